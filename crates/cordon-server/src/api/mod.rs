//! The HTTP API (axum), one module per resource. Every route is added through
//! [`crate::openapi::Api`], which records its operation: `docs/openapi.json` is generated
//! from those (checked by a test). Each resource's module registers its own routes with
//! their body limit; this module only puts them together with the fallbacks.
//!
//! The modules depend on `extract` (the key, the ids, the rejections) and `stream` (how a
//! result goes back), never on this one.

use axum::Router;
use axum::middleware;

use crate::error::{ApiError, Code};
use crate::openapi::{Api, Op};
use crate::service::Service;

pub mod audit;
pub mod contexts;
pub mod execs;
mod extract;
pub mod files;
pub mod metrics;
pub mod ports;
pub mod processes;
mod refused;
pub mod sandboxes;
pub mod server;
pub mod snapshots;
mod stream;
pub mod tokens;
pub mod volumes;
pub mod watch;

pub(crate) use extract::parse_id;
pub use extract::{Auth, MaybeAuth, PeerAddr, authenticate};
pub(crate) use refused::close_after_refused_body;
pub(crate) use stream::OFF_WORKERS;

/// Builds the router (API + metrics + MCP over streamable HTTP).
pub fn router(svc: Service) -> Router {
    documented(svc).0
}

/// The router and the operations of its routes (what `docs/openapi.json` documents).
pub fn documented(svc: Service) -> (Router, Vec<Op>) {
    let limits = svc.config().http.clone();
    let api = Api::default()
        .merge(server::routes(&limits))
        .merge(tokens::routes(&limits))
        .merge(sandboxes::routes(&limits))
        .merge(execs::routes(&limits))
        .merge(processes::routes(&limits))
        .merge(files::routes(&limits))
        .merge(contexts::routes(&limits))
        .merge(volumes::routes(&limits))
        .merge(snapshots::routes(&limits))
        .merge(audit::routes(&limits))
        .merge(ports::routes())
        .merge(metrics::routes())
        .merge(watch::routes());
    let (mcp_router, mcp_ops) = server::mcp(&svc);
    let Api { router, mut ops } = api;
    ops.extend(mcp_ops);
    let router = router
        .merge(mcp_router)
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(middleware::from_fn(close_after_refused_body))
        .with_state(svc);
    (router, ops)
}

async fn no_route() -> ApiError {
    ApiError::new(
        Code::NoSuchRoute,
        "no such route",
        "see docs/openapi.json for the routes this server has",
    )
}

async fn no_method() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not take that method",
        "see docs/openapi.json for the methods of each route",
    )
}
