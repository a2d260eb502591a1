//! Background execs: start, attach (replay, then live output, then the outcome), stdin,
//! signals and the list. Each call locks the sandbox only for one short agent call, so a
//! background exec never holds a sandbox the way a foreground one does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cordon_core::{
    BACKGROUND_KEEP, Command, ExecOutcome, ExecRequest, OutputStream, ProcExit, ProcOutput,
    ProcSignal, Sandbox, Tier,
};

use super::common::{Chunk, ChunkSender, Slot, Slots, audit_err, blocking, gone, lock};
use super::exec::command_digest;
use super::sessions::{Session, Sessions};
use crate::audit::{AuditEvent, BackgroundEnd, Command as AuditCommand, NewEvent, now_ms};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{ExecBody, ExecInfo};

/// Bytes of each stream one attach read moves at most.
const READ_CHUNK: u64 = 256 << 10;
/// How long an attach waits after a read that found nothing new: the first wait, doubled
/// after each such read up to [`ATTACH_POLL_MAX`] (an idle stream costs a few agent reads
/// a second, not 25).
const ATTACH_POLL: Duration = Duration::from_millis(40);
const ATTACH_POLL_MAX: Duration = Duration::from_millis(320);

/// How many attach streams (native attaches, E2B's envd `Start` and `Connect`) one tenant
/// and one sandbox may have open at once.
#[derive(Debug, Clone, Copy)]
pub struct AttachCaps {
    pub per_tenant: usize,
    pub per_sandbox: usize,
}

/// One background exec of a session.
pub(super) struct Proc {
    pub(super) agent_id: u64,
    pub(super) command: String,
    pub(super) started_ms: i64,
    pub(super) ended_ms: Option<i64>,
    pub(super) exit: Option<ProcExit>,
    /// A stop was asked for (DELETE): its end is reported as `killed`.
    pub(super) stopped: bool,
    /// Its pseudo-terminal's size (the last resize's), when it runs on one.
    pub(super) pty: Option<cordon_core::PtySize>,
}

/// A session's background execs by their API id (`ex-<n>`).
#[derive(Default)]
struct Table {
    next: u64,
    pub(super) by_id: BTreeMap<String, Proc>,
}

/// A session's background execs as a full snapshot keeps them (docs/snapshots.md): a
/// sandbox started from it has the same processes under the same exec ids (the tier keeps
/// them), so the same table serves them there.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CarriedProcs {
    next: u64,
    procs: Vec<CarriedProc>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct CarriedProc {
    id: String,
    agent_id: u64,
    command: String,
    started_ms: i64,
    ended_ms: Option<i64>,
    exit: Option<ProcExit>,
    stopped: bool,
    pty: Option<cordon_core::PtySize>,
}

/// The background execs of `s`, for a full snapshot of it.
pub(super) fn carry(s: &Session) -> CarriedProcs {
    let table = s.state::<Table>();
    let t = lock(&table);
    CarriedProcs {
        next: t.next,
        procs: t
            .by_id
            .iter()
            .map(|(id, p)| CarriedProc {
                id: id.clone(),
                agent_id: p.agent_id,
                command: p.command.clone(),
                started_ms: p.started_ms,
                ended_ms: p.ended_ms,
                exit: p.exit.clone(),
                stopped: p.stopped,
                pty: p.pty,
            })
            .collect(),
    }
}

/// Gives `s` (a sandbox just started from a full snapshot) the background execs its source
/// had.
pub(super) fn restore(s: &Session, carried: CarriedProcs) {
    let table = s.state::<Table>();
    let mut t = lock(&table);
    t.next = carried.next;
    for p in carried.procs {
        t.by_id.insert(
            p.id,
            Proc {
                agent_id: p.agent_id,
                command: p.command,
                started_ms: p.started_ms,
                ended_ms: p.ended_ms,
                exit: p.exit,
                stopped: p.stopped,
                pty: p.pty,
            },
        );
    }
}

impl Proc {
    fn info(&self, id: &str) -> ExecInfo {
        ExecInfo {
            id: id.to_string(),
            command: self.command.clone(),
            state: if self.exit.is_some() {
                "exited".into()
            } else {
                "running".into()
            },
            started_ms: self.started_ms,
            ended_ms: self.ended_ms,
            exit_code: self.exit.as_ref().and_then(|e| e.code),
            signal: self.exit.as_ref().and_then(|e| e.signal),
            pty: self.pty,
        }
    }
}

