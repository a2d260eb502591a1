//! envd, E2B's in-sandbox daemon, as Cordon serves it from the host: processes (Connect
//! RPC over Cordon's background execs: start, connect, list, input, signals, a PTY's size),
//! the file system (Connect RPC over Cordon's file operations) and `/files` (over its file
//! calls). Every call is the native service call, audited as such.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::FromRequest;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use cordon_core::units::Dur;
use cordon_core::{OutputStream, Termination};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::connect::{
    self, ConnectError, end_stream, envelope, split_envelopes, stream_error, unary,
};
use super::wire::*;
use super::{
    Auth, Call, E2b, E2bBox, ENVD_PORT, ProcRecord, check_user, connect_error, header_u64, lock,
    retry_busy,
};
use crate::error::Code;
use crate::model::ExecBody;
use crate::service::{AttachSlot, Chunk};

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(s: &str) -> Result<Vec<u8>, ConnectError> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| ConnectError::invalid(format!("input is not base64: {e}")))
}

/// `GET /health`: the sandbox's daemon answers while the sandbox runs (502 otherwise, as
/// E2B's proxy does); without sandbox headers, the listener itself.
pub(super) async fn health(State(e): State<E2b>, headers: HeaderMap) -> Response {
    if headers.contains_key("e2b-sandbox-id")
        && let Err(r) = e.sandbox(&headers, ENVD_PORT, Auth::Liveness).await
    {
        return r;
    }
    StatusCode::NO_CONTENT.into_response()
}

fn is_stream(method: &str) -> bool {
    matches!(method, "Start" | "Connect" | "StreamInput" | "WatchDir")
}

/// `/process.Process/{method}`.
pub(super) async fn process(
    State(e): State<E2b>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let (id, b) = match e.sandbox(&headers, ENVD_PORT, Auth::Envd).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let fail = |err: ConnectError| {
        if is_stream(&method) {
            stream_error(&err)
        } else {
            err.into_response()
        }
    };
    if let Err(err) = check_user(&headers, None) {
        return fail(err);
    }
    if method == "StreamInput" {
        return stream_input(&e, &id, &b, &headers, req.into_body()).await;
    }
    let body = match Bytes::from_request(req, &()).await {
        Ok(b) => b,
        Err(r) => {
            return fail(ConnectError::invalid(format!(
                "reading the request: {}",
                r.body_text()
            )));
        }
    };
    let c = Call {
        e: &e,
        id: &id,
        b: &b,
        headers: &headers,
        body: &body,
    };
    let r = match method.as_str() {
        "Start" => return start(&c).await.unwrap_or_else(|e| stream_error(&e)),
        "Connect" => {
            return attach_existing(&c)
                .await
                .unwrap_or_else(|e| stream_error(&e));
        }
        "List" => list(&e, &id, &b).await,
        "SendInput" => send_input(&c).await,
        "CloseStdin" => close_stdin(&c).await,
        "SendSignal" => send_signal(&c).await,
        "Update" => update(&c).await,
        other => Err(ConnectError::unimplemented(format!(
            "process.Process/{other} is not served by Cordon's E2B listener"
        ))),
    };
    r.unwrap_or_else(IntoResponse::into_response)
}

fn pid_of(exec_id: &str) -> Option<u32> {
    exec_id.strip_prefix("ex-").and_then(|n| n.parse().ok())
}

/// The process a selector names: by pid (any of the sandbox's background execs) or by tag.
fn find(b: &E2bBox, sel: &ProcessSelector) -> Result<(u32, ProcRecord), ConnectError> {
    let procs = lock(&b.procs);
    if let Some(pid) = sel.pid {
        return Ok(match procs.get(&pid) {
            Some(r) => (pid, r.clone()),
            None => (
                pid,
                ProcRecord {
                    exec_id: format!("ex-{pid}"),
                    config: ProcessConfig::default(),
                    tag: None,
                    pty: false,
                    timed_out: Default::default(),
                },
            ),
        });
    }
    if let Some(tag) = &sel.tag {
        return procs
            .iter()
            .find(|(_, r)| r.tag.as_deref() == Some(tag.as_str()))
            .map(|(p, r)| (*p, r.clone()))
            .ok_or_else(|| ConnectError::not_found(format!("no process with tag {tag:?}")));
    }
    Err(ConnectError::invalid("name the process by pid or tag"))
}

