//! Code contexts: long-lived interpreters that run cells and keep their state between
//! them (ADR 0010). A context is a background exec of the sandbox's own interpreter
//! running a driver Cordon embeds (`driver.py`, `driver.js`), so every limit of the
//! sandbox holds for it (processes, memory, cgroup, seccomp, Landlock, egress) and every
//! agent tier has contexts without a change to the agent protocol. The driver speaks the
//! line protocol of [`frames`] over the exec's stdin and stdout; this module writes a cell
//! to it, reads its frames as they come (the agent keeps only the last 1 MiB of a
//! background exec's output, so they are read while the cell runs, never left to pile up)
//! and turns them into a [`CellResult`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_core::{ExecRequest, Language, OutputStream, ProcExit, ProcSignal, Termination};
use sha2::{Digest, Sha256};

use super::common::{Chunk, ChunkSender, blocking, gone, lock};
use super::procs::on_sandbox;
use super::sessions::{Session, Sessions};
use crate::audit::{AuditEvent, ContextRun, ContextStop, now_ms};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{
    CellBody, CellLogs, CellOutput, CellResult, ContextBody, ContextInfo, ContextLang,
};

mod carry;
mod frames;
mod state;
mod typescript;

pub use carry::CarriedContexts;
pub(super) use carry::{carry, restore};

pub use crate::model::{CellError, CellStatus};
use frames::{DriverFrame, DriverRequest, FrameReader, Piece, StreamName};
use state::{Context, Table, Worker};

/// The Python driver, with the chart extraction it calls for a shown figure.
const PYTHON_DRIVER: &str = concat!(include_str!("charts.py"), include_str!("driver.py"));
const JAVASCRIPT_DRIVER: &str = include_str!("driver.js");
/// A bash context's driver is a Python program that keeps one shell.
const BASH_DRIVER: &str = include_str!("driver_bash.py");

/// Bytes of each stream one read of the driver's output moves at most.
const READ_CHUNK: u64 = 1 << 20;
/// Rich outputs one cell may return, in all.
const MAX_RESULTS_BYTES: usize = 64 << 20;
/// After a cell's timeout, how long before the server sends its own interrupt (the
/// driver interrupts the cell itself at its timeout; this is the second try).
const INTERRUPT_SLACK: Duration = Duration::from_millis(250);
/// How long a killed interpreter has to be reported ended.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What one read of a worker's output found.
enum Seen {
    /// stdout or stderr of the cell (raw bytes outside frames, or a stream frame).
    Output(StreamName, String),
    Frame(DriverFrame),
    /// Something the server could not use (a lost stretch of output, a bad frame).
    Warning(String),
}

fn no_context() -> ApiError {
    ApiError::new(
        Code::NotFound,
        "no code context with that id in this sandbox",
        "list them with GET /v1/sandboxes/{id}/contexts",
    )
}

fn context_busy() -> ApiError {
    ApiError::new(
        Code::ContextBusy,
        "the context is running another cell",
        "wait for it to end (one cell at a time per context), or create another context",
    )
}

/// The interpreter that runs a context's driver, and the driver (a TypeScript context's
/// is the JavaScript one: its cells come to it as JavaScript, [`typescript`]).
fn driver_of(lang: ContextLang) -> (Language, &'static str) {
    match lang {
        ContextLang::Javascript | ContextLang::Typescript => {
            (Language::Javascript, JAVASCRIPT_DRIVER)
        }
        ContextLang::Bash => (Language::Python, BASH_DRIVER),
        ContextLang::Python => (Language::Python, PYTHON_DRIVER),
    }
}

/// Waits after a read that found nothing: short at first (a quick cell answers within a
/// fraction of a millisecond), longer the longer a cell runs.
fn idle_wait(rounds: u32) -> Duration {
    match rounds {
        0 => Duration::ZERO,
        1..=8 => Duration::from_micros(50),
        9..=40 => Duration::from_micros(250),
        41..=100 => Duration::from_millis(2),
        _ => Duration::from_millis(20),
    }
}

/// Holds a context's `busy` flag for one call.
struct CtxBusy(Arc<Context>);

impl CtxBusy {
    fn take(ctx: &Arc<Context>) -> Result<Self, ApiError> {
        ctx.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| CtxBusy(ctx.clone()))
            .map_err(|_| context_busy())
    }
}

