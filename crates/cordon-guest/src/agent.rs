//! The agent: serves [`Request`]s on a stream socket inside the sandbox.
//!
//! Each exec runs under a *reaper*: a process forked into a fresh PID and mount namespace
//! (with its own `/proc`), so the program sees only its own process tree, and killing the
//! reaper kills that whole tree — daemons and double forks included. The next exec's reaper
//! is made ahead of time (a *standby*: namespaces made, `/proc` mounted, confinement applied,
//! waiting for its job on a socket), so an exec pays only for the program's own fork and
//! exec; a reaper that has reported its program's end finishes exiting off the critical path. The program itself runs
//! as an unprivileged user with every capability gone, `no_new_privs`, rlimits, and whatever
//! the tier installs in [`AgentConfig::confine`] (the container tier's Landlock and seccomp).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, UsageWho, getrusage, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::statvfs::statvfs;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid, setgroups, setresgid, setresuid, setsid};

use crate::files::Workspace;
use crate::proto::{
    EgressSetup, ErrorCode, Frame, FrameBuffer, PROTOCOL_VERSION, ProcLimits, ProtoError, Reply,
    Request, StdioMode, Stream, encode,
};
use crate::sys;

/// Confinement hook, run in each exec's reaper after its `/proc` is mounted and before the
/// program is forked, so both are confined by it.
pub type Confine = Box<dyn Fn() -> io::Result<()>>;

/// How the agent runs programs.
pub struct AgentConfig {
    /// Identifies the agent in its hello.
    pub name: String,
    /// User and group programs run as.
    pub uid: u32,
    pub gid: u32,
    /// The workspace; files in and out stay beneath it.
    pub workdir: PathBuf,
    /// Filesystems whose fullness is reported as `disk_full` after an exec.
    pub scratch: Vec<PathBuf>,
    /// Mount a fresh `/proc` in each exec's PID namespace.
    pub mount_proc: bool,
    pub confine: Option<Confine>,
}

struct Running {
    id: u64,
    reaper: Pid,
    pidfd: OwnedFd,
    status: File,
    /// What the reaper wrote so far on its status pipe.
    report: Vec<u8>,
    framed: Option<FramedIo>,
    cpu_before_us: u64,
    cgroup: Option<PathBuf>,
    /// The host said no exec follows: no reaper is readied after this one.
    last: bool,
}

/// A reaper made ahead of its exec, waiting for the job on `chan`.
struct Standby {
    pid: Pid,
    pidfd: OwnedFd,
    chan: UnixStream,
}

/// What a standby reaper is sent (with the program's stdin, stdout, stderr and the status
/// pipe as descriptors).
#[derive(serde::Serialize, serde::Deserialize)]
struct Job {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    limits: ProcLimits,
}

struct FramedIo {
    stdout: Option<File>,
    stderr: Option<File>,
    stdin: Option<File>,
    stdin_buf: VecDeque<u8>,
    stdin_close: bool,
}

/// The host channel: a Unix socket (which can carry descriptors) or a character device such
/// as a virtio-serial port (bytes only: use [`StdioMode::Framed`]).
enum Channel {
    Socket(UnixStream),
    Port(File),
}

impl Channel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Channel::Socket(s) => s.as_fd(),
            Channel::Port(f) => f.as_fd(),
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Channel::Socket(s) => s.write_all(bytes),
            Channel::Port(f) => f.write_all(bytes),
        }
    }
}

/// Per-sandbox settings the host sent with [`Request::Configure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub hostname: String,
    pub memory_bytes: u64,
    pub pids: u32,
    pub disk_bytes: u64,
    pub tmp_bytes: u64,
    pub unix_time_ms: u64,
    /// The egress path to set up, if the sandbox has one.
    pub egress: Option<EgressSetup>,
}

/// Applies [`Settings`] inside the sandbox; gets the host's random seed too.
pub type ConfigureHook = Box<dyn FnMut(&Settings, &[u8]) -> io::Result<()>>;

/// Per-exec cgroups (v2) the agent creates under `root`, limited by the configured settings.
struct ExecCgroups {
    root: PathBuf,
    memory_bytes: u64,
    pids: u32,
}

/// Serves one host connection until it closes or sends `Shutdown`.
pub struct Agent {
    cfg: AgentConfig,
    ctrl: Channel,
    work: Workspace,
    inbuf: FrameBuffer,
    fds: VecDeque<OwnedFd>,
    running: Option<Running>,
    standby: Option<Standby>,
    /// Reapers that reported their program's end and are still exiting (namespace teardown).
    exiting: Vec<(Pid, OwnedFd)>,
    configure: Option<ConfigureHook>,
    cgroups: Option<ExecCgroups>,
}

const MAX_STDIN_BUFFER: usize = 16 << 20;

