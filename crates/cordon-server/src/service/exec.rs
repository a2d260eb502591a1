//! Execs and one-shot runs, and the audit rows they write (the exec, its egress
//! decisions, the grants it used). Uses the sessions (a claimed sandbox), and for a run
//! the admission and the pools as a create does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cordon_core::{
    Command, ExecOutcome, ExecRequest, OutputSink, OutputStream, validate_sandbox_path,
};
use sha2::{Digest, Sha256};

use super::common::{Chunk, ChunkSender, NewEventOwned, audit_err, blocking, gone, lock};
use super::pools::Pools;
use super::sessions::{BusyGuard, Session, Sessions};
use crate::audit::{
    AuditEvent, Command as AuditCommand, Created, ExecEnd, ExecRecord, ExecResult, GrantUse,
    NewEvent, RowBudget,
};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::metrics::{Metrics, TerminationLabels};
use crate::model::{CreateRequest, ExecBody, RunFile};

/// How long a one-shot run's sandbox waits after its exec before it is destroyed (it is out
/// of every tenant's reach by then), so the destroy does not compete with the response.
const ONE_SHOT_DESTROY_DELAY: Duration = Duration::from_millis(2);

/// Execs in tenants' sandboxes and one-shot runs.
#[derive(Clone)]
pub struct Execs {
    sessions: Sessions,
    pools: Pools,
    /// Each tenant's egress rows a minute.
    egress_rows: Arc<RowBudget>,
    /// `max_limits.timeout_ms`: the longest exec timeout a request may give.
    max_timeout_ms: u64,
    /// `audit.max_egress_rows_per_exec` and `audit.max_egress_rows_per_minute`.
    egress_caps: (usize, u32),
}

impl Execs {
    pub(super) fn new(
        sessions: Sessions,
        pools: Pools,
        max_timeout_ms: u64,
        egress_caps: (usize, u32),
    ) -> Self {
        Execs {
            sessions,
            pools,
            egress_rows: Arc::new(RowBudget::new(egress_caps.1)),
            max_timeout_ms,
            egress_caps,
        }
    }

    /// Starts an exec: checks the request and claims the sandbox. The returned job runs it.
    pub fn begin_exec(
        &self,
        tenant: &Tenant,
        id: &str,
        body: &ExecBody,
    ) -> Result<ExecJob, ApiError> {
        let req = body.to_request()?;
        let guard = self.sessions.claim(tenant, id)?;
        let max = self.max_timeout_ms;
        if req.timeout_ms.is_some_and(|t| t == 0 || t > max) {
            return Err(ApiError::new(
                Code::PolicyDenied,
                format!("the exec timeout must be between 1 ms and {max} ms"),
                "give a shorter timeout",
            ));
        }
        Ok(ExecJob {
            execs: self.clone(),
            guard,
            req,
        })
    }

    // ---- one-shot run ----------------------------------------------------------------