impl Drop for CtxBusy {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Reads what the worker wrote since the last read: stdout split into frames and raw
/// output, stderr (the interpreter's own, before its driver took fd 2) as output.
fn pump(
    s: &Session,
    w: &mut Worker,
    seen: &mut Vec<Seen>,
) -> Result<(bool, Option<ProcExit>), ApiError> {
    s.touch();
    let out = on_sandbox(s, |sb| sb.read_background(w.agent, w.from, READ_CHUNK))?;
    let moved = !out.stdout.is_empty() || !out.stderr.is_empty();
    if out.stdout_from > w.from[0] {
        w.reader.gap();
        seen.push(Seen::Warning(format!(
            "{} bytes of the context's output were dropped: it wrote more than {} bytes \
             between two reads",
            out.stdout_from - w.from[0],
            cordon_core::BACKGROUND_KEEP
        )));
    }
    w.from = [
        out.stdout_from + out.stdout.len() as u64,
        out.stderr_from + out.stderr.len() as u64,
    ];
    for p in w.reader.push(&out.stdout) {
        seen.push(match p {
            Piece::Raw(b) => Seen::Output(StreamName::Stdout, lossy(b)),
            Piece::Frame(f) => Seen::Frame(f),
            Piece::Bad(e) => Seen::Warning(e),
        });
    }
    if !out.stderr.is_empty() {
        seen.push(Seen::Output(StreamName::Stderr, lossy(out.stderr)));
    }
    Ok((moved, out.exit))
}

fn lossy(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Why an interpreter ended, as a cell's error.
fn death(exit: &ProcExit, s: &Session, stuck: Option<(u64, Duration)>) -> CellError {
    // The interpreter's end through the one classification of exec endings.
    let ended = cordon_core::classify(&cordon_core::Evidence::of_background(exit, false));
    let (name, value) = if let Some((timeout_ms, grace)) = stuck {
        (
            "TimeoutError",
            format!(
                "the cell ran past its timeout of {timeout_ms} ms and did not stop within {} ms \
                 of its interrupt, so its interpreter was killed",
                grace.as_millis()
            ),
        )
    } else if ended == Termination::OutOfMemory {
        (
            "OutOfMemory",
            format!(
                "the interpreter was killed when the sandbox reached its memory limit of {} bytes",
                s.spec.limits.memory_bytes
            ),
        )
    } else if ended == Termination::ProcessLimit {
        (
            "ProcessLimit",
            "the interpreter ended when the sandbox reached its process limit".to_string(),
        )
    } else if let Some(sig) = exit.signal {
        (
            "ContextDied",
            format!("the interpreter was ended by signal {sig}"),
        )
    } else {
        (
            "ContextDied",
            format!(
                "the interpreter exited with status {}",
                exit.code.unwrap_or_default()
            ),
        )
    };
    CellError {
        name: name.into(),
        value,
        traceback: String::new(),
    }
}

/// Code contexts in tenants' sandboxes. Uses the sessions, and the background execs'
/// one agent call at a time.
#[derive(Clone)]
pub struct Contexts {
    sessions: Sessions,
    limits: ContextLimits,
}

/// What the configuration bounds of contexts.
#[derive(Clone, Copy)]
pub(super) struct ContextLimits {
    /// `sessions.max_contexts`: contexts in one sandbox.
    pub(super) max_contexts: usize,
    /// `sessions.context_start_timeout`: how long an interpreter has to start.
    pub(super) start_timeout: Duration,
    /// `sessions.context_grace`: a cell past its timeout, from interrupt to kill.
    pub(super) grace: Duration,
    /// `max_limits.timeout_ms`: the longest cell timeout a request may give.
    pub(super) max_timeout_ms: u64,
}

impl Contexts {
    pub(super) fn new(sessions: Sessions, limits: ContextLimits) -> Self {
        Contexts { sessions, limits }
    }

    fn context(&self, s: &Session, cid: &str) -> Result<Arc<Context>, ApiError> {
        lock(&s.state::<Table>())
            .by_id
            .get(cid)
            .cloned()
            .ok_or_else(no_context)
    }

    /// Refuses a context id that is not one of this tenant's sandbox's.
    pub fn context_check(&self, tenant: &Tenant, id: &str, cid: &str) -> Result<(), ApiError> {
        let s = self.sessions.session(tenant, id)?;
        self.context(&s, cid).map(|_| ())
    }

    fn record_row(&self, s: &Session, event: AuditEvent) {
        let kind = event.kind();
        let r = self.sessions.audit.store.record(&s.row(event));
        if let Err(e) = r {
            tracing::error!("the {kind} audit row could not be written: {e}");
        }
    }

    /// Starts an interpreter for `ctx` and waits for its driver to say it is ready;
    /// blocking. Writes the `context_start` row.
    fn start_worker(&self, s: &Session, ctx: &Context, reason: &str) -> Result<Worker, ApiError> {
        let (interpreter, driver) = driver_of(ctx.lang);
        let mut req = ExecRequest::code(interpreter, driver);
        req.cwd = ctx.cwd.clone();
        let started = on_sandbox(s, |sb| sb.start_background(&req)).map_err(|e| {
            if e.code == Code::InvalidRequest {
                // The tier's userland (or the template) has no such interpreter.
                ApiError::new(
                    Code::Unsupported,
                    e.message,
                    "use a tier or template that has this language's interpreter \
                     (JavaScript: the container or gvisor tier)",
                )
            } else {
                e
            }
        });
        let r = started.and_then(|agent| {
            ctx.agent.store(agent, Ordering::Release);
            let mut w = Worker {
                agent,
                from: [0, 0],
                reader: FrameReader::default(),
                next_cell: 1,
            };
            self.await_ready(s, ctx, &mut w).map(|version| (w, version))
        });
        let r = r.map_err(|e| match &ctx.cwd {
            Some(cwd) => cwd_refusal(s, cwd).unwrap_or(e),
            None => e,
        });
        self.record_row(
            s,
            AuditEvent::ContextStart {
                context: ctx.id.clone(),
                lang: ctx.lang.as_str().to_string(),
                reason: reason.to_string(),
                version: r.as_ref().ok().map(|(_, v)| v.clone()),
                error: r.as_ref().err().map(ApiError::failure),
            },
        );
        let (w, version) = r?;
        let mut m = lock(&ctx.meta);
        m.started_ms = now_ms();
        m.version = version;
        m.count = 0;
        m.alive = true;
        Ok(w)
    }

    fn await_ready(&self, s: &Session, ctx: &Context, w: &mut Worker) -> Result<String, ApiError> {
        let deadline = Instant::now() + self.limits.start_timeout;
        let mut said = String::new();
        let mut rounds = 0;
        loop {
            let mut seen = Vec::new();
            let (moved, exit) = pump(s, w, &mut seen)?;
            for x in seen {
                match x {
                    Seen::Frame(DriverFrame::Ready { version, .. }) => return Ok(version),
                    Seen::Output(_, t) if said.len() < 4096 => said.push_str(&t),
                    _ => {}
                }
            }
            if let Some(exit) = exit {
                let said = said.trim();
                return Err(ApiError::new(
                    Code::SandboxFailure,
                    format!(
                        "the {} interpreter of the context ended before it was ready ({}){}{}",
                        ctx.lang.as_str(),
                        death(&exit, s, None).value,
                        if said.is_empty() { "" } else { ": " },
                        said.chars().take(2000).collect::<String>()
                    ),
                    "check that the sandbox's template has a working interpreter and that its \
                     memory limit leaves room for it",
                ));
            }
            if Instant::now() >= deadline {
                let _ = on_sandbox(s, |sb| sb.signal_background(w.agent, ProcSignal::Kill));
                return Err(ApiError::new(
                    Code::SandboxFailure,
                    format!(
                        "the {} interpreter of the context did not start within {} s",
                        ctx.lang.as_str(),
                        self.limits.start_timeout.as_secs()
                    ),
                    "retry; a busy sandbox (or a microVM's first start) may need longer: \
                     sessions.context_start_timeout",
                ));
            }
            rounds = if moved { 0 } else { rounds + 1 };
            std::thread::sleep(idle_wait(rounds));
        }
    }

    /// Kills the interpreter and waits (a little) for its end; blocking.
    fn kill_worker(&self, s: &Session, agent: u64) -> Option<ProcExit> {
        let _ = on_sandbox(s, |sb| sb.signal_background(agent, ProcSignal::Kill));
        let until = Instant::now() + KILL_WAIT;
        while Instant::now() < until {
            match on_sandbox(s, |sb| sb.read_background(agent, [u64::MAX; 2], 0)) {
                Ok(out) if out.exit.is_some() => return out.exit,
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => return None,
            }
        }
        None
    }

    fn stop_row(&self, s: &Session, ctx: &Context, reason: &str, exit: Option<&ProcExit>) {
        lock(&ctx.meta).alive = false;
        self.record_row(
            s,
            AuditEvent::ContextStop(ContextStop {
                context: ctx.id.clone(),
                reason: reason.to_string(),
                exit_code: exit.and_then(|e| e.code),
                signal: exit.and_then(|e| e.signal),
                oom_killed: exit.is_some_and(|e| e.oom_killed),
                pids_limited: exit.is_some_and(|e| e.pids_limited),
                cpu_us: exit.map(|e| e.cpu_us),
                max_rss_bytes: exit.map(|e| e.max_rss_bytes),
            }),
        );
    }

    /// A new context in `all`, busy until its interpreter runs (a run meanwhile is
    /// refused), within the sandbox's cap.
    fn new_context(
        &self,
        all: &mut Table,
        lang: ContextLang,
        default: bool,
        cwd: Option<String>,
    ) -> Result<Arc<Context>, ApiError> {
        let cap = self.limits.max_contexts;
        if all.by_id.len() >= cap {
            self.sessions.metrics.deny("contexts");
            return Err(ApiError::new(
                Code::TooManyContexts,
                format!("this sandbox holds its limit of {cap} code contexts"),
                "delete one (DELETE /v1/sandboxes/{id}/contexts/{context_id}) or reuse one",
            ));
        }
        all.next += 1;
        let c = Arc::new(Context {
            id: format!("ctx-{}", all.next),
            lang,
            default,
            cwd,
            created_ms: now_ms(),
            busy: AtomicBool::new(true),
            closed: AtomicBool::new(false),
            agent: AtomicU64::new(0),
            meta: Mutex::default(),
            worker: Mutex::new(None),
        });
        all.by_id.insert(c.id.clone(), c.clone());
        Ok(c)
    }

    /// Starts a context (or, with `default`, answers the sandbox's default context of the
    /// language, starting it if there is none).
    pub async fn create_context(
        &self,
        tenant: &Tenant,
        id: &str,
        body: &ContextBody,
    ) -> Result<ContextInfo, ApiError> {
        self.sessions.stopping()?;
        let lang: ContextLang = body.lang.parse()?;
        // A default context's cwd is where it starts if this call makes it (E2B's default
        // contexts start in E2B's home); the native API gives none (`api::contexts`).
        if let Some(cwd) = &body.cwd
            && (!cwd.starts_with('/') || cwd.contains('\0') || cwd.split('/').any(|p| p == ".."))
        {
            return Err(ApiError::invalid(format!(
                "cwd {cwd:?} is not an absolute path without '..'; give one such as /work/project"
            )));
        }
        let s = self.sessions.session(tenant, id)?;
        if !s.tier.features().contexts {
            return Err(ApiError::from(
                cordon_core::Feature::Contexts.unsupported(s.tier, "a code context"),
            ));
        }
        self.sessions.refuse_paused(&s)?;
        if s.ending.get().is_some() {
            return Err(gone(&s.id));
        }
        // Found or made under one lock, so two requests for the default make one.
        let (ctx, existing) = {
            let table = s.state::<Table>();
            let mut all = lock(&table);
            let found = all
                .by_id
                .values()
                .find(|c| body.default && c.default && c.lang == lang)
                .cloned();
            match found {
                Some(c) => (c, true),
                None => (
                    self.new_context(&mut all, lang, body.default, body.cwd.clone())?,
                    false,
                ),
            }
        };
        if existing {
            let c = ctx;
            // One being started by another request is answered once it runs.
            let _busy = loop {
                match CtxBusy::take(&c) {
                    Ok(b) => break b,
                    Err(_) if !lock(&c.meta).alive => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => return Ok(c.info()),
                }
            };
            if !lock(&s.state::<Table>()).by_id.contains_key(&c.id) {
                return Err(ApiError::new(
                    Code::SandboxFailure,
                    "the sandbox's default context could not be started",
                    "retry; the context_start audit row says why",
                ));
            }
            // A dead one gets a fresh interpreter at its next cell.
            return Ok(c.info());
        }
        let busy = CtxBusy(ctx.clone());
        let svc = self.clone();
        let s2 = s.clone();
        let c2 = ctx.clone();
        let r = blocking(move || {
            let _busy = busy;
            let w = svc.start_worker(&s2, &c2, "create")?;
            *lock(&c2.worker) = Some(w);
            Ok::<_, ApiError>(())
        })
        .await?;
        if let Err(e) = r {
            lock(&s.state::<Table>()).by_id.remove(&ctx.id);
            return Err(e);
        }
        Ok(ctx.info())
    }

    /// The sandbox's contexts, oldest first.
    pub fn list_contexts(&self, tenant: &Tenant, id: &str) -> Result<Vec<ContextInfo>, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        let table = s.state::<Table>();
        let all = lock(&table);
        let mut v: Vec<&Arc<Context>> = all.by_id.values().collect();
        v.sort_by_key(|c| (c.created_ms, c.id.len(), c.id.clone()));
        Ok(v.into_iter().map(|c| c.info()).collect())
    }

    /// Ends a context: its interpreter is killed (a cell running in it ends as `died`).
    pub async fn delete_context(
        &self,
        tenant: &Tenant,
        id: &str,
        cid: &str,
    ) -> Result<ContextInfo, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let ctx = lock(&s.state::<Table>())
            .by_id
            .remove(cid)
            .ok_or_else(no_context)?;
        ctx.closed.store(true, Ordering::Release);
        let svc = self.clone();
        let c2 = ctx.clone();
        blocking(move || {
            let agent = c2.agent.load(Ordering::Acquire);
            let exit = svc.kill_worker(&s, agent);
            svc.stop_row(&s, &c2, "client", exit.as_ref());
        })
        .await?;
        let mut info = ctx.info();
        info.state = "deleted".into();
        Ok(info)
    }

