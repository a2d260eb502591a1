//! Reading cgroup files: a process list, one number, or one key of a `key value` file.
//! Below both the host's cgroup manager and the pool, which read them.

use std::fs;
use std::path::Path;

/// The pids listed in a `cgroup.procs` file (none when it cannot be read).
pub fn read_pids(p: &Path) -> Vec<i32> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A file holding one number; 0 when absent or unreadable.
pub fn number(p: &Path) -> u64 {
    parse_number(&fs::read_to_string(p).unwrap_or_default())
}

/// One number in a file's text; 0 when absent.
pub fn parse_number(text: &str) -> u64 {
    text.trim().parse().unwrap_or(0)
}

/// The value of `key` in a `key value` per line file; 0 when absent.
pub fn keyed(p: &Path, key: &str) -> u64 {
    parse_keyed(&fs::read_to_string(p).unwrap_or_default(), key)
}

/// The value of `key` in `key value` lines; 0 when absent.
pub fn parse_keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or(0)
}
