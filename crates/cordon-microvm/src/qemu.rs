//! Starting and talking to one QEMU process.

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::MicrovmError;
use crate::image::Image;
use crate::sys;
use cordon_guest::proto::EGRESS_PORT_NAME;

/// The name of the agent's virtio-serial port (the guest looks for it).
pub const PORT_NAME: &str = "cordon.agent";
/// Where QEMU sees its own directory, inside its private root.
pub const JAIL_VM_DIR: &str = "/vm";
/// The descriptor a restoring QEMU reads its snapshot from.
pub const INCOMING_FD: i32 = 3;
/// The descriptor QEMU reads the root disk from (`-add-fd`, fd set [`ROOT_FDSET`]): Cordon
/// opens the disk, QEMU never gets its path.
pub const ROOT_DISK_FD: i32 = 4;
/// The fd set of the root disk's descriptor.
const ROOT_FDSET: u32 = 4;
/// Where QEMU sees the snapshot's RAM file, inside its private root.
pub const JAIL_RAM: &str = "/img/ram";
/// The most of QEMU's log and the guest console Cordon reads back (their last bytes).
const LOG_TAIL: u64 = 64 << 10;

/// QEMU's flags for a machine of nothing but what its other flags add: no default devices,
/// no user config, no display, no NIC, and an exit instead of a reboot. The microvm tier's
/// QEMU starts from it, and so does `cordon bench`'s bare-QEMU peer.
pub const BARE_MACHINE: [&str; 7] = [
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-nic",
    "none",
];

/// The accelerator QEMU runs guests with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's software emulation: the same wall, far slower.
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Everything that decides the QEMU command line.
#[derive(Debug, Clone)]
pub struct VmParams {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub vcpus: u32,
    pub ram_mib: u64,
    pub image: Image,
    /// Restore from a snapshot instead of booting: QEMU reads it from descriptor
    /// [`INCOMING_FD`], opened by Cordon (it never gets the snapshot's path).
    pub incoming: bool,
    /// Connect the egress port to a socket Cordon serves (`egress.sock`); otherwise its host
    /// end is QEMU's null device. Not part of the snapshot key: the device model is the same.
    pub egress: bool,
    /// The guest's RAM is the snapshot's RAM file ([`JAIL_RAM`]), not anonymous memory: a
    /// template maps it shared (the guest's memory is written into it) and saves only the
    /// device state (`x-ignore-shared`); a restore maps it private, copy-on-write, from a
    /// read-only descriptor, so the pages no VM writes are one copy in the page cache.
    pub shared_ram: bool,
    /// Under TCG, the size of QEMU's translated-code buffer in MiB: the pages of it that
    /// fill stay resident for the VM's life (ignored under KVM).
    pub tcg_tb_mib: u32,
    /// The guest's RAM is an anonymous memory backend named like the file backend: a VM
    /// resumed from a state saved to disk by one whose RAM was a snapshot's file (the
    /// stream then carries every page, under that backend's name).
    pub named_ram: bool,
}

