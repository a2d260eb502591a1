//! Pausing: the vCPUs stopped in place, or the whole VM saved to disk and its QEMU ended,
//! then resumed (in this process or, from the manifest, a later one).

use std::sync::Arc;
use std::sync::atomic::AtomicI32;
use std::time::{Duration, Instant};

use cordon_core::{Error, ExecRequest, Result, SandboxId};
use cordon_host::agent::AgentConn;
use cordon_host::cgroup::SandboxCgroup;
use serde_json::json;

use crate::MicrovmError;
use crate::image::Image;
use crate::paused;
use crate::qemu::{Accel, Vm};

use super::accel::tcg_warning;
use super::state::{MicrovmBackend, MicrovmSandbox, StartMode, lease_uid};

impl MicrovmBackend {
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

    pub(super) fn sandbox_from(&self, m: paused::Manifest) -> Result<MicrovmSandbox> {
        let id = SandboxId::parse(&m.id)
            .ok_or_else(|| Error::Sandbox("a paused sandbox with a malformed id".into()))?;
        let home = self.home();
        if m.qemu_version != home.qemu_version {
            // A version mismatch: a message, with no error to keep.
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
pub(super) fn await_migration(vm: &Vm, limit: Duration) -> std::result::Result<(), MicrovmError> {
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

impl MicrovmSandbox {
    /// Stops the vCPUs, has QEMU write the whole VM (every RAM page, devices) into a new
    /// state file of the paused store through a descriptor, ends QEMU (its memory, cgroup
    /// and uid go) and records the manifest. On a failure before QEMU is ended, the VM
    /// runs on and nothing is left on disk.
    pub(super) fn save_to_disk(&mut self) -> Result<u64> {
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
            return Err(Error::failed(
                "saving the microVM to disk failed (it runs on, paused nowhere: retry, or pause \
                 it without to_disk)",
                e,
            ));
        }
        // QEMU is done with the descriptor: it ends, and with it the VM's memory and CPU.
        self.teardown();
        let manifest = self.manifest(0);
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
    pub(super) fn resume_from_disk(&mut self) -> Result<()> {
        let r = self.start_from_disk();
        if let Err(e) = r {
            self.teardown();
            self.on_disk = None;
            self.home.paused.remove(self.id.as_str());
            tracing::warn!(sandbox = %self.id, "resuming from disk failed: {e}");
            self.failure.get_or_insert_with(|| "resume-failed".into());
            self.gone = Some(format!("its resume from disk failed: {e}"));
            return Err(Error::failed(
                "resuming the microVM from disk failed (the sandbox is lost, create a new one)",
                e,
            ));
        }
        self.on_disk = None;
        self.home.paused.remove(self.id.as_str());
        Ok(())
    }

    pub(super) fn start_from_disk(&mut self) -> Result<()> {
        let (manifest, state) = self
            .home
            .paused
            .open_state(self.id.as_str())
            .inspect_err(|_| self.failure = Some("paused-state-refused".into()))?;
        if manifest.qemu_version != self.home.qemu_version {
            return Err(Error::Sandbox(
                "it was saved by another QEMU version".into(),
            ));
        }
        self.params.egress = false;
        self.params.named_ram = manifest.named_ram;
        self.start_from_state(&state)
    }

    /// Starts a new confined QEMU (its own cgroup, uid and, with `params.egress`, egress
    /// proxy) that loads `state`, continues the guest where it stopped and configures it as
    /// this sandbox (hostname, clock, sizes, fresh randomness, egress).
    pub(super) fn start_from_state(&mut self, state: &std::fs::File) -> Result<()> {
        let mut params = self.params.clone();
        params.incoming = true;
        params.shared_ram = false;
        let mem_limit = (params.ram_mib << 20) + (384 << 20);
        let cgroup = SandboxCgroup::create(
            &format!("vm-{}", self.id.short()),
            mem_limit,
            64 + 4 * params.vcpus,
            self.spec.limits.cpus.max(params.vcpus as f64 * 0.5),
        )
        .map_err(|e| Error::failed("QEMU's own cgroup", e))?;
        let procs = cgroup.procs_files();
        self.cgroup = Some(cgroup);
        self.uid = Some(lease_uid(&self.home.uids)?);
        let run_as = self.run_as()?;
        let dir = self.home.cfg.run_dir.join(self.id.short());
        if params.egress {
            self.egress = Some(crate::egress::VmEgress::start(
                self.id.as_str(),
                &self.spec,
                &self.home.cfg.egress_tuning,
            )?);
        }
        let (mut vm, ctrl, port) = Vm::start(&params, &dir, run_as, procs, Some(state), None)?;
        let qmp = vm.await_qmp();
        self.set_vm(vm);
        qmp?;
        self.ctrl = Some(AgentConn::new(ctrl).map_err(|e| Error::io("the agent socket", e))?);
        if let (Some(e), Some(port)) = (self.egress.as_mut(), port) {
            e.attach(port)?;
        }
        let vm = self
            .vm
            .as_ref()
            .ok_or_else(|| Error::Sandbox("no VM".into()))?;
        // The state was saved with the vCPUs stopped, so the loaded VM waits for `cont`.
        let deadline = Instant::now() + self.home.cfg.boot_timeout;
        loop {
            let st = vm.qmp("query-status", json!({}))?;
            match st.get("status").and_then(|s| s.as_str()) {
                Some("inmigrate") => {}
                Some("paused") | Some("postmigrate") | Some("prelaunch") => break,
                Some("running") => break,
                // QEMU's answer, no error of its own: a message.
                other => {
                    return Err(Error::Sandbox(format!(
                        "the VM is {other:?} after loading its state"
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Sandbox("loading the state took too long".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        vm.qmp("cont", json!({}))?;
        self.params = params;
        // The guest's wall clock stood still while it was on disk: set it again (with fresh
        // randomness for its CRNG; hostname and tmpfs sizes are the same as before).
        self.configure(self.home.cfg.boot_timeout)?;
        // The agent answers (and, under TCG, the exec path is translated again).
        let o = self.run_exec(
            &ExecRequest::argv(["true"]),
            &mut |_: cordon_core::OutputStream, _: &[u8]| {},
        )?;
        if !o.success() {
            // How the check ended, no error of its own: a message.
            return Err(Error::Sandbox(format!(
                "the guest did not run a check exec after the resume ({:?})",
                o.termination
            )));
        }
        Ok(())
    }
}

impl MicrovmSandbox {
    /// What restores this VM's saved state (written with `state_bytes` of it): its spec,
    /// shape, image and the host side's counters.
    pub(super) fn manifest(&self, state_bytes: u64) -> paused::Manifest {
        paused::Manifest {
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
            state_bytes,
            state_sha256: String::new(),
        }
    }

    /// `Sandbox::pause`.
    pub(super) fn pause_vm(&mut self) -> Result<()> {
        self.ctrl()?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        vm.qmp("stop", json!({}))
            .map_err(|e| Error::failed("pausing the microVM", e))?;
        Ok(())
    }

    /// `Sandbox::pause_to_disk`.
    pub(super) fn pause_vm_to_disk(&mut self) -> Result<u64> {
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

    /// `Sandbox::resume`.
    pub(super) fn resume_vm(&mut self) -> Result<()> {
        if self.on_disk.is_some() {
            return self.resume_from_disk();
        }
        self.ctrl()?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        vm.qmp("cont", json!({}))
            .map_err(|e| Error::failed("resuming the microVM", e))?;
        Ok(())
    }
}