/// What a command is, for the list: the argv, or the language and the first line of code.
fn summary(req: &ExecRequest) -> String {
    let s = match &req.command {
        Command::Argv(v) => v.join(" "),
        Command::Code {
            language, source, ..
        } => format!(
            "{}: {}",
            language.as_str(),
            source.lines().next().unwrap_or("")
        ),
        Command::Wasm { .. } => "wasm module".into(),
    };
    s.chars().take(200).collect()
}

fn no_exec() -> ApiError {
    ApiError::new(
        Code::NotFound,
        "no background exec with that id in this sandbox",
        "list them with GET /v1/sandboxes/{id}/execs",
    )
}

/// Runs `f` on the session's sandbox (blocking until a foreground call on it is done).
pub(super) fn on_sandbox<T>(
    s: &Session,
    f: impl FnOnce(&mut Box<dyn Sandbox>) -> cordon_core::Result<T>,
) -> Result<T, ApiError> {
    let mut cell = lock(&s.sandbox);
    let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
    f(sb).map_err(ApiError::from)
}

/// Where an attach's output goes: to the client's chunks, or (without them) kept: the last
/// bytes of each stream, as many as `window` allows, with the count let go.
struct Collector<'a> {
    chunks: &'a Option<ChunkSender>,
    window: [usize; 2],
    collected: [Vec<u8>; 2],
    trimmed: [u64; 2],
}

impl Collector<'_> {
    fn send(&mut self, stream: OutputStream, data: &[u8]) {
        match self.chunks {
            Some(tx) => {
                let _ = tx.send(Chunk {
                    stream,
                    data: data.to_vec(),
                });
            }
            None => {
                let i = usize::from(stream == OutputStream::Stderr);
                self.collected[i].extend_from_slice(data);
                let over = self.collected[i].len().saturating_sub(self.window[i]);
                if over > 0 {
                    self.collected[i].drain(..over);
                    self.trimmed[i] += over as u64;
                }
            }
        }
    }
}

/// Reads a background exec's output from `from` without waiting for a foreground call that
/// holds the sandbox (`None`: looked at again after a pause), nor reading a paused one.
async fn read_unblocked(
    s: &Arc<Session>,
    agent: u64,
    from: [u64; 2],
) -> Result<Option<ProcOutput>, ApiError> {
    if s.is_paused() {
        return Ok(None);
    }
    let s2 = s.clone();
    blocking(move || -> Result<Option<ProcOutput>, ApiError> {
        match s2.sandbox.try_lock() {
            Ok(mut cell) => {
                let sb = cell.as_mut().ok_or_else(|| gone(&s2.id))?;
                Ok(Some(sb.read_background(agent, from, READ_CHUNK)?))
            }
            Err(std::sync::TryLockError::WouldBlock) => Ok(None),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                let mut cell = p.into_inner();
                let sb = cell.as_mut().ok_or_else(|| gone(&s2.id))?;
                Ok(Some(sb.read_background(agent, from, READ_CHUNK)?))
            }
        }
    })
    .await?
}

/// The outcome of an ended background exec.
fn outcome_of(tier: Tier, p: &Proc, dropped: [u64; 2]) -> ExecOutcome {
    let exit = p.exit.clone().unwrap_or_default();
    // The one classification every tier uses (cordon_core::classify), with a background
    // exec's own evidence (the agent's, the tier's disk measure, a client's stop).
    let termination =
        cordon_core::classify(&cordon_core::Evidence::of_background(&exit, p.stopped));
    let mut o = ExecOutcome::new(tier, termination);
    o.exit_code = exit.code;
    o.signal = exit.signal;
    o.usage.cpu_time_us = exit.cpu_us;
    o.usage.peak_memory_bytes = exit.max_rss_bytes;
    o.usage.wall_time_us = (p.ended_ms.unwrap_or(p.started_ms) - p.started_ms).max(0) as u64 * 1000;
    o.stdout_truncated = dropped[0] > 0;
    o.stderr_truncated = dropped[1] > 0;
    for (name, n) in [("stdout", dropped[0]), ("stderr", dropped[1])] {
        if n > 0 {
            o.warnings.push(format!(
                "the first {n} bytes of {name} were dropped: a background exec keeps the last {BACKGROUND_KEEP} bytes of each stream"
            ));
        }
    }
    o
}

/// A place held for one attach stream: its tenant's and its sandbox's.
pub struct AttachSlot {
    _tenant: Slot,
    _sandbox: Slot,
}

