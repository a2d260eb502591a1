use crate::Tier;

/// Errors shared by every backend. Each message says what went wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tier cannot run on this host.
    #[error("the {tier} tier is not available here: {reason}; fix: {fix}")]
    Unavailable {
        tier: Tier,
        reason: String,
        fix: String,
    },
    /// A wall could not be put up and the spec did not allow running weaker.
    #[error(
        "refusing to run: the {layer} layer could not be applied ({reason}); fix the host \
         (see `cordon doctor`) or pass --allow-weaker {layer} to run without it, marked weaker"
    )]
    LayerUnavailable { layer: String, reason: String },
    /// The request itself is invalid.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A path given for a file in or out is not inside the workspace, or is a symlink.
    #[error("refused path {path:?}: {reason}")]
    PathRefused { path: String, reason: String },
    /// A file transfer could not complete.
    #[error("file {path:?}: {reason}")]
    File { path: String, reason: String },
    /// The tier (or this sandbox's build of it) cannot do what was asked.
    #[error("{what} is not supported here; fix: {fix}")]
    Unsupported { what: String, fix: String },
    /// The sandbox is gone (destroyed, timed out or crashed) and cannot be used again.
    #[error("sandbox {id} is no longer running ({reason}); create a new sandbox")]
    Gone { id: String, reason: String },
    /// A resource the server shares between tenants (descriptors, compile slots) is at this
    /// tenant's share, or full, for now: the same request may pass once some is given back.
    /// `what` says which and what to do.
    #[error("{what}")]
    Busy { what: String, retry_after_secs: u64 },
    /// The sandbox machinery failed; the sandboxed code did not cause this.
    #[error("sandbox failure: {0}")]
    Sandbox(String),
    /// An OS call on the host failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
