use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Details, Language, Tier, Weakening};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Command {
    /// Source code in a language; `args` become the program's arguments.
    Code {
        language: Language,
        source: String,
        #[serde(default)]
        args: Vec<String>,
    },
    /// A program and its arguments, run without a shell.
    Argv(Vec<String>),
    /// A WebAssembly program: a WASI preview 1 command module or a preview 2 command
    /// component, given as its bytes (never a host path: the caller reads the file).
    /// Only the wasm tier runs it; `args` follow the program name in its argv.
    Wasm {
        module: Vec<u8>,
        #[serde(default)]
        args: Vec<String>,
    },
}

/// One execution inside an existing sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Command,
    /// Extra environment for this exec only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; defaults to `/work`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Bytes fed to the program's standard input; none means an empty stdin.
    #[serde(default)]
    pub stdin: Option<Vec<u8>>,
    /// Overrides the sandbox's timeout for this exec, in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// A background exec on a pseudo-terminal of this size (its stdin, stdout and stderr,
    /// and its controlling terminal); foreground execs take none.
    #[serde(default)]
    pub pty: Option<crate::PtySize>,
    /// Set by one-shot runs: no exec follows in this sandbox, so the tier need not make
    /// anything ready for a next one. Never part of the API.
    #[serde(skip)]
    pub last: bool,
}

