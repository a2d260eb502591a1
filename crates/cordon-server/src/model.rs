//! Request and response bodies of the API (and the MCP tools). Unknown fields are refused.

use std::collections::BTreeMap;

use base64::Engine as _;
use cordon_core::{Command, ExecRequest, Language, Limits, Tier};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ApiError;
use cordon_core::units::Dur;

fn de_lang<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Language>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    s.map(|s| s.parse::<Language>().map_err(serde::de::Error::custom))
        .transpose()
}

pub use cordon_engine::{GrantName, LimitsPatch};

/// `POST /v1/sandboxes`: the engine's one request type.
pub type CreateRequest = cordon_engine::SandboxRequest;

/// What to run: code in a language, an argv, or a WebAssembly module.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    #[serde(default, deserialize_with = "de_lang")]
    pub lang: Option<Language>,
    #[serde(default)]
    pub code: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A WASI module or component, base64 (wasm tier).
    #[serde(default)]
    pub wasm_base64: Option<String>,
    /// Arguments after the code or module.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Standard input as text.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Standard input as base64.
    #[serde(default)]
    pub stdin_base64: Option<String>,
    /// Timeout of this exec (`"5s"` or seconds); at most the server's limit.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Stream events as NDJSON (also chosen by `Accept: application/x-ndjson`).
    #[serde(default)]
    pub stream: bool,
    /// Start it in the background: the answer is the exec's id at once; attach with
    /// `GET /v1/sandboxes/{id}/execs/{exec_id}`.
    #[serde(default)]
    pub background: bool,
    /// A background exec on a pseudo-terminal of `{rows, cols}` (each 1 to 1000): its
    /// stdin, stdout and stderr; resize it with `POST .../execs/{exec_id}/resize`.
    #[serde(default)]
    pub pty: Option<cordon_core::PtySize>,
}

/// A background exec's new terminal size.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    pub rows: u16,
    pub cols: u16,
}

/// A background exec as listed.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExecInfo {
    pub id: String,
    /// What it runs: the argv, or the language and the code's first line (at most 200
    /// characters).
    pub command: String,
    /// `running` or `exited`.
    pub state: String,
    pub started_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Its pseudo-terminal's size, when it runs on one (the last resize's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<cordon_core::PtySize>,
}

/// A background exec's output so far, read without waiting (MCP's read_exec).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ExecPeek {
    #[serde(flatten)]
    pub info: ExecInfo,
    pub stdout: String,
    pub stderr: String,
    /// Bytes of each stream dropped before these (the sandbox keeps the last 1 MiB).
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// Bytes for a background exec's stdin.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinBody {
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub data_base64: Option<String>,
    /// Close stdin after these bytes (the program sees end of file).
    #[serde(default)]
    pub close: bool,
}

impl StdinBody {
    pub fn bytes(&self) -> Result<Vec<u8>, ApiError> {
        match (&self.data, &self.data_base64) {
            (Some(_), Some(_)) => Err(ApiError::invalid("give data or data_base64, not both")),
            (Some(t), None) => Ok(t.clone().into_bytes()),
            (None, Some(b)) => b64("data_base64", b),
            (None, None) => Ok(Vec::new()),
        }
    }
}

fn b64(what: &str, s: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| ApiError::invalid(format!("{what} is not valid base64: {e}")))
}

impl ExecBody {
    /// The core request, or why the body does not name one thing to run.
    pub fn to_request(&self) -> Result<ExecRequest, ApiError> {
        let command = match (&self.lang, &self.code, &self.argv, &self.wasm_base64) {
            (Some(language), Some(source), None, None) => Command::Code {
                language: *language,
                source: source.clone(),
                args: self.args.clone(),
            },
            (None, None, Some(argv), None) => {
                if argv.is_empty() {
                    return Err(ApiError::invalid("argv is empty; give a program to run"));
                }
                let mut v = argv.clone();
                v.extend(self.args.iter().cloned());
                Command::Argv(v)
            }
            (None, None, None, Some(m)) => Command::Wasm {
                module: b64("wasm_base64", m)?,
                args: self.args.clone(),
            },
            (None, Some(_), None, None) => {
                return Err(ApiError::invalid(
                    "code given without lang; add \"lang\": python, bash, sh or javascript",
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    "give exactly one thing to run: lang + code, argv, or wasm_base64",
                ));
            }
        };
        let stdin = match (&self.stdin, &self.stdin_base64) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give stdin or stdin_base64, not both"));
            }
            (Some(s), None) => Some(s.clone().into_bytes()),
            (None, Some(b)) => Some(b64("stdin_base64", b)?),
            (None, None) => None,
        };
        Ok(ExecRequest {
            command,
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            stdin,
            timeout_ms: self.timeout.map(|d| d.0.as_millis() as u64),
            pty: self.pty,
            last: false,
        })
    }
}