impl VmParams {
    /// What a snapshot made with these parameters can be restored into.
    pub fn snapshot_key(&self, qemu_version: &str) -> String {
        let mut same_device_model = self.clone();
        same_device_model.egress = false;
        same_device_model.incoming = false;
        let args = same_device_model.args().join(" ");
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

    /// The command line, with the paths QEMU sees inside its private root: its own
    /// directory at [`JAIL_VM_DIR`], the image under `/img`.
    pub fn args(&self) -> Vec<String> {
        let mut a = self.machine_args();
        a.extend(self.ram_args());
        a.extend(self.device_args());
        if self.incoming {
            // With its RAM in a file, the `x-ignore-shared` capability must be set before the
            // stream is read: QMP `migrate-incoming` does it (`Vm::start`).
            let from = if self.shared_ram {
                "defer".to_string()
            } else {
                format!("fd:{INCOMING_FD}")
            };
            a.extend(["-incoming".into(), from]);
        }
        a
    }

    /// The machine, its accelerator and CPU, what QEMU may not do (no defaults, no
    /// network, its own sandbox), the vCPUs and the RAM's size.
    fn machine_args(&self) -> Vec<String> {
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
            Accel::Tcg => ("microvm,isa-serial=on,acpi=on", "tcg", "max"),
        };
        let accel = if self.accel == Accel::Tcg {
            format!("{accel},thread=multi,tb-size={}", self.tcg_tb_mib)
        } else {
            accel.to_string()
        };
        let machine = if self.shared_ram || self.named_ram {
            format!("{machine},memory-backend=ram")
        } else {
            machine.to_string()
        };
        let mut a: Vec<String> = ["-M", &machine, "-accel", &accel, "-cpu", cpu]
            .into_iter()
            .chain(BARE_MACHINE)
            .chain([
                "-sandbox",
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            ])
            .map(str::to_string)
            .collect();
        a.extend([
            "-smp".into(),
            self.vcpus.to_string(),
            "-m".into(),
            format!("{}M", self.ram_mib),
        ]);
        a
    }

