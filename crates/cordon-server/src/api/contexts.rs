//! The code context routes: start, list, delete and restart a context, and run a cell in
//! it (one JSON result, or its output streamed as NDJSON or SSE, then the result).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::extract::{Auth, json_rejection, parse_id};
use super::stream::{Mode, mode, stream_events};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::model as m;
use crate::model::{CellBody, ContextBody, ContextInfo};
use crate::openapi::{Api, Op, SANDBOX};
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
    if body.default && body.cwd.is_some() {
        return Err(ApiError::invalid(
            "a default context starts in the workspace: leave out cwd, or make a context of your own",
        ));
    }
    let info = svc.contexts().create_context(&t, &id, &body).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

pub(crate) async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::ContextList>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(crate::model::ContextList {
        contexts: svc.contexts().list_contexts(&t, &id)?,
    }))
}

pub(crate) async fn delete(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(p): Path<(String, String)>,
) -> Result<Json<ContextInfo>, ApiError> {
    let (id, cid) = ids(p)?;
    Ok(Json(svc.contexts().delete_context(&t, &id, &cid).await?))
}

pub(crate) async fn restart(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(p): Path<(String, String)>,
) -> Result<Json<ContextInfo>, ApiError> {
    let (id, cid) = ids(p)?;
    Ok(Json(svc.contexts().restart_context(&t, &id, &cid).await?))
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
        return Ok(Json(svc.contexts().run_cell(&t, &id, &cid, body, None).await?).into_response());
    }
    // Refused before the stream starts when the context is not this tenant's.
    svc.contexts().context_check(&t, &id, &cid)?;
    let gate = svc.output_gate(&t);
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = async move { svc.contexts().run_cell(&t, &id, &cid, body, Some(tx)).await };
    Ok(stream_events(m, rx, fut, "result", gate))
}

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::post("/v1/sandboxes/{id}/contexts", "createContext", "contexts")
                .summary("Start a code context: a long-lived Python or JavaScript interpreter whose state persists between cells (container, gvisor, microvm; JavaScript: container)")
                .json::<m::ContextBody>()
                .ok::<m::ContextInfo>(201, "started")
                .errors(SANDBOX)
                .errors(&[Code::TooManyContexts, Code::Unsupported, Code::SandboxFailure]),
            create,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/contexts", "listContexts", "contexts")
                .summary("The sandbox's code contexts")
                .ok::<m::ContextList>(200, "its contexts")
                .errors(SANDBOX),
            list,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/contexts/{context_id}", "deleteContext", "contexts")
                .summary("End a code context (its interpreter is killed; a cell running in it ends as died)")
                .ok::<m::ContextInfo>(200, "ended")
                .errors(SANDBOX),
            delete,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/contexts/{context_id}/restart", "restartContext", "contexts")
                .summary("Start the context's interpreter again: its variables and imports are gone")
                .ok::<m::ContextInfo>(200, "restarted")
                .errors(SANDBOX)
                .errors(&[Code::ContextBusy, Code::SandboxFailure]),
            restart,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/contexts/{context_id}/run", "runCell", "contexts")
                .summary("Run a cell: one JSON result, or (stream: true or Accept: application/x-ndjson; SSE with Accept: text/event-stream) stdout/stderr events as they come and a last result (or error) event. One cell at a time per context (409 context_busy)")
                .json::<m::CellBody>()
                .ok::<m::CellResult>(200, "the cell's result, or the stream of events")
                .answer(200, "the cell's result, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the cell's result, or the stream of events", "text/event-stream", None)
                .errors(SANDBOX)
                .errors(&[Code::ContextBusy, Code::SandboxFailure]),
            run,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}