/// A file placed in a one-shot run's sandbox before the exec.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub path: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub content_base64: Option<String>,
    #[serde(default)]
    pub mode: Option<u32>,
}

impl RunFile {
    pub fn bytes(&self) -> Result<Vec<u8>, ApiError> {
        match (&self.content, &self.content_base64) {
            (Some(t), None) => Ok(t.clone().into_bytes()),
            (None, Some(b)) => b64("content_base64", b),
            _ => Err(ApiError::invalid(format!(
                "file {:?}: give content or content_base64",
                self.path
            ))),
        }
    }
}

/// `POST /v1/run`: create, exec once, destroy. Its sandbox half is the create's own body
/// (`POST /v1/sandboxes`) less the fields of a sandbox's life (ttl, idle_timeout,
/// on_timeout, labels, volumes): a one-shot run's sandbox lives for its exec.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = without_life_fields)]
pub struct RunRequest {
    /// The create's own type, flattened: a new create field is written once
    /// (`CreateRequest::LIFE_FIELDS` are refused and left out of the schema).
    #[serde(flatten)]
    pub create: CreateRequest,
    #[serde(default)]
    pub files: Vec<RunFile>,
    #[serde(default, deserialize_with = "de_lang")]
    pub lang: Option<Language>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub wasm_base64: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub stdin_base64: Option<String>,
    #[serde(default)]
    pub timeout: Option<Dur>,
    #[serde(default)]
    pub stream: bool,
}

/// The run body's schema: the create's properties but those a run refuses.
fn without_life_fields(schema: &mut schemars::Schema) {
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for f in CreateRequest::LIFE_FIELDS {
            props.remove(f);
        }
    }
}

impl RunRequest {
    /// The create, the exec and the files; refused when it gives a field of a sandbox's
    /// life, which a one-shot run has none of.
    pub fn split(self) -> Result<(CreateRequest, ExecBody, Vec<RunFile>), ApiError> {
        if let Some(f) = self.create.life_fields_given().first() {
            return Err(ApiError::new(
                crate::error::Code::InvalidRequest,
                format!("{f} is not a field of a one-shot run: its sandbox lives for its exec"),
                format!(
                    "leave {f} out, or create a sandbox (POST /v1/sandboxes) with it and exec in that"
                ),
            ));
        }
        let exec = ExecBody {
            lang: self.lang,
            code: self.code,
            argv: self.argv,
            wasm_base64: self.wasm_base64,
            args: self.args,
            env: BTreeMap::new(),
            cwd: None,
            stdin: self.stdin,
            stdin_base64: self.stdin_base64,
            timeout: self.timeout,
            stream: self.stream,
            background: false,
            pty: None,
        };
        Ok((self.create, exec, self.files))
    }
}

