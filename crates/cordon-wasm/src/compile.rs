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
//! - **one compile at a time** in the process, handed out in turn between owners (tenants):
//!   the next compile is the oldest of the owner after the one that compiled last, so one
//!   tenant's queue of slow compiles delays another's by at most one compile each; at most
//!   [`MAX_WAITING_PER_OWNER`] requests of one owner and [`MAX_WAITING`] in all wait or
//!   compile at once: a tenant sending many modules gets refusals (`Busy`, a 429 for that
//!   tenant), not threads, and leaves the others their places;
//! - **a cache by content**: the SHA-256 of the bytes (within one engine) names the compiled
//!   code, kept in memory only (never deserialized from disk), the last [`CACHE_ENTRIES`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
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
/// Requests that may wait for (or hold) the compile slot at once, all owners together.
pub const MAX_WAITING: usize = 16;
/// Requests of one owner that may wait for (or hold) the compile slot at once.
pub const MAX_WAITING_PER_OWNER: usize = 2;

/// Compiled user code.
#[derive(Clone)]
pub(crate) enum Compiled {
    Module(wasmtime::Module),
    Component(Component),
}

/// Why no compiled code came back.
#[derive(Debug)]
pub(crate) enum CompileError {
    /// The binary does not parse as WebAssembly.
    Malformed(wasmtime::wasmparser::BinaryReaderError),
    /// A part of the binary is larger than the tier compiles.
    TooLarge(TooLarge),
    /// The engine refused to compile it.
    Rejected(wasmtime::Error),
    /// The exec's deadline passed first.
    Timeout,
    /// Too many compiles are waiting: this owner's own (`mine`), or `all` of them.
    Busy { mine: bool, all: usize },
}

/// A part of a user's binary past what the tier compiles, with the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TooLarge {
    #[error(
        "the binary is {0} bytes; the wasm tier compiles user programs up to {MAX_BINARY} bytes"
    )]
    Binary(usize),
    #[error(
        "a function body of {0} bytes; the wasm tier compiles functions up to {MAX_FUNCTION} \
         bytes (split it)"
    )]
    Function(usize),
    #[error("a function with {0} locals; the wasm tier compiles functions with up to {MAX_LOCALS}")]
    Locals(u64),
}

type Key = [u8; 32];

/// The compile slot and cache of one engine.
#[derive(Default)]
pub(crate) struct Compiler {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    turn: Condvar,
    cache: Mutex<VecDeque<(Key, Compiled)>>,
}

/// Who waits for the compile slot, by owner, and whose turn is next.
#[derive(Default)]
struct Queue {
    /// Tickets waiting, per owner, oldest first.
    waiting: HashMap<String, VecDeque<u64>>,
    /// Owners with tickets waiting, in the order their turns come.
    order: VecDeque<String>,
    /// The owner whose compile runs now.
    active: Option<String>,
    next_ticket: u64,
}

impl Queue {
    fn held_by(&self, owner: &str) -> usize {
        self.waiting.get(owner).map_or(0, VecDeque::len)
            + usize::from(self.active.as_deref() == Some(owner))
    }

    fn held(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum::<usize>() + usize::from(self.active.is_some())
    }

