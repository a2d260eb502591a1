//! The sandbox init, entered by re-exec of the small `cordon-sandbox-init` binary.
//!
//! It starts on the host as root with the agent socket as its stdin. The host talks to it
//! in three frames, each sent as soon as the host knows its contents:
//! 1. [`InitBegin`] (the id maps): the init forks a child into fresh user, PID, mount,
//!    network, IPC, UTS and cgroup namespaces and writes the child's uid/gid maps (the
//!    sandbox's root maps to an unprivileged host uid; host root is never mapped). A CLI
//!    sends it before it has even parsed its arguments.
//! 2. [`InitSetup`] (from the request): passed on to the child, which builds the sandbox
//!    root's mounts while the host prepares the cgroup (and egress proxy).
//! 3. [`InitJoin`]: the init moves the child into the cgroup, then passes the join on; only
//!    then does the child finish its root, pivot into it and become the agent. Nothing the
//!    sandbox runs starts before it is in its cgroup.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Uid, setresgid, setresuid};
use serde::{Deserialize, Serialize};

use cordon_guest::proto::{ErrorCode, ProtoError, Reply, read_frame, write_frame};
use cordon_guest::sys::{Forked, fork_into, own_fd};
use cordon_guest::{Agent, AgentConfig};

use crate::landlock_rules;
use crate::seccomp::SeccompPolicy;
pub use crate::volumes::InitVolume;
use crate::volumes::{make_bind_points, mount_volumes, volume_mounts};

/// The host's first frame: enough to make the namespaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBegin {
    /// Host uid/gid that the sandbox's uid/gid 0 maps to; `id_count` ids are mapped.
    pub id_base: u32,
    pub id_count: u32,
    /// A network namespace to join instead of making one (a kubelet's pod's, walled by
    /// cordon-oci before any sandbox joins it: ADR 0029). The init joins it as host root,
    /// before the sandbox's user namespace exists, so nothing in the sandbox holds a
    /// capability over it. Left out: the sandbox's own (loopback only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
}

/// The host's second frame: how the sandbox is built, from the request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitSetup {
    /// The unprivileged user programs run as, inside.
    pub sandbox_uid: u32,
    pub hostname: String,
    pub disk_bytes: u64,
    pub tmp_bytes: u64,
    /// Enforce Landlock (false only when the caller allowed running without it).
    pub landlock: bool,
    /// Seccomp filters to install in each program; none when the caller allowed without.
    pub seccomp: Option<Vec<Vec<u64>>>,
    /// A template's read-only root on the host: the sandbox's root is made from it instead
    /// of the host's `/usr` (docs/templates.md). Left out when none, so a setup without
    /// one reads the same as before templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_root: Option<PathBuf>,
    /// `template_root` is a template build's own working copy (`cordon template build`):
    /// it is the sandbox's root, writable, with Cordon's files bound over it, and Landlock
    /// lets the step write anywhere in it. Never set for a template of the store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template_writable: bool,
    /// Host device nodes the operator allowed by name (cordon-oci's node allowances), as
    /// names under `/dev` (`fuse`, `net/tun`): each bound from the host's `/dev` at the
    /// same path, readable and writable as its own mode says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
}

/// A name under `/dev` for an extra device: plain components only, never one of the
/// sandbox's own devices or links.
fn check_device_name(name: &str) -> Result<(), String> {
    let plain = !name.is_empty()
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    let first = name.split('/').next().unwrap_or_default();
    let own = DEVICES.contains(&name)
        || ["fd", "stdin", "stdout", "stderr", "ptmx", "pts", "shm"].contains(&first);
    if plain && !own {
        Ok(())
    } else {
        Err(format!(
            "device /dev/{name} cannot be given: not a plain extra device name"
        ))
    }
}

/// What the host tells init once the sandbox's cgroup (and egress proxy) exist; the
/// sandbox's namespaces and most of its root are made while the host prepares them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitJoin {
    /// `cgroup.procs` files the sandbox's first process is moved into before it runs
    /// anything; empty when cgroups are weakened.
    pub cgroup_procs: Vec<PathBuf>,
    /// Extra text files to create (read-only) under the sandbox's /etc, e.g. a CA.
    #[serde(default)]
    pub extra_files: Vec<(String, String)>,
    /// Host files to copy (read-only, world-readable) under the sandbox's /etc: `(host
    /// path, path inside)`, e.g. a CA bundle. A file given for several paths is copied once
    /// and hard-linked to the others.
    #[serde(default)]
    pub extra_copies: Vec<(PathBuf, String)>,
    /// Loopback port the egress forwarder listens on (held by it for the sandbox's life: no
    /// program can bind it).
    #[serde(default)]
    pub connect_port: Option<u16>,
    /// Host path of the egress proxy's unix socket, bound into the sandbox; a forwarder on
    /// `connect_port` relays to it.
    #[serde(default)]
    pub egress_socket: Option<PathBuf>,
    /// Volumes to mount under /work, in order (ADR 0011). Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<InitVolume>,
}