    /// Starts the context's interpreter again: every variable and import is gone.
    pub async fn restart_context(
        &self,
        tenant: &Tenant,
        id: &str,
        cid: &str,
    ) -> Result<ContextInfo, ApiError> {
        self.sessions.stopping()?;
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let ctx = self.context(&s, cid)?;
        let busy = CtxBusy::take(&ctx)?;
        let svc = self.clone();
        let c2 = ctx.clone();
        blocking(move || {
            let _busy = busy;
            let mut slot = lock(&c2.worker);
            if let Some(old) = slot.take() {
                let exit = svc.kill_worker(&s, old.agent);
                svc.stop_row(&s, &c2, "restart", exit.as_ref());
            }
            lock(&c2.meta).restarts += 1;
            *slot = Some(svc.start_worker(&s, &c2, "restart")?);
            Ok::<_, ApiError>(())
        })
        .await??;
        Ok(ctx.info())
    }

    /// Runs one cell: its output streams to `chunks` as it comes (when given), then its
    /// result. Only the agent calls lock the sandbox, one at a time, so a cell never
    /// holds the sandbox the way a foreground exec does.
    pub async fn run_cell(
        &self,
        tenant: &Tenant,
        id: &str,
        cid: &str,
        body: CellBody,
        chunks: Option<ChunkSender>,
    ) -> Result<CellResult, ApiError> {
        self.sessions.stopping()?;
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        if s.ending.get().is_some() {
            return Err(gone(&s.id));
        }
        let ctx = self.context(&s, cid)?;
        let max = self.limits.max_timeout_ms;
        let timeout_ms = match body.timeout {
            Some(d) => u64::try_from(d.0.as_millis()).unwrap_or(u64::MAX),
            None => s.spec.limits.timeout_ms,
        };
        if timeout_ms == 0 || timeout_ms > max {
            return Err(ApiError::new(
                Code::PolicyDenied,
                format!("the cell timeout must be between 1 ms and {max} ms"),
                "give a shorter timeout",
            ));
        }
        for (k, v) in &body.env {
            cordon_core::validate_env_name(k)?;
            if v.contains('\0') {
                return Err(ApiError::invalid(format!(
                    "the value of environment variable {k} holds a NUL byte; leave it out"
                )));
            }
        }
        let busy = CtxBusy::take(&ctx)?;
        let svc = self.clone();
        blocking(move || {
            let _busy = busy;
            svc.run_blocking(&s, &ctx, &body, timeout_ms, chunks)
        })
        .await?
    }