impl Agent {
    pub fn new(cfg: AgentConfig, ctrl: UnixStream) -> io::Result<Self> {
        Self::with_channel(cfg, Channel::Socket(ctrl))
    }

    /// An agent serving a character device (a virtio-serial port): no descriptors can be
    /// passed, so execs must use [`StdioMode::Framed`].
    pub fn over_port(cfg: AgentConfig, port: File) -> io::Result<Self> {
        Self::with_channel(cfg, Channel::Port(port))
    }

    /// Accepts [`Request::Configure`], applying it with `hook`.
    pub fn on_configure(mut self, hook: ConfigureHook) -> Self {
        self.configure = Some(hook);
        self
    }

    /// Runs each exec in its own cgroup v2 under `root` (memory without swap, pids), with
    /// the limits [`Request::Configure`] sets; OOM kills and refused forks are reported.
    pub fn with_exec_cgroups(mut self, root: PathBuf) -> Self {
        self.cgroups = Some(ExecCgroups {
            root,
            memory_bytes: 0,
            pids: 0,
        });
        self
    }

    fn with_channel(cfg: AgentConfig, ctrl: Channel) -> io::Result<Self> {
        let work = Workspace::open(&cfg.workdir, cfg.uid, cfg.gid)?;
        Ok(Agent {
            cfg,
            ctrl,
            work,
            inbuf: FrameBuffer::default(),
            fds: VecDeque::new(),
            running: None,
            standby: None,
            exiting: Vec::new(),
            configure: None,
            cgroups: None,
        })
    }

    /// Runs until the host closes the channel or asks to shut down.
    pub fn serve(mut self) -> Result<(), ProtoError> {
        self.send(
            &Reply::Hello {
                version: PROTOCOL_VERSION,
                agent: self.cfg.name.clone(),
            },
            b"",
        )?;
        // Ready the first exec's reaper while the host reads the hello. A failure here is
        // retried (and reported) when an exec asks for it.
        self.standby = self.spawn_standby().ok();
        loop {
            if self.poll_once()? {
                self.end_children();
                return Ok(());
            }
        }
    }

    /// Kills the standby and any running exec (their trees go with them) and reaps them.
    fn end_children(&mut self) {
        let mut pids: Vec<Pid> = Vec::new();
        if let Some(sb) = self.standby.take() {
            pids.push(sb.pid);
        }
        if let Some(run) = self.running.take() {
            pids.push(run.reaper);
        }
        pids.extend(self.exiting.drain(..).map(|(p, _)| p));
        for p in &pids {
            let _ = kill(*p, Signal::SIGKILL);
        }
        for p in pids {
            let _ = waitpid(p, None);
        }
    }

