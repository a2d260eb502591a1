//! The server's own routes: health, metrics, the dashboard and MCP over streamable HTTP.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use axum::extract::DefaultBodyLimit;

use super::extract::{MaybeAuth, PeerAddr, authenticate, unauthorized};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::get("/v1/health", "health", "server")
                .summary("Liveness for anyone ({\"status\": \"ok\"}); with a valid key also the version, the tiers' status and the key's tenant's live sandboxes; with an operator's key (edge.dashboard_operators) the pools' fill and every tenant's live sandboxes")
                .public()
                .ok::<Health>(200, "the server is up"),
            health,
        )
        .op(
            Op::get("/metrics", "metrics", "server")
                .summary("Prometheus metrics (OpenMetrics text): every tenant's figures, so an operator's key (edge.dashboard_operators) unless edge.metrics_need_key = false; 403 policy_denied for any other tenant's key")
                .answer(200, "the metrics", "application/openmetrics-text", None),
            metrics,
        )
        .op(
            Op::get("/v1/events", "events", "server")
                .summary("The dashboard's server-sent event stream: a `stats` event every second (live sandboxes with their tier and tenant, counts per tier and tenant, pool fill: the Snapshot schema) and an `audit` event for each audit row as it is written (the last 200 of the past 15 minutes first). The key's tenant's own; every tenant's for the tenants named in edge.dashboard_operators. It ends when the server stops. A tenant has at most audit.max_event_streams_per_tenant open (429 resource_busy past it).")
                .answer(200, "the stream", "text/event-stream", Some(crate::openapi::schema::<crate::dashboard::Snapshot>))
                .errors(&[Code::ResourceBusy]),
            crate::dashboard::events,
        )
        .op(
            Op::get("/dashboard", "dashboard", "server")
                .summary("The dashboard page (read-only; it holds no data: it reads the API with the key the user gives it)")
                .public()
                .answer(200, "the page", "text/html", None),
            crate::dashboard::page,
        )
        .op(
            Op::get("/dashboard/dashboard.js", "dashboardScript", "server")
                .summary("The dashboard's script")
                .public()
                .answer(200, "the script", "text/javascript", None),
            crate::dashboard::script,
        )
        .op(
            Op::get("/dashboard/dashboard.css", "dashboardStyle", "server")
                .summary("The dashboard's style")
                .public()
                .answer(200, "the style", "text/css", None),
            crate::dashboard::style,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

/// MCP over streamable HTTP, behind its own authentication (not an [`Api`] route: rmcp's
/// service is nested), and the operations that document it.
pub(super) fn mcp(svc: &Service) -> (Router<Service>, Vec<Op>) {
    use crate::error::Code as C;
    let (service, book) = crate::mcp::http_service(svc.clone());
    let mcp_router =
        Router::new()
            .nest_service("/mcp", service)
            .layer(middleware::from_fn_with_state(
                (svc.clone(), book),
                mcp_auth,
            ));
    let mcp_ops = vec![
        Op::post("/mcp", "mcp", "server")
            .summary("MCP over streamable HTTP (JSON-RPC 2.0; the tools of docs/service.md#mcp, each with a title, hints, an input and an output schema). The session (Mcp-Session-Id) belongs to the key's tenant; at most max_mcp_sessions each")
            .body("application/json", None)
            .answer(200, "a JSON-RPC answer, or an SSE stream of them", "application/json", None)
            .answer(200, "a JSON-RPC answer, or an SSE stream of them", "text/event-stream", None)
            .errors(&[C::NotFound, C::TooManySandboxes]),
        Op::delete("/mcp", "mcpEnd", "server")
            .summary("End an MCP session (Mcp-Session-Id); 204")
            .answer(204, "ended", "application/json", None)
            .errors(&[C::NotFound]),
    ];
    (mcp_router, mcp_ops)
}

/// Authenticates MCP requests and binds each MCP session to the tenant that opened it:
/// another key holder can neither use nor delete it (404, as for an unknown session), and
/// each tenant opens at most its ceiling's `max_mcp_sessions` at once.
async fn mcp_auth(
    State((svc, book)): State<(Service, Arc<crate::mcp::SessionBook>)>,
    mut req: Request,
    next: Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<PeerAddr>>()
        .map(|c| c.0.0.ip());
    let t = match authenticate(&svc, req.headers(), peer) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match &session {
        Some(id) => {
            if !book.owned_by(id, &t) {
                return ApiError::new(
                    Code::NotFound,
                    "no MCP session with that id",
                    "open a session with an initialize request; sessions of other tenants are not visible",
                )
                .into_response();
            }
        }
        None => {
            let cap = svc
                .gate()
                .rules_for(&cordon_engine::Principal::Tenant(t.0.clone()))
                .max_mcp_sessions;
            if book.count(&t).await >= cap {
                svc.metrics().deny("mcp_sessions");
                let mut e = ApiError::new(
                    Code::TooManySandboxes,
                    format!("you hold your limit of {cap} MCP sessions"),
                    "close sessions you no longer use (DELETE /mcp with their Mcp-Session-Id)",
                );
                e.retry_after = Some(1);
                return e.into_response();
            }
        }
    }
    let deleting = req.method() == axum::http::Method::DELETE;
    req.extensions_mut().insert(t.clone());
    let mut resp = next.run(req).await;
    // rmcp answers a session's DELETE with 202; MCP clients (the official Python SDK among
    // them) take 200 or 204 as the session ended and warn on anything else.
    if deleting && resp.status() == StatusCode::ACCEPTED {
        *resp.status_mut() = StatusCode::NO_CONTENT;
        *resp.body_mut() = Body::empty();
    }
    match (&session, resp.headers().get("mcp-session-id")) {
        (None, Some(new)) => {
            if let Ok(id) = new.to_str() {
                book.bind(id, &t);
            }
        }
        (Some(id), _) if deleting || resp.status() == StatusCode::NOT_FOUND => book.unbind(id),
        _ => {}
    }
    resp
}

/// `GET /v1/health`: the status to anyone; the rest only with a valid key.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Each tier's status on this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiers: Option<std::collections::BTreeMap<cordon_core::Tier, cordon_core::TierStatus>>,
    /// Each warm pool's size and the sandboxes ready in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pools: Option<std::collections::BTreeMap<cordon_core::Tier, PoolHealth>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_sandboxes: Option<usize>,
}

