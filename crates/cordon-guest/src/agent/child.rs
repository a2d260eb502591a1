//! The processes of an exec: the standby that becomes its reaper, the reaper, and the
//! program's own setup (privileges, limits, cwd) up to its exec.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::sys::wait::waitpid;
use nix::unistd::{Gid, Pid, Uid, setgroups, setresgid, setresuid, setsid};

use super::state::{Agent, AgentConfig, Job, Standby, monotonic_us};
use crate::fdpass::recv_with_fds;
use crate::proto::{FrameBuffer, ProcLimits};
use crate::sys;

/// Readying the next exec's reaper.
impl Agent {
    /// Forks the next exec's reaper into its namespaces; it prepares and waits for a job.
    pub(super) fn spawn_standby(&self) -> io::Result<Standby> {
        let (ours, theirs) = UnixStream::pair()?;
        // With per-exec cgroups the agent moves the reaper alone into the exec's cgroup,
        // so the program must be forked after that, by the reaper: nothing is forked ahead.
        let program = match self.cgroups {
            None => Some(UnixStream::pair()?),
            Some(_) => None,
        };
        match sys::fork_into(libc::CLONE_NEWPID | libc::CLONE_NEWNS)? {
            sys::Forked::Child => {
                drop(ours);
                // Copies of running execs' pipes held here would keep a program from ever
                // seeing its stdin end (a background exec's, while this standby waits).
                for fd in self.exec_fds() {
                    let _ = nix::unistd::close(fd);
                }
                standby_main(&self.cfg, theirs, program.map(|(_, far)| far))
            }
            sys::Forked::Parent(pid) => {
                drop(theirs);
                let program = program.map(|(near, _)| near);
                let pidfd = match sys::pidfd_open(pid) {
                    Ok(fd) => Some(fd),
                    // gVisor has no pidfd_open: the reaper's end is seen on its status pipe
                    // and exiting reapers are reaped by polling (see `poll_once`).
                    Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => None,
                    Err(e) => {
                        let _ = kill(pid, Signal::SIGKILL);
                        let _ = waitpid(pid, None);
                        return Err(e);
                    }
                };
                Ok(Standby {
                    pid,
                    pidfd,
                    chan: ours,
                    program,
                    served_cpu_us: 0,
                })
            }
        }
    }

    /// The agent's own descriptors of running execs (their pipes, status pipes, pidfds).
    fn exec_fds(&self) -> Vec<RawFd> {
        let mut fds = Vec::new();
        let runs = self
            .background
            .values()
            .filter_map(|b| b.run.as_ref())
            .chain(self.running.as_ref());
        for run in runs {
            fds.push(run.status.as_raw_fd());
            fds.extend(run.chan.as_ref().map(|c| c.as_raw_fd()));
            fds.extend(run.pidfd.as_ref().map(|f| f.as_raw_fd()));
            if let Some(fr) = &run.framed {
                for f in [&fr.stdin, &fr.stdout, &fr.stderr, &fr.tty]
                    .into_iter()
                    .flatten()
                {
                    fds.push(f.as_raw_fd());
                }
            }
        }
        fds
    }
}

/// Everything the program's process needs, prepared before forking so the child only
/// makes system calls.
pub(super) struct ExecPlan {
    pub(super) argv: Vec<CString>,
    pub(super) env: Vec<CString>,
    pub(super) path_dirs: Vec<Vec<u8>>,
    pub(super) cwd: CString,
    /// Its stdin is a terminal to take as the controlling terminal.
    pub(super) tty: bool,
    /// Who it runs as, when not the sandbox's user.
    pub(super) user: Option<crate::proto::ProcUser>,
}

