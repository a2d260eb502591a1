//! `GET /v1/sandboxes/{id}/metrics`: one of my sandbox's CPU, memory and disk figures over
//! time, sampled every 5 s from its tier's own accounting (the service's sampler; its last
//! hour is kept).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};

use super::extract::{Auth, parse_id, query_rejection};
use crate::error::ApiError;
use crate::model::{MetricsList, MetricsQuery};
use crate::openapi::{Api, Op, SANDBOX};
use crate::service::Service;

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
    Ok(Json(svc.sessions().metrics(&t, &id, q).await?))
}