/// Background execs in tenants' sandboxes. Uses the sessions.
#[derive(Clone)]
pub struct Procs {
    sessions: Sessions,
    /// `sessions.max_background_execs`: how many may run in one sandbox.
    max_running: usize,
    /// `sessions.kill_grace`: from a stop's SIGTERM to its SIGKILL.
    kill_grace: Duration,
    caps: AttachCaps,
    /// Attach streams open, per tenant and per sandbox.
    by_tenant: Slots,
    by_sandbox: Slots,
}

impl Procs {
    pub(super) fn new(
        sessions: Sessions,
        max_running: usize,
        kill_grace: Duration,
        caps: AttachCaps,
    ) -> Self {
        Procs {
            sessions,
            max_running,
            kill_grace,
            caps,
            by_tenant: Slots::new(
                "your attach streams (attaches and E2B process streams) open at once",
                "close streams you no longer read, or wait for their execs to end",
            ),
            by_sandbox: Slots::new(
                "this sandbox's attach streams open at once",
                "close streams of this sandbox you no longer read",
            ),
        }
    }

    /// Takes a place for one attach stream of `tenant` on sandbox `id` (given back when
    /// the stream ends): `429 resource_busy` past `sessions.max_attach_streams_per_tenant`
    /// or `..._per_sandbox`. Taken before a stream's answer starts, so the refusal is the
    /// answer's status.
    pub fn attach_slot(&self, tenant: &Tenant, id: &str) -> Result<AttachSlot, ApiError> {
        let t = self.by_tenant.take(&tenant.0, self.caps.per_tenant);
        let t = t.inspect_err(|_| self.sessions.metrics.deny("attach_streams"))?;
        let s = self.by_sandbox.take(id, self.caps.per_sandbox);
        let s = s.inspect_err(|_| self.sessions.metrics.deny("attach_streams"))?;
        Ok(AttachSlot {
            _tenant: t,
            _sandbox: s,
        })
    }

    /// Records a background exec's end the first time it is seen, with its audit row.
    fn note_end(&self, s: &Session, id: &str, exit: ProcExit) -> Result<(), ApiError> {
        let row = {
            let table = s.state::<Table>();
            let mut procs = lock(&table);
            let Some(p) = procs.by_id.get_mut(id) else {
                return Ok(());
            };
            if p.exit.is_some() {
                return Ok(());
            }
            p.exit = Some(exit.clone());
            p.ended_ms = Some(now_ms());
            BackgroundEnd {
                exec: id.to_string(),
                exit_code: exit.code,
                signal: exit.signal,
                cpu_us: exit.cpu_us,
                max_rss_bytes: exit.max_rss_bytes,
                oom_killed: exit.oom_killed,
                pids_limited: exit.pids_limited,
                stopped: p.stopped,
            }
        };
        self.sessions
            .audit
            .store
            .record(&s.row(AuditEvent::ExecBackgroundEnd(row)))
            .map(|_| ())
            .map_err(audit_err)
    }

    /// Asks the agent about every background exec still thought running; blocking.
    fn refresh(&self, s: &Session) -> Result<(), ApiError> {
        let running: Vec<(String, u64)> = lock(&s.state::<Table>())
            .by_id
            .iter()
            .filter(|(_, p)| p.exit.is_none())
            .map(|(k, p)| (k.clone(), p.agent_id))
            .collect();
        for (id, agent) in running {
            // From past the end: nothing to move, and the end if there is one.
            let out = on_sandbox(s, |sb| sb.read_background(agent, [u64::MAX; 2], 0))?;
            if let Some(exit) = out.exit {
                self.note_end(s, &id, exit)?;
            }
        }
        Ok(())
    }