    /// Forks the next exec's reaper into its namespaces; it prepares and waits for a job.
    fn spawn_standby(&self) -> io::Result<Standby> {
        let (ours, theirs) = UnixStream::pair()?;
        match sys::fork_into(libc::CLONE_NEWPID | libc::CLONE_NEWNS)? {
            sys::Forked::Child => {
                drop(ours);
                // With per-exec cgroups the agent moves the reaper alone into the exec's
                // cgroup, so the program must be forked after that, by the reaper.
                standby_main(&self.cfg, theirs, self.cgroups.is_none())
            }
            sys::Forked::Parent(pid) => {
                drop(theirs);
                let pidfd = match sys::pidfd_open(pid) {
                    Ok(fd) => fd,
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
                })
            }
        }
    }

    fn send(&mut self, reply: &Reply, body: &[u8]) -> Result<(), ProtoError> {
        let bytes = encode(reply, body)?;
        self.ctrl.write_all(&bytes)?;
        Ok(())
    }

    fn error(&mut self, code: ErrorCode, message: impl Into<String>) -> Result<(), ProtoError> {
        self.send(
            &Reply::Error {
                code,
                message: message.into(),
            },
            b"",
        )
    }

    /// One round of the event loop; true when the agent should stop.
    fn poll_once(&mut self) -> Result<bool, ProtoError> {
        let ctrl_ready;
        let mut reaper_done = false;
        let mut exited_ready: Vec<usize> = Vec::new();
        let mut out_ready = [false; 2];
        let mut stdin_ready = false;
        {
            let mut fds = vec![PollFd::new(self.ctrl.as_fd(), PollFlags::POLLIN)];
            let mut idx_pid = None;
            let mut idx_out = [None, None];
            let mut idx_in = None;
            let first_exiting = fds.len();
            for (_, fd) in &self.exiting {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
            if let Some(run) = &self.running {
                // The reaper's status line ends the exec; its pidfd, should it die first.
                idx_pid = Some(fds.len());
                fds.push(PollFd::new(run.status.as_fd(), PollFlags::POLLIN));
                fds.push(PollFd::new(run.pidfd.as_fd(), PollFlags::POLLIN));
                if let Some(fr) = &run.framed {
                    for (i, f) in [&fr.stdout, &fr.stderr].into_iter().enumerate() {
                        if let Some(f) = f {
                            idx_out[i] = Some(fds.len());
                            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                        }
                    }
                    if let Some(w) = &fr.stdin
                        && (!fr.stdin_buf.is_empty() || fr.stdin_close)
                    {
                        idx_in = Some(fds.len());
                        fds.push(PollFd::new(w.as_fd(), PollFlags::POLLOUT));
                    }
                }
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => return Ok(false),
                Err(e) => return Err(io::Error::from(e).into()),
            }
            let hit = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
            ctrl_ready = hit(0);
            for k in 0..self.exiting.len() {
                if hit(first_exiting + k) {
                    exited_ready.push(k);
                }
            }
            if let Some(i) = idx_pid {
                reaper_done = hit(i) || hit(i + 1);
            }
            for k in 0..2 {
                if let Some(i) = idx_out[k] {
                    out_ready[k] = hit(i);
                }
            }
            if let Some(i) = idx_in {
                stdin_ready = hit(i);
            }
        }
        for (k, ready) in out_ready.into_iter().enumerate() {
            if ready {
                self.relay_output(k)?;
            }
        }
        if stdin_ready {
            self.feed_stdin();
        }
        for k in exited_ready.into_iter().rev() {
            let (pid, _) = self.exiting.swap_remove(k);
            let _ = waitpid(pid, None);
        }
        if reaper_done && self.status_complete() {
            self.finish_exec()?;
        }
        if ctrl_ready {
            if !self.read_ctrl()? {
                return Ok(true);
            }
            while let Some(frame) = self.inbuf.next_frame::<Request>()? {
                if self.handle(frame)? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Reads what the host sent, with any descriptors attached; false on close.
    fn read_ctrl(&mut self) -> Result<bool, ProtoError> {
        let mut buf = vec![0u8; 64 * 1024];
        if let Channel::Port(port) = &mut self.ctrl {
            let n = match port.read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.kind() == io::ErrorKind::WouldBlock =>
                {
                    return Ok(true);
                }
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Ok(false);
            }
            self.inbuf.push(&buf[..n]);
            return Ok(true);
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(
                self.ctrl.as_fd().as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(m) => m,
                Err(Errno::EINTR | Errno::EAGAIN) => return Ok(true),
                Err(e) => return Err(io::Error::from(e).into()),
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        fds.extend(raw);
                    }
                }
            }
            (msg.bytes, fds)
        };
        for raw in fds {
            // The kernel installed these descriptors for us (SCM_RIGHTS).
            self.fds.push_back(sys::own_fd(raw));
        }
        if n == 0 {
            return Ok(false);
        }
        self.inbuf.push(&buf[..n]);
        Ok(true)
    }

    fn handle(&mut self, frame: Frame<Request>) -> Result<bool, ProtoError> {
        match frame.header {
            Request::Hello { version } => {
                if version != PROTOCOL_VERSION {
                    self.error(
                        ErrorCode::VersionMismatch,
                        format!("agent speaks protocol {PROTOCOL_VERSION}, host {version}"),
                    )?;
                } else {
                    self.send(&Reply::Ok, b"")?;
                }
            }
            Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdio,
                limits,
                last,
            } => {
                if self.running.is_some() {
                    // Descriptors sent along are dropped with the refusal.
                    self.fds.clear();
                    return self
                        .error(ErrorCode::Busy, "an exec is already running")
                        .map(|_| false);
                }
                match self.start_exec(id, &argv, &env, &cwd, stdio, &limits) {
                    Ok(()) => {
                        if let Some(run) = self.running.as_mut() {
                            run.last = last;
                        }
                        self.send(&Reply::Started { id }, b"")?
                    }
                    Err(e) => self.error(ErrorCode::SpawnFailed, e.to_string())?,
                }
            }
            Request::Stdin { id } => {
                if let Some(fr) = self
                    .running
                    .as_mut()
                    .filter(|r| r.id == id)
                    .and_then(|r| r.framed.as_mut())
                {
                    if frame.body.is_empty() {
                        fr.stdin_close = true;
                    } else if fr.stdin_buf.len() + frame.body.len() <= MAX_STDIN_BUFFER {
                        fr.stdin_buf.extend(frame.body);
                    }
                }
            }
            Request::Kill { id } => {
                if let Some(run) = self.running.as_ref().filter(|r| r.id == id) {
                    // Killing the PID namespace's init takes every process in it along.
                    let _ = kill(run.reaper, Signal::SIGKILL);
                }
            }
            Request::PutFile { path, mode } => match self.work.put(&path, mode, &frame.body) {
                Ok(()) => self.send(&Reply::Ok, b"")?,
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::GetFile { path, max } => match self.work.get(&path, max) {
                Ok((data, truncated)) => self.send(&Reply::File { truncated }, &data)?,
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::Configure {
                hostname,
                memory_bytes,
                pids,
                disk_bytes,
                tmp_bytes,
                unix_time_ms,
                egress,
            } => {
                let settings = Settings {
                    hostname,
                    memory_bytes,
                    pids,
                    disk_bytes,
                    tmp_bytes,
                    unix_time_ms,
                    egress,
                };
                let result = match self.configure.as_mut() {
                    None => Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "this agent takes no configuration",
                    )),
                    Some(hook) => hook(&settings, &frame.body),
                };
                match result {
                    Ok(()) => {
                        if let Some(cg) = self.cgroups.as_mut() {
                            cg.memory_bytes = memory_bytes;
                            cg.pids = pids;
                        }
                        self.send(&Reply::Ok, b"")?
                    }
                    Err(e) => self.error(ErrorCode::BadRequest, format!("configure: {e}"))?,
                }
            }
            Request::Shutdown => {
                if let Some(run) = &self.running {
                    let _ = kill(run.reaper, Signal::SIGKILL);
                }
                self.send(&Reply::Ok, b"")?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn start_exec(
        &mut self,
        id: u64,
        argv: &[String],
        env: &BTreeMap<String, String>,
        cwd: &str,
        stdio: StdioMode,
        limits: &ProcLimits,
    ) -> io::Result<()> {
        if argv.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
        }
        let (child_stdio, framed) = match stdio {
            StdioMode::Passed => {
                if self.fds.len() < 3 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "passed stdio needs three descriptors with the request",
                    ));
                }
                let mut take = || self.fds.pop_front().ok_or(io::ErrorKind::InvalidInput);
                ([take()?, take()?, take()?], None)
            }
            StdioMode::Framed => {
                let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                nix::fcntl::fcntl(&in_w, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
                (
                    [in_r, out_w, err_w],
                    Some(FramedIo {
                        stdout: Some(File::from(out_r)),
                        stderr: Some(File::from(err_r)),
                        stdin: Some(File::from(in_w)),
                        stdin_buf: VecDeque::new(),
                        stdin_close: false,
                    }),
                )
            }
        };
        // Checked here, so a bad request is refused before a reaper is spent on it.
        ExecPlan::new(argv, env, cwd)?;
        let cgroup = match &self.cgroups {
            Some(cg) => Some(cg.create(id)?),
            None => None,
        };
        let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(&status_r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let cpu_before_us = children_cpu_us();
        let job = encode(
            &Job {
                argv: argv.to_vec(),
                env: env.clone(),
                cwd: cwd.to_string(),
                limits: limits.clone(),
            },
            b"",
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let fds = [
            child_stdio[0].as_raw_fd(),
            child_stdio[1].as_raw_fd(),
            child_stdio[2].as_raw_fd(),
            status_w.as_raw_fd(),
        ];
        // A standby that died (or never came up) is replaced once.
        let mut standby = None;
        for _ in 0..2 {
            let sb = match self.standby.take() {
                Some(sb) => sb,
                None => self.spawn_standby()?,
            };
            let joined = match &cgroup {
                Some(dir) => std::fs::write(dir.join("cgroup.procs"), sb.pid.to_string()),
                None => Ok(()),
            };
            match joined.and_then(|_| send_job(&sb.chan, &job, &fds)) {
                Ok(()) => {
                    standby = Some(sb);
                    break;
                }
                Err(_) => {
                    let _ = kill(sb.pid, Signal::SIGKILL);
                    let _ = waitpid(sb.pid, None);
                }
            }
        }
        let Some(sb) = standby else {
            return Err(io::Error::other(
                "the exec's reaper could not be started or joined to its cgroup",
            ));
        };
        drop(status_w);
        drop(child_stdio);
        self.running = Some(Running {
            id,
            reaper: sb.pid,
            pidfd: sb.pidfd,
            status: File::from(status_r),
            report: Vec::new(),
            framed,
            cpu_before_us,
            cgroup,
            // Set by the caller from the request.
            last: false,
        });
        Ok(())
    }

    /// Reads what the reaper wrote on its status pipe; true once the line is whole or the
    /// pipe closed (the reaper died without a report).
    fn status_complete(&mut self) -> bool {
        let Some(run) = self.running.as_mut() else {
            return false;
        };
        let mut buf = [0u8; 256];
        loop {
            match (&run.status).read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => {
                    run.report.extend_from_slice(&buf[..n]);
                    if run.report.contains(&b'\n') || run.report.len() > 4096 {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    fn relay_output(&mut self, which: usize) -> Result<(), ProtoError> {
        let Some(run) = self.running.as_mut() else {
            return Ok(());
        };
        let id = run.id;
        let Some(fr) = run.framed.as_mut() else {
            return Ok(());
        };
        let slot = if which == 0 {
            &mut fr.stdout
        } else {
            &mut fr.stderr
        };
        let Some(f) = slot.as_mut() else {
            return Ok(());
        };
        let mut buf = vec![0u8; 64 * 1024];
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(_) => 0,
        };
        if n == 0 {
            *slot = None;
            return Ok(());
        }
        let stream = if which == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        self.send(&Reply::Output { id, stream }, &buf[..n])
    }

    fn feed_stdin(&mut self) {
        let Some(fr) = self.running.as_mut().and_then(|r| r.framed.as_mut()) else {
            return;
        };
        let Some(w) = fr.stdin.as_mut() else {
            return;
        };
        let (a, _) = fr.stdin_buf.as_slices();
        if !a.is_empty() {
            match w.write(a) {
                Ok(n) => {
                    fr.stdin_buf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The program closed its stdin; drop what is left.
                    fr.stdin_buf.clear();
                    fr.stdin = None;
                    return;
                }
            }
        }
        if fr.stdin_buf.is_empty() && fr.stdin_close {
            fr.stdin = None;
        }
    }

    fn finish_exec(&mut self) -> Result<(), ProtoError> {
        let Some(mut run) = self.running.take() else {
            return Ok(());
        };
        // Relay whatever output is still buffered in framed pipes.
        if let Some(fr) = run.framed.as_mut() {
            fr.stdin = None;
            let mut rest: Vec<(Stream, Vec<u8>)> = Vec::new();
            for (stream, slot) in [
                (Stream::Stdout, &mut fr.stdout),
                (Stream::Stderr, &mut fr.stderr),
            ] {
                if let Some(f) = slot.take() {
                    let mut data = Vec::new();
                    let _ = f.take(MAX_STDIN_BUFFER as u64).read_to_end(&mut data);
                    if !data.is_empty() {
                        rest.push((stream, data));
                    }
                }
            }
            for (stream, data) in rest {
                for chunk in data.chunks(1 << 20) {
                    self.send(&Reply::Output { id: run.id, stream }, chunk)?;
                }
            }
        }
        let report = String::from_utf8_lossy(&run.report).into_owned();
        let parsed = parse_report(&report);
        let Report {
            code,
            signal,
            mut max_rss_bytes,
            cpu_us,
            program_us,
        } = match parsed {
            // The reaper reaped its whole tree before writing this; only its own exit (the
            // namespaces' teardown) remains, which need not hold up the reply. An exec
            // cgroup is removed below, so then it is waited for.
            Some(r) if run.cgroup.is_none() => {
                self.exiting.push((run.reaper, run.pidfd));
                r
            }
            Some(r) => {
                let _ = waitpid(run.reaper, None);
                r
            }
            // No report: the reaper was killed or died. As the PID namespace's init, its
            // exit means every process of the exec is gone; wait for that.
            None => {
                let _ = waitpid(run.reaper, None);
                let cpu = children_cpu_us().saturating_sub(run.cpu_before_us);
                Report {
                    code: None,
                    signal: Some(9),
                    max_rss_bytes: 0,
                    cpu_us: cpu,
                    program_us: 0,
                }
            }
        };
        let disk_full = self.cfg.scratch.iter().any(|p| is_full(p));
        let (mut oom_killed, mut pids_limited) = (false, false);
        if let Some(dir) = &run.cgroup {
            let c = ExecCgroups::finish(dir);
            oom_killed = c.0;
            pids_limited = c.1;
            max_rss_bytes = max_rss_bytes.max(c.2);
        }
        self.send(
            &Reply::Exited {
                id: run.id,
                code,
                signal,
                cpu_us,
                max_rss_bytes,
                disk_full,
                oom_killed,
                pids_limited,
                program_us,
            },
            b"",
        )?;
        // The next exec's reaper gets ready while the host reads this reply, unless the host
        // said none follows (a one-shot run: the sandbox is torn down next).
        if self.standby.is_none() && !run.last {
            self.standby = self.spawn_standby().ok();
        }
        Ok(())
    }
}

impl ExecCgroups {
    /// Makes the cgroup of exec `id`, limits set, ready for the reaper to join.
    fn create(&self, id: u64) -> io::Result<PathBuf> {
        let dir = self.root.join(format!("exec-{id}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let set = |file: &str, value: String| {
            std::fs::write(dir.join(file), value.as_bytes()).map_err(|e| {
                io::Error::new(e.kind(), format!("setting {file} of the exec cgroup: {e}"))
            })
        };
        if self.memory_bytes > 0 {
            set("memory.max", self.memory_bytes.to_string())?;
            set("memory.swap.max", "0".into())?;
            // The whole exec is killed when one of its processes is (no half-dead trees).
            let _ = set("memory.oom.group", "1".into());
        }
        if self.pids > 0 {
            set("pids.max", self.pids.to_string())?;
        }
        Ok(dir)
    }

    /// Reads what happened in an exec's cgroup (OOM kills, refused forks, peak memory) and
    /// removes it.
    fn finish(dir: &Path) -> (bool, bool, u64) {
        let count = |file: &str, key: &str| -> u64 {
            std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == key).then(|| v.trim().parse().ok())?
                    })
                })
                .unwrap_or(0)
        };
        let oom = count("memory.events", "oom_kill") > 0;
        let pids = count("pids.events", "max") > 0;
        let peak = std::fs::read_to_string(dir.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        // The reaper has been reaped, so the cgroup is empty; a moment may pass before the
        // kernel agrees.
        for _ in 0..100 {
            if std::fs::remove_dir(dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        (oom, pids, peak)
    }
}

fn children_cpu_us() -> u64 {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| cpu_us_of(&u))
        .unwrap_or(0)
}

/// User plus system CPU time of a usage record, in microseconds.
fn cpu_us_of(u: &nix::sys::resource::Usage) -> u64 {
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    us(u.user_time()) + us(u.system_time())
}

fn is_full(p: &Path) -> bool {
    match statvfs(p) {
        Ok(s) => s.blocks() > 0 && s.blocks_available() == 0,
        Err(_) => false,
    }
}

/// What a reaper reports of its exec on the status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Report {
    code: Option<i32>,
    signal: Option<i32>,
    max_rss_bytes: u64,
    cpu_us: u64,
    /// The program's own time: from its hand-off (or fork) to its exit; 0 when it never ran.
    program_us: u64,
}

/// Parses `exit|signal VALUE RSS_KB CPU_US [PROGRAM_US]`.
fn parse_report(s: &str) -> Option<Report> {
    let mut it = s.split_whitespace();
    let kind = it.next()?;
    let val: i32 = it.next()?.parse().ok()?;
    let rss_kb: u64 = it.next()?.parse().ok()?;
    let cpu_us: u64 = it.next()?.parse().ok()?;
    let program_us: u64 = match it.next() {
        Some(v) => v.parse().ok()?,
        None => 0,
    };
    let (code, signal) = match kind {
        "exit" => (Some(val), None),
        "signal" => (None, Some(val)),
        _ => return None,
    };
    Some(Report {
        code,
        signal,
        max_rss_bytes: rss_kb * 1024,
        cpu_us,
        program_us,
    })
}

/// Everything the program's process needs, prepared before forking so the child only
/// makes system calls.
struct ExecPlan {
    argv: Vec<CString>,
    env: Vec<CString>,
    path_dirs: Vec<Vec<u8>>,
    cwd: CString,
}

impl ExecPlan {
    fn new(argv: &[String], env: &BTreeMap<String, String>, cwd: &str) -> io::Result<Self> {
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
        })
    }

    /// A plan that runs nothing (for a reaper that only reports a failure).
    fn empty() -> Self {
        ExecPlan {
            argv: Vec::new(),
            env: Vec::new(),
            path_dirs: Vec::new(),
            cwd: CString::default(),
        }
    }

    /// Candidate program paths for argv[0], PATH-searched like a shell.
    fn candidates(&self) -> Vec<CString> {
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
fn send_job(chan: &UnixStream, job: &[u8], fds: &[RawFd]) -> io::Result<()> {
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
fn receive_job(chan: &UnixStream) -> Option<(Job, Vec<OwnedFd>)> {
    let mut frames = FrameBuffer::default();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            chan.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        };
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // The kernel installed these descriptors for us (SCM_RIGHTS).
                    fds.extend(raw.into_iter().map(sys::own_fd));
                }
            }
        }
        let n = msg.bytes;
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