    /// Starts a one-shot run: policy, a place under the limits, a sandbox, the files.
    pub async fn begin_run(
        &self,
        tenant: &Tenant,
        create: CreateRequest,
        body: &ExecBody,
        files: Vec<RunFile>,
    ) -> Result<RunJob, ApiError> {
        self.sessions.stopping()?;
        let mut req = body.to_request()?;
        // A one-shot run's sandbox is destroyed after this exec.
        req.last = true;
        let mut inputs = Vec::new();
        for f in &files {
            let rel = validate_sandbox_path(&f.path)?;
            inputs.push((format!("/work/{rel}"), f.bytes()?, f.mode.unwrap_or(0o644)));
        }
        let mut create = create;
        create.workload = cordon_engine::workload_of(&req.command, !files.is_empty());
        let admit = &self.sessions.admit;
        let (adm, policy_row) = admit.decide_later(tenant, &create, "run").await?;
        let spec = adm.spec;
        let placed: Result<_, ApiError> = async {
            let slot = admit.reserve(tenant, &spec).await?;
            Ok((slot, self.pools.acquire(&spec).await?))
        }
        .await;
        let (slot, acq) = match placed {
            Ok(placed) => placed,
            // Without a sandbox there is no exec hop to carry the decision: write it now.
            Err(e) => {
                self.sessions.audit.record(policy_row).await?;
                return Err(e);
            }
        };
        let id = acq.sandbox.id();
        let tier = spec.tier;
        let created = Created {
            source: acq.source.to_string(),
            start_us: acq.start_us,
            limits: spec.limits.clone(),
            allow_hosts: None,
            ttl_ms: None,
            idle_timeout_ms: None,
            one_shot: true,
            snapshot: None,
        };
        // Written with the exec's own hop, before the program runs (see RunJob::run).
        let rows = vec![
            policy_row,
            NewEventOwned {
                tenant: Some(tenant.0.clone()),
                sandbox: Some(id.clone()),
                tier: Some(tier),
                event: AuditEvent::Create(created),
            },
        ];
        self.sessions
            .metrics
            .live
            .get_or_create(&Metrics::tier(tier))
            .inc();
        let session = Arc::new(Session::new(
            tenant,
            spec,
            acq,
            slot,
            (Duration::MAX, Duration::MAX),
            true,
        ));
        Ok(RunJob {
            execs: self.clone(),
            session,
            req,
            inputs,
            rows,
        })
    }
}

/// SHA-256 of what an exec runs (source, argv or module), for the audit row.
pub(super) fn command_digest(req: &ExecRequest) -> (String, &'static str) {
    let mut h = Sha256::new();
    let kind = match &req.command {
        Command::Code {
            language,
            source,
            args,
        } => {
            h.update(language.as_str().as_bytes());
            h.update([0]);
            h.update(source.as_bytes());
            for a in args {
                h.update([0]);
                h.update(a.as_bytes());
            }
            "code"
        }
        Command::Argv(v) => {
            for a in v {
                h.update(a.as_bytes());
                h.update([0]);
            }
            "argv"
        }
        Command::Wasm { module, .. } => {
            h.update(module);
            "wasm"
        }
    };
    (hex::encode(h.finalize()), kind)
}

/// Folds the egress events a tier reported with an outcome to the server's per-exec cap
/// (the outcome keeps that folded list), then holds ordinary rows to the tenant's budget a
/// minute: returns the rows to store, ending with one `truncated` row for all that were only
/// counted. Exfiltration and grant rows are never held back.
fn fold_egress(
    execs: &Execs,
    tenant: &str,
    events: &mut Vec<cordon_core::EgressEvent>,
) -> Vec<cordon_core::EgressEvent> {
    use cordon_core::{EgressDecision, EgressFold};
    if events.is_empty() {
        return Vec::new();
    }
    let mut fold = EgressFold::new(execs.egress_caps.0);
    for ev in events.drain(..) {
        fold.push(ev);
    }
    *events = fold.take();
    let ordinary = events
        .iter()
        .filter(|e| !e.is_protected() && e.decision != EgressDecision::Truncated)
        .count();
    let mut budget = execs.egress_rows.take(tenant, ordinary);
    let mut stored = Vec::with_capacity(events.len());
    let mut counted: Option<cordon_core::EgressEvent> = None;
    for ev in events.iter() {
        let itemised = if ev.decision == EgressDecision::Truncated {
            false
        } else if ev.is_protected() {
            true
        } else if budget > 0 {
            budget -= 1;
            true
        } else {
            false
        };
        if itemised {
            stored.push(ev.clone());
        } else {
            cordon_core::report::count_into(&mut counted, ev);
        }
    }
    if let Some(mut t) = counted {
        t.reason = Some(format!(
            "{} egress events were counted, not itemised: past {} rows for one exec or {} a minute for the tenant",
            t.count, execs.egress_caps.0, execs.egress_caps.1
        ));
        stored.push(t);
    }
    stored
}

