//! `cordon-guest`: init and agent of a Cordon microVM.
//!
//! The kernel starts it as `/init` from a small initramfs that also holds the kernel modules
//! the guest needs (virtio-mmio, virtio-blk, virtio-console: modules in Debian's cloud
//! kernel). It loads them, mounts the read-only root filesystem from `/dev/vda`, moves onto
//! it, mounts what programs need (`/proc`, `/sys`, a cgroup2 tree, size-limited tmpfs for
//! `/work` and `/tmp`), opens the virtio-serial port named [`PORT_NAME`] and serves the
//! host over it with [`cordon_guest::Agent`] until the host goes away; then it powers the
//! VM off. Anything fatal is printed on the console (the host keeps it) and ends the VM.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_guest::proto::{
    EGRESS_PORT_NAME, EgressSetup, GUEST_CA_BUNDLE_PATH, GUEST_CA_CERT_PATH,
};
use cordon_guest::tunnel::{OnEof, Tunnel};
use cordon_guest::{Agent, AgentConfig, Settings};
use nix::kmod::{ModuleInitFlags, finit_module};
use nix::mount::{MsFlags, mount};
use nix::sys::reboot::{RebootMode, reboot};
use nix::unistd::{Gid, Uid, chown, chroot};

/// The virtio-serial port the host talks on.
const PORT_NAME: &str = "cordon.agent";
/// Programs run as this user and group (`sandbox` in the image's /etc/passwd).
const SANDBOX_ID: u32 = 1000;
/// How long devices may take to appear (TCG boots are slow).
const DEVICE_WAIT: Duration = Duration::from_secs(60);

fn main() {
    if std::process::id() != 1 {
        eprintln!("cordon-guest: this is the microVM's init; it runs as PID 1 only");
        std::process::exit(2);
    }
    let port = match boot() {
        Ok(p) => p,
        Err(e) => fatal(&e),
    };
    let cfg = AgentConfig {
        name: format!("cordon-guest {} (microvm)", env!("CARGO_PKG_VERSION")),
        uid: SANDBOX_ID,
        gid: SANDBOX_ID,
        workdir: PathBuf::from("/work"),
        scratch: vec![PathBuf::from("/work"), PathBuf::from("/tmp")],
        mount_proc: true,
        boot_id: None,
        confine: None,
        winch_on_resize: false,
        standby_idle: Some(cordon_guest::STANDBY_IDLE),
    };
    let agent = match Agent::over_port(cfg, port) {
        Ok(a) => a,
        Err(e) => fatal(&format!("starting the agent: {e}")),
    };
    let result = agent
        .on_configure(Box::new(configure))
        .with_exec_cgroups(PathBuf::from("/sys/fs/cgroup"))
        .serve();
    if let Err(e) = result {
        eprintln!("cordon-guest: the host channel failed: {e}");
    }
    power_off()
}

fn fatal(msg: &str) -> ! {
    eprintln!("cordon-guest: fatal: {msg}");
    power_off()
}

