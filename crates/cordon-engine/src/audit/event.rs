//! What an audit row says: one variant per kind of decision, each with its typed detail.
//!
//! The store keeps the columns it always had (`kind`, `decision`, `detail` as JSON text): a
//! variant names its kind and decision and serializes its detail, so a new kind is one
//! variant here and the compiler leads to every place that must say how it is written.

use std::collections::BTreeMap;

use cordon_core::{
    ArchiveReport, EgressEvent, FileOp, Limits, Termination, Timings, Usage, VolumeMount, Weakening,
};
use serde::{Deserialize, Serialize};

use crate::GateRecord;

/// A refusal or failure as a row records it: the API's error body (`code`, `message`,
/// `fix`, and the rule that refused, if one did).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub code: String,
    pub message: String,
    pub fix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// A sandbox made (a session's create, or the sandbox of a one-shot run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Created {
    /// Where it came from: a warm pool or a cold start.
    pub source: String,
    pub start_us: u64,
    pub limits: Limits,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Made for one run and ended with it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub one_shot: bool,
    /// The snapshot it was started from (a create from a snapshot, or one of a fork).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// A snapshot taken of a sandbox (the row's sandbox), or the attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotTaken {
    pub snapshot: Option<String>,
    pub name: Option<String>,
    pub mode: cordon_core::SnapshotMode,
    pub bytes: Option<u64>,
    pub us: u64,
    pub error: Option<Failure>,
}

/// What an exec ran: the digest and kind of its command, never the command itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Command {
    pub command_sha256: String,
    /// `code`, `argv` or `module`.
    pub command_kind: String,
    pub lang: Option<String>,
    pub limits: Limits,
}

/// How an exec that ran ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecEnd {
    pub timeout_ms: Option<u64>,
    pub termination: Termination,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub usage: Usage,
    pub timings: Timings,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub weakened: Vec<Weakening>,
}

/// An exec's row: it ran and ended somehow, or it could not run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecRecord {
    #[serde(flatten)]
    pub command: Command,
    #[serde(flatten)]
    pub result: ExecResult,
}

/// An exec's end, or why it did not run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ExecResult {
    Ended(ExecEnd),
    Failed { error: Failure },
}

/// A request that carried a grant's credential out through the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantUse {
    pub grant: String,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub status: Option<u16>,
    pub count: u64,
}

impl GrantUse {
    /// The uses an egress event records: one per grant whose credential an allowed request
    /// carried out; none for a refused one, or one that carried none.
    pub fn of(ev: &EgressEvent) -> Vec<GrantUse> {
        let Some(grants) = ev.grant.as_ref() else {
            return Vec::new();
        };
        if ev.decision != cordon_core::EgressDecision::Allow {
            return Vec::new();
        }
        grants
            .iter()
            .map(|name| GrantUse {
                grant: name.to_string(),
                host: ev.host.clone(),
                port: ev.port,
                method: ev.method.clone(),
                path: ev.path.clone(),
                status: ev.status,
                count: ev.count,
            })
            .collect()
    }
}

/// A volume as a sandbox mounts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mounted {
    pub name: String,
    pub path: String,
    pub read_only: bool,
}

/// How a sandbox ended, as its `destroy` row says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Destroyed {
    pub reason: String,
    pub destroy_us: u64,
    pub result: TeardownResult,
    pub volumes_released: usize,
}

/// Whether the tier's teardown reported an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A pause (in memory) or a resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    Pause,
    Resume,
}

/// A background exec that ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackgroundEnd {
    pub exec: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_us: u64,
    pub max_rss_bytes: u64,
    pub oom_killed: bool,
    pub pids_limited: bool,
    pub stopped: bool,
}

/// A code context's interpreter that stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContextStop {
    pub context: String,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub pids_limited: bool,
    pub cpu_us: Option<u64>,
    pub max_rss_bytes: Option<u64>,
}

/// One cell run in a code context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextRun {
    pub context: String,
    pub cell: u64,
    pub code_sha256: String,
    pub status: String,
    /// The exception's name, if the cell raised one.
    pub error: Option<String>,
    pub restarted: bool,
    pub duration_us: u64,
    pub timeout_ms: u64,
}

