//! The tier's two types and what each holds: the backend (its stores, the uid pool, the
//! accelerator) and one sandbox (its VM, agent connection, cgroup, uid and what it has
//! seen), with the accessors tests and diagnostics use. Every other module of the backend
//! adds one verb to them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cordon_core::{Error, Result, SandboxId, SandboxSpec};
use cordon_host::agent::AgentConn;
use cordon_host::cgroup::SandboxCgroup;
use cordon_host::egress as shared_egress;
use cordon_host::idpool::{IdPool, IdPoolError, IdRange};
use serde_json::json;

use crate::MicrovmError;
use crate::egress::VmEgress;
use crate::image::Image;
use crate::paused::PausedStore;
use crate::qemu::{self, Accel, RunAs, Vm, VmParams};
use crate::snapshots::SnapshotStore;

use super::accel::{probe_accel, tcg_warning};
use super::config::MicrovmConfig;

/// The microvm tier.
pub struct MicrovmBackend {
    pub(super) cfg: MicrovmConfig,
    pub(super) accel: OnceLock<(Accel, String)>,
    pub(super) qemu_version: OnceLock<Option<String>>,
    pub(super) snapshots: SnapshotStore,
    pub(super) uids: IdPool,
    pub(super) paused: PausedStore,
}

/// One VM's host uid from the pool: unique among the live QEMUs of every Cordon process on
/// the host (a `flock` lease under `/run/cordon/qemu-uids`), returned once its QEMU is dead.
pub(super) fn lease_uid(pool: &IdPool) -> Result<IdRange> {
    pool.allocate().map_err(|e| match e {
        e @ IdPoolError::Exhausted(_) => Error::failed(
            "all QEMU uids are in use (destroy microVMs or widen the uid range)",
            e,
        ),
        other => other.into_core(),
    })
}

/// How a VM came up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    ColdBoot,
    Restore,
}

impl MicrovmBackend {
    pub fn new(cfg: MicrovmConfig) -> Self {
        let (first, count) = cfg.uid_range;
        MicrovmBackend {
            snapshots: SnapshotStore::new(
                cfg.snapshot_dir.clone(),
                cfg.snapshot_max_count,
                cfg.snapshot_max_bytes,
            ),
            uids: IdPool::single_ids("qemu-uids", first, count),
            paused: PausedStore::new(cfg.paused_dir.clone()),
            cfg,
            accel: OnceLock::new(),
            qemu_version: OnceLock::new(),
        }
    }

    pub fn config(&self) -> &MicrovmConfig {
        &self.cfg
    }

    /// The accelerator in use and why.
    pub fn accel(&self) -> &(Accel, String) {
        self.accel.get_or_init(|| match self.cfg.accel {
            Some(a) => (a, "chosen by configuration".into()),
            None => {
                let (a, why) = probe_accel();
                if a == Accel::Tcg {
                    tracing::warn!("{}", tcg_warning(&why));
                }
                (a, why)
            }
        })
    }

    pub(super) fn qemu_version(&self) -> Option<&String> {
        self.qemu_version
            .get_or_init(|| qemu::version(&self.cfg.qemu))
            .as_ref()
    }

    pub(super) fn params(&self, spec: &SandboxSpec, mut image: Image) -> VmParams {
        if !self.cfg.restore_header {
            image.restore_kernel = None;
        }
        let l = &spec.limits;
        let host_cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let vcpus = (l.cpus.ceil() as u32).clamp(1, host_cpus.max(1));
        // Guest RAM: the exec's memory limit, the two tmpfs (their pages live in guest RAM)
        // and room for the kernel and agent, rounded so similar specs share a snapshot.
        let mib = (l.memory_bytes + l.disk_bytes + l.tmp_bytes) / (1 << 20) + 160;
        let ram_mib = mib.div_ceil(128) * 128;
        VmParams {
            qemu: self.cfg.qemu.clone(),
            accel: self.accel().0,
            vcpus,
            ram_mib,
            image,
            incoming: false,
            egress: shared_egress::wanted(spec),
            shared_ram: false,
            tcg_tb_mib: self.cfg.tcg_tb_mib,
            named_ram: false,
        }
    }

    /// The key of the snapshot new sandboxes with these parameters restore from.
    pub fn snapshot_key(&self, params: &VmParams) -> String {
        let v = self.qemu_version().cloned().unwrap_or_default();
        params.snapshot_key(&v)
    }

    /// What a sandbox needs to be resumed from disk later.
    pub(super) fn home(&self) -> Home {
        Home {
            cfg: self.cfg.clone(),
            uids: self.uids.clone(),
            qemu_version: self.qemu_version().cloned().unwrap_or_default(),
            paused: self.paused.clone(),
        }
    }
}

