//! Cordon's service: the HTTP API (axum), sandbox sessions with TTLs and idle timeouts,
//! per-tenant and global limits, warm pools, a reaper, crash recovery, the audit store
//! (SQLite), API keys, Prometheus metrics and MCP (rmcp).
//!
//! The service never depends on a tier crate: the caller injects one [`Backend`] per tier
//! (see [`Backends`]); after a crash each backend's `recover` cleans up what the dead server
//! left of its tier's sandboxes, and an optional [`RecoveryHook`] anything else.
//!
//! [`Backend`]: cordon_core::Backend

pub mod api;
pub mod audit;
pub mod config;
pub mod dashboard;
pub mod e2b;
mod error;
pub mod keys;
pub mod listen;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod openapi;
mod portproxy;
pub mod service;
pub mod tls;

use std::net::SocketAddr;

pub use config::Config;
pub use error::{ApiError, Code, ServerError};
pub use keys::{Keys, Tenant};
pub use service::{Backends, RecoveryHook, RecoveryReport, Service, scratch_dir};

/// A running HTTP server.
pub struct Server {
    svc: Service,
    addr: SocketAddr,
    tls: bool,
    task: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    e2b: Option<e2b::Listening>,
}

/// Makes a panic anywhere but in a request's handler end the process, as the release
/// build's `panic = "abort"` did before it unwound (ADR 0046): the reaper, a listener's
/// accept loop or a sampler that panicked would otherwise stop alone while the server went on
/// looking healthy. A handler's panic is answered 500 and ends only its request. For the
/// `cordon serve` process (tests' processes keep reporting their own panics).
pub fn abort_on_panics_outside_requests() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if !listen::in_request() {
            eprintln!(
                "cordon serve: a panic outside any request; the server stops (its state may be half-changed)"
            );
            std::process::abort();
        }
    }));
}

impl Server {
    /// Starts the service and listens on `config.bind` (port 0 picks a free port).
    pub async fn start(
        config: Config,
        backends: Backends,
        recovery: Option<RecoveryHook>,
    ) -> Result<Self, ServerError> {
        let keys = Keys::load(
            &config.keys,
            config.key_file.as_deref(),
            config.edge.min_key_len,
        )?;
        if keys.is_empty() {
            return Err(ServerError::Config(
                "no API keys configured; add [[keys]] or key_file (`cordon serve --new-key TENANT` prints one)"
                    .into(),
            ));
        }
        let bind = config.bind;
        let e2b_listen = config.e2b.as_ref().map(|e| e.listen);
        let tls = match &config.tls {
            Some(t) => Some(tls::server_config(&t.cert_file, &t.key_file)?),
            None => None,
        };
        // The operator's certificate for the E2B HTTPS listener is read before anything
        // starts, as [tls]'s is: a start that will fail says so first. (The data dir's own
        // CA is made or read once the service holds the data dir.)
        let e2b_tls = match &config.e2b {
            Some(e) => e2b::https::operator_config(e)?,
            None => None,
        };
        let svc = Service::start(config, keys, backends, recovery).await?;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| ServerError::io(format!("listening on {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ServerError::io("reading the bound address", e))?;
        let e2b = match e2b_listen {
            Some(at) => Some(e2b::serve(svc.clone(), at, e2b_tls).await?),
            None => None,
        };
        let app = api::router(svc.clone());
        let is_tls = tls.is_some();
        let tls = tls.map(|cfg| tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg)));
        let limits = listen::ConnLimits::of(&svc.config().edge);
        let task = listen::serve(
            listener,
            app,
            tls,
            listen::Registry::new(limits),
            svc.cancelled(),
        );
        Ok(Server {
            svc,
            addr,
            tls: is_tls,
            task,
            e2b,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the E2B-compatible listener is (when `[e2b]` turned it on).
    pub fn e2b_addr(&self) -> Option<SocketAddr> {
        self.e2b.as_ref().map(|l| l.addr)
    }

    /// Where the E2B listener's HTTPS for sandbox hosts is (`e2b.https_listen`).
    pub fn e2b_https_addr(&self) -> Option<SocketAddr> {
        self.e2b.as_ref().and_then(|l| l.https)
    }

    /// Whether the API is served over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    pub fn service(&self) -> &Service {
        &self.svc
    }

    /// Stops accepting requests, destroys every sandbox and empties the pools.
    pub async fn shutdown(self) {
        self.svc.shutdown().await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), self.task).await;
        if let Some(l) = self.e2b {
            for t in l.tasks {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), t).await;
            }
        }
    }
}
