//! Host memory that live sandboxes cost, measured from outside any tier: the proportional
//! set size (PSS) of this process plus every process descended from it, sampled while the
//! sandboxes live, minus the same sum before they were created.
//!
//! PSS divides each shared page among the processes mapping it, so N QEMUs or N sandbox
//! helpers sharing one binary are charged for it once in total, which is what a host running
//! many sandboxes pays. In-process tiers (runtime, wasm) show up as this process's own growth.
//! Processes a tier leaves running outside this process tree (none of today's tiers do) would
//! not be seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the figure is made, for the report.
pub const METHOD: &str = "peak over the sandboxes' life of (PSS of the bench process + PSS of all its descendant processes, from /proc/PID/smaps_rollup) minus that sum before they were created, divided by the number of live sandboxes; sampled every 5 ms";

/// PSS in bytes of one process, if it still exists and can be read.
fn pss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The parent of every process on the host.
fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name is in parentheses and may hold spaces: fields follow the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// PSS of `root` and all its descendants, in bytes.
pub fn tree_pss(root: u32) -> u64 {
    let parents = parents();
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, &ppid) in &parents {
        children.entry(ppid).or_default().push(pid);
    }
    let mut total = 0;
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        total += pss(p).unwrap_or(0);
        if let Some(c) = children.get(&p) {
            stack.extend(c);
        }
    }
    total
}

/// Samples [`tree_pss`] of this process in a thread until stopped; keeps the peak.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let me = std::process::id();
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(tree_pss(me), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Sampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling (after one last sample) and returns the peak in bytes.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak
            .load(Ordering::Relaxed)
            .max(tree_pss(std::process::id()))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_counts() {
        let before = tree_pss(std::process::id());
        assert!(before > 0, "this process has a PSS");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("sleep: {e}"));
        std::thread::sleep(Duration::from_millis(100));
        let child_pss = pss(child.id()).unwrap_or(0);
        let _ = child.kill();
        let _ = child.wait();
        assert!(child_pss > 0, "the child was seen");
    }
}