/// What a sandbox keeps of its backend to start its VM again after a pause to disk.
pub(super) struct Home {
    pub(super) cfg: MicrovmConfig,
    pub(super) uids: IdPool,
    pub(super) qemu_version: String,
    pub(super) paused: PausedStore,
}

/// One microVM sandbox.
pub struct MicrovmSandbox {
    /// What its VM was started with.
    pub(super) params: VmParams,
    pub(super) home: Home,
    /// Bytes it holds on disk while paused to disk (it has no VM then).
    pub(super) on_disk: Option<u64>,
    /// Its QEMU's waiter pid (0: none), read by the interrupter: a resume from disk starts
    /// another QEMU.
    pub(super) pid: Arc<AtomicI32>,
    pub(super) id: SandboxId,
    pub(super) spec: SandboxSpec,
    pub(super) accel: Accel,
    pub(super) vm: Option<Vm>,
    pub(super) ctrl: Option<AgentConn>,
    pub(super) cgroup: Option<SandboxCgroup>,
    /// The host uid its QEMU runs as; returned once QEMU is dead.
    pub(super) uid: Option<IdRange>,
    /// The deadline of one file call.
    pub(super) file_timeout: Duration,
    pub(super) start_us: u64,
    pub(super) warnings: Vec<String>,
    pub(super) gone: Option<String>,
    /// Why the VM failed, when it did: guest-kernel-panic, agent-crash, vmm-crash, ...
    pub(super) failure: Option<String>,
    /// QEMU's log and the console's tail, read just before a failed call stopped the VM
    /// (its files go with it): what a failed create reports.
    pub(super) last_words: Option<String>,
    pub(super) next_exec: u64,
    pub(super) mode: StartMode,
    /// The proxy and tunnel, when the spec allows any egress.
    pub(super) egress: Option<VmEgress>,
    /// Scan findings of files taken out, until reported.
    pub(super) file_findings: Vec<cordon_core::Finding>,
    pub(super) ram_bytes: u64,
    /// The guest agent serves file operations and archives (its image is recent enough).
    pub(super) files: bool,
}

/// A failure with no error of its own to keep as a source (`Error::Failed` keeps one): a
/// reply the guest agent should not have sent, or its own words.
pub(super) fn sandbox_msg(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Sandbox(format!("{what}: {detail}"))
}

impl MicrovmSandbox {
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// How this sandbox's VM came up.
    pub fn start_mode(&self) -> StartMode {
        self.mode
    }

    /// Where its state is while it is paused to disk (for tests and diagnostics).
    pub fn paused_dir(&self) -> Option<PathBuf> {
        self.on_disk
            .map(|_| self.home.cfg.paused_dir.join(self.id.as_str()))
    }

    /// QEMU's process id (for tests and diagnostics).
    pub fn qemu_pid(&self) -> Option<i32> {
        self.vm.as_ref().map(|v| v.pid)
    }

    /// The VM's private run directory.
    pub fn run_dir(&self) -> Option<PathBuf> {
        self.vm.as_ref().map(|v| v.dir.clone())
    }

    /// Why the VM failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Sends a non-maskable interrupt to the guest through QMP. The guest kernel runs with
    /// `unknown_nmi_panic`, so this panics it: a way to test panic reporting.
    pub fn inject_nmi(&self) -> Result<()> {
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        vm.qmp("inject-nmi", json!({}))?;
        Ok(())
    }

    /// Copies the guest's whole RAM into a file (QMP `pmemsave`) and returns its path, in
    /// the VM's private directory (removed with the sandbox): to check what a guest could
    /// ever have seen, such as that no real secret reached it.
    pub fn dump_guest_memory(&self) -> Result<PathBuf> {
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        let path = vm.dir.join("guest-memory.dump");
        let inside = format!("{}/guest-memory.dump", qemu::JAIL_VM_DIR);
        vm.qmp(
            "pmemsave",
            json!({"val": 0, "size": self.ram_bytes, "filename": inside}),
        )?;
        Ok(path)
    }

    /// The host uid this sandbox's QEMU runs as.
    pub fn qemu_uid(&self) -> Option<u32> {
        self.uid.as_ref().map(|u| u.base())
    }

    pub(super) fn run_as(&self) -> std::result::Result<RunAs, MicrovmError> {
        match &self.uid {
            Some(u) => Ok(RunAs {
                uid: u.base(),
                gid: u.base(),
            }),
            None => Err(MicrovmError::Qemu("no uid for QEMU".into())),
        }
    }

    pub(super) fn set_vm(&mut self, vm: Vm) {
        self.pid.store(vm.pid, Ordering::Release);
        self.vm = Some(vm);
    }

    pub(super) fn gone_err(&self) -> Error {
        Error::Gone {
            id: self.id.to_string(),
            reason: self.gone.clone().unwrap_or_else(|| "destroyed".into()),
        }
    }
}