    /// The RAM's backend: a named one (to be snapshotted), or the file a snapshot shares or
    /// restores from.
    fn ram_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.named_ram && !self.shared_ram {
            a.extend([
                "-object".into(),
                format!("memory-backend-ram,id=ram,size={}M", self.ram_mib),
            ]);
        }
        if self.shared_ram {
            // `rom=off`: with `readonly=on` the default would make the guest's RAM read-only;
            // here only the file is, and the private mapping of it is the guest's to write.
            let sharing = if self.incoming {
                "share=off,readonly=on,rom=off"
            } else {
                "share=on"
            };
            a.extend([
                "-object".into(),
                format!(
                    "memory-backend-file,id=ram,size={}M,mem-path={JAIL_RAM},{sharing}",
                    self.ram_mib
                ),
            ]);
        }
        a
    }

    /// The console, kernel and initrd, the root disk (a passed descriptor), the serial
    /// ports (egress and agent) and QMP.
    fn device_args(&self) -> Vec<String> {
        let d = |f: &str| format!("{JAIL_VM_DIR}/{f}");
        let mut a = Vec::new();
        a.extend([
            // The console goes to QEMU's stdout: a memory file Cordon opened (and reads with a
            // size cap), so no path in QEMU's directory is ever read back by root.
            "-chardev".into(),
            "stdio,id=con,signal=off".into(),
            "-serial".into(),
            "chardev:con".into(),
            "-kernel".into(),
            "/img/kernel".into(),
            "-initrd".into(),
            "/img/initrd".into(),
            "-append".into(),
            self.cmdline(),
            "-add-fd".into(),
            format!("fd={ROOT_DISK_FD},set={ROOT_FDSET},opaque=root-disk"),
            "-drive".into(),
            format!("id=root,file=/dev/fdset/{ROOT_FDSET},format=raw,if=none,readonly=on"),
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
        a
    }
}

/// A running QEMU and its private directory.
pub struct Vm {
    pub child: Option<Child>,
    /// The VM's directory (QEMU's sockets); QEMU can write in it, so Cordon never follows a
    /// link there or reads back a file from it.
    pub dir: PathBuf,
    pub pid: i32,
    /// The uid QEMU runs as: every socket Cordon connects to in `dir` must be served by it.
    pub uid: u32,
    /// QEMU's stderr and the guest console: memory files Cordon created; QEMU holds only
    /// write descriptors to them.
    log: fs::File,
    console: fs::File,
}

/// The unprivileged identity QEMU runs as.
#[derive(Debug, Clone, Copy)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl Vm {
    /// Starts QEMU confined, in `dir` (created fresh, owned by the QEMU user, mode 0700), and
    /// connects to the agent's port. QEMU waits for that connection before it runs the guest.
    /// `incoming` is the snapshot to restore from (`params.incoming`), opened by Cordon;
    /// `ram` the snapshot's RAM file (`params.shared_ram`) and its path in the store, which
    /// is bound into QEMU's private root (writable only for a template) and checked there to
    /// be the very file Cordon opened.
    pub fn start(
        params: &VmParams,
        dir: &Path,
        run_as: RunAs,
        cgroup_procs: Vec<PathBuf>,
        incoming: Option<&fs::File>,
        ram: Option<(&fs::File, &Path)>,
    ) -> Result<(Vm, UnixStream, Option<UnixStream>), MicrovmError> {
        if params.shared_ram != ram.is_some() {
            return Err(MicrovmError::Qemu(
                "a VM whose RAM is a file needs that file (internal error; report it)".into(),
            ));
        }
        make_vm_dir(dir, run_as)?;
        let log = sys::memory_file(c"qemu-log")
            .map_err(|e| MicrovmError::io("creating the QEMU log", e))?;
        let console = sys::memory_file(c"guest-console")
            .map_err(|e| MicrovmError::io("creating the guest console log", e))?;
        let dup = |f: &fs::File| {
            f.try_clone()
                .map_err(|e| MicrovmError::io("QEMU's log descriptors", e))
        };
        let jail = jail_for(params, dir, ram)?;
        let mut cmd = Command::new("/qemu");
        cmd.arg0(&params.qemu)
            .args(params.args())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::from(dup(&console)?))
            .stderr(Stdio::from(dup(&log)?));
        // The root disk stays open until QEMU has it.
        let (confinement, _disk) = confinement(params, run_as, &cgroup_procs, incoming, jail)?;
        sys::confine(&mut cmd, confinement);
        // From a process-lifetime thread: QEMU's parent-death signal must follow this
        // process, not the (possibly short-lived) thread that asked for the sandbox.
        let child = cordon_host::spawn_tied(cmd).map_err(|e| {
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
            uid: run_as.uid,
            log,
            console,
        };
        let egress = if params.egress {
            Some(vm.connect("egress.sock", "egress")?)
        } else {
            None
        };
        let agent = vm.connect("agent.sock", "agent")?;
        if params.incoming && params.shared_ram {
            vm.migrate_incoming()?;
        }
        Ok((vm, agent, egress))
    }

    /// Starts loading the snapshot (descriptor [`INCOMING_FD`]) into a QEMU started with
    /// `-incoming defer`, with `x-ignore-shared` on: the stream holds no RAM pages, the
    /// guest's memory is the file already mapped. The guest runs once it is loaded.
    fn migrate_incoming(&mut self) -> Result<(), MicrovmError> {
        // QEMU serves QMP once the agent's connection let it go on.
        drop(self.connect("qmp.sock", "QMP")?);
        self.qmp_many(&[
            (
                "migrate-set-capabilities",
                json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]}),
                None,
            ),
            (
                "migrate-incoming",
                json!({"uri": format!("fd:{INCOMING_FD}")}),
                None,
            ),
        ])?;
        Ok(())
    }

    /// Waits until QEMU serves QMP (it opens the socket once the agent's connection let
    /// it go on).
    pub fn await_qmp(&mut self) -> Result<(), MicrovmError> {
        drop(self.connect("qmp.sock", "QMP")?);
        Ok(())
    }

    /// Connects to one of QEMU's server sockets in the VM directory, waiting for it. QEMU
    /// could put a link to any socket there: the socket's server must be QEMU's own uid.
    fn connect(&mut self, file: &str, what: &str) -> Result<UnixStream, MicrovmError> {
        let sock = self.dir.join(file);
        let t0 = Instant::now();
        loop {
            if let Ok(s) = connect_owned(&sock, self.uid) {
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

    /// Kills QEMU and waits until it is gone: QEMU itself (the waiter's child, PID 1 of its
    /// namespace) is killed first and the waiter, which reaps it, exits after it; the waiter
    /// is killed too when QEMU cannot be found.
    pub fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let children = fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
            .unwrap_or_default();
        let mut killed = false;
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            killed |= nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok();
        }
        if !killed {
            let _ = c.kill();
        }
        c.wait().ok()
    }

    /// The last lines QEMU and the guest console printed, for error messages.
    pub fn diagnostics(&self) -> String {
        let tail = |f: &fs::File, n: usize| {
            let text = read_tail(f, LOG_TAIL);
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.contains("waiting for connection"))
                .collect();
            lines[lines.len().saturating_sub(n)..].join(" | ")
        };
        format!(
            "qemu: [{}] console: [{}]",
            tail(&self.log, 3),
            tail(&self.console, 6)
        )
    }

    /// The guest console's last bytes (at most 64 KiB).
    pub fn console(&self) -> String {
        read_tail(&self.console, LOG_TAIL)
    }

    /// One QMP command, on a fresh connection.
    pub fn qmp(&self, command: &str, arguments: Value) -> Result<Value, MicrovmError> {
        qmp_session(
            &self.dir.join("qmp.sock"),
            self.uid,
            &[(command, arguments, None)],
        )
    }

    /// QMP commands on one connection; a command may carry a descriptor (`getfd`).
    pub fn qmp_many(
        &self,
        commands: &[(&str, Value, Option<std::os::fd::RawFd>)],
    ) -> Result<Value, MicrovmError> {
        qmp_session(&self.dir.join("qmp.sock"), self.uid, commands)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The VM's directory: created fresh (never one that already exists: it could be anyone's),
