//! The supply of sandboxes: the tiers' backends and the warm pools. A fresh sandbox comes
//! from a pool when its spec is the pool's, else cold from its tier; pools refill in the
//! background and are drained at shutdown. Below the sessions: it knows no tenant.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_core::{Backend, Probe, Sandbox, SandboxSpec, Tier};
use cordon_engine::{Gate, Ledger, Reservation};
use tokio::sync::Notify;

use super::common::{Life, blocking, lock};
use crate::ServerError;
use crate::audit::Audit;
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::metrics::{Metrics, StartLabels};

/// The backends the service may use, one per tier, injected by the caller.
pub type Backends = BTreeMap<Tier, Arc<dyn Backend>>;

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
    /// The pools the configuration asks for, each spec checked as the gate checks a
    /// request's, their memory reserved against the server's budget.
    pub(super) fn configure(
        cfg: &Config,
        backends: Backends,
        probes: BTreeMap<Tier, Probe>,
        gate: &Gate,
        ledger: &Ledger,
        templates: &cordon_template::Store,
        (audit, metrics, life): (Arc<Audit>, Arc<Metrics>, Life),
    ) -> Result<Self, ServerError> {
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
            if let Err(e) = check_pool_spec(&spec, gate) {
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
        let backend = self.backends.get(&tier).cloned().ok_or_else(|| {
            ApiError::new(
                Code::TierUnavailable,
                format!("no {tier} tier"),
                "choose another tier",
            )
        })?;
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

/// Checks a warm pool's spec as the gate checks a request's (the operator wrote it, so no
/// ceiling applies; a spec that could never be served is refused at start).
fn check_pool_spec(spec: &SandboxSpec, gate: &Gate) -> Result<(), String> {
    spec.validate().map_err(|e| e.to_string())?;
    gate.check_max_limits(&spec.limits)?;
    for entry in spec.egress.allow.iter().chain(&spec.egress.deny) {
        cordon_egress::Pattern::parse(entry).map_err(|e| e.to_string())?;
    }
    if !spec.tier.features().network && !spec.egress.is_closed() {
        return Err(format!(
            "the {} tier has no network, so allow_hosts cannot apply",
            spec.tier
        ));
    }
    Ok(())
}
