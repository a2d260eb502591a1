//! Finding the processes that run a given executable, to show that none outlived what
//! should have ended them. Tests give each case a private copy of the binary, so processes
//! of other tests running at the same time do not count.

use std::path::Path;
use std::time::{Duration, Instant};

/// The pids of the processes whose executable is `exe` (a zombie has none, so a killed
/// process counts as gone once it has exited).
pub fn running_from(exe: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let runs = std::fs::read_link(entry.path().join("exe")).ok()? == exe;
            runs.then_some(pid)
        })
        .collect()
}

/// Waits, at most `limit`, until no process runs `exe` (a killed process may take a
/// moment to exit); returns the pids still running it.
pub fn wait_until_none_run(exe: &Path, limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    let mut left = running_from(exe);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        left = running_from(exe);
    }
    left
}
