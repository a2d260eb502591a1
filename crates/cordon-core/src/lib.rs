//! Cordon's domain types and the [`Backend`] trait.
//!
//! Every isolation tier (wasm, container, gvisor, microvm, ...) implements [`Backend`]:
//! probe what the host can do, create a sandbox from a [`SandboxSpec`], exec in it while
//! streaming output, move files in and out, destroy it. Create and exec are separate so warm
//! pools and multi-step tasks work. This crate never touches the OS.

mod backend;
mod error;
mod exec;
pub mod report;
mod run;
mod spec;
pub mod units;

pub use backend::{
    Backend, Capability, Interrupter, OutputSink, Probe, Sandbox, SandboxId, TierStatus,
};
pub use error::{Error, Result};
pub use exec::{
    Command, ExecOutcome, ExecRequest, OutputStream, SANDBOX_PATH, Termination, Timings, Usage,
    exit_code_for, sandbox_env,
};
pub use report::{
    Details, EgressDecision, EgressEvent, EgressFold, EgressKind, Finding, FindingKind,
};
pub use run::{FileIn, FileOut, run_once};
pub use spec::{
    EgressPolicy, Grant, GrantSecret, Language, Limits, MintedToken, SandboxSpec, SecretValue,
    Tier, TokenMinter, WORKDIR, Weakening, default_grant_header, validate_sandbox_path,
};
