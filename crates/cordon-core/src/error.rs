use std::fmt;

use crate::{Language, Tier};

/// An error kept as the source of another, whatever its type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    /// A value of the request that Cordon does not take, typed by what it is.
    #[error("invalid request: {0}")]
    Rejected(#[from] Rejected),
    /// The request is invalid for a reason an error of its own gives (a parser's, a
    /// compiler's), kept as the source; `what` says what was wrong, `fix` what to do.
    #[error("invalid request: {what}: {source}; {fix}")]
    Malformed {
        what: String,
        fix: String,
        #[source]
        source: BoxError,
    },
    /// A snapshot that cannot start this sandbox; [`SnapshotRefusal`] says why.
    #[error("invalid request: {0}")]
    Snapshot(SnapshotRefusal),
    /// A backend was handed a spec the caller had to prepare first (a programming error of
    /// the caller's, not the tenant's).
    #[error("invalid request: {0}")]
    NotPrepared(Unprepared),
    /// A backend was handed a spec of another tier.
    #[error("invalid request: the {backend} backend was asked for a {asked} sandbox")]
    OtherTier { backend: Tier, asked: Tier },
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
    /// The sandbox machinery failed; the sandboxed code did not cause this. For a failure
    /// with no error of its own (a state, a refusal, a message the guest sent); one caused by
    /// an error is [`Error::Failed`], which keeps it.
    #[error("sandbox failure: {0}")]
    Sandbox(String),
    /// A step of the sandbox machinery failed with an error of its own, kept as the source
    /// (`std::error::Error::source`); the sandboxed code did not cause this. `what` names
    /// the step and, where there is one, what to do.
    #[error("sandbox failure: {what}: {source}")]
    Failed {
        what: String,
        #[source]
        source: BoxError,
    },
    /// An OS call on the host failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a name names, and the names it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Template,
    Volume,
    EnvVar,
    /// `cordon run --volume NAME:/work/PATH[:ro|:rw]`.
    VolumeFlag,
    /// An OCI container's id.
    ContainerId,
    /// An entry of a process's environment, `KEY=VALUE`.
    EnvEntry,
}

impl NameKind {
    /// The names of this kind that are taken, as the fix of a refusal.
    pub fn takes(self) -> &'static str {
        match self {
            NameKind::Template => {
                "use 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
            }
            NameKind::Volume => {
                "use 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit"
            }
            NameKind::EnvVar => "use letters, digits and _",
            NameKind::VolumeFlag => {
                "give NAME:/work/PATH or NAME:/work/PATH:ro, e.g. --volume cache:/work/cache:ro"
            }
            NameKind::ContainerId => "use letters, digits, '_', '-' and '.' (not first)",
            NameKind::EnvEntry => "give KEY=VALUE; fix the container's env",
        }
    }
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Template => "template name",
            NameKind::Volume => "volume name",
            NameKind::EnvVar => "environment variable name",
            NameKind::VolumeFlag => "--volume",
            NameKind::ContainerId => "container id",
            NameKind::EnvEntry => "environment entry",
        })
    }
}

/// A value of a request that Cordon does not take: one typed refusal for each way a name or
/// a field is checked, wherever it is checked, each saying what to give instead. None names
/// a path of the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// A name outside what its kind takes.
    #[error("{kind} {name:?} is not valid; {}", kind.takes())]
    Name { kind: NameKind, name: String },
    /// The same name given twice where each is taken once.
    #[error("{kind} {name:?} is asked for twice; give each once")]
    Twice { kind: NameKind, name: String },
    /// More of something than a sandbox takes.
    #[error("{asked} {what} asked for; a sandbox takes at most {max}")]
    TooMany {
        what: &'static str,
        asked: usize,
        max: usize,
    },
    /// Source code in a language the tier does not run.
    #[error("the {tier} tier does not run {language} code; {fix}")]
    TierLanguage {
        tier: Tier,
        language: Language,
        fix: &'static str,
    },
    /// Source code in a language whose interpreter the sandbox's template lacks.
    #[error(
        "template {template:?} has no {language} interpreter on its PATH ({}); use a template \
         that has one (`cordon template ls`), build one with it (`cordon template build`), or \
         run a program the template has with `cordon run --template {template} -- PROGRAM`",
        language.program()
    )]
    NoInterpreter {
        template: String,
        language: Language,
    },
    /// A limit that would make the sandbox useless (`what` is wrong, `fix` what to give).
    #[error("{what}; {fix}")]
    Limit {
        what: &'static str,
        fix: &'static str,
    },
    /// A terminal's size out of range.
    #[error("a terminal of {rows} rows and {cols} columns: give each between 1 and {max}")]
    Terminal { rows: u16, cols: u16, max: u16 },
    /// A grant that names no host.
    #[error("grant {grant:?} names no host; give at least one host it may be sent to")]
    GrantWithoutHosts { grant: String },
    /// A port of the sandbox that no program of it serves.
    #[error(
        "port {port} is not one a program of the sandbox serves (port {proxy} is the \
         sandbox's egress proxy); name the port your server listens on"
    )]
    NotAProgramPort { port: u16, proxy: u16 },
}

/// Why a snapshot cannot start a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotRefusal {
    /// It was taken on another tier, or in a mode this start does not take.
    #[error(
        "a {mode} snapshot of the {from} tier cannot start a {to} sandbox; start it on its \
         own tier"
    )]
    OtherTier {
        /// The snapshot's mode (`full`, `files`).
        mode: String,
        from: Tier,
        to: Tier,
    },
    /// It was written in a layout this build does not read.
    #[error(
        "this snapshot was written in {tier} snapshot format {found}, which this build does \
         not read (it reads {reads}); take the snapshot again"
    )]
    Format { tier: Tier, found: u32, reads: u32 },
    /// Its own record of itself does not fit this start (`why` names what).
    #[error("this {tier} snapshot cannot start a sandbox: {why}; take the snapshot again")]
    Unusable { tier: Tier, why: String },
}

/// What the caller of a backend had to do before the create and did not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unprepared {
    /// The spec names a template the template store did not resolve.
    #[error(
        "template {0:?} was not resolved before the create; resolve it with the template \
         store (cordon_template::Store::resolve_spec) first"
    )]
    Template(String),
    /// The resolved template is not a root of the template store.
    #[error("template {0:?} is not a root of the template store")]
    TemplateRoot(String),
    /// The spec mounts a volume no lease was taken on.
    #[error(
        "volume {0:?} was not leased before the create; lease it with \
         cordon_host::volume::VolumeStore::mount first"
    )]
    Volume(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// A step of the sandbox machinery that failed with `source`.
    pub fn failed(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Failed {
            what: what.into(),
            source: Box::new(source),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::Error;

    #[test]
    fn a_failed_step_keeps_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the pipe closed");
        let e = Error::failed("sending the join", io);
        assert_eq!(
            e.to_string(),
            "sandbox failure: sending the join: the pipe closed"
        );
        let source = e.source().expect("the io error is kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("as the io error it was");
        assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(Error::Sandbox("a message".into()).source().is_none());
    }
}
