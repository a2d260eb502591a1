//! The audit route: a tenant's own rows.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use cordon_core::SandboxId;

use axum::extract::DefaultBodyLimit;

use super::extract::{Auth, query_rejection};
use crate::audit::Query as AuditQuery;
use crate::config::HttpLimits;
use crate::error::ApiError;
use crate::model as m;
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::get("/v1/audit", "audit", "audit")
                .summary("My audit rows, oldest first (policy, create, exec, file_put, file_get, egress, grant_use, destroy, ...); at most audit.max_reads_per_tenant queries of a tenant under way at once (429 resource_busy past it)")
                .query::<AuditQuery>()
                .ok::<m::AuditEvents>(200, "the rows")
                .errors(&[crate::error::Code::ResourceBusy]),
            audit,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

async fn audit(
    State(svc): State<Service>,
    Auth(t): Auth,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<crate::model::AuditEvents>, ApiError> {
    let Query(q) = q.map_err(query_rejection)?;
    if let Some(s) = &q.sandbox
        && SandboxId::parse(s).is_none()
    {
        return Err(ApiError::invalid(
            "sandbox must be an id like sb-<32 hex digits>",
        ));
    }
    let events = svc.audit_query(&t, q).await?;
    Ok(Json(crate::model::AuditEvents { events }))
}
