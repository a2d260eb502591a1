//! Cordon's request pipeline and its gate, shared by every front door (`cordon run`, the
//! HTTP API, MCP). No HTTP and no async runtime at its API: a front door builds one
//! [`SandboxRequest`], asks the [`Gate`] for an [`Admission`] (or gets a [`Denial`] naming
//! the rule and the fix), holds a place in the [`Ledger`], and hands the spec to a backend.
//!
//! The gate applies the operator's ceiling ([`ceiling`]): per tenant the trust the
//! operator gives it (a request may lower it, never raise it), the tiers open to it, the
//! egress entries it may allow (non-public ranges only where the operator names them),
//! the grants of the operator's [`catalogue`] it may use, and budgets. Grant secrets come
//! from the catalogue alone: a request names grants, never a secret or where one lives.
//! Catalogue grants may forward a stored secret or mint a short-lived token per sandbox
//! ([`tokens`]).

pub mod audit;
pub mod catalogue;
pub mod ceiling;
mod error;
pub mod gate;
pub mod ledger;
pub mod request;
pub mod tokens;

pub use catalogue::Catalogue;
pub use ceiling::{CeilingConfig, GrantEntry, Resolved, TenantRules};
pub use error::GateError;
pub use gate::{
    Admission, Denial, DenyCode, Gate, GateRecord, GateRule, GateSettings, NodeAllowance,
    RulesSource, workload_of,
};
pub use ledger::{BudgetLimits, Full, Ledger, Reservation, host_memory_budget};
pub use request::{
    GrantName, LimitsPatch, OnTimeout, Principal, SandboxRequest, VolumeRequest, Workload,
    may_use_template, tenant_template_name,
};
pub use tokens::{Discovery, Introspection, Issuer, Jwks};
