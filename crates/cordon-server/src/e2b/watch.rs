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
use super::{check_reachable, connect_error, to_sandbox_path};

/// How often a stream asks the sandbox for what its watcher queued.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    /// Sent only by SDKs talking to envd ≥ 0.6.3; Cordon advertises less, so it is false.
    #[serde(default)]
    include_entry: bool,
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

/// The sandbox path a request names, checked as every file call's is.
fn watched_path(req: &WatchRequest) -> Result<String, ConnectError> {
    if req.include_entry {
        return Err(ConnectError::unimplemented(
            "entries in watch events (include_entry) are not served; stat the named path",
        ));
    }
    let p = to_sandbox_path(&req.path);
    check_reachable(&p).map_err(connect_error)?;
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
            Ok(unary(&CreateWatcherResponse {
                watcher_id: w.to_string(),
            }))
        }
        "GetWatcherEvents" => {
            let req: WatcherRequest = c.unary()?;
            let batch = sessions
                .watch_read(&b.tenant, id, watcher_id(&req)?)
                .await
                .map_err(connect_error)?;
            if batch.dropped > 0 {
                tracing::debug!(
                    sandbox = id,
                    dropped = batch.dropped,
                    "watch events dropped"
                );
            }
            Ok(unary(&EventsResponse {
                events: batch.events.into_iter().map(fs_event).collect(),
            }))
        }
        _ => {
            let req: WatcherRequest = c.unary()?;
            sessions
                .watch_stop(&b.tenant, id, watcher_id(&req)?)
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
    tokio::spawn(async move {
        let end = relay(&sessions, &tenant, &id, watcher, keepalive, &tx).await;
        let _ = sessions.watch_stop(&tenant, &id, watcher).await;
        if let Some(last) = end {
            let _ = tx.send(Ok(last)).await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok(connect::stream_response(Body::from_stream(stream)))
}

/// Sends the stream's messages until it ends; the end-of-stream envelope to send, or
/// `None` when the client went away.
async fn relay(
    sessions: &crate::service::Sessions,
    tenant: &crate::keys::Tenant,
    id: &str,
    watcher: u64,
    keepalive: Duration,
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
) -> Option<Bytes> {
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
                let batch = match sessions.watch_read(tenant, id, watcher).await {
                    Ok(b) => b,
                    Err(err) => return Some(end_stream(Some(&connect_error(err)))),
                };
                for ev in batch.events {
                    let msg = envelope(&StreamEvent::Filesystem(fs_event(ev)));
                    tx.send(Ok(msg)).await.ok()?;
                }
                if batch.ended {
                    return Some(end_stream(None));
                }
            }
        }
    }
}