/// Ends the VM. The host runs QEMU with `-no-reboot` and the kernel with `reboot=t`, so a
/// restart request makes QEMU exit at once.
fn power_off() -> ! {
    nix::unistd::sync();
    let _ = reboot(RebootMode::RB_AUTOBOOT);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn mnt(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    let _ = fs::create_dir_all(target);
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(|e| format!("mounting {fstype} on {target}: {e}"))
}

fn boot() -> Result<File, String> {
    let plain = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mnt(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;
    mnt("proc", "/proc", "proc", plain | MsFlags::MS_NODEV, None)?;
    mnt("sysfs", "/sys", "sysfs", plain | MsFlags::MS_NODEV, None)?;
    load_modules(Path::new("/modules"))?;
    wait_for("the root disk /dev/vda", || Path::new("/dev/vda").exists())?;
    // The root's own device nodes and set-id programs do nothing (an image's, through
    // cordon-oci: its /dev/kmsg, a node of the raw root disk): the guest's devices are its
    // devtmpfs's, and no program gains ids from its file.
    mnt(
        "/dev/vda",
        "/newroot",
        "ext4",
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        Some("noload"),
    )?;
    for m in ["/dev", "/proc", "/sys"] {
        let target = format!("/newroot{m}");
        mount(
            Some(m),
            target.as_str(),
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("moving {m} onto the root: {e}"))?;
    }
    nix::unistd::chdir("/newroot").map_err(|e| format!("entering the root: {e}"))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| format!("moving the root to /: {e}"))?;
    chroot(".").map_err(|e| format!("chroot into the root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("entering /: {e}"))?;

    let scratch = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mnt(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        plain | MsFlags::MS_NODEV,
        None,
    )?;
    fs::write("/sys/fs/cgroup/cgroup.subtree_control", b"+memory +pids")
        .map_err(|e| format!("enabling the memory and pids controllers: {e}"))?;
    mnt(
        "tmpfs",
        "/work",
        "tmpfs",
        scratch,
        Some("size=256m,mode=0755"),
    )?;
    chown(
        "/work",
        Some(Uid::from_raw(SANDBOX_ID)),
        Some(Gid::from_raw(SANDBOX_ID)),
    )
    .map_err(|e| format!("chown /work: {e}"))?;
    mnt(
        "tmpfs",
        "/tmp",
        "tmpfs",
        scratch,
        Some("size=64m,mode=1777"),
    )?;
    mnt(
        "tmpfs",
        "/run",
        "tmpfs",
        scratch | MsFlags::MS_NOEXEC,
        Some("size=1m,mode=0755"),
    )?;
    home_mount()?;
    mnt(
        "tmpfs",
        "/dev/shm",
        "tmpfs",
        scratch | MsFlags::MS_NOEXEC,
        Some("size=16m,mode=1777"),
    )?;
    // The guest's terminals: a devpts instance of its own, /dev/ptmx its multiplexer (the
    // guest kernel is the sandbox's, so no terminal of the host is in it either way).
    mnt(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let _ = fs::remove_file("/dev/ptmx");
    std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx")
        .map_err(|e| format!("linking /dev/ptmx: {e}"))?;
    let _ = nix::unistd::sethostname("sandbox");
    // Programs may serve each other on loopback; with egress the forwarder listens there.
    cordon_guest::sys::loopback_up().map_err(|e| format!("bringing loopback up: {e}"))?;

    let mut port = None;
    wait_for("the agent's virtio-serial port", || {
        port = find_port();
        port.is_some()
    })?;
    let dev = port.ok_or("no agent port")?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .map_err(|e| format!("opening {}: {e}", dev.display()))
}

/// The workspace bound again at `/home/user` (E2B's home), so a process started there is
/// there by that name and `/work` names the same files. A root whose `/home/user` is no
/// directory (Debian's, or a template's link to /work) gets it on a small read-only tmpfs
/// over `/home`, the root's other entries of `/home` bound back as they were; a root with
/// no `/home` gets none, and an image whose own `/home/user` holds files keeps them.
fn home_mount() -> Result<(), String> {
    let home = cordon_core::HOME_MOUNT;
    let is_dir = |p: &str| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if is_dir(home) && fs::read_dir(home).map_or(true, |mut d| d.next().is_some()) {
        return Ok(());
    }
    if !is_dir(home) {
        if !is_dir("/home") {
            return Ok(());
        }
        let old = "/run/.home";
        let bind = |from: &str, to: &str| {
            mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .map_err(|e| format!("binding {from} on {to}: {e}"))
        };
        fs::create_dir(old).map_err(|e| format!("creating {old}: {e}"))?;
        bind("/home", old)?;
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mnt("tmpfs", "/home", "tmpfs", flags, Some("size=64k,mode=0755"))?;
        for entry in fs::read_dir(old).map_err(|e| format!("listing /home: {e}"))? {
            let entry = entry.map_err(|e| format!("listing /home: {e}"))?;
            let name = entry.file_name();
            let (from, to) = (Path::new(old).join(&name), Path::new("/home").join(&name));
            let Some((from, to)) = from.to_str().zip(to.to_str()) else {
                continue;
            };
            match entry.file_type() {
                _ if name == "user" => {}
                Ok(t) if t.is_symlink() => {
                    let target = fs::read_link(from).map_err(|e| format!("reading {to}: {e}"))?;
                    std::os::unix::fs::symlink(target, to)
                        .map_err(|e| format!("linking {to}: {e}"))?;
                }
                Ok(t) if t.is_dir() => {
                    fs::create_dir(to).map_err(|e| format!("creating {to}: {e}"))?;
                    bind(from, to)?;
                }
                Ok(_) => {
                    fs::write(to, b"").map_err(|e| format!("creating {to}: {e}"))?;
                    bind(from, to)?;
                }
                Err(e) => return Err(format!("reading {to}: {e}")),
            }
        }
        nix::mount::umount2(old, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| format!("detaching {old}: {e}"))?;
        fs::remove_dir(old).map_err(|e| format!("removing {old}: {e}"))?;
        fs::create_dir(home).map_err(|e| format!("creating {home}: {e}"))?;
        let ro = flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, "/home", None::<&str>, ro, None::<&str>)
            .map_err(|e| format!("making /home read-only: {e}"))?;
    }
    let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some("/work"), home, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("binding /work on {home}: {e}"))
}

/// Loads the modules listed in `dir/order`, in that order (dependencies first).
fn load_modules(dir: &Path) -> Result<(), String> {
    let order = match fs::read_to_string(dir.join("order")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading the module list: {e}")),
    };
    let params = c"";
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f = File::open(dir.join(name)).map_err(|e| format!("opening module {name}: {e}"))?;
        match finit_module(f.as_fd(), params, ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(format!("loading module {name}: {e}")),
        }
    }
    Ok(())
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let t0 = Instant::now();
    while !ready() {
        if t0.elapsed() > DEVICE_WAIT {
            return Err(format!("{what} did not appear within {DEVICE_WAIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn find_port() -> Option<PathBuf> {
    find_named_port(PORT_NAME)
}

fn find_named_port(wanted: &str) -> Option<PathBuf> {
    for entry in fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if name.trim() == wanted {
            let dev = Path::new("/dev").join(entry.file_name());
            if dev.exists() {
                return Some(dev);
            }
        }
    }
    None
}

/// Applies one sandbox's settings: identity, workspace sizes, clock, fresh randomness (a VM
/// restored from a shared snapshot starts with the snapshot's generator state).
fn configure(s: &Settings, seed: &[u8]) -> io::Result<()> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
    let host_ok = !s.hostname.is_empty()
        && s.hostname.len() <= 63
        && s.hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !host_ok {
        return Err(bad("hostname must be 1-63 letters, digits or '-'"));
    }
    if seed.len() < 32 {
        return Err(bad("a random seed of at least 32 bytes is required"));
    }
    let mut urandom = OpenOptions::new().write(true).open("/dev/urandom")?;
    urandom.write_all(seed)?;
    cordon_guest::sys::reseed_crng(&urandom)?;
    nix::unistd::sethostname(&s.hostname)?;
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for (dir, size) in [("/work", s.disk_bytes), ("/tmp", s.tmp_bytes)] {
        let data = format!("size={size}");
        mount(None::<&str>, dir, None::<&str>, flags, Some(data.as_str()))
            .map_err(|e| io::Error::other(format!("resizing {dir}: {e}")))?;
    }
    let _ = fs::set_permissions("/tmp", fs::Permissions::from_mode(0o1777));
    let ts = nix::sys::time::TimeSpec::new(
        (s.unix_time_ms / 1000) as i64,
        ((s.unix_time_ms % 1000) * 1_000_000) as i64,
    );
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts)?;
    if let Some(e) = &s.egress {
        start_egress(e)?;
    }
    Ok(())
}

/// The unprivileged identity the egress forwarder runs as (`nobody`): not the sandbox user,
/// so programs can neither signal nor trace it.
const FORWARDER_ID: u32 = 65534;

/// Sets up the egress path: the CA files under /run/cordon, and a forwarder process that
/// listens on `127.0.0.1:<port>` and carries each connection over the egress port to the
/// host's proxy. Configure comes once per sandbox, while the agent is single-threaded.
fn start_egress(e: &EgressSetup) -> io::Result<()> {
    let ctx = |what: &str, err: io::Error| io::Error::new(err.kind(), format!("{what}: {err}"));
    let dir = Path::new(GUEST_CA_CERT_PATH)
        .parent()
        .unwrap_or(Path::new("/run"));
    fs::create_dir_all(dir).map_err(|err| ctx("creating /run/cordon", err))?;
    for (path, text) in [
        (GUEST_CA_CERT_PATH, &e.ca_cert_pem),
        (GUEST_CA_BUNDLE_PATH, &e.ca_bundle_pem),
    ] {
        fs::write(path, text).map_err(|err| ctx(&format!("writing {path}"), err))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    }
    let dev = find_named_port(EGRESS_PORT_NAME).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("the VM has no {EGRESS_PORT_NAME} port"),
        )
    })?;
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .map_err(|err| ctx(&format!("opening {}", dev.display()), err))?;
    // Listening before any program runs, the agent keeping its copies for the sandbox's
    // life: no program can take the port, even once the forwarder is gone.
    let listeners = cordon_guest::forwarder::listen(e.port).map_err(io::Error::other)?;
    match cordon_guest::sys::fork_into(0)? {
        cordon_guest::sys::Forked::Parent(_) => {
            cordon_guest::forwarder::hold(listeners);
            Ok(())
        }
        cordon_guest::sys::Forked::Child => {
            let code = match forward(listeners, port) {
                Ok(()) => 0,
                Err(err) => {
                    eprintln!("cordon-guest: egress forwarder: {err}");
                    1
                }
            };
            cordon_guest::sys::exit_now(code)
        }
    }
}