/// Runs one exec in a locked sandbox and writes its audit rows; blocking.
fn exec_blocking(
    execs: &Execs,
    s: &Session,
    req: &ExecRequest,
    chunks: Option<ChunkSender>,
    gone_away: Arc<AtomicBool>,
) -> Result<ExecOutcome, ApiError> {
    let (digest, kind) = command_digest(req);
    let t0 = Instant::now();
    let mut result = {
        let mut cell = lock(&s.sandbox);
        match cell.as_mut() {
            None => Err(gone(&s.id)),
            Some(sb) => {
                let mut send = ChunkSink {
                    tx: chunks,
                    gone_away,
                };
                // Streamed output passes a redactor that knows the grants' secrets before
                // it reaches any client (NDJSON, SSE, MCP).
                let mut sink = cordon_egress::scan::RedactingSink::new(
                    cordon_egress::scan::known_secrets_of(&s.spec.grants),
                    &mut send,
                );
                let r = sb.exec(req, &mut sink).map_err(ApiError::from);
                sink.finish();
                r
            }
        }
    };
    let audit = &execs.sessions.audit.store;
    let record = exec_record(req, s, &result, (digest, kind));
    // The exec's row, its egress decisions (folded: a flood is one row per distinct
    // decision with a count, ordinary rows capped per exec and per tenant a minute, the rest
    // counted in one `truncated` row; exfiltration and grant rows always go in) and a
    // grant_use row per request that carried a grant, in one transaction.
    let mut rows = vec![s.row(AuditEvent::Exec(record))];
    let egress = match &mut result {
        Ok(o) => fold_egress(execs, &s.tenant.0, &mut o.extra.egress),
        Err(_) => Vec::new(),
    };
    for ev in &egress {
        rows.push(s.row(AuditEvent::Egress(ev.clone())));
        for used in GrantUse::of(ev) {
            rows.push(s.row(AuditEvent::GrantUse(used)));
        }
    }
    audit.record_all(&rows).map_err(audit_err)?;
    if let Ok(o) = &result {
        let m = &execs.sessions.metrics;
        m.terminations
            .get_or_create(&TerminationLabels {
                tier: s.tier.as_str().into(),
                reason: o.termination.as_str().into(),
            })
            .inc();
        m.exec_seconds
            .get_or_create(&Metrics::tier(s.tier))
            .observe(t0.elapsed().as_secs_f64());
    }
    result
}

/// The audit record of an exec: its command (digest, kind, language, limits) and how it
/// ended, or why it failed.
fn exec_record(
    req: &ExecRequest,
    s: &Session,
    result: &Result<ExecOutcome, ApiError>,
    (digest, kind): (String, &str),
) -> ExecRecord {
    let lang = match &req.command {
        Command::Code { language, .. } => Some(language.as_str()),
        _ => None,
    };
    let command = AuditCommand {
        command_sha256: digest,
        command_kind: kind.to_string(),
        lang: lang.map(str::to_string),
        limits: s.spec.limits.clone(),
    };
    ExecRecord {
        command,
        result: match result {
            Ok(o) => ExecResult::Ended(ExecEnd {
                timeout_ms: req.timeout_ms,
                termination: o.termination,
                exit_code: o.exit_code,
                signal: o.signal,
                usage: o.usage.clone(),
                timings: o.timings.clone(),
                stdout_bytes: o.stdout.len(),
                stderr_bytes: o.stderr.len(),
                stdout_truncated: o.stdout_truncated,
                stderr_truncated: o.stderr_truncated,
                weakened: o.weakened.clone(),
            }),
            Err(e) => ExecResult::Failed { error: e.failure() },
        },
    }
}

/// Where an exec's output goes: the streaming client's channel, if any. The client went
/// away when its channel closed or its request was dropped (`gone_away`).
struct ChunkSink {
    tx: Option<ChunkSender>,
    gone_away: Arc<AtomicBool>,
}

