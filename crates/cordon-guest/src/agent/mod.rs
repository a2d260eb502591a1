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
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::fdpass::recv_with_fds;
use crate::files::Workspace;
use crate::proto::{ErrorCode, Frame, FrameBuffer, PROTOCOL_VERSION, ProtoError, Reply, Request};

mod background;
mod child;
mod exec;
mod files;
mod ring;
mod state;

pub use state::{Agent, AgentConfig, ConfigureHook, Confine, STANDBY_IDLE, Settings};
use state::{Channel, ExecCgroups, FramedIo, Running};

/// One round's poll set, and where each descriptor is in it.
#[derive(Default)]
struct Round<'a> {
    fds: Vec<PollFd<'a>>,
    /// Each exiting reaper's pidfd, where it has one.
    exiting: Vec<Option<usize>>,
    /// The running exec's status pipe, its reaper's pidfd, its output and its stdin.
    status: Option<usize>,
    pidfd: Option<usize>,
    out: [Option<usize>; 2],
    stdin: Option<usize>,
    background: Vec<BgWatch>,
    /// The directory watchers' inotify descriptor.
    watch: Option<usize>,
}

impl<'a> Round<'a> {
    fn add(&mut self, fd: BorrowedFd<'a>, flags: PollFlags) -> usize {
        self.fds.push(PollFd::new(fd, flags));
        self.fds.len() - 1
    }

    /// An exec's framed output streams (those `wanted`: 0 stdout, 1 stderr) and its stdin,
    /// when there is something to write to it.
    fn add_framed(
        &mut self,
        fr: &'a FramedIo,
        wanted: impl Fn(usize) -> bool,
    ) -> ([Option<usize>; 2], Option<usize>) {
        let mut out = [None, None];
        for (i, f) in [&fr.stdout, &fr.stderr].into_iter().enumerate() {
            if let Some(f) = f
                && wanted(i)
            {
                out[i] = Some(self.add(f.as_fd(), PollFlags::POLLIN));
            }
        }
        let stdin = match &fr.stdin {
            Some(w) if !fr.stdin_buf.is_empty() || fr.stdin_close => {
                Some(self.add(w.as_fd(), PollFlags::POLLOUT))
            }
            _ => None,
        };
        (out, stdin)
    }

    /// Whether the poll found descriptor `i` ready (or ended).
    fn hit(&self, i: usize) -> bool {
        self.fds
            .get(i)
            .is_some_and(|f| f.revents().is_some_and(|r| !r.is_empty()))
    }

    fn hit_at(&self, i: Option<usize>) -> bool {
        i.is_some_and(|i| self.hit(i))
    }
}

/// Where a background exec's descriptors are in one round's poll set.
struct BgWatch {
    id: u64,
    status: usize,
    pidfd: Option<usize>,
    out: [Option<usize>; 2],
    stdin: Option<usize>,
}

/// What one round found ready.
struct Ready {
    /// The host sent something.
    ctrl: bool,
    watch: bool,
    /// The running exec's reaper reported or died.
    reaper_done: bool,
    /// Indices of [`Agent`]'s exiting reapers that are gone.
    exited: Vec<usize>,
    out: [bool; 2],
    stdin: bool,
    background: Vec<BgReady>,
}