/// A standby reaper: PID 1 of the next exec's namespace, made before the exec is asked
/// for. It mounts its `/proc`, takes on the tier's confinement and (with `prefork`) forks
/// the program's process, which drops its privileges at once; then it waits for its job
/// and runs it as [`reaper_main`]. Never returns.
fn standby_main(cfg: &AgentConfig, chan: UnixStream, prefork: bool) -> ! {
    let mut failed: Option<String> = None;
    if cfg.mount_proc {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        if let Err(e) = mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>) {
            failed = Some(format!("cannot mount /proc for the exec: {e}"));
        }
    }
    // The tier's confinement (Landlock, seccomp) goes on here, once /proc is mounted and
    // before the program exists, so the reaper and everything it starts are inside it.
    if failed.is_none()
        && let Some(hook) = &cfg.confine
        && let Err(e) = hook()
    {
        failed = Some(format!("the sandbox's filters could not be applied: {e}"));
    }
    // The program's process is forked now too, off the exec's critical path; it waits for
    // the job on its own socket. Without it (no prefork, or the fork failed) the reaper
    // forks the program once the job is here.
    let mut program = None;
    if failed.is_none()
        && prefork
        && let Ok((ours, theirs)) = UnixStream::pair()
    {
        match sys::fork_into(0) {
            Ok(sys::Forked::Child) => {
                drop(chan);
                drop(ours);
                program_standby(cfg, theirs)
            }
            Ok(sys::Forked::Parent(pid)) => program = Some((pid, ours)),
            Err(_) => {}
        }
    }
    let Some((job, fds)) = receive_job(&chan) else {
        sys::exit_now(0)
    };
    drop(chan);
    let Ok([a, b, c, status]) = <[OwnedFd; 4]>::try_from(fds) else {
        sys::exit_now(120)
    };
    let plan = match ExecPlan::new(&job.argv, &job.env, &job.cwd) {
        Ok(p) => p,
        Err(e) => {
            failed.get_or_insert(format!("bad exec request: {e}"));
            // Never used: the failure is reported below before the plan is.
            ExecPlan::empty()
        }
    };
    // Hand the job to the pre-forked program; if it is gone, fork a new one below.
    let mut forked = None;
    if failed.is_none()
        && let Some((pid, sock)) = program
    {
        let bytes = encode(&job, b"").unwrap_or_default();
        let fds = [a.as_raw_fd(), b.as_raw_fd(), c.as_raw_fd()];
        let handed = Instant::now();
        if !bytes.is_empty() && send_job(&sock, &bytes, &fds).is_ok() {
            forked = Some((pid, handed));
        } else {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
    reaper_main(cfg, &plan, &job.limits, [a, b, c], status, failed, forked)
}

/// The reaper, job in hand: PID 1 of the exec's namespace. `forked` is the program's
/// process when it was forked ahead and already has its job, with the moment it was
/// handed over. Never returns.
fn reaper_main(
    cfg: &AgentConfig,
    plan: &ExecPlan,
    limits: &ProcLimits,
    stdio: [OwnedFd; 3],
    status: OwnedFd,
    failed: Option<String>,
    forked: Option<(Pid, Instant)>,
) -> ! {
    // Move what we keep to fixed numbers: stdio to 0-2, the status pipe to 3. First lift
    // every descriptor above the range, so no dup2 below lands on one still needed.
    let [a, b, c] = stdio;
    renumber_from_zero([a, b, c, status]);
    if sys::close_from(4).is_err() {
        sys::exit_now(120);
    }
    // fd 3 is ours: dup2'd above.
    let mut status = File::from(sys::own_fd(3));
    if let Some(e) = failed {
        let _ = writeln!(io::stderr(), "cordon: {e}");
        let _ = status.write_all(b"exit 125 0 0\n");
        sys::exit_now(0);
    }
    let (child, started) = match forked {
        Some(forked) => forked,
        None => {
            let started = Instant::now();
            match sys::fork_into(0) {
                Ok(sys::Forked::Child) => {
                    drop(status);
                    program_main(cfg, plan, limits)
                }
                Ok(sys::Forked::Parent(pid)) => (pid, started),
                Err(_) => sys::exit_now(120),
            }
        }
    };
    // Close our copies of the program's stdio so the host sees EOF when the tree is gone.
    for fd in 0..3 {
        let _ = nix::unistd::close(fd);
    }
    let mut main_status = None;
    let mut program_us = 0u64;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
            Ok(ws) => {
                if ws.pid() == Some(child) {
                    main_status = Some(ws);
                    program_us = started.elapsed().as_micros() as u64;
                    // The program is done: end everything it left behind.
                    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                }
            }
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    // Every process of the exec has been waited for: these are the whole tree's figures.
    let (rss_kb, cpu_us) = match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => (u.max_rss() as u64, cpu_us_of(&u)),
        Err(_) => (0, 0),
    };
    let line = match main_status {
        Some(WaitStatus::Exited(_, code)) => {
            format!("exit {code} {rss_kb} {cpu_us} {program_us}\n")
        }
        Some(WaitStatus::Signaled(_, sig, _)) => {
            format!("signal {} {rss_kb} {cpu_us} {program_us}\n", sig as i32)
        }
        _ => format!("signal 9 {rss_kb} {cpu_us} {program_us}\n"),
    };
    let _ = status.write_all(line.as_bytes());
    // What is left is this namespace's teardown, which nobody waits for when the program
    // was forked ahead (no per-exec cgroup to remove): let the host's reading of the report
    // go first.
    if forked.is_some() {
        let _ = sys::set_nice(19);
    }
    sys::exit_now(0)
}

