//! The supply of sandboxes: the tiers' backends and the warm pools. A fresh sandbox comes
//! from a pool when its spec is the pool's, else cold from its tier; pools refill in the
//! background and are drained at shutdown. Below the sessions: it knows no tenant.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_core::{Backend, Probe, Sandbox, SandboxSpec, Tier};
use cordon_engine::{Denial, DenyCode, Gate, Ledger, Principal, Reservation};
use cordon_policy::TierChoice;
use tokio::sync::Notify;

use super::common::{Life, blocking, lock};
use crate::ServerError;
use crate::audit::Audit;
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::metrics::{Metrics, StartLabels};
use crate::model::CreateRequest;

/// A snapshot a new sandbox starts from: its id (for the audit), image and directory.
#[derive(Debug, Clone)]
pub(super) struct FromSnapshot {
    pub(super) id: String,
    pub(super) image: cordon_core::SnapshotImage,
    pub(super) dir: cordon_core::SnapshotDir,
}

/// The backends the service may use, one per tier, injected by the caller.
pub type Backends = BTreeMap<Tier, Arc<dyn Backend>>;

/// Why a refill made no sandbox (logged; the pool backs off and tries again).
#[derive(Debug, thiserror::Error)]
enum RefillError {
    #[error("the tier could not make a sandbox: {0}")]
    Create(#[source] cordon_core::Error),
    #[error("the pooled sandbox's row could not be written: {0}")]
    Audit(#[source] crate::audit::StoreError),
}

/// How long a warm pool waits after a take before refilling, while it still holds others.
const REFILL_DEBOUNCE: Duration = Duration::from_millis(25);

/// A sandbox that is destroyed off the async runtime if it is ever dropped still alive
/// (a cancelled request, an early return): a backend's destroy blocks, and some backends
/// own resources that must not be dropped on a runtime thread.
pub struct Held(pub(super) Option<Box<dyn Sandbox>>);

impl Held {
    pub(super) fn new(sb: Box<dyn Sandbox>) -> Self {
        Held(Some(sb))
    }

    pub(super) fn as_mut(&mut self) -> Option<&mut Box<dyn Sandbox>> {
        self.0.as_mut()
    }

    pub(super) fn take(&mut self) -> Option<Box<dyn Sandbox>> {
        self.0.take()
    }

    pub(super) fn id(&self) -> String {
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

/// A fresh sandbox and where it came from, for the create audit row.
pub(super) struct Acquired {
    pub(super) sandbox: Held,
    pub(super) source: &'static str,
    pub(super) start_us: u64,
}

/// A warm pool of fresh, never-used sandboxes of one spec: a tier's default, or one a
/// `[[pool]]` table gives.
pub(super) struct Pool {
    pub(super) tier: Tier,
    pub(super) size: usize,
    pub(super) spec: SandboxSpec,
    pub(super) ready: Mutex<VecDeque<Held>>,
    pub(super) wake: Notify,
}

/// The tiers' backends and the warm pools.
#[derive(Clone)]
pub struct Pools {
    backends: Arc<Backends>,
    probes: Arc<BTreeMap<Tier, Probe>>,
    pools: Arc<Vec<Arc<Pool>>>,
    /// Memory the warm pools hold, counted against the server's budget for their life.
    _budget: Arc<Vec<Reservation>>,
    audit: Arc<Audit>,
    metrics: Arc<Metrics>,
    life: Life,
}

impl Pools {
    /// The pools the configuration asks for, their memory reserved against the server's
    /// budget. Each pool's spec is the gate's admission of the request a create makes for
    /// one of its sandboxes (its tier, limits, lists and template), so a pooled sandbox is
    /// exactly what that create would have made cold; a pool the gate would refuse every
    /// tenant stops the start with the gate's reason.
    pub(super) fn configure(
        cfg: &Config,
        backends: Backends,
        probes: BTreeMap<Tier, Probe>,
        gate: &Gate,
        ledger: &Ledger,
        (audit, metrics, life): (Arc<Audit>, Arc<Metrics>, Life),
    ) -> Result<Self, ServerError> {
        // The default spec of each pooled tier, then the `[[pool]]` specs.
        let defaults = cfg.pools.iter().map(|(tier, size)| {
            (
                CreateRequest {
                    tier: Some(TierChoice::Tier(*tier)),
                    ..Default::default()
                },
                *size,
            )
        });
        // A template is resolved once, at start: the pool's spec holds the template's lease
        // for as long as the server runs.
        let others = cfg.spec_pools.iter().map(|p| (p.spec.clone(), p.size));
        let mut pools: Vec<Arc<Pool>> = Vec::new();
        for (req, size) in defaults.chain(others) {
            let Some(TierChoice::Tier(tier)) = req.tier else {
                continue;
            };
            if size == 0 {
                continue;
            }
            if !backends.contains_key(&tier) {
                return Err(ServerError::Config(format!(
                    "a warm pool of the {tier} tier is configured but this build has no {tier} tier"
                )));
            }
            let spec = match admit_pool(cfg, gate, &req) {
                Ok(spec) => spec,
                Err(d) if d.code == DenyCode::TierUnavailable => {
                    tracing::warn!(%tier, reason = %d.message, "tier unavailable here: its warm pool stays empty");
                    continue;
                }
                Err(d) => {
                    return Err(ServerError::Config(format!(
                        "a warm pool of the {tier} tier: the gate refuses it for every tenant ({}): {}; {}",
                        d.rule, d.message, d.fix
                    )));
                }
            };
            if pools.iter().any(|p| p.spec == spec) {
                return Err(ServerError::Config(format!(
                    "two warm pools of the {tier} tier hold the same spec; merge them into one"
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
        let mut budget = Vec::new();
        for p in &pools {
            let bytes = p.spec.limits.memory_bytes.saturating_mul(p.size as u64);
            budget.push(
                ledger
                    .reserve_pool(bytes)
                    .map_err(|e| ServerError::Config(format!("the {} pool: {e}", p.tier)))?,
            );
        }
        Ok(Pools {
            backends: Arc::new(backends),
            probes: Arc::new(probes),
            pools: Arc::new(pools),
            _budget: Arc::new(budget),
            audit,
            metrics,
            life,
        })
    }

    /// The backend of a tier, if this server has it.
    pub(super) fn backend(&self, tier: Tier) -> Option<Arc<dyn Backend>> {
        self.backends.get(&tier).cloned()
    }

    /// The backend of a tier a sandbox is to start on: a tier this server lacks is refused.
    pub(super) fn serving(&self, tier: Tier) -> Result<Arc<dyn Backend>, ApiError> {
        self.backend(tier).ok_or_else(|| {
            ApiError::new(
                Code::TierUnavailable,
                format!("no {tier} tier"),
                "choose another tier",
            )
        })
    }

    /// Each tier's probe, taken at start.
    pub fn probes(&self) -> &BTreeMap<Tier, Probe> {
        &self.probes
    }

    fn tier_available(&self, tier: Tier) -> bool {
        self.probes.get(&tier).is_some_and(|p| p.available())
    }

    /// Number of fresh sandboxes waiting in a tier's pools.
    pub fn ready(&self, tier: Tier) -> usize {
        self.pools
            .iter()
            .filter(|p| p.tier == tier)
            .map(|p| lock(&p.ready).len())
            .sum()
    }

    /// Starts filling every pool of a tier that runs here (on the background tracker).
    pub(super) fn start(&self) {
        for pool in self.pools.iter() {
            if self.tier_available(pool.tier) {
                self.life
                    .background
                    .spawn(self.clone().refill(pool.clone()));
            } else {
                tracing::warn!(tier = %pool.tier, "tier unavailable here: its warm pool stays empty");
            }
        }
    }

    /// Destroys what every pool holds (shutdown).
    pub(super) async fn drain(&self) {
        for pool in self.pools.iter() {
            self.drain_pool(pool).await;
        }
    }

    /// A fresh sandbox for `spec`: from the warm pool when the spec is the pool's, else cold.
    pub(super) async fn acquire(&self, spec: &SandboxSpec) -> Result<Acquired, ApiError> {
        let tier = spec.tier;
        let labels = Metrics::tier(tier);
        if self.pools.iter().any(|p| p.tier == tier) {
            // Pools hold sandboxes of no owner yet: the spec matches whoever asks.
            let mut unowned = spec.clone();
            unowned.owner = None;
            if let Some(pool) = self.pools.iter().find(|p| p.spec == unowned) {
                let taken = lock(&pool.ready).pop_front();
                self.pool_gauge(tier);
                pool.wake.notify_one();
                if let Some(mut sandbox) = taken {
                    if let (Some(owner), Some(sb)) = (&spec.owner, sandbox.as_mut()) {
                        sb.set_owner(owner);
                    }
                    self.metrics.pool_hits.get_or_create(&labels).inc();
                    self.started(tier, "pool");
                    return Ok(Acquired {
                        sandbox,
                        source: "pool",
                        start_us: 0,
                    });
                }
            }
            self.metrics.pool_misses.get_or_create(&labels).inc();
        }
        let backend = self.serving(tier)?;
        let spec2 = spec.clone();
        let t0 = Instant::now();
        let sandbox = blocking(move || backend.create(&spec2)).await??;
        self.metrics
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

    /// A sandbox for `spec` started from a snapshot's image (`from`), else a fresh one
    /// ([`Self::acquire`]).
    pub(super) async fn acquire_from(
        &self,
        spec: &SandboxSpec,
        from: Option<&FromSnapshot>,
    ) -> Result<Acquired, ApiError> {
        let Some(from) = from else {
            return self.acquire(spec).await;
        };
        let tier = spec.tier;
        let backend = self.serving(tier)?;
        let (spec2, image, dir) = (spec.clone(), from.image.clone(), from.dir.clone());
        let sandbox = blocking(move || backend.start_from_snapshot(&image, &dir, &spec2)).await??;
        self.started(tier, "snapshot");
        let start_us = sandbox.start_us();
        Ok(Acquired {
            sandbox: Held::new(sandbox),
            source: "snapshot",
            start_us,
        })
    }

    fn started(&self, tier: Tier, source: &str) {
        self.metrics
            .starts
            .get_or_create(&StartLabels {
                tier: tier.as_str().into(),
                source: source.into(),
            })
            .inc();
    }

    async fn refill(self, pool: Arc<Pool>) {
        let labels = Metrics::tier(pool.tier);
        let mut failures = 0u32;
        loop {
            if self.life.cancel.is_cancelled() {
                return;
            }
            let have = lock(&pool.ready).len();
            if have >= pool.size {
                tokio::select! {
                    _ = self.life.cancel.cancelled() => return,
                    _ = pool.wake.notified() => {}
                }
                // A sandbox was just taken. Unless that emptied the pool, let the request
                // that took it run its exec before a refill competes with it for the CPU.
                if !lock(&pool.ready).is_empty() {
                    tokio::select! {
                        _ = self.life.cancel.cancelled() => return,
                        _ = tokio::time::sleep(REFILL_DEBOUNCE) => {}
                    }
                }
                continue;
            }
            let Some(backend) = self.backends.get(&pool.tier).cloned() else {
                return;
            };
            let spec = pool.spec.clone();
            let audit = self.audit.clone();
            let tier = pool.tier;
            let t0 = Instant::now();
            let made =
                tokio::task::spawn_blocking(move || -> Result<Box<dyn Sandbox>, RefillError> {
                    let sb = backend.create(&spec).map_err(RefillError::Create)?;
                    if let Err(e) = audit.sandbox_started(sb.id().as_str(), None, tier, "pooled") {
                        let mut sb = sb;
                        let _ = sb.destroy();
                        return Err(RefillError::Audit(e));
                    }
                    Ok(sb)
                })
                .await;
            match made {
                Ok(Ok(sb)) => {
                    failures = 0;
                    self.metrics
                        .start_seconds
                        .get_or_create(&labels)
                        .observe(t0.elapsed().as_secs_f64());
                    lock(&pool.ready).push_back(Held::new(sb));
                    self.pool_gauge(pool.tier);
                    if self.life.cancel.is_cancelled() {
                        self.drain_pool(&pool).await;
                        return;
                    }
                }
                Ok(Err(e)) => {
                    failures += 1;
                    tracing::warn!(tier = %pool.tier, error = %e, "warm pool refill failed");
                    let wait = Duration::from_millis(200u64 << failures.min(6));
                    tokio::select! {
                        _ = self.life.cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Err(_) => return,
            }
        }
    }

    async fn drain_pool(&self, pool: &Arc<Pool>) {
        let items: Vec<Held> = lock(&pool.ready).drain(..).collect();
        let audit = self.audit.clone();
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
        self.metrics
            .pool_ready
            .get_or_create(&Metrics::tier(tier))
            .set(self.ready(tier) as i64);
    }
}

/// The spec of a pool: the gate's admission of `req` for a tenant the operator's ceiling
/// does not name (its defaults) or, failing that, for the first named tenant it admits, as
/// that tenant's create would be admitted; the sandboxes are nobody's until taken. The
/// refusal, when every tenant is refused, is the defaults'.
fn admit_pool(cfg: &Config, gate: &Gate, req: &CreateRequest) -> Result<SandboxSpec, Denial> {
    let admit = |name: &str| gate.admit(&Principal::Tenant(name.to_string()), req, "pool");
    // No tenant is named "": this one has the ceiling's defaults.
    let refused = match admit("") {
        Ok(adm) => return Ok(unowned(adm.spec)),
        Err(d) => d,
    };
    cfg.tenants
        .keys()
        .find_map(|name| admit(name).ok())
        .map(|adm| unowned(adm.spec))
        .ok_or(refused)
}

/// A pool's sandboxes are nobody's until a create takes one (and sets its owner).
fn unowned(mut spec: SandboxSpec) -> SandboxSpec {
    spec.owner = None;
    spec
}