/// Directories from the host bound read-only into the sandbox (or recreated as the same
/// symlinks where the host has merged /usr).
const HOST_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Where the sandbox root is built (a tmpfs over the host's /tmp path, in the sandbox's
/// private mount namespace) before it becomes `/`.
const ROOT_BUILT_AT: &str = "/tmp";

/// Most volumes one sandbox mounts: its leased volumes and its host binds (the host refuses
/// more: `cordon_core::MAX_MOUNTS`, `cordon_core::MAX_HOST_BINDS`).
const MAX_VOLUMES: usize = cordon_core::MAX_MOUNTS + cordon_core::MAX_HOST_BINDS;

/// Scheduling priority of every process of a sandbox (the host's default is 0).
pub const SANDBOX_NICE: i32 = 5;

/// Entry point of the init binary. Never returns.
pub fn main() -> ! {
    // The host passes the agent socket as stdin; move it off fd 0 and put /dev/null there.
    let sock = match nix::fcntl::fcntl(std::io::stdin(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3)) {
        Ok(fd) => UnixStream::from(own_fd(fd)),
        Err(_) => std::process::exit(1),
    };
    if let Ok(null) = fs::File::open("/dev/null") {
        let _ = cordon_guest::sys::dup2_to(&null, 0);
    }
    let code = run_outer(sock).unwrap_or(1);
    std::process::exit(code)
}

fn report(sock: &mut UnixStream, message: String) {
    let _ = write_frame(
        sock,
        &Reply::Error {
            code: ErrorCode::SpawnFailed,
            message,
        },
        b"",
    );
}

fn run_outer(mut sock: UnixStream) -> io::Result<i32> {
    let begin: InitBegin = match read_frame(&mut sock) {
        Ok(f) => f.header,
        // The host went away before asking for anything (a CLI that started us ahead of
        // parsing its arguments, then found it needs no container).
        Err(ProtoError::Closed) => return Ok(0),
        Err(e) => {
            report(&mut sock, format!("init received a bad first frame: {e}"));
            return Ok(1);
        }
    };
    // Die with the host process that started us.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    // The whole sandbox runs a little below the host's own processes: when the host's few
    // cores are all busy, Cordon's control plane (the server answering, the CLI reporting)
    // goes first, and a busy sandbox cannot starve it. An idle host runs it at full speed.
    let _ = cordon_guest::sys::set_nice(SANDBOX_NICE);
    if let Some(ns) = &begin.netns
        && let Err(e) = crate::sys::join_netns(ns)
    {
        report(
            &mut sock,
            format!("joining the pod's network namespace: {e}"),
        );
        return Ok(1);
    }
    let own_net = if begin.netns.is_some() {
        0
    } else {
        libc::CLONE_NEWNET
    };
    let (go_r, go_w) = nix::unistd::pipe()?;
    // A socket, not a pipe: the join carries the volumes' mounts as descriptors.
    let (to_child_w, to_child_r) = UnixStream::pair()?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | own_net
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    // A user namespace is owned by, and its use of per-user kernel counts (inotify,
    // fanotify, message queue bytes, pending signals, namespaces) is charged to, the host
    // id that creates it: that is the sandbox's own root id, not host root's. Only the
    // effective ids change, with the capabilities kept across the change (so hosts that
    // restrict unprivileged user namespaces still allow it), and both are restored at once.
    let owner = begin.id_base;
    let bits = crate::sys::securebits()?;
    crate::sys::set_securebits(bits | crate::sys::SECBIT_NO_SETUID_FIXUP)?;
    let (root_u, root_g) = (Uid::from_raw(0), Gid::from_raw(0));
    setresgid(root_g, Gid::from_raw(owner), root_g)?;
    setresuid(root_u, Uid::from_raw(owner), root_u)?;
    let forked = fork_into(flags);
    if !matches!(forked, Ok(Forked::Child)) {
        setresuid(root_u, root_u, root_u)?;
        setresgid(root_g, root_g, root_g)?;
        crate::sys::set_securebits(bits)?;
    }
    match forked {
        Err(e) => {
            report(
                &mut sock,
                format!("creating namespaces: {e} (are user namespaces enabled?)"),
            );
            Ok(1)
        }
        Ok(Forked::Child) => {
            // Before anything else: uid changes must drop capabilities again in here.
            if crate::sys::set_securebits(bits).is_err() {
                cordon_guest::sys::exit_now(1)
            }
            drop(go_w);
            drop(to_child_w);
            let code = match run_child(&mut sock, go_r, to_child_r, own_net != 0) {
                Ok(()) => 0,
                Err(msg) => {
                    report(&mut sock, msg);
                    1
                }
            };
            cordon_guest::sys::exit_now(code)
        }
        Ok(Forked::Parent(child)) => {
            drop(go_r);
            drop(to_child_r);
            // Hold the sandbox's mount namespace until the agent has been reaped. Its exit
            // then only drops a reference: it leaves the cgroup at once, and the host
            // removes the cgroup while this process, dropping the namespace on return,
            // unmounts the sandbox's filesystems. Without the hold (no /proc here) the
            // agent's own exit unmounts them, before the cgroup can go.
            let _held_mounts = fs::File::open(format!("/proc/{child}/ns/mnt")).ok();
            let fail = |sock: &mut UnixStream, message: String| {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                report(sock, message);
                Ok(1)
            };
            let map = format!("0 {} {}\n", begin.id_base, begin.id_count);
            let mapped = fs::write(format!("/proc/{child}/uid_map"), &map)
                .and_then(|_| fs::write(format!("/proc/{child}/gid_map"), &map));
            if let Err(e) = mapped {
                return fail(
                    &mut sock,
                    format!("writing the user namespace id maps: {e}"),
                );
            }
            let mut go = fs::File::from(go_w);
            go.write_all(b"g")?;
            drop(go);
            // The child reads the setup and the join from this socket; a child that failed
            // has reported why on the socket, and its exit status says the rest.
            let mut to_child = to_child_w;
            let setup: InitSetup = match from_host(&mut sock, "setup") {
                Ok(setup) => setup,
                Err(message) => return fail(&mut sock, message),
            };
            let _ = write_frame(&mut to_child, &setup, b"");
            let join: InitJoin = match from_host(&mut sock, "join") {
                Ok(join) => join,
                Err(message) => return fail(&mut sock, message),
            };
            let pid = child.to_string();
            for procs in &join.cgroup_procs {
                if let Err(e) = fs::write(procs, &pid) {
                    return fail(
                        &mut sock,
                        format!("moving the sandbox into cgroup {}: {e}", procs.display()),
                    );
                }
            }
            let mounts = match volume_mounts(child, &join.volumes) {
                Ok(m) => m,
                Err(message) => return fail(&mut sock, message),
            };
            let _ = write_frame(&mut to_child, &join, b"");
            if !mounts.is_empty() {
                let _ = send_fds(&to_child, &mounts);
            }
            drop(mounts);
            drop(to_child);
            drop(sock);
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, c)) => return Ok(c),
                    Ok(WaitStatus::Signaled(_, s, _)) => return Ok(128 + s as i32),
                    Ok(_) => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

/// The host's next frame, or what went wrong.
fn from_host<T: serde::de::DeserializeOwned>(
    sock: &mut UnixStream,
    what: &str,
) -> Result<T, String> {
    match read_frame(sock) {
        Ok(f) => Ok(f.header),
        Err(ProtoError::Closed) => Err(format!("the host went away before the {what}")),
        Err(e) => Err(format!("init received a bad {what}: {e}")),
    }
}

/// Sends descriptors on one byte of their own.
fn send_fds(to: &UnixStream, fds: &[OwnedFd]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [io::IoSlice::new(b"v")];
    sendmsg::<()>(
        to.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Takes `n` descriptors sent by [`send_fds`].
fn recv_fds(from: &UnixStream, n: usize) -> Result<Vec<OwnedFd>, String> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::{AsRawFd, RawFd};
    let mut buf = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; MAX_VOLUMES]);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        from.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("receiving the volumes' mounts: {e}"))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| format!("receiving the volumes' mounts: {e}"))?
    {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(own_fd));
        }
    }
    if fds.len() != n {
        return Err(format!("expected {n} volume mounts, got {}", fds.len()));
    }
    Ok(fds)
}