    /// Starts an exec in the background and answers its id at once.
    pub async fn start_background(
        &self,
        tenant: &Tenant,
        id: &str,
        body: &ExecBody,
    ) -> Result<ExecInfo, ApiError> {
        let req = body.to_request()?;
        if let Some(size) = req.pty {
            size.validate()?;
        }
        if req.stdin.is_some() {
            return Err(ApiError::invalid(
                "a background exec takes its stdin through POST .../execs/{exec_id}/stdin",
            ));
        }
        let guard = self.sessions.claim(tenant, id)?;
        self.sessions.refuse_paused(&guard.0)?;
        let svc = self.clone();
        blocking(move || -> Result<ExecInfo, ApiError> {
            let s = guard.0.clone();
            let _busy = guard;
            svc.refresh(&s)?;
            let cap = svc.max_running;
            let live = lock(&s.state::<Table>())
                .by_id
                .values()
                .filter(|p| p.exit.is_none())
                .count();
            if live >= cap {
                svc.sessions.metrics.deny("background_execs");
                return Err(ApiError::new(
                    Code::TooManyExecs,
                    format!("this sandbox has its limit of {cap} background execs running"),
                    "stop one (DELETE /v1/sandboxes/{id}/execs/{exec_id}) or wait for one to end",
                ));
            }
            let (digest, kind) = command_digest(&req);
            let r = on_sandbox(&s, |sb| sb.start_background(&req));
            let exec_id = r.as_ref().ok().map(|agent| {
                let table = s.state::<Table>();
                let mut procs = lock(&table);
                procs.next += 1;
                let exec_id = format!("ex-{}", procs.next);
                procs.by_id.insert(
                    exec_id.clone(),
                    Proc {
                        agent_id: *agent,
                        command: summary(&req),
                        started_ms: now_ms(),
                        ended_ms: None,
                        exit: None,
                        stopped: false,
                        pty: req.pty,
                    },
                );
                exec_id
            });
            svc.sessions
                .audit
                .store
                .record(&s.row(AuditEvent::ExecBackground {
                    exec: exec_id.clone(),
                    command: AuditCommand {
                        command_sha256: digest,
                        command_kind: kind.to_string(),
                        lang: None,
                        limits: s.spec.limits.clone(),
                    },
                    error: r.as_ref().err().map(ApiError::failure),
                }))
                .map_err(audit_err)?;
            r?;
            let exec_id = exec_id.unwrap_or_default();
            let table = s.state::<Table>();
            let procs = lock(&table);
            procs
                .by_id
                .get(&exec_id)
                .map(|p| p.info(&exec_id))
                .ok_or_else(no_exec)
        })
        .await?
    }