async fn start(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: StartRequest = c.stream()?;
    let (e, b, id) = (c.e, c.b, c.id.to_string());
    // The stream's place is taken before the process starts: a refusal (the tenant's or
    // the sandbox's streams at their limit) leaves nothing running.
    let slot = e
        .svc
        .procs()
        .attach_slot(&b.tenant, &id)
        .map_err(connect_error)?;
    // Connect-Timeout-Ms is the process's lifetime, as envd runs it under a context with
    // that deadline (none, or 0: until the sandbox ends).
    let max = e.svc.config().max_limits.timeout_ms;
    let timeout = header_u64(c.headers, "connect-timeout-ms")
        .filter(|t| *t > 0)
        .map(|t| Dur(Duration::from_millis(t.min(max))));
    let keepalive = c.keepalive();
    let cwd = req
        .process
        .cwd
        .as_deref()
        .filter(|c| !c.is_empty())
        // As given: `/home/user` is the workspace's second mount point.
        .map(|c| {
            if c.starts_with('/') {
                c.to_string()
            } else {
                format!("{}/{c}", super::HOME)
            }
        })
        .unwrap_or_else(|| super::HOME.to_string());
    let mut argv = vec![req.process.cmd.clone()];
    argv.extend(req.process.args.iter().cloned());
    let pty = req.pty.map(|p| {
        let s = p.size.unwrap_or(PtySizeMsg { cols: 80, rows: 24 });
        cordon_core::PtySize {
            rows: s.rows,
            cols: s.cols,
        }
    });
    // PWD as a login shell would have it (the shell keeps a PWD that names its directory).
    let mut env = req.process.envs.clone();
    env.entry("PWD".to_string()).or_insert_with(|| cwd.clone());
    let exec = ExecBody {
        argv: Some(argv),
        env,
        cwd: Some(cwd),
        background: true,
        pty,
        timeout,
        ..Default::default()
    };
    let info = retry_busy(|| e.svc.procs().start_background(&b.tenant, &id, &exec))
        .await
        .map_err(connect_error)?;
    let pid = pid_of(&info.id)
        .ok_or_else(|| ConnectError::new("internal", "an exec id without a number"))?;
    let timed_out = Arc::new(AtomicBool::new(false));
    lock(&b.procs).insert(
        pid,
        ProcRecord {
            exec_id: info.id.clone(),
            config: req.process.clone(),
            tag: req.tag.clone(),
            pty: pty.is_some(),
            timed_out: timed_out.clone(),
        },
    );
    if let Some(Dur(lifetime)) = timeout {
        kill_at_deadline(e, b, &id, &info.id, lifetime, timed_out);
    }
    // Without `stdin: true` the process reads end of file at once, as under envd.
    // (A process that has ended already needs no end of file.)
    if pty.is_none() && req.stdin != Some(true) {
        let _ = e
            .svc
            .procs()
            .exec_stdin(&b.tenant, &id, &info.id, Vec::new(), true)
            .await;
    }
    Ok(events(
        e,
        b,
        (id, info.id, pid),
        pty.is_some(),
        keepalive,
        slot,
    ))
}

/// Kills the process `lifetime` after its start if it still runs (a background exec
/// carries no timeout of its own; the sandbox's end stops it too).
fn kill_at_deadline(
    e: &E2b,
    b: &E2bBox,
    id: &str,
    exec_id: &str,
    lifetime: Duration,
    timed_out: Arc<AtomicBool>,
) {
    let svc = e.svc.clone();
    let (tenant, id, exec_id) = (b.tenant.clone(), id.to_string(), exec_id.to_string());
    tokio::spawn(async move {
        tokio::time::sleep(lifetime).await;
        let running = svc
            .procs()
            .list_execs(&tenant, &id)
            .await
            .is_ok_and(|l| l.iter().any(|x| x.id == exec_id && x.state == "running"));
        if running {
            timed_out.store(true, Ordering::SeqCst);
            let _ = svc.procs().exec_signal(&tenant, &id, &exec_id, true).await;
        }
    });
}

async fn attach_existing(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: ProcessRequest = c.stream()?;
    let (e, b, id) = (c.e, c.b, c.id.to_string());
    let (pid, rec) = find(b, &req.process)?;
    e.svc
        .procs()
        .list_execs_check(&b.tenant, &id, &rec.exec_id)
        .map_err(|_| ConnectError::not_found(format!("process with pid {pid} not found")))?;
    let slot = e
        .svc
        .procs()
        .attach_slot(&b.tenant, &id)
        .map_err(connect_error)?;
    let keepalive = c.keepalive();
    Ok(events(
        e,
        b,
        (id, rec.exec_id, pid),
        rec.pty,
        keepalive,
        slot,
    ))
}

