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
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Gid, Uid, setresgid, setresuid};

use cordon_guest::proto::{ErrorCode, ProtoError, Reply, read_frame, write_frame};
use cordon_guest::sys::{Forked, fork_into, own_fd};
use cordon_guest::{Agent, AgentConfig};

pub use crate::frames::{InitBegin, InitEnd, InitJoin, InitSetup};
use crate::landlock_rules;
use crate::root::{build_root, finish_root};
use crate::seccomp::SeccompPolicy;
pub use crate::volumes::InitVolume;
use crate::volumes::volume_mounts;

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
    // Die with the host process that started us (an init that ends its sandbox itself
    // turns this into a signal it takes: `run_parent`).
    let host = nix::unistd::getppid();
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
        // Changing the effective ids cleared the parent-death signal: set it again, and
        // see whether the host went while it was off.
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
        if nix::unistd::getppid() != host {
            if let Ok(Forked::Parent(child)) = forked {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            }
            return Ok(1);
        }
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
            run_parent(sock, (host, child), &begin, go_w, to_child_w)
        }
    }
}

/// The outer init once the child is forked: writes its id maps and lets it go, passes it the
/// host's setup and join (moving it into the cgroup and opening the volumes' mounts first),
/// then waits for it and exits with its status; with the join's [`InitEnd`], it ends the
/// sandbox itself once the host is gone.
fn run_parent(
    mut sock: UnixStream,
    (host, child): (nix::unistd::Pid, nix::unistd::Pid),
    begin: &InitBegin,
    go_w: OwnedFd,
    to_child_w: UnixStream,
) -> io::Result<i32> {
    // Hold the sandbox's mount namespace until the agent has been reaped. Its exit
    // then only drops a reference: it leaves the cgroup at once, and the host
    // removes the cgroup while this process, dropping the namespace on return,
    // unmounts the sandbox's filesystems. Without the hold (no /proc here) the
    // agent's own exit unmounts them, before the cgroup can go.
    let held_mounts = fs::File::open(format!("/proc/{child}/ns/mnt")).ok();
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
    // An init that ends its sandbox itself does so on every way out, a failure's too: the
    // child is killed and reaped, and the cgroup removed, before this process (and with it
    // the id lease, when it got one) goes.
    let give_up = |sock: &mut UnixStream, message: String, signals: Option<&SigSet>| {
        let status = fail(sock, message);
        if let Some(end) = &join.end {
            let _ = wait_for(child, signals);
            remove_cgroups(end);
        }
        status
    };
    let ending = match &join.end {
        Some(_) => match Ending::take_over(&sock, host, child) {
            Ok(ending) => Some(ending),
            Err(message) => return give_up(&mut sock, message, None),
        },
        None => None,
    };
    let signals = ending.as_ref().map(|e| &e.signals);
    let pid = child.to_string();
    for procs in &join.cgroup_procs {
        if let Err(e) = fs::write(procs, &pid) {
            return give_up(
                &mut sock,
                format!("moving the sandbox into cgroup {}: {e}", procs.display()),
                signals,
            );
        }
    }
    let mounts = match volume_mounts(child, &join.volumes) {
        Ok(m) => m,
        Err(message) => return give_up(&mut sock, message, signals),
    };
    let _ = write_frame(&mut to_child, &join, b"");
    if !mounts.is_empty() {
        let _ = send_fds(&to_child, &mounts);
    }
    drop(mounts);
    drop(to_child);
    drop(sock);
    let Some(ending) = ending else {
        let status = wait_for(child, None);
        drop(held_mounts);
        return status;
    };
    let status = wait_for(child, Some(&ending.signals));
    // Nothing of the sandbox runs any more: its cgroup goes (or is kept for the next
    // sandbox), then its file systems with the mount namespace, and only then its host
    // ids, with the lease's descriptor as this process ends.
    if let Some(end) = &join.end {
        remove_cgroups(end);
    }
    drop(held_mounts);
    drop(ending);
    status
}

