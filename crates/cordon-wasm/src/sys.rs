//! The only unsafe code of the crate: turning verified precompiled bytes or cache files into
//! code, and reading the calling thread's CPU clock.

use std::fs::File;

use wasmtime::{Engine, Module};

/// Deserializes a precompiled core module.
pub(crate) fn module(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Module> {
    // SAFETY: `bytes` came from `Engine::precompile_module` of an engine with this
    // configuration, either just now or read back from the cache and checked against the
    // SHA-256 recorded when it was written (artifacts::precompiled), from the same buffer
    // we pass here, so nothing can change it between the check and the use. wasmtime also
    // checks the header, version and engine settings and refuses a mismatch.
    unsafe { Module::deserialize(engine, bytes) }
}

/// Maps a precompiled core module from a cache file already opened and checked.
pub(crate) fn module_file(engine: &Engine, file: &File) -> wasmtime::Result<Module> {
    let file = file.try_clone()?;
    // SAFETY: `file` is the cache entry this engine wrote: artifacts::cached opened it once,
    // found it owned by this user or root and writable by no one else, and its device,
    // inode, size, mtime and ctime equal to those recorded (with its SHA-256) right after
    // it was written with `Engine::precompile_module`'s output, so its bytes are that
    // output. Only this user or root can change it while it is mapped, and the cache never
    // rewrites a file in place (new entries are renamed over). wasmtime also checks the
    // header, version and engine settings and refuses a mismatch.
    unsafe { Module::deserialize_open_file(engine, file) }
}

/// CPU time the calling thread has used, in nanoseconds (0 if the clock cannot be read).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that lives across the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel we run on provides; on failure
    // the call leaves `ts` as it is and returns -1, which we turn into 0.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Raises this process's soft descriptor limit to its hard limit (capped at 2^20) and returns
/// the soft limit in force after it (the old one when it cannot be raised).
pub(crate) fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit that lives across the call; RLIMIT_NOFILE is
    // a resource every Linux kernel knows. On failure `lim` is left as it was.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    let want = lim.rlim_max.min(1 << 20);
    if lim.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit read above with only the soft limit raised to
        // at most the hard limit, which an unprivileged process may do.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = want;
        }
    }
    lim.rlim_cur
}
