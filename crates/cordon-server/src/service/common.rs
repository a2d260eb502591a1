//! What every component of the service shares, and nothing that knows a component: the
//! audit recorder, the server's life (stopping, the background tasks), a chunk of
//! streamed output, and the helpers that run blocking work off the async runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cordon_core::{OutputStream, Tier};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::{Audit, AuditEvent, NewEvent};
use crate::error::{ApiError, Code};

/// A chunk of output on its way to a streaming client.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub stream: OutputStream,
    pub data: Vec<u8>,
}

pub type ChunkSender = mpsc::UnboundedSender<Chunk>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a blocking closure off the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal_from("a worker thread failed", e))
}

/// An audit row that could not be written: the request it was for fails (nothing is
/// reported without its row). The store's error is kept as the source, for the log.
pub(super) fn audit_err(e: impl std::error::Error + Send + Sync + 'static) -> ApiError {
    ApiError::internal_from(
        "the audit row could not be written; nothing was reported without it",
        e,
    )
}

/// The answer for a sandbox destroyed while a call on it was under way.
pub(super) fn gone(id: &str) -> ApiError {
    ApiError::new(
        Code::SandboxGone,
        format!("sandbox {id} has been destroyed"),
        "create a new sandbox",
    )
}

/// An owned audit row, to move into a blocking task.
pub(super) struct NewEventOwned {
    pub(super) tenant: Option<String>,
    pub(super) sandbox: Option<String>,
    pub(super) tier: Option<Tier>,
    pub(super) event: AuditEvent,
}

impl NewEventOwned {
    pub(super) fn borrowed(&self) -> NewEvent<'_> {
        NewEvent {
            tenant: self.tenant.as_deref(),
            sandbox: self.sandbox.as_deref(),
            tier: self.tier,
            event: self.event.clone(),
        }
    }
}

/// The audit store, as the components write it: off the runtime, a failure an error.
#[derive(Clone)]
pub(super) struct Recorder {
    pub(super) store: Arc<Audit>,
}

impl Recorder {
    /// Writes one row off the async runtime.
    pub(super) async fn record(&self, e: NewEventOwned) -> Result<i64, ApiError> {
        let audit = self.store.clone();
        blocking(move || audit.record(&e.borrowed()))
            .await?
            .map_err(audit_err)
    }
}

/// The server's life: whether it is stopping, the signal that it began to, and the tasks
/// shutdown waits for.
#[derive(Clone)]
pub(super) struct Life {
    stopping: Arc<AtomicBool>,
    pub(super) cancel: CancellationToken,
    /// Destroys running in the background (one-shot runs, the reaper, stops); shutdown
    /// waits.
    pub(super) destroys: TaskTracker,
    /// The reaper and the pool refills; shutdown waits for them to return, so no refill
    /// adds a sandbox after the pools are drained and no task holds the data dir's lock
    /// once shutdown is done.
    pub(super) background: TaskTracker,
}

impl Life {
    pub(super) fn new() -> Self {
        Life {
            stopping: Arc::new(AtomicBool::new(false)),
            cancel: CancellationToken::new(),
            destroys: TaskTracker::new(),
            background: TaskTracker::new(),
        }
    }

    /// Refuses new work once shutdown has begun.
    pub(super) fn stopping(&self) -> Result<(), ApiError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(ApiError::new(
                Code::ShuttingDown,
                "the server is shutting down",
                "retry against the restarted server",
            ));
        }
        Ok(())
    }

    /// Begins shutdown: new work is refused and the background tasks see the cancel.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.cancel.cancel();
    }
}

/// Places of one kind (attach streams, audit reads, event streams) held at once, counted
/// per key (a tenant, a sandbox): a key at its cap is refused with `429 resource_busy`
/// naming what is full, and a place is given back when its [`Slot`] is dropped (the stream
/// ended or its client went away).
#[derive(Clone)]
pub struct Slots {
    what: &'static str,
    fix: &'static str,
    held: Arc<Mutex<std::collections::HashMap<String, usize>>>,
}

/// One place held in [`Slots`].
pub struct Slot {
    held: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    key: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Slots {
    /// `what` names the place in a refusal ("attach streams of yours"); `fix` says what to do.
    pub fn new(what: &'static str, fix: &'static str) -> Self {
        Slots {
            what,
            fix,
            held: Arc::default(),
        }
    }

    /// Takes a place of `key`'s when it holds fewer than `cap`.
    pub fn take(&self, key: &str, cap: usize) -> Result<Slot, ApiError> {
        let mut held = lock(&self.held);
        let n = held.entry(key.to_string()).or_insert(0);
        if *n >= cap {
            let mut e = ApiError::new(
                Code::ResourceBusy,
                format!("{} are at their limit of {cap}", self.what),
                self.fix,
            );
            e.retry_after = Some(1);
            return Err(e);
        }
        *n += 1;
        Ok(Slot {
            held: self.held.clone(),
            key: key.to_string(),
        })
    }

    /// Places `key` holds now.
    pub fn held(&self, key: &str) -> usize {
        lock(&self.held).get(key).copied().unwrap_or(0)
    }
}

/// The snapshots' directory under the data dir (a paused sandbox's files are kept there
/// too, as `paused-<id>`).
pub fn snapshots_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("snapshots")
}