impl OutputSink for ChunkSink {
    fn output(&mut self, stream: OutputStream, data: &[u8]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Chunk {
                stream,
                data: data.to_vec(),
            });
        }
    }

    fn cancelled(&self) -> bool {
        self.gone_away.load(Ordering::Relaxed) || self.tx.as_ref().is_some_and(|t| t.is_closed())
    }
}

/// Marks a request's client as gone when the request's future is dropped before it
/// completed (the connection closed); disarmed once the answer is ready.
struct GoneOnDrop(Option<Arc<AtomicBool>>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

/// A claimed exec, ready to run.
pub struct ExecJob {
    execs: Execs,
    guard: BusyGuard,
    req: ExecRequest,
}

impl ExecJob {
    /// Runs the exec, streaming output chunks to `chunks` if given. The audit row is written
    /// before this returns.
    pub async fn run(self, chunks: Option<ChunkSender>) -> Result<ExecOutcome, ApiError> {
        let ExecJob { execs, guard, req } = self;
        let s = guard.0.clone();
        let flag = Arc::new(AtomicBool::new(false));
        let mut on_drop = GoneOnDrop(Some(flag.clone()));
        // The guard travels with the blocking work: the sandbox stays busy until the exec
        // has really ended, even when the client left first.
        let r = blocking(move || {
            let _busy = guard;
            exec_blocking(&execs, &s, &req, chunks, flag)
        })
        .await?;
        on_drop.0 = None;
        r
    }
}

/// A one-shot run with its sandbox, ready to run.
pub struct RunJob {
    execs: Execs,
    session: Arc<Session>,
    req: ExecRequest,
    inputs: Vec<(String, Vec<u8>, u32)>,
    /// The policy decision and the create, written before anything runs.
    rows: Vec<NewEventOwned>,
}

impl RunJob {
    /// Puts the files in, execs, destroys the sandbox (always), and returns the outcome.
    pub async fn run(self, chunks: Option<ChunkSender>) -> Result<ExecOutcome, ApiError> {
        let RunJob {
            execs,
            session,
            req,
            inputs,
            rows,
        } = self;
        let s = session.clone();
        let execs2 = execs.clone();
        let start_us = session.start_us;
        let r = blocking(move || -> Result<ExecOutcome, ApiError> {
            // One hop and one commit for the rows, then the files and the program: nothing
            // of the request's runs before its policy decision and create are on record.
            let events: Vec<NewEvent<'_>> = rows.iter().map(|r| r.borrowed()).collect();
            execs2
                .sessions
                .audit
                .store
                .sandbox_started_with(&s.id, Some(&s.tenant.0), s.tier, &events)
                .map_err(audit_err)?;
            for (path, data, mode) in &inputs {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.put_file(path, data, *mode)?;
            }
            exec_blocking(&execs2, &s, &req, chunks, Arc::new(AtomicBool::new(false)))
        })
        .await;
        // The outcome does not wait for the teardown: the sandbox is out of every tenant's
        // reach already (it never was in the session map), its destroy row is written by
        // the task, and its place under the limits is freed when that finishes. It is
        // marked as on its way back before the answer goes: the client's next run, which
        // may come at once, waits for that place rather than being refused.
        session.leaving();
        let tracker = execs.sessions.life.destroys.clone();
        let sessions = execs.sessions.clone();
        tracker.spawn(async move {
            // Let the response go out first: tearing the sandbox down (its processes'
            // exits, namespace and cgroup teardown) would otherwise compete with writing it.
            tokio::time::sleep(ONE_SHOT_DESTROY_DELAY).await;
            if let Err(e) = sessions.destroy_session(session, "one-shot").await {
                tracing::warn!(error = %e, "destroying a one-shot sandbox");
            }
        });
        let mut outcome = r??;
        outcome.timings.start_us = start_us;
        Ok(outcome)
    }
}
