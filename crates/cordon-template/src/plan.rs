//! A build's steps as data: what `cordon template build --plan FILE` runs, and what the
//! server writes for a build asked through E2B's template API (docs/e2b.md, Template
//! builds). The `--run` form is a plan of `Run` steps only.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The steps of one build, in order, and whether a cached result may stand for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildPlan {
    pub steps: Vec<PlanStep>,
    /// Where steps start before a `Workdir` step says otherwise (`/` when left out).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Build again even when a template of the same inputs exists.
    #[serde(default)]
    pub force: bool,
    /// A command the template's sandboxes start with, and the command that says it is
    /// ready: the build starts the one and waits for the other before it seals.
    #[serde(default)]
    pub start: Option<StartCommand>,
}

/// A start command and its readiness check (E2B's `set_start_cmd`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCommand {
    pub start: String,
    /// Run until it exits 0; left out, the start command's own exit is not waited for.
    #[serde(default)]
    pub ready: Option<String>,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlanStep {
    /// `sh -c CMD` in the current directory with the current environment.
    Run {
        cmd: String,
        /// The user the step asked for (`None`: the plan's current one).
        #[serde(default)]
        user: Option<String>,
    },
    /// Unpacks a tar archive (gzip or not) the host holds into `dest` (relative to the
    /// current directory), inside the build's sandbox: the archive is the unpacking
    /// program's stdin, so the host never writes into the working copy.
    Copy {
        archive: PathBuf,
        /// The archive's digest as its sender named it (part of the build's inputs).
        digest: String,
        /// What of the archive is copied: a path or shell pattern inside it (`*`: all).
        src: String,
        dest: String,
        #[serde(default)]
        gzip: bool,
        /// Octal mode given to what was unpacked (`chmod -R`).
        #[serde(default)]
        mode: Option<String>,
        #[serde(default)]
        user: Option<String>,
    },
    /// Variables for the later steps and for every sandbox on the template.
    Env { vars: BTreeMap<String, String> },
    /// The directory later steps start in (made if missing).
    Workdir { dir: String },
    /// The user later steps ask for.
    User { name: String },
}

impl PlanStep {
    /// The step as the build's inputs name it: its kind and arguments (a copy by its
    /// archive's digest, never by where the host keeps it).
    pub fn input(&self) -> String {
        match self {
            PlanStep::Run { cmd, user } => match user {
                Some(u) => format!("RUN[{u}] {cmd}"),
                None => cmd.clone(),
            },
            PlanStep::Copy {
                digest,
                src,
                dest,
                gzip,
                mode,
                user,
                ..
            } => format!(
                "COPY {digest} {src} {dest} gzip={gzip} mode={} user={}",
                mode.as_deref().unwrap_or(""),
                user.as_deref().unwrap_or("")
            ),
            PlanStep::Env { vars } => {
                let kv: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("ENV {}", kv.join(" "))
            }
            PlanStep::Workdir { dir } => format!("WORKDIR {dir}"),
            PlanStep::User { name } => format!("USER {name}"),
        }
    }
}

/// How a build ended, written by `cordon template build --result FILE` for whoever started
/// it (the server reads it; stderr has the log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildResult {
    pub ok: bool,
    /// The template's digest when built or cached.
    #[serde(default)]
    pub digest: Option<String>,
    /// Whether no step ran because a template of the same inputs existed.
    #[serde(default)]
    pub cached: bool,
    /// The step that failed, from 1 (none: before or after the steps).
    #[serde(default)]
    pub step: Option<usize>,
    /// Why it failed, for the one who asked (no host path).
    #[serde(default)]
    pub message: String,
    /// The user a failed step asked for that the build does not know.
    #[serde(default)]
    pub unknown_user: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_reads_back_and_refuses_unknown_fields() {
        let plan = BuildPlan {
            steps: vec![
                PlanStep::Workdir { dir: "/app".into() },
                PlanStep::Run {
                    cmd: "ls".into(),
                    user: Some("root".into()),
                },
            ],
            workdir: Some("/home/user".into()),
            force: true,
            start: None,
        };
        let text = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<BuildPlan>(&text).unwrap(), plan);
        let bad = r#"{"steps":[{"kind":"run","cmd":"ls","shell":"bash"}]}"#;
        assert!(serde_json::from_str::<BuildPlan>(bad).is_err());
        assert_eq!(plan.steps[1].input(), "RUN[root] ls");
    }
}
