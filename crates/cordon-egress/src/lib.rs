//! Cordon's host-side egress proxy.
//!
//! One [`EgressProxy`] serves one sandbox. It is a deny-by-default HTTP forward proxy
//! (absolute-form requests) and CONNECT proxy that:
//! - allows only hosts on the sandbox's allow list (exact names, `*.suffix`, ports, explicit
//!   CIDRs), with deny entries winning, and answers everything else with a 403 naming the rule;
//! - resolves names itself and refuses loopback, private, link-local (cloud metadata), CGNAT,
//!   multicast, unspecified, IPv6 ULA/link-local/mapped addresses unless an allow entry names
//!   the range, then connects to exactly the address it checked;
//! - terminates TLS for granted hosts with a per-sandbox CA and swaps each grant's random
//!   placeholder for the real secret in the grant's header only, for matching host, method and
//!   path; a placeholder headed anywhere else is refused and audited as exfiltration;
//! - enforces per-sandbox byte, connection, request-rate, idle and total-time limits;
//! - records every decision as an [`AuditEvent`] (never a secret value).
//!
//! [`scan()`] is the output scanner for everything that leaves a sandbox towards the caller.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cordon_egress::Error> {
//! use cordon_egress::{EgressProxy, ProxyConfig};
//! let mut cfg = ProxyConfig::new("sbx-1");
//! cfg.policy.allow = vec!["api.example.com".parse().expect("a host pattern")];
//! cfg.unix_socket = Some("/run/cordon/sbx-1/egress.sock".into());
//! let proxy = EgressProxy::start(cfg, &tokio::runtime::Handle::current())?;
//! let env = proxy.sandbox_env();          // HTTP_PROXY=..., placeholders, CA paths
//! let ca_bundle = proxy.ca_bundle_pem();  // write at ProxyConfig::ca_bundle_path inside
//! # let _ = (env, ca_bundle);
//! let report = proxy.shutdown().await;    // placeholders are worthless from here on
//! # let _ = report;
//! # Ok(()) }
//! ```

mod audit;
mod body;
mod conn;
mod error;
pub mod guard;
mod limits;
pub mod policy;
mod proxy;
pub mod resolve;
pub mod scan;
mod secrets;
mod shared;
mod target;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cordon_core::{EgressPolicy, Grant};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, broadcast};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use audit::{AuditEvent, Decision, Kind, MAX_KEPT_EVENTS};
pub use error::{Error, Result};
pub use limits::EgressLimits;
pub use policy::{Host, Pattern, Policy, Refusal};
pub use resolve::{Resolver, StaticResolver, SystemResolver};
pub use scan::{Finding, FindingKind, KnownSecret, ScanOptions, ScanOutput, scan, scan_with};
pub use secrets::{MIN_SECRET_LEN, Secret, check_secret};
pub use tls::{UpstreamRoots, ca_params};

use crate::audit::AuditLog;
use crate::limits::RateLimiter;
use crate::secrets::Grants;
use crate::shared::Shared;

/// Port the in-sandbox forwarder listens on by default (`127.0.0.1:3128`).
pub const DEFAULT_SANDBOX_PROXY_PORT: u16 = 3128;
/// Where the CA certificate alone goes inside the sandbox by default.
pub const DEFAULT_CA_CERT_PATH: &str = "/etc/cordon/egress-ca.pem";
/// Where the CA plus the system bundle goes inside the sandbox by default.
pub const DEFAULT_CA_BUNDLE_PATH: &str = "/etc/cordon/ca-bundle.pem";