fn run_child(
    sock: &mut UnixStream,
    go: OwnedFd,
    from_parent: UnixStream,
    own_net: bool,
) -> Result<(), String> {
    let ctx = |what: &str| {
        let what = what.to_string();
        move |e: nix::errno::Errno| format!("{what}: {e}")
    };
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(ctx("pdeathsig"))?;
    let mut b = [0u8; 1];
    fs::File::from(go)
        .read_exact(&mut b)
        .map_err(|e| format!("waiting for the id maps: {e}"))?;
    let root = Uid::from_raw(0);
    setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)).map_err(ctx("setresgid"))?;
    setresuid(root, root, root).map_err(ctx("setresuid"))?;
    // A credential change clears the parent-death signal: set it again, so the whole
    // sandbox dies with the init process the host holds.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(ctx("pdeathsig"))?;
    // A pod's namespace is not the sandbox's to set up: its loopback is up (CNI's), and
    // nothing in here holds a capability over it.
    if own_net {
        crate::sys::loopback_up().map_err(|e| format!("bringing loopback up: {e}"))?;
    }
    let mut from_parent = from_parent;
    let setup: InitSetup = read_frame(&mut from_parent)
        .map_err(|e| format!("waiting for the setup: {e}"))?
        .header;
    nix::unistd::sethostname(&setup.hostname).map_err(ctx("sethostname"))?;
    build_root(&setup)?;
    // Nothing past this point runs before the parent has moved us into the sandbox's
    // cgroup (it passes the join on only after that).
    let join: InitJoin = read_frame(&mut from_parent)
        .map_err(|e| format!("waiting to join the cgroup: {e}"))?
        .header;
    let volumes = if join.volumes.is_empty() {
        Vec::new()
    } else if join.volumes.len() > MAX_VOLUMES {
        return Err(format!("more than {MAX_VOLUMES} volumes"));
    } else {
        recv_fds(&from_parent, join.volumes.len())?
    };
    drop(from_parent);
    // The cgroup namespace was made before the move, rooted at the host's cgroup: a fresh
    // one roots it at the sandbox's own, so /proc/self/cgroup shows no host path.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(ctx("entering a cgroup namespace"))?;
    finish_root(&join, &setup, volumes)?;
    // After the pivot: /proc is the sandbox's own (its PID namespace's instance), so the
    // lookups below walk only its own entries. Through the host's /proc every live user
    // namespace's /proc/sys/user entries share one dentry hash chain, and each write here
    // walked them all: a create cost time in proportion to the live sandboxes (ADR 0026).
    // Nothing of the sandbox runs yet: the agent starts below.
    limit_user_counts()?;
    if let (Some(port), Some(_)) = (join.connect_port, &join.egress_socket) {
        cordon_guest::forwarder::spawn(
            port,
            std::path::Path::new(cordon_guest::proto::EGRESS_SOCKET_INSIDE),
        )?;
    }
    let ruleset = if setup.landlock {
        // The init reports its failures to the host as text over its socket: the typed
        // error ends here as its message.
        Some(
            landlock_rules::build(
                setup.template_writable,
                &setup.devices,
                &crate::volumes::writable_binds(&join.volumes),
            )
            .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let seccomp = setup.seccomp.as_deref().map(SeccompPolicy::from_wire);
    nix::sys::prctl::set_dumpable(false).map_err(ctx("set_dumpable"))?;
    let confine: cordon_guest::Confine = Box::new(move || {
        if let Some(r) = &ruleset {
            landlock_rules::enforce(r)?;
        }
        if let Some(s) = &seccomp {
            s.apply()?;
        }
        Ok(())
    });
    let cfg = AgentConfig {
        name: format!("cordon-sandbox-init {}", env!("CARGO_PKG_VERSION")),
        uid: setup.sandbox_uid,
        gid: setup.sandbox_uid,
        workdir: PathBuf::from("/work"),
        // A full volume is a full disk too (its quota is its file system's size).
        scratch: [PathBuf::from("/work"), PathBuf::from("/tmp")]
            .into_iter()
            .chain(
                join.volumes
                    .iter()
                    .filter(|v| !v.read_only)
                    .map(|v| Path::new("/work").join(&v.path)),
            )
            .collect(),
        mount_proc: true,
        confine: Some(confine),
        winch_on_resize: false,
    };
    let sock = sock.try_clone().map_err(|e| format!("agent socket: {e}"))?;
    let agent = Agent::new(cfg, sock).map_err(|e| format!("starting the agent: {e}"))?;
    agent.serve().map_err(|e| format!("agent: {e}"))
}

/// The sandbox's own per-user limits (`/proc/sys/user/*` of its user namespace), each
/// below what its host id may use in total. No namespaces but the PID and mount namespace
/// the agent makes for each exec; no fanotify.
pub const USER_NS_LIMITS: [(&str, u64); 12] = [
    ("max_inotify_instances", 64),
    ("max_inotify_watches", 8192),
    ("max_fanotify_groups", 0),
    ("max_fanotify_marks", 0),
    ("max_user_namespaces", 0),
    ("max_net_namespaces", 0),
    ("max_ipc_namespaces", 0),
    ("max_uts_namespaces", 0),
    ("max_cgroup_namespaces", 0),
    ("max_time_namespaces", 0),
    ("max_pid_namespaces", 64),
    ("max_mnt_namespaces", 64),
];

/// Writes [`USER_NS_LIMITS`] (a kernel without an entry has nothing to limit there).
fn limit_user_counts() -> Result<(), String> {
    for (name, value) in USER_NS_LIMITS {
        match fs::write(format!("/proc/sys/user/{name}"), value.to_string()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("limiting the sandbox's {name}: {e}")),
        }
    }
    Ok(())
}