/// One warm pool.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct PoolHealth {
    pub size: usize,
    pub ready: usize,
}

/// Whether `t` is one of the operator's keys (`edge.dashboard_operators`): those see the
/// server-wide figures (every tenant's sandboxes, the pools, `/metrics`).
fn is_operator(svc: &Service, t: &crate::keys::Tenant) -> bool {
    svc.config().edge.dashboard_operators.contains(&t.0)
}

/// Health: `{"status": "ok"}` to anyone; the version and the tiers with a valid key; the
/// server-wide figures (pool fill, every tenant's live sandboxes) only to the operator's
/// keys, or to anyone when the operator sets `edge.metrics_need_key = false`. Any other
/// tenant's key sees its own live sandboxes.
async fn health(State(svc): State<Service>, MaybeAuth(t): MaybeAuth) -> Json<Health> {
    let mut h = Health {
        status: "ok".into(),
        version: None,
        tiers: None,
        pools: None,
        live_sandboxes: None,
    };
    let open = !svc.config().edge.metrics_need_key;
    if t.is_none() && !open {
        return Json(h);
    }
    h.version = Some(env!("CARGO_PKG_VERSION").into());
    h.tiers = Some(svc.probes().iter().map(|(t, p)| (*t, p.status)).collect());
    let whole = open || t.as_ref().is_some_and(|t| is_operator(&svc, t));
    if !whole {
        h.live_sandboxes = t.map(|t| svc.sessions().live_sandboxes(Some(&t)).len());
        return Json(h);
    }
    h.pools = Some(
        svc.config()
            .pools
            .iter()
            .map(|(t, size)| {
                (
                    *t,
                    PoolHealth {
                        size: *size,
                        ready: svc.pools().ready(*t),
                    },
                )
            })
            .collect(),
    );
    h.live_sandboxes = Some(svc.sessions().count());
    Json(h)
}

/// `/metrics`: every tenant's figures, so only the operator's keys read them (or anyone,
/// with `edge.metrics_need_key = false`).
async fn metrics(State(svc): State<Service>, MaybeAuth(t): MaybeAuth) -> Response {
    if svc.config().edge.metrics_need_key {
        let Some(t) = t else {
            return unauthorized("/metrics needs an API key").into_response();
        };
        if !is_operator(&svc, &t) {
            return ApiError::new(
                Code::PolicyDenied,
                "/metrics shows every tenant's figures; only the operator's keys read it",
                "use a key of a tenant named in edge.dashboard_operators (or set edge.metrics_need_key = false to publish the metrics)",
            )
            .into_response();
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        svc.metrics().encode(),
    )
        .into_response()
}
