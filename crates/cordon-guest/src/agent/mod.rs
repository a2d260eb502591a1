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
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, UsageWho, getrusage, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid, setgroups, setresgid, setresuid, setsid};

use crate::files::Workspace;
use crate::proto::{
    EgressSetup, ErrorCode, Frame, FrameBuffer, PROTOCOL_VERSION, ProcLimits, ProtoError, Reply,
    Request, StdioMode, Stream, encode,
};
use crate::sys;

mod background;
mod child;
mod exec;
mod files;

use background::*;
pub(crate) use child::recv_with_fds;
use child::*;

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
    /// After a terminal's resize, send `SIGWINCH` to the exec's reaper, which passes it on
    /// to every process of the exec: for kernels whose pseudo-terminals send none (gVisor's).
    pub winch_on_resize: bool,
}

struct Running {
    id: u64,
    reaper: Pid,
    /// None where the kernel has no `pidfd_open` (gVisor): the status pipe's end is the sign.
    pidfd: Option<OwnedFd>,
    status: File,
    /// What the reaper wrote so far on its status pipe.
    report: Vec<u8>,
    framed: Option<FramedIo>,
    cpu_before_us: u64,
    cgroup: Option<PathBuf>,
    /// The host said no exec follows, or the exec runs in the background: its reaper
    /// serves no other exec, and none is readied after it.
    last: bool,
    /// The reaper's job socket, held until the exec ends (a foreground exec's reaper may
    /// then serve the next one, see [`child::standby_main`]); dropping it lets the reaper
    /// exit once it reported.
    chan: Option<UnixStream>,
    /// [`Standby::served_cpu_us`] of its reaper.
    served_cpu_us: u64,
}

/// Where a background exec's descriptors are in one round's poll set.
struct BgWatch {
    id: u64,
    status: usize,
    pidfd: Option<usize>,
    out: [Option<usize>; 2],
    stdin: Option<usize>,
}

/// A reaper made ahead of its exec, waiting for the job on `chan`.
struct Standby {
    pid: Pid,
    pidfd: Option<OwnedFd>,
    chan: UnixStream,
    /// The program's process the reaper forks ahead waits for its job on the other end:
    /// the agent hands it over itself, so the program does not wait for the reaper to
    /// wake and pass it on (on gVisor's ptrace platform each such wake costs 1-3 ms).
    /// None with per-exec cgroups, where the program is forked only once the reaper is in
    /// its exec's cgroup.
    program: Option<UnixStream>,
    /// CPU time of the execs this reaper already served and reported: not the next one's,
    /// should the reaper die without a report (its whole life is then counted).
    served_cpu_us: u64,
}

/// What a standby reaper is sent (with the program's stdin, stdout, stderr and the status
/// pipe as descriptors).
#[derive(serde::Serialize, serde::Deserialize)]
struct Job {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    limits: ProcLimits,
    /// Its stdin is a terminal, to become the program's controlling terminal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    tty: bool,
    /// Who it runs as, when not the sandbox's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<crate::proto::ProcUser>,
    /// (To a reaper) the agent already handed this job to the program's process the
    /// reaper forked ahead; without it, that process is replaced by one the reaper forks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    direct: bool,
    /// When the agent handed the job to the program (`CLOCK_MONOTONIC`, µs): the reaper
    /// may get its own copy only after the program has run, and times it from here.
    #[serde(default)]
    handed_us: u64,
}

/// A background exec's own user: never id 0, the agent's own (its files, its processes).
fn check_user(u: &crate::proto::ProcUser) -> Result<(), String> {
    if u.uid == 0 || u.gid == 0 || u.groups.contains(&0) {
        return Err(
            "a program never runs as user or group 0 here (the agent's); \
                    give other ids"
                .into(),
        );
    }
    Ok(())
}

/// `CLOCK_MONOTONIC` in microseconds: the clock `Instant` reads, comparable across the
/// agent's processes.
fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

struct FramedIo {
    stdout: Option<File>,
    stderr: Option<File>,
    stdin: Option<File>,
    stdin_buf: VecDeque<u8>,
    stdin_close: bool,
    /// On a pseudo-terminal: its master (`stdout` and `stdin` are copies of it), held until
    /// the exec ends, so closing stdin sends the terminal's end-of-file character and never
    /// hangs the terminal up; resizes act on it.
    tty: Option<File>,
}

/// The host channel: a Unix socket (which can carry descriptors), a character device such
/// as a virtio-serial port, or a pair of pipes (the gVisor tier's stdin and stdout); the
/// last two carry bytes only: use [`StdioMode::Framed`].
enum Channel {
    Socket(UnixStream),
    Port(File),
    Pipes { rx: File, tx: File },
}