/// The program's own process, between fork and exec, forked once the job is known. Never
/// returns.
fn program_main(cfg: &AgentConfig, plan: &ExecPlan, limits: &ProcLimits) -> ! {
    if let Err(e) = sys::close_from(3) {
        program_fail("closing inherited descriptors", &e);
    }
    leave_the_agent();
    // Limits before the privileges go (a VM's root may raise a hard limit); the working
    // directory after, as on the forked-ahead path: the program's own user must reach it.
    apply_limits(limits);
    if let Err(e) = drop_privileges(cfg) {
        program_fail("dropping privileges", &e);
    }
    enter_cwd(plan);
    exec_program(plan)
}

/// The program's own process forked ahead of its job: it drops every privilege at once,
/// then waits on `sock` for the job and its stdin, stdout and stderr. Never returns.
fn program_standby(cfg: &AgentConfig, sock: UnixStream) -> ! {
    // Keep only the job socket (as fd 3): nothing of the agent's stays open in here.
    let raw = std::os::fd::IntoRawFd::into_raw_fd(sock);
    if raw != 3 {
        if sys::dup2_to(&raw, 3).is_err() {
            sys::exit_now(120);
        }
        let _ = nix::unistd::close(raw);
    }
    if sys::close_from(4).is_err() {
        sys::exit_now(120);
    }
    let sock = UnixStream::from(sys::own_fd(3));
    leave_the_agent();
    let dropped = drop_privileges(cfg);
    // No job: the reaper went away (then so does this namespace) or sent a bad one, which
    // the reaper reports as this process's exit status.
    let Some((job, fds)) = receive_job(&sock) else {
        sys::exit_now(120)
    };
    drop(sock);
    let Ok(stdio) = <[OwnedFd; 3]>::try_from(fds) else {
        sys::exit_now(120)
    };
    renumber_from_zero(stdio);
    if let Err(e) = dropped {
        program_fail("dropping privileges", &e);
    }
    let plan = match ExecPlan::new(&job.argv, &job.env, &job.cwd) {
        Ok(plan) => plan,
        Err(e) => program_fail("bad exec request", &e),
    };
    // Lowering limits needs no privilege (and raising a hard limit needs one the sandbox's
    // root never has: CAP_SYS_RESOURCE in the host's user namespace).
    apply_limits(&job.limits);
    enter_cwd(&plan);
    exec_program(&plan)
}