impl ExecRequest {
    pub fn code(language: Language, source: impl Into<String>) -> Self {
        Self::new(Command::Code {
            language,
            source: source.into(),
            args: Vec::new(),
        })
    }

    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(Command::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// Runs a WebAssembly module or component (wasm tier only).
    pub fn wasm(module: Vec<u8>, args: Vec<String>) -> Self {
        Self::new(Command::Wasm { module, args })
    }

    pub fn new(command: Command) -> Self {
        ExecRequest {
            command,
            env: BTreeMap::new(),
            cwd: None,
            stdin: None,
            timeout_ms: None,
            pty: None,
            last: false,
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Why an exec ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Termination {
    /// The program exited by itself; see the exit code.
    Exited,
    /// The program was ended by a signal it did not get from Cordon.
    Signalled,
    /// The wall-clock limit passed; the whole process tree was killed.
    Timeout,
    /// The memory limit was reached and the kernel killed a process.
    OutOfMemory,
    /// The process limit was reached (fork bomb); the exec was stopped.
    ProcessLimit,
    /// More output than the cap; the exec was stopped and output truncated.
    OutputLimit,
    /// The workspace or a file-size limit was reached.
    DiskLimit,
    /// The host ended the sandbox (destroy, shutdown) before the program finished.
    Killed,
    /// The client went away before the program finished; its whole process tree was killed
    /// and the sandbox lives on.
    Cancelled,
    /// The sandbox machinery failed; not caused by the program.
    SandboxFailure,
}

impl Termination {
    /// Every termination, for tests that must cover each (a new one added here is covered).
    pub const ALL: [Termination; 10] = [
        Termination::Exited,
        Termination::Signalled,
        Termination::Timeout,
        Termination::OutOfMemory,
        Termination::ProcessLimit,
        Termination::OutputLimit,
        Termination::DiskLimit,
        Termination::Killed,
        Termination::Cancelled,
        Termination::SandboxFailure,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Termination::Exited => "exited",
            Termination::Signalled => "signalled",
            Termination::Timeout => "timeout",
            Termination::OutOfMemory => "out-of-memory",
            Termination::ProcessLimit => "process-limit",
            Termination::OutputLimit => "output-limit",
            Termination::DiskLimit => "disk-limit",
            Termination::Killed => "killed",
            Termination::Cancelled => "cancelled",
            Termination::SandboxFailure => "sandbox-failure",
        }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `PATH` inside every native tier's sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment a program gets in a native tier's sandbox, weakest first: Cordon's
/// defaults (`PATH`, `LANG`), then the template's image environment (its `PATH` replaces
/// Cordon's), then `HOME=/work`, then what the tier adds (its egress proxy's variables and
/// grant placeholders), then the sandbox's spec, then the exec's own.
pub fn sandbox_env(
    spec: &crate::SandboxSpec,
    tier_env: impl IntoIterator<Item = (String, String)>,
    req: &ExecRequest,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_string(), SANDBOX_PATH.to_string()),
        ("HOME".to_string(), "/work".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    if let Some(t) = &spec.resolved_template {
        env.extend(t.env.clone());
        env.insert("HOME".to_string(), "/work".to_string());
    }
    env.extend(tier_env);
    env.extend(spec.env.clone());
    env.extend(req.env.clone());
    env
}

/// The exit status `cordon run` (and E2B's envd, for a limit) uses for an outcome: the
/// program's own code when it exited, 128+N for signal N, and a fixed code per termination
/// reason otherwise (documented in the README): timeout 124, out-of-memory 137,
/// process-limit 122, output-limit 121, disk-limit 120, killed 143, cancelled 130,
/// sandbox-failure 125.
pub fn exit_code_for(outcome: &ExecOutcome) -> i32 {
    match outcome.termination {
        Termination::Exited => outcome.exit_code.unwrap_or(125),
        Termination::Signalled => 128 + outcome.signal.unwrap_or(0),
        Termination::Timeout => 124,
        Termination::OutOfMemory => 137,
        Termination::ProcessLimit => 122,
        Termination::OutputLimit => 121,
        Termination::DiskLimit => 120,
        Termination::Killed => 143,
        Termination::Cancelled => 130,
        Termination::SandboxFailure => 125,
    }
}

/// Resources one exec used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// User + system CPU time, in microseconds.
    pub cpu_time_us: u64,
    /// Peak memory, in bytes (the sandbox's peak where the tier measures it so).
    pub peak_memory_bytes: u64,
    /// Wall time of the exec, in microseconds.
    pub wall_time_us: u64,
}

/// Where the time went, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Timings {
    /// Time to create the sandbox (zero for a warm one taken from a pool).
    pub start_us: u64,
    /// Time from exec request to the outcome.
    pub run_us: u64,
    /// Time to destroy the sandbox, where it was destroyed in the same call.
    #[serde(default)]
    pub destroy_us: u64,
    /// Of `run_us`, the program's own time as the sandbox measured it: from handing the
    /// job to the program's process to its exit (its execve, its run and its exit). The
    /// rest of `run_us` is the sandbox's and the host's. Zero where a tier does not tell
    /// the two apart (wasm, runtime, gvisor).
    #[serde(default)]
    pub program_us: u64,
}

/// The result of one exec. Identical in shape for every tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecOutcome {
    pub tier: Tier,
    pub termination: Termination,
    /// Exit status when the program exited.
    pub exit_code: Option<i32>,
    /// Signal number when the program was ended by a signal.
    pub signal: Option<i32>,
    /// Standard output as text (invalid UTF-8 replaced).
    #[serde(serialize_with = "ser_lossy", deserialize_with = "de_bytes")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub stdout: Vec<u8>,
    /// Standard error as text (invalid UTF-8 replaced).
    #[serde(serialize_with = "ser_lossy", deserialize_with = "de_bytes")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub usage: Usage,
    pub timings: Timings,
    /// Walls this run went without, because the caller allowed it. Empty for a full run.
    #[serde(default)]
    pub weakened: Vec<Weakening>,
    /// Things the caller should know (a slower fallback, a layer best-effort, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Scan findings, egress decisions and failure details (the JSON key is `extra`).
    #[serde(default, skip_serializing_if = "Details::is_empty")]
    pub extra: Details,
}

impl ExecOutcome {
    /// An outcome with no output, for the given tier and reason.
    pub fn new(tier: Tier, termination: Termination) -> Self {
        ExecOutcome {
            tier,
            termination,
            exit_code: None,
            signal: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            usage: Usage::default(),
            timings: Timings::default(),
            weakened: Vec::new(),
            warnings: Vec::new(),
            extra: Details::default(),
        }
    }

    /// True when the program ran to completion with status 0.
    pub fn success(&self) -> bool {
        self.termination == Termination::Exited && self.exit_code == Some(0)
    }
}

fn ser_lossy<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    Ok(String::deserialize(d)?.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_env_layers_defaults_tier_spec_and_exec() {
        let mut spec = crate::SandboxSpec::new(Tier::Container);
        spec.env.insert("LANG".into(), "spec".into());
        spec.env.insert("A".into(), "spec".into());
        let mut req = ExecRequest::argv(["true"]);
        req.env.insert("A".into(), "exec".into());
        let env = sandbox_env(&spec, [("HTTPS_PROXY".into(), "tier".into())], &req);
        assert_eq!(env["PATH"], SANDBOX_PATH);
        assert_eq!(env["HOME"], "/work");
        assert_eq!(env["HTTPS_PROXY"], "tier");
        assert_eq!(env["LANG"], "spec");
        assert_eq!(env["A"], "exec");
    }

    #[test]
    fn a_template_env_sits_under_cordons_own_variables() {
        let mut spec = crate::SandboxSpec::new(Tier::Container);
        spec.resolved_template = Some(crate::ResolvedTemplate {
            name: "t".into(),
            digest: "sha256:00".into(),
            root: "/nonexistent".into(),
            writable: false,
            env: [
                ("PATH", "/opt/py/bin:/usr/bin"),
                ("HOME", "/root"),
                ("HTTPS_PROXY", "image"),
                ("IMAGE_ONLY", "1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            languages: Default::default(),
            lease: None,
        });
        let req = ExecRequest::argv(["true"]);
        let env = sandbox_env(&spec, [("HTTPS_PROXY".into(), "tier".into())], &req);
        assert_eq!(env["PATH"], "/opt/py/bin:/usr/bin");
        assert_eq!(env["HOME"], "/work");
        assert_eq!(env["HTTPS_PROXY"], "tier");
        assert_eq!(env["IMAGE_ONLY"], "1");
    }

    #[test]
    fn exit_codes_per_reason() {
        let mut o = ExecOutcome::new(Tier::Container, Termination::Exited);
        o.exit_code = Some(3);
        assert_eq!(exit_code_for(&o), 3);
        o.termination = Termination::Timeout;
        assert_eq!(exit_code_for(&o), 124);
        o.termination = Termination::Signalled;
        o.signal = Some(11);
        assert_eq!(exit_code_for(&o), 139);
    }

    #[test]
    fn outcome_json_shape() {
        let mut o = ExecOutcome::new(Tier::Container, Termination::OutOfMemory);
        o.stdout = b"hi\xff".to_vec();
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["termination"], "out-of-memory");
        assert_eq!(v["stdout"], "hi\u{fffd}");
        for key in ["exit_code", "signal", "stderr", "usage", "timings", "tier"] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
    }
}