/// mode 0700, owned by the QEMU user.
fn make_vm_dir(dir: &Path, run_as: RunAs) -> Result<(), MicrovmError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| MicrovmError::io("creating the VM run directory", e))?;
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| MicrovmError::io("creating the VM directory", e))?;
    nix::unistd::chown(
        dir,
        Some(nix::unistd::Uid::from_raw(run_as.uid)),
        Some(nix::unistd::Gid::from_raw(run_as.gid)),
    )
    .map_err(|e| MicrovmError::io("giving the VM directory to the QEMU user", e.into()))?;
    Ok(())
}

/// How QEMU is confined: its uid and groups (the owner group of `/dev/kvm` on the KVM
/// path), its cgroup, the snapshot it restores and its root disk under fixed numbers, its
/// private root and Cordon's system call filter. Answers the root disk's descriptor too,
/// which must stay open until QEMU is started.
fn confinement(
    params: &VmParams,
    run_as: RunAs,
    cgroup_procs: &[PathBuf],
    incoming: Option<&fs::File>,
    jail: sys::Jail,
) -> Result<(sys::Confinement, fs::File), MicrovmError> {
    let procs = cgroup_procs
        .iter()
        .filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect();
    let incoming_fd = match (params.incoming, incoming) {
        (true, Some(f)) => Some(f.as_raw_fd()),
        (false, None) => None,
        _ => {
            return Err(MicrovmError::Qemu(
                "a restore needs its snapshot (internal error; report it)".into(),
            ));
        }
    };
    // The root disk, opened here as root (QEMU's uid may not read it: a template's disk
    // is root's alone), numbered above the fixed targets.
    let disk = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&params.image.rootfs)
        .and_then(|f| sys::dup_at_least(&f, ROOT_DISK_FD + 1))
        .map_err(|e| MicrovmError::io("opening the guest's root disk", e))?;
    let groups = if params.accel == Accel::Kvm {
        fs::metadata("/dev/kvm")
            .map(|m| vec![m.gid()])
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let confinement = sys::Confinement {
        uid: run_as.uid,
        gid: run_as.gid,
        groups,
        cgroup_procs: procs,
        incoming: incoming_fd.map(|fd| (fd, INCOMING_FD)),
        root_disk: Some((disk.as_raw_fd(), ROOT_DISK_FD)),
        jail,
        seccomp: crate::seccomp::filter()?,
    };
    Ok((confinement, disk))
}