/// What the API says about one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub tier: Tier,
    /// `live`, `destroying` (its teardown is running) or `destroyed`.
    pub state: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub idle_timeout_ms: u64,
    pub last_used_ms: i64,
    pub limits: Limits,
    pub allow_hosts: Vec<String>,
    /// `pool` (a warm, never-used sandbox) or `cold`.
    pub source: String,
    /// Microseconds to create it (0 when it came from the warm pool).
    pub start_us: u64,
    pub busy: bool,
    /// Its processes are stopped (POST .../pause); `state` is `paused` too.
    pub paused: bool,
    /// Paused to disk (`{"to_disk": true}`, microvm: it outlives a server restart) or to its
    /// files (`{"files_only": true}`): it holds no memory and no CPU on the host, only
    /// `on_disk_bytes` of disk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_disk: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_disk_bytes: Option<u64>,
    /// How many times a resume started it again from its files (a pause to files): its
    /// processes, code contexts and background execs are those of its last start only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// What its TTL or idle timeout does, when not `destroy`.
    #[serde(default, skip_serializing_if = "cordon_engine::OnTimeout::is_destroy")]
    pub on_timeout: cordon_engine::OnTimeout,
    /// The labels given at create.
    pub labels: BTreeMap<String, String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most labels a sandbox carries, and the longest key and value.
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_KEY: usize = 63;
pub const MAX_LABEL_VALUE: usize = 256;

/// Checks a sandbox's labels: at most [`MAX_LABELS`], keys of 1 to [`MAX_LABEL_KEY`] ASCII
/// letters, digits and `._-/` starting with a letter or digit, values of at most
/// [`MAX_LABEL_VALUE`] characters without control characters.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if labels.len() > MAX_LABELS {
        return Err(ApiError::invalid(format!(
            "{} labels; a sandbox carries at most {MAX_LABELS}",
            labels.len()
        )));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_LABEL_KEY
            && k.as_bytes()[0].is_ascii_alphanumeric()
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(ApiError::invalid(format!(
                "label key {k:?} is not valid: 1 to {MAX_LABEL_KEY} letters, digits, '.', '_', '-' or '/', starting with a letter or digit"
            )));
        }
        if v.chars().count() > MAX_LABEL_VALUE || v.chars().any(char::is_control) {
            return Err(ApiError::invalid(format!(
                "the value of label {k:?} must be at most {MAX_LABEL_VALUE} characters without control characters"
            )));
        }
    }
    Ok(())
}

/// `POST /v1/sandboxes/{id}/pause`: an optional body; without one the sandbox is paused in
/// memory.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Save the whole sandbox to disk and let go of its memory (microvm only).
    #[serde(default)]
    pub to_disk: bool,
    /// Keep its files only (the tiers with filesystem snapshots: container, gvisor): the
    /// workspace and what the root let it write stay on disk, its processes end and its
    /// memory is let go; a resume starts it again from its files under the same id, as a
    /// machine boots again (no process, code context or watcher of before).
    #[serde(default)]
    pub files_only: bool,
}

/// `PATCH /v1/sandboxes/{id}`: a new TTL (counted from the sandbox's creation, paused time
/// not counted) or idle timeout, within the server's maxima.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    #[serde(default)]
    pub ttl: Option<Dur>,
    #[serde(default)]
    pub idle_timeout: Option<Dur>,
}

/// `POST /v1/sandboxes/{id}/contexts`: a long-lived interpreter for code cells.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextBody {
    /// `python`, `javascript`, `typescript` (`ts`) or `bash`.
    pub lang: String,
    /// The sandbox's default context of this language: answered if it exists, made if not
    /// (what `run_code` without a context uses).
    #[serde(default)]
    pub default: bool,
    /// The directory its interpreter starts in (an absolute path that exists in the
    /// sandbox); default the workspace, `/work`. Not for a default context.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// The language of a code context's cells; `typescript` cells are turned into JavaScript
/// before Node runs them (ADR 0043).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextLang {
    Python,
    Javascript,
    Typescript,
    Bash,
}

impl ContextLang {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextLang::Python => "python",
            ContextLang::Javascript => "javascript",
            ContextLang::Typescript => "typescript",
            ContextLang::Bash => "bash",
        }
    }
}

impl std::str::FromStr for ContextLang {
    type Err = ApiError;
    fn from_str(s: &str) -> Result<Self, ApiError> {
        match s {
            "python" | "python3" | "py" => Ok(ContextLang::Python),
            "javascript" | "js" | "node" => Ok(ContextLang::Javascript),
            "typescript" | "ts" => Ok(ContextLang::Typescript),
            "bash" => Ok(ContextLang::Bash),
            _ => Err(ApiError::invalid(format!(
                "a code context runs python, javascript, typescript or bash, not {s:?}"
            ))),
        }
    }
}

