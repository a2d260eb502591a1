//! Ending a VM: its teardown (QEMU, its directory, cgroup and uid) and the diagnosis of a
//! VM or agent that went away.

use std::fs;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cordon_core::Result;

use super::state::MicrovmSandbox;

impl MicrovmSandbox {
    /// Works out why the VM or its agent went away; records it and returns a message.
    pub(super) fn diagnose(&mut self, context: &str) -> String {
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

    pub(super) fn teardown(&mut self) {
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
}

impl MicrovmSandbox {
    /// `Sandbox::destroy`.
    pub(super) fn destroy_vm(&mut self) -> Result<()> {
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