/// Everything one sandbox's proxy needs.
#[derive(Clone)]
pub struct ProxyConfig {
    /// The sandbox id, stamped on every audit event.
    pub sandbox_id: String,
    /// Allow and deny entries.
    pub policy: EgressPolicy,
    /// Scoped credentials. Their hosts are allowed on port 443 implicitly (deny still wins).
    pub grants: Vec<Grant>,
    /// Per-sandbox limits.
    pub limits: EgressLimits,
    /// Unix socket to listen on (bind-mounted into the sandbox). A stale socket file at
    /// this path is replaced.
    pub unix_socket: Option<PathBuf>,
    /// Loopback TCP address to listen on (port 0 picks one), for tests and benches.
    pub tcp_listen: Option<SocketAddr>,
    /// Port the in-sandbox forwarder listens on; goes into the proxy variables.
    pub sandbox_proxy_port: u16,
    /// Path of the CA certificate inside the sandbox (`NODE_EXTRA_CA_CERTS`).
    pub ca_cert_path: String,
    /// Path of the CA bundle inside the sandbox (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`,
    /// `CURL_CA_BUNDLE`, `GIT_SSL_CAINFO`).
    pub ca_bundle_path: String,
    /// Trust for upstream TLS.
    pub upstream_roots: UpstreamRoots,
    /// Append audit events to this JSON-lines file.
    pub audit_log: Option<PathBuf>,
    /// Name resolution; the system resolver when `None`.
    pub resolver: Option<Arc<dyn Resolver>>,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("sandbox_id", &self.sandbox_id)
            .field("policy", &self.policy)
            .field(
                "grants",
                &self.grants.iter().map(|g| &g.name).collect::<Vec<_>>(),
            )
            .field("limits", &self.limits)
            .field("unix_socket", &self.unix_socket)
            .field("tcp_listen", &self.tcp_listen)
            .finish_non_exhaustive()
    }
}

impl ProxyConfig {
    /// A closed configuration (nothing allowed, no listener yet) with default limits.
    pub fn new(sandbox_id: impl Into<String>) -> Self {
        ProxyConfig {
            sandbox_id: sandbox_id.into(),
            policy: EgressPolicy::default(),
            grants: Vec::new(),
            limits: EgressLimits::default(),
            unix_socket: None,
            tcp_listen: None,
            sandbox_proxy_port: DEFAULT_SANDBOX_PROXY_PORT,
            ca_cert_path: DEFAULT_CA_CERT_PATH.into(),
            ca_bundle_path: DEFAULT_CA_BUNDLE_PATH.into(),
            upstream_roots: UpstreamRoots::default(),
            audit_log: None,
            resolver: None,
        }
    }

    /// A configuration carrying a sandbox spec's egress policy and grants (listener still to
    /// be set).
    pub fn for_spec(sandbox_id: impl Into<String>, spec: &cordon_core::SandboxSpec) -> Self {
        let mut cfg = ProxyConfig::new(sandbox_id);
        cfg.policy = spec.egress.clone();
        cfg.grants = spec.grants.clone();
        cfg
    }

    /// Checks the whole configuration without starting anything (secrets are not loaded).
    pub fn validate(&self) -> Result<()> {
        self.limits.validate()?;
        if self.unix_socket.is_none() && self.tcp_listen.is_none() {
            return Err(Error::NoListener);
        }
        if let Some(a) = self.tcp_listen
            && !a.ip().is_loopback()
        {
            return Err(Error::NotLoopback(a));
        }
        Ok(())
    }
}

/// Counters of one proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressStats {
    /// Bytes received from the sandbox.
    pub bytes_up: u64,
    /// Bytes sent to the sandbox.
    pub bytes_down: u64,
    /// Client connections accepted (refused ones included).
    pub connections: u64,
    /// Requests seen (refused ones included).
    pub requests: u64,
}

/// What a proxy leaves behind when it shuts down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressReport {
    /// The latest audit events kept in memory, oldest first.
    pub events: Vec<AuditEvent>,
    /// Older events that left that view because more than [`MAX_KEPT_EVENTS`] were recorded.
    pub dropped_events: u64,
    /// Final counters.
    pub stats: EgressStats,
}

/// The entry point: starts one sandbox's proxy.
pub struct EgressProxy;

impl EgressProxy {
    /// Starts the proxy on `runtime` (its listeners and connections run as tasks there).
    /// Loads the grants' secrets, makes the per-sandbox CA and binds the listeners.
    pub fn start(config: ProxyConfig, runtime: &tokio::runtime::Handle) -> Result<ProxyHandle> {
        start_on(config, runtime, None)
    }

    /// Starts the proxy on a small runtime of its own (two worker threads), for callers
    /// that are not async. Shut it down with [`ProxyHandle::shutdown_blocking`].
    pub fn start_owned(config: ProxyConfig) -> Result<ProxyHandle> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cordon-egress")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let handle = rt.handle().clone();
        start_on(config, &handle, Some(rt))
    }
}

