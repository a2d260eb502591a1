//! The tier's face: `Backend` for the backend and `Sandbox` for a sandbox, each method
//! handing on to the module of its verb.

use std::sync::atomic::Ordering;

use cordon_core::{
    Backend, Capability, ExecOutcome, ExecRequest, OutputSink, Probe, Result, Sandbox, SandboxId,
    SandboxSpec, Tier,
};
use cordon_host::egress as shared_egress;

use crate::image;
use crate::qemu::{self, Accel};

use super::accel::tcg_warning;
use super::state::{MicrovmBackend, MicrovmSandbox};

impl Backend for MicrovmBackend {
    /// A full boot of the guest (no snapshot): what the first sandbox of a shape costs,
    /// and every sandbox where snapshots are off.
    fn create_unprepared(&self, spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        Some(
            self.create_cold(spec)
                .map(|sb| Box::new(sb) as Box<dyn Sandbox>),
        )
    }

    /// QEMU is spawned tied to the process that starts it and dies with it; what it leaves
    /// of each sandbox named (whose owner is gone) is removed: its paused-to-disk state
    /// (those the server keeps are not named), its cgroup and its run directory (sockets,
    /// console log), both named by the sandbox's short id.
    fn recover(&self, orphans: &[String]) -> Vec<String> {
        let mut removed = Vec::new();
        for name in orphans {
            if self.paused.remove(name) {
                removed.push(format!("paused microVM state of {name}"));
            }
            let Some(id) = SandboxId::parse(name) else {
                continue;
            };
            let dirs = cordon_host::cgroup::dirs_of(
                cordon_host::cgroup::PARENT,
                &format!("vm-{}", id.short()),
            );
            if !dirs.is_empty() {
                cordon_host::cgroup::remove_dirs(&dirs, std::time::Duration::from_secs(5));
                removed.push(format!("microvm: the cgroup of {}", id.short()));
            }
            let run = self.cfg.run_dir.join(id.short());
            if run.is_dir() && std::fs::remove_dir_all(&run).is_ok() {
                removed.push(format!("microvm: the directory of {}", id.short()));
            }
        }
        removed
    }

    fn start_from_snapshot(
        &self,
        image: &cordon_core::SnapshotImage,
        dir: &cordon_core::SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Sandbox>> {
        image
            .mode
            .full_only(self.tier(), "starting a sandbox from a snapshot")?;
        Ok(Box::new(self.start_from_full(image, dir, spec)?))
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
                format!("run `{}`", Tier::Microvm.setup_command()),
            ),
        });
        caps.push(match image::load(&self.cfg.data_dir) {
            Ok(img) => Capability::ok(
                "guest image",
                format!("kernel {}, {}", img.kernel_version, img.rootfs.display()),
            ),
            Err(e) => Capability::missing(
                "guest image",
                e.to_string(),
                format!("run `{}`", Tier::Microvm.setup_command()),
            ),
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

impl Sandbox for MicrovmSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        self.run_exec(req, sink)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        self.write_file(path, data, mode)
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        self.read_file(path, max_bytes)
    }

    fn file_op(&mut self, op: &cordon_core::FileOp) -> Result<cordon_core::FileReply> {
        // Its guest image's agent predates metadata (an op it cannot read would end the
        // call), and the guest's tmpfs may keep no user attributes: refused here.
        if matches!(op, cordon_core::FileOp::SetMetadata { .. }) {
            return Err(cordon_core::Feature::FileMetadata.unsupported_here("metadata on a file"));
        }
        self.file_call(op.name(), |io| cordon_host::files::file_op(io, op))
    }

    fn pause(&mut self) -> Result<()> {
        self.pause_vm()
    }

    fn snapshot(
        &mut self,
        mode: cordon_core::SnapshotMode,
        dir: &cordon_core::SnapshotDir,
    ) -> Result<cordon_core::SnapshotImage> {
        mode.full_only(Tier::Microvm, &format!("a {mode} snapshot"))?;
        self.snapshot_full(dir)
    }

    fn pause_to_disk(&mut self) -> Result<u64> {
        self.pause_vm_to_disk()
    }

    fn on_disk_bytes(&self) -> Option<u64> {
        self.on_disk
    }

    fn resume(&mut self) -> Result<()> {
        self.resume_vm()
    }

    fn start_background(&mut self, req: &ExecRequest) -> Result<u64> {
        self.start_background_exec(req)
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

    fn start_relayed(
        &mut self,
        req: &ExecRequest,
        user: Option<cordon_core::ProcUser>,
    ) -> Result<u64> {
        self.start_relayed_exec(req, user)
    }

    fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::raise(io, id, signal, all)
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

    /// QEMU's cgroup: the guest's memory as the host charges it and the VM's CPU time; the
    /// workspace is a disk inside the guest, not read from the host.
    fn gauge(&self) -> Option<std::sync::Arc<dyn cordon_core::Gauge>> {
        let cg = self.cgroup.as_ref()?;
        Some(std::sync::Arc::new(
            cg.gauge(cordon_host::cgroup::gauge::Workspace::Unknown),
        ))
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
        self.destroy_vm()
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