impl ExecPlan {
    pub(super) fn new(
        argv: &[String],
        env: &BTreeMap<String, String>,
        cwd: &str,
    ) -> io::Result<Self> {
        let cs = |s: &str| {
            CString::new(s).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "NUL byte in argument or environment",
                )
            })
        };
        let path = env
            .get("PATH")
            .map(String::as_str)
            .unwrap_or("/usr/bin:/bin");
        Ok(ExecPlan {
            argv: argv.iter().map(|a| cs(a)).collect::<io::Result<_>>()?,
            env: env
                .iter()
                .map(|(k, v)| cs(&format!("{k}={v}")))
                .collect::<io::Result<_>>()?,
            path_dirs: path
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| d.as_bytes().to_vec())
                .collect(),
            cwd: cs(cwd)?,
            tty: false,
            user: None,
        })
    }

    /// A plan that runs nothing (for a reaper that only reports a failure).
    pub(super) fn empty() -> Self {
        ExecPlan {
            argv: Vec::new(),
            env: Vec::new(),
            path_dirs: Vec::new(),
            cwd: CString::default(),
            tty: false,
            user: None,
        }
    }

    /// Candidate program paths for argv[0], PATH-searched like a shell.
    pub(super) fn candidates(&self) -> Vec<CString> {
        let name = self.argv[0].as_bytes();
        if name.contains(&b'/') {
            return vec![self.argv[0].clone()];
        }
        self.path_dirs
            .iter()
            .filter_map(|d| {
                let mut p = d.clone();
                p.push(b'/');
                p.extend_from_slice(name);
                CString::new(p).ok()
            })
            .collect()
    }
}

/// Sends a standby reaper its job with the program's stdio and the status pipe (or a
/// pre-forked program its job with its stdio).
pub(super) fn send_job(chan: &UnixStream, job: &[u8], fds: &[RawFd]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, sendmsg};
    let cmsg = [ControlMessage::ScmRights(fds)];
    let iov = [io::IoSlice::new(job)];
    let sent = sendmsg::<()>(chan.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)?;
    let mut chan = chan;
    chan.write_all(&job[sent..])
}

/// Receives the job (and its four descriptors) on a standby reaper's socket; `None` when the
/// agent closed it without one.
pub(super) fn receive_job(chan: &UnixStream) -> Option<(Job, Vec<OwnedFd>)> {
    receive_job_with(chan, MsgFlags::MSG_CMSG_CLOEXEC)
}

/// [`receive_job`] with the given `recvmsg` flags: without `MSG_CMSG_CLOEXEC` the
/// descriptors survive an exec.
fn receive_job_with(chan: &UnixStream, flags: MsgFlags) -> Option<(Job, Vec<OwnedFd>)> {
    let mut frames = FrameBuffer::default();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (n, passed) = match recv_with_fds(chan.as_raw_fd(), &mut buf, flags) {
            Ok(r) => r,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        };
        fds.extend(passed);
        if n == 0 {
            return None;
        }
        frames.push(&buf[..n]);
        match frames.next_frame::<Job>() {
            Ok(Some(f)) => return Some((f.header, fds)),
            Ok(None) => continue,
            Err(_) => return None,
        }
    }
}

/// Where a reaper that serves exec after exec keeps its job socket: above the program's
/// stdio and status pipe (0-3), which are renumbered for each job.
const REAPER_CHAN_FD: RawFd = 4;