/// QEMU's private root: a tmpfs (read-only once built) holding only its own directory
/// (`/vm`), its image files (`/img`, read-only), its binary (`/qemu`), the host's `/usr`
/// read-only (QEMU's libraries and firmware) with the usual links to it, `/dev/null`,
/// `/dev/urandom` (and `/dev/kvm` on the KVM path) and the loader cache; with its RAM in a
/// file, that one file at [`JAIL_RAM`] (read-only unless this is the template writing it;
/// checked once bound to be the inode of Cordon's descriptor). No `/proc`, no other VM's
/// directory, no snapshot store, nothing else of the host.
fn jail_for(
    params: &VmParams,
    dir: &Path,
    ram: Option<(&fs::File, &Path)>,
) -> Result<sys::Jail, MicrovmError> {
    let parent = dir
        .parent()
        .ok_or_else(|| MicrovmError::Qemu("the VM directory has no parent".into()))?;
    let root = parent.join(".jail");
    match fs::DirBuilder::new().mode(0o755).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(MicrovmError::io("creating QEMU's root mount point", e)),
    }
    let mut j = JailPlan::new(root)?;
    j.bind_dir(Path::new("/usr"), "usr", false)?;
    j.bind_dir(dir, "vm", true)?;
    for d in ["img", "dev", "etc"] {
        j.dir(d)?;
    }
    // A restore never boots the kernel; QEMU gets only its boot header (`restore_kernel`).
    let kernel = match (&params.image.restore_kernel, params.incoming) {
        (Some(header), true) => header,
        _ => &params.image.kernel,
    };
    j.bind_file(kernel, "img/kernel", false, false)?;
    j.bind_file(&params.image.initrd, "img/initrd", false, false)?;
    j.bind_file(&private_binary(&params.qemu, parent)?, "qemu", false, false)?;
    j.bind_file(Path::new("/dev/null"), "dev/null", true, true)?;
    j.bind_file(Path::new("/dev/urandom"), "dev/urandom", true, true)?;
    j.host_libraries()?;
    if let Some((file, path)) = ram {
        j.ram(file, path, !params.incoming)?;
    }
    if params.accel == Accel::Kvm {
        j.bind_file(Path::new("/dev/kvm"), "dev/kvm", true, true)?;
    }
    j.finish()
}

/// QEMU's private root as it is laid out: each path under `root`, made ready (as C
/// strings) before the fork.
struct JailPlan {
    root: PathBuf,
    jail: sys::Jail,
}

impl JailPlan {
    fn new(root: PathBuf) -> Result<Self, MicrovmError> {
        let jail = sys::Jail {
            root: c_path(&root)?,
            dirs: Vec::new(),
            files: Vec::new(),
            links: Vec::new(),
            binds: Vec::new(),
            expect: Vec::new(),
            old: c_path(&root.join(".old"))?,
            workdir: CString::new(JAIL_VM_DIR)
                .map_err(|_| MicrovmError::Qemu("bad path".into()))?,
        };
        Ok(JailPlan { root, jail })
    }

    fn under(&self, rel: &str) -> Result<CString, MicrovmError> {
        c_path(&self.root.join(rel))
    }

    /// An empty directory.
    fn dir(&mut self, rel: &str) -> Result<(), MicrovmError> {
        let d = self.under(rel)?;
        self.jail.dirs.push(d);
        Ok(())
    }

    /// A host directory bound at `rel` (read-only unless `writable`; never devices).
    fn bind_dir(&mut self, host: &Path, rel: &str, writable: bool) -> Result<(), MicrovmError> {
        self.dir(rel)?;
        let bind = (c_path(host)?, self.under(rel)?, writable, false);
        self.jail.binds.push(bind);
        Ok(())
    }