fn start_on(
    config: ProxyConfig,
    runtime: &tokio::runtime::Handle,
    owned: Option<tokio::runtime::Runtime>,
) -> Result<ProxyHandle> {
    config.validate()?;
    let mut policy = Policy::new(&config.policy.allow, &config.policy.deny);
    let grants = Grants::compile(&config.grants, &config.sandbox_id)?;
    let mut terminated = Vec::new();
    for g in &grants.list {
        for p in &g.hosts {
            policy.add_implicit(p.clone(), format!("grant:{}", g.name));
            terminated.push(p.clone());
        }
    }
    let ca = tls::SandboxCa::new(&config.sandbox_id, &terminated)?;
    // The proxy originates TLS only to the hosts whose TLS it terminates (the grants'); a
    // proxy that only tunnels never needs trust roots, so it never loads them.
    // Extra roots given are checked either way, so a bad one is an error at the start.
    let upstream_tls = if terminated.is_empty() && config.upstream_roots.extra_pem.is_empty() {
        None
    } else {
        Some(TlsConnector::from(tls::client_config(
            &config.upstream_roots,
        )?))
    };
    let audit = AuditLog::new(&config.sandbox_id, config.audit_log.as_deref())?;
    let placeholders: Vec<(String, String)> = grants
        .list
        .iter()
        .map(|g| (g.env_var.clone(), g.placeholder.clone()))
        .collect();
    let shared = Arc::new(Shared {
        policy,
        grants,
        conn_sem: Arc::new(Semaphore::new(config.limits.max_connections as usize)),
        rate: RateLimiter::new(
            config.limits.requests_per_second,
            config.limits.request_burst,
        ),
        limits: config.limits.clone(),
        resolver: config
            .resolver
            .clone()
            .unwrap_or_else(|| Arc::new(SystemResolver)),
        ca,
        upstream_tls,
        audit,
        bytes_up: AtomicU64::new(0),
        bytes_down: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        cancel: CancellationToken::new(),
        tracker: TaskTracker::new(),
        epoch: Instant::now(),
    });

    let _enter = runtime.enter();
    let mut unix_path = None;
    if let Some(path) = &config.unix_socket {
        let listener = bind_unix(path)?;
        shared
            .tracker
            .spawn(proxy::accept_unix(shared.clone(), listener));
        unix_path = Some(path.clone());
    }
    let mut tcp_addr = None;
    if let Some(addr) = config.tcp_listen {
        let std_l = std::net::TcpListener::bind(addr).map_err(|source| Error::Listen {
            what: addr.to_string(),
            source,
        })?;
        let listen_err = |source| Error::Listen {
            what: addr.to_string(),
            source,
        };
        std_l.set_nonblocking(true).map_err(listen_err)?;
        tcp_addr = Some(std_l.local_addr().map_err(listen_err)?);
        let listener = tokio::net::TcpListener::from_std(std_l).map_err(listen_err)?;
        shared
            .tracker
            .spawn(proxy::accept_tcp(shared.clone(), listener));
    }
    Ok(ProxyHandle {
        shared,
        runtime: runtime.clone(),
        owned,
        unix_path,
        tcp_addr,
        placeholders,
        sandbox_proxy_port: config.sandbox_proxy_port,
        ca_cert_path: config.ca_cert_path,
        ca_bundle_path: config.ca_bundle_path,
    })
}

fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;
    let err = |source| Error::Listen {
        what: path.display().to_string(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        std::fs::remove_file(path).map_err(err)?;
    }
    let std_l = std::os::unix::net::UnixListener::bind(path).map_err(err)?;
    std_l.set_nonblocking(true).map_err(err)?;
    tokio::net::UnixListener::from_std(std_l).map_err(err)
}

/// A running proxy. Dropping it stops the proxy (prefer [`ProxyHandle::shutdown`] to get
/// the report).
pub struct ProxyHandle {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    owned: Option<tokio::runtime::Runtime>,
    unix_path: Option<PathBuf>,
    tcp_addr: Option<SocketAddr>,
    placeholders: Vec<(String, String)>,
    sandbox_proxy_port: u16,
    ca_cert_path: String,
    ca_bundle_path: String,
}

impl std::fmt::Debug for ProxyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHandle")
            .field("unix_socket", &self.unix_path)
            .field("tcp_addr", &self.tcp_addr)
            .finish_non_exhaustive()
    }
}