/// A process's events: its start, its output as it comes (replayed from its start, as
/// much as the sandbox keeps), keepalives, and its end (or the error that ended it), then
/// the end-of-stream message. The client going away leaves the process running.
fn events(
    e: &E2b,
    b: &E2bBox,
    (id, exec_id, pid): (String, String, u32),
    pty: bool,
    keepalive: Duration,
    slot: AttachSlot,
) -> Response {
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let svc = e.svc.clone();
    let tenant = b.tenant.clone();
    let gate = svc.output_gate(&tenant);
    let timed_out = lock(&b.procs)
        .get(&pid)
        .map(|r| r.timed_out.clone())
        .unwrap_or_default();
    tokio::spawn(async move {
        if out_tx
            .send(Ok(envelope(&EventMsg {
                event: ProcessEvent::Start { pid },
            })))
            .await
            .is_err()
        {
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
        let fut = async move {
            svc.procs()
                .attach(&tenant, &id, &exec_id, Some(tx), Some(slot))
                .await
        };
        let mut done = std::pin::pin!(fut);
        let mut tick = tokio::time::interval(keepalive);
        tick.tick().await;
        // A large chunk is encoded on the blocking pool, one of the tenant's at a time
        // (as the native streams', `api::stream`).
        let data = |c: Chunk| {
            let gate = gate.clone();
            async move {
                if c.data.len() <= crate::api::OFF_WORKERS {
                    return data_event(pty, c);
                }
                let _turn = gate.acquire().await.ok();
                tokio::task::spawn_blocking(move || data_event(pty, c))
                    .await
                    .unwrap_or_default()
            }
        };
        let result = loop {
            tokio::select! {
                biased;
                _ = out_tx.closed() => return,
                Some(c) = rx.recv() => {
                    let _ = out_tx.send(Ok(data(c).await)).await;
                }
                _ = tick.tick() => {
                    let _ = out_tx.send(Ok(envelope(&EventMsg { event: ProcessEvent::Keepalive {} }))).await;
                }
                r = &mut done => break r,
            }
        };
        while let Ok(c) = rx.try_recv() {
            let _ = out_tx.send(Ok(data(c).await)).await;
        }
        let last = match result {
            Ok(o) if o.termination == Termination::Timeout || timed_out.load(Ordering::SeqCst) => {
                end_stream(Some(&ConnectError::new(
                    "deadline_exceeded",
                    "the process ran past its timeout (the call's Connect-Timeout-Ms) and Cordon killed it",
                )))
            }
            Ok(o) => {
                let _ = out_tx
                    .send(Ok(envelope(&EventMsg {
                        event: ProcessEvent::End(end_event(&o)),
                    })))
                    .await;
                end_stream(None)
            }
            // The sandbox ended under the process: as when E2B's sandbox goes away, the
            // stream breaks off (no end message); the SDKs then ask /health (502) and raise
            // their sandbox-killed error (JavaScript's only on a broken stream).
            Err(err) if err.code == crate::Code::SandboxGone => {
                let _ = out_tx
                    .send(Err(std::io::Error::other(
                        "the sandbox ended under the process",
                    )))
                    .await;
                return;
            }
            Err(err) => end_stream(Some(&connect_error(err))),
        };
        let _ = out_tx.send(Ok(last)).await;
    });
    let stream = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    connect::stream_response(Body::from_stream(stream))
}

/// One output chunk as envd's data event (base64, as envd sends bytes).
fn data_event(pty: bool, c: Chunk) -> Bytes {
    let mut d = DataEvent::default();
    let text = Some(b64(&c.data));
    match (pty, c.stream) {
        (true, _) => d.pty = text,
        (false, OutputStream::Stdout) => d.stdout = text,
        (false, OutputStream::Stderr) => d.stderr = text,
    }
    envelope(&EventMsg {
        event: ProcessEvent::Data(d),
    })
}

fn signal_name(sig: i32) -> String {
    match sig {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        1 => "hangup".into(),
        n => format!("signal {n}"),
    }
}

/// How a process ended, as envd reports it (Go's `ProcessState`: a signal gives exit code
/// -1), from the classified ending: a Cordon limit that stopped it is named in `error`, with
/// the exit status `cordon run` gives that limit ([`cordon_core::exit_code_for`]) when the
/// program left none of its own.
fn end_event(o: &cordon_core::ExecOutcome) -> EndEvent {
    let code = o.exit_code.unwrap_or_else(|| cordon_core::exit_code_for(o));
    let limit = match o.termination {
        Termination::Exited => None,
        Termination::Signalled | Termination::Killed | Termination::Cancelled => {
            return EndEvent {
                exit_code: -1,
                exited: false,
                status: format!("signal: {}", signal_name(o.signal.unwrap_or(9))),
                error: None,
            };
        }
        Termination::OutOfMemory => Some("out of memory (the sandbox's memory limit)"),
        Termination::ProcessLimit => Some("the sandbox's process limit"),
        Termination::OutputLimit => Some("more output than the sandbox's output limit"),
        Termination::DiskLimit => Some("the sandbox's disk limit"),
        Termination::Timeout => Some("its timeout"),
        Termination::SandboxFailure => Some("the sandbox failed"),
    };
    EndEvent {
        exit_code: code,
        exited: o.exit_code.is_some(),
        status: format!("exit status {code}"),
        error: limit.map(|what| format!("Cordon stopped it: {what}")),
    }
}

async fn list(e: &E2b, id: &str, b: &E2bBox) -> Result<Response, ConnectError> {
    let execs = e
        .svc
        .procs()
        .list_execs(&b.tenant, id)
        .await
        .map_err(connect_error)?;
    let procs = lock(&b.procs);
    let processes = execs
        .into_iter()
        .filter(|x| x.state == "running")
        .filter_map(|x| {
            let pid = pid_of(&x.id)?;
            Some(match procs.get(&pid) {
                Some(r) => ProcessInfo {
                    config: r.config.clone(),
                    pid,
                    tag: r.tag.clone(),
                },
                None => ProcessInfo {
                    config: ProcessConfig {
                        cmd: x.command.clone(),
                        ..Default::default()
                    },
                    pid,
                    tag: None,
                },
            })
        })
        .collect();
    Ok(unary(&ListResponse { processes }))
}

async fn send_input(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: SendInputRequest = c.unary()?;
    let (e, b, id) = (c.e, c.b, c.id);
    let (_, rec) = find(b, &req.process)?;
    let data = match (&req.input.stdin, &req.input.pty) {
        (Some(s), _) | (None, Some(s)) => unb64(s)?,
        (None, None) => Vec::new(),
    };
    write_input(e, id, b, &rec, data, false).await?;
    Ok(unary(&Empty {}))
}

async fn write_input(
    e: &E2b,
    id: &str,
    b: &E2bBox,
    rec: &ProcRecord,
    data: Vec<u8>,
    close: bool,
) -> Result<(), ConnectError> {
    e.svc
        .procs()
        .exec_stdin(&b.tenant, id, &rec.exec_id, data, close)
        .await
        .map_err(|err| match err.code {
            Code::NotFound => ConnectError::not_found("process not found"),
            _ => connect_error(err),
        })
}

async fn close_stdin(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: ProcessRequest = c.unary()?;
    let (e, b, id) = (c.e, c.b, c.id);
    let (_, rec) = find(b, &req.process)?;
    write_input(e, id, b, &rec, Vec::new(), true).await?;
    Ok(unary(&Empty {}))
}

async fn send_signal(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: SendSignalRequest = c.unary()?;
    let (e, b, id) = (c.e, c.b, c.id);
    let kill = match req.signal.as_str() {
        "SIGNAL_SIGKILL" => true,
        "SIGNAL_SIGTERM" => false,
        other => {
            return Err(ConnectError::invalid(format!(
                "signal {other:?}: Cordon sends SIGNAL_SIGTERM or SIGNAL_SIGKILL"
            )));
        }
    };
    let (pid, rec) = find(b, &req.process)?;
    let running = e
        .svc
        .procs()
        .list_execs(&b.tenant, id)
        .await
        .map_err(connect_error)?
        .iter()
        .any(|x| x.id == rec.exec_id && x.state == "running");
    if !running {
        return Err(ConnectError::not_found(format!(
            "process with pid {pid} not found"
        )));
    }
    e.svc
        .procs()
        .exec_signal(&b.tenant, id, &rec.exec_id, kill)
        .await
        .map_err(connect_error)?;
    Ok(unary(&Empty {}))
}

async fn update(c: &Call<'_>) -> Result<Response, ConnectError> {
    let req: UpdateRequest = c.unary()?;
    let (e, b, id) = (c.e, c.b, c.id);
    let (_, rec) = find(b, &req.process)?;
    if let Some(size) = req.pty.and_then(|p| p.size) {
        e.svc
            .procs()
            .exec_resize(
                &b.tenant,
                id,
                &rec.exec_id,
                cordon_core::PtySize {
                    rows: size.rows,
                    cols: size.cols,
                },
            )
            .await
            .map_err(connect_error)?;
    }
    Ok(unary(&Empty {}))
}

/// `StreamInput`: a client stream (`start`, then `data` messages), each written to the
/// process's stdin as it arrives; answered with one empty message.
async fn stream_input(e: &E2b, id: &str, b: &E2bBox, headers: &HeaderMap, body: Body) -> Response {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("application/connect+json") {
        return stream_error(&ConnectError::unimplemented(
            "StreamInput takes application/connect+json (the Connect protocol's JSON codec)",
        ));
    }
    let mut data = body.into_data_stream();
    let mut buf = Vec::new();
    let mut target: Option<ProcRecord> = None;
    let r: Result<(), ConnectError> = async {
        while let Some(piece) = data.next().await {
            let piece = piece
                .map_err(|e| ConnectError::new("canceled", format!("reading the stream: {e}")))?;
            buf.extend_from_slice(&piece);
            if buf.len() > connect::MAX_MESSAGE + 5 {
                return Err(ConnectError::new(
                    "resource_exhausted",
                    "a message larger than Cordon reads",
                ));
            }
            let (msgs, end) = split_envelopes(&mut buf)?;
            for m in msgs {
                let msg: StreamInputMsg = serde_json::from_slice(&m).map_err(|err| {
                    ConnectError::invalid(format!("a StreamInput message: {err}"))
                })?;
                match msg {
                    StreamInputMsg::Start { process } => target = Some(find(b, &process)?.1),
                    StreamInputMsg::Data { input } => {
                        let rec = target
                            .as_ref()
                            .ok_or_else(|| ConnectError::invalid("data before start"))?;
                        let bytes = match (&input.stdin, &input.pty) {
                            (Some(s), _) | (None, Some(s)) => unb64(s)?,
                            (None, None) => Vec::new(),
                        };
                        write_input(e, id, b, rec, bytes, false).await?;
                    }
                    StreamInputMsg::Keepalive {} => {}
                }
            }
            if end {
                break;
            }
        }
        Ok(())
    }
    .await;
    let mut out = Vec::new();
    match r {
        Ok(()) => {
            out.extend_from_slice(&envelope(&Empty {}));
            out.extend_from_slice(&end_stream(None));
        }
        Err(err) => out.extend_from_slice(&end_stream(Some(&err))),
    }
    connect::stream_response(Body::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_ends_with_minus_one() {
        let mut o =
            cordon_core::ExecOutcome::new(cordon_core::Tier::Container, Termination::Signalled);
        o.signal = Some(9);
        let ev = end_event(&o);
        assert_eq!(
            (ev.exit_code, ev.exited, ev.status.as_str()),
            (-1, false, "signal: killed")
        );
        let mut o =
            cordon_core::ExecOutcome::new(cordon_core::Tier::Container, Termination::Exited);
        o.exit_code = Some(3);
        assert_eq!(end_event(&o).status, "exit status 3");
    }

    /// E2B's exit status of a limit is the one `cordon run` gives it (it kept a table of
    /// its own before), and every ending but a clean exit or a signal names its limit.
    #[test]
    fn a_limits_exit_status_is_the_one_cordon_run_gives() {
        for t in Termination::ALL {
            let o = cordon_core::ExecOutcome::new(cordon_core::Tier::Container, t);
            let ev = end_event(&o);
            match t {
                Termination::Signalled | Termination::Killed | Termination::Cancelled => {
                    assert_eq!((ev.exit_code, ev.exited), (-1, false), "{t}")
                }
                Termination::Exited => assert_eq!(ev.error, None, "{t}"),
                _ => {
                    assert_eq!(ev.exit_code, cordon_core::exit_code_for(&o), "{t}");
                    assert!(!ev.exited, "{t}");
                    assert!(
                        ev.error.is_some_and(|e| e.starts_with("Cordon stopped it")),
                        "{t}"
                    );
                }
            }
        }
        // A background exec keeps the code it exited with when a limit ended it.
        let mut o =
            cordon_core::ExecOutcome::new(cordon_core::Tier::Container, Termination::DiskLimit);
        o.exit_code = Some(1);
        let ev = end_event(&o);
        assert_eq!((ev.exit_code, ev.exited), (1, true));
        assert_eq!(
            ev.error.as_deref(),
            Some("Cordon stopped it: the sandbox's disk limit")
        );
    }
}
