//! The sandbox routes: create, list, get, change, pause, resume and destroy.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use axum::extract::DefaultBodyLimit;

use super::extract::{Auth, bytes_rejection, json_rejection, parse_id};
use crate::config::HttpLimits;
use crate::openapi::{Api, Op};
use serde_json::json;

use crate::error::{ApiError, Code};
use crate::model::{self as m, CreateRequest};
use crate::openapi::SANDBOX;
use crate::service::Service;

/// The errors of a create (and of a one-shot run's create).
pub(super) const CREATE: &[Code] = &[
    Code::NotFound,
    Code::PolicyDenied,
    Code::TierUnavailable,
    Code::GrantUnavailable,
    Code::LayerUnavailable,
    Code::TooManySandboxes,
    Code::ResourceBusy,
    Code::VolumeInUse,
    Code::StorageLow,
    Code::ShuttingDown,
    Code::SandboxFailure,
];

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::post("/v1/sandboxes", "createSandbox", "sandboxes")
                .summary("Create a sandbox (fresh from the warm pool when the spec is the pool's), through the operator's ceiling and the tier policy")
                .json::<CreateRequest>()
                .ok::<m::SandboxInfo>(201, "created")
                .errors(CREATE),
            create,
        )
        .op(
            Op::get("/v1/sandboxes", "listSandboxes", "sandboxes")
                .summary("List my live sandboxes, optionally only those carrying every given label")
                .query_param("label", "key=value; repeat it to ask for several labels", json!({"type": "string"}))
                .ok::<m::SandboxList>(200, "my sandboxes")
                .errors(&[Code::InvalidRequest]),
            list,
        )
        .op(
            Op::get("/v1/sandboxes/{id}", "getSandbox", "sandboxes")
                .summary("One of my live sandboxes")
                .ok::<m::SandboxInfo>(200, "the sandbox")
                .errors(&[Code::NotFound]),
            info,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}", "destroySandbox", "sandboxes")
                .summary("Destroy (idempotent: destroying a destroyed sandbox of mine succeeds with already=true)")
                .ok::<m::Destroyed>(200, "destroyed")
                .errors(&[Code::NotFound]),
            destroy,
        )
        .op(
            Op::patch("/v1/sandboxes/{id}", "updateSandbox", "sandboxes")
                .summary("Change a sandbox's TTL (from its creation, paused time not counted) or idle timeout, within the server's maxima")
                .json::<m::PatchRequest>()
                .ok::<m::SandboxInfo>(200, "the sandbox")
                .errors(SANDBOX),
            patch,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/pause", "pauseSandbox", "sandboxes")
                .summary("Pause: every process stops where it is (no CPU), memory kept, TTL clock stopped; with to_disk (microvm) the whole sandbox is saved to disk, its memory freed, and it survives a server restart")
                .json::<m::PauseRequest>()
                .body_optional()
                .ok::<m::SandboxInfo>(200, "paused")
                .errors(SANDBOX)
                .errors(&[Code::SandboxBusy, Code::Unsupported, Code::PausedQuota, Code::StorageLow, Code::SandboxFailure]),
            pause,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/resume", "resumeSandbox", "sandboxes")
                .summary("Resume a paused sandbox")
                .ok::<m::SandboxInfo>(200, "running again")
                .errors(SANDBOX)
                .errors(&[Code::SandboxFailure]),
            resume,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

async fn create(
    State(svc): State<Service>,
    Auth(t): Auth,
    body: Result<Json<CreateRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let info = svc.sessions().create(&t, req).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// `?label=k=v` (repeatable): only sandboxes carrying every such label.
async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> Result<Json<crate::model::SandboxList>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::invalid(format!("the query is not valid: {e}")))?;
    let mut labels = Vec::new();
    for (k, v) in pairs {
        if k != "label" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {k:?}; the list takes label=key=value"
            )));
        }
        let (lk, lv) = v
            .split_once('=')
            .ok_or_else(|| ApiError::invalid("give label=key=value"))?;
        labels.push((lk.to_string(), lv.to_string()));
    }
    Ok(Json(crate::model::SandboxList {
        sandboxes: svc.sessions().list(&t, &labels),
        on_disk_bytes: svc.sessions().on_disk_bytes(&t),
    }))
}

/// An optional body: none (or an empty one) pauses in memory; `{"to_disk": true}` to disk;
/// `{"files_only": true}` keeps its files only.
async fn pause(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    let body = body.map_err(bytes_rejection)?;
    let req: crate::model::PauseRequest = if body.iter().all(u8::is_ascii_whitespace) {
        Default::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::invalid(format!(
                "the pause body: {e}; give {{\"to_disk\": true}}, {{\"files_only\": true}} or none"
            ))
        })?
    };
    let mode = crate::service::PauseMode::of(req.to_disk, req.files_only)?;
    Ok(Json(svc.sessions().pause(&t, &id, mode).await?))
}

async fn resume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.sessions().resume(&t, &id).await?))
}

async fn patch(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<crate::model::PatchRequest>, JsonRejection>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    let Json(req) = body.map_err(json_rejection)?;
    Ok(Json(svc.sessions().patch(&t, &id, req).await?))
}

async fn info(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.sessions().info(&t, &id).await?).into_response())
}

async fn destroy(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::Destroyed>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.sessions().destroy(&t, &id).await?))
}
