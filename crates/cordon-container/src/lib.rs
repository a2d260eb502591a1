//! Cordon's `container` tier: fresh user, PID, mount, network, IPC, UTS and cgroup
//! namespaces; `pivot_root` onto a read-only root built from the host's `/usr`; a seccomp
//! filter kept as data; Landlock; cgroups v1 and v2; rlimits; an unprivileged user with no
//! capabilities and `no_new_privs`. Fails closed when a layer cannot be applied.
//!
//! Host side: [`ContainerBackend`] creates sandboxes. Sandbox side: the `cordon-sandbox-init`
//! binary ([`init::main`]) builds the sandbox and runs the agent from `cordon-guest`.

mod backend;
mod snapshot;
mod sys;

pub use backend::{ContainerBackend, ContainerConfig, ContainerSandbox, INIT_BINARY, Terminal};
/// Who a program started with [`ContainerSandbox::start_attached`] runs as.
pub use cordon_guest::proto::ProcUser;
// The host side shared with the other native tiers lives in cordon-host; the sandbox side
// (the init, its seccomp filter and Landlock rules) in cordon-sandbox-init.
use cordon_host::{cgroup, egress, idpool};
pub use cordon_sandbox_init::{init, landlock_rules, seccomp};