/// Mount flags a bind mount must keep (locked by the kernel in a user namespace).
fn locked_flags(src: &Path) -> MsFlags {
    let mut f = MsFlags::empty();
    if let Ok(st) = nix::sys::statvfs::statvfs(src) {
        use nix::sys::statvfs::FsFlags;
        let fl = st.flags();
        if fl.contains(FsFlags::ST_NOSUID) {
            f |= MsFlags::MS_NOSUID;
        }
        if fl.contains(FsFlags::ST_NODEV) {
            f |= MsFlags::MS_NODEV;
        }
        if fl.contains(FsFlags::ST_NOEXEC) {
            f |= MsFlags::MS_NOEXEC;
        }
        if fl.contains(FsFlags::ST_NOATIME) {
            f |= MsFlags::MS_NOATIME;
        }
        if fl.contains(FsFlags::ST_NODIRATIME) {
            f |= MsFlags::MS_NODIRATIME;
        }
        // ST_RELATIME (Linux's value; musl's headers and so nix's FsFlags lack the name).
        const ST_RELATIME: libc::c_ulong = 0x1000;
        if fl.bits() & ST_RELATIME != 0 {
            f |= MsFlags::MS_RELATIME;
        }
    }
    f
}

fn bind_ro(src: &Path, dst: &Path, extra: MsFlags) -> Result<(), String> {
    let e = |what: &str| {
        let what = format!("{what} {} on {}", src.display(), dst.display());
        move |err: nix::errno::Errno| format!("{what}: {err}")
    };
    cordon_guest::sys::bind_recursive(src, dst).map_err(e("binding"))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | extra
        | locked_flags(src);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>).map_err(e("read-only remount of"))
}

