//! The snapshots new sandboxes are restored from: made once per VM shape by booting a
//! template VM to "agent ready" and migrating it into the snapshot store.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use cordon_core::Result;
use cordon_guest::proto::{PROTOCOL_VERSION, Reply};
use cordon_host::agent::{AgentConn, CallError, HEADER_ROOM};
use serde_json::json;

use crate::MicrovmError;
use crate::qemu::{RunAs, Vm, VmParams};
use crate::snapshots::Snapshot;

use super::state::{MicrovmBackend, lease_uid};

impl MicrovmBackend {
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
    pub(super) fn make_snapshot(
        &self,
        params: &VmParams,
        partial: &crate::snapshots::Partial,
    ) -> std::result::Result<(), MicrovmError> {
        let mut tpl = params.clone();
        tpl.incoming = false;
        tpl.egress = false;
        let mut suffix = [0u8; 6];
        getrandom::fill(&mut suffix).map_err(|e| MicrovmError::failed("no randomness", e))?;
        let dir = self
            .cfg
            .run_dir
            .join(format!("snap-{}", hex::encode(suffix)));
        let uid = lease_uid(&self.uids)
            .map_err(|e| MicrovmError::failed("leasing the template VM's uid", e))?;
        let run_as = RunAs {
            uid: uid.base(),
            gid: uid.base(),
        };
        let made = self.save_template(&tpl, &dir, run_as, partial);
        // QEMU is dead (killed or dropped) before the RAM file is taken back, its directory
        // goes and its uid returns.
        let reclaimed = self.snapshots.reclaim(partial);
        let _ = fs::remove_dir_all(&dir);
        drop(uid);
        made.and(reclaimed)
    }

    /// The template VM `tpl` started in `dir` as `run_as`, up to its agent's hello, and its
    /// state saved into `partial`; the VM is gone when this returns.
    fn save_template(
        &self,
        tpl: &VmParams,
        dir: &Path,
        run_as: RunAs,
        partial: &crate::snapshots::Partial,
    ) -> std::result::Result<(), MicrovmError> {
        self.snapshots.lend_ram(partial, run_as.uid)?;
        let (mut vm, ctrl, _) = Vm::start(
            tpl,
            dir,
            run_as,
            Vec::new(),
            None,
            partial.ram.as_ref().zip(partial.ram_path.as_deref()),
        )?;
        let mut ctrl = AgentConn::new(ctrl).map_err(|e| MicrovmError::io("the agent socket", e))?;
        self.await_hello(&mut ctrl, &vm)?;
        save_state(&mut vm, partial, tpl.shared_ram)?;
        vm.kill();
        Ok(())
    }

    /// The template VM's agent says hello in this protocol's version within the boot
    /// timeout (a timeout is a stalled boot, tried once more).
    fn await_hello(&self, ctrl: &mut AgentConn, vm: &Vm) -> std::result::Result<(), MicrovmError> {
        let deadline = Instant::now() + self.cfg.boot_timeout;
        match ctrl.recv(deadline, HEADER_ROOM) {
            Ok(f) if matches!(f.header, Reply::Hello { version, .. } if version == PROTOCOL_VERSION) => {
                Ok(())
            }
            Ok(f) => Err(MicrovmError::Qemu(format!(
                "unexpected first message from the guest agent: {:?}",
                f.header
            ))),
            Err(CallError::Timeout) => Err(MicrovmError::BootStalled(format!(
                "the template VM, after {} s: {}",
                self.cfg.boot_timeout.as_secs(),
                vm.diagnostics()
            ))),
            Err(e) => Err(MicrovmError::Failed {
                what: format!(
                    "the template VM did not reach the agent ({})",
                    vm.diagnostics()
                ),
                source: Box::new(e),
            }),
        }
    }

    /// Removes every snapshot (they are remade on demand).
    pub fn clear_snapshots(&self) -> io::Result<()> {
        self.snapshots.clear()
    }
}

/// Has the VM migrate its state into the partial snapshot's stream (handed over as a
/// descriptor; with `shared_ram`, the device state only, the RAM staying in its file) and
/// waits, up to 120 s, for the migration to complete.
fn save_state(
    vm: &mut Vm,
    partial: &crate::snapshots::Partial,
    shared_ram: bool,
) -> std::result::Result<(), MicrovmError> {
    use std::os::fd::AsRawFd;
    let mut commands = Vec::new();
    if shared_ram {
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
            Some("completed") => return Ok(()),
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
}
