//! The Linux host side every native tier (container, gvisor, microvm) shares, so no tier
//! crate depends on another: cgroups (v1 and v2), the egress link (a per-sandbox proxy on a
//! unix socket, the output scan and the audit events it reports) and the pool of per-sandbox
//! host id ranges, and the host's end of the agent channel for tiers whose agent speaks
//! the framed protocol ([`agent`]). (The forwarder that relays a sandbox's `127.0.0.1:<port>` to the proxy's
//! socket runs inside the sandbox: `cordon_guest::forwarder`.)

pub mod agent;
pub mod cgroup;
pub mod egress;
pub mod files;
pub mod idpool;
pub mod ports;
pub mod procs;
mod sys;
pub mod tied;
pub mod volume;

/// What the unit tests share.
#[cfg(test)]
mod testing {
    pub(crate) use cordon_testkit::root_or_skip;
}

pub use tied::spawn_tied;

/// Errors of the host side, converted into [`cordon_core::Error`] at the API boundary.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cgroup: {0}")]
    Cgroup(String),
}

impl From<HostError> for cordon_core::Error {
    fn from(e: HostError) -> Self {
        cordon_core::Error::Invalid(e.to_string())
    }
}