impl Channel {
    /// What is polled for input.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Channel::Socket(s) => s.as_fd(),
            Channel::Port(f) => f.as_fd(),
            Channel::Pipes { rx, .. } => rx.as_fd(),
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Channel::Socket(s) => s.write_all(bytes),
            Channel::Port(f) => f.write_all(bytes),
            Channel::Pipes { tx, .. } => tx.write_all(bytes),
        }
    }

    /// Reads bytes (descriptors sent along on a socket are dropped).
    fn read_bytes(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Channel::Socket(s) => s.read(buf),
            Channel::Port(f) => f.read(buf),
            Channel::Pipes { rx, .. } => rx.read(buf),
        }
    }

    /// The byte stream to read from, for channels that carry no descriptors.
    fn bytes_in(&mut self) -> Option<&mut File> {
        match self {
            Channel::Socket(_) => None,
            Channel::Port(f) => Some(f),
            Channel::Pipes { rx, .. } => Some(rx),
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
    /// Background execs by id, running or ended and not yet dropped.
    background: BTreeMap<u64, Background>,
    standby: Option<Standby>,
    /// Reapers that reported their program's end and are still exiting (namespace teardown).
    exiting: Vec<(Pid, Option<OwnedFd>)>,
    configure: Option<ConfigureHook>,
    cgroups: Option<ExecCgroups>,
    /// The port relay ([`crate::ports`]), forked at the first [`Request::PortOpen`].
    ports: Option<crate::ports::Relay>,
    /// Directory watchers ([`Request::Watch`]); their inotify descriptor is polled while
    /// any exists.
    watches: crate::watch::Watches,
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

    /// An agent serving a pair of pipes (the gVisor tier: the container's stdin and stdout,
    /// which runsc connects to the host): bytes only, so execs use [`StdioMode::Framed`].
    pub fn over_pipes(cfg: AgentConfig, rx: File, tx: File) -> io::Result<Self> {
        Self::with_channel(cfg, Channel::Pipes { rx, tx })
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
            background: BTreeMap::new(),
            standby: None,
            exiting: Vec::new(),
            configure: None,
            cgroups: None,
            ports: None,
            watches: crate::watch::Watches::new(),
        })
    }

    /// Runs until the host closes the channel or asks to shut down.
    pub fn serve(mut self) -> Result<(), ProtoError> {
        crate::sys::note_relay_sender();
        self.send(
            &Reply::Hello {
                version: PROTOCOL_VERSION,
                agent: self.cfg.name.clone(),
            },
            b"",
        )?;
        // The bounding set is emptied once here, for every process the agent forks: each
        // program's own drop then costs one check instead of a call per capability. A
        // failure leaves it to each program, which drops it (or fails) as before.
        let _ = crate::sys::drop_bounding_set();
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
        pids.extend(
            std::mem::take(&mut self.background)
                .into_values()
                .filter_map(|bg| bg.run.map(|r| r.reaper)),
        );
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

    fn send(&mut self, reply: &Reply, body: &[u8]) -> Result<(), ProtoError> {
        let bytes = encode(reply, body)?;
        self.ctrl.write_all(&bytes)?;
        Ok(())
    }

    fn archive_reply(
        &mut self,
        result: Result<cordon_core::ArchiveReport, crate::files::FileError>,
    ) -> Result<(), ProtoError> {
        match result {
            Ok(report) => {
                let body = serde_json::to_vec(&report)
                    .map_err(|e| ProtoError::Malformed(format!("encoding a report: {e}")))?;
                self.send(&Reply::Archive, &body)
            }
            Err((code, msg)) => self.error(code, msg),
        }
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
        let watch_ready;
        let mut reaper_done = false;
        let mut exited_ready: Vec<usize> = Vec::new();
        let mut out_ready = [false; 2];
        let mut stdin_ready = false;
        let mut bg_watch: Vec<BgWatch> = Vec::new();
        let mut bg_ready: Vec<(u64, [bool; 2], bool, bool)> = Vec::new();
        {
            let mut fds = vec![PollFd::new(self.ctrl.as_fd(), PollFlags::POLLIN)];
            let mut idx_pid = None;
            let mut idx_out = [None, None];
            let mut idx_in = None;
            let mut exiting_idx = Vec::with_capacity(self.exiting.len());
            for (_, fd) in &self.exiting {
                exiting_idx.push(fd.as_ref().map(|fd| {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    fds.len() - 1
                }));
            }
            // Reapers without a pidfd are looked at again within this long.
            let unwatched = exiting_idx.iter().any(Option::is_none);
            if let Some(run) = &self.running {
                // The reaper's status line ends the exec; its pidfd, should it die first.
                idx_pid = Some(fds.len());
                fds.push(PollFd::new(run.status.as_fd(), PollFlags::POLLIN));
                if let Some(pidfd) = &run.pidfd {
                    fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
                }
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
            for (id, bg) in &self.background {
                let Some(run) = &bg.run else { continue };
                let mut w = BgWatch {
                    id: *id,
                    status: fds.len(),
                    pidfd: None,
                    out: [None, None],
                    stdin: None,
                };
                fds.push(PollFd::new(run.status.as_fd(), PollFlags::POLLIN));
                if let Some(pidfd) = &run.pidfd {
                    w.pidfd = Some(fds.len());
                    fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
                }
                if let Some(fr) = &run.framed {
                    for (i, f) in [&fr.stdout, &fr.stderr].into_iter().enumerate() {
                        // A held stream that holds all it may waits for the host's read.
                        if let Some(f) = f
                            && !bg.out[i].full()
                        {
                            w.out[i] = Some(fds.len());
                            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                        }
                    }
                    if let Some(wr) = &fr.stdin
                        && (!fr.stdin_buf.is_empty() || fr.stdin_close)
                    {
                        w.stdin = Some(fds.len());
                        fds.push(PollFd::new(wr.as_fd(), PollFlags::POLLOUT));
                    }
                }
                bg_watch.push(w);
            }
            let idx_watch = self.watches.fd().map(|fd| {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                fds.len() - 1
            });
            let wait = if unwatched {
                PollTimeout::from(50u8)
            } else {
                PollTimeout::NONE
            };
            match poll(&mut fds, wait) {
                Ok(_) => {}
                Err(Errno::EINTR) => return Ok(false),
                Err(e) => return Err(io::Error::from(e).into()),
            }
            let hit = |i: usize| {
                fds.get(i)
                    .is_some_and(|f| f.revents().is_some_and(|r| !r.is_empty()))
            };
            ctrl_ready = hit(0);
            watch_ready = idx_watch.is_some_and(hit);
            for (k, idx) in exiting_idx.iter().enumerate() {
                let gone = match idx {
                    Some(i) => hit(*i),
                    // No pidfd: ask without waiting.
                    None => matches!(
                        waitpid(self.exiting[k].0, Some(WaitPidFlag::WNOHANG)),
                        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_)
                    ),
                };
                if gone {
                    exited_ready.push(k);
                }
            }
            if let Some(i) = idx_pid {
                let has_pidfd = self.running.as_ref().is_some_and(|r| r.pidfd.is_some());
                reaper_done = hit(i) || (has_pidfd && hit(i + 1));
            }
            for k in 0..2 {
                if let Some(i) = idx_out[k] {
                    out_ready[k] = hit(i);
                }
            }
            if let Some(i) = idx_in {
                stdin_ready = hit(i);
            }
            for w in &bg_watch {
                let out = w.out.map(|i| i.is_some_and(hit));
                let stdin = w.stdin.is_some_and(hit);
                let done = hit(w.status) || w.pidfd.is_some_and(hit);
                if out.iter().any(|x| *x) || stdin || done {
                    bg_ready.push((w.id, out, stdin, done));
                }
            }
        }
        for (id, out, stdin, done) in bg_ready {
            for (k, ready) in out.into_iter().enumerate() {
                if ready {
                    self.relay_background(id, k);
                }
            }
            if stdin {
                self.feed_background(id);
            }
            if done
                && self
                    .background
                    .get_mut(&id)
                    .and_then(|bg| bg.run.as_mut())
                    .is_some_and(Running::status_complete)
            {
                self.finish_background(id);
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
        if watch_ready {
            self.watches.pump(&self.work);
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

    /// Hands a connection to the port relay, forking it first (again, if it died).
    fn hand_port(&mut self, port: u16, conn: &OwnedFd) -> io::Result<()> {
        if let Some(r) = &self.ports
            && r.hand(port, conn).is_ok()
        {
            return Ok(());
        }
        let relay = crate::ports::Relay::spawn()?;
        let r = relay.hand(port, conn);
        self.ports = Some(relay);
        r
    }

    /// Reads what the host sent, with any descriptors attached; false on close.
    fn read_ctrl(&mut self) -> Result<bool, ProtoError> {
        let mut buf = vec![0u8; 64 * 1024];
        if let Some(port) = self.ctrl.bytes_in() {
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
        let fd = self.ctrl.as_fd().as_raw_fd();
        let (n, fds) = match recv_with_fds(fd, &mut buf, MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(r) => r,
            Err(Errno::EINTR | Errno::EAGAIN) => return Ok(true),
            Err(e) => return Err(io::Error::from(e).into()),
        };
        self.fds.extend(fds);
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
                match self.launch(id, &argv, &env, &cwd, stdio, &limits, None, None) {
                    Ok(mut run) => {
                        run.last = last;
                        self.running = Some(run);
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
            Request::BgExec {
                id,
                argv,
                env,
                cwd,
                limits,
                pty,
                stdio,
                user,
                hold,
            } => {
                // Descriptors sent along are the program's own only when it says so.
                if stdio != StdioMode::Passed {
                    self.fds.clear();
                }
                let started = match user.as_ref().map(check_user) {
                    Some(Err(m)) => Err((ErrorCode::BadRequest, m)),
                    _ => self.start_background(
                        id,
                        &argv,
                        &env,
                        &cwd,
                        &limits,
                        (pty, stdio, hold),
                        user,
                    ),
                };
                // Whatever the start made of them, none is left for a later request.
                self.fds.clear();
                match started {
                    Ok(()) => {
                        self.send(&Reply::Started { id }, b"")?;
                        // The next exec's reaper gets ready while the host reads the reply.
                        if self.standby.is_none() {
                            self.standby = self.spawn_standby().ok();
                        }
                    }
                    Err((code, msg)) => self.error(code, msg)?,
                }
            }
            Request::BgRead {
                id,
                stdout_from,
                stderr_from,
                max,
            } => self.read_background(id, [stdout_from, stderr_from], max)?,
            Request::BgStdin { id } => self.write_background(id, frame.body)?,
            Request::BgSignal { id, signal } => self.signal_background(id, signal)?,
            Request::BgRaise { id, signal, all } => self.raise_background(id, signal, all)?,
            Request::BgResize { id, size } => self.resize_background(id, size)?,
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
            Request::FileOp { op } => match self.work.op(&op) {
                Ok(reply) => {
                    let body = serde_json::to_vec(&reply)
                        .map_err(|e| ProtoError::Malformed(format!("encoding a reply: {e}")))?;
                    self.send(&Reply::Files, &body)?
                }
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::PutArchive { path, budget } => {
                let (result, drained) = {
                    let mut rd = files::UploadReader::new(&mut self.ctrl, &mut self.inbuf);
                    let r = self.work.unpack(&path, &mut rd, budget);
                    (r, rd.drain())
                };
                // A channel that broke, or a host that sent something else mid-upload.
                drained?;
                self.archive_reply(result)?;
            }
            Request::GetArchive { path, max } => {
                let (result, flushed) = {
                    let mut w = files::DownloadWriter::new(&mut self.ctrl);
                    let r = self.work.pack(&path, max, &mut w);
                    let f = w.flush_all();
                    (r, f)
                };
                flushed?;
                self.archive_reply(result)?;
            }
            Request::ArchiveData => self.error(
                ErrorCode::BadRequest,
                "archive data outside an upload; send put_archive first",
            )?,
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
                        let features = vec![
                            crate::proto::FEATURE_FILES.to_string(),
                            crate::proto::FEATURE_WATCH.to_string(),
                        ];
                        self.send(&Reply::Configured { features }, b"")?
                    }
                    Err(e) => self.error(ErrorCode::BadRequest, format!("configure: {e}"))?,
                }
            }
            Request::PortOpen { port } => {
                let conn = self.fds.pop_front();
                self.fds.clear();
                match conn.map(|c| self.hand_port(port, &c)) {
                    Some(Ok(())) => self.send(&Reply::Ok, b"")?,
                    Some(Err(e)) => self.error(
                        ErrorCode::Io,
                        format!("the port relay cannot take the connection: {e}"),
                    )?,
                    None => self.error(
                        ErrorCode::BadRequest,
                        "no connection came with the port request",
                    )?,
                }
            }
            Request::PortDial { port, socket } => match crate::ports::dial(&socket) {
                Ok(conn) => match self.hand_port(port, &conn) {
                    Ok(()) => self.send(&Reply::Ok, b"")?,
                    Err(e) => self.error(
                        ErrorCode::Io,
                        format!("the port relay cannot take the connection: {e}"),
                    )?,
                },
                Err(e) => self.error(ErrorCode::BadRequest, e)?,
            },
            Request::Watch { op } => match self.watches.handle(&self.work, &op) {
                Ok(reply) => {
                    let body = serde_json::to_vec(&reply)
                        .map_err(|e| ProtoError::Malformed(format!("encoding a reply: {e}")))?;
                    self.send(&Reply::Watch, &body)?
                }
                Err((code, msg)) => self.error(code, msg)?,
            },
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
}