/// What a crash recovery found and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    pub sandboxes: Vec<String>,
    /// Sandboxes paused to disk, kept across the restart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    pub removed: Vec<String>,
    pub scratch: Vec<String>,
}

/// One `cordon template build`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateBuilt {
    pub name: String,
    pub digest: Option<String>,
    pub inputs_digest: String,
    pub base: String,
    pub steps: usize,
    pub duration_ms: u64,
    /// `ok`, or how it failed; also the row's decision.
    pub result: String,
}

/// A file or archive moved into or out of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transfer {
    pub path: String,
    pub bytes: Option<u64>,
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<ArchiveReport>,
    pub error: Option<String>,
}

/// One audit event. Each variant is one `kind`; [`AuditEvent::kind`],
/// [`AuditEvent::decision`] and [`AuditEvent::detail`] say how it is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum AuditEvent {
    /// The gate's decision on a request (`allow` or `deny`), with its whole record.
    Policy {
        allowed: bool,
        record: Box<GateRecord>,
    },
    Create(Created),
    /// A create the tier or the volumes could not serve.
    CreateFailed {
        error: Failure,
    },
    Exec(ExecRecord),
    /// One proxy decision (folded: a flood is one row with a count).
    Egress(EgressEvent),
    GrantUse(GrantUse),
    VolumeMount {
        volumes: Vec<Mounted>,
    },
    VolumeMountFailed {
        volumes: Vec<VolumeMount>,
        error: Failure,
    },
    Destroy(Destroyed),
    /// A sandbox a dead server left behind, removed at the next start.
    Recovered {
        state_was: String,
    },
    /// A session paused to disk that the next start could not bring back.
    ResumeFailed {
        error: String,
    },
    /// A pause in memory or a resume, and how long it took.
    Lifecycle {
        action: Lifecycle,
        us: u64,
        error: Option<Failure>,
    },
    PausedToDisk {
        us: u64,
        on_disk_bytes: u64,
    },
    /// New clocks for a session.
    Patch {
        ttl_ms: Option<i64>,
        idle_timeout_ms: Option<i64>,
    },
    FilePut(Transfer),
    FileGet(Transfer),
    FileOp {
        op: FileOp,
        error: Option<String>,
    },
    ArchivePut(Transfer),
    ArchiveGet(Transfer),
    /// A connection from outside to a port served on the sandbox's own loopback (`via`:
    /// the listener it came through, `e2b` or `api`), or its refusal.
    PortOpen {
        port: u16,
        via: String,
        error: Option<String>,
    },
    /// A directory watcher started on a sandbox's workspace (`via`: `e2b` or `api`), or
    /// its refusal.
    WatchStart {
        path: String,
        recursive: bool,
        via: String,
        error: Option<String>,
    },
    ExecBackground {
        exec: Option<String>,
        command: Command,
        error: Option<Failure>,
    },
    ExecBackgroundEnd(BackgroundEnd),
    /// A signal sent to a background exec (`kill` or `term`).
    ExecSignal {
        exec: String,
        kill: bool,
    },
    ContextStart {
        context: String,
        lang: String,
        reason: String,
        version: Option<String>,
        error: Option<Failure>,
    },
    ContextStop(ContextStop),
    ContextRun(ContextRun),
    /// A volume made, refused (`denied`) or failed.
    VolumeCreate {
        name: String,
        size: u64,
        outcome: VolumeOutcome,
    },
    VolumeDelete {
        name: String,
        outcome: VolumeOutcome,
    },
    Recovery(RecoveryReport),
    Startup {
        pid: u32,
        recovered: usize,
    },
    Shutdown {
        graceful: bool,
    },
    TemplateBuild(TemplateBuilt),
    Snapshot(SnapshotTaken),
    SnapshotDelete {
        snapshot: String,
        bytes: u64,
    },
}

/// How a volume call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeOutcome {
    /// Done: how long it took (a create) or the size it freed (a delete).
    Done {
        us: Option<u64>,
        size: Option<u64>,
    },
    Denied(Failure),
    Failed(Failure),
}

