//! The transport-independent core: sessions, limits, warm pools, the reaper, crash
//! recovery and audit. The HTTP API and the MCP server are thin layers over [`Service`].
//!
//! Backend calls block (syscalls, child processes), so every one runs in `spawn_blocking`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Command, ExecOutcome, ExecRequest, OutputStream, Probe, Sandbox, SandboxSpec, Tier,
    validate_sandbox_path,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cordon_engine::{
    Admission, BudgetLimits, Catalogue, Gate, GateSettings, Issuer, Ledger, Principal, Reservation,
    RulesSource,
};

use crate::ServerError;
use crate::audit::{Audit, Event, LiveRow, NewEvent, Query, RowBudget, now_ms};
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::keys::{Keys, Tenant};
use crate::metrics::{Metrics, StartLabels, TerminationLabels};
use crate::model::{CreateRequest, ExecBody, RunFile, SandboxInfo};

/// The backends the service may use, one per tier, injected by the caller.
pub type Backends = BTreeMap<Tier, Arc<dyn Backend>>;

/// Cleans up what a crashed server left of sandboxes of the given rows (cgroups,
/// processes, tier-specific files); returns one line per thing removed. Injected by the
/// caller, which knows the tiers.
pub type RecoveryHook = Arc<dyn Fn(&[LiveRow]) -> Vec<String> + Send + Sync>;

/// A chunk of output on its way to a streaming client.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub stream: OutputStream,
    pub data: Vec<u8>,
}

pub type ChunkSender = mpsc::UnboundedSender<Chunk>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a one-shot run's sandbox waits after its exec before it is destroyed (it is out
/// of every tenant's reach by then), so the destroy does not compete with the response.
const ONE_SHOT_DESTROY_DELAY: Duration = Duration::from_millis(2);

/// How long a warm pool waits after a take before refilling, while it still holds others.
const REFILL_DEBOUNCE: Duration = Duration::from_millis(25);

/// Runs a blocking closure off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a worker thread failed: {e}")))
}

fn audit_err(e: ServerError) -> ApiError {
    ApiError::internal(format!(
        "the audit row could not be written ({e}); nothing was reported without it"
    ))
}

/// A sandbox that is destroyed off the async runtime if it is ever dropped still alive
/// (a cancelled request, an early return): a backend's destroy blocks, and some backends
/// own resources that must not be dropped on a runtime thread.
pub struct Held(Option<Box<dyn Sandbox>>);

impl Held {
    fn new(sb: Box<dyn Sandbox>) -> Self {
        Held(Some(sb))
    }

    fn as_mut(&mut self) -> Option<&mut Box<dyn Sandbox>> {
        self.0.as_mut()
    }

    fn take(&mut self) -> Option<Box<dyn Sandbox>> {
        self.0.take()
    }

    fn id(&self) -> String {
        self.0
            .as_ref()
            .map(|s| s.id().to_string())
            .unwrap_or_default()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(mut sb) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn_blocking(move || {
                        let _ = sb.destroy();
                        drop(sb);
                    });
                }
                Err(_) => {
                    let _ = sb.destroy();
                }
            }
        }
    }
}

type SandboxCell = Arc<Mutex<Held>>;

/// One live sandbox held by a tenant.
struct Session {
    id: String,
    tenant: Tenant,
    tier: Tier,
    spec: SandboxSpec,
    created_ms: i64,
    created: Instant,
    ttl: Duration,
    idle: Duration,
    /// Milliseconds since `created` of the last request's end.
    last_used: AtomicI64,
    busy: AtomicBool,
    source: &'static str,
    start_us: u64,
    sandbox: SandboxCell,
    /// Ends a running exec at once, so destroying a busy sandbox does not wait for it.
    interrupt: Option<cordon_core::Interrupter>,
    /// Why it is being destroyed, once that has begun. The session stays listed (as
    /// `destroying`) until its sandbox is gone and the destroy is audited, so a sandbox
    /// missing from the list always has its destroy row on record.
    ending: OnceLock<&'static str>,
    /// Set once the destroy is done and audited; a second destroy waits on it.
    ended: watch::Sender<bool>,
    _slot: Reservation,
}

impl Session {
    /// Marks the session as being destroyed for `reason`; false if that had begun already.
    fn begin_ending(&self, reason: &'static str) -> bool {
        let first = self.ending.set(reason).is_ok();
        // Pairs with the fence in `claim`: the destroy's later look at `busy` sees a claim
        // that missed this mark, and interrupts its exec.
        fence(Ordering::SeqCst);
        first
    }

    /// Waits until a destroy begun elsewhere is done and audited.
    async fn wait_ended(&self) {
        let mut rx = self.ended.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|done| *done).await;
    }

    fn touch(&self) {
        self.last_used
            .store(self.created.elapsed().as_millis() as i64, Ordering::Relaxed);
    }

    fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.clone(),
            tier: self.tier,
            state: if self.ending.get().is_some() {
                "destroying".into()
            } else {
                "live".into()
            },
            created_ms: self.created_ms,
            expires_ms: self.created_ms + self.ttl.as_millis() as i64,
            idle_timeout_ms: self.idle.as_millis() as u64,
            last_used_ms: self.created_ms + self.last_used.load(Ordering::Relaxed),
            limits: self.spec.limits.clone(),
            allow_hosts: self.spec.egress.allow.clone(),
            source: self.source.into(),
            start_us: self.start_us,
            busy: self.busy.load(Ordering::Relaxed),
        }
    }

    /// Why the reaper should end it now, if it should.
    fn expired(&self) -> Option<&'static str> {
        let age = self.created.elapsed();
        if age >= self.ttl {
            return Some("ttl");
        }
        let idle_for = age
            .as_millis()
            .saturating_sub(self.last_used.load(Ordering::Relaxed).max(0) as u128);
        if !self.busy.load(Ordering::Relaxed) && idle_for >= self.idle.as_millis() {
            return Some("idle");
        }
        None
    }
}

/// Clears a session's busy flag when an exec or file call ends.
struct BusyGuard(Arc<Session>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.store(false, Ordering::Release);
    }
}

/// A warm pool of fresh, never-used sandboxes of one spec: a tier's default, or one a
/// `[[pool]]` table gives.
struct Pool {
    tier: Tier,
    size: usize,
    spec: SandboxSpec,
    ready: Mutex<VecDeque<Held>>,
    wake: Notify,
}

