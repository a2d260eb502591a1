//! E2B's message types, written from the field names of its published protocol (the
//! control plane's OpenAPI schemas, envd's `process` and `filesystem` protos in proto3 JSON,
//! the code interpreter's NDJSON lines). Requests tolerate fields Cordon does not read (the
//! SDKs add fields release by release); the ones Cordon cannot honour are read so that they
//! can be refused by name.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

// ---- control plane -----------------------------------------------------------------

/// `POST /sandboxes`, `POST /v2/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed.
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Paused instead of killed at its timeout (the SDK's `lifecycle.on_timeout: pause`).
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// `false` asks a timeout's pause to keep the files only; Cordon's pause keeps all.
    #[serde(default)]
    pub auto_pause_memory: Option<bool>,
    /// Woken by the next request when paused (`lifecycle.auto_resume`).
    #[serde(default)]
    pub auto_resume: Option<AutoResume>,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub network: Option<Network>,
    #[serde(default)]
    pub volume_mounts: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    pub mcp: Option<IgnoredAny>,
    #[serde(default)]
    pub secrets: Option<IgnoredAny>,
}

/// `autoResume` of a create.
#[derive(Debug, Default, Deserialize)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

/// `lifecycle` of a sandbox's info, as E2B's SDKs read it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: &'static str,
}

/// A sandbox's network settings as E2B's SDKs send them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    /// The `Host` requests for the sandbox's ports carry (`${PORT}` is the port).
    #[serde(default)]
    pub mask_request_host: Option<String>,
    /// Per-host request rewrites (E2B injects credentials this way).
    #[serde(default)]
    pub rules: Option<IgnoredAny>,
    #[serde(default)]
    pub egress_proxy: Option<IgnoredAny>,
}

/// `POST /sandboxes/{id}/connect` and its `/v2` twin.
#[derive(Debug, Default, Deserialize)]
pub struct ConnectBody {
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct TimeoutBody {
    pub timeout: u64,
}

/// What create and connect answer (E2B's `Sandbox` schema).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxOut {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: &'static str,
    pub envd_access_token: String,
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
    pub alias: Option<String>,
}

/// One sandbox as `GET /sandboxes/{id}` and the list answer it (`SandboxDetail`,
/// `ListedSandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub alias: Option<String>,
    pub started_at: String,
    pub end_at: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub envd_version: &'static str,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub lifecycle: Lifecycle,
}

/// E2B's error body: always JSON, the HTTP status again as `code`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

/// The body E2B's proxy answers for a sandbox it cannot reach (502); the SDKs key on its
/// message.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NotFoundBody {
    pub sandbox_id: String,
    pub message: &'static str,
    pub code: u16,
}

// ---- envd: process -----------------------------------------------------------------

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PtySizeMsg {
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PtyMsg {
    #[serde(default)]
    pub size: Option<PtySizeMsg>,
}

#[derive(Debug, Deserialize)]
pub struct StartRequest {
    pub process: ProcessConfig,
    #[serde(default)]
    pub pty: Option<PtyMsg>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// A process named by its pid or its tag.
#[derive(Debug, Default, Deserialize)]
pub struct ProcessSelector {
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ProcessRequest {
    pub process: ProcessSelector,
}

#[derive(Debug, Default, Deserialize)]
pub struct ProcessInput {
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub pty: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    #[serde(default)]
    pub input: ProcessInput,
}

#[derive(Debug, Deserialize)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    pub signal: String,
}

#[derive(Debug, Deserialize)]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    #[serde(default)]
    pub pty: Option<PtyMsg>,
}

/// One message of the `StreamInput` client stream.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputMsg {
    Start { process: ProcessSelector },
    Data { input: ProcessInput },
    Keepalive {},
}

#[derive(Debug, Serialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// An empty message (`{}`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Empty {}

/// One event of a process stream: `{"event": {...}}`.
#[derive(Debug, Serialize)]
pub struct EventMsg {
    pub event: ProcessEvent,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive {},
}

/// Output, base64: one of the three.
#[derive(Debug, Default, Serialize)]
pub struct DataEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    /// proto3 JSON leaves a zero out.
    #[serde(skip_serializing_if = "is_zero")]
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

// ---- envd: filesystem --------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Deserialize)]
pub struct ListDirRequest {
    pub path: String,
    #[serde(default)]
    pub depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    /// int64: a string in proto3 JSON.
    pub size: String,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    pub modified_time: String,
    /// The entry is a symlink (envd ≥ 0.6; the pinned SDKs then show it as one).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_symlink: bool,
    /// Where a symlink points, as an absolute path (E2B's form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// The entry's `user.e2b.*` extended attributes, the prefix left off (envd ≥ 0.6.2).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Debug, Serialize)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// `POST /files` answers one of these per file written.
#[derive(Debug, Serialize)]
pub struct WriteInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    /// The metadata the upload stored (envd ≥ 0.6.2); none when it gave none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// `GET /files`, `POST /files`: the query.
#[derive(Debug, Default, Deserialize)]
pub struct FilesQuery {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub signature: Option<String>,
    /// Unix seconds after which the signature is refused.
    #[serde(default)]
    pub signature_expiration: Option<i64>,
}

// ---- code interpreter --------------------------------------------------------------

/// `POST /execute`.
#[derive(Debug, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
pub struct ContextCreate {
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ContextOut {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// One NDJSON line of `/execute`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputLine {
    Stdout {
        text: String,
        timestamp: String,
    },
    Stderr {
        text: String,
        timestamp: String,
    },
    Result(Box<ResultOut>),
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    NumberOfExecutions {
        execution_count: u64,
    },
    EndOfExecution,
    Keepalive,
}

/// A rich output: each MIME type the SDKs know under its own field, the rest in `extra`.
#[derive(Debug, Default, Serialize)]
pub struct ResultOut {
    pub is_main_result: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    /// The JSON output passed through as the interpreter gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// A DataFrame's columns (E2B's `data`), passed through as the driver gave them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// A shown figure's chart data (E2B's `chart`), passed through as the driver gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_protocols_shape() {
        let start = serde_json::to_string(&EventMsg {
            event: ProcessEvent::Start { pid: 7 },
        })
        .unwrap();
        assert_eq!(start, r#"{"event":{"start":{"pid":7}}}"#);
        let end = serde_json::to_string(&EventMsg {
            event: ProcessEvent::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
        })
        .unwrap();
        assert_eq!(
            end,
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
        );
        let ka = serde_json::to_string(&EventMsg {
            event: ProcessEvent::Keepalive {},
        })
        .unwrap();
        assert_eq!(ka, r#"{"event":{"keepalive":{}}}"#);
        let line = serde_json::to_string(&OutputLine::EndOfExecution).unwrap();
        assert_eq!(line, r#"{"type":"end_of_execution"}"#);
        let line =
            serde_json::to_string(&OutputLine::NumberOfExecutions { execution_count: 3 }).unwrap();
        assert_eq!(
            line,
            r#"{"type":"number_of_executions","execution_count":3}"#
        );
    }

    #[test]
    fn stream_input_messages_parse() {
        let m: StreamInputMsg = serde_json::from_str(r#"{"start":{"process":{"pid":3}}}"#).unwrap();
        assert!(matches!(m, StreamInputMsg::Start { process } if process.pid == Some(3)));
        let m: StreamInputMsg =
            serde_json::from_str(r#"{"data":{"input":{"stdin":"aGk="}}}"#).unwrap();
        assert!(
            matches!(m, StreamInputMsg::Data { input } if input.stdin.as_deref() == Some("aGk="))
        );
    }
}