/// A standby reaper: PID 1 of the next exec's namespace, made before the exec is asked
/// for. It mounts its `/proc`, takes on the tier's confinement and (with `prefork`) forks
/// the program's process, which drops its privileges at once; then it waits for its job
/// and runs it as [`run_job`]. Never returns.
///
/// With the program forked ahead (no per-exec cgroups), the reaper serves exec after exec
/// in its namespaces: once it has reported one (its whole tree killed and reaped), it
/// forks the next program's process and sends the agent that process's socket over
/// `chan`. The agent keeps the reaper as its next standby, or closes `chan` and the
/// reaper exits. An exec then costs no new namespaces, `/proc` mount or reaper process
/// (ADR 0021).
pub(super) fn standby_main(cfg: &AgentConfig, chan: UnixStream, prefork: Option<UnixStream>) -> ! {
    let failed = reaper_setup(cfg);
    // A terminate sent to the reaper (a background exec's) reaches the whole tree, and so
    // does a resize's SIGWINCH where the agent sends it.
    let _ = sys::forward_signals_to_namespace();
    let reusable = prefork.is_some() && failed.is_none();
    // A reaper that failed its set-up forks no program: the socket is dropped now, so the
    // agent's hand-over to it fails (or is discarded) and the job comes here.
    let prefork = if failed.is_none() { prefork } else { None };
    let (chan, mut next) = match prefork {
        // A reaper that lives on keeps nothing of the agent's but its own two sockets:
        // not the agent's channel, nor any exec's pipes (a copy held here would keep a
        // reader from its EOF for as long as the reaper lives).
        Some(sock) if reusable => match keep_only(chan, sock) {
            Some((chan, sock)) => (chan, Some(sock)),
            None => sys::exit_now(120),
        },
        other => (chan, other),
    };
    loop {
        // The program's process is forked now too, off the exec's critical path; it waits
        // for the job on its own socket, which the agent sends it. Without it (no prefork,
        // or the fork failed) the reaper forks the program once the job is here. Only
        // after the confinement above: a failure there leaves no program (its socket is
        // dropped here, so the agent's hand-over to it fails or is discarded).
        let mut program = None;
        if failed.is_none()
            && let Some(sock) = next.take()
        {
            match sys::fork_into(0) {
                Ok(sys::Forked::Child) => {
                    drop(chan);
                    program_standby(cfg, sock)
                }
                Ok(sys::Forked::Parent(pid)) => {
                    // A signal relayed before the job came is this process's.
                    sys::set_relay_target(pid.as_raw());
                    program = Some(pid)
                }
                Err(_) => {}
            }
        }
        let Some((job, fds)) = receive_job(&chan) else {
            sys::exit_now(0)
        };
        let Ok([a, b, c, status]) = <[OwnedFd; 4]>::try_from(fds) else {
            sys::exit_now(120)
        };
        // Only a reaper that serves exec after exec forks its program ahead.
        if let Some(pid) = program {
            if job.direct {
                // The program has its job and its stdio: the reaper drops its copies (one
                // call when they arrived on 0-2, as they do here) and only waits for the
                // tree and reports, doing as little as it can beside the program's start.
                if on_zero_to_two(&[&a, &b, &c]) && sys::close_between(0, 2).is_ok() {
                    for fd in [a, b, c] {
                        let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
                    }
                } else {
                    drop((a, b, c));
                }
                // Timed from the agent's hand-over (the job may be read after the program
                // ran).
                let since = Duration::from_micros(monotonic_us().saturating_sub(job.handed_us));
                let now = Instant::now();
                let handed = now.checked_sub(since).unwrap_or(now);
                wait_and_report(pid, handed, File::from(status));
                if job.last {
                    sys::exit_now(0)
                }
                next = next_program(&chan);
                continue;
            }
            // It did not get its job: one is forked below instead.
            let _ = kill(pid, Signal::SIGKILL);
        }
        let mut job_failed = failed.clone();
        let plan = match ExecPlan::new(&job.argv, &job.env, &job.cwd) {
            Ok(p) => ExecPlan {
                tty: job.tty,
                user: job.user.clone(),
                ..p
            },
            Err(e) => {
                job_failed.get_or_insert(format!("bad exec request: {e}"));
                // Never used: the failure is reported below before the plan is.
                ExecPlan::empty()
            }
        };
        if reusable && job_failed.is_none() && !job.last {
            run_job(cfg, &plan, &job.limits, [a, b, c], status, None, 5);
            next = next_program(&chan);
            continue;
        }
        drop(chan);
        run_job(cfg, &plan, &job.limits, [a, b, c], status, job_failed, 4);
        sys::exit_now(0)
    }
}

/// A standby reaper's own set-up: its `/proc`, then the tier's confinement (Landlock,
/// seccomp), once /proc is mounted and before the program exists, so the reaper and
/// everything it starts are inside it. The failure, if any, to report for its exec.
fn reaper_setup(cfg: &AgentConfig) -> Option<String> {
    if cfg.mount_proc {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        if let Err(e) = mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>) {
            return Some(format!("cannot mount /proc for the exec: {e}"));
        }
        if let Some(id) = &cfg.boot_id
            && let Err(e) = mount(
                Some(id.as_path()),
                "/proc/sys/kernel/random/boot_id",
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        {
            return Some(format!("cannot give the exec the sandbox's boot id: {e}"));
        }
    }
    if let Some(hook) = &cfg.confine
        && let Err(e) = hook()
    {
        return Some(format!("the sandbox's filters could not be applied: {e}"));
    }
    None
}

/// True when `fds` are descriptors 0, 1, 2, ... in order.
fn on_zero_to_two(fds: &[&OwnedFd]) -> bool {
    fds.iter().map(|f| f.as_raw_fd()).eq(0..fds.len() as RawFd)
}