    /// A host file bound at `rel` (read-only unless `writable`; a device node only with
    /// `devices`).
    fn bind_file(
        &mut self,
        host: &Path,
        rel: &str,
        writable: bool,
        devices: bool,
    ) -> Result<(), MicrovmError> {
        let at = self.under(rel)?;
        self.jail.files.push(at.clone());
        self.jail.binds.push((c_path(host)?, at, writable, devices));
        Ok(())
    }

    /// The host's `/lib`, `/lib64`, `/bin` and `/sbin` as they are there (links to `/usr`,
    /// or directories bound read-only), and the loader cache.
    fn host_libraries(&mut self) -> Result<(), MicrovmError> {
        for top in ["lib", "lib64", "bin", "sbin"] {
            let host = Path::new("/").join(top);
            match fs::read_link(&host) {
                Ok(target) => {
                    let link = (c_path(&target)?, self.under(top)?);
                    self.jail.links.push(link);
                }
                Err(_) if host.is_dir() => self.bind_dir(&host, top, false)?,
                Err(_) => {}
            }
        }
        let cache = Path::new("/etc/ld.so.cache");
        if cache.is_file() {
            self.bind_file(cache, "etc/ld.so.cache", false, false)?;
        }
        Ok(())
    }

    /// The snapshot's RAM file (`file`, opened by Cordon, at `path` in the store) at
    /// [`JAIL_RAM`], writable only for the template writing it.
    fn ram(&mut self, file: &fs::File, path: &Path, writable: bool) -> Result<(), MicrovmError> {
        let m = file
            .metadata()
            .map_err(|e| MicrovmError::io("reading the snapshot's memory file", e))?;
        self.bind_file(path, "img/ram", writable, false)?;
        // The store is root's alone, but a snapshot can be collected and remade between the
        // open and the bind: the bound file must be the one Cordon opened and checked.
        let at = self.under("img/ram")?;
        self.jail.expect.push((at, m.dev(), m.ino()));
        Ok(())
    }

    /// The plan done: the host's old root's mount point last.
    fn finish(mut self) -> Result<sys::Jail, MicrovmError> {
        self.dir(".old")?;
        Ok(self.jail)
    }
}

/// A path as a C string (refused with a NUL byte in it).
fn c_path(p: &Path) -> Result<CString, MicrovmError> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| MicrovmError::Qemu(format!("a path with a NUL byte: {}", p.display())))
}

/// An execute-only copy (mode 0711, root's) of QEMU's binary, made once per binary under
/// `run_dir/.qemu-bin/`: QEMU's uid can run it but not read it, so the kernel makes the
/// process non-dumpable at exec.
fn private_binary(qemu: &Path, run_dir: &Path) -> Result<PathBuf, MicrovmError> {
    let meta = fs::metadata(qemu).map_err(|e| {
        MicrovmError::Qemu(format!(
            "cannot find QEMU ({e}); install qemu-system-x86 (scripts/setup.sh)"
        ))
    })?;
    let id = format!(
        "{:x}-{:x}-{:x}-{:x}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime()
    );
    let dir = run_dir.join(".qemu-bin");
    match fs::DirBuilder::new().mode(0o711).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(MicrovmError::io("creating QEMU's binary directory", e)),
    }
    let bin = dir.join(id);
    if fs::symlink_metadata(&bin)
        .is_ok_and(|m| m.is_file() && m.uid() == 0 && m.mode() & 0o7777 == 0o711)
    {
        return Ok(bin);
    }
    let mut suffix = [0u8; 6];
    getrandom::fill(&mut suffix).map_err(|e| MicrovmError::failed("no randomness", e))?;
    let tmp = dir.join(format!(".tmp-{}", hex::encode(suffix)));
    // Copied by a child process, so no descriptor open for writing on the copy ever exists in
    // this one: a fork by another thread (another sandbox starting) would inherit it until its
    // exec, and QEMU's own exec of the copy would then fail with "Text file busy".
    let copied = Command::new("/bin/cp")
        .arg("--")
        .arg(qemu)
        .arg(&tmp)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| MicrovmError::io("copying QEMU's binary", e))?;
    if !copied.success() {
        let _ = fs::remove_file(&tmp);
        return Err(MicrovmError::Qemu(format!(
            "copying QEMU's binary failed ({copied}); check that the run directory has room"
        )));
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o711))
        .and_then(|()| fs::rename(&tmp, &bin))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            MicrovmError::io("installing QEMU's binary copy", e)
        })?;
    Ok(bin)
}