impl AuditEvent {
    /// The row of a gate decision, and the tier it names (the admitted one, or the refused
    /// request's, if it named one).
    pub fn of_decision(
        decided: &Result<crate::Admission, crate::Denial>,
    ) -> (Option<cordon_core::Tier>, AuditEvent) {
        match decided {
            Ok(a) => (
                Some(a.spec.tier),
                AuditEvent::Policy {
                    allowed: true,
                    record: Box::new(a.record.clone()),
                },
            ),
            Err(d) => (
                d.record.tier,
                AuditEvent::Policy {
                    allowed: false,
                    record: d.record.clone(),
                },
            ),
        }
    }

    /// The `kind` column.
    pub fn kind(&self) -> &'static str {
        use AuditEvent as E;
        match self {
            E::Policy { .. } => "policy",
            E::Create(_) | E::CreateFailed { .. } => "create",
            E::Exec(_) => "exec",
            E::Egress(_) => "egress",
            E::GrantUse(_) => "grant_use",
            E::VolumeMount { .. } | E::VolumeMountFailed { .. } => "volume_mount",
            E::Destroy(_) | E::Recovered { .. } | E::ResumeFailed { .. } => "destroy",
            E::Lifecycle {
                action: Lifecycle::Pause,
                ..
            }
            | E::PausedToDisk { .. } => "pause",
            E::Lifecycle {
                action: Lifecycle::Resume,
                ..
            } => "resume",
            E::Patch { .. } => "patch",
            E::FilePut(_) => "file_put",
            E::FileGet(_) => "file_get",
            E::FileOp { .. } => "file_op",
            E::ArchivePut(_) => "archive_put",
            E::ArchiveGet(_) => "archive_get",
            E::PortOpen { .. } => "port_open",
            E::WatchStart { .. } => "watch_start",
            E::ExecBackground { .. } => "exec_background",
            E::ExecBackgroundEnd(_) => "exec_background_end",
            E::ExecSignal { .. } => "exec_signal",
            E::ContextStart { .. } => "context_start",
            E::ContextStop(_) => "context_stop",
            E::ContextRun(_) => "context_run",
            E::VolumeCreate { .. } => "volume_create",
            E::VolumeDelete { .. } => "volume_delete",
            E::Recovery(_) => "recovery",
            E::Startup { .. } => "startup",
            E::Shutdown { .. } => "shutdown",
            E::TemplateBuild(_) => "template_build",
            E::Snapshot(_) => "snapshot",
            E::SnapshotDelete { .. } => "snapshot_delete",
        }
    }

    /// Every kind a row may have, for the query API's checks and the docs.
    pub const KINDS: &'static [&'static str] = &[
        "policy",
        "create",
        "exec",
        "egress",
        "grant_use",
        "volume_mount",
        "destroy",
        "pause",
        "resume",
        "patch",
        "file_put",
        "file_get",
        "file_op",
        "archive_put",
        "archive_get",
        "port_open",
        "exec_background",
        "exec_background_end",
        "exec_signal",
        "context_start",
        "context_stop",
        "context_run",
        "volume_create",
        "volume_delete",
        "recovery",
        "startup",
        "shutdown",
        "template_build",
        "snapshot",
        "snapshot_delete",
    ];

    /// The `decision` column.
    pub fn decision(&self) -> Option<&str> {
        use AuditEvent as E;
        let ok_or_error = |failed: bool| Some(if failed { "error" } else { "ok" });
        match self {
            E::Policy { allowed, .. } => Some(if *allowed { "allow" } else { "deny" }),
            E::Create(_) | E::VolumeMount { .. } | E::PausedToDisk { .. } | E::Patch { .. } => {
                Some("ok")
            }
            E::ExecBackgroundEnd(_) | E::ContextStop(_) | E::ContextRun(_) => Some("ok"),
            E::CreateFailed { .. } | E::VolumeMountFailed { .. } => Some("error"),
            E::Exec(r) => Some(match &r.result {
                ExecResult::Ended(end) => end.termination.as_str(),
                ExecResult::Failed { .. } => "error",
            }),
            E::Egress(ev) => Some(ev.decision.as_str()),
            E::GrantUse(_) => Some("allow"),
            E::Destroy(d) => Some(&d.reason),
            E::Recovered { .. } => Some("recovered"),
            E::ResumeFailed { .. } => Some("resume-failed"),
            E::Lifecycle { error, .. } => ok_or_error(error.is_some()),
            E::FilePut(t) | E::FileGet(t) | E::ArchivePut(t) | E::ArchiveGet(t) => {
                ok_or_error(t.error.is_some())
            }
            E::FileOp { error, .. } | E::PortOpen { error, .. } | E::WatchStart { error, .. } => {
                ok_or_error(error.is_some())
            }
            E::ExecBackground { error, .. } => ok_or_error(error.is_some()),
            E::ContextStart { error, .. } => ok_or_error(error.is_some()),
            E::ExecSignal { kill, .. } => Some(if *kill { "kill" } else { "term" }),
            E::VolumeCreate { outcome, .. } | E::VolumeDelete { outcome, .. } => {
                Some(match outcome {
                    VolumeOutcome::Done { .. } => "ok",
                    VolumeOutcome::Denied(_) => "deny",
                    VolumeOutcome::Failed(_) => "error",
                })
            }
            E::Recovery(_) | E::Startup { .. } | E::Shutdown { .. } => None,
            E::TemplateBuild(b) => Some(&b.result),
            E::Snapshot(t) => ok_or_error(t.error.is_some()),
            E::SnapshotDelete { .. } => Some("ok"),
        }
    }

    /// The `detail` column: the variant's fields as a JSON object (its own record where it
    /// carries one).
    pub fn detail(&self) -> Result<String, serde_json::Error> {
        use AuditEvent as E;
        fn to<T: Serialize>(v: &T) -> Result<String, serde_json::Error> {
            serde_json::to_string(v)
        }
        match self {
            E::Policy { record, .. } => to(record),
            E::Create(c) => to(c),
            E::Exec(r) => to(r),
            E::Egress(ev) => to(ev),
            E::GrantUse(g) => to(g),
            E::Destroy(d) => to(d),
            E::FilePut(t) | E::FileGet(t) | E::ArchivePut(t) | E::ArchiveGet(t) => to(t),
            E::ExecBackgroundEnd(b) => to(b),
            E::ContextStop(c) => to(c),
            E::ContextRun(c) => to(c),
            E::Recovery(r) => to(r),
            E::TemplateBuild(b) => to(b),
            E::Snapshot(t) => to(t),
            E::CreateFailed { .. }
            | E::Recovered { .. }
            | E::ResumeFailed { .. }
            | E::Lifecycle { .. }
            | E::PausedToDisk { .. }
            | E::Patch { .. }
            | E::Startup { .. }
            | E::Shutdown { .. } => to(&self.lifecycle_fields()),
            E::FileOp { .. }
            | E::PortOpen { .. }
            | E::WatchStart { .. }
            | E::ExecBackground { .. }
            | E::ExecSignal { .. }
            | E::ContextStart { .. } => to(&self.work_fields()),
            E::VolumeMount { .. }
            | E::VolumeMountFailed { .. }
            | E::VolumeCreate { .. }
            | E::VolumeDelete { .. }
            | E::SnapshotDelete { .. } => to(&self.storage_fields()),
        }
    }

    /// The detail of a sandbox's or the server's life (a failed create, a recovery, a
    /// lifecycle step, a patch, a start or stop of the server); empty for other events.
    fn lifecycle_fields(&self) -> Detail {
        use AuditEvent as E;
        let d = Detail::new();
        match self {
            E::CreateFailed { error } => d.with("error", error),
            E::Recovered { state_was } => d
                .with("reason", &"crash-recovery")
                .with("state_was", state_was),
            E::ResumeFailed { error } => d.with("reason", &"resume-failed").with("error", error),
            E::Lifecycle { us, error, .. } => d.with("us", us).with("error", error),
            E::PausedToDisk { us, on_disk_bytes } => d
                .with("us", us)
                .with("to_disk", &true)
                .with("on_disk_bytes", on_disk_bytes),
            E::Patch {
                ttl_ms,
                idle_timeout_ms,
            } => d
                .with("ttl_ms", ttl_ms)
                .with("idle_timeout_ms", idle_timeout_ms),
            E::Startup { pid, recovered } => d.with("pid", pid).with("recovered", recovered),
            E::Shutdown { graceful } => d.with("graceful", graceful),
            _ => d,
        }
    }

    /// The detail of work in a sandbox (a file operation, a port, a watch, a background
    /// exec, a signal, a code context's start); empty for other events.
    fn work_fields(&self) -> Detail {
        use AuditEvent as E;
        let d = Detail::new();
        match self {
            E::FileOp { op, error } => d.with("op", op).with("error", error),
            E::PortOpen { port, via, error } => {
                d.with("port", port).with("via", via).with("error", error)
            }
            E::WatchStart {
                path,
                recursive,
                via,
                error,
            } => d
                .with("path", path)
                .with("recursive", recursive)
                .with("via", via)
                .with("error", error),
            E::ExecBackground {
                exec,
                command,
                error,
            } => d
                .with("exec", exec)
                .with("command_sha256", &command.command_sha256)
                .with("command_kind", &command.command_kind)
                .with("limits", &command.limits)
                .with("error", error),
            E::ExecSignal { exec, .. } => d.with("exec", exec),
            E::ContextStart {
                context,
                lang,
                reason,
                version,
                error,
            } => d
                .with("context", context)
                .with("lang", lang)
                .with("reason", reason)
                .with("version", version)
                .with("error", error),
            _ => d,
        }
    }

    /// The detail of volumes and snapshots kept by the server (mounts, creates, deletes);
    /// empty for other events.
    fn storage_fields(&self) -> Detail {
        use AuditEvent as E;
        let d = Detail::new();
        match self {
            E::VolumeMount { volumes } => d.with("volumes", volumes),
            E::VolumeMountFailed { volumes, error } => {
                d.with("volumes", volumes).with("error", error)
            }
            E::VolumeCreate {
                name,
                size,
                outcome,
            } => {
                let d = d.with("name", name).with("size", size);
                match outcome {
                    VolumeOutcome::Done { us, .. } => d.with("us", us),
                    VolumeOutcome::Denied(e) | VolumeOutcome::Failed(e) => d.with("error", e),
                }
            }
            E::VolumeDelete { name, outcome } => {
                let d = d.with("name", name);
                match outcome {
                    VolumeOutcome::Done { size, .. } => d.with("size", size),
                    VolumeOutcome::Denied(e) | VolumeOutcome::Failed(e) => d.with("error", e),
                }
            }
            E::SnapshotDelete { snapshot, bytes } => {
                d.with("snapshot", snapshot).with("bytes", bytes)
            }
            _ => d,
        }
    }
}