/// Readies a reaper for its next exec: the next program's socket goes to the agent first
/// (it may send the job before the process exists; the job waits in the socket), and the
/// end the process is forked with is returned. A closed `chan` means the agent did not
/// keep this reaper: it exits.
fn next_program(chan: &UnixStream) -> Option<UnixStream> {
    let Ok((near, far)) = UnixStream::pair() else {
        sys::exit_now(0)
    };
    if send_job(chan, b"p", &[near.as_raw_fd()]).is_err() {
        // Not kept: what is left is this namespace's teardown, which nobody waits for;
        // the host's reading of the report goes first.
        let _ = sys::set_nice(19);
        sys::exit_now(0)
    }
    Some(far)
}

/// Puts `chan` on [`REAPER_CHAN_FD`] and `sock` on the descriptor after it, and closes
/// every other descriptor; `None` if it cannot. Both are first lifted above the range, so
/// neither dup2 lands on the other.
fn keep_only(chan: UnixStream, sock: UnixStream) -> Option<(UnixStream, UnixStream)> {
    let lift = |s: UnixStream| {
        nix::fcntl::fcntl(&s, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(64))
            .ok()
            .map(sys::own_fd)
    };
    let (chan, sock) = (lift(chan)?, lift(sock)?);
    let first = REAPER_CHAN_FD;
    sys::dup2_to(&chan, first).ok()?;
    sys::dup2_to(&sock, first + 1).ok()?;
    drop((chan, sock));
    sys::close_between(0, first as u32 - 1).ok()?;
    sys::close_from(first as u32 + 2).ok()?;
    Some((
        UnixStream::from(sys::own_fd(first)),
        UnixStream::from(sys::own_fd(first + 1)),
    ))
}

/// The reaper, job in hand: PID 1 of the exec's namespace, which forks the program now.
/// Every descriptor from `keep_below` up is closed first. Returns once the exec's whole
/// tree has been reaped and reported on the status pipe (or the failure reported); the
/// program's own process never returns from here.
pub(super) fn run_job(
    cfg: &AgentConfig,
    plan: &ExecPlan,
    limits: &ProcLimits,
    stdio: [OwnedFd; 3],
    status: OwnedFd,
    failed: Option<String>,
    keep_below: u32,
) {
    // Move what we keep to fixed numbers: stdio to 0-2, the status pipe to 3. First lift
    // every descriptor above the range, so no dup2 below lands on one still needed.
    let [a, b, c] = stdio;
    renumber_from_zero([a, b, c, status]);
    if sys::close_from(keep_below).is_err() {
        sys::exit_now(120);
    }
    // fd 3 is ours: dup2'd above.
    let mut status = File::from(sys::own_fd(3));
    if let Some(e) = failed {
        let _ = writeln!(io::stderr(), "cordon: {e}");
        let _ = status.write_all(b"exit 125 0 0\n");
        return;
    }
    let started = Instant::now();
    let child = match sys::fork_into(0) {
        Ok(sys::Forked::Child) => {
            drop(status);
            program_main(cfg, plan, limits)
        }
        Ok(sys::Forked::Parent(pid)) => {
            sys::set_relay_target(pid.as_raw());
            pid
        }
        Err(_) => sys::exit_now(120),
    };
    // Close our copies of the program's stdio so the host sees EOF when the tree is gone.
    for fd in 0..3 {
        let _ = nix::unistd::close(fd);
    }
    wait_and_report(child, started, status);
}

/// Waits for the program `child` (handed its job at `started`) and then for every process
/// left in the namespace, killed once the program is done; reports on `status`.
fn wait_and_report(child: Pid, started: Instant, mut status: File) {
    let mut main_status = None;
    let mut program_us = 0u64;
    // The whole tree's figures, summed over this exec's children as each is reaped (the
    // reaper may have served execs before).
    let (mut rss_kb, mut cpu_us) = (0u64, 0u64);
    loop {
        match sys::wait_any() {
            Ok(r) => {
                cpu_us += r.cpu_us;
                rss_kb = rss_kb.max(r.max_rss_kb);
                if r.pid == child && r.end != sys::End::Other {
                    // Reaped: its pid may name another process from now on.
                    sys::set_relay_target(0);
                    main_status = Some(r.end);
                    program_us = started.elapsed().as_micros() as u64;
                    // The program is done: end everything it left behind.
                    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                }
            }
            // Only "no child left" ends the wait: every process of the namespace is gone.
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => break,
            Err(_) => continue,
        }
    }
    let line = match main_status {
        Some(sys::End::Exited(code)) => {
            format!("exit {code} {rss_kb} {cpu_us} {program_us}\n")
        }
        Some(sys::End::Signaled(sig)) => {
            format!("signal {sig} {rss_kb} {cpu_us} {program_us}\n")
        }
        _ => format!("signal 9 {rss_kb} {cpu_us} {program_us}\n"),
    };
    let _ = status.write_all(line.as_bytes());
}

