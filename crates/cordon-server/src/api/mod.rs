//! The HTTP API (axum), one module per resource. Every route is added through
//! [`crate::openapi::Api`], which records its operation: `docs/openapi.json` is generated
//! from those (checked by a test). Each resource's module registers its own routes with
//! their body limit; this module only puts them together with the fallbacks.
//!
//! The modules depend on `extract` (the key, the ids, the rejections) and `stream` (how a
//! result goes back), never on this one.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;

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
pub mod sandboxes;
pub mod server;
pub mod snapshots;
mod stream;
pub mod tokens;
pub mod volumes;
pub mod watch;

pub(crate) use extract::parse_id;
pub use extract::{Auth, MaybeAuth, PeerAddr, authenticate};
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

/// A request with a body that is refused (4xx/5xx) may be answered before its body was
/// read: the server then drops the connection, and a client that kept it for its next
/// request would see that request fail. `Connection: close` tells it not to.
pub(crate) async fn close_after_refused_body(req: Request, next: Next) -> Response {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v != "0");
    let mut res = next.run(req).await;
    if has_body && (res.status().is_client_error() || res.status().is_server_error()) {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
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
