//! The code context routes: start, list, delete and restart a context, and run a cell in
//! it (one JSON result, or its output streamed as NDJSON or SSE, then the result).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use crate::api::{Auth, Mode, json_rejection, mode, parse_id, stream_events};
use crate::error::ApiError;
use crate::model::{CellBody, ContextBody, ContextInfo};
use crate::service::Service;

/// A context's id: `ctx-` and a number.
fn parse_context_id(id: &str) -> Result<String, ApiError> {
    id.strip_prefix("ctx-")
        .filter(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
        .map(|_| id.to_string())
        .ok_or_else(|| ApiError::not_found("code context"))
}

/// The sandbox and context ids of a context route.
fn ids((id, cid): (String, String)) -> Result<(String, String), ApiError> {
    Ok((parse_id(&id)?, parse_context_id(&cid)?))
}

pub(crate) async fn create(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<ContextBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(json_rejection)?;
    let info = svc.create_context(&t, &id, &body).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

pub(crate) async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::ContextList>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(crate::model::ContextList {
        contexts: svc.list_contexts(&t, &id)?,
    }))
}

pub(crate) async fn delete(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(p): Path<(String, String)>,
) -> Result<Json<ContextInfo>, ApiError> {
    let (id, cid) = ids(p)?;
    Ok(Json(svc.delete_context(&t, &id, &cid).await?))
}

pub(crate) async fn restart(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(p): Path<(String, String)>,
) -> Result<Json<ContextInfo>, ApiError> {
    let (id, cid) = ids(p)?;
    Ok(Json(svc.restart_context(&t, &id, &cid).await?))
}

/// Runs a cell: the whole result, or `stdout`/`stderr` events as they come and a last
/// `result` (or `error`) event.
pub(crate) async fn run(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(p): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Json<CellBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (id, cid) = ids(p)?;
    let Json(body) = body.map_err(json_rejection)?;
    let m = mode(&headers, body.stream);
    if m == Mode::Whole {
        return Ok(Json(svc.run_cell(&t, &id, &cid, body, None).await?).into_response());
    }
    // Refused before the stream starts when the context is not this tenant's.
    svc.context_check(&t, &id, &cid)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = async move { svc.run_cell(&t, &id, &cid, body, Some(tx)).await };
    Ok(stream_events(m, rx, fut, "result"))
}
