//! The frames the host sends the sandbox init: the id maps ([`InitBegin`]), how the
//! sandbox is built ([`InitSetup`]) and what it joins ([`InitJoin`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::volumes::InitVolume;

/// The host's first frame: enough to make the namespaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBegin {
    /// Host uid/gid that the sandbox's uid/gid 0 maps to; `id_count` ids are mapped.
    pub id_base: u32,
    pub id_count: u32,
    /// A network namespace to join instead of making one (a kubelet's pod's, walled by
    /// cordon-oci before any sandbox joins it: ADR 0029). The init joins it as host root,
    /// before the sandbox's user namespace exists, so nothing in the sandbox holds a
    /// capability over it. Left out: the sandbox's own (loopback only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
}

/// The host's second frame: how the sandbox is built, from the request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitSetup {
    /// The unprivileged user programs run as, inside.
    pub sandbox_uid: u32,
    pub hostname: String,
    pub disk_bytes: u64,
    pub tmp_bytes: u64,
    /// Enforce Landlock (false only when the caller allowed running without it).
    pub landlock: bool,
    /// Seccomp filters to install in each program; none when the caller allowed without.
    pub seccomp: Option<Vec<Vec<u64>>>,
    /// A template's read-only root on the host: the sandbox's root is made from it instead
    /// of the host's `/usr` (docs/templates.md). Left out when none, so a setup without
    /// one reads the same as before templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_root: Option<PathBuf>,
    /// `template_root` is a template build's own working copy (`cordon template build`):
    /// it is the sandbox's root, writable, with Cordon's files bound over it, and Landlock
    /// lets the step write anywhere in it. Never set for a template of the store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template_writable: bool,
    /// Host device nodes the operator allowed by name (cordon-oci's node allowances), as
    /// names under `/dev` (`fuse`, `net/tun`): each bound from the host's `/dev` at the
    /// same path, readable and writable as its own mode says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// How long a reaper readied for the next exec waits for one before the agent lets it
    /// go (`cordon_guest::AgentConfig::standby_idle`), in milliseconds; 0 keeps it.
    /// Left out: `cordon_guest::STANDBY_IDLE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_idle_ms: Option<u64>,
    /// The sandbox's own boot id in each exec's `/proc` (`cordon_guest::proto::BOOT_ID_INSIDE`),
    /// never in a build's writable root; false keeps the host's.
    #[serde(default)]
    pub own_boot_id: bool,
}

/// A name under `/dev` for an extra device: plain components only, never one of the
/// sandbox's own devices or links.
pub(crate) fn check_device_name(name: &str) -> Result<(), String> {
    let plain = !name.is_empty()
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    let first = name.split('/').next().unwrap_or_default();
    let own = DEVICES.contains(&name)
        || ["fd", "stdin", "stdout", "stderr", "ptmx", "pts", "shm"].contains(&first);
    if plain && !own {
        Ok(())
    } else {
        Err(format!(
            "device /dev/{name} cannot be given: not a plain extra device name"
        ))
    }
}

/// What the host tells init once the sandbox's cgroup (and egress proxy) exist; the
/// sandbox's namespaces and most of its root are made while the host prepares them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitJoin {
    /// `cgroup.procs` files the sandbox's first process is moved into before it runs
    /// anything; empty when cgroups are weakened.
    pub cgroup_procs: Vec<PathBuf>,
    /// Extra text files to create (read-only) under the sandbox's /etc, e.g. a CA.
    #[serde(default)]
    pub extra_files: Vec<(String, String)>,
    /// Host files to copy (read-only, world-readable) under the sandbox's /etc: `(host
    /// path, path inside)`, e.g. a CA bundle. A file given for several paths is copied once
    /// and hard-linked to the others.
    #[serde(default)]
    pub extra_copies: Vec<(PathBuf, String)>,
    /// Loopback port the egress forwarder listens on (held by it for the sandbox's life: no
    /// program can bind it).
    #[serde(default)]
    pub connect_port: Option<u16>,
    /// Host path of the egress proxy's unix socket, bound into the sandbox; a forwarder on
    /// `connect_port` relays to it.
    #[serde(default)]
    pub egress_socket: Option<PathBuf>,
    /// Volumes to mount under /work, in order (ADR 0011). Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<InitVolume>,
    /// The init ends the sandbox itself once its host is gone (a one-shot `cordon run`,
    /// which returns at the program's report: ADR 0044). The host sends the descriptor of
    /// its id lease right after this frame, which the init holds until the sandbox's last
    /// process is reaped and its cgroup removed. Left out: the host ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<InitEnd>,
}

/// What a sandbox init that outlives its host removes once the sandbox's last process is
/// gone.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitEnd {
    /// The sandbox's cgroup directories (every hierarchy's).
    pub cgroups: Vec<PathBuf>,
    /// The one of them kept for the next sandbox if it ended clean (its memory cgroup,
    /// where the pool serves its parent: `cordon_cgroup_pool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepable: Option<PathBuf>,
}

pub(crate) const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
