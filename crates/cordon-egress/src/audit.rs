//! Audit events: one per decision, never carrying a secret value.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::error::{Error, Result};

pub use cordon_core::report::{
    EgressDecision as Decision, EgressEvent as AuditEvent, EgressFold, EgressKind as Kind,
};

/// Most recent events kept itemised in memory for [`AuditLog::events`]; older ones are
/// dropped from that view (and counted). What the tiers report goes through the fold.
pub const MAX_KEPT_EVENTS: usize = 4096;

struct Kept {
    /// The latest events, for inspection.
    recent: VecDeque<AuditEvent>,
    dropped: u64,
    /// Every event since the last [`AuditLog::take`], folded and bounded.
    fold: EgressFold,
}

/// Fans events out to memory, subscribers and an optional JSON-lines file.
pub(crate) struct AuditLog {
    sandbox: String,
    kept: Mutex<Kept>,
    tx: broadcast::Sender<AuditEvent>,
    file: Option<Mutex<BufWriter<File>>>,
}

impl AuditLog {
    pub(crate) fn new(sandbox: &str, path: Option<&Path>) -> Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(BufWriter::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| Error::AuditLog {
                        path: p.to_path_buf(),
                        source,
                    })?,
            ))),
            None => None,
        };
        let (tx, _) = broadcast::channel(4096);
        Ok(AuditLog {
            sandbox: sandbox.to_string(),
            kept: Mutex::new(Kept {
                recent: VecDeque::new(),
                dropped: 0,
                fold: EgressFold::default(),
            }),
            tx,
            file,
        })
    }

    pub(crate) fn record(&self, mut ev: AuditEvent) {
        ev.sandbox.clone_from(&self.sandbox);
        if let Some(f) = &self.file {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            if let Ok(line) = serde_json::to_string(&ev) {
                // A failing audit file must not take the proxy down; the in-memory copy and
                // the subscribers still get the event.
                let _ = writeln!(f, "{line}").and_then(|_| f.flush());
            }
        }
        tracing::debug!(
            decision = ?ev.decision,
            host = ev.host.as_deref().unwrap_or(""),
            rule = ev.rule.as_deref().unwrap_or(""),
            "egress"
        );
        let _ = self.tx.send(ev.clone());
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.fold.push(ev.clone());
        if kept.recent.len() >= MAX_KEPT_EVENTS {
            kept.recent.pop_front();
            kept.dropped += 1;
        }
        kept.recent.push_back(ev);
    }

    /// The latest events (at most [`MAX_KEPT_EVENTS`]) and how many older ones left that view.
    pub(crate) fn events(&self) -> (Vec<AuditEvent>, u64) {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        (kept.recent.iter().cloned().collect(), kept.dropped)
    }

    /// Every event since the last call, folded: one row per distinct decision with a
    /// count, at most [`cordon_core::report::DEFAULT_FOLD_ROWS`] ordinary rows and a
    /// `truncated` row for the rest; exfiltration and grant events are never dropped.
    pub(crate) fn take(&self) -> Vec<AuditEvent> {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fold
            .take()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AuditEvent> {
        self.tx.subscribe()
    }
}
