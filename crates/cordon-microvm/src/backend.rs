//! Host side of the microvm tier.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use cordon_core::{
    Backend, Capability, Error, ExecOutcome, ExecRequest, OutputSink, Probe, Result, Sandbox,
    SandboxId, SandboxSpec, Termination, Tier,
};
use cordon_guest::proto::{self, Frame, PROTOCOL_VERSION, Reply, Request, StdioMode};
use cordon_host::cgroup::SandboxCgroup;
use cordon_host::egress as shared_egress;
use cordon_host::idpool::{IdPool, IdPoolError, IdRange};
use serde_json::json;

use crate::MicrovmError;
use crate::egress::{EgressTuning, VmEgress};
use crate::image::{self, Image};
use crate::paused::{self, PausedStore};
use crate::qemu::{self, Accel, RunAs, Vm, VmParams};
use crate::snapshots::{Snapshot, SnapshotStore};
use cordon_host::agent::{self, AgentConn, CallError, HEADER_ROOM};

/// Decides whether KVM is really usable here: `/dev/kvm` alone is not enough (a paravirtual
/// `kvm_pvm` device emulates guest kernel code ~1000x slower and crashes stock kernels).
/// Returns the accelerator and why. `CORDON_MICROVM_ACCEL=tcg|kvm` overrides.
pub fn probe_accel() -> (Accel, String) {
    match std::env::var("CORDON_MICROVM_ACCEL").as_deref() {
        Ok("tcg") => return (Accel::Tcg, "TCG forced by CORDON_MICROVM_ACCEL".into()),
        Ok("kvm") => return (Accel::Kvm, "KVM forced by CORDON_MICROVM_ACCEL".into()),
        _ => {}
    }
    if !Path::new("/dev/kvm").exists() {
        return (Accel::Tcg, "no /dev/kvm on this host".into());
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        return (
            Accel::Tcg,
            "/dev/kvm is the paravirtual kvm_pvm module (no VMX/SVM): guest kernel code runs \
             emulated ~1000x slower and stock kernels crash under it"
                .into(),
        );
    }
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !hw {
        return (
            Accel::Tcg,
            "the CPU shows no VMX/SVM: /dev/kvm is not hardware virtualization".into(),
        );
    }
    if !Path::new("/sys/module/kvm_intel").exists() && !Path::new("/sys/module/kvm_amd").exists() {
        return (Accel::Tcg, "neither kvm_intel nor kvm_amd is loaded".into());
    }
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => (
            Accel::Kvm,
            "hardware KVM (VMX/SVM, kvm_intel/kvm_amd)".into(),
        ),
        Err(e) => (Accel::Tcg, format!("cannot open /dev/kvm: {e}")),
    }
}

fn tcg_warning(reason: &str) -> String {
    format!(
        "microvm runs under TCG software emulation, not KVM ({reason}): the wall is the same, \
         but boots take seconds and guest code runs many times slower"
    )
}

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
        }
    }
}

/// The microvm tier.
pub struct MicrovmBackend {
    cfg: MicrovmConfig,
    accel: OnceLock<(Accel, String)>,
    qemu_version: OnceLock<Option<String>>,
    snapshots: SnapshotStore,
    uids: IdPool,
    paused: PausedStore,
}

/// How one create attempt failed: a stalled cold boot is tried again.
enum Attempt {
    Stalled(String),
    Failed(Error),
}

impl Attempt {
    fn into_error(self) -> Error {
        match self {
            Attempt::Stalled(why) => MicrovmError::BootStalled(why).into(),
            Attempt::Failed(e) => e,
        }
    }
}

impl From<Error> for Attempt {
    fn from(e: Error) -> Self {
        Attempt::Failed(e)
    }
}

impl From<MicrovmError> for Attempt {
    fn from(e: MicrovmError) -> Self {
        Attempt::Failed(e.into())
    }
}

