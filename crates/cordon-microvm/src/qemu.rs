//! Starting and talking to one QEMU process.

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::MicrovmError;
use crate::backend::Accel;
use crate::image::Image;
use crate::sys;
use cordon_guest::proto::EGRESS_PORT_NAME;

/// The name of the agent's virtio-serial port (the guest looks for it).
pub const PORT_NAME: &str = "cordon.agent";

/// Everything that decides the QEMU command line.
#[derive(Debug, Clone)]
pub struct VmParams {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub vcpus: u32,
    pub ram_mib: u64,
    pub image: Image,
    /// Restore from this migration file instead of booting.
    pub incoming: Option<PathBuf>,
    /// Connect the egress port to a socket Cordon serves (`egress.sock`); otherwise its host
    /// end is QEMU's null device. Not part of the snapshot key: the device model is the same.
    pub egress: bool,
}

impl VmParams {
    /// What a snapshot made with these parameters can be restored into.
    pub fn snapshot_key(&self, qemu_version: &str) -> String {
        let mut same_device_model = self.clone();
        same_device_model.egress = false;
        let args = same_device_model.args(Path::new("/dir")).join(" ");
        let text = format!("{qemu_version} {} {args}", self.image.id);
        let digest = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes());
        hex::encode(&digest[..12])
    }

    /// The guest kernel's command line. Under TCG the kernel's timer calibration against
    /// the emulated PIT fails when the host is busy (and the boot then hangs), so the TSC
    /// frequency is given (the host's, which TCG's TSC runs at) and calibration skipped.
    fn cmdline(&self) -> String {
        let mut c = String::from(
            "console=ttyS0 quiet panic=-1 reboot=t nmi_watchdog=0 sysctl.kernel.unknown_nmi_panic=1 sysctl.kernel.panic_on_unrecovered_nmi=1 random.trust_cpu=on",
        );
        if self.accel == Accel::Tcg {
            let khz = host_tsc_khz();
            // loops_per_jiffy for the kernel's HZ=250.
            c.push_str(&format!(
                " tsc_early_khz={khz} tsc=reliable no_timer_check lpj={}",
                khz * 4
            ));
        }
        c
    }

    /// The command line; `dir` is the VM's private run directory.
    pub fn args(&self, dir: &Path) -> Vec<String> {
        let d = |f: &str| dir.join(f).display().to_string();
        let (machine, accel, cpu) = match self.accel {
            // The tuned flags of the hardware path: no option ROMs, no legacy PIT/PIC/RTC
            // (KVM's in-kernel irqchip and kvmclock replace them). ACPI stays on: Debian's
            // cloud kernel finds virtio-mmio devices only through it.
            Accel::Kvm => (
                "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,isa-serial=on,acpi=on",
                "kvm",
                "host",
            ),
            // Under TCG the guest kernel needs the PIT to calibrate its clock.
            Accel::Tcg => (
                "microvm,isa-serial=on,acpi=on",
                "tcg,thread=multi,tb-size=128",
                "max",
            ),
        };
        let mut a: Vec<String> = [
            "-M",
            machine,
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-nic",
            "none",
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend([
            "-smp".into(),
            self.vcpus.to_string(),
            "-m".into(),
            format!("{}M", self.ram_mib),
            "-chardev".into(),
            format!("file,id=con,path={}", d("console.log")),
            "-serial".into(),
            "chardev:con".into(),
            "-kernel".into(),
            self.image.kernel.display().to_string(),
            "-initrd".into(),
            self.image.initrd.display().to_string(),
            "-append".into(),
            self.cmdline(),
            "-drive".into(),
            format!(
                "id=root,file={},format=raw,if=none,readonly=on",
                self.image.rootfs.display()
            ),
            "-device".into(),
            "virtio-blk-device,drive=root".into(),
            "-device".into(),
            "virtio-serial-device,max_ports=3".into(),
            // The egress port's host end, before the agent's: with egress QEMU waits for
            // Cordon to connect to it first.
            "-chardev".into(),
            if self.egress {
                format!(
                    "socket,id=egress,path={},server=on,wait=on",
                    d("egress.sock")
                )
            } else {
                "null,id=egress".into()
            },
            "-device".into(),
            format!("virtserialport,chardev=egress,name={EGRESS_PORT_NAME},nr=2"),
            "-chardev".into(),
            format!("socket,id=agent,path={},server=on,wait=on", d("agent.sock")),
            "-device".into(),
            format!("virtserialport,chardev=agent,name={PORT_NAME},nr=1"),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", d("qmp.sock")),
        ]);
        if let Some(f) = &self.incoming {
            a.extend(["-incoming".into(), format!("file:{}", f.display())]);
        }
        a
    }
}

/// A running QEMU and its private directory.
pub struct Vm {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub pid: i32,
}

