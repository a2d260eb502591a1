//! The exec routes: an exec in a sandbox (whole, streamed or in the background) and the
//! one-shot run (create, exec, destroy).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cordon_core::ExecOutcome;
use tokio::sync::mpsc;

use axum::extract::DefaultBodyLimit;

use super::extract::{Auth, json_rejection, parse_id};
use super::sandboxes::CREATE;
use super::stream::{Mode, mode, stream_response};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::model::{self as m, ExecBody, RunRequest};
use crate::openapi::SANDBOX;
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::post("/v1/sandboxes/{id}/exec", "exec", "execs")
                .summary("Exec in a sandbox: lang + code, argv or wasm_base64. One JSON outcome; with stream: true or Accept: application/x-ndjson, stdout/stderr events as they come and a last outcome (or error) event (SSE with Accept: text/event-stream); with background: true its id at once (202)")
                .json::<ExecBody>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .ok::<m::ExecInfo>(202, "started in the background")
                .errors(SANDBOX)
                .errors(&[Code::SandboxBusy, Code::TooManyExecs, Code::Unsupported, Code::SandboxFailure]),
            exec,
        )
        .op(
            Op::post("/v1/run", "run", "run")
                .summary("One-shot: create, put files, exec, destroy; one JSON outcome or streamed events as for exec")
                .json::<RunRequest>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .errors(CREATE)
                .errors(&[Code::PathRefused, Code::FileError, Code::TooManyExecs]),
            run,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

async fn exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ExecBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(json_rejection)?;
    if body.background {
        let info = svc.procs().start_background(&t, &id, &body).await?;
        return Ok((StatusCode::ACCEPTED, Json(info)).into_response());
    }
    if body.pty.is_some() {
        return Err(ApiError::invalid(
            "a pseudo-terminal is for background execs: add \"background\": true, or leave out pty",
        ));
    }
    let m = mode(&headers, body.stream);
    let job = svc.execs().begin_exec(&t, &id, &body)?;
    if m == Mode::Whole {
        return Ok(Json(job.run(None).await?).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = job.run(Some(tx));
    Ok(stream_response(m, rx, fut, svc.output_gate(&t)))
}

async fn run(
    State(svc): State<Service>,
    Auth(t): Auth,
    headers: HeaderMap,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let (create, exec, files) = req.split()?;
    let m = mode(&headers, exec.stream);
    let job = svc.execs().begin_run(&t, create, &exec, files).await?;
    if m == Mode::Whole {
        return Ok(Json(job.run(None).await?).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = job.run(Some(tx));
    Ok(stream_response(m, rx, fut, svc.output_gate(&t)))
}
