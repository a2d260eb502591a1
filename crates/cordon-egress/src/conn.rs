//! One client connection: byte metering against the sandbox's budgets, activity tracking
//! for the idle timeout, and the watchdog that ends it with a reason.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, Decision, Kind};
use crate::shared::Shared;

/// Why a connection ended: (rule, sentence).
pub(crate) type EndReason = (String, String);

pub(crate) struct Conn {
    pub id: u64,
    pub shared: Arc<Shared>,
    up: AtomicU64,
    down: AtomicU64,
    last_activity_ms: AtomicU64,
    started: Instant,
    reason: Mutex<Option<EndReason>>,
    /// Cancelled to end the connection at once (limit reached, exfiltration seen).
    pub kill: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    pub(crate) fn new(id: u64, shared: Arc<Shared>, permit: OwnedSemaphorePermit) -> Arc<Conn> {
        let c = Arc::new(Conn {
            id,
            kill: shared.cancel.child_token(),
            shared,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            started: Instant::now(),
            reason: Mutex::new(None),
            _permit: permit,
        });
        c.touch();
        c
    }

    fn touch(&self) {
        let ms = self.shared.epoch.elapsed().as_millis() as u64;
        self.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    /// Records why the connection ends (first reason wins) and ends it.
    pub(crate) fn end(&self, rule: &str, reason: String) {
        {
            let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some((rule.to_string(), reason));
            }
        }
        self.kill.cancel();
    }

    /// Resolves when the connection must end: idle, total timeout, killed, or shutdown.
    pub(crate) async fn watch(&self) {
        let limits = &self.shared.limits;
        let total_deadline = self.started + limits.connection_timeout();
        loop {
            let last = self.shared.epoch
                + Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
            let idle_deadline = last + limits.idle_timeout();
            let next = total_deadline.min(idle_deadline);
            tokio::select! {
                _ = self.kill.cancelled() => return,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            let now = Instant::now();
            if now >= total_deadline {
                self.end(
                    "limit:connection_timeout",
                    format!(
                        "the connection was open longer than {} ms",
                        limits.connection_timeout_ms
                    ),
                );
                return;
            }
            let last = self.shared.epoch
                + Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
            if now >= last + limits.idle_timeout() {
                self.end(
                    "limit:idle_timeout",
                    format!("no traffic for {} ms", limits.idle_timeout_ms),
                );
                return;
            }
        }
    }

    /// Runs `fut` until it finishes or the connection must end.
    pub(crate) async fn guarded<F: std::future::Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            r = fut => Some(r),
            _ = self.watch() => None,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut ev = AuditEvent::new(self.id, Kind::Connection, Decision::Closed);
        ev.bytes_up = Some(self.up.load(Ordering::Relaxed));
        ev.bytes_down = Some(self.down.load(Ordering::Relaxed));
        let reason = self
            .reason
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match reason {
            Some((rule, why)) => {
                if rule.starts_with("limit:") {
                    ev.decision = Decision::Limit;
                }
                ev.rule = Some(rule);
                ev.reason = Some(why);
            }
            None if self.shared.cancel.is_cancelled() => {
                ev.rule = Some("shutdown".into());
                ev.reason = Some("the sandbox's proxy was shut down".into());
            }
            None => {}
        }
        self.shared.audit.record(ev);
    }
}

/// The client side of a connection, metered against the sandbox's byte budgets.
pub(crate) struct MeteredIo<T> {
    io: T,
    conn: Arc<Conn>,
}

impl<T> MeteredIo<T> {
    pub(crate) fn new(io: T, conn: Arc<Conn>) -> Self {
        MeteredIo { io, conn }
    }
}

fn limit_error(what: &str) -> io::Error {
    io::Error::other(format!("egress {what} limit reached"))
}

impl<T: AsyncRead + Unpin> AsyncRead for MeteredIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.conn.kill.is_cancelled() {
            return Poll::Ready(Err(io::Error::other(
                "connection ended by the egress proxy",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = (buf.filled().len() - before) as u64;
            if n > 0 {
                this.conn.touch();
                this.conn.up.fetch_add(n, Ordering::Relaxed);
                let shared = &this.conn.shared;
                let total = shared.bytes_up.fetch_add(n, Ordering::Relaxed) + n;
                if total > shared.limits.max_bytes_up {
                    this.conn.end(
                        "limit:bytes_up",
                        format!(
                            "the sandbox sent more than {} bytes",
                            shared.limits.max_bytes_up
                        ),
                    );
                    buf.set_filled(before);
                    return Poll::Ready(Err(limit_error("upload")));
                }
            }
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MeteredIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.conn.kill.is_cancelled() {
            return Poll::Ready(Err(io::Error::other(
                "connection ended by the egress proxy",
            )));
        }
        if buf.is_empty() {
            return Pin::new(&mut this.io).poll_write(cx, buf);
        }
        let shared = this.conn.shared.clone();
        let limit = shared.limits.max_bytes_down;
        let len = buf.len() as u64;
        // Reserve, write what the budget allows, refund the rest.
        let prev = shared.bytes_down.fetch_add(len, Ordering::Relaxed);
        if prev >= limit {
            shared.bytes_down.fetch_sub(len, Ordering::Relaxed);
            this.conn.end(
                "limit:bytes_down",
                format!("the sandbox received {limit} bytes, its download limit"),
            );
            return Poll::Ready(Err(limit_error("download")));
        }
        let allowed = len.min(limit - prev) as usize;
        let r = Pin::new(&mut this.io).poll_write(cx, &buf[..allowed]);
        let written = match &r {
            Poll::Ready(Ok(n)) => *n as u64,
            _ => 0,
        };
        shared
            .bytes_down
            .fetch_sub(len - written, Ordering::Relaxed);
        if written > 0 {
            this.conn.touch();
            this.conn.down.fetch_add(written, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