    /// A place in `owner`'s queue, or why not.
    fn enter(&mut self, owner: &str) -> Result<u64, CompileError> {
        if self.held_by(owner) >= MAX_WAITING_PER_OWNER {
            return Err(CompileError::Busy {
                mine: true,
                all: self.held(),
            });
        }
        let all = self.held();
        if all >= MAX_WAITING {
            return Err(CompileError::Busy { mine: false, all });
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let mine = self.waiting.entry(owner.to_string()).or_default();
        mine.push_back(ticket);
        if mine.len() == 1 {
            self.order.push_back(owner.to_string());
        }
        Ok(ticket)
    }

    /// Takes the slot for `ticket` when it is free and the ticket is next in turn.
    fn try_take(&mut self, ticket: u64) -> bool {
        if self.active.is_some() {
            return false;
        }
        let Some(owner) = self.order.front().cloned() else {
            return false;
        };
        let Some(mine) = self.waiting.get_mut(&owner) else {
            return false;
        };
        if mine.front() != Some(&ticket) {
            return false;
        }
        mine.pop_front();
        self.order.pop_front();
        if mine.is_empty() {
            self.waiting.remove(&owner);
        } else {
            // Its next compile waits for every other owner's turn.
            self.order.push_back(owner.clone());
        }
        self.active = Some(owner);
        true
    }

    /// Leaves the queue without a turn (the compile thread could not start).
    fn leave(&mut self, owner: &str, ticket: u64) {
        if let Some(mine) = self.waiting.get_mut(owner) {
            mine.retain(|t| *t != ticket);
            if mine.is_empty() {
                self.waiting.remove(owner);
                self.order.retain(|o| o != owner);
            }
        }
    }
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
    /// Compiles `bytes` (a core module when `component` is false) for `owner`, waiting
    /// until `deadline`.
    pub fn compile(
        &self,
        engine: &Engine,
        owner: &str,
        bytes: &[u8],
        component: bool,
        deadline: Instant,
    ) -> Result<Compiled, CompileError> {
        check_shape(bytes)?;
        let key: Key = Sha256::digest(bytes).into();
        if let Some(c) = self.inner.cached(&key) {
            return Ok(c);
        }
        let ticket = self.inner.lock_queue().enter(owner)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let shared = self.inner.clone();
        let engine = engine.clone();
        let bytes = bytes.to_vec();
        let spawned = std::thread::Builder::new()
            .name("cordon-wasm-compile".into())
            .spawn(move || {
                {
                    let mut q = shared.lock_queue();
                    while !q.try_take(ticket) {
                        q = shared.turn.wait(q).unwrap_or_else(PoisonError::into_inner);
                    }
                }
                let result = match shared.cached(&key) {
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
                            Err(e) => Err(CompileError::Rejected(e)),
                        }
                    }
                };
                shared.lock_queue().active = None;
                shared.turn.notify_all();
                let _ = tx.send(result);
            });
        if spawned.is_err() {
            self.inner.lock_queue().leave(owner, ticket);
            self.inner.turn.notify_all();
            return Err(CompileError::Busy {
                mine: false,
                all: MAX_WAITING,
            });
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CompileError::Timeout),
        }
    }
}

impl Shared {
    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn check_shape(bytes: &[u8]) -> Result<(), CompileError> {
    if bytes.len() > MAX_BINARY {
        return Err(CompileError::TooLarge(TooLarge::Binary(bytes.len())));
    }
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(CompileError::Malformed)?;
        if let Payload::CodeSectionEntry(body) = payload {
            let size = body.range().len();
            if size > MAX_FUNCTION {
                return Err(CompileError::TooLarge(TooLarge::Function(size)));
            }
            let mut locals = 0u64;
            let reader = body.get_locals_reader().map_err(CompileError::Malformed)?;
            for l in reader {
                let (n, _) = l.map_err(CompileError::Malformed)?;
                locals += u64::from(n);
            }
            if locals > MAX_LOCALS {
                return Err(CompileError::TooLarge(TooLarge::Locals(locals)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One owner's queue never keeps another's compile out: each has its own places, and
    /// turns alternate between owners whatever order they came in.
    #[test]
    fn owners_have_their_own_places_and_take_turns() {
        let mut q = Queue::default();
        let a1 = q.enter("a").unwrap();
        let a2 = q.enter("a").unwrap();
        assert!(matches!(
            q.enter("a"),
            Err(CompileError::Busy { mine: true, .. })
        ));
        let b1 = q.enter("b").unwrap();
        assert!(!q.try_take(a2), "a's second is not next");
        assert!(q.try_take(a1));
        assert!(!q.try_take(b1), "the slot is taken");
        q.active = None;
        assert!(!q.try_take(a2), "b's turn comes before a's second");
        assert!(q.try_take(b1));
        q.active = None;
        assert!(q.try_take(a2));
        q.active = None;
        assert_eq!(q.held(), 0);
        // A place given back is a place again.
        assert!(q.enter("a").is_ok() && q.enter("a").is_ok());
    }

    #[test]
    fn the_whole_queue_is_bounded_too() {
        let mut q = Queue::default();
        for i in 0..MAX_WAITING {
            q.enter(&format!("tenant-{i}")).unwrap();
        }
        assert!(matches!(
            q.enter("late"),
            Err(CompileError::Busy { mine: false, all }) if all == MAX_WAITING
        ));
        let t = q.enter("tenant-0");
        assert!(t.is_err());
        q.leave("tenant-1", 1);
        assert!(q.enter("late").is_ok());
    }
}
