//! The monitor: the process a caller sees as the container's. `create` starts it; it
//! admits the bundle through the gate, makes the Cordon sandbox (the container tier, the
//! bundle's root filesystem as its read-only root), reports ready, and then serves the
//! control socket: the container's process and each `exec` run as background execs of the
//! sandbox, their output relayed to the descriptors the caller gave. When the container's
//! process ends the sandbox is destroyed and the monitor ends the same way (exit code or
//! signal), which is what the caller's `waitpid` reports.
//!
//! Everything the sandbox holds on the host (its init, egress proxy, cgroup, id range) is
//! tied to the monitor: killed, it takes the sandbox with it (the inits' parent-death
//! signal), and `delete` removes the cgroup it may leave.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_core::{ExecRequest, ProcSignal, Sandbox};
use cordon_engine::Principal;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;

use crate::bundle::{self, ProcessSpec};
use crate::ctl::{Conn, Listener, Reply, Request};
use crate::node::NodeConfig;
use crate::state::{Record, Root, Status};
use crate::{OciError, Result};

/// Where the bundle's root filesystem is bound, in the monitor's own mount namespace: a
/// tmpfs of its own over this (empty) directory, whose parents the sandbox's ids can pass
/// whatever the modes above the engine's state directory (containerd's are 0700). The host
/// sees only the empty directory.
pub const ROOTS_AT: &str = "/run/cordon-oci-roots";

/// What the monitor is started with.
pub struct Setup {
    pub root: Root,
    pub id: String,
    pub bundle: PathBuf,
    pub node: NodeConfig,
}

/// One process of the container: the first is the container's own.
struct Proc {
    bg: u64,
    stdin: Option<File>,
    stdout: File,
    stderr: File,
    from: [u64; 2],
    /// An exec's connection: its end is told how the process ended; its closing kills it.
    conn: Option<Conn>,
}

/// Makes the sandbox for the bundle. Errors are the caller's to report (`create` prints
/// them); nothing is left running.
pub fn prepare(setup: &Setup) -> Result<(Box<dyn Sandbox>, ProcessSpec, Record)> {
    let spec = bundle::load(&setup.bundle)?;
    let granted = bundle::check(&spec, &setup.node.allow)?;
    let process = ProcessSpec::from_oci(spec.process().as_ref().ok_or_else(|| {
        OciError::Invalid("the bundle's config.json has no process; name the program to run".into())
    })?)?;
    if process.terminal {
        return Err(OciError::Refused {
            what: "it asks for a terminal".into(),
            fix: "run it without a terminal (no -t / tty: false) for now".into(),
        });
    }
    let rootfs = bundle::rootfs(&spec, &setup.bundle)?;
    let req = bundle::request(&spec)?;
    let gate = setup.node.gate()?;
    let mut decided = gate.admit(
        &Principal::Tenant(crate::node::TENANT.into()),
        &req,
        "oci create",
    );
    // The node's allowances the bundle uses, marked on the decision.
    match &mut decided {
        Ok(a) => a.record.node_allowances = granted.record.clone(),
        Err(d) => d.record.node_allowances = granted.record.clone(),
    }
    // Recorded before anything runs; a decision that cannot be recorded stops the container.
    let audit = crate::audit::record_decision(&setup.node, &setup.id, &decided)?;
    let admitted = decided.map_err(|d| OciError::Refused {
        what: format!("{} (rule {})", d.message, d.rule),
        fix: d.fix.clone(),
    })?;
    let mut sandbox_spec = admitted.spec;
    let mount_at = bind_rootfs(&rootfs)?;
    sandbox_spec.volumes = crate::allow::bind_host_paths(granted.host_paths, Path::new(ROOTS_AT))?;
    sandbox_spec.devices = granted.devices;
    sandbox_spec.resolved_template = Some(cordon_core::ResolvedTemplate {
        name: format!("oci:{}", setup.id),
        digest: String::new(),
        root: mount_at,
        env: Default::default(),
        languages: Default::default(),
        lease: None,
        writable: false,
    });
    let backend =
        cordon_container::ContainerBackend::new(cordon_container::ContainerConfig::discover());
    let sandbox = backend.create_sandbox(&sandbox_spec)?;
    let record = Record {
        id: setup.id.clone(),
        bundle: setup.bundle.clone(),
        pid: std::process::id() as i32,
        pid_start: crate::state::start_time(std::process::id() as i32).unwrap_or(0),
        status: Status::Created,
        created: crate::state::now_rfc3339(),
        annotations: spec
            .annotations()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        sandbox: Some(sandbox.id().as_str().to_string()),
        exit_code: None,
    };
    // The backend's sandbox owns everything; the backend itself holds nothing more. Its
    // proxy's decisions go to the node's audit store as they are made.
    let sandbox = crate::audit::Audited::new(Box::new(sandbox), audit, &setup.id);
    Ok((Box::new(sandbox), process, record))
}

