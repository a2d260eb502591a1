//! Per-exec host state: memory/table/instance limits, captured and capped stdio, the scratch
//! disk quota, and the markers that end an exec with a termination reason.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use cordon_core::Termination;
use tokio::io::AsyncWrite;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Raised inside the store to end an exec with a reason; found again by downcasting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stop(pub Termination);

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cordon stopped the guest: {}", self.0)
    }
}

impl std::error::Error for Stop {}

/// Flags one exec raises; read when the outcome is put together.
#[derive(Debug, Default)]
pub(crate) struct Flags {
    pub memory_refused: AtomicBool,
    pub disk_refused: AtomicBool,
    pub output_limit: AtomicBool,
}

/// Store limits: memory (the spec's limit), table elements, instance/table/memory counts.
pub(crate) struct Limiter {
    pub memory_bytes: usize,
    pub table_elements: usize,
    pub flags: Arc<Flags>,
    /// Bytes of all linear memories of the store now, and the most they reached.
    pub total_memory: usize,
    pub peak_memory: usize,
}

/// Counts that hold for every guest (the Python component needs about 20 core instances).
pub(crate) const MAX_INSTANCES: usize = 64;
pub(crate) const MAX_TABLES: usize = 64;
pub(crate) const MAX_MEMORIES: usize = 8;

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Linear memories of one store add up: the limit is on the total.
        let total = self
            .total_memory
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_bytes {
            self.flags.memory_refused.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        self.total_memory = total;
        self.peak_memory = self.peak_memory.max(total);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            self.flags.memory_refused.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

/// Captured output of one stream, capped. Clones share the buffer.
#[derive(Clone)]
pub(crate) struct Capture {
    inner: Arc<Mutex<CaptureBuf>>,
    flags: Arc<Flags>,
}

struct CaptureBuf {
    data: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    pub fn new(cap: u64, flags: Arc<Flags>) -> Self {
        Capture {
            inner: Arc::new(Mutex::new(CaptureBuf {
                data: Vec::new(),
                cap: usize::try_from(cap).unwrap_or(usize::MAX),
                truncated: false,
            })),
            flags,
        }
    }

    /// Appends what fits; false when the cap was passed (the rest is dropped).
    fn push(&self, bytes: &[u8]) -> bool {
        let mut b = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let room = b.cap.saturating_sub(b.data.len());
        if bytes.len() > room {
            b.data.extend_from_slice(&bytes[..room]);
            b.truncated = true;
            self.flags.output_limit.store(true, Ordering::Relaxed);
            return false;
        }
        b.data.extend_from_slice(bytes);
        true
    }

    /// The captured bytes and whether they were truncated.
    pub fn take(&self) -> (Vec<u8>, bool) {
        let mut b = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (std::mem::take(&mut b.data), b.truncated)
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.push(&bytes) {
            Ok(())
        } else {
            Err(StreamError::Trap(wasmtime::Error::new(Stop(
                Termination::OutputLimit,
            ))))
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.push(buf) {
            Poll::Ready(Ok(buf.len()))
        } else {
            // The epoch callback sees the flag and ends the exec.
            Poll::Ready(Err(std::io::Error::other("cordon output limit reached")))
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The scratch disk budget of one sandbox. Writes reserve bytes before they happen, against
/// a running count that lives as long as the sandbox (every exec and every file put adds to
/// the same count). When the count says the budget is spent, the scratch dir is measured
/// again (overwrites and deletions give space back), but a measurement is believed only if
/// it reached every entry: a tree the walk cannot finish (nested past the host's PATH_MAX,
/// say) never lowers the count. A write is refused if it still does not fit.
pub(crate) struct DiskQuota {
    root: PathBuf,
    limit: u64,
    used: Arc<DiskLedger>,
    flags: Arc<Flags>,
}

/// The bytes a sandbox's scratch dir holds as far as Cordon knows (shared by its execs).
#[derive(Debug, Default)]
pub(crate) struct DiskLedger {
    used: Mutex<u64>,
}

impl DiskLedger {
    /// Takes a fresh measurement into account; returns the bytes then counted.
    pub fn remeasure(&self, root: &std::path::Path) -> u64 {
        let m = usage(root);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = if m.complete {
            m.bytes
        } else {
            m.bytes.max(*used)
        };
        *used
    }

    /// Adds `n` bytes to the count if the total stays within `limit`.
    fn take(&self, n: u64, limit: u64) -> bool {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        if used.saturating_add(n) <= limit {
            *used += n;
            return true;
        }
        false
    }

    /// Sets the count after a write Cordon made itself.
    pub fn set(&self, bytes: u64) {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner) = bytes;
    }
}

/// What every file, directory or link costs besides its bytes (one block).
pub(crate) const ENTRY_COST: u64 = 4096;

impl DiskQuota {
    pub fn new(root: PathBuf, limit: u64, used: Arc<DiskLedger>, flags: Arc<Flags>) -> Self {
        DiskQuota {
            root,
            limit,
            used,
            flags,
        }
    }

    /// Reserves `n` bytes; false (and the disk flag raised) when they do not fit.
    pub fn reserve(&self, n: u64) -> bool {
        if self.used.take(n, self.limit) {
            return true;
        }
        self.used.remeasure(&self.root);
        if self.used.take(n, self.limit) {
            return true;
        }
        self.flags.disk_refused.store(true, Ordering::Relaxed);
        false
    }
}

/// A walk of a scratch dir.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    /// File sizes plus one block per entry, of what the walk reached.
    pub bytes: u64,
    /// Whether it reached every entry.
    pub complete: bool,
}

/// Bytes under `root`: file sizes plus one block per entry. Symlinks are not followed. A
/// directory or entry the walk cannot read (a path past PATH_MAX, say) makes it incomplete.
pub(crate) fn usage(root: &std::path::Path) -> Usage {
    let mut total = 0u64;
    let mut complete = true;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            complete = false;
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                complete = false;
                continue;
            };
            total = total.saturating_add(ENTRY_COST);
            let Ok(meta) = entry.metadata() else {
                complete = false;
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Usage {
        bytes: total,
        complete,
    }
}