/// The unprivileged identity QEMU runs as.
#[derive(Debug, Clone, Copy)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl Vm {
    /// Starts QEMU confined, in `dir` (created, owned by the QEMU user, mode 0700), and
    /// connects to the agent's port. QEMU waits for that connection before it runs the guest.
    pub fn start(
        params: &VmParams,
        dir: &Path,
        run_as: RunAs,
        cgroup_procs: Vec<PathBuf>,
    ) -> Result<(Vm, UnixStream, Option<UnixStream>), MicrovmError> {
        fs::create_dir_all(dir).map_err(|e| MicrovmError::io("creating the VM directory", e))?;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
        nix::unistd::chown(
            dir,
            Some(nix::unistd::Uid::from_raw(run_as.uid)),
            Some(nix::unistd::Gid::from_raw(run_as.gid)),
        )
        .map_err(|e| MicrovmError::io("giving the VM directory to the QEMU user", e.into()))?;
        let log = fs::File::create(dir.join("qemu.log"))
            .map_err(|e| MicrovmError::io("creating the QEMU log", e))?;
        let mut cmd = Command::new(&params.qemu);
        cmd.args(params.args(dir))
            .env_clear()
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        let procs = cgroup_procs
            .iter()
            .filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
            .collect();
        sys::confine(
            &mut cmd,
            sys::Confinement {
                uid: run_as.uid,
                gid: run_as.gid,
                cgroup_procs: procs,
            },
        );
        // From a process-lifetime thread: QEMU's parent-death signal must follow this
        // process, not the (possibly short-lived) thread that asked for the sandbox.
        let child = cordon_guest::host::spawn_tied(cmd).map_err(|e| {
            MicrovmError::Qemu(format!(
                "cannot start {}: {e}; install qemu-system-x86 (scripts/setup.sh)",
                params.qemu.display()
            ))
        })?;
        let pid = child.id() as i32;
        let mut vm = Vm {
            child: Some(child),
            dir: dir.to_path_buf(),
            pid,
        };
        let egress = if params.egress {
            Some(vm.connect("egress.sock", "egress")?)
        } else {
            None
        };
        let agent = vm.connect("agent.sock", "agent")?;
        Ok((vm, agent, egress))
    }

    /// Connects to one of QEMU's server sockets in the VM directory, waiting for it.
    fn connect(&mut self, file: &str, what: &str) -> Result<UnixStream, MicrovmError> {
        let sock = self.dir.join(file);
        let t0 = Instant::now();
        loop {
            if let Ok(s) = UnixStream::connect(&sock) {
                return Ok(s);
            }
            if let Some(status) = self.exited() {
                return Err(MicrovmError::Qemu(format!(
                    "QEMU exited at start ({status}): {}",
                    self.diagnostics()
                )));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                self.kill();
                return Err(MicrovmError::Qemu(format!(
                    "QEMU did not open the {what} socket within 20 s"
                )));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// The exit status, once QEMU has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills QEMU and waits for it.
    pub fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = c.kill();
        c.wait().ok()
    }

    /// The last lines QEMU and the guest console printed, for error messages.
    pub fn diagnostics(&self) -> String {
        let tail = |f: &str, n: usize| {
            let text = fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.contains("waiting for connection"))
                .collect();
            lines[lines.len().saturating_sub(n)..].join(" | ")
        };
        format!(
            "qemu: [{}] console: [{}]",
            tail("qemu.log", 3),
            tail("console.log", 6)
        )
    }

    /// The guest console's text.
    pub fn console(&self) -> String {
        fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// One QMP command, on a fresh connection.
    pub fn qmp(&self, command: &str, arguments: Value) -> Result<Value, MicrovmError> {
        qmp(&self.dir.join("qmp.sock"), command, arguments)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends one QMP command and returns its `return` value.
pub fn qmp(sock: &Path, command: &str, arguments: Value) -> Result<Value, MicrovmError> {
    let err = |e: std::io::Error| MicrovmError::Qemu(format!("QMP {command}: {e}"));
    let s = UnixStream::connect(sock).map_err(err)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(err)?;
    let mut w = s.try_clone().map_err(err)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(err)?; // greeting
    let mut send = |v: Value| -> Result<(), MicrovmError> {
        let mut text = v.to_string();
        text.push('\n');
        w.write_all(text.as_bytes()).map_err(err)
    };
    send(json!({"execute": "qmp_capabilities"}))?;
    send(json!({"execute": command, "arguments": arguments}))?;
    let mut returns = 0;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(err)? == 0 {
            return Err(MicrovmError::Qemu(format!(
                "QMP {command}: connection closed"
            )));
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| MicrovmError::Qemu(format!("QMP {command}: bad reply: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(MicrovmError::Qemu(format!("QMP {command}: {e}")));
        }
        if let Some(ret) = v.get("return") {
            returns += 1;
            if returns == 2 {
                return Ok(ret.clone());
            }
        }
    }
}

/// `qemu-system-x86_64 --version`'s first line (snapshots are keyed by it).
pub fn version(qemu: &Path) -> Option<String> {
    let out = Command::new(qemu).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
}

/// The host's TSC frequency in kHz, rounded to 100 MHz so that frequency noise does not
/// change snapshot keys; 2 GHz when unknown.
pub fn host_tsc_khz() -> u64 {
    let mhz = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(2000.0);
    ((mhz / 100.0).round() as u64).max(1) * 100_000
}
