//! Warm pools: taking a fresh sandbox, refilling, draining.

use super::*;

/// A warm pool of fresh, never-used sandboxes of one spec: a tier's default, or one a
/// `[[pool]]` table gives.
pub(super) struct Pool {
    pub(super) tier: Tier,
    pub(super) size: usize,
    pub(super) spec: SandboxSpec,
    pub(super) ready: Mutex<VecDeque<Held>>,
    pub(super) wake: Notify,
}

impl Service {
    /// A fresh sandbox for `spec`: from the warm pool when the spec is the pool's, else cold.
    pub(super) async fn acquire(&self, spec: &SandboxSpec) -> Result<Acquired, ApiError> {
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

    pub(super) fn started(&self, tier: Tier, source: &str) {
        self.inner
            .metrics
            .starts
            .get_or_create(&StartLabels {
                tier: tier.as_str().into(),
                source: source.into(),
            })
            .inc();
    }

    pub(super) async fn refill(self, pool: Arc<Pool>) {
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

    pub(super) async fn drain_pool(&self, pool: &Arc<Pool>) {
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
    pub(super) fn pool_gauge(&self, tier: Tier) {
        self.inner
            .metrics
            .pool_ready
            .get_or_create(&Metrics::tier(tier))
            .set(self.pool_ready(tier) as i64);
    }
}
