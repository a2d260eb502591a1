//! Cordon's domain types and the [`Backend`] trait.
//!
//! Every isolation tier (wasm, container, gvisor, microvm, ...) implements [`Backend`]:
//! probe what the host can do, create a sandbox from a [`SandboxSpec`], exec in it while
//! streaming output, move files in and out, destroy it. Create and exec are separate so warm
//! pools and multi-step tasks work. This crate never touches the OS.

mod backend;
pub mod egress;
mod ending;
mod error;
mod exec;
mod features;
mod files;
mod gauge;
mod language;
mod paths;
mod procs;
pub mod report;
mod run;
mod sandbox_id;
mod snapshot;
mod spec;
mod tier;
pub mod units;
mod volume;
mod watch;
mod workspace_image;

pub use backend::{
    Backend, Capability, Interrupter, OutputSink, PORT_CONNECTED, Probe, ProcUser, Sandbox,
    Terminal, TierStatus,
};
pub use egress::{Host, HostMatch, Pattern, PatternError, Ports};
pub use ending::{Evidence, ExitReport, classify};
pub use error::{BoxError, Error, NameKind, Rejected, Result, SnapshotRefusal, Unprepared};
pub use exec::{
    Command, ExecOutcome, ExecRequest, OutputStream, SANDBOX_PATH, Termination, Timings, Usage,
    exit_code_for, sandbox_env,
};
pub use features::{Feature, Features, refuse_outside};
pub use files::{
    ArchiveReport, FileEntry, FileKind, FileOp, FileReply, MAX_LIST_ENTRIES, MAX_METADATA_BYTES,
    MAX_METADATA_KEY, MAX_METADATA_KEYS, MAX_METADATA_VALUE, METADATA_XATTR_PREFIX,
    MetadataRefused, Skipped, check_metadata,
};
pub use gauge::{Gauge, Reading};
pub use language::Language;
pub use paths::{
    AGENT_DIRS, BOOT_ID, FileTarget, HOME_MOUNT, UNREACHABLE, WORKDIR, classify_sandbox_path,
    validate_sandbox_dir, validate_sandbox_path,
};
pub use procs::{BACKGROUND_KEEP, PTY_MAX, ProcExit, ProcOutput, ProcSignal, PtySize};
pub use report::{
    Details, EgressDecision, EgressEvent, EgressFold, EgressKind, Finding, FindingKind, GrantNames,
};
pub use run::{FileIn, FileOut, run_once};
pub use sandbox_id::SandboxId;
pub use snapshot::{MAX_FORKS, SnapshotDir, SnapshotImage, SnapshotMode};
pub use spec::{
    EgressPolicy, Grant, GrantSecret, HOST_ETC, Limits, MintedToken, ResolvedTemplate, SandboxSpec,
    SecretValue, TokenMinter, Weakening, default_grant_header, scratch_dir, validate_env_name,
    validate_template_name,
};
pub use tier::Tier;
pub use volume::{
    HostBind, MAX_HOST_BINDS, MAX_MOUNTS, MIN_VOLUME_BYTES, VolumeMount, VolumeSource,
    validate_bind_target, validate_mounts, validate_volume_name, validate_volume_path,
};
pub use watch::{
    MAX_QUEUED_BYTES, MAX_QUEUED_EVENTS, MAX_WATCHED_DIRS, MAX_WATCHERS, WatchEvent, WatchKind,
    WatchOp, WatchReply,
};
pub use workspace_image::WorkspaceImage;

/// Cordon's data dir by default: `$CORDON_HOME`, else `/var/lib/cordon` for root, else
/// `$XDG_DATA_HOME/cordon` (or `~/.local/share/cordon`).
pub fn default_data_dir() -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    if let Some(h) = std::env::var_os("CORDON_HOME") {
        return PathBuf::from(h);
    }
    // The owner of /proc/self is the effective uid.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return PathBuf::from("/var/lib/cordon");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("cordon")
}