/// Kills QEMU (the waiter `pid`'s child, PID 1 of its namespace) and then the waiter.
pub fn kill_vm(pid: i32) {
    let children =
        fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// The last `cap` bytes of a file Cordon holds open, as text.
fn read_tail(f: &fs::File, cap: u64) -> String {
    use std::os::unix::fs::FileExt;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(cap);
    let mut buf = vec![0u8; (len - start) as usize];
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], start + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf.truncate(got);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Connects to a unix socket and checks that its server runs as `uid` (a link planted in
/// QEMU's directory cannot point Cordon at another VM's or the host's sockets).
pub fn connect_owned(path: &Path, uid: u32) -> std::io::Result<UnixStream> {
    let s = UnixStream::connect(path)?;
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(std::io::Error::from)?;
    if cred.uid() != uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the socket is not served by this VM's QEMU",
        ));
    }
    Ok(s)
}

/// Sends QMP commands on one connection and returns the last one's `return` value.
pub fn qmp_session(
    sock: &Path,
    uid: u32,
    commands: &[(&str, Value, Option<std::os::fd::RawFd>)],
) -> Result<Value, MicrovmError> {
    let name = commands.last().map(|c| c.0).unwrap_or("qmp");
    let err = |e: std::io::Error| MicrovmError::failed(format!("QMP {name}"), e);
    let s = connect_owned(sock, uid).map_err(err)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(err)?;
    s.set_write_timeout(Some(Duration::from_secs(30)))
        .map_err(err)?;
    let w = s.try_clone().map_err(err)?;
    // Replies are bounded: a QMP line over 1 MiB ends the session.
    let mut r = BufReader::new(std::io::Read::take(s, 16 << 20));
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<usize, MicrovmError> {
        line.clear();
        let n = (&mut r).take(1 << 20).read_line(line).map_err(err)?;
        Ok(n)
    };
    read_line(&mut line)?; // greeting
    let send = |v: Value, fd: Option<std::os::fd::RawFd>| -> Result<(), MicrovmError> {
        let mut text = v.to_string();
        text.push('\n');
        match fd {
            None => (&w).write_all(text.as_bytes()).map_err(err),
            Some(fd) => sys_send_with_fd(&w, text.as_bytes(), fd).map_err(err),
        }
    };
    let mut all = vec![("qmp_capabilities", json!({}), None)];
    all.extend(commands.iter().map(|(c, a, f)| (*c, a.clone(), *f)));
    let mut last = Value::Null;
    for (command, arguments, fd) in all {
        send(json!({"execute": command, "arguments": arguments}), fd)?;
        loop {
            if read_line(&mut line)? == 0 {
                return Err(MicrovmError::Qemu(format!(
                    "QMP {command}: connection closed"
                )));
            }
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| MicrovmError::failed(format!("QMP {command}: bad reply"), e))?;
            if let Some(e) = v.get("error") {
                return Err(MicrovmError::Qemu(format!("QMP {command}: {e}")));
            }
            if let Some(ret) = v.get("return") {
                last = ret.clone();
                break;
            }
        }
    }
    Ok(last)
}

/// Writes `bytes` with `fd` attached (`SCM_RIGHTS`), as QMP's `getfd` expects.
fn sys_send_with_fd(s: &UnixStream, bytes: &[u8], fd: std::os::fd::RawFd) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [std::io::IoSlice::new(bytes)];
    let fds = [fd];
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(std::io::Error::from)?;
    if n < bytes.len() {
        (&*s).write_all(&bytes[n..])?;
    }
    Ok(())
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