struct Inner {
    cfg: Config,
    backends: Backends,
    probes: BTreeMap<Tier, Probe>,
    audit: Arc<Audit>,
    /// Each tenant's egress rows a minute.
    egress_rows: RowBudget,
    keys: Keys,
    metrics: Metrics,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    pools: Vec<Arc<Pool>>,
    /// The gate every create and run passes: the operator's ceiling, the grant catalogue
    /// and the tier policy.
    gate: Gate,
    /// Sandboxes and memory held, per tenant and in all.
    ledger: Ledger,
    /// Memory the warm pools hold, counted against the server's budget for their life.
    _pool_budget: Vec<Reservation>,
    /// Mints grant tokens and publishes their keys.
    issuer: Arc<Issuer>,
    throttle: crate::api::Throttle,
    stopping: AtomicBool,
    cancel: CancellationToken,
    /// Destroys running in the background (one-shot runs, the reaper); shutdown waits.
    destroys: TaskTracker,
    /// The reaper and the pool refills; shutdown waits for them to return, so no refill
    /// adds a sandbox after the pools are drained and no task holds the data dir's lock
    /// once shutdown is done.
    background: TaskTracker,
    _lock: File,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// Who made a sandbox and where it came from, for the create audit row.
struct Acquired {
    sandbox: Held,
    source: &'static str,
    start_us: u64,
}

/// What a crash recovery found and removed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    pub sandboxes: Vec<String>,
    pub removed: Vec<String>,
    pub scratch: Vec<String>,
}

