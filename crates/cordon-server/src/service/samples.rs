//! A live sandbox's CPU, memory and disk over time (E2B's `get_metrics`, the native
//! `GET /v1/sandboxes/{id}/metrics`): one sampler task reads every live sandbox's
//! [`cordon_core::Gauge`] (the tier's own figures: the cgroup its processes, sentry or VM
//! run in, its workspace's file system) every [`SAMPLE_EVERY`], on one blocking call for
//! all of them, without their locks (a gauge is taken anew only when the sandbox's lock is
//! free at that moment). Each sandbox keeps its last [`KEEP`] samples in its session, so
//! their memory is bounded and goes with the sandbox. A plain exec costs nothing more: no
//! call into a sandbox is made for a sample.

use std::collections::VecDeque;
use std::sync::{Arc, TryLockError};
use std::time::Duration;

use cordon_core::Gauge;

use super::common::{blocking, lock};
use super::sessions::{Session, Sessions};
use crate::error::ApiError;
use crate::keys::Tenant;
use crate::model::{MetricSample, MetricsList, MetricsQuery};

/// How often each sandbox is sampled (as E2B's orchestrator does).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per sandbox: its last hour.
pub const KEEP: usize = 720;

/// A session's samples and the gauge they come from.
#[derive(Default)]
struct Samples {
    gauge: Option<Arc<dyn Gauge>>,
    /// The last reading's time (ms) and CPU time (µs), for the next one's share.
    last: Option<(i64, u64)>,
    ring: VecDeque<MetricSample>,
}

/// Samples every live sandbox on its schedule, until the server stops.
pub(super) struct Sampler {
    pub(super) sessions: Sessions,
}

impl Sampler {
    pub(super) async fn run(self) {
        let life = self.sessions.life.clone();
        loop {
            tokio::select! {
                _ = life.cancel.cancelled() => return,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
            let all = self.sessions.all();
            if all.is_empty() {
                continue;
            }
            let _ = tokio::task::spawn_blocking(move || {
                let now = crate::audit::now_ms();
                for s in &all {
                    sample(s, now);
                }
            })
            .await;
        }
    }
}

/// The gauge of `s`'s sandbox when its lock is free now (a busy sandbox keeps the last).
fn fresh_gauge(s: &Session) -> Option<Option<Arc<dyn Gauge>>> {
    match s.sandbox.try_lock() {
        Ok(cell) => Some(cell.0.as_ref().and_then(|sb| sb.gauge())),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner().0.as_ref().and_then(|sb| sb.gauge())),
        Err(TryLockError::WouldBlock) => None,
    }
}

fn sample(s: &Session, now_ms: i64) {
    if s.ending.get().is_some() {
        return;
    }
    let fresh = fresh_gauge(s);
    let state = s.state::<Samples>();
    let mut st = lock(&state);
    if let Some(g) = fresh {
        st.gauge = g;
    }
    let Some(r) = st.gauge.as_ref().and_then(|g| g.read()) else {
        return;
    };
    let limits = &s.spec.limits;
    let cpus = limits.cpus.max(0.01);
    let pct = match st.last {
        Some((at, cpu)) if now_ms > at => {
            let spent = r.cpu_us.saturating_sub(cpu) as f64;
            let wall = (now_ms - at) as f64 * 1000.0 * cpus;
            (spent / wall * 100.0).clamp(0.0, 100.0)
        }
        _ => 0.0,
    };
    st.last = Some((now_ms, r.cpu_us));
    if st.ring.len() >= KEEP {
        st.ring.pop_front();
    }
    st.ring.push_back(MetricSample {
        at_ms: now_ms,
        cpu_count: cpus.ceil() as u32,
        cpu_used_pct: (pct * 100.0).round() / 100.0,
        mem_used: r.memory_bytes,
        mem_total: limits.memory_bytes,
        mem_cache: r.cache_bytes,
        disk_used: r.disk_used_bytes.unwrap_or(0),
        disk_total: limits.disk_bytes,
    });
}

impl Sessions {
    /// Sandbox `id`'s samples taken from `q.start_ms` to `q.end_ms` (each bound optional),
    /// oldest first.
    pub async fn metrics(
        &self,
        tenant: &Tenant,
        id: &str,
        q: MetricsQuery,
    ) -> Result<MetricsList, ApiError> {
        let MetricsQuery { start_ms, end_ms } = q;
        if let (Some(s), Some(e)) = (start_ms, end_ms)
            && s > e
        {
            return Err(ApiError::invalid(
                "start_ms is after end_ms; give start_ms <= end_ms",
            ));
        }
        let s = self.session(tenant, id)?;
        let samples = blocking(move || {
            let state = s.state::<Samples>();
            let st = lock(&state);
            st.ring
                .iter()
                .filter(|m| start_ms.is_none_or(|t| m.at_ms >= t))
                .filter(|m| end_ms.is_none_or(|t| m.at_ms <= t))
                .copied()
                .collect()
        })
        .await?;
        Ok(MetricsList {
            interval_ms: SAMPLE_EVERY.as_millis() as u64,
            kept: KEEP,
            samples,
        })
    }
}
