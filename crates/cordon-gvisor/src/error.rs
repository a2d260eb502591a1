//! The tier's own errors.

/// Errors of the gvisor tier, turned into [`cordon_core::Error`] at the API boundary.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error("workspace: {0}")]
    Workspace(String),
    #[error("runsc: {0}")]
    Runsc(String),
    /// A host call of the tier failed. `what` names it and never a host path (a tenant may
    /// read it); the path goes to the operator's log.
    #[error("{what}: {source}")]
    Host {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}
