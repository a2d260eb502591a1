//! E2B's code interpreter (port 49999) over Cordon's code contexts: `/execute` streams a
//! cell's output as NDJSON lines, `/contexts` makes, lists, deletes and restarts contexts.
//! Python, JavaScript, TypeScript and bash run; the other kernels E2B's image has (R, Java,
//! Deno) do not exist here.

use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::wire::{ContextCreate, ContextOut, ExecuteRequest, OutputLine, ResultOut};
use super::{
    Auth, E2b, E2bBox, HOME, INTERP_PORT, WORK, api_error, e2b_error, lock, now_ms, rfc3339,
    to_e2b_path, to_sandbox_path,
};
use crate::error::ApiError;
use crate::keys::Tenant;
use crate::model::{CellBody, CellError, CellOutput, CellResult, ContextBody, ContextInfo};
use crate::service::{CellStatus, Chunk, ChunkSender, Service};

/// A line every this long while a cell is quiet (E2B's server does the same).
const KEEPALIVE: Duration = Duration::from_secs(5);

/// Cordon's language name for E2B's.
fn language(l: Option<&str>) -> Result<&'static str, Response> {
    match l.unwrap_or("python") {
        "python" | "py" | "" => Ok("python"),
        "javascript" | "js" => Ok("javascript"),
        "typescript" | "ts" => Ok("typescript"),
        "bash" | "sh" => Ok("bash"),
        other => Err(e2b_error(
            StatusCode::BAD_REQUEST,
            format!(
                "language {other:?}: Cordon's code contexts run python, javascript, typescript and bash; run other languages with commands.run"
            ),
        )),
    }
}

fn context_out(c: &ContextInfo) -> ContextOut {
    ContextOut {
        id: c.id.clone(),
        language: c.lang.as_str().to_string(),
        cwd: to_e2b_path(&c.cwd),
    }
}