/// The program's own process, between fork and exec, forked once the job is known. Never
/// returns.
pub(super) fn program_main(cfg: &AgentConfig, plan: &ExecPlan, limits: &ProcLimits) -> ! {
    if let Err(e) = sys::close_from(3) {
        program_fail("closing inherited descriptors", &e);
    }
    leave_the_agent();
    take_terminal(plan);
    // Limits before the privileges go (a VM's root may raise a hard limit); the working
    // directory after, as on the forked-ahead path: the program's own user must reach it.
    apply_limits(limits);
    if let Err(e) = drop_privileges(cfg, plan.user.as_ref()) {
        program_fail("dropping privileges", &e);
    }
    enter_cwd(plan);
    exec_program(plan)
}

/// The program's own process forked ahead of its job: it drops every privilege at once,
/// then waits on `sock` for the job and its stdin, stdout and stderr. Never returns.
pub(super) fn program_standby(cfg: &AgentConfig, sock: UnixStream) -> ! {
    // Keep only the job socket (as fd 3): nothing of the agent's stays open in here.
    let raw = std::os::fd::IntoRawFd::into_raw_fd(sock);
    if raw != 3 {
        if sys::dup2_to(&raw, 3).is_err() {
            sys::exit_now(120);
        }
        let _ = nix::unistd::close(raw);
    }
    // 0-2 too: the job's stdin, stdout and stderr then arrive there, in order (the kernel
    // gives passed descriptors the lowest free numbers), with nothing left to move.
    if sys::close_from(4).is_err() || sys::close_between(0, 2).is_err() {
        sys::exit_now(120);
    }
    let sock = UnixStream::from(sys::own_fd(3));
    leave_the_agent();
    let dropped = drop_privileges(cfg, None);
    // No job: the reaper went away (then so does this namespace) or sent a bad one, which
    // the reaper reports as this process's exit status. Received without close-on-exec:
    // these are the program's own.
    let Some((job, fds)) = receive_job_with(&sock, MsgFlags::empty()) else {
        sys::exit_now(120)
    };
    drop(sock);
    let Ok(stdio) = <[OwnedFd; 3]>::try_from(fds) else {
        sys::exit_now(120)
    };
    if on_zero_to_two(&[&stdio[0], &stdio[1], &stdio[2]]) {
        // Already in place: kept open for the program.
        for fd in stdio {
            let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
        }
    } else {
        renumber_from_zero(stdio);
    }
    if let Err(e) = dropped {
        program_fail("dropping privileges", &e);
    }
    let plan = match ExecPlan::new(&job.argv, &job.env, &job.cwd) {
        Ok(plan) => ExecPlan {
            tty: job.tty,
            ..plan
        },
        Err(e) => program_fail("bad exec request", &e),
    };
    // A session leader since `leave_the_agent`: its terminal becomes the controlling one.
    take_terminal(&plan);
    // Lowering limits needs no privilege (and raising a hard limit needs one the sandbox's
    // root never has: CAP_SYS_RESOURCE in the host's user namespace).
    apply_limits(&job.limits);
    enter_cwd(&plan);
    exec_program(&plan)
}

/// Puts `fds` on descriptors 0, 1, 2, ... in order (in a forked child; exits 120 if it
/// cannot). Each is first lifted above the range, so no dup2 lands on one still needed.
pub(super) fn renumber_from_zero<const N: usize>(fds: [OwnedFd; N]) {
    let mut high = Vec::new();
    for fd in fds {
        match nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(64)) {
            Ok(raw) => high.push(sys::own_fd(raw)),
            Err(_) => sys::exit_now(120),
        }
    }
    for (i, fd) in high.iter().enumerate() {
        if sys::dup2_to(fd, i as RawFd).is_err() {
            sys::exit_now(120);
        }
    }
}

pub(super) fn program_fail(step: &str, e: &dyn std::fmt::Display) -> ! {
    let _ = writeln!(io::stderr(), "cordon: {step}: {e}");
    sys::exit_now(127)
}

