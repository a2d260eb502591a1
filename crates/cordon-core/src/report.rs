//! What an outcome reports beside the program's own results, typed: scan findings, egress
//! decisions (grant uses among them), and how a failed sandbox failed.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What a decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressDecision {
    /// The request or tunnel was let through.
    Allow,
    /// Refused by policy (deny entry, default deny, address guard, grant scope, ...).
    Deny,
    /// A credential placeholder was on its way to a host its grant does not cover.
    Exfiltration,
    /// A per-sandbox limit ended the request or connection.
    Limit,
    /// The upstream could not be reached or answered badly.
    Error,
    /// A connection ended (carries byte counts and the reason).
    Closed,
}

/// What kind of traffic the event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressKind {
    /// An absolute-form plain-HTTP request.
    Http,
    /// A CONNECT request (opaque tunnel or TLS terminated).
    Connect,
    /// A request inside a TLS connection the proxy terminated.
    Https,
    /// A client connection as a whole.
    Connection,
}

/// One audit event. `path` never includes the query string; no header value is ever logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The sandbox this proxy serves.
    pub sandbox: String,
    /// Client connection number within this proxy, from 1.
    pub conn: u64,
    /// What kind of traffic.
    pub kind: EgressKind,
    /// The decision.
    pub decision: EgressDecision,
    /// The rule that decided (e.g. `allow api.example.test`, `deny *.evil.test`,
    /// `default-deny`, `address-guard:loopback`, `grant:github`, `limit:bytes_up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A human sentence: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Target host as requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The address the proxy connected to (or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// HTTP method where seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// URL path where seen, without the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Upstream status code, when a response came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The grant whose secret was added to the request (name only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// Whether the proxy terminated TLS for this CONNECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<bool>,
    /// Bytes from the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Bytes to the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
}

impl EgressEvent {
    pub fn new(conn: u64, kind: EgressKind, decision: EgressDecision) -> Self {
        EgressEvent {
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            sandbox: String::new(),
            conn,
            kind,
            decision,
            rule: None,
            reason: None,
            host: None,
            port: None,
            addr: None,
            method: None,
            path: None,
            status: None,
            grant: None,
            terminated: None,
            bytes_up: None,
            bytes_down: None,
        }
    }
}

impl EgressDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            EgressDecision::Allow => "allow",
            EgressDecision::Deny => "deny",
            EgressDecision::Exfiltration => "exfiltration",
            EgressDecision::Limit => "limit",
            EgressDecision::Error => "error",
            EgressDecision::Closed => "closed",
        }
    }
}

/// What kind of thing a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A real secret value the host knows (raw, base64 or hex): always redacted.
    KnownSecret,
    /// A PEM private key block.
    PrivateKey,
    /// An AWS access key id (`AKIA...`, `ASIA...`).
    AwsAccessKeyId,
    /// A GitHub token (`ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_`, `github_pat_`).
    GithubToken,
    /// A GitLab personal access token (`glpat-`).
    GitlabToken,
    /// A Slack token (`xoxb-`, `xoxp-`, ...) or incoming webhook URL.
    SlackToken,
    /// A Stripe secret or restricted key (`sk_live_`, `rk_test_`, ...).
    StripeKey,
    /// A Google API key (`AIza...`).
    GoogleApiKey,
    /// An OpenAI or Anthropic API key (`sk-...`, `sk-ant-...`).
    AiApiKey,
    /// A JSON Web Token.
    Jwt,
}

/// One finding. Offsets refer to the scanned input; the matched value is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What was found.
    pub kind: FindingKind,
    /// For known secrets, the secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Byte offset in the input.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Whether it was replaced in the output.
    pub redacted: bool,
    /// Where it was found: the output stream (`stdout`, `stderr`) or the file taken out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// The details of one outcome (serialized as its `extra` object).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Details {
    /// Credential formats and known secrets found in what left the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// Every egress decision since the last outcome (a grant's use is an `allow` with
    /// `grant` set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressEvent>,
    /// How the sandbox failed, where the tier knows (`agent-protocol`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The accelerator a microVM ran on (`kvm`, `tcg`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
}

impl Details {
    pub fn is_empty(&self) -> bool {
        *self == Details::default()
    }

    /// Adds what a later report says (lists appended, the rest replaced where given).
    pub fn merge(&mut self, more: Details) {
        self.findings.extend(more.findings);
        self.egress.extend(more.egress);
        if more.failure.is_some() {
            self.failure = more.failure;
        }
        if more.accelerator.is_some() {
            self.accelerator = more.accelerator;
        }
    }
}