fn valid_context_id(cid: &str) -> bool {
    cid.strip_prefix("ctx-")
        .is_some_and(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
}

fn no_context(cid: &str) -> Response {
    e2b_error(StatusCode::NOT_FOUND, format!("context {cid} not found"))
}

/// A result's text as E2B's interpreter answers it: one pair of matching quotes around the
/// whole text taken off (a cell ending in a `str` value shows `bar`, not IPython's `'bar'`;
/// E2B's own env-var tests read it so).
fn unquoted(text: &str) -> &str {
    ['\'', '"']
        .iter()
        .find_map(|q| text.strip_prefix(*q).and_then(|t| t.strip_suffix(*q)))
        .unwrap_or(text)
}

/// A rich output under the SDKs' field names.
fn result_line(o: &CellOutput) -> OutputLine {
    let mut r = ResultOut {
        is_main_result: o.main,
        ..Default::default()
    };
    for (mime, data) in &o.data {
        let v = Some(data.clone());
        match mime.as_str() {
            "text/plain" => r.text = Some(unquoted(data).to_string()),
            "text/html" => r.html = v,
            "text/markdown" => r.markdown = v,
            "image/svg+xml" => r.svg = v,
            "image/png" => r.png = v,
            "image/jpeg" => r.jpeg = v,
            "application/pdf" => r.pdf = v,
            "text/latex" => r.latex = v,
            "application/javascript" => r.javascript = v,
            "application/json" => r.json = serde_json::from_str(data).ok(),
            "application/vnd.cordon.chart+json" => r.chart = serde_json::from_str(data).ok(),
            "application/vnd.cordon.data+json" => r.data = serde_json::from_str(data).ok(),
            _ => {
                r.extra.insert(mime.clone(), data.clone());
            }
        }
    }
    OutputLine::Result(Box::new(r))
}

fn line(l: &OutputLine) -> Bytes {
    let mut v = serde_json::to_vec(l).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

async fn default_context(e: &E2b, b: &E2bBox, id: &str, lang: &str) -> Result<String, Response> {
    // E2B's interpreter starts in E2B's home (the workspace's second mount point).
    let body = ContextBody {
        lang: lang.to_string(),
        default: true,
        cwd: Some(HOME.to_string()),
    };
    e.svc
        .contexts()
        .create_context(&b.tenant, id, &body)
        .await
        .map(|c| c.id)
        .map_err(api_error)
}

/// `POST /execute`: the cell's output as NDJSON lines, its results, its error, its number,
/// and `end_of_execution`.
pub(super) async fn execute(State(e): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    let (id, b) = match e.sandbox(&headers, INTERP_PORT, Auth::Envd).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req: ExecuteRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return e2b_error(StatusCode::BAD_REQUEST, format!("the request body: {err}")),
    };
    let cid = match cell_context(&e, &b, &id, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    // run_code(envs=...): set for this cell only, as E2B's interpreter does.
    let cell = CellBody {
        code: req.code,
        timeout: None,
        stream: true,
        env: req.env_vars.unwrap_or_default(),
        // As E2B's interpreter: a client gone (its own timeout) interrupts the cell.
        interrupt_when_unread: true,
    };
    let target = CellTarget {
        svc: e.svc.clone(),
        tenant: b.tenant.clone(),
        id,
        cid,
    };
    tokio::spawn(stream_cell(target, cell, out_tx));
    let stream = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

/// The context a cell runs in: the one it names (which must exist), or the sandbox's
/// default context of its language.
async fn cell_context(
    e: &E2b,
    b: &E2bBox,
    id: &str,
    req: &ExecuteRequest,
) -> Result<String, Response> {
    if req.context_id.is_some() && req.language.is_some() {
        return Err(e2b_error(
            StatusCode::BAD_REQUEST,
            "give context_id or language, not both",
        ));
    }
    let cid = match &req.context_id {
        Some(c) if valid_context_id(c) => c.clone(),
        Some(c) => return Err(no_context(c)),
        None => {
            let lang = language(req.language.as_deref())?;
            default_context(e, b, id, lang).await?
        }
    };
    if e.svc.contexts().context_check(&b.tenant, id, &cid).is_err() {
        return Err(no_context(&cid));
    }
    Ok(cid)
}

/// Where a cell runs: the sandbox and its context.
struct CellTarget {
    svc: Service,
    tenant: Tenant,
    id: String,
    cid: String,
}

impl CellTarget {
    /// Runs the cell, its output chunks to `tx`. The context runs one cell at a time; as
    /// E2B's kernel queues executions, this one waits for the one before it (an
    /// interrupted one ends within its grace).
    async fn run_queued(&self, cell: CellBody, tx: ChunkSender) -> Result<CellResult, ApiError> {
        loop {
            let r = self
                .svc
                .contexts()
                .run_cell(
                    &self.tenant,
                    &self.id,
                    &self.cid,
                    cell.clone(),
                    Some(tx.clone()),
                )
                .await;
            match r {
                Err(err) if err.code == crate::Code::ContextBusy => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                r => break r,
            }
        }
    }

    /// Whether the cell ended because its sandbox did (and the sandbox is not live).
    async fn sandbox_ended(&self, result: &Result<CellResult, ApiError>) -> bool {
        let ended = match result {
            Ok(r) => r.status == CellStatus::Died,
            Err(err) => err.code == crate::Code::SandboxGone,
        };
        ended
            && !matches!(self.svc.sessions().info(&self.tenant, &self.id).await, Ok(i) if i.state == "live")
    }
}

/// The cell's NDJSON lines to `out_tx`: its output as it comes (a keepalive line while it is
/// quiet), then its closing lines; nothing more once the client is gone.
async fn stream_cell(
    target: CellTarget,
    cell: CellBody,
    out_tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let mut done = std::pin::pin!(target.run_queued(cell, tx));
    let mut tick = tokio::time::interval(KEEPALIVE);
    tick.tick().await;
    let result = loop {
        tokio::select! {
            biased;
            _ = out_tx.closed() => return,
            Some(c) = rx.recv() => { let _ = out_tx.send(Ok(chunk_line(c))).await; }
            _ = tick.tick() => { let _ = out_tx.send(Ok(line(&OutputLine::Keepalive))).await; }
            r = &mut done => break r,
        }
    };
    while let Ok(c) = rx.try_recv() {
        let _ = out_tx.send(Ok(chunk_line(c))).await;
    }
    // The sandbox ended under the cell: as when E2B's sandbox goes away under a request,
    // the answer breaks off; the SDK then asks /health (502) and raises its
    // sandbox-killed error instead of returning an execution.
    if target.sandbox_ended(&result).await {
        let _ = out_tx
            .send(Err(std::io::Error::other(
                "the sandbox ended under the cell",
            )))
            .await;
        return;
    }
    for l in &closing_lines(result) {
        let _ = out_tx.send(Ok(line(l))).await;
    }
}

/// A chunk of the cell's output as its `stdout` or `stderr` line.
fn chunk_line(c: Chunk) -> Bytes {
    let text = String::from_utf8_lossy(&c.data).into_owned();
    let timestamp = rfc3339(now_ms());
    line(&match c.stream {
        cordon_core::OutputStream::Stdout => OutputLine::Stdout { text, timestamp },
        cordon_core::OutputStream::Stderr => OutputLine::Stderr { text, timestamp },
    })
}

/// The lines after a cell's output: its results, its error, its number, and
/// `end_of_execution`.
fn closing_lines(result: Result<CellResult, ApiError>) -> Vec<OutputLine> {
    let mut lines = Vec::new();
    match result {
        Ok(r) => {
            lines.extend(r.results.iter().map(result_line));
            lines.extend(cell_error(r.status, r.restarted, r.error));
            if r.execution_count > 0 {
                lines.push(OutputLine::NumberOfExecutions {
                    execution_count: r.execution_count,
                });
            }
        }
        Err(err) => lines.push(OutputLine::Error {
            name: "CordonError".into(),
            value: super::message_of(&err),
            traceback: String::new(),
        }),
    }
    lines.push(OutputLine::EndOfExecution);
    lines
}

/// A cell's error line, as E2B's interpreter names it, where it did not end well
/// (`restarted`: a fresh interpreter took the place of one that died).
fn cell_error(status: CellStatus, restarted: bool, error: Option<CellError>) -> Option<OutputLine> {
    match status {
        CellStatus::Ok => None,
        CellStatus::Error => error.map(|err| OutputLine::Error {
            name: err.name,
            value: err.value,
            traceback: err.traceback,
        }),
        CellStatus::Timeout => Some(OutputLine::Error {
            name: "TimeoutError".into(),
            value: "the cell ran past its timeout (the sandbox's exec timeout) and was interrupted; the context keeps its state".into(),
            traceback: String::new(),
        }),
        CellStatus::Died => Some(OutputLine::Error {
            name: "DeadKernelError".into(),
            value: if restarted {
                "the interpreter ended during the cell (out of memory or killed); a fresh one took its place and earlier state is gone".into()
            } else {
                "the interpreter ended during the cell (out of memory or killed)".into()
            },
            traceback: String::new(),
        }),
    }
}

/// `POST /contexts`.
pub(super) async fn create(State(e): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    let (id, b) = match e.sandbox(&headers, INTERP_PORT, Auth::Traffic).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req: ContextCreate = if body.iter().all(u8::is_ascii_whitespace) {
        ContextCreate::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(err) => {
                return e2b_error(StatusCode::BAD_REQUEST, format!("the request body: {err}"));
            }
        }
    };
    let lang = match language(req.language.as_deref()) {
        Ok(l) => l,
        Err(r) => return r,
    };
    // The context's directory, as E2B names it (default E2B's home, the workspace's second
    // mount point). One in the workspace is made if missing, as E2B's interpreter starts
    // there even when it is new.
    let cwd = match req.cwd.as_deref().map(|c| c.trim_end_matches('/')) {
        None | Some("") => Some(HOME.to_string()),
        Some(c) if c == HOME => Some(HOME.to_string()),
        Some(c) => {
            let inside = to_sandbox_path(c);
            if inside.starts_with(&format!("{WORK}/")) {
                let op = cordon_core::FileOp::Mkdir {
                    path: inside,
                    parents: true,
                };
                if let Err(err) = e.svc.files().file_op(&b.tenant, &id, op).await {
                    return api_error(err);
                }
            }
            Some(if c.starts_with('/') {
                c.to_string()
            } else {
                format!("{HOME}/{c}")
            })
        }
    };
    let body = ContextBody {
        lang: lang.to_string(),
        default: false,
        cwd,
    };
    match e.svc.contexts().create_context(&b.tenant, &id, &body).await {
        Ok(c) => Json(context_out(&c)).into_response(),
        Err(err) => api_error(err),
    }
}

/// `GET /contexts`.
pub(super) async fn list(State(e): State<E2b>, headers: HeaderMap) -> Response {
    let (id, b) = match e.sandbox(&headers, INTERP_PORT, Auth::Traffic).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    // E2B's interpreter starts a Python and a JavaScript context with the sandbox, so its
    // list always has them: here they start at the first list that lacks them (a tier
    // without Node has no JavaScript one), and come first, as the oldest.
    let listed = |e: &E2b| e.svc.contexts().list_contexts(&b.tenant, &id);
    let mut v = match listed(&e) {
        Ok(v) => v,
        Err(err) => return api_error(err),
    };
    let mut made = false;
    for lang in ["python", "javascript"] {
        if v.iter().any(|c| c.default && c.lang.as_str() == lang)
            || lock(&b.no_default).contains(&lang)
        {
            continue;
        }
        match default_context(&e, &b, &id, lang).await {
            Ok(_) => made = true,
            Err(_) => lock(&b.no_default).push(lang),
        }
    }
    if made {
        v = match listed(&e) {
            Ok(v) => v,
            Err(err) => return api_error(err),
        };
    }
    v.sort_by_key(|c| !c.default);
    Json(v.iter().map(context_out).collect::<Vec<_>>()).into_response()
}

/// `DELETE /contexts/{id}`.
pub(super) async fn delete(
    State(e): State<E2b>,
    headers: HeaderMap,
    Path(cid): Path<String>,
) -> Response {
    on_context(e, headers, cid, Verb::Delete).await
}

/// `POST /contexts/{id}/restart`.
pub(super) async fn restart(
    State(e): State<E2b>,
    headers: HeaderMap,
    Path(cid): Path<String>,
) -> Response {
    on_context(e, headers, cid, Verb::Restart).await
}

/// What a call does to one context.
enum Verb {
    Delete,
    Restart,
}

/// `verb` on the context `cid` of the sandbox the request names: an empty answer, or E2B's
/// 404 for a context that is not there (or not a context's id).
async fn on_context(e: E2b, headers: HeaderMap, cid: String, verb: Verb) -> Response {
    let (id, b) = match e.sandbox(&headers, INTERP_PORT, Auth::Traffic).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !valid_context_id(&cid) {
        return no_context(&cid);
    }
    let contexts = e.svc.contexts();
    let done = match verb {
        Verb::Delete => contexts.delete_context(&b.tenant, &id, &cid).await,
        Verb::Restart => contexts.restart_context(&b.tenant, &id, &cid).await,
    };
    match done {
        Ok(_) => Json(()).into_response(),
        Err(err) if err.code == crate::Code::NotFound => no_context(&cid),
        Err(err) => api_error(err),
    }
}

#[cfg(test)]
mod tests {
    use super::unquoted;

    #[test]
    fn one_pair_of_matching_quotes_around_the_whole_text_goes() {
        assert_eq!(unquoted("'bar'"), "bar");
        assert_eq!(unquoted("\"it's\""), "it's");
        assert_eq!(unquoted("''"), "");
        // Not a pair around the whole text: kept as shown.
        for kept in ["'", "\"", "'a\"", "[1, 'a']", "'a' + 'b", "42"] {
            assert_eq!(unquoted(kept), kept, "{kept:?}");
        }
    }
}