/// Puts `fds` on descriptors 0, 1, 2, ... in order (in a forked child; exits 120 if it
/// cannot). Each is first lifted above the range, so no dup2 lands on one still needed.
fn renumber_from_zero<const N: usize>(fds: [OwnedFd; N]) {
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

fn program_fail(step: &str, e: &dyn std::fmt::Display) -> ! {
    let _ = writeln!(io::stderr(), "cordon: {step}: {e}");
    sys::exit_now(127)
}

/// Its own session, and the OOM killer's first choice (never the agent).
fn leave_the_agent() {
    let _ = setsid();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/oom_score_adj")
    {
        let _ = f.write_all(b"1000");
    }
}

/// The sandbox user, every capability gone, `no_new_privs`.
fn drop_privileges(cfg: &AgentConfig) -> io::Result<()> {
    let uid = Uid::from_raw(cfg.uid);
    let gid = Gid::from_raw(cfg.gid);
    setgroups(&[gid])
        .and_then(|_| setresgid(gid, gid, gid))
        .map_err(io::Error::from)
        .and_then(|_| sys::drop_bounding_set())
        .and_then(|_| setresuid(uid, uid, uid).map_err(io::Error::from))
        .and_then(|_| sys::clear_ambient())
        .and_then(|_| nix::sys::prctl::set_no_new_privs().map_err(io::Error::from))
}

fn apply_limits(limits: &ProcLimits) {
    let lim = |r: Resource, v: u64| setrlimit(r, v, v);
    if let Err(e) = lim(Resource::RLIMIT_NOFILE, limits.open_files)
        .and_then(|_| lim(Resource::RLIMIT_FSIZE, limits.file_size))
        .and_then(|_| lim(Resource::RLIMIT_CORE, 0))
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

fn enter_cwd(plan: &ExecPlan) {
    if let Err(e) = nix::unistd::chdir(plan.cwd.as_c_str()) {
        program_fail(&format!("changing to {:?}", plan.cwd), &e);
    }
}

/// Closes what is left of the agent's descriptors and execs, trying each PATH candidate.
/// Never returns.
fn exec_program(plan: &ExecPlan) -> ! {
    if let Err(e) = sys::close_from(3) {
        program_fail("closing inherited descriptors", &e);
    }
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
    fn reports_parse() {
        let r = parse_report("exit 3 100 7 450\n").unwrap();
        assert_eq!(
            (r.code, r.signal, r.max_rss_bytes, r.cpu_us, r.program_us),
            (Some(3), None, 102400, 7, 450)
        );
        let r = parse_report("signal 9 0 0\n").unwrap();
        assert_eq!((r.code, r.signal, r.program_us), (None, Some(9), 0));
        assert_eq!(parse_report("exit 3 100 7 x\n"), None);
        assert_eq!(parse_report("exit 3 100\n"), None);
        assert_eq!(parse_report(""), None);
        assert_eq!(parse_report("exit x 1"), None);
    }

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
