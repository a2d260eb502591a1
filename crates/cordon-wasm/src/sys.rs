//! The only unsafe code of the crate: turning verified precompiled bytes into code.

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
