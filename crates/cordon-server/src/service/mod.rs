//! The transport-independent core: sessions, limits, warm pools, the reaper, crash
//! recovery and audit. The HTTP API and the MCP server are thin layers over [`Service`].
//!
//! Backend calls block (syscalls, child processes), so every one runs in `spawn_blocking`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Command, ExecOutcome, ExecRequest, OutputSink, OutputStream, Probe, Sandbox,
    SandboxSpec, Tier, validate_sandbox_path,
};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cordon_engine::{
    Admission, BudgetLimits, Catalogue, Gate, GateSettings, Issuer, Ledger, Principal, Reservation,
    RulesSource,
};

use crate::ServerError;
use crate::audit::{
    Audit, AuditEvent, BackgroundEnd, Command as AuditCommand, ContextRun, ContextStop, Created,
    Destroyed, Event, ExecEnd, ExecRecord, ExecResult, GrantUse, Lifecycle, LiveRow, Mounted,
    NewEvent, Query, RowBudget, TeardownResult, Transfer, VolumeOutcome, now_ms,
};
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
/// How long a new sandbox waits for places under the limits that are being given back
/// (teardowns under way) before it is refused, and how often it looks.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);
const TEARDOWN_POLL: Duration = Duration::from_millis(5);

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

fn audit_err(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!(
        "the audit row could not be written ({e}); nothing was reported without it"
    ))
}

mod admit;
mod contexts;
mod exec;
mod files;
mod pools;
mod procs;
mod reaper;
mod recovery;
mod sessions;
mod volumes;

pub use contexts::{CellError, CellStatus};
use exec::NewEventOwned;
pub use exec::{ExecJob, RunJob};
use pools::Pool;
pub use recovery::scratch_dir;
use recovery::{check_pool_spec, open_and_recover};
pub use sessions::Held;
use sessions::{BusyGuard, Session};

struct Inner {
    cfg: Config,
    /// Pauses to disk under way: session id -> (tenant, bytes its state may take), counted
    /// against the tenant's `max_paused_bytes` until the save ends.
    paused_pending: Mutex<HashMap<String, (String, u64)>>,
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
    /// Tenants' volumes on the host.
    volumes: cordon_host::volume::VolumeStore,
    /// Memory the warm pools hold, counted against the server's budget for their life.
    _pool_budget: Vec<Reservation>,
    /// Mints grant tokens and publishes their keys.
    issuer: Arc<Issuer>,
    throttle: crate::keys::Throttle,
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

pub use crate::audit::RecoveryReport;

impl Service {
    /// Opens the data dir (taking its lock), recovers from a crash, starts the reaper and
    /// warm pools. Must be called inside a tokio runtime.
    pub async fn start(
        cfg: Config,
        keys: Keys,
        backends: Backends,
        recovery: Option<RecoveryHook>,
    ) -> Result<Self, ServerError> {
        let (lock_file, audit, report, kept) = tokio::task::spawn_blocking({
            let cfg = cfg.clone();
            let backends = backends.clone();
            move || open_and_recover(&cfg, &backends, recovery)
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
        let templates = cordon_template::Store::open(&cfg.data_dir).map_err(|e| {
            ServerError::Config(format!("the template store under the data dir: {e}"))
        })?;
        let gate = gate.with_templates(templates.clone());
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
        let mut others = Vec::new();
        for p in &cfg.spec_pools {
            let mut spec = SandboxSpec::new(p.tier);
            spec.limits = p.limits.apply(&cfg.default_limits);
            spec.egress = cordon_core::EgressPolicy {
                allow: p.allow_hosts.clone(),
                deny: p.deny_hosts.clone(),
            };
            // A pool's template is resolved once, at start; the pool's spec holds its lease
            // for as long as the server runs.
            spec.template = p.template.clone();
            templates.resolve_spec(&mut spec).map_err(|e| {
                ServerError::Config(format!("a warm pool of the {} tier: {e}", p.tier))
            })?;
            others.push((spec, p.size));
        }
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
        let volume_store = volumes::open_store(&cfg.data_dir)?;
        let svc = Service {
            inner: Arc::new(Inner {
                cfg,
                paused_pending: Mutex::default(),
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
                volumes: volume_store,
                _pool_budget: pool_budget,
                issuer,
                throttle: crate::keys::Throttle::default(),
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
        svc.revive_paused(kept).await;
        svc.inner.background.spawn(svc.clone().reaper());
        Ok(svc)
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Failed-key back-off per source address.
    pub fn throttle(&self) -> &crate::keys::Throttle {
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

    // ---- audit -----------------------------------------------------------------------

    /// Audit rows of `tenant`.
    pub async fn audit_query(&self, tenant: &Tenant, q: Query) -> Result<Vec<Event>, ApiError> {
        let audit = self.inner.audit.clone();
        let t = tenant.0.clone();
        blocking(move || audit.query(Some(&t), &q))
            .await?
            .map_err(audit_err)
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
            // Paused to disk: kept for the next start, its files and record left in place.
            if lock(&s.on_disk).is_some() && !s.busy.load(Ordering::Acquire) {
                let sb = lock(&s.sandbox).take();
                blocking(move || drop(sb)).await.ok();
                lock(&self.inner.sessions).remove(&s.id);
                continue;
            }
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
            audit.record(&NewEvent::server(AuditEvent::Shutdown { graceful: true }))
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