/// A detail object built field by field from typed values (each serialized as it is
/// added), for the variants whose detail is a few of their own fields.
#[derive(Serialize)]
#[serde(transparent)]
struct Detail(BTreeMap<&'static str, serde_json::Value>);

impl Detail {
    fn new() -> Self {
        Detail(BTreeMap::new())
    }

    fn with<T: Serialize + ?Sized>(mut self, key: &'static str, value: &T) -> Self {
        // A value of these types always serializes: they are plain data.
        let v = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
        self.0.insert(key, v);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::{EgressDecision, EgressKind};

    fn failure() -> Failure {
        Failure {
            code: "sandbox_gone".into(),
            message: "gone".into(),
            fix: "make another".into(),
            rule: None,
        }
    }

    fn detail(e: &AuditEvent) -> serde_json::Value {
        serde_json::from_str(&e.detail().unwrap()).unwrap()
    }

    #[test]
    fn each_event_names_a_known_kind_and_its_decision() {
        let command = Command {
            command_sha256: "ab".into(),
            command_kind: "code".into(),
            lang: Some("python".into()),
            limits: Limits::default(),
        };
        let ended = AuditEvent::Exec(ExecRecord {
            command: command.clone(),
            result: ExecResult::Ended(ExecEnd {
                timeout_ms: Some(5),
                termination: Termination::OutOfMemory,
                exit_code: None,
                signal: Some(9),
                usage: Usage::default(),
                timings: Timings::default(),
                stdout_bytes: 1,
                stderr_bytes: 2,
                stdout_truncated: false,
                stderr_truncated: true,
                weakened: Vec::new(),
            }),
        });
        let failed = AuditEvent::Exec(ExecRecord {
            command,
            result: ExecResult::Failed { error: failure() },
        });
        let mut ev = EgressEvent::new(1, EgressKind::Connect, EgressDecision::Deny);
        ev.host = Some("x.test".into());
        let egress = AuditEvent::Egress(ev);
        let cases: Vec<(AuditEvent, &str, Option<&str>)> = vec![
            (ended.clone(), "exec", Some("out-of-memory")),
            (failed.clone(), "exec", Some("error")),
            (egress.clone(), "egress", Some("deny")),
            (
                AuditEvent::Lifecycle {
                    action: Lifecycle::Resume,
                    us: 3,
                    error: Some(failure()),
                },
                "resume",
                Some("error"),
            ),
            (
                AuditEvent::PausedToDisk {
                    us: 1,
                    on_disk_bytes: 2,
                },
                "pause",
                Some("ok"),
            ),
            (
                AuditEvent::Recovered {
                    state_was: "live".into(),
                },
                "destroy",
                Some("recovered"),
            ),
            (
                AuditEvent::ExecSignal {
                    exec: "e1".into(),
                    kill: false,
                },
                "exec_signal",
                Some("term"),
            ),
            (
                AuditEvent::VolumeCreate {
                    name: "v".into(),
                    size: 1,
                    outcome: VolumeOutcome::Denied(failure()),
                },
                "volume_create",
                Some("deny"),
            ),
            (AuditEvent::Shutdown { graceful: true }, "shutdown", None),
        ];
        for (event, kind, decision) in &cases {
            assert_eq!(event.kind(), *kind, "{event:?}");
            assert!(AuditEvent::KINDS.contains(kind), "{kind} is not listed");
            assert_eq!(event.decision(), *decision, "{event:?}");
            assert!(detail(event).is_object(), "{event:?}");
        }
        // The detail keeps the fields readers match on, as before the enum.
        let d = detail(&ended);
        assert_eq!(d["command_sha256"], "ab");
        assert_eq!(d["termination"], "out-of-memory");
        assert_eq!(d["stderr_truncated"], true);
        assert!(d.get("error").is_none());
        let d = detail(&failed);
        assert_eq!(d["error"]["code"], "sandbox_gone");
        assert!(d.get("termination").is_none());
        assert_eq!(detail(&egress)["host"], "x.test");
        let d = detail(&AuditEvent::PausedToDisk {
            us: 1,
            on_disk_bytes: 2,
        });
        assert_eq!(
            d,
            serde_json::json!({"us": 1, "to_disk": true, "on_disk_bytes": 2})
        );
    }

    #[test]
    fn the_kinds_list_has_each_kind_once() {
        let mut k = AuditEvent::KINDS.to_vec();
        k.sort_unstable();
        k.dedup();
        assert_eq!(k.len(), AuditEvent::KINDS.len());
    }

    #[test]
    fn a_grant_use_is_recorded_per_grant_an_allowed_request_carried() {
        let mut ev = EgressEvent::new(1, EgressKind::Http, EgressDecision::Allow);
        ev.host = Some("api.test".into());
        ev.count = 3;
        assert!(GrantUse::of(&ev).is_empty(), "no grant carried: no use");
        ev.grant = Some(["github", "npm"].into_iter().collect());
        let uses = GrantUse::of(&ev);
        let names: Vec<&str> = uses.iter().map(|u| u.grant.as_str()).collect();
        assert_eq!(names, ["github", "npm"]);
        assert!(
            uses.iter()
                .all(|u| u.host.as_deref() == Some("api.test") && u.count == 3)
        );
        ev.decision = EgressDecision::Deny;
        assert!(
            GrantUse::of(&ev).is_empty(),
            "a refused request used no grant"
        );
    }
}