/// Binds `src` on `dst` writable, without set-id programs or device nodes.
fn bind_rw(src: &Path, dst: &Path) -> Result<(), String> {
    let e = |what: &'static str| move |err: nix::errno::Errno| format!("{what}: {err}");
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(e("binding"))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(src);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>).map_err(e("remounting"))
}

/// A build's writable root: every file of Cordon's generated layer `gen` bound over the
/// same path of `root` (made, empty, where the root lacks it; never through a symbolic
/// link of the root), `gen`'s `/dev` over the root's, and the mount points made. The
/// root's own files stay as they are under the binds, so none of Cordon's files is
/// sealed into the template.
fn cover_build_root(layer: &Path, root: &Path) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    // The path `rel` under `root`, its directories made, refusing links on the way.
    let make = |rel: &Path, dir: bool| -> Result<PathBuf, String> {
        let mut at = root.to_path_buf();
        let n = rel.components().count();
        for (i, c) in rel.components().enumerate() {
            at.push(c);
            let last = i + 1 == n;
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!(
                        "the build's root has a symbolic link at /{}, where Cordon puts its own \
                         files; build from a base without it",
                        rel.display()
                    ));
                }
                Ok(m) if !last && !m.is_dir() => {
                    return Err(format!(
                        "the build's root has a file at /{}, where Cordon needs a directory",
                        rel.display()
                    ));
                }
                Ok(_) => {}
                Err(_) if !last || dir => {
                    fs::create_dir(&at).map_err(io(format!("creating /{}", rel.display())))?
                }
                Err(_) => {
                    fs::write(&at, b"").map_err(io(format!("creating /{}", rel.display())))?
                }
            }
        }
        Ok(at)
    };
    let bind = |from: &Path, to: &Path| -> Result<(), String> {
        mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| {
            format!(
                "binding Cordon's {} in the build's root: {e}",
                from.display()
            )
        })
    };
    for d in ["proc", "tmp", "work"] {
        make(Path::new(d), true)?;
    }
    let dev = make(Path::new("dev"), true)?;
    bind(&layer.join("dev"), &dev)?;
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = layer.join(&rel);
        for entry in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
            let entry = entry.map_err(io(format!("listing {}", dir.display())))?;
            let sub = rel.join(entry.file_name());
            if rel.as_os_str().is_empty()
                && ["dev", "proc", "tmp", "work"]
                    .contains(&entry.file_name().to_str().unwrap_or(""))
            {
                continue;
            }
            let ft = entry
                .file_type()
                .map_err(io(format!("reading {}", sub.display())))?;
            if ft.is_dir() {
                make(&sub, true)?;
                todo.push(sub);
            } else if ft.is_file() {
                let to = make(&sub, false)?;
                bind(&entry.path(), &to)?;
            }
        }
    }
    Ok(())
}

