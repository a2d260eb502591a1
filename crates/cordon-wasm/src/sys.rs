//! The only unsafe code of the crate: turning verified precompiled bytes into code, and
//! reading the calling thread's CPU clock.

use wasmtime::component::Component;
use wasmtime::{Engine, Module};

/// Deserializes a precompiled component.
pub(crate) fn component(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `bytes` came from `Engine::precompile_component` of an engine with this
    // configuration, either just now or read back from the cache and checked against the
    // SHA-256 recorded when it was written (artifacts::precompiled), from the same buffer
    // we pass here, so nothing can change it between the check and the use. wasmtime also
    // checks the header, version and engine settings and refuses a mismatch.
    unsafe { Component::deserialize(engine, bytes) }
}

/// Deserializes a precompiled core module.
pub(crate) fn module(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Module> {
    // SAFETY: as for `component`: the bytes are our own `precompile_module` output, verified
    // against their recorded hash from this same buffer.
    unsafe { Module::deserialize(engine, bytes) }
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
