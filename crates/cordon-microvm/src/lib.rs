//! Cordon's `microvm` tier: each sandbox is a QEMU `microvm` virtual machine with its own
//! guest kernel (Debian's cloud kernel), a read-only Debian root with Python 3, size-limited
//! tmpfs for `/work` and `/tmp`, and the `cordon-guest` agent as init, spoken to over a
//! virtio-serial port with the versioned frame protocol of `cordon_guest::proto`.
//!
//! The accelerator is chosen by a probe: KVM only where hardware virtualization is really
//! usable (VMX/SVM present, not the paravirtual `kvm_pvm`); otherwise TCG, with a loud
//! warning in every result, in `cordon doctor` and in the logs. QEMU runs confined: its own
//! seccomp sandbox (`-sandbox on,...`), an unprivileged user, its own cgroup, new mount,
//! network, IPC and UTS namespaces, no NIC. Egress, when a spec allows it, runs over a
//! second virtio-serial port to a per-sandbox proxy on the host (see `egress`).
//!
//! New sandboxes are restored from a snapshot of a VM booted once to "agent ready" (QEMU
//! migration to a file); each is then configured with its own identity, limits, clock and
//! fresh randomness before it is handed out.

mod backend;
mod egress;
mod error;
pub mod image;
mod paused;
mod qemu;
mod seccomp;
mod snapshots;
mod sys;

pub use backend::{MicrovmBackend, MicrovmConfig, MicrovmSandbox, probe_accel};
pub use egress::EgressTuning;
pub use error::MicrovmError;
pub use qemu::{Accel, BARE_MACHINE};