fn tmpfs(dst: &Path, opts: &str, flags: MsFlags) -> Result<(), String> {
    mount(Some("tmpfs"), dst, Some("tmpfs"), flags, Some(opts))
        .map_err(|e| format!("mounting tmpfs on {}: {e}", dst.display()))
}

/// Where a template's pieces are staged, under the stage tmpfs at [`ROOT_BUILT_AT`]: the
/// template's root bound read-only, Cordon's generated files (the top layer), and the
/// read-only overlay of the two that becomes `/`. The overlay's options name only these
/// paths, never where the template lives on the host.
const TEMPLATE_LOWER: &str = "/tmp/tpl";
const TEMPLATE_GEN: &str = "/tmp/gen";
const TEMPLATE_ROOT: &str = "/tmp/root";

fn build_root(setup: &InitSetup) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    cordon_guest::sys::make_mounts_private().map_err(|e| format!("making mounts private: {e}"))?;
    let new = Path::new(ROOT_BUILT_AT);
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // The template's root is opened before the stage tmpfs hides whatever the host has at
    // its path (a data dir under /tmp), then bound from that open directory. Errors say
    // what failed, never where the template lives.
    let template = match &setup.template_root {
        Some(t) => Some(
            nix::fcntl::open(
                t.as_path(),
                nix::fcntl::OFlag::O_PATH
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "opening the template's root: {e} (the data dir and its parents must be \
                     passable (o+x) by the sandbox's ids)"
                )
            })?,
        ),
        None => None,
    };
    tmpfs(new, "size=4m,mode=0755", nosuid_nodev)?;
    if let Some(fd) = template {
        // The template: its root bound read-only here; the generated files go to their own
        // directory, and the overlay of both is mounted once the join's files are in.
        let lower = Path::new(TEMPLATE_LOWER);
        for d in [TEMPLATE_LOWER, TEMPLATE_GEN, TEMPLATE_ROOT] {
            fs::create_dir(d).map_err(io(format!("creating {d}")))?;
        }
        let src = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        if setup.template_writable {
            // A build's working copy: bound writable where the root is made.
            bind_rw(&src, Path::new(TEMPLATE_ROOT)).map_err(|e| {
                let errno = e.rsplit(": ").next().unwrap_or("failed");
                format!("binding the build's root: {errno}")
            })?;
            drop(fd);
            return make_tree(Path::new(TEMPLATE_GEN), setup);
        }
        bind_ro(&src, lower, MsFlags::MS_NODEV).map_err(|e| {
            let errno = e.rsplit(": ").next().unwrap_or("failed");
            format!("binding the template's root read-only: {errno}")
        })?;
        drop(fd);
        return make_tree(Path::new(TEMPLATE_GEN), setup);
    }
    for name in HOST_DIRS {
        let host = Path::new("/").join(name);
        let inside = new.join(name);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target =
                    fs::read_link(&host).map_err(io(format!("reading {}", host.display())))?;
                symlink(&target, &inside).map_err(io(format!("linking {}", inside.display())))?;
            }
            Ok(m) if m.is_dir() => {
                fs::create_dir(&inside).map_err(io(format!("creating {}", inside.display())))?;
                bind_ro(&host, &inside, MsFlags::MS_NODEV)?;
            }
            _ => {}
        }
    }
    make_tree(new, setup)?;
    // The few host /etc entries that /usr points into, read-only.
    for name in cordon_core::HOST_ETC {
        let host = Path::new("/etc").join(name);
        let inside = new.join("etc").join(name);
        let made = match fs::metadata(&host) {
            Ok(m) if m.is_dir() => fs::create_dir(&inside),
            Ok(m) if m.is_file() => fs::write(&inside, b""),
            _ => continue,
        };
        made.map_err(io(format!("creating {}", inside.display())))?;
        bind_ro(&host, &inside, MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
    }
    mount_pieces(new, setup)
}