/// A code context as listed.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ContextInfo {
    pub id: String,
    pub lang: ContextLang,
    /// The sandbox's default context of its language.
    pub default: bool,
    /// The directory its interpreter started in.
    pub cwd: String,
    /// `ready`, `running` (a cell is running) or `dead` (its interpreter could not be
    /// started again: restart it or delete it).
    pub state: String,
    pub created_ms: i64,
    /// When its current interpreter started (a restart starts a new one).
    pub started_ms: i64,
    /// Cells run in its current interpreter.
    pub execution_count: u64,
    /// The interpreter's version (`3.11.2`, `v20.20.2`).
    pub version: String,
    /// How many times its interpreter was started again (restart, death, stuck cell).
    pub restarts: u64,
}

/// `POST /v1/sandboxes/{id}/contexts/{context_id}/run`: one cell.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CellBody {
    pub code: String,
    /// The cell's timeout (`"5s"` or seconds); default the sandbox's timeout, at most the
    /// server's limit.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Stream events as NDJSON (also chosen by `Accept: application/x-ndjson`).
    #[serde(default)]
    pub stream: bool,
    /// Environment variables set for this cell only: the context's own values (or their
    /// absence) come back when the cell ends.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Interrupt the cell when the reader of its streamed output goes away (E2B's
    /// interpreter does; set by the E2B listener, not part of the native API).
    #[serde(skip)]
    #[schemars(skip)]
    pub interrupt_when_unread: bool,
}

/// One rich output of a cell: MIME type to data (binary types base64, JSON as its text).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct CellOutput {
    /// The value of the cell's last expression (at most one per cell).
    pub main: bool,
    pub data: BTreeMap<String, String>,
}

/// A cell's standard output and error, in the order each was written: pieces as they
/// arrived, joined so that every item but the last ends a line.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellLogs {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

/// How a cell ended, as the driver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CellStatus {
    /// It ran to its end.
    Ok,
    /// It raised (threw) an error: `error` says which.
    Error,
    /// It ran past its timeout and was interrupted; the context keeps its state.
    Timeout,
    /// The interpreter ended during the cell (out of memory, killed, crashed, or stuck past
    /// the grace after its timeout); a fresh one was started in its place.
    Died,
}

impl CellStatus {
    /// As it is written on the wire and in the audit.
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Timeout => "timeout",
            CellStatus::Died => "died",
        }
    }
}

/// A cell's error: the exception's (or thrown value's) name, its value and the traceback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CellError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// What a cell did.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellResult {
    pub context: String,
    /// `ok`, `error`, `timeout` (interrupted; the context keeps its state) or `died` (the
    /// interpreter ended: out of memory, killed, or stuck past the grace after its
    /// timeout; `restarted` says whether a fresh one took its place).
    pub status: CellStatus,
    /// The text of the last expression's value (`text/plain` of the main output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub results: Vec<CellOutput>,
    pub logs: CellLogs,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<CellError>,
    /// The cell's number in this interpreter (0 when it died).
    pub execution_count: u64,
    /// A fresh interpreter replaced the one that died: earlier state is gone.
    pub restarted: bool,
    pub duration_us: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `POST /v1/volumes`'s body.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreate {
    /// 1 to 63 of `a-z 0-9 _ -`, starting with a letter or digit; unique per tenant.
    pub name: String,
    /// Its quota: the file system's size (`"256M"` or bytes), at least 8 MiB.
    pub size: cordon_core::units::Size,
}

/// One volume as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeInfo {
    pub name: String,
    /// Its quota in bytes: writes past it fail with ENOSPC inside the sandbox.
    pub size: u64,
    /// Bytes of the server's disk it holds now (it grows as it is written, up to `size`).
    pub used: u64,
    pub created_ms: i64,
    /// The sandboxes mounting it now.
    pub mounts: Vec<VolumeMountInfo>,
}

/// A sandbox mounting a volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeMountInfo {
    pub sandbox: String,
    pub read_only: bool,
    pub since_ms: i64,
}

