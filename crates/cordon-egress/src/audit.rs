//! Audit events: one per decision, never carrying a secret value.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::error::{Error, Result};

pub use cordon_core::report::{
    EgressDecision as Decision, EgressEvent as AuditEvent, EgressKind as Kind,
};

/// Most events kept in memory; older ones are dropped (and counted) past this.
pub const MAX_KEPT_EVENTS: usize = 100_000;

struct Kept {
    events: Vec<AuditEvent>,
    dropped: u64,
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
                events: Vec::new(),
                dropped: 0,
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
        if kept.events.len() >= MAX_KEPT_EVENTS {
            kept.dropped += 1;
        } else {
            kept.events.push(ev);
        }
    }

    pub(crate) fn events(&self) -> (Vec<AuditEvent>, u64) {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        (kept.events.clone(), kept.dropped)
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AuditEvent> {
        self.tx.subscribe()
    }
}
