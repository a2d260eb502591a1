//! `GET /sandboxes/{sandboxID}/metrics` (the SDKs' `get_metrics`): the sandbox's samples
//! ([`crate::model::MetricSample`], taken every 5 s from the tier's own figures) between
//! `start` and `end` (Unix seconds, as the SDKs send them; by default from the sandbox's
//! start to now), oldest first, as E2B's `SandboxMetric`.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{E2b, api_error, e2b_error, rfc3339};

#[derive(Debug, Deserialize)]
pub(super) struct Range {
    start: Option<i64>,
    end: Option<i64>,
}

/// E2B's `SandboxMetric`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

pub(super) async fn metrics(
    State(e): State<E2b>,
    super::control::About { t, id, .. }: super::control::About,
    Query(range): Query<Range>,
) -> Response {
    if let (Some(s), Some(end)) = (range.start, range.end)
        && s > end
    {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            "start is after end; give start <= end (Unix seconds)",
        );
    }
    let ms = |s: i64| s.saturating_mul(1000);
    // `end` names a whole second: every sample taken within it is in.
    let end = range.end.map(|s| ms(s).saturating_add(999));
    match e
        .svc
        .sessions()
        .metrics(
            &t,
            &id,
            crate::model::MetricsQuery {
                start_ms: range.start.map(ms),
                end_ms: end,
            },
        )
        .await
    {
        Ok(list) => Json(
            list.samples
                .into_iter()
                .map(|m| SandboxMetric {
                    timestamp: rfc3339(m.at_ms),
                    timestamp_unix: m.at_ms / 1000,
                    cpu_count: m.cpu_count,
                    cpu_used_pct: m.cpu_used_pct,
                    mem_used: m.mem_used,
                    mem_total: m.mem_total,
                    mem_cache: m.mem_cache,
                    disk_used: m.disk_used,
                    disk_total: m.disk_total,
                })
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(err) => api_error(err),
    }
}