/// Cordon's own files and mount points of the sandbox root, under `at`: a minimal /etc
/// (nothing of the host's), /dev's entries, /proc, /tmp and /work.
fn make_tree(at: &Path, setup: &InitSetup) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    let etc = at.join("etc");
    fs::create_dir(&etc).map_err(io("creating /etc".into()))?;
    let uid = setup.sandbox_uid;
    let files: [(&str, String); 4] = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1 localhost {h}\n::1 localhost {h}\n",
                h = setup.hostname
            ),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".to_string(),
        ),
    ];
    for (name, body) in files {
        fs::write(etc.join(name), body).map_err(io(format!("writing /etc/{name}")))?;
    }
    // /dev: a few device nodes bound from the host, nothing else. A directory of the root's
    // own tmpfs (read-only with it), not a filesystem of its own: each superblock costs a
    // mount at start and a teardown at the end of every run.
    let dev = at.join("dev");
    fs::create_dir(&dev).map_err(io("creating /dev".into()))?;
    for d in DEVICES {
        fs::write(dev.join(d), b"").map_err(io(format!("creating /dev/{d}")))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(link)).map_err(io(format!("linking /dev/{link}")))?;
    }
    // Pseudo-terminals come from the sandbox's own devpts instance (mounted on dev/pts);
    // ptmx is its multiplexer, never the host's.
    symlink("pts/ptmx", dev.join("ptmx")).map_err(io("linking /dev/ptmx".into()))?;
    for name in &setup.devices {
        check_device_name(name)?;
        let at = dev.join(name);
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating /dev/{name}")))?;
        }
        fs::write(&at, b"").map_err(io(format!("creating /dev/{name}")))?;
    }
    for d in ["dev/shm", "dev/pts", "proc", "tmp", "work", "home"] {
        fs::create_dir(at.join(d)).map_err(io(format!("creating /{d}")))?;
    }
    // The workspace's second mount point (`bind_home`); a build's root keeps its own /home.
    if !setup.template_writable {
        fs::create_dir(at.join("home/user")).map_err(io("creating /home/user".into()))?;
    }
    Ok(())
}

