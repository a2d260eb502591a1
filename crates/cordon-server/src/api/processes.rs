//! The background exec routes: list, attach, stop, stdin and resize.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use cordon_core::ExecOutcome;
use serde::Deserialize;
use tokio::sync::mpsc;

use axum::extract::DefaultBodyLimit;

use super::extract::{Auth, json_rejection, parse_id, query_rejection};
use super::stream::{Mode, mode, stream_response};
use crate::config::HttpLimits;
use crate::error::ApiError;
use crate::model as m;
use crate::openapi::SANDBOX;
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::get("/v1/sandboxes/{id}/execs", "listExecs", "execs")
                .summary("The sandbox's background execs")
                .ok::<m::ExecList>(200, "its background execs")
                .errors(SANDBOX),
            list_execs,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/execs/{exec_id}", "attachExec", "execs")
                .summary("Attach to a background exec: its output so far, then live, then its outcome (NDJSON; SSE with Accept: text/event-stream; one JSON outcome with stream=false). A tenant has at most sessions.max_attach_streams_per_tenant attaches open, a sandbox sessions.max_attach_streams_per_sandbox (429 resource_busy past them)")
                .query::<AttachQuery>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .errors(SANDBOX)
                .errors(&[crate::error::Code::ResourceBusy]),
            attach,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/execs/{exec_id}", "stopExec", "execs")
                .summary("Stop a background exec: SIGTERM to its process tree, SIGKILL after sessions.kill_grace (signal=kill: at once)")
                .query::<StopQuery>()
                .ok::<m::ExecInfo>(200, "the exec")
                .errors(SANDBOX),
            stop_exec,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/execs/{exec_id}/stdin", "execStdin", "execs")
                .summary("Write to a background exec's stdin (data or data_base64), and close it with close: true")
                .json::<m::StdinBody>()
                .ok::<m::StdinWritten>(200, "written")
                .errors(SANDBOX),
            exec_stdin,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/execs/{exec_id}/resize", "resizeExec", "execs")
                .summary("Resize a background exec's pseudo-terminal (TIOCSWINSZ: its program gets SIGWINCH)")
                .json::<m::ResizeBody>()
                .ok::<m::ExecInfo>(200, "the exec")
                .errors(SANDBOX),
            resize_exec,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

/// A background exec's id: `ex-` and a number.
fn parse_exec_id(id: &str) -> Result<String, ApiError> {
    id.strip_prefix("ex-")
        .filter(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
        .map(|_| id.to_string())
        .ok_or_else(|| ApiError::not_found("background exec"))
}

async fn list_execs(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::ExecList>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(crate::model::ExecList {
        execs: svc.procs().list_execs(&t, &id).await?,
    }))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AttachQuery {
    /// false: wait and answer the outcome as one JSON object; true (the default): stream.
    #[serde(default)]
    stream: Option<bool>,
}

/// Attaches to a background exec: replayed output, live output, then its outcome (NDJSON
/// by default, SSE with `Accept: text/event-stream`, one JSON outcome with `?stream=false`).
async fn attach(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    headers: HeaderMap,
    q: Result<Query<AttachQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let m = match mode(&headers, q.stream.unwrap_or(true)) {
        Mode::Whole if q.stream.is_none() => Mode::Ndjson,
        m => m,
    };
    if m == Mode::Whole {
        return Ok(Json(svc.procs().attach(&t, &id, &exec_id, None, None).await?).into_response());
    }
    // Refused before the stream starts when the exec is not this tenant's, or when the
    // tenant or the sandbox has its limit of streams open (429 resource_busy).
    svc.procs().list_execs_check(&t, &id, &exec_id)?;
    let slot = svc.procs().attach_slot(&t, &id)?;
    let gate = svc.output_gate(&t);
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = async move {
        svc.procs()
            .attach(&t, &id, &exec_id, Some(tx), Some(slot))
            .await
    };
    Ok(stream_response(m, rx, fut, gate))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct StopQuery {
    /// `term` (the default: SIGTERM, then SIGKILL after the grace) or `kill` (at once).
    #[serde(default)]
    signal: Option<String>,
}

async fn stop_exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    q: Result<Query<StopQuery>, QueryRejection>,
) -> Result<Json<crate::model::ExecInfo>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let kill = match q.signal.as_deref() {
        None | Some("term") => false,
        Some("kill") => true,
        Some(_) => return Err(ApiError::invalid("signal must be term or kill")),
    };
    Ok(Json(
        svc.procs().exec_signal(&t, &id, &exec_id, kill).await?,
    ))
}

async fn exec_stdin(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    body: Result<Json<crate::model::StdinBody>, JsonRejection>,
) -> Result<Json<crate::model::StdinWritten>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Json(body) = body.map_err(json_rejection)?;
    let data = body.bytes()?;
    let n = data.len();
    svc.procs()
        .exec_stdin(&t, &id, &exec_id, data, body.close)
        .await?;
    Ok(Json(crate::model::StdinWritten {
        bytes: n as u64,
        closed: body.close,
    }))
}

async fn resize_exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    body: Result<Json<crate::model::ResizeBody>, JsonRejection>,
) -> Result<Json<crate::model::ExecInfo>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Json(body) = body.map_err(json_rejection)?;
    let size = cordon_core::PtySize {
        rows: body.rows,
        cols: body.cols,
    };
    Ok(Json(
        svc.procs().exec_resize(&t, &id, &exec_id, size).await?,
    ))
}
