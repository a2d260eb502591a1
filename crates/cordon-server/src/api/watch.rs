//! `GET /v1/sandboxes/{id}/watch?path=...&recursive=...`: changes under one of my
//! sandbox's workspace directories as server-sent events, as they come (the sandbox's own
//! watcher, bounded there, read every 100 ms): `change` events (`{"name","kind"}`, the
//! name relative to the directory), `dropped` (`{"dropped"}`: events lost to the sandbox's
//! bounds since the last), and `end` when the directory goes. The watcher stops when the
//! client goes away, and ends with the sandbox. (Not under `/files/`: a file named `watch`
//! stays reachable there.)

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::extract::{Auth, parse_id, query_rejection};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::openapi::{Api, Op, SANDBOX};
use crate::service::{Service, Sessions};

/// How often the stream reads what the sandbox's watcher queued.
const POLL: Duration = Duration::from_millis(100);

/// The directory to watch (a sandbox path, `/work` by default) and whether every
/// directory beneath it is watched too.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    pub path: Option<String>,
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Serialize)]
struct Dropped {
    dropped: u64,
}

pub(super) fn routes() -> Api {
    Api::default().op(
        Op::get("/v1/sandboxes/{id}/watch", "watchDir", "files")
            .summary("Watch a workspace directory of my sandbox: server-sent events `change` ({name, kind}: create, write, remove, rename or chmod; the name relative to the directory), `dropped` ({dropped}: lost to the sandbox's bounds) and `end` (the directory is gone); at most 16 watchers per sandbox; audited (watch_start)")
            .query::<WatchQuery>()
            .answer(200, "the events as they come", "text/event-stream", None)
            .errors(SANDBOX)
            .errors(&[Code::PathRefused, Code::FileError, Code::ResourceBusy, Code::Unsupported]),
        watch,
    )
}

async fn watch(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let path = q.path.unwrap_or_else(|| cordon_core::WORKDIR.to_string());
    let sessions = svc.sessions().clone();
    let watcher = sessions
        .watch_start(&t, &id, &path, q.recursive, "api")
        .await?;
    let (tx, rx) = mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        relay(&sessions, &t, &id, watcher, &tx).await;
        let _ = sessions.watch_stop(&t, &id, watcher).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok(ev), rx))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Sends the events until the directory goes, the sandbox does, or the client.
async fn relay(sessions: &Sessions, t: &Tenant, id: &str, watcher: u64, tx: &mpsc::Sender<Event>) {
    let mut poll = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = poll.tick() => {}
        }
        let batch = match sessions.watch_read(t, id, watcher).await {
            Ok(b) => b,
            Err(e) => {
                let ev = Event::default().event("error").json_data(&e);
                if let Ok(ev) = ev {
                    let _ = tx.send(ev).await;
                }
                return;
            }
        };
        if batch.dropped > 0
            && let Ok(ev) = Event::default().event("dropped").json_data(Dropped {
                dropped: batch.dropped,
            })
            && tx.send(ev).await.is_err()
        {
            return;
        }
        for change in batch.events {
            if let Ok(ev) = Event::default().event("change").json_data(&change)
                && tx.send(ev).await.is_err()
            {
                return;
            }
        }
        if batch.ended {
            let _ = tx.send(Event::default().event("end").data("{}")).await;
            return;
        }
    }
}