    /// Sends cell `body` to the context's interpreter (a fresh one when an earlier death
    /// left none, with a warning saying so); returns the cell's number and the warnings.
    fn begin_cell(
        &self,
        s: &Session,
        ctx: &Context,
        slot: &mut Option<Worker>,
        body: &CellBody,
        timeout_ms: u64,
    ) -> Result<(u64, Vec<String>), ApiError> {
        let mut warnings = Vec::new();
        if slot.is_none() {
            // An earlier death left no interpreter: this cell gets a fresh one.
            *slot = Some(self.start_worker(s, ctx, "dead")?);
            warnings
                .push("the context's interpreter had ended; this cell ran in a fresh one".into());
        }
        let Some(w) = slot.as_mut() else {
            return Err(no_context());
        };
        let cell = w.next_cell;
        w.next_cell += 1;
        // A TypeScript cell goes as JavaScript; one that is not valid TypeScript goes with
        // its error, which the driver answers as the cell's (counted like any other cell).
        let translated = match ctx.lang {
            ContextLang::Typescript => Some(typescript::to_javascript(&body.code)),
            _ => None,
        };
        let (code, error) = match &translated {
            Some(Ok(js)) => (js.as_str(), None),
            Some(Err(e)) => ("", Some(e)),
            None => (body.code.as_str(), None),
        };
        let line = DriverRequest::Run {
            cell,
            code,
            timeout_ms,
            env: &body.env,
            error,
        }
        .line();
        on_sandbox(s, |sb| sb.write_background(w.agent, &line))?;
        Ok((cell, warnings))
    }