/// `GET /v1/volumes`: the tenant's volumes and its volume ceiling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
    /// The volumes' sizes added up: what counts against `quota_bytes`.
    pub used_bytes: u64,
    /// The most `used_bytes` may be (the operator's `max_volume_bytes` for this tenant).
    pub quota_bytes: u64,
    /// Bytes of the server's disk the volumes hold now.
    pub allocated_bytes: u64,
    /// The most volumes this tenant may have.
    pub max_volumes: usize,
}

/// `GET /v1/sandboxes`: the tenant's live sandboxes.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
    /// Bytes of the server's disk the tenant's sandboxes paused to disk hold.
    pub on_disk_bytes: u64,
}

/// What a destroy did: `already` when the sandbox had been destroyed before this call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Destroyed {
    pub id: String,
    /// Always `destroyed`.
    pub state: String,
    pub already: bool,
}

impl Destroyed {
    pub fn new(id: &str, already: bool) -> Self {
        Destroyed {
            id: id.to_string(),
            state: "destroyed".into(),
            already,
        }
    }
}

/// `DELETE /v1/volumes/{name}`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeDeleted {
    pub name: String,
    pub deleted: bool,
}

/// A file written into a sandbox: its sandbox path and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileWritten {
    pub path: String,
    pub bytes: u64,
}

/// A directory's entries.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<cordon_core::FileEntry>,
    /// More entries than one listing returns (`cordon_core::MAX_LIST_ENTRIES`).
    pub truncated: bool,
}

/// One entry, with the path asked about.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Stat {
    pub path: String,
    #[serde(flatten)]
    pub entry: cordon_core::FileEntry,
}

/// What a remove, rename or mkdir did.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Done {
    pub op: &'static str,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// `GET /v1/sandboxes/{id}/metrics`'s query: the samples taken from `start_ms` to `end_ms`
/// (milliseconds since the Unix epoch; each optional).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
}

/// A sandbox's samples, oldest first.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct MetricsList {
    /// How often a sample is taken, in milliseconds.
    pub interval_ms: u64,
    /// How many samples a sandbox keeps (its newest).
    pub kept: usize,
    pub samples: Vec<MetricSample>,
}

/// One sample of a sandbox's figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub struct MetricSample {
    /// When it was taken, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// CPUs the sandbox may use (its limit, rounded up).
    pub cpu_count: u32,
    /// Its CPU time since the sample before, as a share of `cpu_count` CPUs, in percent.
    pub cpu_used_pct: f64,
    /// Memory charged to it, page cache included, in bytes.
    pub mem_used: u64,
    /// Its memory limit, in bytes.
    pub mem_total: u64,
    /// The page cache part of `mem_used` (a tmpfs workspace's files are there).
    pub mem_cache: u64,
    /// Bytes used on its workspace (0 where the tier cannot tell from the host: microvm).
    pub disk_used: u64,
    /// Its workspace's size limit, in bytes.
    pub disk_total: u64,
}

/// A sandbox's background execs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ExecList {
    pub execs: Vec<ExecInfo>,
}

/// A sandbox's code contexts.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ContextList {
    pub contexts: Vec<ContextInfo>,
}

/// Bytes written to a background exec's stdin.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct StdinWritten {
    pub bytes: u64,
    /// Its stdin was closed after them.
    pub closed: bool,
}

/// `GET /v1/audit`: audit rows, oldest first.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct AuditEvents {
    pub events: Vec<crate::audit::Event>,
}

/// `POST /v1/sandboxes/{id}/snapshots`: a snapshot of a live sandbox.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name of your own for it (1 to 64 of `a-z 0-9 . _ -`), unique among your snapshots;
    /// it then answers to the name as to its id.
    #[serde(default)]
    pub name: Option<String>,
    /// `full` (memory, processes and files) or `filesystem` (files; processes start fresh).
    /// Left out: full where the sandbox's tier can, else filesystem.
    #[serde(default)]
    pub mode: Option<cordon_core::SnapshotMode>,
}

