//! The record of a gate's decision, for the audit row: who asked for what, under which
//! ceiling, and what was decided (or which rule refused it and why).

use std::collections::BTreeSet;

use cordon_core::{Limits, Tier, Weakening};
use cordon_policy::{Autonomy, Trust};
use serde::Serialize;

/// How a refusal is answered (the HTTP status follows from it; the CLI exits 125).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyCode {
    /// The request is malformed or self-contradictory (400).
    InvalidRequest,
    /// A rule of the operator's ceiling or the tier policy refuses it (403).
    PolicyDenied,
    /// The tier cannot run here (422).
    TierUnavailable,
    /// A catalogue grant's secret cannot be had right now (503).
    GrantUnavailable,
}

impl DenyCode {
    pub fn as_str(self) -> &'static str {
        match self {
            DenyCode::InvalidRequest => "invalid_request",
            DenyCode::PolicyDenied => "policy_denied",
            DenyCode::TierUnavailable => "tier_unavailable",
            DenyCode::GrantUnavailable => "grant_unavailable",
        }
    }
}

/// A grant in a decision record: its name and hosts, never its secret or source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantRecord {
    pub name: String,
    pub hosts: Vec<cordon_core::Pattern>,
    pub minted: bool,
}

/// A template in a decision record: its name and the digest it resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateRecord {
    pub name: String,
    pub digest: String,
}

/// The whole decision, for the audit row (allowed or refused).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateRecord {
    /// `create` or `run`.
    pub request: String,
    pub principal: String,
    /// The trust the operator gives the principal, and what the request asked for.
    pub trust_ceiling: Trust,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<Trust>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autonomy: Option<Autonomy>,
    pub allowed_tiers: Vec<Tier>,
    pub egress_ceiling: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    pub allow_hosts: Vec<String>,
    pub deny_hosts: Vec<String>,
    pub grants: Vec<GrantRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateRecord>,
    pub allow_weaker: BTreeSet<Weakening>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// The rule that refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<super::GateRule>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The tier policy's decision (or refusal), where it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_policy: Option<PolicyOutcome>,
    /// What the node's operator allowed this request by naming it exactly (cordon-oci's
    /// `[allow]` entries), marked on the decision as `allow_weaker` is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_allowances: Vec<NodeAllowance>,
}

/// One exact thing a node's operator allowed a container that Cordon refuses by default
/// (docs/kubernetes.md, "The node's allowances"); recorded with the gate's decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeAllowance {
    /// A host device node bound at the same path in the sandbox's `/dev`.
    Device {
        path: String,
        /// `c` or `b`.
        device_type: String,
        major: i64,
        minor: i64,
    },
    /// A host directory bound at `at` under `/work`, read-only unless `writable`.
    HostPath {
        path: String,
        at: String,
        writable: bool,
    },
    /// A capability the bundle lists, accepted; the program still holds none.
    Capability { name: String },
    /// A host namespace the bundle asks for, accepted; the workload runs in its own.
    HostNamespace { namespace: String },
}

/// What the tier policy said.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PolicyOutcome {
    Decided(Box<cordon_policy::Decision>),
    Refused(Box<cordon_policy::Refusal>),
}