    /// After the context's interpreter died (or was killed for `stuck`, its timeout and
    /// grace): records its end and starts a fresh one unless the context or the sandbox is
    /// going. Returns the cell's error and whether a fresh interpreter took its place.
    fn after_death(
        &self,
        s: &Session,
        ctx: &Context,
        slot: &mut Option<Worker>,
        (exit, stuck): (&ProcExit, Option<(u64, Duration)>),
        warnings: &mut Vec<String>,
    ) -> (CellError, bool) {
        let mut error = death(exit, s, stuck);
        self.stop_row(
            s,
            ctx,
            if stuck.is_some() { "timeout" } else { "died" },
            Some(exit),
        );
        *slot = None;
        let mut restarted = false;
        if ctx.closed.load(Ordering::Acquire) {
            error.value.push_str("; the context was deleted");
        } else if s.ending.get().is_some() {
            error.value.push_str("; the sandbox is being destroyed");
        } else {
            lock(&ctx.meta).restarts += 1;
            match self.start_worker(s, ctx, "died") {
                Ok(nw) => {
                    *slot = Some(nw);
                    restarted = true;
                    error.value.push_str(
                        "; a fresh interpreter took its place: earlier variables and \
                         imports are gone",
                    );
                }
                Err(e) => warnings.push(format!(
                    "a fresh interpreter could not be started ({}); the next cell \
                     tries again",
                    e.message
                )),
            }
        }
        (error, restarted)
    }