/// What the API says about one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotInfo {
    /// `snap-` and 32 hex digits.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The tier its sandboxes run on (the source's).
    pub tier: Tier,
    pub mode: cordon_core::SnapshotMode,
    /// What it holds on disk, counted in your `max_snapshot_bytes`.
    pub bytes: u64,
    /// The sandbox it was taken of.
    pub source: String,
    pub created_ms: i64,
    /// The source's template, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/snapshots/{id}/sandboxes` (start from a snapshot) and
/// `POST /v1/sandboxes/{id}/fork` (snapshot a live sandbox and start from it at once): each
/// new sandbox is a create through the gate with the source's spec (never wider) and these.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartFromSnapshotRequest {
    /// How many sandboxes, 1 to 20 (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default)]
    pub ttl: Option<cordon_core::units::Dur>,
    #[serde(default)]
    pub idle_timeout: Option<cordon_core::units::Dur>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The sandboxes started from a snapshot: those that started, and why the others did not
/// (each start succeeds or fails on its own, like any create).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct StartedFromSnapshot {
    pub snapshot: String,
    pub sandboxes: Vec<SandboxInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ApiError>,
}

/// `DELETE /v1/snapshots/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotDeleted {
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(body: serde_json::Value) -> Result<RunRequest, String> {
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    #[test]
    fn a_run_body_is_the_create_flattened_less_its_life() {
        let r = run(serde_json::json!({
            "tier": "wasm", "trust": "untrusted", "limits": {"memory_bytes": 1024},
            "env": {"A": "1"}, "allow_hosts": ["a.test"], "template": "t",
            "lang": "python", "code": "print(1)", "stream": true,
            "files": [{"path": "a", "content": "x"}],
        }))
        .unwrap();
        let (create, exec, files) = r.split().unwrap();
        assert_eq!(create.limits.memory_bytes, Some(1024));
        assert_eq!(create.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            (create.allow_hosts.len(), create.template.as_deref()),
            (1, Some("t"))
        );
        assert!(exec.stream && exec.env.is_empty());
        assert_eq!(files.len(), 1);
        // Unknown fields are refused through the flattening, as before it.
        let e = run(serde_json::json!({"code": "1", "bogus": 1})).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        assert!(run(serde_json::json!({"limits": {"bogus": 1}})).is_err());
        // A field of a sandbox's life is refused, saying what to do.
        for (f, v) in [
            ("ttl", serde_json::json!("5m")),
            ("idle_timeout", serde_json::json!(60)),
            ("on_timeout", serde_json::json!("pause")),
            ("labels", serde_json::json!({"a": "b"})),
            (
                "volumes",
                serde_json::json!([{"name": "v", "path": "/work/v"}]),
            ),
        ] {
            let mut body = serde_json::json!({"lang": "python", "code": "1"});
            body[f] = v;
            let e = run(body).unwrap().split().unwrap_err();
            assert!(
                e.message.starts_with(f) && e.fix.contains("POST /v1/sandboxes"),
                "{f}: {e:?}"
            );
        }
    }

    #[test]
    fn the_run_schema_has_every_create_field_but_its_life() {
        let create = schemars::schema_for!(CreateRequest);
        let run = schemars::schema_for!(RunRequest);
        let props = |s: &schemars::Schema| -> BTreeMap<String, serde_json::Value> {
            s.get("properties")
                .and_then(|p| p.as_object())
                .map(|p| p.clone().into_iter().collect())
                .unwrap_or_default()
        };
        let (create, run_props) = (props(&create), props(&run));
        assert!(create.len() > 10, "{create:?}");
        for (name, schema) in &create {
            if CreateRequest::LIFE_FIELDS.contains(&name.as_str()) {
                assert!(
                    !run_props.contains_key(name),
                    "{name} is in the run's schema"
                );
            } else {
                assert_eq!(run_props.get(name), Some(schema), "{name}");
            }
        }
        for f in CreateRequest::LIFE_FIELDS {
            assert!(create.contains_key(f), "{f} is not a create field");
        }
        assert_eq!(
            run.get("additionalProperties"),
            Some(&serde_json::json!(false))
        );
    }
}