/// A private mount namespace for the monitor (and the sandbox's init it starts), with the
/// bundle's root bound under [`ROOTS_AT`] in it; returns where. It goes away with the
/// monitor.
fn bind_rootfs(rootfs: &Path) -> Result<PathBuf> {
    use nix::mount::{MsFlags, mount};
    use std::os::unix::fs::DirBuilderExt;
    let m = |what: &str| {
        let what = what.to_string();
        move |e: nix::Error| OciError::io(what, e.into())
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(m(
        "making the monitor's mount namespace (run cordon-oci as root)",
    ))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(m("making the monitor's mounts private"))?;
    let base = Path::new(ROOTS_AT);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(base)
        .map_err(|e| OciError::io(format!("making {ROOTS_AT}"), e))?;
    mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=64k,mode=0711"),
    )
    .map_err(m("mounting the roots' tmpfs"))?;
    let at = base.join("root");
    std::fs::create_dir(&at).map_err(|e| OciError::io("making the root's mount point", e))?;
    mount(
        Some(rootfs),
        &at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| {
        OciError::io(
            format!("binding the bundle's root filesystem {}", rootfs.display()),
            e.into(),
        )
    })?;
    Ok(at)
}

fn dup_file(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<File> {
    Ok(File::from(fd.try_clone_to_owned()?))
}

fn exec_request(p: &ProcessSpec) -> ExecRequest {
    let mut req = ExecRequest::argv(p.args.clone());
    req.env = p.env.clone();
    req.cwd = Some(p.cwd.clone());
    req
}

/// The monitor's life once the sandbox is up: serve the control socket until the
/// container's process ends, then destroy the sandbox and end as it did.
pub fn serve(
    root: &Root,
    mut sandbox: Box<dyn Sandbox>,
    process: ProcessSpec,
    mut record: Record,
    listener: Listener,
) -> ! {
    // The caller's signals for the container (conmon and the shims forward them) are read
    // as data, not handled asynchronously.
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        mask.add(s);
    }
    let _ = mask.thread_block();
    let sigfd = SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_NONBLOCK | nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
    )
    .ok();
    let mut procs: Vec<Proc> = Vec::new();
    let mut main: Option<u64> = None;
    let mut ended: Option<(Option<i32>, Option<i32>)> = None;
    while ended.is_none() {
        let running = !procs.is_empty();
        let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if let Some(s) = &sigfd {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        let fixed = fds.len();
        for p in &procs {
            if let Some(i) = &p.stdin {
                fds.push(PollFd::new(i.as_fd(), PollFlags::POLLIN));
            }
        }
        let timeout = if running { 10u16 } else { 1000 };
        let _ = poll(&mut fds, PollTimeout::from(timeout));
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        // Signals: TERM, INT, HUP, QUIT end the container's process as SIGTERM does.
        if sigfd.is_some() && ready[1] {
            while let Some(Ok(Some(_))) = sigfd.as_ref().map(|s| s.read_signal()) {}
            match main {
                Some(bg) => {
                    let _ = sandbox.signal_background(bg, ProcSignal::Term);
                }
                None => ended = Some((None, Some(libc::SIGTERM))),
            }
        }
        if ready[0]
            && let Ok(conn) = listener.accept()
        {
            let _ = conn.set_timeout(Some(Duration::from_secs(5)));
            if let Some(done) = handle(
                &mut *sandbox,
                &conn,
                &mut procs,
                &mut main,
                &process,
                root,
                &mut record,
            ) {
                ended = Some(done);
            }
        }
        // Input for the processes.
        let mut k = fixed;
        for p in procs.iter_mut() {
            if p.stdin.is_none() {
                continue;
            }
            let readable = ready.get(k).copied().unwrap_or(false);
            k += 1;
            if !readable {
                continue;
            }
            let mut buf = vec![0u8; 64 << 10];
            let n = p.stdin.as_mut().map_or(Ok(0), |f| f.read(&mut buf));
            let data = match n {
                Ok(n) => &buf[..n],
                Err(_) => &[][..],
            };
            if data.is_empty() {
                p.stdin = None;
            }
            let _ = sandbox.write_background(p.bg, data);
        }
        // Exec connections closed by their caller (the exec's monitor was killed).
        let mut i = 0;
        while i < procs.len() {
            let p = &mut procs[i];
            if let Some(c) = &p.conn {
                let mut f = [PollFd::new(c.as_fd(), PollFlags::POLLIN)];
                if poll(&mut f, PollTimeout::ZERO).unwrap_or(0) > 0 {
                    let _ = sandbox.signal_background(p.bg, ProcSignal::Kill);
                    p.conn = None;
                }
            }
            i += 1;
        }
        // Output, and ends.
        let mut i = 0;
        while i < procs.len() {
            let p = &mut procs[i];
            let out = match sandbox.read_background(p.bg, p.from, 256 << 10) {
                Ok(o) => o,
                Err(_) => {
                    // The sandbox is gone: its processes with it.
                    cordon_core::ProcOutput {
                        exit: Some(cordon_core::ProcExit {
                            signal: Some(libc::SIGKILL),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                }
            };
            let _ = p.stdout.write_all(&out.stdout);
            let _ = p.stderr.write_all(&out.stderr);
            p.from = [
                out.stdout_from + out.stdout.len() as u64,
                out.stderr_from + out.stderr.len() as u64,
            ];
            if let Some(exit) = out.exit {
                let signal = if exit.oom_killed {
                    Some(libc::SIGKILL)
                } else {
                    exit.signal
                };
                let (code, signal) = (exit.code.filter(|_| signal.is_none()), signal);
                if Some(p.bg) == main {
                    ended = Some((code, signal));
                } else if let Some(c) = &p.conn {
                    let _ = c.send(&Reply::Exited { code, signal }, &[]);
                }
                procs.remove(i);
                continue;
            }
            i += 1;
        }
    }
    let (code, signal) = ended.unwrap_or((None, Some(libc::SIGKILL)));
    for p in &procs {
        if let Some(c) = &p.conn {
            let _ = c.send(
                &Reply::Exited {
                    code: None,
                    signal: Some(libc::SIGKILL),
                },
                &[],
            );
        }
    }
    let _ = sandbox.destroy();
    drop(sandbox);
    record.status = Status::Stopped;
    record.exit_code = Some(code.unwrap_or_else(|| 128 + signal.unwrap_or(0)));
    let _ = root.save(&record);
    let _ = std::fs::remove_file(root.dir(&record.id).join(crate::ctl::SOCKET));
    match (code, signal) {
        (_, Some(s)) => crate::sys::die_by(s),
        (Some(c), None) => std::process::exit(c),
        (None, None) => std::process::exit(0),
    }
}

/// One control request. Returns how the container ended when the request ended it (a
/// signal before it started).
fn handle(
    sandbox: &mut dyn Sandbox,
    conn: &Conn,
    procs: &mut Vec<Proc>,
    main: &mut Option<u64>,
    process: &ProcessSpec,
    root: &Root,
    record: &mut Record,
) -> Option<(Option<i32>, Option<i32>)> {
    let (req, fds) = match conn.recv::<Request>() {
        Ok(Some(r)) => r,
        _ => return None,
    };
    let err = |m: String| Reply::Error { message: m };
    let (reply, ended) = match req {
        Request::Start if main.is_some() => (err("the container was started already".into()), None),
        Request::Start => {
            // The monitor's own stdio: what the caller gave for the container's process.
            match start_proc(
                sandbox,
                process,
                [
                    dup_file(std::io::stdin().as_fd()).ok(),
                    dup_file(std::io::stdout().as_fd()).ok(),
                    dup_file(std::io::stderr().as_fd()).ok(),
                ],
            ) {
                Ok(p) => {
                    *main = Some(p.bg);
                    procs.push(p);
                    record.status = Status::Running;
                    let _ = root.save(record);
                    (Reply::Ok, None)
                }
                Err(e) => (err(format!("starting the container's process: {e}")), None),
            }
        }
        Request::Signal { signal } => {
            let sig = match signal {
                libc::SIGKILL => Some(ProcSignal::Kill),
                libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT => {
                    Some(ProcSignal::Term)
                }
                _ => None,
            };
            match (sig, *main) {
                (None, _) => (
                    err(format!(
                        "signal {signal} is not delivered by cordon-oci; send SIGTERM (15) or SIGKILL (9)"
                    )),
                    None,
                ),
                (Some(s), Some(bg)) => match sandbox.signal_background(bg, s) {
                    Ok(()) => (Reply::Ok, None),
                    Err(e) => (err(format!("signalling the container: {e}")), None),
                },
                // Not started: the container ends here.
                (Some(_), None) => (Reply::Ok, Some((None, Some(signal)))),
            }
        }
        Request::Exec { process } => {
            let mut fds = fds.into_iter().map(File::from);
            let stdio = [fds.next(), fds.next(), fds.next()];
            if main.is_none() {
                (
                    err("the container is not running; start it first".into()),
                    None,
                )
            } else {
                match start_proc(sandbox, &process, stdio) {
                    Ok(mut p) => {
                        let _ = conn.send(&Reply::Ok, &[]);
                        if let Ok(c) = conn_clone(conn) {
                            p.conn = Some(c);
                        }
                        procs.push(p);
                        return None;
                    }
                    Err(e) => (err(format!("starting the process: {e}")), None),
                }
            }
        }
        Request::Ps => (
            Reply::Pids {
                pids: record
                    .sandbox
                    .as_deref()
                    .map(sandbox_pids)
                    .unwrap_or_default(),
            },
            None,
        ),
    };
    let _ = conn.send(&reply, &[]);
    ended
}

fn conn_clone(c: &Conn) -> std::io::Result<Conn> {
    let fd: OwnedFd = c.as_fd().try_clone_to_owned()?;
    Ok(crate::ctl::Conn::from_owned(fd))
}

fn start_proc(
    sandbox: &mut dyn Sandbox,
    process: &ProcessSpec,
    [stdin, stdout, stderr]: [Option<File>; 3],
) -> Result<Proc> {
    let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
        return Err(OciError::Invalid(
            "the process's stdout and stderr were not passed".into(),
        ));
    };
    let bg = sandbox.start_background(&exec_request(process))?;
    Ok(Proc {
        bg,
        stdin,
        stdout,
        stderr,
        from: [0, 0],
        conn: None,
    })
}

/// The host pids of every process in the sandbox's cgroup.
pub fn sandbox_pids(sandbox: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = cordon_host::cgroup::dirs_of(cordon_host::cgroup::PARENT, sandbox)
        .iter()
        .flat_map(|d| cordon_host::cgroup::read_pids(&d.join("cgroup.procs")))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Removes what a container whose monitor is gone may have left: its sandbox's cgroup (and
/// any process still in it). Returns whether anything was left.
pub fn sweep(record: &Record) -> bool {
    let Some(name) = &record.sandbox else {
        return false;
    };
    let dirs = cordon_host::cgroup::dirs_of(cordon_host::cgroup::PARENT, name);
    if dirs.is_empty() {
        return false;
    }
    cordon_host::cgroup::remove_dirs(&dirs, Duration::from_secs(5));
    true
}

/// Raw descriptor numbers of the calling process's stdio, for an `exec` request.
pub fn own_stdio() -> [i32; 3] {
    [
        std::io::stdin().as_raw_fd(),
        std::io::stdout().as_raw_fd(),
        std::io::stderr().as_raw_fd(),
    ]
}