    fn run_blocking(
        &self,
        s: &Session,
        ctx: &Context,
        body: &CellBody,
        timeout_ms: u64,
        chunks: Option<ChunkSender>,
    ) -> Result<CellResult, ApiError> {
        let t0 = Instant::now();
        let mut slot = lock(&ctx.worker);
        let (cell, warnings) = self.begin_cell(s, ctx, &mut slot, body, timeout_ms)?;
        let Some(w) = slot.as_mut() else {
            return Err(no_context());
        };
        let mut out = CellCollector::new(s, ctx, chunks);
        out.warnings = warnings;
        let timeout = Duration::from_millis(timeout_ms);
        let grace = self.limits.grace;
        let mut interrupted = false;
        let mut rounds = 0;
        // Time the sandbox spent paused during the cell does not count against it.
        let mut paused = Duration::ZERO;
        let ended = loop {
            if s.is_paused() && s.ending.get().is_none() {
                let at = Instant::now();
                std::thread::sleep(Duration::from_millis(20));
                paused += at.elapsed();
                continue;
            }
            let mut seen = Vec::new();
            let (moved, exit) = pump(s, w, &mut seen)?;
            let mut done = None;
            for x in seen {
                match x {
                    Seen::Frame(DriverFrame::Done {
                        cell: c,
                        status,
                        error,
                        count,
                    }) if c == cell => done = Some((status, error, count)),
                    x => out.take(x, cell),
                }
            }
            if let Some(d) = done {
                break Ok(d);
            }
            if let Some(exit) = exit {
                break Err((exit, None));
            }
            let waited = t0.elapsed().saturating_sub(paused);
            let unread =
                body.interrupt_when_unread && out.chunks.as_ref().is_some_and(|c| c.is_closed());
            if !interrupted && (unread || waited > timeout + INTERRUPT_SLACK) {
                interrupted = true;
                let line = DriverRequest::Interrupt { cell }.line();
                let _ = on_sandbox(s, |sb| sb.write_background(w.agent, &line));
            }
            if waited > timeout + grace || s.ending.get().is_some() {
                let exit = self.kill_worker(s, w.agent).unwrap_or_default();
                break Err((exit, Some((timeout_ms, grace))));
            }
            rounds = if moved { 0 } else { rounds + 1 };
            std::thread::sleep(idle_wait(rounds));
        };
        let (status, error, count, restarted) = match ended {
            Ok((status, error, count)) => {
                lock(&ctx.meta).count = count;
                (status, error, count, false)
            }
            Err((exit, stuck)) => {
                let (error, restarted) =
                    self.after_death(s, ctx, &mut slot, (&exit, stuck), &mut out.warnings);
                (CellStatus::Died, Some(error), 0, restarted)
            }
        };
        drop(slot);
        let r = out.finish(status, error, count, restarted, t0.elapsed());
        self.record_row(
            s,
            AuditEvent::ContextRun(ContextRun {
                context: ctx.id.clone(),
                cell: count,
                code_sha256: hex::encode(Sha256::digest(body.code.as_bytes())),
                status: r.status.as_str().to_string(),
                error: r.error.as_ref().map(|e| e.name.clone()),
                restarted: r.restarted,
                duration_us: r.duration_us,
                timeout_ms,
            }),
        );
        Ok(r)
    }
}

