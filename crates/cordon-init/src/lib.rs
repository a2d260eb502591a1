//! The container tier's sandbox init, as a crate of its own so its dependency graph is what
//! the binary carries (no proxy, no async runtime, no cgroup library): it builds the sandbox
//! (namespaces on the host's id maps, the root, the egress files) and runs Cordon's agent
//! from `cordon-guest`, with the seccomp filter (compiled at build time) and the Landlock
//! ruleset applied to every exec. The host side (`cordon-container`) uses its setup types.

mod frames;
pub mod init;
pub mod landlock_rules;
mod root;
pub mod seccomp;
mod seccomp_tree;
mod sys;
mod volumes;

/// Errors of the init's policies, converted by the container tier at its API boundary.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("seccomp: {0}")]
    Seccomp(String),
}
