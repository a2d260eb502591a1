//! Host side of the microvm tier, one module per verb. Each module uses only those listed
//! above it:
//! - `accel`: KVM or TCG, and the TCG warning;
//! - `config`: where the tier keeps its files and how VMs start;
//! - `state`: the backend's and a sandbox's state, their accessors;
//! - `cleanup`: a VM's teardown and the diagnosis of one that went away;
//! - `agent`: the guest agent's connection (calls, hello, configure);
//! - `exec`: running programs (foreground and background);
//! - `files`: files in and out;
//! - `pause`: pause and resume, in memory or on disk, and reviving a paused sandbox;
//! - `snapshot`: the snapshots new sandboxes are restored from;
//! - `create`: booting or restoring a new sandbox;
//! - `fork`: full snapshots of a live sandbox, and sandboxes started from one;
//! - `tier`: the `Backend` and `Sandbox` traits over the verbs.

mod accel;
mod agent;
mod cleanup;
mod config;
mod create;
mod exec;
mod files;
mod fork;
mod pause;
mod snapshot;
mod state;
mod tier;

pub use accel::probe_accel;
pub use config::MicrovmConfig;
pub use state::{MicrovmBackend, MicrovmSandbox};
