//! A live sandbox's resource figures, read from the tier's own accounting (the cgroup its
//! processes, sentry or VM run in, the file system of its workspace) without the sandbox's
//! lock and without a call into the sandbox: a [`Gauge`] is a handle a sampler keeps and
//! reads on its own schedule, while execs and file calls go on.

/// What a gauge read, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// CPU time used since the sandbox started (all its processes), in microseconds.
    pub cpu_us: u64,
    /// Memory charged to the sandbox now, in bytes (page cache included).
    pub memory_bytes: u64,
    /// The part of `memory_bytes` that is page cache (file contents, a tmpfs workspace).
    pub cache_bytes: u64,
    /// Bytes used on the workspace's file system; `None` where the tier cannot tell.
    pub disk_used_bytes: Option<u64>,
}

/// A handle that reads a sandbox's figures; `None` once they can no longer be read (the
/// sandbox is gone, or its cgroup was replaced).
pub trait Gauge: Send + Sync {
    fn read(&self) -> Option<Reading>;
}