impl ProxyHandle {
    /// The environment the sandbox must get: proxy variables pointing at
    /// `http://127.0.0.1:<sandbox_proxy_port>`, an empty `NO_PROXY`, the CA paths, and each
    /// grant's variable set to its placeholder.
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        self.env_for_proxy_url(&format!("http://127.0.0.1:{}", self.sandbox_proxy_port))
    }

    /// [`Self::sandbox_env`] with another proxy URL (tests use the loopback TCP listener).
    pub fn env_for_proxy_url(&self, url: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            env.push((k.into(), url.into()));
        }
        env.push(("NO_PROXY".into(), String::new()));
        env.push(("no_proxy".into(), String::new()));
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            env.push((k.into(), self.ca_bundle_path.clone()));
        }
        env.push(("NODE_EXTRA_CA_CERTS".into(), self.ca_cert_path.clone()));
        for (var, ph) in &self.placeholders {
            env.push((var.clone(), ph.clone()));
        }
        env
    }

    /// The per-sandbox CA certificate (PEM). Goes into the sandbox; its key never does.
    pub fn ca_cert_pem(&self) -> &str {
        self.shared.ca.cert_pem()
    }

    /// The CA certificate followed by the host's system bundle, for `ca_bundle_path`.
    pub fn ca_bundle_pem(&self) -> String {
        let mut out = self.ca_cert_pem().to_string();
        for p in [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/cert.pem",
        ] {
            if let Ok(s) = std::fs::read_to_string(p) {
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str(&s);
                break;
            }
        }
        out
    }

    /// The unix socket the proxy listens on.
    pub fn unix_socket(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// The loopback TCP address the proxy listens on.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Each grant's `(env var, placeholder)`.
    pub fn placeholders(&self) -> &[(String, String)] {
        &self.placeholders
    }

    /// The real secrets of this sandbox's grants, named by grant, for [`scan()`]ning what the
    /// sandbox outputs.
    pub fn known_secrets(&self) -> Vec<KnownSecret> {
        self.shared
            .grants
            .list
            .iter()
            .flat_map(|g| {
                g.secret
                    .forms()
                    .into_iter()
                    .map(|f| KnownSecret::new(g.name.clone(), f.to_vec()))
            })
            .collect()
    }

    /// Scans output leaving the sandbox: grant secrets redacted, credential formats flagged.
    pub fn scan_output(&self, bytes: &[u8]) -> ScanOutput {
        scan(bytes, &self.known_secrets())
    }

    /// A copy of the latest audit events, itemised (at most [`MAX_KEPT_EVENTS`]).
    pub fn events(&self) -> Vec<AuditEvent> {
        self.shared.audit.events().0
    }

    /// The audit events since the last call, folded and bounded (what a tier reports with
    /// each outcome): repeated decisions are one row with a count, a flood past the row cap
    /// is one `truncated` row, and exfiltration and grant events are never dropped.
    pub fn take_events(&self) -> Vec<AuditEvent> {
        self.shared.audit.take()
    }

    /// Live audit events from now on (a lagging receiver loses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<AuditEvent> {
        self.shared.audit.subscribe()
    }

    /// Counters so far.
    pub fn stats(&self) -> EgressStats {
        let s = &self.shared;
        EgressStats {
            bytes_up: s.bytes_up.load(Ordering::Relaxed),
            bytes_down: s.bytes_down.load(Ordering::Relaxed),
            connections: s.connections.load(Ordering::Relaxed),
            requests: s.requests.load(Ordering::Relaxed),
        }
    }

    fn begin_shutdown(&self) {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }

    fn report(&self) -> EgressReport {
        let (events, dropped_events) = self.shared.audit.events();
        EgressReport {
            events,
            dropped_events,
            stats: self.stats(),
        }
    }

    /// Stops accepting, ends every connection, waits (up to 5 s) for them to close and
    /// returns the report. The placeholders are worthless afterwards.
    pub async fn shutdown(self) -> EgressReport {
        self.begin_shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.shared.tracker.wait()).await;
        self.report()
    }

    /// [`Self::shutdown`] for callers outside any async runtime.
    pub fn shutdown_blocking(mut self) -> EgressReport {
        self.begin_shutdown();
        let tracker = self.shared.tracker.clone();
        let wait = async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
        };
        match self.owned.take() {
            Some(rt) => {
                rt.block_on(wait);
                let report = self.report();
                rt.shutdown_timeout(Duration::from_secs(1));
                report
            }
            None => {
                self.runtime.block_on(wait);
                self.report()
            }
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.begin_shutdown();
        if let Some(rt) = self.owned.take() {
            rt.shutdown_background();
        }
    }
}