impl Service {
    /// Opens the data dir (taking its lock), recovers from a crash, starts the reaper and
    /// warm pools. Must be called inside a tokio runtime.
    pub async fn start(
        cfg: Config,
        keys: Keys,
        backends: Backends,
        recovery: Option<RecoveryHook>,
    ) -> Result<Self, ServerError> {
        let (lock_file, audit, report) = tokio::task::spawn_blocking({
            let cfg = cfg.clone();
            move || open_and_recover(&cfg, recovery)
        })
        .await
        .map_err(|e| ServerError::Config(format!("startup worker failed: {e}")))??;
        if !report.sandboxes.is_empty() || !report.scratch.is_empty() || !report.removed.is_empty()
        {
            tracing::warn!(
                sandboxes = report.sandboxes.len(),
                removed = report.removed.len(),
                scratch = report.scratch.len(),
                "cleaned up what a previous server left behind"
            );
        }
        let probes = tokio::task::spawn_blocking({
            let backends = backends.clone();
            move || {
                backends
                    .iter()
                    .map(|(t, b)| (*t, b.probe()))
                    .collect::<BTreeMap<_, _>>()
            }
        })
        .await
        .map_err(|e| ServerError::Config(format!("probe worker failed: {e}")))?;
        let rules = match &cfg.policy.rules_file {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    ServerError::Config(format!("reading the policy file {}: {e}", p.display()))
                })?;
                RulesSource::Text(text)
            }
            None => RulesSource::Shipped,
        };
        let bench = cfg.policy.bench_file.as_ref().and_then(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            match cordon_policy::BenchFigures::from_bench_json(&text) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!("ignoring the bench figures in {}: {e}", p.display());
                    None
                }
            }
        });
        let issuer = Arc::new(
            Issuer::new(
                cfg.oidc
                    .issuer
                    .clone()
                    .unwrap_or_else(|| format!("http://{}", cfg.bind)),
                cfg.oidc.rotate_every.0,
                cfg.oidc.max_token_life.0,
            )
            .map_err(|e| ServerError::Config(e.to_string()))?,
        );
        let catalogue = Catalogue::load(&cfg.grants, Some(issuer.clone()))
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let available = probes
            .iter()
            .filter(|(t, p)| p.available() && backends.contains_key(t))
            .map(|(t, _)| *t)
            .collect();
        let unavailable = probes
            .iter()
            .filter(|(_, p)| !p.available())
            .map(|(t, p)| {
                let why = p
                    .capabilities
                    .iter()
                    .filter(|c| !c.ok && c.required)
                    .map(|c| format!("{}: {}", c.name, c.detail))
                    .collect::<Vec<_>>()
                    .join("; ");
                (*t, why)
            })
            .collect();
        let gate = Gate::new(
            GateSettings {
                default_tier: cfg.default_tier,
                default_limits: cfg.default_limits.clone(),
                max_limits: cfg.max_limits.clone(),
                default_ttl: cfg.sessions.default_ttl.0,
                max_ttl: cfg.sessions.max_ttl.0,
                default_idle: cfg.sessions.default_idle_timeout.0,
            },
            cfg.ceiling(),
            Arc::new(catalogue),
            rules,
            bench,
        )
        .with_tiers(available, unavailable);
        gate.load_rules().map_err(|e| {
            ServerError::Config(match &cfg.policy.rules_file {
                Some(p) => format!("the policy file {}: {e}", p.display()),
                None => e,
            })
        })?;
        let ledger = Ledger::new(BudgetLimits {
            max_sandboxes: cfg.sessions.max_sandboxes,
            max_sandboxes_per_tenant: cfg.sessions.max_sandboxes_per_tenant,
            max_memory: cfg
                .budgets
                .max_memory
                .map(|s| s.0)
                .unwrap_or_else(cordon_engine::host_memory_budget),
        });
        // The default spec of each pooled tier, then the `[[pool]]` specs, built as a
        // request with the same tier, limits and lists builds its spec, so it takes one.
        let defaults = cfg.pools.iter().map(|(tier, size)| {
            let mut spec = SandboxSpec::new(*tier);
            spec.limits = cfg.default_limits.clone();
            (spec, *size)
        });
        let others = cfg.spec_pools.iter().map(|p| {
            let mut spec = SandboxSpec::new(p.tier);
            spec.limits = p.limits.apply(&cfg.default_limits);
            spec.egress = cordon_core::EgressPolicy {
                allow: p.allow_hosts.clone(),
                deny: p.deny_hosts.clone(),
            };
            (spec, p.size)
        });
        let mut pools: Vec<Arc<Pool>> = Vec::new();
        for (spec, size) in defaults.chain(others) {
            let tier = spec.tier;
            if size == 0 {
                continue;
            }
            if !backends.contains_key(&tier) {
                return Err(ServerError::Config(format!(
                    "a warm pool of the {tier} tier is configured but this build has no {tier} tier"
                )));
            }
            if pools.iter().any(|p| p.spec == spec) {
                return Err(ServerError::Config(format!(
                    "two warm pools of the {tier} tier hold the same spec; merge them into one"
                )));
            }
            if let Err(e) = check_pool_spec(&spec, &gate) {
                return Err(ServerError::Config(format!(
                    "a warm pool of the {tier} tier: {e}"
                )));
            }
            pools.push(Arc::new(Pool {
                tier,
                size,
                spec,
                ready: Mutex::new(VecDeque::new()),
                wake: Notify::new(),
            }));
        }
        let mut pool_budget = Vec::new();
        for p in &pools {
            let bytes = p.spec.limits.memory_bytes.saturating_mul(p.size as u64);
            pool_budget.push(
                ledger
                    .reserve_pool(bytes)
                    .map_err(|e| ServerError::Config(format!("the {} pool: {e}", p.tier)))?,
            );
        }
        let egress_rows = RowBudget::new(cfg.audit.max_egress_rows_per_minute);
        let svc = Service {
            inner: Arc::new(Inner {
                cfg,
                backends,
                probes,
                egress_rows,
                audit: Arc::new(audit),
                keys,
                metrics: Metrics::new(),
                sessions: Mutex::new(HashMap::new()),
                pools,
                gate,
                ledger,
                _pool_budget: pool_budget,
                issuer,
                throttle: crate::api::Throttle::default(),
                stopping: AtomicBool::new(false),
                cancel: CancellationToken::new(),
                destroys: TaskTracker::new(),
                background: TaskTracker::new(),
                _lock: lock_file,
            }),
        };
        for pool in &svc.inner.pools {
            if svc.tier_available(pool.tier) {
                svc.inner.background.spawn(svc.clone().refill(pool.clone()));
            } else {
                tracing::warn!(tier = %pool.tier, "tier unavailable here: its warm pool stays empty");
            }
        }
        svc.inner.background.spawn(svc.clone().reaper());
        Ok(svc)
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Failed-key back-off per source address.
    pub fn throttle(&self) -> &crate::api::Throttle {
        &self.inner.throttle
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn audit(&self) -> &Arc<Audit> {
        &self.inner.audit
    }

    pub fn probes(&self) -> &BTreeMap<Tier, Probe> {
        &self.inner.probes
    }

    /// Fires when shutdown begins.
    pub fn cancelled(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    fn tier_available(&self, tier: Tier) -> bool {
        self.inner.probes.get(&tier).is_some_and(|p| p.available())
    }

    fn stopping(&self) -> Result<(), ApiError> {
        if self.inner.stopping.load(Ordering::Acquire) {
            return Err(ApiError::new(
                Code::ShuttingDown,
                "the server is shutting down",
                "retry against the restarted server",
            ));
        }
        Ok(())
    }

    /// Number of fresh sandboxes waiting in a tier's pool.
    pub fn pool_ready(&self, tier: Tier) -> usize {
        self.inner
            .pools
            .iter()
            .filter(|p| p.tier == tier)
            .map(|p| lock(&p.ready).len())
            .sum()
    }

    /// Number of destroys under way (one-shot runs' teardowns, reaped and deleted sandboxes).
    pub fn destroys_in_flight(&self) -> usize {
        self.inner.destroys.len()
    }

    /// Number of sandboxes tenants hold.
    pub fn live_count(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    async fn record(&self, e: NewEventOwned) -> Result<i64, ApiError> {
        let audit = self.inner.audit.clone();
        blocking(move || audit.record(&e.borrowed()))
            .await?
            .map_err(audit_err)
    }

    // ---- policy ----------------------------------------------------------------------

    /// The gate every create and run passes.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// The token issuer of minted grants.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.inner.issuer
    }

    /// Turns a create request into a spec, or refuses it. Every decision is audited.
    async fn decide(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<Admission, ApiError> {
        let (adm, row) = self.decide_later(tenant, req, what).await?;
        self.record(row).await?;
        Ok(adm)
    }

    /// [`Self::decide`], but an allowed request's policy row is returned for the caller to
    /// write with its next rows (before anything it reports); a refusal's is written here.
    async fn decide_later(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<(Admission, NewEventOwned), ApiError> {
        let who = Principal::Tenant(tenant.0.clone());
        match self.inner.gate.admit(&who, req, what) {
            Ok(adm) => {
                let row = NewEventOwned {
                    tenant: Some(tenant.0.clone()),
                    sandbox: None,
                    kind: "policy",
                    decision: Some("allow"),
                    tier: Some(adm.spec.tier),
                    detail: serde_json::to_value(&adm.record).unwrap_or_default(),
                };
                Ok((adm, row))
            }
            Err(d) => {
                self.record(NewEventOwned {
                    tenant: Some(tenant.0.clone()),
                    sandbox: None,
                    kind: "policy",
                    decision: Some("deny"),
                    tier: d.record.tier,
                    detail: serde_json::to_value(&*d.record).unwrap_or_default(),
                })
                .await?;
                let e = ApiError::from(d);
                self.inner.metrics.deny(e.code.as_str());
                Err(e)
            }
        }
    }

    /// Reserves a place under the budgets, or says when to retry.
    fn reserve(&self, tenant: &Tenant, spec: &SandboxSpec) -> Result<Reservation, ApiError> {
        self.disk_guard()?;
        let rules = self
            .inner
            .gate
            .rules_for(&Principal::Tenant(tenant.0.clone()));
        match self.inner.ledger.reserve(
            &tenant.0,
            spec.limits.memory_bytes,
            (rules.max_sandboxes, rules.max_memory),
        ) {
            Ok(r) => Ok(r),
            Err(full) => {
                self.inner.metrics.deny("too_many_sandboxes");
                let mut e = ApiError::new(
                    Code::TooManySandboxes,
                    full.message,
                    "destroy sandboxes you no longer need, or retry after the Retry-After seconds",
                );
                e.retry_after = Some(self.inner.cfg.sessions.retry_after_secs.max(1));
                Err(e)
            }
        }
    }

    /// Refuses a new sandbox while the data dir's file system is nearly full: the audit
    /// store must be able to write what every running sandbox does.
    fn disk_guard(&self) -> Result<(), ApiError> {
        let need = self.inner.cfg.audit.min_free_disk.0;
        if need == 0 {
            return Ok(());
        }
        let free = match nix::sys::statvfs::statvfs(&self.inner.cfg.data_dir) {
            Ok(v) => v.blocks_available().saturating_mul(v.fragment_size()),
            Err(e) => {
                tracing::warn!(error = %e, "reading the data dir's free space");
                return Ok(());
            }
        };
        if free >= need {
            return Ok(());
        }
        tracing::error!(
            free,
            need,
            "the data dir's file system is nearly full: new sandboxes are refused"
        );
        self.inner.metrics.deny("storage_low");
        let mut e = ApiError::new(
            Code::StorageLow,
            "the server is low on storage and takes no new sandboxes for now",
            "retry later; the operator has been told (free space under audit.min_free_disk)",
        );
        e.retry_after = Some(60);
        Err(e)
    }

    /// A fresh sandbox for `spec`: from the warm pool when the spec is the pool's, else cold.
    async fn acquire(&self, spec: &SandboxSpec) -> Result<Acquired, ApiError> {
        let tier = spec.tier;
        let labels = Metrics::tier(tier);
        if self.inner.pools.iter().any(|p| p.tier == tier) {
            // Pools hold sandboxes of no owner yet: the spec matches whoever asks.
            let mut unowned = spec.clone();
            unowned.owner = None;
            if let Some(pool) = self.inner.pools.iter().find(|p| p.spec == unowned) {
                let taken = lock(&pool.ready).pop_front();
                self.pool_gauge(tier);
                pool.wake.notify_one();
                if let Some(mut sandbox) = taken {
                    if let (Some(owner), Some(sb)) = (&spec.owner, sandbox.as_mut()) {
                        sb.set_owner(owner);
                    }
                    self.inner.metrics.pool_hits.get_or_create(&labels).inc();
                    self.started(tier, "pool");
                    return Ok(Acquired {
                        sandbox,
                        source: "pool",
                        start_us: 0,
                    });
                }
            }
            self.inner.metrics.pool_misses.get_or_create(&labels).inc();
        }
        let backend = self.inner.backends.get(&tier).cloned().ok_or_else(|| {
            ApiError::new(
                Code::TierUnavailable,
                format!("no {tier} tier"),
                "choose another tier",
            )
        })?;
        let spec2 = spec.clone();
        let t0 = Instant::now();
        let sandbox = blocking(move || backend.create(&spec2)).await??;
        self.inner
            .metrics
            .start_seconds
            .get_or_create(&labels)
            .observe(t0.elapsed().as_secs_f64());
        self.started(tier, "cold");
        let start_us = sandbox.start_us();
        Ok(Acquired {
            sandbox: Held::new(sandbox),
            source: "cold",
            start_us,
        })
    }

    fn started(&self, tier: Tier, source: &str) {
        self.inner
            .metrics
            .starts
            .get_or_create(&StartLabels {
                tier: tier.as_str().into(),
                source: source.into(),
            })
            .inc();
    }

    // ---- sessions --------------------------------------------------------------------

    /// Creates a sandbox for `tenant`.
    pub async fn create(
        &self,
        tenant: &Tenant,
        req: CreateRequest,
    ) -> Result<SandboxInfo, ApiError> {
        self.stopping()?;
        let Admission {
            spec, ttl, idle, ..
        } = self.decide(tenant, &req, "create").await?;
        let slot = self.reserve(tenant, &spec)?;
        let acq = match self.acquire(&spec).await {
            Ok(a) => a,
            Err(e) => {
                self.record(NewEventOwned {
                    tenant: Some(tenant.0.clone()),
                    sandbox: None,
                    kind: "create",
                    decision: Some("error"),
                    tier: Some(spec.tier),
                    detail: json!({"error": e.to_json()}),
                })
                .await?;
                return Err(e);
            }
        };
        let id = acq.sandbox.id();
        let created_ms = now_ms();
        let session = Arc::new(Session {
            id: id.clone(),
            tenant: tenant.clone(),
            tier: spec.tier,
            spec: spec.clone(),
            created_ms,
            created: Instant::now(),
            ttl,
            idle,
            last_used: AtomicI64::new(0),
            busy: AtomicBool::new(false),
            source: acq.source,
            start_us: acq.start_us,
            interrupt: acq.sandbox.0.as_ref().and_then(|sb| sb.interrupter()),
            sandbox: Arc::new(Mutex::new(acq.sandbox)),
            ending: OnceLock::new(),
            ended: watch::channel(false).0,
            _slot: slot,
        });
        let audit = self.inner.audit.clone();
        let (t, i, tier) = (tenant.0.clone(), id.clone(), spec.tier);
        let detail = json!({
            "source": acq.source,
            "start_us": acq.start_us,
            "limits": spec.limits,
            "allow_hosts": spec.egress.allow,
            "ttl_ms": ttl.as_millis() as u64,
            "idle_timeout_ms": idle.as_millis() as u64,
        });
        let written = blocking(move || -> Result<(), ServerError> {
            audit.sandbox_started(&i, Some(&t), tier, "live")?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                kind: "create",
                decision: Some("ok"),
                tier: Some(tier),
                detail,
            })?;
            Ok(())
        })
        .await?;
        if let Err(e) = written {
            session.begin_ending("audit-failure");
            self.destroy_session(session, "audit-failure").await.ok();
            return Err(audit_err(e));
        }
        self.inner
            .metrics
            .live
            .get_or_create(&Metrics::tier(spec.tier))
            .inc();
        let info = session.info();
        lock(&self.inner.sessions).insert(id, session);
        Ok(info)
    }

    fn session(&self, tenant: &Tenant, id: &str) -> Result<Arc<Session>, ApiError> {
        let s = lock(&self.inner.sessions).get(id).cloned();
        match s {
            Some(s) if s.tenant == *tenant => Ok(s),
            _ => Err(ApiError::not_found("sandbox")),
        }
    }

    fn claim(&self, tenant: &Tenant, id: &str) -> Result<BusyGuard, ApiError> {
        self.stopping()?;
        let s = self.session(tenant, id)?;
        if s.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(ApiError::new(
                Code::SandboxBusy,
                "the sandbox is running another request",
                "wait for it to finish, or use another sandbox for parallel work",
            ));
        }
        // Checked after taking the busy flag, with a fence that pairs with the one in
        // `begin_ending`: either this sees the mark, or the destroy sees the flag and
        // interrupts the exec.
        fence(Ordering::SeqCst);
        if let Some(reason) = s.ending.get() {
            s.busy.store(false, Ordering::Release);
            return Err(ApiError::new(
                Code::SandboxGone,
                format!("the sandbox is being destroyed ({reason})"),
                "create a new sandbox",
            ));
        }
        s.touch();
        Ok(BusyGuard(s))
    }

    /// Sandboxes `tenant` holds.
    pub fn list(&self, tenant: &Tenant) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = lock(&self.inner.sessions)
            .values()
            .filter(|s| s.tenant == *tenant)
            .map(|s| s.info())
            .collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// One sandbox of `tenant`; a destroyed one is reported as such.
    pub async fn info(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ApiError> {
        if let Ok(s) = self.session(tenant, id) {
            return Ok(s.info());
        }
        Err(ApiError::not_found("live sandbox"))
    }

    /// Destroys a sandbox; destroying one already destroyed succeeds again. A sandbox the
    /// reaper is destroying is waited for and then reported as already destroyed.
    pub async fn destroy(&self, tenant: &Tenant, id: &str) -> Result<serde_json::Value, ApiError> {
        let s = {
            let map = lock(&self.inner.sessions);
            match map.get(id) {
                Some(s) if s.tenant == *tenant => Some(s.clone()),
                Some(_) => return Err(ApiError::not_found("sandbox")),
                None => None,
            }
        };
        match s {
            Some(s) if s.begin_ending("client") => {
                // Detached from this request: a client that goes away mid-request must not
                // leave the sandbox half destroyed and listed as `destroying` for ever.
                let svc = self.clone();
                self.inner
                    .destroys
                    .spawn(async move { svc.destroy_session(s, "client").await })
                    .await
                    .map_err(|e| ApiError::internal(format!("the destroy task failed: {e}")))??;
                Ok(json!({"id": id, "state": "destroyed", "already": false}))
            }
            Some(s) => {
                s.wait_ended().await;
                Ok(json!({"id": id, "state": "destroyed", "already": true}))
            }
            None => {
                let audit = self.inner.audit.clone();
                let i = id.to_string();
                let known = blocking(move || audit.sandbox_state(&i))
                    .await?
                    .map_err(audit_err)?;
                match known {
                    Some((Some(owner), state)) if owner == tenant.0 && state != "live" => {
                        Ok(json!({"id": id, "state": "destroyed", "already": true}))
                    }
                    _ => Err(ApiError::not_found("sandbox")),
                }
            }
        }
    }

    /// Destroys a session marked as ending, audits it, and only then takes it off the map.
    async fn destroy_session(&self, s: Arc<Session>, reason: &'static str) -> Result<(), ApiError> {
        // Tokens minted for it are refused from now on (introspection answers inactive).
        self.inner.issuer.end_sandbox(&s.id);
        // A running exec holds the sandbox: end it rather than wait for its timeout.
        if s.busy.load(Ordering::Acquire)
            && let Some(interrupt) = &s.interrupt
        {
            interrupt();
        }
        let cell = s.sandbox.clone();
        let audit = self.inner.audit.clone();
        let (t, i, tier) = (s.tenant.0.clone(), s.id.clone(), s.tier);
        let res = blocking(move || -> Result<serde_json::Value, ServerError> {
            let t0 = Instant::now();
            let taken = lock(&cell).take();
            let outcome = match taken {
                Some(mut sb) => match sb.destroy() {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => json!({"ok": false, "error": e.to_string()}),
                },
                None => json!({"ok": true, "note": "already gone"}),
            };
            let detail = json!({
                "reason": reason,
                "destroy_us": t0.elapsed().as_micros() as u64,
                "result": outcome,
            });
            audit.sandbox_ended(&i, "destroyed", reason)?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                kind: "destroy",
                decision: Some(reason),
                tier: Some(tier),
                detail: detail.clone(),
            })?;
            Ok(detail)
        })
        .await;
        {
            let mut map = lock(&self.inner.sessions);
            if map.get(&s.id).is_some_and(|m| Arc::ptr_eq(m, &s)) {
                map.remove(&s.id);
            }
        }
        s.ended.send_replace(true);
        self.inner
            .metrics
            .live
            .get_or_create(&Metrics::tier(s.tier))
            .dec();
        res?.map(|_| ()).map_err(audit_err)
    }

    // ---- exec and files --------------------------------------------------------------

    /// Starts an exec: checks the request and claims the sandbox. The returned job runs it.
    pub fn begin_exec(
        &self,
        tenant: &Tenant,
        id: &str,
        body: &ExecBody,
    ) -> Result<ExecJob, ApiError> {
        let req = body.to_request()?;
        let guard = self.claim(tenant, id)?;
        let max = self.inner.cfg.max_limits.timeout_ms;
        if req.timeout_ms.is_some_and(|t| t == 0 || t > max) {
            return Err(ApiError::new(
                Code::PolicyDenied,
                format!("the exec timeout must be between 1 ms and {max} ms"),
                "give a shorter timeout",
            ));
        }
        Ok(ExecJob {
            svc: self.clone(),
            guard,
            req,
        })
    }

    /// Writes a file into a sandbox (under /work).
    pub async fn put_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
        data: Vec<u8>,
        mode: u32,
    ) -> Result<serde_json::Value, ApiError> {
        let rel = validate_sandbox_path(path)?;
        let full = format!("/work/{rel}");
        let guard = self.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.inner.audit.clone();
        let p = full.clone();
        let n = data.len();
        // The sandbox stays busy until the blocking call has ended, even if the client
        // gives up first: the guard travels with the work, not with the request.
        blocking(move || -> Result<(), ApiError> {
            let _busy = guard;
            let digest = hex::encode(Sha256::digest(&data));
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.put_file(&p, &data, mode)
            };
            audit
                .record(&NewEvent {
                    tenant: Some(&s.tenant.0),
                    sandbox: Some(&s.id),
                    kind: "file_put",
                    decision: Some(if r.is_ok() { "ok" } else { "error" }),
                    tier: Some(s.tier),
                    detail: json!({"path": p, "bytes": n, "sha256": digest, "mode": mode,
                        "error": r.as_ref().err().map(|e| e.to_string())}),
                })
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await??;
        Ok(json!({"path": full, "bytes": n}))
    }

    /// Reads a file out of a sandbox (under /work), at most the configured size.
    pub async fn get_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
    ) -> Result<Vec<u8>, ApiError> {
        let rel = validate_sandbox_path(path)?;
        let full = format!("/work/{rel}");
        let guard = self.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.inner.audit.clone();
        let max = self.inner.cfg.http.max_file_bytes as u64;
        let data = blocking(move || -> Result<Vec<u8>, ApiError> {
            let _busy = guard;
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.get_file(&full, max)
            };
            audit
                .record(&NewEvent {
                    tenant: Some(&s.tenant.0),
                    sandbox: Some(&s.id),
                    kind: "file_get",
                    decision: Some(if r.is_ok() { "ok" } else { "error" }),
                    tier: Some(s.tier),
                    detail: json!({"path": full,
                        "bytes": r.as_ref().map(|d| d.len()).ok(),
                        "sha256": r.as_ref().map(|d| hex::encode(Sha256::digest(d))).ok(),
                        "error": r.as_ref().err().map(|e| e.to_string())}),
                })
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await??;
        Ok(data)
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
        self.stopping()?;
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
        let (adm, policy_row) = self.decide_later(tenant, &create, "run").await?;
        let spec = adm.spec;
        let placed: Result<_, ApiError> = async {
            let slot = self.reserve(tenant, &spec)?;
            Ok((slot, self.acquire(&spec).await?))
        }
        .await;
        let (slot, acq) = match placed {
            Ok(placed) => placed,
            // Without a sandbox there is no exec hop to carry the decision: write it now.
            Err(e) => {
                self.record(policy_row).await?;
                return Err(e);
            }
        };
        let id = acq.sandbox.id();
        let tier = spec.tier;
        let detail = json!({"source": acq.source, "start_us": acq.start_us, "limits": spec.limits, "one_shot": true});
        // Written with the exec's own hop, before the program runs (see RunJob::run).
        let rows = vec![
            policy_row,
            NewEventOwned {
                tenant: Some(tenant.0.clone()),
                sandbox: Some(id.clone()),
                kind: "create",
                decision: Some("ok"),
                tier: Some(tier),
                detail,
            },
        ];
        self.inner
            .metrics
            .live
            .get_or_create(&Metrics::tier(tier))
            .inc();
        let session = Arc::new(Session {
            id,
            tenant: tenant.clone(),
            tier,
            spec,
            created_ms: now_ms(),
            created: Instant::now(),
            ttl: Duration::MAX,
            idle: Duration::MAX,
            last_used: AtomicI64::new(0),
            busy: AtomicBool::new(true),
            source: acq.source,
            start_us: acq.start_us,
            interrupt: acq.sandbox.0.as_ref().and_then(|sb| sb.interrupter()),
            sandbox: Arc::new(Mutex::new(acq.sandbox)),
            ending: OnceLock::new(),
            ended: watch::channel(false).0,
            _slot: slot,
        });
        Ok(RunJob {
            svc: self.clone(),
            session,
            req,
            inputs,
            rows,
        })
    }

    // ---- audit -----------------------------------------------------------------------

    /// Audit rows of `tenant`.
    pub async fn audit_query(&self, tenant: &Tenant, q: Query) -> Result<Vec<Event>, ApiError> {
        let audit = self.inner.audit.clone();
        let t = tenant.0.clone();
        blocking(move || audit.query(Some(&t), &q))
            .await?
            .map_err(audit_err)
    }

    // ---- background tasks ------------------------------------------------------------

    async fn reaper(self) {
        let every = self.inner.cfg.sessions.reap_interval.0;
        let mut last_retention: Option<Instant> = None;
        let mut last_trim: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let expired: Vec<(Arc<Session>, &'static str)> = lock(&self.inner.sessions)
                .values()
                .filter_map(|s| {
                    let reason = s.expired()?;
                    s.begin_ending(reason).then(|| (s.clone(), reason))
                })
                .collect();
            for (s, reason) in expired {
                let svc = self.clone();
                self.inner.destroys.spawn(async move {
                    if let Err(e) = svc.destroy_session(s, reason).await {
                        tracing::warn!(error = %e, "reaping a sandbox");
                    }
                });
            }
            if last_trim.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                last_trim = Some(Instant::now());
                let audit = self.inner.audit.clone();
                let max = self.inner.cfg.audit.max_size.0;
                match tokio::task::spawn_blocking(move || audit.trim_to(max)).await {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::warn!(
                        rows = n,
                        "the audit store reached audit.max_size: its oldest rows were deleted"
                    ),
                    Ok(Err(e)) => tracing::warn!(error = %e, "audit size bound"),
                    Err(_) => {}
                }
            }
            if last_retention.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
                last_retention = Some(Instant::now());
                let audit = self.inner.audit.clone();
                let days = self.inner.cfg.audit.retention_days;
                if let Ok(Err(e)) =
                    tokio::task::spawn_blocking(move || audit.apply_retention(days)).await
                {
                    tracing::warn!(error = %e, "audit retention");
                }
            }
        }
    }

    async fn refill(self, pool: Arc<Pool>) {
        let labels = Metrics::tier(pool.tier);
        let mut failures = 0u32;
        loop {
            if self.inner.cancel.is_cancelled() {
                return;
            }
            let have = lock(&pool.ready).len();
            if have >= pool.size {
                tokio::select! {
                    _ = self.inner.cancel.cancelled() => return,
                    _ = pool.wake.notified() => {}
                }
                // A sandbox was just taken. Unless that emptied the pool, let the request
                // that took it run its exec before a refill competes with it for the CPU.
                if !lock(&pool.ready).is_empty() {
                    tokio::select! {
                        _ = self.inner.cancel.cancelled() => return,
                        _ = tokio::time::sleep(REFILL_DEBOUNCE) => {}
                    }
                }
                continue;
            }
            let Some(backend) = self.inner.backends.get(&pool.tier).cloned() else {
                return;
            };
            let spec = pool.spec.clone();
            let audit = self.inner.audit.clone();
            let tier = pool.tier;
            let t0 = Instant::now();
            let made = tokio::task::spawn_blocking(move || -> Result<Box<dyn Sandbox>, String> {
                let sb = backend.create(&spec).map_err(|e| e.to_string())?;
                if let Err(e) = audit.sandbox_started(sb.id().as_str(), None, tier, "pooled") {
                    let mut sb = sb;
                    let _ = sb.destroy();
                    return Err(e.to_string());
                }
                Ok(sb)
            })
            .await;
            match made {
                Ok(Ok(sb)) => {
                    failures = 0;
                    self.inner
                        .metrics
                        .start_seconds
                        .get_or_create(&labels)
                        .observe(t0.elapsed().as_secs_f64());
                    lock(&pool.ready).push_back(Held::new(sb));
                    self.pool_gauge(pool.tier);
                    if self.inner.cancel.is_cancelled() {
                        self.drain_pool(&pool).await;
                        return;
                    }
                }
                Ok(Err(e)) => {
                    failures += 1;
                    tracing::warn!(tier = %pool.tier, error = %e, "warm pool refill failed");
                    let wait = Duration::from_millis(200u64 << failures.min(6));
                    tokio::select! {
                        _ = self.inner.cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Err(_) => return,
            }
        }
    }

    async fn drain_pool(&self, pool: &Arc<Pool>) {
        let items: Vec<Held> = lock(&pool.ready).drain(..).collect();
        let audit = self.inner.audit.clone();
        let _ = blocking(move || {
            for mut sb in items.into_iter().filter_map(|mut h| h.take()) {
                let id = sb.id().to_string();
                let _ = sb.destroy();
                let _ = audit.sandbox_ended(&id, "destroyed", "shutdown (pool)");
            }
        })
        .await;
        self.pool_gauge(pool.tier);
    }

    /// Sets a tier's `pool_ready` gauge: the fresh sandboxes in all its pools.
    fn pool_gauge(&self, tier: Tier) {
        self.inner
            .metrics
            .pool_ready
            .get_or_create(&Metrics::tier(tier))
            .set(self.pool_ready(tier) as i64);
    }

    /// Graceful shutdown: refuses new work, destroys every sandbox and empties the pools.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.cancel.cancel();
        // The reaper and refills see the cancel and return (a refill's create in flight
        // finishes first, and its sandbox is drained with its pool below).
        self.inner.background.close();
        self.inner.background.wait().await;
        let all: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let mut tasks = Vec::new();
        for s in all {
            let svc = self.clone();
            tasks.push(tokio::spawn(async move {
                if s.begin_ending("shutdown") {
                    svc.destroy_session(s, "shutdown").await
                } else {
                    // Another destroy (the reaper's or a client's) is under way.
                    s.wait_ended().await;
                    Ok(())
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        self.inner.destroys.close();
        self.inner.destroys.wait().await;
        for pool in &self.inner.pools {
            self.drain_pool(pool).await;
        }
        let audit = self.inner.audit.clone();
        let _ = blocking(move || {
            audit.record(&NewEvent {
                kind: "shutdown",
                detail: json!({"graceful": true}),
                ..Default::default()
            })
        })
        .await;
    }
}

fn gone(id: &str) -> ApiError {
    ApiError::new(
        Code::SandboxGone,
        format!("sandbox {id} has been destroyed"),
        "create a new sandbox",
    )
}

/// An owned audit row, to move into a blocking task.
struct NewEventOwned {
    tenant: Option<String>,
    sandbox: Option<String>,
    kind: &'static str,
    decision: Option<&'static str>,
    tier: Option<Tier>,
    detail: serde_json::Value,
}

impl NewEventOwned {
    fn borrowed(&self) -> NewEvent<'_> {
        NewEvent {
            tenant: self.tenant.as_deref(),
            sandbox: self.sandbox.as_deref(),
            kind: self.kind,
            decision: self.decision,
            tier: self.tier,
            detail: self.detail.clone(),
        }
    }
}

/// SHA-256 of what an exec runs (source, argv or module), for the audit row.
fn command_digest(req: &ExecRequest) -> (String, &'static str) {
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
    svc: &Service,
    tenant: &str,
    events: &mut Vec<cordon_core::EgressEvent>,
) -> Vec<cordon_core::EgressEvent> {
    use cordon_core::{EgressDecision, EgressFold};
    if events.is_empty() {
        return Vec::new();
    }
    let mut fold = EgressFold::new(svc.inner.cfg.audit.max_egress_rows_per_exec);
    for ev in events.drain(..) {
        fold.push(ev);
    }
    *events = fold.take();
    let ordinary = events
        .iter()
        .filter(|e| !e.is_protected() && e.decision != EgressDecision::Truncated)
        .count();
    let mut budget = svc.inner.egress_rows.take(tenant, ordinary);
    let mut stored = Vec::with_capacity(events.len());
    let mut counted: Option<cordon_core::EgressEvent> = None;
    for ev in events.iter() {
        let over = ev.decision == EgressDecision::Truncated
            || (!ev.is_protected() && {
                let none_left = budget == 0;
                budget = budget.saturating_sub(1);
                none_left
            });
        if !over {
            stored.push(ev.clone());
            continue;
        }
        let t = counted.get_or_insert_with(|| {
            let mut t = cordon_core::EgressEvent::new(
                0,
                cordon_core::EgressKind::Connection,
                EgressDecision::Truncated,
            );
            t.sandbox.clone_from(&ev.sandbox);
            t.time_ms = ev.time_ms;
            t.count = 0;
            t.rule = Some("audit:truncated".into());
            t
        });
        t.count = t.count.saturating_add(ev.count);
    }
    if let Some(mut t) = counted {
        t.reason = Some(format!(
            "{} egress events were counted, not itemised: past {} rows for one exec or {} a minute for the tenant",
            t.count,
            svc.inner.cfg.audit.max_egress_rows_per_exec,
            svc.inner.cfg.audit.max_egress_rows_per_minute
        ));
        stored.push(t);
    }
    stored
}

/// Runs one exec in a locked sandbox and writes its audit rows; blocking.
fn exec_blocking(
    svc: &Service,
    s: &Session,
    req: &ExecRequest,
    chunks: Option<ChunkSender>,
) -> Result<ExecOutcome, ApiError> {
    let (digest, kind) = command_digest(req);
    let t0 = Instant::now();
    let mut result = {
        let mut cell = lock(&s.sandbox);
        match cell.as_mut() {
            None => Err(gone(&s.id)),
            Some(sb) => {
                let mut send = |stream: OutputStream, data: &[u8]| {
                    if let Some(tx) = &chunks {
                        let _ = tx.send(Chunk {
                            stream,
                            data: data.to_vec(),
                        });
                    }
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
    let audit = &svc.inner.audit;
    let lang = match &req.command {
        Command::Code { language, .. } => Some(language.as_str()),
        _ => None,
    };
    let detail = match &result {
        Ok(o) => json!({
            "command_sha256": digest,
            "command_kind": kind,
            "lang": lang,
            "limits": s.spec.limits,
            "timeout_ms": req.timeout_ms,
            "termination": o.termination,
            "exit_code": o.exit_code,
            "signal": o.signal,
            "usage": o.usage,
            "timings": o.timings,
            "stdout_bytes": o.stdout.len(),
            "stderr_bytes": o.stderr.len(),
            "stdout_truncated": o.stdout_truncated,
            "stderr_truncated": o.stderr_truncated,
            "weakened": o.weakened,
        }),
        Err(e) => json!({
            "command_sha256": digest,
            "command_kind": kind,
            "lang": lang,
            "limits": s.spec.limits,
            "error": e.to_json(),
        }),
    };
    // The exec's row, its egress decisions (folded: a flood is one row per distinct
    // decision with a count, ordinary rows capped per exec and per tenant a minute, the rest
    // counted in one `truncated` row; exfiltration and grant rows always go in) and a
    // grant_use row per request that carried a grant, in one transaction.
    let mut rows = vec![NewEvent {
        tenant: Some(&s.tenant.0),
        sandbox: Some(&s.id),
        kind: "exec",
        decision: Some(match &result {
            Ok(o) => o.termination.as_str(),
            Err(_) => "error",
        }),
        tier: Some(s.tier),
        detail,
    }];
    let egress = match &mut result {
        Ok(o) => fold_egress(svc, &s.tenant.0, &mut o.extra.egress),
        Err(_) => Vec::new(),
    };
    for ev in &egress {
        rows.push(NewEvent {
            tenant: Some(&s.tenant.0),
            sandbox: Some(&s.id),
            kind: "egress",
            decision: Some(ev.decision.as_str()),
            tier: Some(s.tier),
            detail: serde_json::to_value(ev).unwrap_or_default(),
        });
        if let (Some(grants), cordon_core::EgressDecision::Allow) = (&ev.grant, ev.decision) {
            for name in grants.split(',') {
                rows.push(NewEvent {
                    tenant: Some(&s.tenant.0),
                    sandbox: Some(&s.id),
                    kind: "grant_use",
                    decision: Some("allow"),
                    tier: Some(s.tier),
                    detail: json!({
                        "grant": name,
                        "host": ev.host,
                        "port": ev.port,
                        "method": ev.method,
                        "path": ev.path,
                        "status": ev.status,
                        "count": ev.count,
                    }),
                });
            }
        }
    }
    audit.record_all(&rows).map_err(audit_err)?;
    if let Ok(o) = &result {
        let m = &svc.inner.metrics;
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

/// A claimed exec, ready to run.
pub struct ExecJob {
    svc: Service,
    guard: BusyGuard,
    req: ExecRequest,
}

impl ExecJob {
    /// Runs the exec, streaming output chunks to `chunks` if given. The audit row is written
    /// before this returns.
    pub async fn run(self, chunks: Option<ChunkSender>) -> Result<ExecOutcome, ApiError> {
        let ExecJob { svc, guard, req } = self;
        let s = guard.0.clone();
        let r = blocking(move || exec_blocking(&svc, &s, &req, chunks)).await?;
        drop(guard);
        r
    }
}

/// A one-shot run with its sandbox, ready to run.
pub struct RunJob {
    svc: Service,
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
            svc,
            session,
            req,
            inputs,
            rows,
        } = self;
        let s = session.clone();
        let svc2 = svc.clone();
        let start_us = session.start_us;
        let r = blocking(move || -> Result<ExecOutcome, ApiError> {
            // One hop and one commit for the rows, then the files and the program: nothing
            // of the request's runs before its policy decision and create are on record.
            let events: Vec<NewEvent<'_>> = rows.iter().map(|r| r.borrowed()).collect();
            svc2.inner
                .audit
                .sandbox_started_with(&s.id, Some(&s.tenant.0), s.tier, &events)
                .map_err(audit_err)?;
            for (path, data, mode) in &inputs {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.put_file(path, data, *mode)?;
            }
            exec_blocking(&svc2, &s, &req, chunks)
        })
        .await;
        // The outcome does not wait for the teardown: the sandbox is out of every tenant's
        // reach already (it never was in the session map), its destroy row is written by
        // the task, and its place under the limits is freed when that finishes.
        let tracker = svc.inner.destroys.clone();
        tracker.spawn(async move {
            // Let the response go out first: tearing the sandbox down (its processes'
            // exits, namespace and cgroup teardown) would otherwise compete with writing it.
            tokio::time::sleep(ONE_SHOT_DESTROY_DELAY).await;
            if let Err(e) = svc.destroy_session(session, "one-shot").await {
                tracing::warn!(error = %e, "destroying a one-shot sandbox");
            }
        });
        let mut outcome = r??;
        outcome.timings.start_us = start_us;
        Ok(outcome)
    }
}

// ---- startup ---------------------------------------------------------------------------

/// The scratch root a tier's backend should use, under the data dir, so that a restart
/// after a crash can remove what a dead server left there.
pub fn scratch_dir(data_dir: &Path, tier: Tier) -> PathBuf {
    data_dir.join("scratch").join(tier.as_str())
}

fn open_and_recover(
    cfg: &Config,
    hook: Option<RecoveryHook>,
) -> Result<(File, Audit, RecoveryReport), ServerError> {
    let dir = &cfg.data_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("creating the data dir {}", dir.display()), e))?;
    let lock_path = dir.join("cordon.lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| ServerError::io(format!("opening {}", lock_path.display()), e))?;
    if lock_file.try_lock().is_err() {
        return Err(ServerError::Locked(dir.display().to_string()));
    }
    let _ = std::fs::write(&lock_path, format!("{}\n", std::process::id()));
    let audit = Audit::open(&dir.join("audit.db"))?;
    let mut report = RecoveryReport::default();
    let rows = audit.unfinished()?;
    report.sandboxes = rows.iter().map(|r| r.id.clone()).collect();
    // The hook runs even with no unfinished rows: a server killed while a sandbox was being
    // made (before its row was written) leaves host state no row names.
    if let Some(h) = &hook {
        report.removed = h(&rows);
    }
    let scratch = dir.join("scratch");
    if let Ok(tiers) = std::fs::read_dir(&scratch) {
        for t in tiers.flatten() {
            let Ok(entries) = std::fs::read_dir(t.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let removed = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if removed.is_ok() {
                    report.scratch.push(p.display().to_string());
                }
            }
        }
    }
    for tier in Tier::ALL {
        let _ = std::fs::create_dir_all(scratch_dir(dir, tier));
    }
    if !report.sandboxes.is_empty() || !report.scratch.is_empty() || !report.removed.is_empty() {
        for r in &rows {
            audit.sandbox_ended(
                &r.id,
                "recovered",
                "left by a server that stopped without cleanup; removed on restart",
            )?;
        }
        for r in &rows {
            audit.record(&NewEvent {
                tenant: r.tenant.as_deref(),
                sandbox: Some(&r.id),
                kind: "destroy",
                decision: Some("recovered"),
                tier: r.tier.parse().ok(),
                detail: json!({"reason": "crash-recovery", "state_was": r.state}),
            })?;
        }
        audit.record(&NewEvent {
            kind: "recovery",
            detail: serde_json::to_value(&report).unwrap_or_default(),
            ..Default::default()
        })?;
    }
    audit.record(&NewEvent {
        kind: "startup",
        detail: json!({"pid": std::process::id(), "recovered": report.sandboxes.len()}),
        ..Default::default()
    })?;
    Ok((lock_file, audit, report))
}

/// Checks a warm pool's spec as the gate checks a request's (the operator wrote it, so no
/// ceiling applies; a spec that could never be served is refused at start).
fn check_pool_spec(spec: &SandboxSpec, gate: &Gate) -> Result<(), String> {
    spec.validate().map_err(|e| e.to_string())?;
    gate.check_max_limits(&spec.limits)?;
    for entry in spec.egress.allow.iter().chain(&spec.egress.deny) {
        cordon_egress::Pattern::parse(entry).map_err(|e| e.to_string())?;
    }
    if matches!(spec.tier, Tier::Runtime | Tier::Wasm) && !spec.egress.is_closed() {
        return Err(format!(
            "the {} tier has no network, so allow_hosts cannot apply",
            spec.tier
        ));
    }
    Ok(())
}
