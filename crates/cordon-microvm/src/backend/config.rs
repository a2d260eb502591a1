//! Where the tier keeps its files and how its VMs are started.

use std::path::PathBuf;
use std::time::Duration;

use crate::egress::EgressTuning;
use crate::image;
use crate::qemu::Accel;

/// Where things live and how VMs are started.
#[derive(Debug, Clone)]
pub struct MicrovmConfig {
    /// Cordon's data directory (the image is under `microvm/`).
    pub data_dir: PathBuf,
    /// Per-VM private directories (sockets, console log).
    pub run_dir: PathBuf,
    /// Snapshots of agent-ready VMs.
    pub snapshot_dir: PathBuf,
    /// Sandboxes paused to disk, one root-only directory each (`Sandbox::pause_to_disk`).
    pub paused_dir: PathBuf,
    pub qemu: PathBuf,
    /// The accelerator; `None` probes.
    pub accel: Option<Accel>,
    /// The host uids (and equal gids) QEMUs run as: `(first, count)`. Each VM gets one of
    /// its own, never shared with another live VM of any Cordon process on the host (see
    /// [`cordon_host::idpool`]); `count` bounds the microVMs running at once.
    pub uid_range: (u32, u32),
    /// How long a cold boot may take to reach the agent.
    pub boot_timeout: Duration,
    /// Restore new sandboxes from a snapshot (made on first use) instead of booting each.
    pub snapshots: bool,
    /// Applied to each sandbox's egress proxy configuration.
    pub egress_tuning: EgressTuning,
    /// Snapshots kept at most (least recently used collected first), and their total size.
    pub snapshot_max_count: usize,
    pub snapshot_max_bytes: u64,
    /// The deadline of one file call (put or get) on the agent channel, writes and reads.
    pub file_timeout: Duration,
    /// Under emulation (TCG), run one `true` as the last step of every create, so the
    /// sandbox's first real exec does not pay for translating the exec path's guest code
    /// (`CORDON_MICROVM_WARM_UP=0` turns it off). Nothing of it stays in the sandbox.
    pub warm_up: bool,
    /// Snapshots keep the guest's RAM in a file of the snapshot store that every VM restored
    /// from it maps private and copy-on-write, so the pages no VM writes are paid once
    /// (`CORDON_MICROVM_SHARED_RAM=0` turns it off: snapshots of the old format, the whole
    /// RAM in the stream, read into each VM's own memory).
    pub shared_ram: bool,
    /// Under TCG, QEMU's translated-code buffer in MiB (`CORDON_MICROVM_TCG_TB_MIB`): what
    /// of it fills stays resident for each VM's life; a smaller one is flushed and refilled
    /// more often (ADR 0013).
    pub tcg_tb_mib: u32,
    /// A restored VM's QEMU gets only the kernel's boot header as `-kernel`, not the whole
    /// kernel it would keep a private copy of (`image::restore_kernel`, ADR 0018;
    /// `CORDON_MICROVM_RESTORE_HEADER=0` gives it the whole kernel).
    pub restore_header: bool,
    /// The disk a resolved template whose root is not in the template store boots (an OCI
    /// bundle's root under cordon-oci: one disk per bundle, in its state directory, which
    /// removes it with the container), made from the root if missing. `None`: such a
    /// template is refused.
    pub root_disk: Option<PathBuf>,
    /// The cgroup (below each hierarchy's root) QEMU's cgroup is made in: `None` is
    /// `cordon/`; cordon-oci names the pod's (`cordon_host::cgroup::place`).
    pub cgroup_parent: Option<String>,
}

impl MicrovmConfig {
    pub fn discover() -> Self {
        Self::with_data_dir(image::default_data_dir())
    }

    pub fn with_data_dir(data_dir: PathBuf) -> Self {
        let mv = image::image_dir(&data_dir);
        MicrovmConfig {
            run_dir: mv.join("run"),
            snapshot_dir: mv.join("snapshots"),
            paused_dir: mv.join("paused"),
            data_dir,
            qemu: std::env::var_os("CORDON_QEMU")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/usr/bin/qemu-system-x86_64")),
            accel: None,
            uid_range: (0x7ffd_0000, 0x1000),
            boot_timeout: Duration::from_secs(90),
            snapshots: true,
            egress_tuning: EgressTuning::default(),
            snapshot_max_count: 8,
            snapshot_max_bytes: 2 << 30,
            file_timeout: Duration::from_secs(60),
            warm_up: std::env::var("CORDON_MICROVM_WARM_UP").map_or(true, |v| v != "0"),
            shared_ram: std::env::var("CORDON_MICROVM_SHARED_RAM").map_or(true, |v| v != "0"),
            tcg_tb_mib: std::env::var("CORDON_MICROVM_TCG_TB_MIB")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|n: &u32| (8..=2048).contains(n))
                .unwrap_or(128),
            restore_header: std::env::var("CORDON_MICROVM_RESTORE_HEADER")
                .map_or(true, |v| v != "0"),
            root_disk: None,
            cgroup_parent: None,
        }
    }
}
