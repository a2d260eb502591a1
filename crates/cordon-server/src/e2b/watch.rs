//! envd's directory watching as E2B's SDKs speak it: the streaming `WatchDir` (the JS SDK
//! and the Python async one) and the polled `CreateWatcher` / `GetWatcherEvents` /
//! `RemoveWatcher` (the Python sync SDK), over the sandbox's own watchers
//! ([`crate::service::WatchBatch`], bounded in the sandbox). Event names are relative to
//! the watched directory and typed as envd types them. A stream's watcher is stopped when
//! the client goes away; every watcher ends with its sandbox.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use cordon_core::{WatchEvent, WatchKind};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::connect::{self, ConnectError, end_stream, envelope, unary};
use super::wire::EntryInfo;
use super::{E2b, check_watched, connect_error, lock, to_sandbox_path};
use crate::keys::Tenant;

/// How often a stream asks the sandbox for what its watcher queued.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    /// Each event carries the entry's [`EntryInfo`] when it can be stat-ed (envd ≥ 0.6.3).
    #[serde(default)]
    include_entry: bool,
    /// envd refuses network mounts unless this is set (envd ≥ 0.6.4). A Cordon workspace
    /// is never a network mount (a tmpfs or the sandbox's own directory), so it is taken
    /// and changes nothing.
    #[serde(default)]
    #[allow(dead_code)]
    allow_network_mounts: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateWatcherResponse {
    watcher_id: String,
}

#[derive(Debug, Serialize)]
struct FsEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry: Option<Box<EntryInfo>>,
}

#[derive(Debug, Serialize)]
struct EventsResponse {
    events: Vec<FsEvent>,
}

#[derive(Debug, Serialize)]
struct Empty {}

/// One message of `WatchDir`'s answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum StreamEvent {
    Start {},
    Filesystem(FsEvent),
    Keepalive {},
}

fn fs_event(e: WatchEvent) -> FsEvent {
    FsEvent {
        entry: None,
        name: e.name,
        kind: match e.kind {
            WatchKind::Create => "EVENT_TYPE_CREATE",
            WatchKind::Write => "EVENT_TYPE_WRITE",
            WatchKind::Remove => "EVENT_TYPE_REMOVE",
            WatchKind::Rename => "EVENT_TYPE_RENAME",
            WatchKind::Chmod => "EVENT_TYPE_CHMOD",
        },
    }
}

/// A batch's events; with `dir` (the watched sandbox directory, for watchers that asked
/// for entries), each with the entry it names when that can be stat-ed (not after a
/// remove, nor a rename away), through the tier's own file call.
async fn events(
    e: &E2b,
    tenant: &Tenant,
    id: &str,
    dir: Option<&str>,
    batch: Vec<WatchEvent>,
) -> Vec<FsEvent> {
    let mut out = Vec::with_capacity(batch.len());
    for ev in batch {
        let gone = ev.kind == WatchKind::Remove;
        let mut fe = fs_event(ev);
        if let Some(dir) = dir
            && !gone
        {
            let path = format!("{}/{}", dir.trim_end_matches('/'), fe.name);
            let found = super::entry::stat_of(e, tenant, id, &path).await;
            fe.entry = found.ok().map(Box::new);
        }
        out.push(fe);
    }
    out
}

/// The sandbox path a request names, checked as every file call's is.
fn watched_path(req: &WatchRequest) -> Result<String, ConnectError> {
    let p = to_sandbox_path(&req.path);
    check_watched(&p).map_err(connect_error)?;
    Ok(p)
}

fn watcher_id(req: &WatcherRequest) -> Result<u64, ConnectError> {
    req.watcher_id
        .parse()
        .map_err(|_| ConnectError::not_found(format!("no watcher {:?}", req.watcher_id)))
}

