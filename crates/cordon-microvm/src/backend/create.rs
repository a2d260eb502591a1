//! Creating a sandbox: its VM booted cold or restored from a snapshot, in its own cgroup
//! and uid, its egress attached and its agent configured (a stalled cold boot is tried
//! once more).

use std::sync::Arc;
use std::sync::atomic::AtomicI32;
use std::time::Instant;

use cordon_core::{Error, ExecRequest, Result, SandboxId, SandboxSpec, Tier};
use cordon_host::agent::{AgentConn, CallError, HEADER_ROOM};
use cordon_host::cgroup::SandboxCgroup;

use crate::MicrovmError;
use crate::egress::VmEgress;
use crate::image::{self, Image};
use crate::qemu::{Accel, Vm, VmParams};
use crate::snapshots::Snapshot;

use super::accel::tcg_warning;
use super::state::{MicrovmBackend, MicrovmSandbox, StartMode, lease_uid};

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

impl MicrovmBackend {
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
            return Err(Attempt::Failed(Error::OtherTier {
                backend: Tier::Microvm,
                asked: spec.tier,
            }));
        }
        let image = self.image_for(spec)?;
        let mut params = self.params(spec, image);
        let snapshot = if mode == StartMode::Restore {
            params.incoming = true;
            params.shared_ram = self.cfg.shared_ram;
            Some(self.ensure_snapshot(&params)?)
        } else {
            None
        };
        let t0 = Instant::now();
        let mut sb = self.unstarted(spec, params, mode)?;
        let mut stalled = false;
        if let Err(e) = self.boot(&mut sb, snapshot, &mut stalled) {
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
            return Err(Attempt::Failed(Error::Failed {
                what: format!("the microVM did not come up after {secs:.1} s ({diag})"),
                source: Box::new(e),
            }));
        }
        if sb.accel == Accel::Tcg && self.cfg.warm_up {
            warm_up(&mut sb)?;
        }
        sb.start_us = t0.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, ?mode, accel = sb.accel.as_str(), start_us = sb.start_us, "microvm ready");
        Ok(sb)
    }

    /// The image the sandbox boots: the tier's, or a template's own disk (made once per
    /// digest); the agent stays the initramfs's. A template's snapshots are its own (the
    /// image's id, part of the snapshot key, carries the template's digest).
    fn image_for(&self, spec: &SandboxSpec) -> Result<Image> {
        let mut image = image::load(&self.cfg.data_dir)?;
        match (&spec.template, &spec.resolved_template) {
            (Some(name), None) => {
                return Err(Error::NotPrepared(cordon_core::Unprepared::Template(
                    name.clone(),
                )));
            }
            (_, Some(t)) => {
                let disk = cordon_template::disk_image_path(&t.root)
                    .or_else(|| self.cfg.root_disk.clone())
                    .ok_or_else(|| {
                        Error::NotPrepared(cordon_core::Unprepared::TemplateRoot(t.name.clone()))
                    })?;
                image::template_disk(&t.root, &disk).map_err(|e| {
                    tracing::error!(template = %t.name, "making the template's disk: {e}");
                    // The error names host paths: it goes to the log, not to the tenant.
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
        Ok(image)
    }

    /// The sandbox before its VM starts: its id, QEMU's own cgroup (the VM's RAM and some
    /// room, its vCPUs' share) and a leased uid.
    fn unstarted(
        &self,
        spec: &SandboxSpec,
        params: VmParams,
        mode: StartMode,
    ) -> Result<MicrovmSandbox> {
        let id = SandboxId::random()?;
        let mut warnings = Vec::new();
        let (accel, why) = self.accel().clone();
        if accel == Accel::Tcg {
            warnings.push(tcg_warning(&why));
        }
        let mem_limit = (params.ram_mib << 20) + (384 << 20);
        let cgroup = SandboxCgroup::create_in(
            self.cfg
                .cgroup_parent
                .as_deref()
                .unwrap_or(cordon_host::cgroup::PARENT),
            &format!("vm-{}", id.short()),
            &cordon_host::cgroup::Limits {
                memory: mem_limit,
                pids: Some(64 + 4 * params.vcpus),
                cpus: spec.limits.cpus.max(params.vcpus as f64 * 0.5),
            },
        )
        .map_err(|e| Error::LayerUnavailable {
            layer: "cgroups".into(),
            reason: format!("QEMU's own cgroup: {e}"),
        })?;
        let uid = lease_uid(&self.uids)?;
        Ok(MicrovmSandbox {
            ram_bytes: params.ram_mib << 20,
            params,
            home: self.home(),
            on_disk: None,
            pid: Arc::new(AtomicI32::new(0)),
            uid: Some(uid),
            file_timeout: self.cfg.file_timeout,
            id,
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
            files: false,
        })
    }

    /// Starts the sandbox's VM (restoring `snapshot` where given) with its egress attached,
    /// waits for a cold-booted agent's hello (`stalled` when it never came) and configures
    /// the agent.
    fn boot(
        &self,
        sb: &mut MicrovmSandbox,
        snapshot: Option<Snapshot>,
        stalled: &mut bool,
    ) -> Result<()> {
        let boot = self.cfg.boot_timeout;
        let dir = self.cfg.run_dir.join(sb.id.short());
        let procs = sb
            .cgroup
            .as_ref()
            .map(|c| c.procs_files())
            .unwrap_or_default();
        if sb.params.egress {
            sb.egress = Some(VmEgress::start(
                sb.id.as_str(),
                &sb.spec,
                &self.cfg.egress_tuning,
            )?);
        }
        let run_as = sb.run_as()?;
        let (vm, ctrl, port) = Vm::start(
            &sb.params,
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
        sb.ctrl = Some(AgentConn::new(ctrl).map_err(|e| MicrovmError::io("the agent socket", e))?);
        if let (Some(e), Some(port)) = (sb.egress.as_mut(), port) {
            e.attach(port)?;
        }
        if sb.mode == StartMode::ColdBoot {
            let r = sb.ctrl()?.recv(Instant::now() + boot, HEADER_ROOM);
            *stalled = matches!(r, Err(CallError::Timeout));
            sb.check_hello(r)?;
        }
        sb.configure(boot)
    }
}

/// Under TCG a guest's first exec pays for translating every code path it takes (the
/// agent's exec handling, the reaper's fork, the loader): several times a later exec. One
/// `true` here takes that off the first real exec, so a sandbox from a warm pool answers at
/// its steady speed; its reaper and namespaces go with it.
fn warm_up(sb: &mut MicrovmSandbox) -> std::result::Result<(), Attempt> {
    let warm = sb.run_exec(
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
            return Err(Attempt::Failed(Error::failed(
                "the microVM did not run its warm-up exec",
                e,
            )));
        }
    }
    Ok(())
}
