//! What the connections of one sandbox's proxy share: its policy, grants, limits, audit log
//! and counters. Below both the proxy and its connections, which each hold it.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::AuditLog;
use crate::limits::{EgressLimits, RateLimiter};
use crate::policy::{Host, Policy};
use crate::resolve::Resolver;
use crate::secrets::Grants;
use crate::tls::SandboxCa;

/// Everything the connections of one sandbox share.
pub(crate) struct Shared {
    pub policy: Policy,
    pub grants: Grants,
    pub limits: EgressLimits,
    pub resolver: Arc<dyn Resolver>,
    pub ca: SandboxCa,
    /// TLS to upstreams; only a proxy that terminates some host's TLS has it.
    pub upstream_tls: Option<TlsConnector>,
    pub audit: AuditLog,
    pub conn_sem: Arc<Semaphore>,
    pub rate: RateLimiter,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub requests: AtomicU64,
    pub connections: AtomicU64,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub epoch: Instant,
}

impl Shared {
    pub(crate) fn terminates(&self, host: &Host) -> bool {
        self.grants.covers(host)
    }

    /// The upstream TLS client, which every proxy that terminates a host's TLS has.
    pub(crate) fn upstream_tls(&self) -> Result<&TlsConnector, String> {
        self.upstream_tls
            .as_ref()
            .ok_or_else(|| "the proxy has no upstream TLS configuration (a bug)".to_string())
    }
}