/// Its own session, and the OOM killer's first choice (never the agent).
pub(super) fn leave_the_agent() {
    let _ = setsid();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/oom_score_adj")
    {
        let _ = f.write_all(b"1000");
    }
}

/// The sandbox user (or `user`, never id 0), every capability gone, `no_new_privs`.
pub(super) fn drop_privileges(
    cfg: &AgentConfig,
    user: Option<&crate::proto::ProcUser>,
) -> io::Result<()> {
    let (uid, gid, mut groups) = match user {
        Some(u) if u.uid != 0 && u.gid != 0 && !u.groups.contains(&0) => (
            Uid::from_raw(u.uid),
            Gid::from_raw(u.gid),
            u.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
        ),
        Some(_) => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a program never runs as user or group 0",
            ));
        }
        None => (Uid::from_raw(cfg.uid), Gid::from_raw(cfg.gid), Vec::new()),
    };
    groups.insert(0, gid);
    setgroups(&groups)
        .and_then(|_| setresgid(gid, gid, gid))
        .map_err(io::Error::from)
        .and_then(|_| sys::drop_bounding_set())
        .and_then(|_| setresuid(uid, uid, uid).map_err(io::Error::from))
        .and_then(|_| sys::clear_ambient())
        .and_then(|_| nix::sys::prctl::set_no_new_privs().map_err(io::Error::from))
}

/// On a pseudo-terminal, makes stdin's terminal the (new session's) controlling terminal,
/// so the program gets `SIGWINCH`, `^C` and job control from it.
pub(super) fn take_terminal(plan: &ExecPlan) {
    if plan.tty
        && let Err(e) = sys::take_controlling_terminal(0)
    {
        program_fail("taking the pseudo-terminal as the controlling terminal", &e);
    }
}

pub(super) fn apply_limits(limits: &ProcLimits) {
    let lim = |r: Resource, v: u64| setrlimit(r, v, v);
    if let Err(e) = lim(Resource::RLIMIT_NOFILE, limits.open_files)
        .and_then(|_| lim(Resource::RLIMIT_FSIZE, limits.file_size))
        .and_then(|_| lim(Resource::RLIMIT_CORE, 0))
        .and_then(|_| {
            if limits.processes > 0 {
                lim(Resource::RLIMIT_NPROC, limits.processes)
            } else {
                Ok(())
            }
        })
        .and_then(|_| {
            if limits.address_space > 0 {
                lim(Resource::RLIMIT_AS, limits.address_space)
            } else {
                Ok(())
            }
        })
    {
        program_fail("setting resource limits", &e);
    }
}

pub(super) fn enter_cwd(plan: &ExecPlan) {
    if let Err(e) = nix::unistd::chdir(plan.cwd.as_c_str()) {
        program_fail(&format!("changing to {:?}", plan.cwd), &e);
    }
}

/// Closes what is left of the agent's descriptors and execs, trying each PATH candidate.
/// Never returns.
pub(super) fn exec_program(plan: &ExecPlan) -> ! {
    if let Err(e) = sys::close_from(3) {
        program_fail("closing inherited descriptors", &e);
    }
    // The agent's runtime ignores SIGPIPE, and an ignored signal stays ignored across
    // exec: the program starts with every signal's default action, as anywhere else (a
    // writer into a closed pipe ends by SIGPIPE).
    sys::default_signal_actions();
    let mut last = Errno::ENOENT;
    for cand in plan.candidates() {
        match nix::unistd::execve(&cand, &plan.argv, &plan.env) {
            Err(e) => {
                if e != Errno::ENOENT || last == Errno::ENOENT {
                    last = e;
                }
            }
        }
    }
    let name = String::from_utf8_lossy(plan.argv[0].as_bytes()).into_owned();
    let _ = writeln!(io::stderr(), "cordon: cannot run {name}: {last}");
    sys::exit_now(if last == Errno::ENOENT { 127 } else { 126 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search() {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/a:/b".to_string());
        let p = ExecPlan::new(&["ls".into()], &env, "/").unwrap();
        assert_eq!(p.candidates().len(), 2);
        let p = ExecPlan::new(&["/x/ls".into()], &env, "/").unwrap();
        assert_eq!(p.candidates(), vec![CString::new("/x/ls").unwrap()]);
        assert!(ExecPlan::new(&["a\0b".into()], &env, "/").is_err());
    }
}