/// Gathers a cell's output and results, streaming the output when asked; everything that
/// leaves passes the grants' redactor.
struct CellCollector {
    context: String,
    secrets: Vec<cordon_egress::scan::KnownSecret>,
    chunks: Option<ChunkSender>,
    caps: [u64; 2],
    sizes: [u64; 2],
    logs: CellLogs,
    results: Vec<CellOutput>,
    results_bytes: usize,
    warnings: Vec<String>,
    truncated: [bool; 2],
}

impl CellCollector {
    fn new(s: &Session, ctx: &Context, chunks: Option<ChunkSender>) -> Self {
        CellCollector {
            context: ctx.id.clone(),
            secrets: cordon_egress::scan::known_secrets_of(&s.spec.grants),
            chunks,
            caps: [s.spec.limits.stdout_bytes, s.spec.limits.stderr_bytes],
            sizes: [0, 0],
            logs: CellLogs::default(),
            results: Vec::new(),
            results_bytes: 0,
            warnings: Vec::new(),
            truncated: [false, false],
        }
    }

    fn clean(&self, text: String) -> String {
        if self.secrets.is_empty() {
            return text;
        }
        lossy(cordon_egress::scan::scan(text.as_bytes(), &self.secrets).bytes)
    }

    fn take(&mut self, x: Seen, cell: u64) {
        match x {
            Seen::Output(name, text) => self.output(name, text),
            Seen::Frame(DriverFrame::Stream { name, text, .. }) => self.output(name, text),
            Seen::Frame(DriverFrame::Display {
                cell: c,
                data,
                main,
            }) if c == cell => {
                let n: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
                if self.results_bytes + n > MAX_RESULTS_BYTES {
                    self.warnings.push(format!(
                        "a rich output was dropped: the cell's outputs passed {MAX_RESULTS_BYTES} bytes"
                    ));
                    return;
                }
                self.results_bytes += n;
                let data = data.into_iter().map(|(k, v)| (k, self.clean(v))).collect();
                self.results.push(CellOutput { main, data });
            }
            Seen::Frame(_) => {}
            Seen::Warning(w) => self.warnings.push(w),
        }
    }

