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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
use crate::proto::{
    ErrorCode, Frame, FrameBuffer, PROTOCOL_VERSION, ProtoError, Reply, Request, StdioMode,
};

mod background;
mod child;
mod exec;
mod files;
mod ring;
mod state;

pub use state::{Agent, AgentConfig, ConfigureHook, Confine, STANDBY_IDLE, Settings};
use state::{Channel, ExecCgroups, MAX_STDIN_BUFFER, Running};

/// Where a background exec's descriptors are in one round's poll set.
struct BgWatch {
    id: u64,
    status: usize,
    pidfd: Option<usize>,
    out: [Option<usize>; 2],
    stdin: Option<usize>,
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
                self.standby_wait()
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
