//! Compiling users' own modules and components, bounded.
//!
//! Compilation happens before any guest code runs, so none of the exec's walls (epoch
//! deadline, memory limiter) see it. Here it is bounded instead by:
//! - **shape**: before Cranelift sees anything, one linear pass (`wasmparser`) refuses a
//!   binary over [`MAX_BINARY`] bytes, a function body over [`MAX_FUNCTION`] bytes or with more
//!   than [`MAX_LOCALS`] locals: compile time and memory then grow about linearly with the size;
//! - **the exec's deadline**: the caller waits for the compile only until its exec's deadline
//!   and then ends as `timeout`; the compile finishes in the background (it cannot be
//!   interrupted) and its result is kept;
//! - **one compile at a time** in the process (a lock), and at most [`MAX_WAITING`] requests
//!   waiting for it: a tenant sending many modules gets refusals, not threads;
//! - **a cache by content**: the SHA-256 of the bytes (within one engine) names the compiled
//!   code, kept in memory only (never deserialized from disk), the last [`CACHE_ENTRIES`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::wasmparser::{Parser, Payload};

/// Largest user binary.
pub const MAX_BINARY: usize = 64 << 20;
/// Largest function body.
pub const MAX_FUNCTION: usize = 512 << 10;
/// Most locals of one function.
pub const MAX_LOCALS: u64 = 50_000;
/// Compiles kept.
pub const CACHE_ENTRIES: usize = 32;
/// Requests that may wait for the compile slot at once.
pub const MAX_WAITING: usize = 8;

/// Compiled user code.
#[derive(Clone)]
pub(crate) enum Compiled {
    Module(wasmtime::Module),
    Component(Component),
}

/// Why no compiled code came back.
#[derive(Debug)]
pub(crate) enum CompileError {
    /// The binary is not acceptable; the message says why.
    Invalid(String),
    /// The exec's deadline passed first.
    Timeout,
    /// Too many compiles are waiting.
    Busy,
}

type Key = [u8; 32];

/// The compile slot and cache of one engine.
#[derive(Default)]
pub(crate) struct Compiler {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<()>,
    cache: Mutex<VecDeque<(Key, Compiled)>>,
    waiting: AtomicUsize,
}

impl Shared {
    fn cached(&self, key: &Key) -> Option<Compiled> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let i = cache.iter().position(|(k, _)| k == key)?;
        let hit = cache.remove(i)?;
        let c = hit.1.clone();
        cache.push_back(hit);
        Some(c)
    }

    fn keep(&self, key: Key, c: Compiled) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|(k, _)| *k != key);
        if cache.len() >= CACHE_ENTRIES {
            cache.pop_front();
        }
        cache.push_back((key, c));
    }
}

impl Compiler {
    /// Compiles `bytes` (a core module when `component` is false), waiting until `deadline`.
    pub fn compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        component: bool,
        deadline: Instant,
    ) -> Result<Compiled, CompileError> {
        check_shape(bytes)?;
        let key: Key = Sha256::digest(bytes).into();
        if let Some(c) = self.inner.cached(&key) {
            return Ok(c);
        }
        if self.inner.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            self.inner.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(CompileError::Busy);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let shared = self.inner.clone();
        let engine = engine.clone();
        let bytes = bytes.to_vec();
        let spawned = std::thread::Builder::new()
            .name("cordon-wasm-compile".into())
            .spawn(move || {
                let result = {
                    let _slot = shared.slot.lock().unwrap_or_else(PoisonError::into_inner);
                    match shared.cached(&key) {
                        Some(c) => Ok(c),
                        None => {
                            let r = if component {
                                Component::from_binary(&engine, &bytes).map(Compiled::Component)
                            } else {
                                wasmtime::Module::from_binary(&engine, &bytes).map(Compiled::Module)
                            };
                            match r {
                                Ok(c) => {
                                    shared.keep(key, c.clone());
                                    Ok(c)
                                }
                                Err(e) => Err(format!("{e:#}")),
                            }
                        }
                    }
                };
                shared.waiting.fetch_sub(1, Ordering::AcqRel);
                let _ = tx.send(result);
            });
        if spawned.is_err() {
            self.inner.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(CompileError::Busy);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(CompileError::Invalid(e)),
            Err(_) => Err(CompileError::Timeout),
        }
    }
}

/// Refuses binaries whose size or functions would make compilation costly.
fn check_shape(bytes: &[u8]) -> Result<(), CompileError> {
    if bytes.len() > MAX_BINARY {
        return Err(CompileError::Invalid(format!(
            "the binary is {} bytes; the wasm tier compiles user programs up to {MAX_BINARY} bytes",
            bytes.len()
        )));
    }
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| CompileError::Invalid(format!("malformed: {e}")))?;
        if let Payload::CodeSectionEntry(body) = payload {
            let size = body.range().len();
            if size > MAX_FUNCTION {
                return Err(CompileError::Invalid(format!(
                    "a function body of {size} bytes; the wasm tier compiles functions up to \
                     {MAX_FUNCTION} bytes (split it)"
                )));
            }
            let mut locals = 0u64;
            let reader = body
                .get_locals_reader()
                .map_err(|e| CompileError::Invalid(format!("malformed: {e}")))?;
            for l in reader {
                let (n, _) = l.map_err(|e| CompileError::Invalid(format!("malformed: {e}")))?;
                locals += u64::from(n);
            }
            if locals > MAX_LOCALS {
                return Err(CompileError::Invalid(format!(
                    "a function with {locals} locals; the wasm tier compiles functions with up \
                     to {MAX_LOCALS}"
                )));
            }
        }
    }
    Ok(())
}
