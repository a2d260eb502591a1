//! What can go wrong with templates. Messages name templates and paths inside images, never
//! where the store lives on the host: a tenant may see them.

/// Errors of the template store and of imports.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// No template has this name.
    #[error(
        "no template named {0:?}; list them with `cordon template ls`, or import one with `cordon template import FILE --name NAME`"
    )]
    NotFound(String),
    /// A template of this name exists already (templates are immutable).
    #[error(
        "a template named {0:?} exists already; templates are immutable: pick another name, or remove it first with `cordon template rm {0}`"
    )]
    Exists(String),
    /// The name is not a valid template name.
    #[error("{0}")]
    Invalid(String),
    /// The file is neither an OCI image layout nor a docker archive.
    #[error(
        "{0}; give a tar of an OCI image layout (index.json, blobs/) or a docker archive (`docker save`, manifest.json)"
    )]
    UnknownFormat(String),
    /// A blob's content does not match the digest (or size) that names it.
    #[error(
        "the image's {what} does not match its digest {expected}: the file is corrupt or was tampered with; export the image again"
    )]
    DigestMismatch { what: String, expected: String },
    /// The image is malformed or uses something Cordon does not import.
    #[error("the image cannot be imported: {0}")]
    Malformed(String),
    /// The image exceeds an import limit (a hostile image is untrusted input).
    #[error(
        "the image exceeds the import limit on {what} ({limit}); an image this large is refused as untrusted input: make it smaller, or raise the limit (--max-{flag})"
    )]
    Limit {
        what: &'static str,
        flag: &'static str,
        limit: u64,
    },
    /// Sealing a build or importing an image would write more to the host's disk than the
    /// build's disk limit or the template store's budget allow; nothing was kept.
    #[error(
        "the template would take more than {limit} of the host's disk ({what}); nothing was kept: {fix}"
    )]
    DiskLimit {
        /// The bound, for people (`400.0M`).
        limit: String,
        /// Which bound: the build's `--disk`, or the store's budget.
        what: String,
        fix: String,
    },
    /// A digest prefix names several templates of different digests.
    #[error(
        "{prefix:?} is the start of the digests of several templates ({candidates}); give more of the digest (or the whole `sha256:...`), or the template's name"
    )]
    Ambiguous { prefix: String, candidates: String },
    /// The template is used by a live sandbox and cannot be removed yet.
    #[error(
        "template {0:?} is in use by a live sandbox; it is removed by the next `cordon template gc` after the sandbox ends"
    )]
    InUse(String),
    /// The template's manifest in the store is unreadable.
    #[error(
        "the store's record of template {name:?} is damaged ({reason}); remove it with `cordon template rm {name}` and import it again"
    )]
    Damaged { name: String, reason: String },
    /// An OS call on the host failed. `what` never names a host path.
    #[error("{what}: {source}; check that the data dir is writable and has space")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl TemplateError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TemplateError {
        let what = what.into();
        move |source| TemplateError::Io { what, source }
    }
}

impl From<TemplateError> for cordon_core::Error {
    fn from(e: TemplateError) -> Self {
        match e {
            TemplateError::Io { what, source } => cordon_core::Error::io(what, source),
            other => cordon_core::Error::Invalid(other.to_string()),
        }
    }
}

pub type Result<T, E = TemplateError> = std::result::Result<T, E>;
