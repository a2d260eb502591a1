//! Audit events: one per decision, never carrying a secret value.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::error::{Error, Result};

/// What a decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The request or tunnel was let through.
    Allow,
    /// Refused by policy (deny entry, default deny, address guard, grant scope, ...).
    Deny,
    /// A credential placeholder was on its way to a host its grant does not cover.
    Exfiltration,
    /// A per-sandbox limit ended the request or connection.
    Limit,
    /// The upstream could not be reached or answered badly.
    Error,
    /// A connection ended (carries byte counts and the reason).
    Closed,
}

/// What kind of traffic the event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An absolute-form plain-HTTP request.
    Http,
    /// A CONNECT request (opaque tunnel or TLS terminated).
    Connect,
    /// A request inside a TLS connection the proxy terminated.
    Https,
    /// A client connection as a whole.
    Connection,
}

/// One audit event. `path` never includes the query string; no header value is ever logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The sandbox this proxy serves.
    pub sandbox: String,
    /// Client connection number within this proxy, from 1.
    pub conn: u64,
    /// What kind of traffic.
    pub kind: Kind,
    /// The decision.
    pub decision: Decision,
    /// The rule that decided (e.g. `allow api.example.test`, `deny *.evil.test`,
    /// `default-deny`, `address-guard:loopback`, `grant:github`, `limit:bytes_up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A human sentence: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Target host as requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The address the proxy connected to (or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// HTTP method where seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// URL path where seen, without the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Upstream status code, when a response came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The grant whose secret was added to the request (name only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// Whether the proxy terminated TLS for this CONNECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<bool>,
    /// Bytes from the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Bytes to the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
}

impl AuditEvent {
    pub(crate) fn new(conn: u64, kind: Kind, decision: Decision) -> Self {
        AuditEvent {
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            sandbox: String::new(),
            conn,
            kind,
            decision,
            rule: None,
            reason: None,
            host: None,
            port: None,
            addr: None,
            method: None,
            path: None,
            status: None,
            grant: None,
            terminated: None,
            bytes_up: None,
            bytes_down: None,
        }
    }
}

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