    /// The sandbox's background execs, oldest first.
    pub async fn list_execs(&self, tenant: &Tenant, id: &str) -> Result<Vec<ExecInfo>, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        let svc = self.clone();
        let s2 = s.clone();
        // A paused sandbox's agent cannot answer; its list is what was last seen.
        if !s.is_paused() {
            blocking(move || svc.refresh(&s2)).await??;
        }
        let table = s.state::<Table>();
        let procs = lock(&table);
        let mut v: Vec<ExecInfo> = procs.by_id.iter().map(|(k, p)| p.info(k)).collect();
        v.sort_by_key(|e| (e.started_ms, e.id.len(), e.id.clone()));
        Ok(v)
    }

    /// Refuses an exec id that is not one of this tenant's sandbox's.
    pub fn list_execs_check(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
    ) -> Result<(), ApiError> {
        let s = self.sessions.session(tenant, id)?;
        Self::agent_id(&s, exec_id).map(|_| ())
    }

    fn agent_id(s: &Session, exec_id: &str) -> Result<u64, ApiError> {
        lock(&s.state::<Table>())
            .by_id
            .get(exec_id)
            .map(|p| p.agent_id)
            .ok_or_else(no_exec)
    }

    /// Attaches to a background exec: what it wrote since its start (within what the
    /// sandbox keeps), then its live output, then its outcome. Output passes the grants'
    /// redactor like any exec's. Without `chunks` the output is collected into the outcome
    /// (within the sandbox's output caps).
    ///
    /// The attach holds a place of its tenant's and its sandbox's ([`Procs::attach_slot`];
    /// `slot` when the caller took it before its answer began) and no thread while it
    /// waits: each read of the agent is one short blocking call, and the waits between
    /// them are timers.
    pub async fn attach(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
        chunks: Option<ChunkSender>,
        slot: Option<AttachSlot>,
    ) -> Result<ExecOutcome, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        let agent = Self::agent_id(&s, exec_id)?;
        let _slot = match slot {
            Some(slot) => slot,
            None => self.attach_slot(tenant, id)?,
        };
        // Collected (without `chunks`): the last bytes of each stream, as many as the sandbox
        // keeps and the stream's cap allows, so the outcome is what an attach after the end
        // would replay however far behind this reader fell meanwhile. Before, it was every
        // byte this reader happened to see: more than the sandbox keeps when it read while
        // the exec wrote, with a gap the warning did not tell.
        let window = [s.spec.limits.stdout_bytes, s.spec.limits.stderr_bytes]
            .map(|cap| cap.min(BACKGROUND_KEEP) as usize);
        let mut sink = Collector {
            chunks: &chunks,
            window,
            collected: Default::default(),
            trimmed: [0; 2],
        };
        let mut redactor = cordon_egress::scan::Redactor::new(
            &cordon_egress::scan::known_secrets_of(&s.spec.grants),
        );
        let mut from = [0u64; 2];
        let mut dropped = [0u64; 2];
        let mut wait = ATTACH_POLL;
        let exit = loop {
            if s.ending.get().is_some() {
                return Err(gone(&s.id));
            }
            if chunks.as_ref().is_some_and(|t| t.is_closed()) {
                // The client went away; the exec runs on.
                return Err(ApiError::new(
                    Code::InvalidRequest,
                    "the client went away",
                    "attach again",
                ));
            }
            // Never waits for a foreground call: it is looked at again after a pause.
            let out = read_unblocked(&s, agent, from).await?;
            let Some(out) = out else {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(ATTACH_POLL_MAX);
                continue;
            };
            let moved = !out.stdout.is_empty() || !out.stderr.is_empty();
            for (i, (start, data, stream)) in [
                (out.stdout_from, &out.stdout, OutputStream::Stdout),
                (out.stderr_from, &out.stderr, OutputStream::Stderr),
            ]
            .into_iter()
            .enumerate()
            {
                dropped[i] += start.saturating_sub(from[i]);
                from[i] = start + data.len() as u64;
                if !data.is_empty() {
                    let clean = redactor.push(stream, data);
                    if !clean.is_empty() {
                        sink.send(stream, &clean);
                    }
                }
            }
            if let Some(exit) = out.exit {
                break exit;
            }
            if moved {
                wait = ATTACH_POLL;
            } else {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(ATTACH_POLL_MAX);
            }
        };
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let rest = redactor.finish(stream);
            if !rest.is_empty() {
                sink.send(stream, &rest);
            }
        }
        let Collector {
            collected: [out, err],
            trimmed,
            ..
        } = sink;
        if chunks.is_none() {
            // What the reader missed and what the window let go are one front: the output
            // kept is the stream's last bytes.
            dropped = [0, 1].map(|i| dropped[i] + trimmed[i]);
        }
        let mut o = self.ended(&s, exec_id, exit, dropped).await?;
        o.stdout = out;
        o.stderr = err;
        Ok(o)
    }

    /// Notes the end of background exec `exec_id` and answers its outcome, with `dropped`
    /// bytes of each stream the reader did not get.
    async fn ended(
        &self,
        s: &Arc<Session>,
        exec_id: &str,
        exit: ProcExit,
        dropped: [u64; 2],
    ) -> Result<ExecOutcome, ApiError> {
        let svc = self.clone();
        let (s2, e2) = (s.clone(), exec_id.to_string());
        blocking(move || svc.note_end(&s2, &e2, exit)).await??;
        let table = s.state::<Table>();
        let procs = lock(&table);
        let p = procs.by_id.get(exec_id).ok_or_else(no_exec)?;
        Ok(outcome_of(s.tier, p, dropped))
    }

    /// A background exec's output so far (what the sandbox keeps) and its state, at once.
    pub async fn peek_exec(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
    ) -> Result<crate::model::ExecPeek, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let agent = Self::agent_id(&s, exec_id)?;
        let svc = self.clone();
        let exec_id = exec_id.to_string();
        blocking(move || {
            let out = on_sandbox(&s, |sb| sb.read_background(agent, [0, 0], BACKGROUND_KEEP))?;
            if let Some(exit) = out.exit.clone() {
                svc.note_end(&s, &exec_id, exit)?;
            }
            let info = lock(&s.state::<Table>())
                .by_id
                .get(&exec_id)
                .map(|p| p.info(&exec_id))
                .ok_or_else(no_exec)?;
            let (clean_out, clean_err) = {
                let secrets = cordon_egress::scan::known_secrets_of(&s.spec.grants);
                let mut got: [Vec<u8>; 2] = Default::default();
                let mut keep = |stream: OutputStream, d: &[u8]| {
                    got[usize::from(stream == OutputStream::Stderr)].extend_from_slice(d)
                };
                let mut sink = cordon_egress::scan::RedactingSink::new(secrets, &mut keep);
                cordon_core::OutputSink::output(&mut sink, OutputStream::Stdout, &out.stdout);
                cordon_core::OutputSink::output(&mut sink, OutputStream::Stderr, &out.stderr);
                sink.finish();
                drop(sink);
                let [a, b] = got;
                (a, b)
            };
            Ok(crate::model::ExecPeek {
                info,
                stdout: String::from_utf8_lossy(&clean_out).into_owned(),
                stderr: String::from_utf8_lossy(&clean_err).into_owned(),
                stdout_dropped: out.stdout_from,
                stderr_dropped: out.stderr_from,
            })
        })
        .await?
    }

    /// Writes to a background exec's stdin (and closes it when asked).
    pub async fn exec_stdin(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
        data: Vec<u8>,
        close: bool,
    ) -> Result<(), ApiError> {
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let agent = Self::agent_id(&s, exec_id)?;
        blocking(move || {
            if !data.is_empty() {
                on_sandbox(&s, |sb| sb.write_background(agent, &data))?;
            }
            if close {
                on_sandbox(&s, |sb| sb.write_background(agent, b""))?;
            }
            Ok(())
        })
        .await?
    }

    /// Sets a background exec's terminal size (its program gets `SIGWINCH`).
    pub async fn exec_resize(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
        size: cordon_core::PtySize,
    ) -> Result<ExecInfo, ApiError> {
        size.validate()?;
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let agent = Self::agent_id(&s, exec_id)?;
        let has_pty = lock(&s.state::<Table>())
            .by_id
            .get(exec_id)
            .is_some_and(|p| p.pty.is_some());
        if !has_pty {
            return Err(ApiError::new(
                Code::Unsupported,
                "this background exec runs without a pseudo-terminal, so it has no size",
                "start it with \"pty\": {\"rows\": R, \"cols\": C} to resize it later",
            ));
        }
        let s2 = s.clone();
        blocking(move || on_sandbox(&s2, |sb| sb.resize_background(agent, size))).await??;
        let table = s.state::<Table>();
        let mut procs = lock(&table);
        let p = procs.by_id.get_mut(exec_id).ok_or_else(no_exec)?;
        p.pty = Some(size);
        Ok(p.info(exec_id))
    }

    /// Stops a background exec: SIGTERM to its process tree now, SIGKILL after the
    /// configured grace if it still runs (`kill` sends SIGKILL at once).
    pub async fn exec_signal(
        &self,
        tenant: &Tenant,
        id: &str,
        exec_id: &str,
        kill: bool,
    ) -> Result<ExecInfo, ApiError> {
        let s = self.sessions.session(tenant, id)?;
        self.sessions.refuse_paused(&s)?;
        let agent = Self::agent_id(&s, exec_id)?;
        let first = if kill {
            ProcSignal::Kill
        } else {
            ProcSignal::Term
        };
        if let Some(p) = lock(&s.state::<Table>()).by_id.get_mut(exec_id) {
            p.stopped = true;
        }
        let s2 = s.clone();
        blocking(move || on_sandbox(&s2, |sb| sb.signal_background(agent, first))).await??;
        let audit = self.sessions.audit.store.clone();
        let (t, i, tier, e) = (
            s.tenant.0.clone(),
            s.id.clone(),
            s.tier,
            exec_id.to_string(),
        );
        blocking(move || {
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                tier: Some(tier),
                event: AuditEvent::ExecSignal {
                    exec: e.to_string(),
                    kill,
                },
            })
        })
        .await?
        .map_err(audit_err)?;
        if !kill {
            let grace = self.kill_grace;
            let svc = self.clone();
            let s3 = s.clone();
            let e = exec_id.to_string();
            // A sandbox started again from its files meanwhile numbers its execs anew: the
            // kill is for the process of this start only.
            let boot = s.restarts.load(Ordering::Acquire);
            self.sessions.life.destroys.spawn(async move {
                tokio::time::sleep(grace).await;
                let _ = blocking(move || -> Result<(), ApiError> {
                    if s3.ending.get().is_some()
                        || s3.is_paused()
                        || s3.restarts.load(Ordering::Acquire) != boot
                    {
                        return Ok(());
                    }
                    svc.refresh(&s3)?;
                    let running = lock(&s3.state::<Table>())
                        .by_id
                        .get(&e)
                        .is_some_and(|p| p.exit.is_none());
                    if running {
                        on_sandbox(&s3, |sb| sb.signal_background(agent, ProcSignal::Kill))?;
                    }
                    Ok(())
                })
                .await;
            });
        }
        let table = s.state::<Table>();
        let procs = lock(&table);
        procs
            .by_id
            .get(exec_id)
            .map(|p| p.info(exec_id))
            .ok_or_else(no_exec)
    }
}
