//! The snapshot routes (issue 46): take a snapshot of a live sandbox, list, get and delete
//! them, start sandboxes from one, and fork a live sandbox (a snapshot and its starts at
//! once).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::extract::{Auth, bytes_rejection, parse_id};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::model as m;
use crate::openapi::{Api, Op, SANDBOX};
use crate::service::{Service, StartOptions};

/// The errors of a snapshot being taken.
const TAKE: &[Code] = &[
    Code::InvalidRequest,
    Code::SandboxBusy,
    Code::SandboxPaused,
    Code::Unsupported,
    Code::SnapshotExists,
    Code::SnapshotQuota,
    Code::StorageLow,
    Code::SandboxFailure,
];

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::post("/v1/sandboxes/{id}/snapshots", "createSnapshot", "snapshots")
                .summary("Take a snapshot of a live sandbox of mine: full (memory, processes and files) or filesystem (files; processes start fresh), kept in the data dir until I delete it (it outlives the sandbox and a server restart) and counted in my max_snapshot_bytes; the sandbox runs on")
                .json::<m::SnapshotRequest>()
                .body_optional()
                .ok::<m::SnapshotInfo>(201, "taken")
                .errors(SANDBOX)
                .errors(TAKE),
            take,
        )
        .op(
            Op::get("/v1/snapshots", "listSnapshots", "snapshots")
                .summary("My snapshots, oldest first")
                .ok::<m::SnapshotList>(200, "my snapshots"),
            list,
        )
        .op(
            Op::get("/v1/snapshots/{id}", "getSnapshot", "snapshots")
                .summary("One of my snapshots, by id or name (another tenant's is 404)")
                .ok::<m::SnapshotInfo>(200, "the snapshot")
                .errors(&[Code::NotFound]),
            get,
        )
        .op(
            Op::delete("/v1/snapshots/{id}", "deleteSnapshot", "snapshots")
                .summary("Delete one of my snapshots and its image; sandboxes started from it live on")
                .ok::<m::SnapshotDeleted>(200, "deleted")
                .errors(&[Code::NotFound]),
            delete,
        )
        .op(
            Op::post("/v1/snapshots/{id}/sandboxes", "startFromSnapshot", "snapshots")
                .summary("Start 1 to 20 sandboxes from one of my snapshots: each a create through the gate with the snapshot's spec (never wider), its own id, limits, files, network identity, TTL, and grants' placeholders and tokens minted for it")
                .json::<m::StartFromSnapshotRequest>()
                .body_optional()
                .ok::<m::StartedFromSnapshot>(201, "started (errors lists those that did not)")
                .errors(&[Code::NotFound, Code::InvalidRequest])
                .errors(super::sandboxes::CREATE),
            start,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/fork", "forkSandbox", "snapshots")
                .summary("Fork a live sandbox of mine: a snapshot of it (full where its tier can, else filesystem), 1 to 20 sandboxes started from it, the snapshot then deleted")
                .json::<m::StartFromSnapshotRequest>()
                .body_optional()
                .ok::<m::StartedFromSnapshot>(201, "forked (errors lists those that did not start)")
                .errors(SANDBOX)
                .errors(TAKE)
                .errors(super::sandboxes::CREATE),
            fork,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

/// An optional JSON body: none (or only whitespace) is the type's default.
fn optional<T: DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(bytes_rejection)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("the request body: {e}")))
}

async fn take(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let req: m::SnapshotRequest = optional(body)?;
    let info = svc.snapshots().take(&t, &id, req.name, req.mode).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
) -> Result<Json<m::SnapshotList>, ApiError> {
    Ok(Json(m::SnapshotList {
        snapshots: svc.snapshots().list(&t).await?,
    }))
}

async fn get(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(key): Path<String>,
) -> Result<Json<m::SnapshotInfo>, ApiError> {
    Ok(Json(svc.snapshots().get(&t, &key).await?))
}

async fn delete(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(key): Path<String>,
) -> Result<Json<m::SnapshotDeleted>, ApiError> {
    let id = svc.snapshots().get(&t, &key).await?.id;
    svc.snapshots().delete(&t, &id).await?;
    Ok(Json(m::SnapshotDeleted { id }))
}

fn options(req: &m::StartFromSnapshotRequest) -> StartOptions {
    StartOptions {
        ttl: req.ttl,
        idle_timeout: req.idle_timeout,
        labels: req.labels.clone(),
    }
}

/// 201 with those that started; when none did, the first one's error.
fn started(
    snapshot: String,
    outcomes: Vec<Result<m::SandboxInfo, ApiError>>,
) -> Result<Response, ApiError> {
    let (mut sandboxes, mut errors) = (Vec::new(), Vec::new());
    for o in outcomes {
        match o {
            Ok(s) => sandboxes.push(s),
            Err(e) => errors.push(e),
        }
    }
    if sandboxes.is_empty() && !errors.is_empty() {
        return Err(errors.swap_remove(0));
    }
    let body = m::StartedFromSnapshot {
        snapshot,
        sandboxes,
        errors,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn start(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(key): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: m::StartFromSnapshotRequest = optional(body)?;
    let id = svc.snapshots().get(&t, &key).await?.id;
    let outcomes = svc
        .snapshots()
        .start(&t, &id, req.count.unwrap_or(1), options(&req))
        .await?;
    started(id, outcomes)
}

async fn fork(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let req: m::StartFromSnapshotRequest = optional(body)?;
    let (snap, outcomes) = svc
        .snapshots()
        .fork(&t, &id, req.count.unwrap_or(1), options(&req))
        .await?;
    started(snap, outcomes)
}
