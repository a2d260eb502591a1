//! `GET /v1/sandboxes/{id}/metrics`: one of my sandbox's CPU, memory and disk figures over
//! time, sampled every 5 s from its tier's own accounting (the service's sampler; its last
//! hour is kept).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};

use super::extract::{Auth, parse_id, query_rejection};
use crate::error::ApiError;
use crate::openapi::{Api, Op, SANDBOX};
use crate::service::{METRIC_SAMPLES_KEPT, MetricSample, SAMPLE_EVERY, Service};

/// Which samples: those taken from `start_ms` to `end_ms` (milliseconds since the Unix
/// epoch; each optional).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
}

/// A sandbox's samples, oldest first.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct MetricsList {
    /// How often a sample is taken, in milliseconds.
    pub interval_ms: u64,
    /// How many samples a sandbox keeps (its newest).
    pub kept: usize,
    pub samples: Vec<MetricSample>,
}

pub(super) fn routes() -> Api {
    Api::default().op(
        Op::get("/v1/sandboxes/{id}/metrics", "sandboxMetrics", "sandboxes")
            .summary("My sandbox's CPU (count, used %), memory (used, total, page cache) and disk (used, total) over time, sampled every 5 s from the tier's own figures; the last hour is kept")
            .query::<MetricsQuery>()
            .ok::<MetricsList>(200, "the samples in the range, oldest first")
            .errors(SANDBOX),
        metrics,
    )
}

async fn metrics(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<MetricsQuery>, QueryRejection>,
) -> Result<Json<MetricsList>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    if let (Some(s), Some(e)) = (q.start_ms, q.end_ms)
        && s > e
    {
        return Err(ApiError::invalid(
            "start_ms is after end_ms; give start_ms <= end_ms",
        ));
    }
    let samples = svc
        .sessions()
        .metrics(&t, &id, q.start_ms, q.end_ms)
        .await?;
    Ok(Json(MetricsList {
        interval_ms: SAMPLE_EVERY.as_millis() as u64,
        kept: METRIC_SAMPLES_KEPT,
        samples,
    }))
}
