//! Checks shared by the tiers' integration tests, so that every tier is held to the same
//! probe rather than to its own copy of it: the escape battery's tier-neutral probes
//! ([`escape`]) and the egress path ([`egress`]). Each check runs real sandboxes through the
//! [`cordon_core::Backend`] trait and panics with what it saw; test support only, never part
//! of Cordon itself. [`procs`] finds processes left running by a given binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod egress;
pub mod escape;
pub mod procs;

use cordon_core::{Backend, ExecOutcome, ExecRequest, OutputStream, SandboxSpec};

/// Runs one request in a fresh sandbox and destroys it.
pub fn run_once(b: &dyn Backend, spec: &SandboxSpec, req: &ExecRequest) -> ExecOutcome {
    let mut sb = b.create(spec).unwrap();
    let o = sb.exec(req, &mut |_: OutputStream, _: &[u8]| {}).unwrap();
    sb.destroy().unwrap();
    o
}

pub fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}