/// The agent's exit status once it is reaped. With `signals` (blocked, and taken here): any
/// of them but SIGCHLD (the host's end, a terminal's interrupt or hang-up) kills it first.
fn wait_for(child: nix::unistd::Pid, signals: Option<&SigSet>) -> io::Result<i32> {
    let flags = signals.map(|_| WaitPidFlag::WNOHANG);
    loop {
        match waitpid(child, flags) {
            Ok(WaitStatus::Exited(_, c)) => return Ok(c),
            Ok(WaitStatus::Signaled(_, s, _)) => return Ok(128 + s as i32),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        // Still alive (only asked without waiting): a SIGCHLD says it may be gone now.
        if let Some(set) = signals
            && set.wait().is_ok_and(|s| s != Signal::SIGCHLD)
        {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        }
    }
}

/// An init that ends its sandbox itself (ADR 0044; what it removes is the join's
/// [`InitEnd`]): the host's id lease it holds until then, and the signals it waits on.
struct Ending {
    /// The host's id lease (its open lease file): the range stays leased while it is open.
    _lease: OwnedFd,
    signals: SigSet,
}

/// How long the sandbox's cgroup directories may take to empty once its last process is
/// reaped (the kernel lists an exiting task a moment longer).
const CGROUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

impl Ending {
    /// Takes the lease descriptor the host sends after the join, and makes the host's end
    /// (its exit, or its thread's) a signal this process takes instead of one that kills
    /// it: the sandbox is then killed and ended here. A host already gone is seen at once.
    fn take_over(
        sock: &UnixStream,
        host: nix::unistd::Pid,
        child: nix::unistd::Pid,
    ) -> Result<Self, String> {
        let lease = recv_fds(sock, 1, "the host's id lease")?
            .pop()
            .ok_or_else(|| "the host sent no id lease".to_string())?;
        // SIGTERM is the parent-death signal below. The CLI's own end may come as a
        // terminal's interrupt, quit or hang-up, sent to its whole process group, this
        // process included: each is an order to end the sandbox too, never this process's
        // end before the sandbox's.
        let mut signals = SigSet::empty();
        for s in [
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGHUP,
            Signal::SIGCHLD,
        ] {
            signals.add(s);
        }
        signals
            .thread_block()
            .map_err(|e| format!("blocking the end's signals: {e}"))?;
        // An ignored SIGCHLD (inherited from whoever started the host) would have the
        // kernel reap the agent unseen, and the wait below never woken for it.
        crate::sys::default_sigchld().map_err(|e| format!("resetting SIGCHLD: {e}"))?;
        nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(|e| format!("pdeathsig: {e}"))?;
        if nix::unistd::getppid() != host {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        }
        Ok(Ending {
            _lease: lease,
            signals,
        })
    }
}

/// Removes an ended sandbox's cgroup directories (its memory cgroup kept for the next
/// sandbox if it ended clean), waiting for the kernel to let them go; what is still there
/// after [`CGROUP_PATIENCE`] is left to the next sweep of empty cgroups.
fn remove_cgroups(plan: &InitEnd) {
    let keepable = plan.keepable.as_deref();
    let deadline = std::time::Instant::now() + CGROUP_PATIENCE;
    let mut left = cordon_cgroup_pool::remove_ended(&plan.cgroups, keepable);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(200));
        left = cordon_cgroup_pool::remove_ended(&left, keepable);
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

/// Sends descriptors on one byte of their own (the host sends its id lease so too).
pub fn send_fds(to: &UnixStream, fds: &[OwnedFd]) -> io::Result<()> {
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

/// Takes `n` descriptors sent by [`send_fds`]: `what` they are, for the error.
fn recv_fds(from: &UnixStream, n: usize, what: &str) -> Result<Vec<OwnedFd>, String> {
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
    .map_err(|e| format!("receiving {what}: {e}"))?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(|e| format!("receiving {what}: {e}"))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(own_fd));
        }
    }
    if fds.len() != n {
        return Err(format!(
            "expected {n} descriptors of {what}, got {}",
            fds.len()
        ));
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
        recv_fds(&from_parent, join.volumes.len(), "the volumes' mounts")?
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
    let cfg = agent_config(&setup, &join)?;
    let sock = sock.try_clone().map_err(|e| format!("agent socket: {e}"))?;
    let agent = Agent::new(cfg, sock).map_err(|e| format!("starting the agent: {e}"))?;
    agent.serve().map_err(|e| format!("agent: {e}"))
}

/// The agent's configuration: the sandbox's user, its scratch file systems (the workspace,
/// /tmp and each writable volume) and the confinement each program gets (Landlock and
/// seccomp); the process stops being dumpable.
fn agent_config(setup: &InitSetup, join: &InitJoin) -> Result<AgentConfig, String> {
    let ctx = |what: &str| {
        let what = what.to_string();
        move |e: nix::errno::Errno| format!("{what}: {e}")
    };
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
        // A build's sandbox has the host's (its root gets no file of Cordon's it would keep).
        boot_id: (setup.own_boot_id && !setup.template_writable)
            .then(|| PathBuf::from(cordon_guest::proto::BOOT_ID_INSIDE)),
        confine: Some(confine),
        winch_on_resize: false,
        standby_idle: match setup.standby_idle_ms {
            Some(0) => None,
            Some(ms) => Some(std::time::Duration::from_millis(ms)),
            None => Some(cordon_guest::STANDBY_IDLE),
        },
    };
    Ok(cfg)
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
