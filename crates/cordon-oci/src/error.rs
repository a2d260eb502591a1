//! What `cordon-oci` reports: [`OciError`] and the errors of the node's config and audit
//! store it carries. Below every other module of the crate, which all return these.

use cordon_engine::audit::StoreError;

/// What `cordon-oci` reports to its caller. Every message says what to do; none names a
/// host path of the node beyond what the caller itself gave.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The bundle asks for something Cordon does not give (`what`), with the way out.
    #[error("cordon-oci refuses this container: {what}; {fix}")]
    Refused { what: String, fix: String },
    /// The bundle or a request could not be read.
    #[error("{0}")]
    Invalid(String),
    /// The bundle's `config.json` could not be read.
    #[error(
        "reading the bundle's config.json ({path}): {source}; the caller must write an OCI \
         runtime config there"
    )]
    BundleConfig {
        path: std::path::PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    /// A `cordon.*` annotation's value is not one Cordon takes; `want` says what it takes.
    #[error("annotation {key}={value:?}: {want}; fix the container's (or pod's) annotations")]
    Annotation {
        key: String,
        value: String,
        want: &'static str,
    },
    /// A `cordon.*` annotation Cordon does not read (`known`: those it does).
    #[error("unknown annotation {key}; Cordon reads {}", known.join(", "))]
    UnknownAnnotation {
        key: String,
        known: &'static [&'static str],
    },
    /// A container's state record does not parse.
    #[error(
        "the state of container {id:?} is damaged ({source}); `cordon-oci delete --force {id}` \
         removes it"
    )]
    DamagedState {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    /// A container's state record could not be encoded.
    #[error("encoding the state: {0}")]
    EncodeState(#[source] serde_json::Error),
    /// The network namespace a pod's bundle names cannot be entered.
    #[error(
        "the bundle's network namespace cannot be entered ({0}); a pod's sandbox must name the \
         namespace CNI made"
    )]
    Netns(#[source] nix::Error),
    /// No container of that id.
    #[error("container {0:?} does not exist; `cordon-oci list` shows the containers of this root")]
    NotFound(String),
    /// The container is in a state that does not allow the command.
    #[error("{0}")]
    State(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Core(#[from] cordon_core::Error),
    /// A row of the node's audit store could not be written.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The node's Cordon config could not be taken.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl OciError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        OciError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, OciError>;

/// Why the node's config was not taken. Its text names no host path (a container's
/// creator sees it in the refusal): the node's operator knows which file it is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the node's Cordon config cannot allow {entry}: {why}")]
    Allow { entry: String, why: String },
    #[error(
        "the node's Cordon config does not parse: {0}; fix the file (docs/kubernetes.md lists its keys)"
    )]
    Toml(#[from] toml::de::Error),
    #[error("the node's grant catalogue: {0}; fix its [[grant]] entries")]
    Catalogue(#[source] cordon_engine::GateError),
}

/// Why a row could not be written. A decision that cannot be recorded stops the container.
#[derive(Debug, thiserror::Error)]
#[error(
    "recording in the node's audit store: {source}; make its directory writable or name \
     another with `audit` in the node config"
)]
pub struct AuditError {
    #[source]
    source: AuditFailure,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditFailure {
    #[error("{0}")]
    Dir(#[source] std::io::Error),
    #[error("{0}")]
    Store(#[source] StoreError),
}

impl From<AuditFailure> for AuditError {
    fn from(source: AuditFailure) -> Self {
        AuditError { source }
    }
}