/// One VM's host uid from the pool: unique among the live QEMUs of every Cordon process on
/// the host (a `flock` lease under `/run/cordon/qemu-uids`), returned once its QEMU is dead.
fn lease_uid(pool: &IdPool) -> Result<IdRange> {
    pool.allocate().map_err(|e| match e {
        IdPoolError::Exhausted(n) => Error::Sandbox(format!(
            "all {n} QEMU uids are in use; destroy microVMs or widen the uid range"
        )),
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

    fn qemu_version(&self) -> Option<&String> {
        self.qemu_version
            .get_or_init(|| qemu::version(&self.cfg.qemu))
            .as_ref()
    }

    fn params(&self, spec: &SandboxSpec, mut image: Image) -> VmParams {
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

    /// Creates a sandbox by booting a fresh VM (no snapshot), for measurements and for
    /// making snapshots.
    pub fn create_cold(&self, spec: &SandboxSpec) -> Result<MicrovmSandbox> {
        self.create_with(spec, StartMode::ColdBoot)
    }

    /// Creates a sandbox restored from the snapshot (made first if missing).
    pub fn create_restored(&self, spec: &SandboxSpec) -> Result<MicrovmSandbox> {
        self.create_with(spec, StartMode::Restore)
    }

    pub fn create_sandbox(&self, spec: &SandboxSpec) -> Result<MicrovmSandbox> {
        let mode = if self.cfg.snapshots {
            StartMode::Restore
        } else {
            StartMode::ColdBoot
        };
        self.create_with(spec, mode)
    }

    /// One create; a cold boot whose guest stalled before its agent answered (seen about
    /// once in a few hundred TCG boots on a loaded host, with no console output) is booted
    /// once more, with the stalled one's console in the log.
    fn create_with(&self, spec: &SandboxSpec, mode: StartMode) -> Result<MicrovmSandbox> {
        match self.create_once(spec, mode) {
            Err(Attempt::Stalled(why)) => {
                tracing::warn!("a microvm cold boot stalled, booting it once more: {why}");
                self.create_once(spec, mode).map_err(Attempt::into_error)
            }
            r => r.map_err(Attempt::into_error),
        }
    }

    fn create_once(
        &self,
        spec: &SandboxSpec,
        mode: StartMode,
    ) -> std::result::Result<MicrovmSandbox, Attempt> {
        spec.validate()?;
        if spec.tier != Tier::Microvm {
            return Err(Attempt::Failed(Error::Invalid(format!(
                "the microvm backend was asked for a {} sandbox",
                spec.tier
            ))));
        }
        let mut image = image::load(&self.cfg.data_dir)?;
        match (&spec.template, &spec.resolved_template) {
            (Some(name), None) => {
                return Err(Attempt::Failed(Error::Invalid(format!(
                    "template {name:?} was not resolved before the create; resolve it with the \
                     template store (cordon_template::Store::resolve_spec) first"
                ))));
            }
            (_, Some(t)) => {
                // The guest boots the template's own disk (made once per digest); the
                // agent stays the initramfs's. Its snapshots are its own (the image's id,
                // part of the snapshot key, carries the template's digest).
                let disk = cordon_template::disk_image_path(&t.root).ok_or_else(|| {
                    Error::Invalid(format!(
                        "template {:?} is not a root of the template store",
                        t.name
                    ))
                })?;
                image::template_disk(&t.root, &disk).map_err(|e| {
                    tracing::error!(template = %t.name, "making the template's disk: {e}");
                    Error::Sandbox(format!(
                        "the disk image of template {:?} could not be made; the operator's log \
                         says why",
                        t.name
                    ))
                })?;
                image.rootfs = disk;
                image.id = format!("{}-{}", image.id, t.digest);
            }
            (None, None) => {}
        }
        let mut params = self.params(spec, image);
        let snapshot = if mode == StartMode::Restore {
            params.incoming = true;
            params.shared_ram = self.cfg.shared_ram;
            Some(self.ensure_snapshot(&params)?)
        } else {
            None
        };
        let t0 = Instant::now();
        let id = SandboxId::random()?;
        let mut warnings = Vec::new();
        let (accel, why) = self.accel().clone();
        if accel == Accel::Tcg {
            warnings.push(tcg_warning(&why));
        }
        let mem_limit = (params.ram_mib << 20) + (384 << 20);
        let cgroup = SandboxCgroup::create(
            &format!("vm-{}", id.short()),
            mem_limit,
            64 + 4 * params.vcpus,
            spec.limits.cpus.max(params.vcpus as f64 * 0.5),
        )
        .map_err(|e| Error::LayerUnavailable {
            layer: "cgroups".into(),
            reason: format!("QEMU's own cgroup: {e}"),
        })?;
        let uid = lease_uid(&self.uids)?;
        let mut sb = MicrovmSandbox {
            params: params.clone(),
            home: self.home(),
            on_disk: None,
            pid: Arc::new(AtomicI32::new(0)),
            uid: Some(uid),
            file_timeout: self.cfg.file_timeout,
            id: id.clone(),
            spec: spec.clone(),
            accel,
            vm: None,
            ctrl: None,
            cgroup: Some(cgroup),
            start_us: 0,
            warnings,
            gone: None,
            failure: None,
            last_words: None,
            next_exec: 1,
            mode,
            egress: None,
            file_findings: Vec::new(),
            ram_bytes: params.ram_mib << 20,
            files: false,
        };
        let dir = self.cfg.run_dir.join(id.short());
        let boot = self.cfg.boot_timeout;
        let mut stalled = false;
        let result = (|| {
            let procs = sb
                .cgroup
                .as_ref()
                .map(|c| c.procs_files())
                .unwrap_or_default();
            if params.egress {
                sb.egress = Some(VmEgress::start(id.as_str(), spec, &self.cfg.egress_tuning)?);
            }
            let run_as = sb.run_as()?;
            let (vm, ctrl, port) = Vm::start(
                &params,
                &dir,
                run_as,
                procs,
                snapshot.as_ref().map(|s| &s.stream),
                snapshot
                    .as_ref()
                    .and_then(|s| s.ram.as_ref().zip(s.ram_path.as_deref())),
            )?;
            drop(snapshot);
            sb.set_vm(vm);
            sb.ctrl =
                Some(AgentConn::new(ctrl).map_err(|e| MicrovmError::io("the agent socket", e))?);
            if let (Some(e), Some(port)) = (sb.egress.as_mut(), port) {
                e.attach(port)?;
            }
            if mode == StartMode::ColdBoot {
                let r = sb.ctrl()?.recv(Instant::now() + boot, HEADER_ROOM);
                stalled = matches!(r, Err(CallError::Timeout));
                sb.check_hello(r)?;
            }
            sb.configure(boot)
        })();
        if let Err(e) = result {
            let diag = sb
                .vm
                .as_ref()
                .map(|v| v.diagnostics())
                .or_else(|| sb.last_words.take())
                .unwrap_or_default();
            sb.teardown();
            let secs = t0.elapsed().as_secs_f64();
            if stalled {
                return Err(Attempt::Stalled(format!("after {secs:.1} s: {diag}")));
            }
            return Err(Attempt::Failed(Error::Sandbox(format!(
                "the microVM did not come up after {secs:.1} s: {e} ({diag})"
            ))));
        }
        // Under TCG a guest's first exec pays for translating every code path it takes (the
        // agent's exec handling, the reaper's fork, the loader): several times a later
        // exec. One `true` here takes that off the first real exec, so a sandbox from a
        // warm pool answers at its steady speed; its reaper and namespaces go with it.
        if accel == Accel::Tcg && self.cfg.warm_up {
            let warm = sb.exec(
                &ExecRequest::argv(["true"]),
                &mut |_: cordon_core::OutputStream, _: &[u8]| {},
            );
            match warm {
                Ok(o) if o.success() => {}
                Ok(o) => {
                    tracing::warn!(sandbox = %sb.id, termination = ?o.termination, "microvm warm-up exec did not succeed")
                }
                Err(e) => {
                    sb.teardown();
                    return Err(Attempt::Failed(Error::Sandbox(format!(
                        "the microVM did not run its warm-up exec: {e}"
                    ))));
                }
            }
        }
        sb.start_us = t0.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, ?mode, accel = accel.as_str(), start_us = sb.start_us, "microvm ready");
        Ok(sb)
    }

    /// The snapshot for `params`, opened read-only; a template VM is booted and saved when
    /// there is none. Only this key's lock is held through the boot: sandboxes of other
    /// shapes are created meanwhile.
    pub fn ensure_snapshot(&self, params: &VmParams) -> Result<Snapshot> {
        let key = self.snapshot_key(params);
        if let Some(s) = self.snapshots.open(&key, params.shared_ram)? {
            return Ok(s);
        }
        let _making = self.snapshots.lock_key(&key)?;
        if let Some(s) = self.snapshots.open(&key, params.shared_ram)? {
            return Ok(s);
        }
        let t0 = Instant::now();
        let partial = self
            .snapshots
            .create_partial(params.shared_ram.then_some(params.ram_mib << 20))?;
        let made = match self.make_snapshot(params, &partial) {
            Err(MicrovmError::BootStalled(why)) => {
                tracing::warn!("a microvm template boot stalled, booting it once more: {why}");
                self.make_snapshot(params, &partial)
            }
            r => r,
        };
        let snapshot = match made {
            Ok(()) => self.snapshots.install(partial, &key)?,
            Err(e) => {
                self.snapshots.discard_partial(partial);
                return Err(e.into());
            }
        };
        let removed = self.snapshots.collect(&key);
        if !removed.is_empty() {
            tracing::info!(?removed, "least recently used microvm snapshots removed");
        }
        tracing::info!(snapshot = %key, seconds = t0.elapsed().as_secs_f64(), shared_ram = params.shared_ram, "microvm snapshot made");
        Ok(snapshot)
    }

    /// Boots a template VM to "agent ready" and has it write its state into the partial
    /// snapshot's stream, a file it gets only as a descriptor; with its RAM in a file, the
    /// guest's memory is that file (lent to the template's uid for its life, taken back
    /// once its QEMU is dead) and the stream holds the device state only.
    fn make_snapshot(
        &self,
        params: &VmParams,
        partial: &crate::snapshots::Partial,
    ) -> std::result::Result<(), MicrovmError> {
        use std::os::fd::AsRawFd;
        let mut tpl = params.clone();
        tpl.incoming = false;
        tpl.egress = false;
        let mut suffix = [0u8; 6];
        getrandom::fill(&mut suffix)
            .map_err(|e| MicrovmError::Qemu(format!("no randomness: {e}")))?;
        let dir = self
            .cfg
            .run_dir
            .join(format!("snap-{}", hex::encode(suffix)));
        let uid = lease_uid(&self.uids).map_err(|e| MicrovmError::Qemu(e.to_string()))?;
        let run_as = RunAs {
            uid: uid.base(),
            gid: uid.base(),
        };
        let made = (|| -> std::result::Result<(), MicrovmError> {
            self.snapshots.lend_ram(partial, run_as.uid)?;
            let (mut vm, ctrl, _) = Vm::start(
                &tpl,
                &dir,
                run_as,
                Vec::new(),
                None,
                partial.ram.as_ref().zip(partial.ram_path.as_deref()),
            )?;
            let mut ctrl =
                AgentConn::new(ctrl).map_err(|e| MicrovmError::io("the agent socket", e))?;
            let deadline = Instant::now() + self.cfg.boot_timeout;
            match ctrl.recv(deadline, HEADER_ROOM) {
                Ok(f) if matches!(f.header, Reply::Hello { version, .. } if version == PROTOCOL_VERSION) =>
                    {}
                Ok(f) => {
                    return Err(MicrovmError::Qemu(format!(
                        "unexpected first message from the guest agent: {:?}",
                        f.header
                    )));
                }
                Err(CallError::Timeout) => {
                    return Err(MicrovmError::BootStalled(format!(
                        "the template VM, after {} s: {}",
                        self.cfg.boot_timeout.as_secs(),
                        vm.diagnostics()
                    )));
                }
                Err(e) => {
                    return Err(MicrovmError::Qemu(format!(
                        "the template VM did not reach the agent: {e} ({})",
                        vm.diagnostics()
                    )));
                }
            }
            let mut commands = Vec::new();
            if tpl.shared_ram {
                // The RAM stays in its file: the stream carries the device state only.
                commands.push((
                    "migrate-set-capabilities",
                    json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]}),
                    None,
                ));
            }
            commands.push((
                "getfd",
                json!({"fdname": "snapshot"}),
                Some(partial.stream.as_raw_fd()),
            ));
            commands.push(("migrate", json!({"uri": "fd:snapshot"}), None));
            vm.qmp_many(&commands)?;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let st = vm.qmp("query-migrate", json!({}))?;
                match st.get("status").and_then(|s| s.as_str()) {
                    Some("completed") => break,
                    Some("failed") | Some("cancelled") => {
                        return Err(MicrovmError::Qemu(format!("saving the snapshot: {st}")));
                    }
                    _ => {}
                }
                if Instant::now() > deadline {
                    return Err(MicrovmError::Qemu(
                        "saving the snapshot took over 120 s".into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            vm.kill();
            Ok(())
        })();
        // QEMU is dead (killed or dropped) before the RAM file is taken back, its directory
        // goes and its uid returns.
        let reclaimed = self.snapshots.reclaim(partial);
        let _ = fs::remove_dir_all(&dir);
        drop(uid);
        made.and(reclaimed)
    }

    /// Removes every snapshot (they are remade on demand).
    pub fn clear_snapshots(&self) -> io::Result<()> {
        self.snapshots.clear()
    }

    /// What a sandbox needs to be resumed from disk later.
    fn home(&self) -> Home {
        Home {
            cfg: self.cfg.clone(),
            uids: self.uids.clone(),
            qemu_version: self.qemu_version().cloned().unwrap_or_default(),
            paused: self.paused.clone(),
        }
    }

    /// The ids of sandboxes paused to disk in this backend's directory.
    pub fn paused_ids(&self) -> Vec<String> {
        self.paused.ids()
    }

    /// The sandbox `id` paused to disk by an earlier process (`None` if there is none),
    /// from its manifest: it holds no VM until resumed, which checks its state's digest.
    pub fn revive_sandbox(&self, id: &str) -> Result<Option<MicrovmSandbox>> {
        match self.paused.manifest(id)? {
            Some(m) => self.sandbox_from(m).map(Some),
            None => Ok(None),
        }
    }

    fn sandbox_from(&self, m: paused::Manifest) -> Result<MicrovmSandbox> {
        let id = SandboxId::parse(&m.id)
            .ok_or_else(|| Error::Sandbox("a paused sandbox with a malformed id".into()))?;
        let home = self.home();
        if m.qemu_version != home.qemu_version {
            return Err(Error::Sandbox(format!(
                "sandbox {id} was saved by another QEMU ({}); this host runs {}: it cannot be \
                 resumed, destroy it",
                m.qemu_version, home.qemu_version
            )));
        }
        let image = Image {
            restore_kernel: crate::image::restore_kernel(&m.kernel),
            kernel: m.kernel,
            initrd: m.initrd,
            rootfs: m.rootfs,
            kernel_version: m.kernel_version,
            id: m.image_id,
        };
        // This backend's parameters for the spec, with the saved VM's shape over them.
        let mut params = self.params(&m.spec, image);
        params.accel = m.accel;
        params.vcpus = m.vcpus;
        params.ram_mib = m.ram_mib;
        params.incoming = true;
        params.egress = false;
        params.shared_ram = false;
        params.named_ram = m.named_ram;
        let mut warnings = Vec::new();
        if m.accel == Accel::Tcg {
            warnings.push(tcg_warning(&self.accel().1));
        }
        Ok(MicrovmSandbox {
            params,
            home,
            on_disk: Some(self.paused.bytes(id.as_str())),
            pid: Arc::new(AtomicI32::new(0)),
            uid: None,
            file_timeout: self.cfg.file_timeout,
            id,
            spec: m.spec,
            accel: m.accel,
            vm: None,
            ctrl: None,
            cgroup: None,
            start_us: m.start_us,
            warnings,
            gone: None,
            failure: None,
            last_words: None,
            next_exec: m.next_exec,
            mode: StartMode::Restore,
            egress: None,
            file_findings: Vec::new(),
            ram_bytes: m.ram_mib << 20,
            files: m.files,
        })
    }
}

/// Waits until QEMU's outgoing migration has completed.
fn await_migration(vm: &Vm, limit: Duration) -> std::result::Result<(), MicrovmError> {
    let deadline = Instant::now() + limit;
    loop {
        let st = vm.qmp("query-migrate", json!({}))?;
        match st.get("status").and_then(|s| s.as_str()) {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => {
                return Err(MicrovmError::Qemu(format!("the migration failed: {st}")));
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(MicrovmError::Qemu(format!(
                "the migration took over {} s",
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a sandbox keeps of its backend to start its VM again after a pause to disk.
struct Home {
    cfg: MicrovmConfig,
    uids: IdPool,
    qemu_version: String,
    paused: PausedStore,
}

impl Backend for MicrovmBackend {
    /// A full boot of the guest (no snapshot): what the first sandbox of a shape costs,
    /// and every sandbox where snapshots are off.
    fn create_unprepared(&self, spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        Some(
            self.create_cold(spec)
                .map(|sb| Box::new(sb) as Box<dyn Sandbox>),
        )
    }

    /// Nothing of its own yet: QEMU is spawned tied to the process that starts it and dies
    /// with it; its cgroup, empty once QEMU is gone, is swept with the other empty sandbox
    /// cgroups by the container tier's recovery.
    /// Removes the paused-to-disk state of the dead server's sandboxes named (those the
    /// server keeps are not named).
    fn recover(&self, orphans: &[String]) -> Vec<String> {
        orphans
            .iter()
            .filter(|id| self.paused.remove(id))
            .map(|id| format!("paused microVM state of {id}"))
            .collect()
    }

    fn revive(&self, id: &str) -> Option<Result<Box<dyn Sandbox>>> {
        self.revive_sandbox(id)
            .transpose()
            .map(|r| r.map(|sb| Box::new(sb) as Box<dyn Sandbox>))
    }

    fn tier(&self) -> Tier {
        Tier::Microvm
    }

    fn probe(&self) -> Probe {
        let mut caps = Vec::new();
        caps.push(match self.qemu_version() {
            Some(v) => Capability::ok("qemu", v.clone()),
            None => Capability::missing(
                "qemu",
                format!("{} not found", self.cfg.qemu.display()),
                "apt-get install -t bookworm-backports qemu-system-x86 (scripts/setup.sh does it)",
            ),
        });
        caps.push(match image::load(&self.cfg.data_dir) {
            Ok(img) => Capability::ok(
                "guest image",
                format!("kernel {}, {}", img.kernel_version, img.rootfs.display()),
            ),
            Err(e) => Capability::missing("guest image", e.to_string(), "cordon image build"),
        });
        caps.push(if nix::unistd::geteuid().is_root() {
            Capability::ok("root", "QEMU can be confined (user, namespaces, cgroup)")
        } else {
            Capability::missing("root", "not running as root", "run Cordon as root")
        });
        let (accel, why) = self.accel().clone();
        let mut kvm = match accel {
            Accel::Kvm => Capability::ok("hardware KVM", why.clone()),
            Accel::Tcg => Capability::missing(
                "hardware KVM",
                format!("falling back to TCG: {why}"),
                "run on a host with VMX/SVM and kvm_intel/kvm_amd (bare metal or nested virtualization); TCG works but is slow",
            ),
        };
        kvm.required = false;
        caps.push(kvm);
        let mut notes = vec![format!("accelerator: {}", accel.as_str())];
        if accel == Accel::Tcg {
            notes.push(format!("WARNING: {}", tcg_warning(&why)));
        }
        Probe::from_capabilities(Tier::Microvm, caps, notes)
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.create_sandbox(spec)?))
    }
}

/// One microVM sandbox.
pub struct MicrovmSandbox {
    /// What its VM was started with.
    params: VmParams,
    home: Home,
    /// Bytes it holds on disk while paused to disk (it has no VM then).
    on_disk: Option<u64>,
    /// Its QEMU's waiter pid (0: none), read by the interrupter: a resume from disk starts
    /// another QEMU.
    pid: Arc<AtomicI32>,
    id: SandboxId,
    spec: SandboxSpec,
    accel: Accel,
    vm: Option<Vm>,
    ctrl: Option<AgentConn>,
    cgroup: Option<SandboxCgroup>,
    /// The host uid its QEMU runs as; returned once QEMU is dead.
    uid: Option<IdRange>,
    /// The deadline of one file call.
    file_timeout: Duration,
    start_us: u64,
    warnings: Vec<String>,
    gone: Option<String>,
    /// Why the VM failed, when it did: guest-kernel-panic, agent-crash, vmm-crash, ...
    failure: Option<String>,
    /// QEMU's log and the console's tail, read just before a failed call stopped the VM
    /// (its files go with it): what a failed create reports.
    last_words: Option<String>,
    next_exec: u64,
    mode: StartMode,
    /// The proxy and tunnel, when the spec allows any egress.
    egress: Option<VmEgress>,
    /// Scan findings of files taken out, until reported.
    file_findings: Vec<cordon_core::Finding>,
    ram_bytes: u64,
    /// The guest agent serves file operations and archives (its image is recent enough).
    files: bool,
}

fn sandbox_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Sandbox(format!("{what}: {e}"))
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

    /// Writes raw bytes to the agent channel, bypassing the frame encoder (to test that the
    /// agent rejects malformed frames), and returns whether the agent is still answering.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        let deadline = Instant::now() + self.file_timeout;
        let r = self.ctrl()?.send_raw(bytes, deadline);
        self.check_call(r, "writing to the agent")
    }

    /// The host uid this sandbox's QEMU runs as.
    pub fn qemu_uid(&self) -> Option<u32> {
        self.uid.as_ref().map(|u| u.base())
    }

    fn run_as(&self) -> std::result::Result<RunAs, MicrovmError> {
        match &self.uid {
            Some(u) => Ok(RunAs {
                uid: u.base(),
                gid: u.base(),
            }),
            None => Err(MicrovmError::Qemu("no uid for QEMU".into())),
        }
    }

    /// The result of a call on the agent channel. A call that failed part-way leaves the
    /// channel between frames: the VM is stopped (and the reason recorded).
    fn check_call<T>(&mut self, r: std::result::Result<T, CallError>, what: &str) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(CallError::Timeout) => {
                self.gone = Some(format!("its agent did not finish {what} in time"));
                self.last_words = self.vm.as_ref().map(|v| v.diagnostics());
                self.teardown();
                Err(Error::Sandbox(format!(
                    "{what}: the guest agent did not take or answer it in time; the microVM was stopped, create a new sandbox"
                )))
            }
            Err(CallError::Proto(e)) => {
                self.failure = Some("agent-protocol".into());
                self.gone = Some(format!("its agent broke the protocol ({e})"));
                self.last_words = self.vm.as_ref().map(|v| v.diagnostics());
                self.teardown();
                Err(Error::Sandbox(format!(
                    "{what}: the guest agent broke the protocol ({e}); the microVM was stopped, create a new sandbox"
                )))
            }
            Err(e) => {
                let why = self.diagnose(&e.to_string());
                Err(Error::Sandbox(format!("the guest agent stopped: {why}")))
            }
        }
    }

    /// One request and its reply, all by one deadline; a reply longer than `max_frame`
    /// bytes is refused from its length.
    fn call(
        &mut self,
        req: &Request,
        body: &[u8],
        timeout: Duration,
        max_frame: usize,
        what: &str,
    ) -> Result<proto::Frame<Reply>> {
        let deadline = Instant::now() + timeout;
        let ctrl = self.ctrl()?;
        let r = ctrl
            .send(req, body, deadline)
            .and_then(|()| ctrl.recv(deadline, max_frame));
        self.check_call(r, what)
    }

    /// One file call on the agent channel, each frame by the file deadline; refused at
    /// once when the guest's agent predates file operations (it would stop at an unknown
    /// request).
    fn file_call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut cordon_host::files::ConnIo<'_>) -> cordon_host::files::Answer<T>,
    ) -> Result<T> {
        if !self.files {
            return Err(cordon_host::files::agent_too_old(what));
        }
        let timeout = self.file_timeout;
        let conn = self.ctrl()?;
        let r = f(&mut cordon_host::files::ConnIo { conn, timeout });
        self.check_call(r, what)?
    }

    fn set_vm(&mut self, vm: Vm) {
        self.pid.store(vm.pid, Ordering::Release);
        self.vm = Some(vm);
    }

    /// Stops the vCPUs, has QEMU write the whole VM (every RAM page, devices) into a new
    /// state file of the paused store through a descriptor, ends QEMU (its memory, cgroup
    /// and uid go) and records the manifest. On a failure before QEMU is ended, the VM
    /// runs on and nothing is left on disk.
    fn save_to_disk(&mut self) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let pending = self.home.paused.create(self.id.as_str())?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        let saved = (|| -> std::result::Result<(), MicrovmError> {
            vm.qmp("stop", json!({}))?;
            // A VM restored from a snapshot has `x-ignore-shared` on: off, so every page of
            // its private copy of the snapshot's RAM goes into the stream.
            vm.qmp_many(&[
                (
                    "migrate-set-capabilities",
                    json!({"capabilities": [{"capability": "x-ignore-shared", "state": false}]}),
                    None,
                ),
                (
                    "getfd",
                    json!({"fdname": "paused"}),
                    Some(pending.state.as_raw_fd()),
                ),
                ("migrate", json!({"uri": "fd:paused"}), None),
            ])?;
            await_migration(vm, Duration::from_secs(600))
        })();
        if let Err(e) = saved {
            self.home.paused.remove(self.id.as_str());
            let _ = vm.qmp("cont", json!({}));
            return Err(Error::Sandbox(format!(
                "saving the microVM to disk failed ({e}); it runs on, paused nowhere: retry, or \
                 pause it without to_disk"
            )));
        }
        // QEMU is done with the descriptor: it ends, and with it the VM's memory and CPU.
        self.teardown();
        let manifest = paused::Manifest {
            format: paused::FORMAT,
            id: self.id.as_str().to_string(),
            spec: self.spec.clone(),
            qemu_version: self.home.qemu_version.clone(),
            accel: self.accel,
            vcpus: self.params.vcpus,
            ram_mib: self.params.ram_mib,
            named_ram: self.params.shared_ram || self.params.named_ram,
            kernel: self.params.image.kernel.clone(),
            initrd: self.params.image.initrd.clone(),
            rootfs: self.params.image.rootfs.clone(),
            image_id: self.params.image.id.clone(),
            kernel_version: self.params.image.kernel_version.clone(),
            next_exec: self.next_exec,
            files: self.files,
            start_us: self.start_us,
            state_bytes: 0,
            state_sha256: String::new(),
        };
        match self.home.paused.finish(pending, manifest) {
            Ok(_) => Ok(self.home.paused.bytes(self.id.as_str())),
            Err(e) => {
                self.home.paused.remove(self.id.as_str());
                tracing::error!(sandbox = %self.id, "recording a paused microVM: {e}");
                self.gone = Some("its state could not be recorded on disk".into());
                Err(Error::Sandbox(
                    "the microVM's state could not be recorded on disk (the operator's log says \
                     why) and the sandbox is lost; create a new sandbox"
                        .into(),
                ))
            }
        }
    }

    /// Starts a new confined QEMU from the state on disk (checked against its digest first:
    /// a mismatch removes it and runs nothing), reconnects the agent and continues the
    /// guest where it stopped. Any failure loses the sandbox (its files are removed).
    fn resume_from_disk(&mut self) -> Result<()> {
        let r = self.start_from_disk();
        if let Err(e) = r {
            self.teardown();
            self.on_disk = None;
            self.home.paused.remove(self.id.as_str());
            tracing::warn!(sandbox = %self.id, "resuming from disk failed: {e}");
            self.failure.get_or_insert_with(|| "resume-failed".into());
            self.gone = Some(format!("its resume from disk failed: {e}"));
            return Err(Error::Sandbox(format!(
                "resuming the microVM from disk failed ({e}); the sandbox is lost, create a new \
                 one"
            )));
        }
        self.on_disk = None;
        self.home.paused.remove(self.id.as_str());
        Ok(())
    }

    fn start_from_disk(&mut self) -> std::result::Result<(), String> {
        let (manifest, state) = self.home.paused.open_state(self.id.as_str()).map_err(|e| {
            self.failure = Some("paused-state-refused".into());
            e.to_string()
        })?;
        if manifest.qemu_version != self.home.qemu_version {
            return Err("it was saved by another QEMU version".into());
        }
        let mut params = self.params.clone();
        params.incoming = true;
        params.egress = false;
        params.named_ram = manifest.named_ram;
        params.shared_ram = false;
        let mem_limit = (params.ram_mib << 20) + (384 << 20);
        let cgroup = SandboxCgroup::create(
            &format!("vm-{}", self.id.short()),
            mem_limit,
            64 + 4 * params.vcpus,
            self.spec.limits.cpus.max(params.vcpus as f64 * 0.5),
        )
        .map_err(|e| format!("QEMU's own cgroup: {e}"))?;
        let procs = cgroup.procs_files();
        self.cgroup = Some(cgroup);
        self.uid = Some(lease_uid(&self.home.uids).map_err(|e| e.to_string())?);
        let run_as = self.run_as().map_err(|e| e.to_string())?;
        let dir = self.home.cfg.run_dir.join(self.id.short());
        let (mut vm, ctrl, _) = Vm::start(&params, &dir, run_as, procs, Some(&state), None)
            .map_err(|e| e.to_string())?;
        drop(state);
        let qmp = vm.await_qmp();
        self.set_vm(vm);
        qmp.map_err(|e| e.to_string())?;
        self.ctrl = Some(AgentConn::new(ctrl).map_err(|e| format!("the agent socket: {e}"))?);
        let vm = self.vm.as_ref().ok_or("no VM")?;
        // The state was saved with the vCPUs stopped, so the loaded VM waits for `cont`.
        let deadline = Instant::now() + self.home.cfg.boot_timeout;
        loop {
            let st = vm
                .qmp("query-status", json!({}))
                .map_err(|e| e.to_string())?;
            match st.get("status").and_then(|s| s.as_str()) {
                Some("inmigrate") => {}
                Some("paused") | Some("postmigrate") | Some("prelaunch") => break,
                Some("running") => break,
                other => return Err(format!("the VM is {other:?} after loading its state")),
            }
            if Instant::now() > deadline {
                return Err("loading the state took too long".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        vm.qmp("cont", json!({})).map_err(|e| e.to_string())?;
        self.params = params;
        // The guest's wall clock stood still while it was on disk: set it again (with fresh
        // randomness for its CRNG; hostname and tmpfs sizes are the same as before).
        self.configure(self.home.cfg.boot_timeout)
            .map_err(|e| e.to_string())?;
        // The agent answers (and, under TCG, the exec path is translated again).
        let o = self
            .exec(
                &ExecRequest::argv(["true"]),
                &mut |_: cordon_core::OutputStream, _: &[u8]| {},
            )
            .map_err(|e| e.to_string())?;
        if !o.success() {
            return Err(format!(
                "the guest did not run a check exec after the resume ({:?})",
                o.termination
            ));
        }
        Ok(())
    }

    fn gone_err(&self) -> Error {
        Error::Gone {
            id: self.id.to_string(),
            reason: self.gone.clone().unwrap_or_else(|| "destroyed".into()),
        }
    }

    fn ctrl(&mut self) -> Result<&mut AgentConn> {
        if self.gone.is_some() {
            return Err(self.gone_err());
        }
        match self.ctrl.as_mut() {
            Some(c) => Ok(c),
            None => Err(Error::Gone {
                id: self.id.to_string(),
                reason: "destroyed".into(),
            }),
        }
    }

    /// The agent's first frame (`r`, as received) must be its hello in this protocol.
    fn check_hello(&mut self, r: std::result::Result<Frame<Reply>, CallError>) -> Result<()> {
        let f = self.check_call(r, "starting the guest")?;
        match f.header {
            Reply::Hello { version, .. } if version == PROTOCOL_VERSION => Ok(()),
            Reply::Hello { version, .. } => Err(Error::Sandbox(format!(
                "the guest agent speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild the image (`cordon image build`)"
            ))),
            other => Err(sandbox_err(
                "unexpected first message from the guest",
                format!("{other:?}"),
            )),
        }
    }

    /// Gives the guest its identity, limits, clock and fresh randomness.
    fn configure(&mut self, timeout: Duration) -> Result<()> {
        let mut seed = [0u8; 64];
        getrandom::fill(&mut seed).map_err(|e| Error::Sandbox(format!("no randomness: {e}")))?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let l = &self.spec.limits;
        let req = Request::Configure {
            hostname: self.id.short().to_string(),
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            tmp_bytes: l.tmp_bytes,
            unix_time_ms: now,
            egress: match &self.egress {
                Some(e) => Some(e.setup()?),
                None => None,
            },
        };
        let f = self.call(&req, &seed, timeout, HEADER_ROOM, "configuring the guest")?;
        match f.header {
            // An agent built before agents listed features: no file operations.
            Reply::Ok => Ok(()),
            Reply::Configured { features } => {
                self.files = features.iter().any(|f| f == proto::FEATURE_FILES);
                Ok(())
            }
            Reply::Error { message, .. } => Err(sandbox_err("configuring the guest", message)),
            other => Err(sandbox_err(
                "unexpected reply to configure",
                format!("{other:?}"),
            )),
        }
    }

    /// Works out why the VM or its agent went away; records it and returns a message.
    fn diagnose(&mut self, context: &str) -> String {
        let Some(vm) = self.vm.as_mut() else {
            return context.to_string();
        };
        // A panicking guest reboots at once (panic=-1 reboot=t) and QEMU exits (-no-reboot).
        let t0 = Instant::now();
        let mut status = vm.exited();
        while status.is_none() && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
            status = vm.exited();
        }
        let console = vm.console();
        let line = |needle: &str| {
            console
                .lines()
                .find(|l| l.contains(needle))
                .map(|l| l.trim().to_string())
        };
        let (kind, msg) = if let Some(l) = line("Attempted to kill init") {
            ("agent-crash", format!("the guest agent (init) died: {l}"))
        } else if let Some(l) = line("Kernel panic") {
            (
                "guest-kernel-panic",
                format!("the guest kernel panicked: {l}"),
            )
        } else if let Some(l) = line("cordon-guest: fatal") {
            ("agent-crash", format!("the guest agent failed: {l}"))
        } else if let Some(st) = status {
            use std::os::unix::process::ExitStatusExt;
            match st.signal() {
                Some(sig) => ("vmm-crash", format!("QEMU was killed by signal {sig}")),
                None => (
                    "vmm-exit",
                    format!("QEMU exited ({st}): {}", vm.diagnostics()),
                ),
            }
        } else {
            (
                "agent-lost",
                format!("the agent channel failed ({context}); the VM still runs"),
            )
        };
        tracing::warn!(sandbox = %self.id, failure = kind, "{msg}");
        self.failure = Some(kind.to_string());
        self.gone = Some(msg.clone());
        msg
    }

    fn teardown(&mut self) {
        self.ctrl = None;
        // The tunnel and the proxy end (and every placeholder with them).
        self.egress = None;
        self.pid.store(0, Ordering::Release);
        if let Some(mut vm) = self.vm.take() {
            vm.kill();
            let _ = fs::remove_dir_all(&vm.dir);
        }
        if let Some(cg) = self.cgroup.take()
            && !cg.kill_and_remove(Duration::from_secs(5))
        {
            tracing::warn!(sandbox = %self.id, "QEMU's cgroup could not be removed");
        }
        // QEMU is dead: its uid may serve another VM.
        self.uid = None;
    }

    fn env_for(&self, req: &ExecRequest) -> BTreeMap<String, String> {
        let tier_env = self.egress.iter().flat_map(|e| e.link.env());
        cordon_core::sandbox_env(&self.spec, tier_env, req)
    }

    /// The argv, environment, working directory and per-process limits of an exec (a
    /// template without the exec's interpreter refuses it here, foreground or background).
    fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
        let limits = cordon_host::agent::ExecParts::workspace_limits(&self.spec.limits);
        cordon_host::agent::ExecParts::new(
            req,
            &self.spec,
            (Tier::Microvm, false),
            self.env_for(req),
            limits,
        )
    }

    fn run_exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        cordon_host::agent::refuse_foreground_pty(req)?;
        let cordon_host::agent::ExecParts {
            argv,
            env,
            cwd,
            limits: proc_limits,
            pty: _,
        } = self.exec_parts(req)?;
        let limits = self.spec.limits.clone();
        let timeout = Duration::from_millis(req.timeout_ms.unwrap_or(limits.timeout_ms));
        let id = self.next_exec;
        self.next_exec += 1;
        let t0 = Instant::now();
        let request = Request::Exec {
            id,
            argv,
            env,
            cwd,
            stdio: StdioMode::Framed,
            limits: proc_limits,
            last: req.last,
        };
        let stdin = req.stdin.clone().unwrap_or_default();
        let plan = agent::FramedExec {
            id,
            request: &request,
            stdin: &stdin,
            deadline: t0 + timeout,
            stdout_cap: limits.stdout_bytes,
            stderr_cap: limits.stderr_bytes,
            // The wall clock ends the VM, not just the program.
            kill_at_deadline: false,
            kill_grace: Duration::from_secs(5),
            tick: Duration::from_millis(100),
        };
        let driven = agent::run_framed(self.ctrl()?, &plan, sink, &mut || None);
        let run = match driven {
            Ok(run) => run,
            Err(agent::ExecError::Protocol(why)) => {
                self.failure = Some("agent-protocol".into());
                self.gone = Some(format!("its agent broke the protocol: {why}"));
                self.teardown();
                return Err(sandbox_err("the guest agent broke the protocol", why));
            }
            Err(e @ agent::ExecError::SpawnFailed(_)) => return Err(Error::Sandbox(e.to_string())),
            Err(agent::ExecError::Refused(why)) => {
                return Err(sandbox_err("the guest agent refused the exec", why));
            }
        };
        // What the driver and the guest agent saw (the agent reads the exec's own cgroup in
        // the guest: OOM kills and refused forks come with its report).
        let mut seen = run.evidence();
        if seen.agent_lost() {
            // QEMU is the only process of its cgroup, made with the VM: an OOM kill counted
            // there is the memory limit ending the VM, and the agent with it. Read before a
            // teardown removes the cgroup.
            seen.oom_killed |= self
                .cgroup
                .as_ref()
                .is_some_and(|c| c.counters().oom_kills > 0);
        }
        let exit = match run.ended {
            agent::Ended::Exited(exit) => Some(exit),
            agent::Ended::Abandoned => {
                self.gone = Some("its exec reached the timeout and the VM was killed".into());
                self.teardown();
                None
            }
            agent::Ended::KillUnanswered => {
                self.gone = Some("its agent did not answer a kill".into());
                self.teardown();
                None
            }
            agent::Ended::Lost(CallError::Timeout | CallError::Proto(_)) => {
                self.gone = Some("its agent channel failed during an exec".into());
                self.teardown();
                None
            }
            agent::Ended::Lost(_) => {
                self.diagnose("the agent channel closed during an exec");
                None
            }
        };
        let wall = t0.elapsed();
        let mut o = ExecOutcome::new(Tier::Microvm, Termination::Exited);
        o.stdout = run.stdout;
        o.stderr = run.stderr;
        o.stdout_truncated = run.stdout_truncated;
        o.stderr_truncated = run.stderr_truncated;
        o.warnings = self.warnings.clone();
        o.usage.wall_time_us = wall.as_micros() as u64;
        o.timings.run_us = wall.as_micros() as u64;
        o.extra.accelerator = Some(self.accel.as_str().to_string());
        let exit = exit.unwrap_or_default();
        // The guest's own clock measured the program: it is the guest's word, and a restored
        // guest's clock under emulation can run ahead of the host's. Never more than the exec
        // the host timed.
        o.timings.program_us = exit.program_us.min(o.timings.run_us);
        o.exit_code = exit.code;
        o.signal = exit.signal;
        o.usage.cpu_time_us = exit.cpu_us;
        o.usage.peak_memory_bytes = exit.max_rss_bytes;
        o.termination = cordon_core::classify(&seen);
        shared_egress::scan_outcome(&mut o, self.egress.as_mut().map(|e| &mut e.link));
        if o.termination == Termination::OutOfMemory && seen.agent_lost() {
            o.warnings.push(
                "the microVM's memory limit ended it (QEMU was killed for memory); destroy this sandbox and create another"
                    .into(),
            );
        }
        if o.termination == Termination::SandboxFailure {
            let why = self.gone.clone().unwrap_or_else(|| "unknown".into());
            o.warnings.push(format!("the microVM failed: {why}"));
            if let Some(f) = &self.failure {
                o.extra.failure = Some(f.clone());
            }
        }
        Ok(o)
    }
}

impl Sandbox for MicrovmSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        self.ctrl()?;
        self.run_exec(req, sink)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        cordon_core::validate_sandbox_path(path)?;
        let req = Request::PutFile {
            path: path.to_string(),
            mode,
        };
        let f = self.call(&req, data, self.file_timeout, HEADER_ROOM, "writing a file")?;
        match f.header {
            Reply::Ok => Ok(()),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(sandbox_err(
                "unexpected reply to a file write",
                format!("{other:?}"),
            )),
        }
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        cordon_core::validate_sandbox_path(path)?;
        let req = Request::GetFile {
            path: path.to_string(),
            max: max_bytes,
        };
        // The reply may carry at most `max_bytes`: a longer frame is refused from its length,
        // before its body is read, whatever the guest claims.
        let max_frame = usize::try_from(max_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(HEADER_ROOM)
            .min(proto::MAX_FRAME);
        let f = self.call(&req, b"", self.file_timeout, max_frame, "reading a file")?;
        match f.header {
            Reply::File { truncated: false } if f.body.len() as u64 <= max_bytes => {
                let (clean, found) =
                    shared_egress::scan_file(self.egress.as_ref().map(|e| &e.link), path, &f.body);
                self.file_findings.extend(found);
                Ok(clean)
            }
            Reply::File { .. } => Err(Error::File {
                path: path.to_string(),
                reason: format!(
                    "larger than the {max_bytes}-byte limit for files out; raise it or write less"
                ),
            }),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(sandbox_err(
                "unexpected reply to a file read",
                format!("{other:?}"),
            )),
        }
    }

    fn file_op(&mut self, op: &cordon_core::FileOp) -> Result<cordon_core::FileReply> {
        self.file_call(op.name(), |io| cordon_host::files::file_op(io, op))
    }

    fn pause(&mut self) -> Result<()> {
        self.ctrl()?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        vm.qmp("stop", json!({}))
            .map_err(|e| Error::Sandbox(format!("pausing the microVM: {e}")))?;
        Ok(())
    }

    fn pause_to_disk(&mut self) -> Result<u64> {
        if let Some(bytes) = self.on_disk {
            return Ok(bytes);
        }
        self.ctrl()?;
        if self.egress.is_some() {
            return Err(Error::Unsupported {
                what: "pausing a microVM with egress to disk".into(),
                fix: "pause it without to_disk: its egress proxy, CA and grants live in the \
                      server's memory and would not survive; sandboxes without allow_hosts or \
                      grants can be paused to disk"
                    .into(),
            });
        }
        if let Some(t) = &self.spec.resolved_template {
            return Err(Error::Unsupported {
                what: format!("pausing a microVM of template {:?} to disk", t.name),
                fix: "pause it without to_disk: a template's lease and environment are held \
                      by this server process and would not survive a restart; sandboxes \
                      without a template can be paused to disk"
                    .into(),
            });
        }
        let bytes = self.save_to_disk()?;
        self.on_disk = Some(bytes);
        Ok(bytes)
    }

    fn on_disk_bytes(&self) -> Option<u64> {
        self.on_disk
    }

    fn resume(&mut self) -> Result<()> {
        if self.on_disk.is_some() {
            return self.resume_from_disk();
        }
        self.ctrl()?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        vm.qmp("cont", json!({}))
            .map_err(|e| Error::Sandbox(format!("resuming the microVM: {e}")))?;
        Ok(())
    }

    fn start_background(&mut self, req: &ExecRequest) -> Result<u64> {
        self.ctrl()?;
        let parts = self.exec_parts(req)?;
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.background(id);
        self.file_call("a background exec", |io| {
            cordon_host::procs::start(io, &request)
        })?;
        Ok(id)
    }

    fn read_background(
        &mut self,
        id: u64,
        from: [u64; 2],
        max: u64,
    ) -> Result<cordon_core::ProcOutput> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::read(io, id, from, max)
        })
    }

    fn write_background(&mut self, id: u64, data: &[u8]) -> Result<()> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::write(io, id, data)
        })
    }

    fn resize_background(&mut self, id: u64, size: cordon_core::PtySize) -> Result<()> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::resize(io, id, size)
        })
    }

    fn signal_background(&mut self, id: u64, signal: cordon_core::ProcSignal) -> Result<()> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::signal(io, id, signal)
        })
    }

    fn put_archive(
        &mut self,
        dir: &str,
        tar: &mut dyn std::io::Read,
    ) -> Result<cordon_core::ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        let budget = self.spec.limits.disk_bytes;
        self.file_call("uploading a directory", |io| {
            cordon_host::files::put_archive(io, dir, budget, tar)
        })
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<cordon_core::ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        cordon_host::files::refuse_unscanned(&self.spec, dir)?;
        self.file_call("downloading a directory", |io| {
            cordon_host::files::get_archive(io, dir, max_bytes, out)
        })
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn interrupter(&self) -> Option<cordon_core::Interrupter> {
        // QEMU is our child, reaped by destroy or by an exec's timeout. Only a busy sandbox is
        // interrupted, and a pid is handed out again only after the kernel's pid counter
        // wraps (sequential allocation), so the pid cannot name another process by then.
        let pid = self.pid.clone();
        Some(std::sync::Arc::new(move || {
            let p = pid.load(Ordering::Acquire);
            if p > 0 {
                qemu::kill_vm(p)
            }
        }))
    }

    fn report(&mut self) -> cordon_core::Details {
        shared_egress::report(
            &mut self.file_findings,
            self.egress.as_mut().map(|e| &mut e.link),
        )
    }

    fn destroy(&mut self) -> Result<()> {
        if self.gone.as_deref() == Some("destroyed") {
            return Ok(());
        }
        self.teardown();
        // Its state on disk, if it was paused there, goes with it.
        self.on_disk = None;
        self.home.paused.remove(self.id.as_str());
        self.gone = Some("destroyed".into());
        Ok(())
    }
}

impl Drop for MicrovmSandbox {
    /// Destroys it, but a sandbox paused to disk holds no VM: its files stay for a later
    /// process to revive (`Backend::revive`); only `destroy` removes them.
    fn drop(&mut self) {
        if self.on_disk.is_none() {
            let _ = self.destroy();
        }
    }
}