/// What of a background exec is ready: its output streams, its stdin, its end.
struct BgReady {
    id: u64,
    out: [bool; 2],
    stdin: bool,
    done: bool,
}

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
            exec_seen: std::time::Instant::now(),
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
        // The bounding set is emptied once here, for every process the agent forks: each
        // program's own drop then costs one check instead of a call per capability. A
        // failure leaves it to each program, which drops it (or fails) as before.
        let _ = crate::sys::drop_bounding_set();
        // The first exec's reaper is forked before the hello: its set-up (its namespaces'
        // `/proc`, the confinement, its program's fork) then runs beside the hello's round
        // trip and the host's own steps before its first request, instead of after the
        // agent has read that request. A failure here is retried (and reported) when an
        // exec asks for it.
        self.standby = self.spawn_standby().ok();
        self.send(
            &Reply::Hello {
                version: PROTOCOL_VERSION,
                agent: self.cfg.name.clone(),
            },
            b"",
        )?;
        loop {
            if self.poll_once()? {
                self.end_children();
                return Ok(());
            }
        }
    }

    /// How long the event loop may wait before the standby's idle time is up (forever with
    /// no standby, or none let go).
    fn standby_wait(&self) -> PollTimeout {
        match (&self.standby, self.cfg.standby_idle) {
            (Some(_), Some(idle)) => {
                let left = idle.saturating_sub(self.exec_seen.elapsed());
                // At least a millisecond, at most what a poll takes (it waits again).
                let ms = left.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
                PollTimeout::from(ms)
            }
            _ => PollTimeout::NONE,
        }
    }

    /// Lets the standby go once no exec has started or ended for
    /// [`AgentConfig::standby_idle`]: its closed job socket tells the reaper to exit, and the
    /// program it forked ahead goes with its namespace. It is reaped as the reapers that
    /// reported are (`exiting`).
    fn retire_idle_standby(&mut self) {
        let Some(idle) = self.cfg.standby_idle else {
            return;
        };
        if self.exec_seen.elapsed() < idle {
            return;
        }
        if let Some(sb) = self.standby.take() {
            self.exiting.push((sb.pid, sb.pidfd));
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

    /// One round of the event loop; true when the agent should stop.
    fn poll_once(&mut self) -> Result<bool, ProtoError> {
        // The wait below ends when the standby's idle time is up; it goes here.
        self.retire_idle_standby();
        let Some(ready) = self.wait()? else {
            return Ok(false);
        };
        self.serve_background(ready.background);
        self.serve_foreground(ready.out, ready.stdin)?;
        for k in ready.exited.into_iter().rev() {
            let (pid, _) = self.exiting.swap_remove(k);
            let _ = waitpid(pid, None);
        }
        if ready.reaper_done && self.status_complete() {
            self.finish_exec()?;
        }
        if ready.watch {
            self.watches.pump(&self.work);
        }
        if ready.ctrl {
            return self.serve_ctrl();
        }
        Ok(false)
    }

    /// Waits for anything the agent watches to be ready; `None` when a signal cut the wait
    /// short.
    fn wait(&self) -> Result<Option<Ready>, ProtoError> {
        let mut round = self.round();
        // Reapers without a pidfd are looked at again within this long.
        let wait = if round.exiting.iter().any(Option::is_none) {
            PollTimeout::from(50u8)
        } else {
            self.standby_wait()
        };
        match poll(&mut round.fds, wait) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(None),
            Err(e) => return Err(io::Error::from(e).into()),
        }
        Ok(Some(self.ready(&round)))
    }

    /// The poll set of one round: the host channel, exiting reapers, the running exec and
    /// each background one, the directory watchers.
    fn round(&self) -> Round<'_> {
        let mut r = Round::default();
        r.add(self.ctrl.as_fd(), PollFlags::POLLIN);
        for (_, fd) in &self.exiting {
            let i = fd.as_ref().map(|fd| r.add(fd.as_fd(), PollFlags::POLLIN));
            r.exiting.push(i);
        }
        if let Some(run) = &self.running {
            // The reaper's status line ends the exec; its pidfd, should it die first.
            r.status = Some(r.add(run.status.as_fd(), PollFlags::POLLIN));
            r.pidfd = run
                .pidfd
                .as_ref()
                .map(|fd| r.add(fd.as_fd(), PollFlags::POLLIN));
            if let Some(fr) = &run.framed {
                (r.out, r.stdin) = r.add_framed(fr, |_| true);
            }
        }
        for (id, bg) in &self.background {
            let Some(run) = &bg.run else { continue };
            let status = r.add(run.status.as_fd(), PollFlags::POLLIN);
            let pidfd = run
                .pidfd
                .as_ref()
                .map(|fd| r.add(fd.as_fd(), PollFlags::POLLIN));
            // A held stream that holds all it may waits for the host's read.
            let (out, stdin) = match &run.framed {
                Some(fr) => r.add_framed(fr, |i| !bg.out[i].full()),
                None => ([None, None], None),
            };
            r.background.push(BgWatch {
                id: *id,
                status,
                pidfd,
                out,
                stdin,
            });
        }
        r.watch = self.watches.fd().map(|fd| r.add(fd, PollFlags::POLLIN));
        r
    }

    /// What a polled round found ready.
    fn ready(&self, r: &Round) -> Ready {
        let exited = r
            .exiting
            .iter()
            .enumerate()
            .filter(|(k, idx)| match idx {
                Some(i) => r.hit(*i),
                // No pidfd: ask without waiting.
                None => matches!(
                    waitpid(self.exiting[*k].0, Some(WaitPidFlag::WNOHANG)),
                    Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_)
                ),
            })
            .map(|(k, _)| k)
            .collect();
        let background = r
            .background
            .iter()
            .filter_map(|w| {
                let ready = BgReady {
                    id: w.id,
                    out: w.out.map(|i| r.hit_at(i)),
                    stdin: r.hit_at(w.stdin),
                    done: r.hit(w.status) || r.hit_at(w.pidfd),
                };
                (ready.out.iter().any(|x| *x) || ready.stdin || ready.done).then_some(ready)
            })
            .collect();
        Ready {
            ctrl: r.hit(0),
            watch: r.hit_at(r.watch),
            reaper_done: r.hit_at(r.status) || r.hit_at(r.pidfd),
            exited,
            out: r.out.map(|i| r.hit_at(i)),
            stdin: r.hit_at(r.stdin),
            background,
        }
    }

    /// Background execs' output into their rings, their stdin fed, their ends taken.
    fn serve_background(&mut self, ready: Vec<BgReady>) {
        for bg in ready {
            for (k, ready) in bg.out.into_iter().enumerate() {
                if ready {
                    self.relay_background(bg.id, k);
                }
            }
            if bg.stdin {
                self.feed_background(bg.id);
            }
            if bg.done
                && self
                    .background
                    .get_mut(&bg.id)
                    .and_then(|b| b.run.as_mut())
                    .is_some_and(Running::status_complete)
            {
                self.finish_background(bg.id);
            }
        }
    }

    /// The running exec's output to the host, and its stdin fed.
    fn serve_foreground(&mut self, out: [bool; 2], stdin: bool) -> Result<(), ProtoError> {
        for (k, ready) in out.into_iter().enumerate() {
            if ready {
                self.relay_output(k)?;
            }
        }
        if stdin {
            self.feed_stdin();
        }
        Ok(())
    }

    /// Reads what the host sent and answers each whole request; true when the agent should
    /// stop.
    fn serve_ctrl(&mut self) -> Result<bool, ProtoError> {
        if !self.read_ctrl()? {
            return Ok(true);
        }
        while let Some(frame) = self.inbuf.next_frame::<Request>()? {
            if self.handle(frame)? {
                return Ok(true);
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

    /// Answers one request; true when the agent should stop.
    fn handle(&mut self, frame: Frame<Request>) -> Result<bool, ProtoError> {
        match frame.header {
            Request::Hello { version } => self.hello(version)?,
            Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdio,
                limits,
                last,
            } => {
                let launched = self.launch_foreground(exec::Launch {
                    id,
                    argv,
                    env,
                    cwd,
                    stdio,
                    limits,
                    pty: None,
                    user: None,
                    last,
                });
                self.foreground_started(id, last, launched)?
            }
            Request::Stdin { id } => self.foreground_stdin(id, frame.body),
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
                let launch = exec::Launch {
                    id,
                    argv,
                    env,
                    cwd,
                    stdio,
                    limits,
                    pty,
                    user,
                    last: false,
                };
                let started = self.start_background(launch, hold);
                self.background_started(id, started)?
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
            Request::PutFile { path, mode } => match self.put_file(&path, mode, &frame.body) {
                Ok(()) => self.send(&Reply::Ok, b"")?,
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::GetFile { path, max } => match self.get_file(&path, max) {
                Ok((data, truncated)) => self.send(&Reply::File { truncated }, &data)?,
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::FileOp { op } => match self.file_op(&op) {
                Ok(reply) => {
                    let body = serde_json::to_vec(&reply)
                        .map_err(|e| ProtoError::Malformed(format!("encoding a reply: {e}")))?;
                    self.send(&Reply::Files, &body)?
                }
                Err((code, msg)) => self.error(code, msg)?,
            },
            Request::PutArchive { path, budget } => self.put_archive(&path, budget)?,
            Request::GetArchive { path, max } => self.get_archive(&path, max)?,
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
                self.configure(&settings, &frame.body)?
            }
            Request::PortOpen { port } => self.port_open(port)?,
            Request::PortDial { port, socket } => self.port_dial(port, &socket)?,
            Request::Watch { op } => self.watch(&op)?,
            Request::Shutdown => {
                self.shutdown()?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Answers [`Request::Hello`]: the host must speak this agent's protocol.
    fn hello(&mut self, version: u32) -> Result<(), ProtoError> {
        if version != PROTOCOL_VERSION {
            self.error(
                ErrorCode::VersionMismatch,
                format!("agent speaks protocol {PROTOCOL_VERSION}, host {version}"),
            )
        } else {
            self.send(&Reply::Ok, b"")
        }
    }

    /// Answers [`Request::PutArchive`]: the upload's tar stream, read from the frames that
    /// follow, unpacked within `budget`.
    fn put_archive(&mut self, path: &str, budget: u64) -> Result<(), ProtoError> {
        let (result, drained) = {
            let mut rd = files::UploadReader::new(&mut self.ctrl, &mut self.inbuf);
            let r = self.work.unpack(path, &mut rd, budget);
            (r, rd.drain())
        };
        // A channel that broke, or a host that sent something else mid-upload.
        drained?;
        self.archive_reply(result)
    }

    /// Answers [`Request::GetArchive`]: `path` packed as frames of a download.
    fn get_archive(&mut self, path: &str, max: u64) -> Result<(), ProtoError> {
        let (result, flushed) = {
            let mut w = files::DownloadWriter::new(&mut self.ctrl);
            let r = self.work.pack(path, max, &mut w);
            let f = w.flush_all();
            (r, f)
        };
        flushed?;
        self.archive_reply(result)
    }

    /// Answers [`Request::Configure`]: the tier's hook applies `settings` (with the host's
    /// random seed), and per-exec cgroups take their limits.
    fn configure(&mut self, settings: &Settings, seed: &[u8]) -> Result<(), ProtoError> {
        let result = match self.configure.as_mut() {
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this agent takes no configuration",
            )),
            Some(hook) => hook(settings, seed),
        };
        match result {
            Ok(()) => {
                if let Some(cg) = self.cgroups.as_mut() {
                    cg.memory_bytes = settings.memory_bytes;
                    cg.pids = settings.pids;
                }
                let features = vec![
                    crate::proto::FEATURE_FILES.to_string(),
                    crate::proto::FEATURE_WATCH.to_string(),
                ];
                self.send(&Reply::Configured { features }, b"")
            }
            Err(e) => self.error(ErrorCode::BadRequest, format!("configure: {e}")),
        }
    }

    /// Answers [`Request::PortOpen`]: the connection that came with it goes to the relay.
    fn port_open(&mut self, port: u16) -> Result<(), ProtoError> {
        let conn = self.fds.pop_front();
        self.fds.clear();
        match conn.map(|c| self.hand_port(port, &c)) {
            Some(Ok(())) => self.send(&Reply::Ok, b""),
            Some(Err(e)) => self.error(
                ErrorCode::Io,
                format!("the port relay cannot take the connection: {e}"),
            ),
            None => self.error(
                ErrorCode::BadRequest,
                "no connection came with the port request",
            ),
        }
    }

    /// Answers [`Request::PortDial`]: the agent dials `socket` and hands the relay the
    /// connection.
    fn port_dial(&mut self, port: u16, socket: &str) -> Result<(), ProtoError> {
        match crate::ports::dial(socket) {
            Ok(conn) => match self.hand_port(port, &conn) {
                Ok(()) => self.send(&Reply::Ok, b""),
                Err(e) => self.error(
                    ErrorCode::Io,
                    format!("the port relay cannot take the connection: {e}"),
                ),
            },
            Err(e) => self.error(ErrorCode::BadRequest, e),
        }
    }

    /// Answers [`Request::Watch`].
    fn watch(&mut self, op: &cordon_core::WatchOp) -> Result<(), ProtoError> {
        match self.watches.handle(&self.work, op) {
            Ok(reply) => {
                let body = serde_json::to_vec(&reply)
                    .map_err(|e| ProtoError::Malformed(format!("encoding a reply: {e}")))?;
                self.send(&Reply::Watch, &body)
            }
            Err((code, msg)) => self.error(code, msg),
        }
    }

    /// Answers [`Request::Shutdown`]: the running exec is killed (its tree with it).
    fn shutdown(&mut self) -> Result<(), ProtoError> {
        if let Some(run) = &self.running {
            let _ = kill(run.reaper, Signal::SIGKILL);
        }
        self.send(&Reply::Ok, b"")
    }
}