/// The forwarder process: keeps only its listeners, the port and stderr (the console),
/// drops to `nobody`, then serves until the tunnel ends.
fn forward(listeners: Vec<TcpListener>, port: File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut keep: Vec<i32> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    keep.extend([port.as_raw_fd(), 2]);
    for fd in 0..1024 {
        if !keep.contains(&fd) {
            let _ = nix::unistd::close(fd);
        }
    }
    let nobody = Gid::from_raw(FORWARDER_ID);
    nix::unistd::setgroups(&[])?;
    nix::unistd::setresgid(nobody, nobody, nobody)?;
    let nobody = Uid::from_raw(FORWARDER_ID);
    nix::unistd::setresuid(nobody, nobody, nobody)?;
    nix::sys::prctl::set_no_new_privs()?;
    let reader = port.try_clone()?;
    let tunnel = std::sync::Arc::new(Tunnel::start(
        Box::new(reader),
        Box::new(port),
        None,
        // The port reads empty while its host end is not (yet) connected.
        OnEof::Retry,
        Box::new(|| {}),
    )?);
    let serve = |listener: TcpListener, tunnel: std::sync::Arc<Tunnel>| {
        for conn in listener.incoming() {
            if tunnel.is_dead() {
                break;
            }
            let Ok(tcp) = conn else { continue };
            let _ = tcp.set_nodelay(true);
            let _ = tunnel.carry(Box::new(tcp));
        }
    };
    let mut listeners = listeners.into_iter();
    let Some(first) = listeners.next() else {
        return Ok(());
    };
    for other in listeners {
        let tunnel = tunnel.clone();
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || serve(other, tunnel))?;
    }
    serve(first, tunnel);
    Ok(())
}