    fn output(&mut self, name: StreamName, text: String) {
        if text.is_empty() {
            return;
        }
        let i = usize::from(name == StreamName::Stderr);
        let text = self.clean(text);
        if let Some(tx) = &self.chunks {
            let _ = tx.send(Chunk {
                stream: if i == 0 {
                    OutputStream::Stdout
                } else {
                    OutputStream::Stderr
                },
                data: text.as_bytes().to_vec(),
            });
        }
        let room = self.caps[i].saturating_sub(self.sizes[i]);
        if room == 0 {
            self.truncated[i] = true;
            return;
        }
        let mut text = text;
        if text.len() as u64 > room {
            let mut cut = room as usize;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            self.truncated[i] = true;
        }
        self.sizes[i] += text.len() as u64;
        let logs = if i == 0 {
            &mut self.logs.stdout
        } else {
            &mut self.logs.stderr
        };
        // A piece that does not end a line continues the one before it, so where the
        // driver's frames happened to break (print's text and its newline are two writes)
        // does not show in the logs: every item but the last ends with a newline.
        match logs.last_mut() {
            Some(last) if !last.ends_with('\n') => last.push_str(&text),
            _ => logs.push(text),
        }
    }

    fn finish(
        mut self,
        status: CellStatus,
        error: Option<CellError>,
        count: u64,
        restarted: bool,
        took: Duration,
    ) -> CellResult {
        for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
            if self.truncated[i] {
                self.warnings.push(format!(
                    "the cell's {name} was cut at the sandbox's limit of {} bytes",
                    self.caps[i]
                ));
            }
        }
        let error = error.map(|e| CellError {
            name: e.name,
            value: self.clean(e.value),
            traceback: self.clean(e.traceback),
        });
        let text = self
            .results
            .iter()
            .find(|r| r.main)
            .and_then(|r| r.data.get("text/plain").cloned());
        CellResult {
            context: self.context,
            status,
            text,
            results: self.results,
            logs: self.logs,
            error,
            execution_count: count,
            restarted,
            duration_us: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            warnings: self.warnings,
        }
    }
}

/// Why an interpreter that did not start could not: its directory is missing, no directory,
/// or closed to the sandbox's user (a 400 saying what to do, not a failure of the sandbox).
/// Asked only after a failed start, so a start costs nothing more; `None` when the directory
/// is there and open (or the tier cannot say) and the failure is another.
fn cwd_refusal(s: &Session, cwd: &str) -> Option<ApiError> {
    use cordon_core::{FileKind, FileOp, FileReply};
    let refusal = |why: &str| {
        ApiError::new(
            Code::InvalidRequest,
            format!("the context's cwd {cwd:?} {why}"),
            "give a directory that exists and the sandbox's user may enter, such as \
             /home/user (E2B) or /work, or make it first (a command's mkdir, or the files \
             API); code runs as the sandbox's user, never as root",
        )
    };
    let path = cwd.to_string();
    match on_sandbox(s, |sb| sb.file_op(&FileOp::Stat { path: path.clone() })) {
        Ok(FileReply::Entry { entry }) if entry.kind != FileKind::Dir => {
            Some(refusal("is not a directory"))
        }
        // A directory its user cannot read is one it may not enter either, as a rule.
        Ok(_) => match on_sandbox(s, |sb| sb.file_op(&FileOp::List { path })) {
            Err(e) if e.code == Code::FileError => {
                Some(refusal("is a directory the sandbox's user may not enter"))
            }
            _ => None,
        },
        Err(e) if e.code == Code::FileError => {
            Some(refusal("does not exist in the sandbox for its user"))
        }
        Err(_) => None,
    }
}