/// `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher`.
pub(super) async fn unary_call(
    c: &super::Call<'_>,
    method: &str,
) -> Result<Response, ConnectError> {
    let (e, b, id) = (c.e, c.b, c.id);
    let sessions = e.svc.sessions();
    match method {
        "CreateWatcher" => {
            let req: WatchRequest = c.unary()?;
            let p = watched_path(&req)?;
            let w = sessions
                .watch_start(&b.tenant, id, &p, req.recursive, "e2b")
                .await
                .map_err(connect_error)?;
            if req.include_entry {
                lock(&b.watch_entries).insert(w, p);
            }
            Ok(unary(&CreateWatcherResponse {
                watcher_id: w.to_string(),
            }))
        }
        "GetWatcherEvents" => {
            let req: WatcherRequest = c.unary()?;
            let watcher = watcher_id(&req)?;
            let batch = sessions
                .watch_read(&b.tenant, id, watcher)
                .await
                .map_err(connect_error)?;
            let dir = lock(&b.watch_entries).get(&watcher).cloned();
            if batch.dropped > 0 {
                tracing::debug!(
                    sandbox = id,
                    dropped = batch.dropped,
                    "watch events dropped"
                );
            }
            Ok(unary(&EventsResponse {
                events: events(e, &b.tenant, id, dir.as_deref(), batch.events).await,
            }))
        }
        _ => {
            let req: WatcherRequest = c.unary()?;
            let watcher = watcher_id(&req)?;
            lock(&b.watch_entries).remove(&watcher);
            sessions
                .watch_stop(&b.tenant, id, watcher)
                .await
                .map_err(connect_error)?;
            Ok(unary(&Empty {}))
        }
    }
}

/// `WatchDir`: the start message, then the events as they come (read every [`POLL`]),
/// keepalives, and the end when the watched directory goes or the sandbox does. The
/// client going away stops the watcher.
pub(super) async fn stream(c: &super::Call<'_>) -> Result<Response, ConnectError> {
    let req: WatchRequest = c.stream()?;
    let (e, b, id) = (c.e, c.b, c.id.to_string());
    let p = watched_path(&req)?;
    let keepalive = c.keepalive();
    let sessions = e.svc.sessions().clone();
    let tenant = b.tenant.clone();
    let watcher = sessions
        .watch_start(&tenant, &id, &p, req.recursive, "e2b")
        .await
        .map_err(connect_error)?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let r = Relay {
        e: e.clone(),
        tenant,
        id,
        watcher,
        dir: req.include_entry.then_some(p),
    };
    tokio::spawn(async move {
        let end = r.run(keepalive, &tx).await;
        let _ = sessions.watch_stop(&r.tenant, &r.id, watcher).await;
        if let Some(last) = end {
            let _ = tx.send(Ok(last)).await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok(connect::stream_response(Body::from_stream(stream)))
}

/// One `WatchDir` stream's watcher.
struct Relay {
    e: E2b,
    tenant: Tenant,
    id: String,
    watcher: u64,
    /// The watched directory, when the events carry their entries.
    dir: Option<String>,
}

impl Relay {
    /// Sends the stream's messages until it ends; the end-of-stream envelope to send, or
    /// `None` when the client went away.
    async fn run(
        &self,
        keepalive: Duration,
        tx: &mpsc::Sender<Result<Bytes, Infallible>>,
    ) -> Option<Bytes> {
        let sessions = self.e.svc.sessions();
        let (tenant, id) = (&self.tenant, self.id.as_str());
        tx.send(Ok(envelope(&StreamEvent::Start {}))).await.ok()?;
        let mut poll = tokio::time::interval(POLL);
        let mut alive = tokio::time::interval(keepalive);
        alive.tick().await;
        loop {
            tokio::select! {
                biased;
                _ = tx.closed() => return None,
                _ = alive.tick() => {
                    tx.send(Ok(envelope(&StreamEvent::Keepalive {}))).await.ok()?;
                }
                _ = poll.tick() => {
                    let batch = match sessions.watch_read(tenant, id, self.watcher).await {
                        Ok(b) => b,
                        Err(err) => return Some(end_stream(Some(&connect_error(err)))),
                    };
                    let dir = self.dir.as_deref();
                    for ev in events(&self.e, tenant, id, dir, batch.events).await {
                        tx.send(Ok(envelope(&StreamEvent::Filesystem(ev)))).await.ok()?;
                    }
                    if batch.ended {
                        return Some(end_stream(None));
                    }
                }
            }
        }
    }
}