/// The filesystems of the sandbox root `root` (its tree made by [`make_tree`]).
fn mount_pieces(root: &Path, setup: &InitSetup) -> Result<(), String> {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for d in DEVICES {
        mount(
            Some(&Path::new("/dev").join(d)),
            &root.join("dev").join(d),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding /dev/{d}: {e}"))?;
    }
    // The devices the operator allowed by name: the host's nodes themselves (their
    // mount keeps the host's /dev's flags; the sandbox's ids open them as the node's mode
    // says).
    for name in &setup.devices {
        check_device_name(name)?;
        mount(
            Some(&Path::new("/dev").join(name)),
            &root.join("dev").join(name),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding /dev/{name}: {e}"))?;
    }
    // A private devpts instance (always new inside the sandbox's user namespace; said
    // anyway): only the sandbox's own terminals are in it, and anyone may open its ptmx.
    mount(
        Some("devpts"),
        &root.join("dev/pts"),
        Some("devpts"),
        // Not nodev: its nodes are the terminals.
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| format!("mounting devpts on /dev/pts: {e}"))?;
    let small = setup.tmp_bytes.min(64 << 20);
    tmpfs(
        &root.join("dev/shm"),
        &format!("size={small},mode=1777"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
    )?;
    // /proc of the sandbox's PID namespace; no /sys at all.
    mount(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("mounting /proc: {e}"))?;
    tmpfs(
        &root.join("tmp"),
        &format!("size={},mode=1777", setup.tmp_bytes),
        nosuid_nodev,
    )?;
    let uid = setup.sandbox_uid;
    tmpfs(
        &root.join("work"),
        &format!("size={},mode=0755,uid={uid},gid={uid}", setup.disk_bytes),
        nosuid_nodev,
    )?;
    Ok(())
}

/// The rest of the root, once the host's join has come: the egress proxy's files and
/// socket, then the root turns read-only and becomes `/`.
fn finish_root(join: &InitJoin, setup: &InitSetup, volumes: Vec<OwnedFd>) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    let template = setup.template_root.is_some();
    // Files go to the generated layer; with a template, mounts go to the overlay made next.
    let gen_at = Path::new(if template {
        TEMPLATE_GEN
    } else {
        ROOT_BUILT_AT
    });
    let new = gen_at;
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // Where an extra file goes in the new root, its directories made.
    let place = |path: &str| -> Result<PathBuf, String> {
        let rel = path.trim_start_matches('/');
        if rel.split('/').any(|c| c == ".." || c.is_empty()) || !rel.starts_with("etc/") {
            return Err(format!(
                "extra file {path:?} must be a plain path under /etc"
            ));
        }
        let dst = new.join(rel);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        Ok(dst)
    };
    for (path, body) in &join.extra_files {
        fs::write(place(path)?, body).map_err(io(format!("writing {path}")))?;
    }
    let mut copied: Vec<(&Path, PathBuf)> = Vec::new();
    for (from, path) in &join.extra_copies {
        let dst = place(path)?;
        if let Some((_, first)) = copied.iter().find(|(f, _)| *f == from.as_path()) {
            fs::hard_link(first, &dst).map_err(io(format!("linking {path}")))?;
            continue;
        }
        // The copy is the kernel's (copy_file_range); the source's mode is not the sandbox's.
        fs::copy(from, &dst)
            .and_then(|_| fs::set_permissions(&dst, fs::Permissions::from_mode(0o644)))
            .map_err(io(format!("copying {} to {path}", from.display())))?;
        copied.push((from.as_path(), dst));
    }
    let sock_inside = cordon_guest::proto::EGRESS_SOCKET_INSIDE.trim_start_matches('/');
    if join.egress_socket.is_some() {
        let inside = gen_at.join(sock_inside);
        if let Some(parent) = inside.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        fs::write(&inside, b"").map_err(io("creating the egress socket mount point".into()))?;
    }
    let new = if setup.template_writable {
        // A build's root: its own writable tree, Cordon's files bound over it.
        let root = Path::new(TEMPLATE_ROOT);
        make_bind_points(root, &join.volumes)?;
        cover_build_root(Path::new(TEMPLATE_GEN), root)?;
        mount_pieces(root, setup)?;
        root
    } else if template {
        // The root: Cordon's generated layer over the template's, read-only (an overlay
        // of lower layers only has no upper to write to). Writes go to /work and /tmp.
        make_bind_points(gen_at, &join.volumes)?;
        let root = Path::new(TEMPLATE_ROOT);
        mount(
            Some("overlay"),
            root,
            Some("overlay"),
            MsFlags::MS_RDONLY | nosuid_nodev,
            Some(format!("lowerdir={TEMPLATE_GEN}:{TEMPLATE_LOWER}").as_str()),
        )
        .map_err(|e| format!("mounting the template's root (overlayfs): {e}"))?;
        mount_pieces(root, setup)?;
        root
    } else {
        make_bind_points(new, &join.volumes)?;
        new
    };
    if let Some(sock) = &join.egress_socket {
        let inside = new.join(sock_inside);
        mount(
            Some(sock.as_path()),
            &inside,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding the egress socket: {e}"))?;
    }
    mount_volumes(new, setup.sandbox_uid, &join.volumes, volumes)?;
    if !setup.template_writable {
        crate::volumes::bind_home(new)?;
    }
    // The root itself becomes read-only, then we pivot into it and drop the host's tree.
    if !template {
        mount(
            None::<&str>,
            new,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid_nodev,
            Some("size=4m,mode=0755"),
        )
        .map_err(|e| format!("making the root read-only: {e}"))?;
    }
    nix::unistd::chdir(new).map_err(|e| format!("entering the new root: {e}"))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detaching the host's root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}
