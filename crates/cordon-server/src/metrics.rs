//! Prometheus metrics (prometheus-client): starts per tier, start latency, live sandboxes,
//! pool sizes, pool hits and misses, denials, terminations by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabels {
    pub tier: String,
    /// `pool` or `cold`.
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabels {
    pub tier: String,
    pub reason: String,
}

fn start_histogram() -> Histogram {
    // 100 µs .. ~6.5 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    pub starts: Family<StartLabels, Counter>,
    pub start_seconds: Family<TierLabels, Histogram, fn() -> Histogram>,
    pub exec_seconds: Family<TierLabels, Histogram, fn() -> Histogram>,
    pub live: Family<TierLabels, Gauge>,
    pub pool_ready: Family<TierLabels, Gauge>,
    pub pool_hits: Family<TierLabels, Counter>,
    pub pool_misses: Family<TierLabels, Counter>,
    pub denials: Family<ReasonLabels, Counter>,
    pub terminations: Family<TerminationLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cordon");
        let starts = Family::<StartLabels, Counter>::default();
        let start_seconds =
            Family::<TierLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                start_histogram as fn() -> Histogram,
            );
        let exec_seconds = Family::<TierLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            start_histogram as fn() -> Histogram,
        );
        let live = Family::<TierLabels, Gauge>::default();
        let pool_ready = Family::<TierLabels, Gauge>::default();
        let pool_hits = Family::<TierLabels, Counter>::default();
        let pool_misses = Family::<TierLabels, Counter>::default();
        let denials = Family::<ReasonLabels, Counter>::default();
        let terminations = Family::<TerminationLabels, Counter>::default();
        registry.register(
            "sandbox_starts",
            "Sandboxes handed out, by tier and source (pool or cold)",
            starts.clone(),
        );
        registry.register(
            "sandbox_start_seconds",
            "Time to create a sandbox (cold starts and pool refills)",
            start_seconds.clone(),
        );
        registry.register(
            "exec_seconds",
            "Time from exec request to outcome",
            exec_seconds.clone(),
        );
        registry.register("live_sandboxes", "Sandboxes held by tenants", live.clone());
        registry.register(
            "pool_ready",
            "Fresh, never-used sandboxes waiting in the warm pool",
            pool_ready.clone(),
        );
        registry.register(
            "pool_hits",
            "Creates served from the warm pool",
            pool_hits.clone(),
        );
        registry.register(
            "pool_misses",
            "Creates that had to start a sandbox cold",
            pool_misses.clone(),
        );
        registry.register(
            "denials",
            "Requests refused (policy, limits, auth), by reason",
            denials.clone(),
        );
        registry.register(
            "exec_terminations",
            "Execs ended, by tier and termination reason",
            terminations.clone(),
        );
        Metrics {
            registry,
            starts,
            start_seconds,
            exec_seconds,
            live,
            pool_ready,
            pool_hits,
            pool_misses,
            denials,
            terminations,
        }
    }

    pub fn tier(t: cordon_core::Tier) -> TierLabels {
        TierLabels {
            tier: t.as_str().to_string(),
        }
    }

    pub fn deny(&self, reason: &str) {
        self.denials
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
