//! Background execs: what a tier reports of one ([`ProcOutput`]) and how one is signalled.

use serde::{Deserialize, Serialize};

/// Bytes of each stream a sandbox keeps of a background exec: the last this many, so a
/// client that attaches late sees the most recent output, and the count of bytes dropped
/// before them.
pub const BACKGROUND_KEEP: u64 = 1 << 20;

/// A signal a client may send a background exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcSignal {
    /// SIGTERM to every process of the exec (a server gets to shut down cleanly).
    Term,
    /// SIGKILL to the whole process tree.
    Kill,
}

/// Most rows or columns a background exec's terminal may have.
pub const PTY_MAX: u16 = 1000;

/// The size of a background exec's pseudo-terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl PtySize {
    /// Checks both sides are within `1..=`[`PTY_MAX`].
    pub fn validate(&self) -> crate::Result<()> {
        let ok = |n: u16| (1..=PTY_MAX).contains(&n);
        if ok(self.rows) && ok(self.cols) {
            Ok(())
        } else {
            Err(crate::Rejected::Terminal {
                rows: self.rows,
                cols: self.cols,
                max: PTY_MAX,
            }
            .into())
        }
    }
}

/// How a background exec ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_us: u64,
    pub max_rss_bytes: u64,
    #[serde(default)]
    pub oom_killed: bool,
    #[serde(default)]
    pub pids_limited: bool,
    /// The workspace (or a writable volume) was full when it ended, measured as a
    /// foreground exec's is.
    #[serde(default)]
    pub disk_full: bool,
}

/// A read of a background exec's output: the bytes of each stream from `*_from` (an offset
/// into everything the stream ever carried; larger than asked when older bytes were
/// dropped), and its end once it has ended and every byte of its output is in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcOutput {
    pub stdout_from: u64,
    pub stdout: Vec<u8>,
    pub stderr_from: u64,
    pub stderr: Vec<u8>,
    pub exit: Option<ProcExit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sizes_are_bounded() {
        for (rows, cols) in [(1, 1), (24, 80), (PTY_MAX, PTY_MAX)] {
            assert!(PtySize { rows, cols }.validate().is_ok());
        }
        for (rows, cols) in [(0, 80), (24, 0), (PTY_MAX + 1, 80), (24, u16::MAX)] {
            let e = PtySize { rows, cols }.validate().unwrap_err().to_string();
            assert!(e.contains("between 1 and 1000"), "{e}");
        }
    }
}
