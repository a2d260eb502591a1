//! The E2B-compatible listener (`[e2b]` in the config): E2B's own SDKs (`e2b`,
//! `e2b-code-interpreter`, Python and JavaScript) speak to it unchanged with
//! `E2B_API_URL` and `E2B_SANDBOX_URL` set to its address.
//!
//! A thin adapter: every E2B call becomes the same [`Service`] call a native route makes,
//! so the operator's ceiling, the tier policy, the limits and the audit apply exactly as
//! to a native call. The E2B API key is one of its tenant's keys; the E2B template name is
//! mapped to a Cordon template by the operator; the tier is the operator's (`e2b.tier`) or
//! the policy's, never the client's. Routes are told apart by path (the control plane's,
//! envd's and the code interpreter's never overlap); envd and code-interpreter calls name
//! their sandbox by the `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers and prove it with
//! the sandbox's access token (`X-Access-Token`).
//!
//! E2B's user `user` (home `/home/user`) and `root` are both the sandbox's one
//! unprivileged user: E2B's home is Cordon's workspace `/work`, which file paths are
//! mapped onto. What Cordon cannot honour is refused in E2B's error shape, saying what
//! Cordon does instead (docs/e2b.md).

// Handlers answer their refusals as ready responses; they are the cold path of a call.
#![allow(clippy::result_large_err)]

mod builds;
mod common;
mod connect;
mod control;
mod entry;
mod envd;
mod filesystem;
mod gzip;
pub mod https;
mod interp;
mod listing;
mod metrics;
mod ports;
mod registry;
mod snapshots;
mod watch;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};

use crate::ServerError;
use crate::service::Service;

pub use connect::ConnectError;
// Everything the routes share lives in `common` (below the routes, which use it through
// these names); this module holds the declarations, the listener and the router.
pub use common::*;

/// Binds the E2B listener and serves it until the service stops.
/// The E2B listener's sockets and their tasks.
pub struct Listening {
    pub addr: SocketAddr,
    /// The HTTPS listener for sandbox hosts (`e2b.https_listen`).
    pub https: Option<SocketAddr>,
    pub tasks: Vec<tokio::task::JoinHandle<Result<(), std::io::Error>>>,
}

/// Serves the E2B listener on `at`, and its HTTPS one where the config asks, with
/// `operator_tls` (the operator's certificate, read before the service started) or the data
/// dir's CA.
pub async fn serve(
    svc: Service,
    at: SocketAddr,
    operator_tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<Listening, ServerError> {
    let cfg = svc
        .config()
        .e2b
        .clone()
        .ok_or_else(|| ServerError::Config("[e2b] is not configured".into()))?;
    let cfg_builds = cfg.builds;
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .map_err(|e| ServerError::io(format!("listening on {at} (e2b.listen)"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::io("reading the E2B listener's address", e))?;
    // Both listeners serve the same routes from the same state (one record per sandbox).
    let state = E2b {
        svc: svc.clone(),
        cfg: Arc::new(cfg),
        boxes: Arc::default(),
        builds: Arc::new(registry::Builds::new(cfg_builds, &svc.config().data_dir)),
    };
    let https = match state.cfg.https_listen {
        Some(at) => {
            let tls = match operator_tls {
                Some(tls) => tls,
                None => {
                    let boxes = state.boxes.clone();
                    let known: https::Known =
                        Arc::new(move |id: &str| lock(&boxes).contains_key(id));
                    https::ca_config(&state.cfg, &svc.config().data_dir, known)?
                }
            };
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| ServerError::io(format!("listening on {at} (e2b.https_listen)"), e))?;
            Some((l, tokio_rustls::TlsAcceptor::from(tls)))
        }
        None => None,
    };
    let limits = crate::listen::ConnLimits::of(&svc.config().edge);
    let mut tasks = vec![crate::listen::serve(
        listener,
        router(state.clone()),
        None,
        crate::listen::Registry::new(limits),
        svc.cancelled(),
    )];
    let mut https_addr = None;
    if let Some((l, tls)) = https {
        https_addr = Some(
            l.local_addr()
                .map_err(|e| ServerError::io("reading the E2B HTTPS listener's address", e))?,
        );
        tasks.push(crate::listen::serve(
            l,
            router(state),
            Some(tls),
            crate::listen::Registry::new(limits),
            svc.cancelled(),
        ));
    }
    Ok(Listening {
        addr,
        https: https_addr,
        tasks,
    })
}

fn router(state: E2b) -> Router {
    let limits = state.svc.config().http.clone();
    let files = Router::new()
        .route(
            "/files",
            get(filesystem::get_file).post(filesystem::post_files),
        )
        .layer(DefaultBodyLimit::max(limits.max_file_bytes));
    Router::new()
        // The control plane (X-API-KEY).
        .route("/sandboxes", post(control::create).get(listing::list))
        .route("/v2/sandboxes", post(control::create).get(listing::list))
        .route(
            "/sandboxes/{id}",
            get(control::detail).delete(control::kill),
        )
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::connect))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/metrics", get(metrics::metrics))
        .route(
            "/sandboxes/{id}/snapshots",
            post(snapshots::create_snapshot),
        )
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/sandboxes/{id}/{*rest}", axum::routing::any(refused))
        .route("/templates", axum::routing::any(refused))
        .route(
            "/templates/{*rest}",
            axum::routing::any(snapshots::templates),
        )
        .route("/v2/templates", axum::routing::any(refused))
        .route(
            "/v2/templates/{*rest}",
            axum::routing::any(builds::v2_templates),
        )
        .route("/v3/templates", post(builds::request))
        .route("/volumes", axum::routing::any(refused))
        .route("/volumes/{*rest}", axum::routing::any(refused))
        .route("/secrets", axum::routing::any(refused))
        .route("/secrets/{*rest}", axum::routing::any(refused))
        .route("/snapshots", get(snapshots::list_snapshots))
        .route("/snapshots/{*rest}", axum::routing::any(refused))
        // envd (port 49983).
        .route("/health", get(envd::health))
        .route("/process.Process/{method}", post(envd::process))
        .route(
            "/filesystem.Filesystem/{method}",
            post(filesystem::filesystem),
        )
        // The code interpreter (port 49999).
        .route("/execute", post(interp::execute))
        .route("/contexts", post(interp::create).get(interp::list))
        .route("/contexts/{id}", axum::routing::delete(interp::delete))
        .route("/contexts/{id}/restart", post(interp::restart))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .merge(files)
        .fallback(no_route)
        // A sandbox's own servers (`get_host(port)`), before any route reads the headers.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ports::route,
        ))
        // A refused request's body may be left unread, and the connection then dropped:
        // say so (`Connection: close`), as the native API does, so an SDK's pool does not
        // send its next call on it.
        .layer(axum::middleware::from_fn(
            crate::api::close_after_refused_body,
        ))
        .with_state(state)
}

async fn no_route() -> Response {
    e2b_error(
        StatusCode::NOT_FOUND,
        "no such route on Cordon's E2B listener; docs/e2b.md lists what it serves",
    )
}
