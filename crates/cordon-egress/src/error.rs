//! Errors of the egress proxy. Each message says what went wrong and what to do about it.

use std::path::PathBuf;

/// Everything that can stop the proxy from starting or a configuration from loading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An allow or deny entry, or a grant host, could not be parsed.
    #[error(transparent)]
    Pattern(#[from] cordon_core::PatternError),
    /// A grant is malformed (bad header name, method, path prefix, empty host list, ...).
    #[error("grant {grant:?} is not valid: {reason}")]
    Grant {
        /// The grant's name.
        grant: String,
        /// Why it was refused, with the fix.
        reason: String,
    },
    /// A grant's secret could not be loaded from the host.
    #[error("grant {grant:?}: cannot load its secret: {reason}")]
    Secret {
        /// The grant's name.
        grant: String,
        /// Why (never the secret value).
        reason: String,
    },
    /// A limit is unusable (zero where a positive value is needed).
    #[error("egress limit {what} is not valid: {reason}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Why, with the fix.
        reason: String,
    },
    /// The per-sandbox certificate authority or a leaf certificate could not be made.
    #[error(
        "cannot create the per-sandbox TLS certificate authority: {0}; this is a bug, report it"
    )]
    Ca(String),
    /// The upstream TLS trust roots could not be loaded.
    #[error("cannot load upstream TLS roots: {0}")]
    Roots(String),
    /// A listening socket could not be opened.
    #[error("cannot listen on {what}: {source}; check the path or address is free and writable")]
    Listen {
        /// The socket path or address.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TCP listen address is not on loopback.
    #[error(
        "refusing to listen on {0}: the egress proxy's TCP listener must be on a loopback address (127.0.0.0/8 or ::1)"
    )]
    NotLoopback(std::net::SocketAddr),
    /// Neither a unix socket nor a TCP address was given.
    #[error(
        "the egress proxy has nothing to listen on; give a unix socket path or a loopback TCP address"
    )]
    NoListener,
    /// The audit log file could not be opened.
    #[error(
        "cannot open the egress audit log {path}: {source}; check the directory exists and is writable"
    )]
    AuditLog {
        /// The log file path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The proxy's own runtime could not be built.
    #[error("cannot start the egress proxy runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
