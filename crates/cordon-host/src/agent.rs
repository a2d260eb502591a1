//! The host's end of the agent channel, shared by every tier whose agent speaks the framed
//! protocol (container over a socket that also carries the program's stdio as passed
//! descriptors, microvm over a virtio-serial socket, gvisor over the container's stdin and
//! stdout), written for a hostile agent: every call has one deadline
//! covering all of its writes and reads (an agent that stops reading cannot hold a call past
//! it), every frame is checked against the largest one the call can need before a byte of
//! its body is buffered, and decoding costs the same per frame however small the frames are
//! (the buffer is consumed by an offset and compacted only when half is spent).
//!
//! [`argv_for`] and [`file_error`] are what every tier that drives the agent (container
//! too) needs of the protocol on the host.
//!
//! [`run_framed`] drives one exec over such a channel: the request and its stdin by the
//! exec's deadline, output relayed to the sink within the caps (as frames, or read from
//! pipes whose other ends went to the agent with the request), the tier's own reasons to
//! stop checked as it runs, and a kill whose answer is bounded.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use cordon_core::{
    Command, Error, Evidence, ExecRequest, ExitReport, Language, OutputSink, OutputStream,
    Termination, Tier,
};
use cordon_guest::proto::{self, ErrorCode, Frame, ProtoError, Reply, Request, StdioMode, Stream};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

/// Bytes a frame may carry beyond the payload a call asked for (its JSON header).
pub const HEADER_ROOM: usize = 64 << 10;
/// What one read takes from the socket at most.
const READ_CHUNK: usize = 256 << 10;
/// What a read takes when nothing says more is coming: a reply's frame is a few hundred
/// bytes, and every byte a read may take is zeroed first (the whole 256 KiB chunk was: 64
/// page faults and a 256 KiB memset for a 169-byte reply, on every `cordon run`'s path).
const SMALL_READ: usize = 16 << 10;

/// Why a call on the agent channel failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the guest agent did not take or answer the request in time")]
    Timeout,
    #[error("the agent channel closed")]
    Closed,
    #[error("agent channel I/O: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Proto(#[from] ProtoError),
}

/// What one wait for input found.
#[derive(Debug, PartialEq, Eq)]
pub enum Filled {
    /// New bytes were buffered.
    Data,
    /// Nothing arrived within the wait.
    Nothing,
    /// The guest closed the channel.
    Eof,
}

/// The agent channel: what is read from and written to (one socket, or two pipes), both
/// non-blocking, and the bytes received but not yet decoded.
pub struct AgentConn {
    rx: File,
    /// Where writes go when it is not `rx` (two pipes). A socket is both ends on one
    /// descriptor: a live sandbox holds no second one in the server (issue 49).
    tx: Option<File>,
    buf: Vec<u8>,
    /// Where the undecoded bytes start in `buf`.
    start: usize,
    /// What the next read may take when no frame being received says how much it lacks:
    /// doubled after a read that filled all it asked for (more is waiting), back to
    /// [`SMALL_READ`] after one that did not.
    next_read: usize,
}

impl AgentConn {
    /// A channel over one stream socket, read and written on its one descriptor.
    pub fn new(sock: UnixStream) -> io::Result<Self> {
        Self::over(OwnedFd::from(sock), None)
    }

    /// A channel over a pair of descriptors: `rx` is read, `tx` written (a child's stdout
    /// and stdin).
    pub fn pipes(rx: OwnedFd, tx: OwnedFd) -> io::Result<Self> {
        Self::over(rx, Some(tx))
    }

    fn over(rx: OwnedFd, tx: Option<OwnedFd>) -> io::Result<Self> {
        for fd in std::iter::once(&rx).chain(tx.as_ref()) {
            let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
            fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        }
        Ok(AgentConn {
            rx: File::from(rx),
            tx: tx.map(File::from),
            buf: Vec::new(),
            start: 0,
            next_read: SMALL_READ,
        })
    }

    /// What writes go to.
    fn tx(&self) -> &File {
        self.tx.as_ref().unwrap_or(&self.rx)
    }

    /// Raw bytes, bypassing the encoder (tests of the guest's checks), by `deadline`.
    pub fn send_raw(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), CallError> {
        let mut sent = 0;
        while sent < bytes.len() {
            match self.tx().write(&bytes[sent..]) {
                Ok(0) => return Err(CallError::Closed),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(PollFlags::POLLOUT, deadline)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Sends one frame; the whole of it must be taken by `deadline`.
    pub fn send(
        &mut self,
        header: &Request,
        body: &[u8],
        deadline: Instant,
    ) -> Result<(), CallError> {
        let bytes = proto::encode(header, body)?;
        self.send_raw(&bytes, deadline)
    }

    /// Sends one frame with descriptors attached to its first byte (`SCM_RIGHTS`; the
    /// channel must be a socket); the whole of it must be taken by `deadline`.
    pub fn send_with_fds(
        &mut self,
        header: &Request,
        body: &[u8],
        fds: &[std::os::fd::RawFd],
        deadline: Instant,
    ) -> Result<(), CallError> {
        let bytes = proto::encode(header, body)?;
        let sent = loop {
            let iov = [io::IoSlice::new(&bytes)];
            let cmsg = [ControlMessage::ScmRights(fds)];
            match sendmsg::<()>(self.tx().as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => self.wait(PollFlags::POLLOUT, deadline)?,
                Err(e) => return Err(io::Error::from(e).into()),
            }
        };
        self.send_raw(&bytes[sent..], deadline)
    }

    /// The next frame, whole by `deadline`; a frame longer than `max_frame` bytes is refused
    /// as soon as its length arrives.
    pub fn recv(&mut self, deadline: Instant, max_frame: usize) -> Result<Frame<Reply>, CallError> {
        loop {
            if let Some(f) = self.next_frame(max_frame)? {
                return Ok(f);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CallError::Timeout);
            }
            match self.fill(deadline - now)? {
                Filled::Eof => return Err(CallError::Closed),
                Filled::Data | Filled::Nothing => {}
            }
        }
    }

    /// Waits up to `wait` for input and buffers what arrived (one read).
    pub fn fill(&mut self, wait: Duration) -> Result<Filled, CallError> {
        let now = self.take_ready()?;
        if now != Filled::Nothing {
            return Ok(now);
        }
        let ms = wait.as_millis().clamp(1, u16::MAX as u128) as u16;
        let mut fds = [PollFd::new(self.rx.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(Filled::Nothing),
            Ok(_) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        self.take_ready()
    }

    /// Buffers what has already arrived, without waiting (one read).
    fn take_ready(&mut self) -> Result<Filled, CallError> {
        match self.read_some() {
            Ok(f) => Ok(f),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(Filled::Nothing)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn read_some(&mut self) -> io::Result<Filled> {
        // Spent bytes are dropped only when they are at least half of the buffer: each byte
        // is moved at most once on average, whatever the frame sizes.
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        let ask = self.read_len();
        self.buf.resize(len + ask, 0);
        let r = self.rx.read(&mut self.buf[len..]);
        let got = *r.as_ref().unwrap_or(&0);
        self.buf.truncate(len + got);
        self.next_read = if got == ask {
            (ask * 2).min(READ_CHUNK)
        } else {
            SMALL_READ
        };
        match r? {
            0 => Ok(Filled::Eof),
            _ => Ok(Filled::Data),
        }
    }

    /// How much the next read asks for: what the frame being received still lacks, or
    /// [`Self::next_read`], whichever is more, within [`SMALL_READ`]..=[`READ_CHUNK`].
    fn read_len(&self) -> usize {
        let rest = &self.buf[self.start..];
        let lacks = match rest.get(..4) {
            Some(&[a, b, c, d]) => proto::check_total([a, b, c, d])
                .map(|total| (total + 4).saturating_sub(rest.len()))
                .unwrap_or(0),
            _ => 0,
        };
        lacks.max(self.next_read).clamp(SMALL_READ, READ_CHUNK)
    }

    /// Decodes the next whole frame from what is buffered.
    pub fn next_frame(&mut self, max_frame: usize) -> Result<Option<Frame<Reply>>, ProtoError> {
        let rest = &self.buf[self.start..];
        if rest.len() < 4 {
            return Ok(None);
        }
        let total = proto::check_total([rest[0], rest[1], rest[2], rest[3]])?;
        if total > max_frame {
            return Err(ProtoError::Malformed(format!(
                "a frame of {total} bytes where at most {max_frame} fit"
            )));
        }
        if rest.len() < 4 + total {
            return Ok(None);
        }
        let payload = rest[4..4 + total].to_vec();
        self.start += 4 + total;
        proto::decode_payload(payload).map(Some)
    }

    /// Drops every byte buffered and not yet decoded (a channel being closed).
    pub fn discard(&mut self) {
        self.buf.clear();
        self.start = 0;
    }

    /// Bytes buffered and not yet decoded, and the buffer's size (tests).
    pub fn buffered(&self) -> (usize, usize) {
        (self.buf.len() - self.start, self.buf.capacity())
    }

    fn wait(&self, events: PollFlags, deadline: Instant) -> Result<(), CallError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(CallError::Timeout);
        }
        let ms = (deadline - now).as_millis().clamp(1, u16::MAX as u128) as u16;
        let fd = if events.contains(PollFlags::POLLOUT) {
            self.tx().as_fd()
        } else {
            self.rx.as_fd()
        };
        let mut fds = [PollFd::new(fd, events)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(io::Error::from(e).into()),
        }
    }
}

/// The argv that runs a request inside a Linux userland: languages through their
/// interpreters, argv as given. `node` says whether this tier's userland has JavaScript.
pub fn argv_for(req: &ExecRequest, tier: Tier, node: bool) -> cordon_core::Result<Vec<String>> {
    Ok(match &req.command {
        Command::Argv(v) => {
            if v.is_empty() {
                return Err(Error::Invalid(
                    "empty command; give a program to run".into(),
                ));
            }
            v.clone()
        }
        Command::Code {
            language,
            source,
            args,
        } => {
            let mut v: Vec<String> = match language {
                Language::Python => vec!["python3".into(), "-c".into(), source.clone()],
                Language::Bash => vec!["bash".into(), "-c".into(), source.clone(), "bash".into()],
                Language::Sh => vec!["sh".into(), "-c".into(), source.clone(), "sh".into()],
                Language::Javascript if node => vec!["node".into(), "-e".into(), source.clone()],
                Language::Javascript => {
                    return Err(cordon_core::Rejected::TierLanguage {
                        tier,
                        language: Language::Javascript,
                        fix: "its root has no JavaScript runtime (node); use --tier wasm for \
                              JavaScript",
                    }
                    .into());
                }
            };
            v.extend(args.iter().cloned());
            v
        }
        Command::Wasm { .. } => {
            return Err(cordon_core::Feature::WasmModules.unsupported(tier, "a WebAssembly module"));
        }
    })
}

/// What the agent needs to start a program, as a tier builds it from an exec request.
#[derive(Debug, Clone)]
pub struct ExecParts {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: String,
    pub limits: proto::ProcLimits,
    /// The request's pseudo-terminal (background execs only).
    pub pty: Option<cordon_core::PtySize>,
}

impl ExecParts {
    /// An exec's parts as every agent tier builds them: a template without the exec's
    /// interpreter refuses it here (foreground or background alike), the argv for `tier`
    /// (`node`: see [`argv_for`]), the environment the tier made, `/work` unless the request
    /// names a directory, and the per-process limits the tier chose.
    pub fn new(
        req: &ExecRequest,
        spec: &cordon_core::SandboxSpec,
        (tier, node): (Tier, bool),
        env: std::collections::BTreeMap<String, String>,
        limits: proto::ProcLimits,
    ) -> cordon_core::Result<Self> {
        if let (Command::Code { language, .. }, Some(t)) = (&req.command, &spec.resolved_template) {
            t.check_language(*language)?;
        }
        Ok(ExecParts {
            argv: argv_for(req, tier, node)?,
            env,
            cwd: req.cwd.clone().unwrap_or_else(|| "/work".to_string()),
            limits,
            pty: req.pty,
        })
    }

    /// The per-process limits of a tier whose workspace has a size limit of its own: open
    /// files, and a file-size limit as a second layer only (the workspace answers ENOSPC
    /// first).
    pub fn workspace_limits(l: &cordon_core::Limits) -> proto::ProcLimits {
        proto::ProcLimits {
            open_files: l.open_files,
            file_size: l.disk_bytes.max(l.tmp_bytes) + (1 << 20),
            address_space: 0,
            processes: 0,
        }
    }

    /// The [`Request::BgExec`] that starts it in the background as exec `id`.
    pub fn background(self, id: u64) -> Request {
        self.background_with(id, StdioMode::Framed)
    }

    /// [`ExecParts::background`] with its stdio `stdio` ([`StdioMode::Passed`]: the
    /// host's descriptors go with the request).
    pub fn background_with(self, id: u64, stdio: StdioMode) -> Request {
        Request::BgExec {
            id,
            argv: self.argv,
            env: self.env,
            cwd: self.cwd,
            limits: self.limits,
            pty: self.pty,
            stdio,
            user: None,
            hold: false,
        }
    }

    /// The [`Request::BgExec`] of a host that relays its output to a reader of its own
    /// (cordon-oci): its output is held in the agent until read, never dropped (the program
    /// waits on its pipe instead), and it runs as `user` when one is given.
    pub fn relayed(self, id: u64, user: Option<proto::ProcUser>) -> Request {
        let mut request = self.background(id);
        if let Request::BgExec {
            hold, user: who, ..
        } = &mut request
        {
            *hold = true;
            *who = user;
        }
        request
    }

    /// Exec `id` of `req` in the foreground, its stdio `stdio` (`last`: no exec follows, when
    /// the tier's agent is told so), with the request's timeout and the sandbox's `limits`
    /// otherwise. A pseudo-terminal is refused: only background execs have one (their stdin
    /// and resizes come through calls of their own).
    pub fn foreground(
        self,
        req: &ExecRequest,
        (id, stdio, last): (u64, StdioMode, bool),
        limits: &cordon_core::Limits,
    ) -> cordon_core::Result<Foreground> {
        if self.pty.is_some() {
            return Err(Error::Invalid(
                "a pseudo-terminal is for background execs only: start it with background: true, \
                 or leave out pty"
                    .into(),
            ));
        }
        Ok(Foreground {
            id,
            request: Request::Exec {
                id,
                argv: self.argv,
                env: self.env,
                cwd: self.cwd,
                stdio,
                limits: self.limits,
                last,
            },
            stdin: req.stdin.clone().unwrap_or_default(),
            timeout: Duration::from_millis(req.timeout_ms.unwrap_or(limits.timeout_ms)),
            stdout_cap: limits.stdout_bytes,
            stderr_cap: limits.stderr_bytes,
        })
    }
}

/// A foreground exec as a tier hands it to [`run_framed`] ([`ExecParts::foreground`]).
#[derive(Debug, Clone)]
pub struct Foreground {
    pub id: u64,
    /// The [`Request::Exec`].
    pub request: Request,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
}

/// How a tier ends a foreground exec that outlives its deadline, and how often its own
/// watch runs ([`FramedExec`]'s fields of the same names).
#[derive(Debug, Clone, Copy)]
pub struct Ending {
    pub kill_at_deadline: bool,
    pub kill_grace: Duration,
    pub tick: Duration,
}

impl Foreground {
    /// The exec to drive, started at `t0`: its deadline is `t0` and the timeout.
    pub fn plan(&self, t0: Instant, ending: Ending) -> FramedExec<'_> {
        FramedExec {
            id: self.id,
            request: &self.request,
            stdin: &self.stdin,
            deadline: t0 + self.timeout,
            stdout_cap: self.stdout_cap,
            stderr_cap: self.stderr_cap,
            kill_at_deadline: ending.kill_at_deadline,
            kill_grace: ending.kill_grace,
            tick: ending.tick,
        }
    }
}

/// Maps an agent's refusal of a file operation to the API error.
pub fn file_error(path: &str, code: ErrorCode, message: String) -> Error {
    match code {
        ErrorCode::PathRefused => Error::PathRefused {
            path: path.to_string(),
            reason: message,
        },
        _ => Error::File {
            path: path.to_string(),
            reason: message,
        },
    }
}

/// One exec to drive over a framed channel.
pub struct FramedExec<'a> {
    pub id: u64,
    /// The [`Request::Exec`]. With [`StdioMode::Framed`] stdin goes as frames and output
    /// comes back as frames; with [`StdioMode::Passed`] the driver makes three pipes, sends
    /// their sandbox ends with the request, and writes stdin and reads output itself.
    pub request: &'a Request,
    pub stdin: &'a [u8],
    pub deadline: Instant,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
    /// At the deadline, ask the agent to kill the program and wait for its end (the sandbox
    /// lives on); otherwise return at once and let the tier end the sandbox.
    pub kill_at_deadline: bool,
    /// How long a kill may go untaken or unanswered.
    pub kill_grace: Duration,
    /// How often the tier's own watch runs while nothing arrives.
    pub tick: Duration,
}

/// What the agent reported at a program's end ([`Reply::Exited`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_us: u64,
    pub max_rss_bytes: u64,
    pub disk_full: bool,
    pub oom_killed: bool,
    pub pids_limited: bool,
    pub program_us: u64,
}

/// How the driver's loop ended.
#[derive(Debug)]
pub enum Ended {
    /// The agent reported the program's end.
    Exited(Exit),
    /// The deadline passed, or the exec could not be handed over by it, and no kill was
    /// asked for: the tier ends the sandbox.
    Abandoned,
    /// A kill was not taken or not answered within the grace: the agent is stuck.
    KillUnanswered,
    /// The channel closed or failed.
    Lost(CallError),
}

/// The outcome of [`run_framed`]: how it ended, Cordon's own reason to stop the program if
/// it had one, and the output kept within the caps.
#[derive(Debug)]
pub struct FramedRun {
    pub ended: Ended,
    pub stopped: Option<Termination>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

impl FramedRun {
    /// What the driver and the agent saw of the exec's end, for [`cordon_core::classify`]:
    /// Cordon's reason to stop it, the agent's report (none when the agent reported no end)
    /// and what the agent found itself (its exec cgroup's OOM kills and refused forks, a full
    /// scratch filesystem). The tier adds what its own watch and counters saw.
    pub fn evidence(&self) -> Evidence {
        let mut e = Evidence {
            stopped: self.stopped,
            ..Evidence::default()
        };
        if let Ended::Exited(x) = &self.ended {
            e.reported = Some(ExitReport {
                code: x.code,
                signal: x.signal,
            });
            e.oom_killed = x.oom_killed;
            e.forks_refused = x.pids_limited;
            e.disk_full = x.disk_full;
        }
        e
    }
}

/// Why an exec did not run: the channel is between frames only for [`ExecError::SpawnFailed`]
/// and [`ExecError::Refused`]; after [`ExecError::Protocol`] the tier ends the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the program could not be started: {0}")]
    SpawnFailed(String),
    #[error("the agent refused the exec: {0}")]
    Refused(String),
    #[error("{0}")]
    Protocol(String),
}

/// The host's ends of a program's stdio when its sandbox ends went to the agent with the
/// request ([`StdioMode::Passed`]): stdin is written from the request's bytes, output read
/// as it comes.
struct Pipes<'a> {
    stdin: Option<File>,
    data: &'a [u8],
    written: usize,
    stdout: Option<File>,
    stderr: Option<File>,
}

impl<'a> Pipes<'a> {
    /// Three pipes: the host's ends (non-blocking) and the sandbox's (stdin, stdout, stderr).
    fn make(data: &'a [u8]) -> io::Result<(Self, [OwnedFd; 3])> {
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from);
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        for fd in [&in_w, &out_r, &err_r] {
            let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
            fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        }
        let pipes = Pipes {
            // No stdin: our end closes at once, so a program that reads it sees end-of-file
            // instead of waiting out its timeout.
            stdin: (!data.is_empty()).then(|| File::from(in_w)),
            data,
            written: 0,
            stdout: Some(File::from(out_r)),
            stderr: Some(File::from(err_r)),
        };
        Ok((pipes, [in_r, out_w, err_w]))
    }

    fn drained(&self) -> bool {
        self.stdout.is_none() && self.stderr.is_none()
    }

    /// Waits up to `wait` for the agent channel (unless it has closed) or a pipe, moves what
    /// the pipes have, and says whether the channel is readable.
    fn wait_and_move(
        &mut self,
        conn: Option<&AgentConn>,
        wait: Duration,
        run: &mut FramedRun,
        ex: &FramedExec<'_>,
        sink: &mut dyn OutputSink,
    ) -> Result<bool, CallError> {
        let mut ready = [false; 4];
        {
            let mut fds = Vec::with_capacity(4);
            let mut which = Vec::with_capacity(4);
            if let Some(conn) = conn {
                fds.push(PollFd::new(conn.rx.as_fd(), PollFlags::POLLIN));
                which.push(0);
            }
            for (k, f) in [&self.stdout, &self.stderr].into_iter().enumerate() {
                if let Some(f) = f {
                    fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                    which.push(k + 1);
                }
            }
            if let Some(f) = &self.stdin {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLOUT));
                which.push(3);
            }
            let ms = wait.as_millis().clamp(1, u16::MAX as u128) as u16;
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
            for (fd, k) in fds.iter().zip(which) {
                ready[k] = fd.revents().is_some_and(|r| !r.is_empty());
            }
        }
        for (k, stream) in [(1, OutputStream::Stdout), (2, OutputStream::Stderr)] {
            if !ready[k] {
                continue;
            }
            let slot = if k == 1 {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            let Some(f) = slot.as_mut() else { continue };
            let mut chunk = [0u8; 64 << 10];
            match f.read(&mut chunk) {
                Ok(0) => *slot = None,
                Ok(n) => keep_output(run, ex, stream, &chunk[..n], sink),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => *slot = None,
            }
        }
        if ready[3]
            && let Some(f) = self.stdin.as_mut()
        {
            match f.write(&self.data[self.written..]) {
                Ok(n) => {
                    self.written += n;
                    if self.written >= self.data.len() {
                        self.stdin = None;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                // The program closed its stdin: the rest is not wanted.
                Err(_) => self.stdin = None,
            }
        }
        Ok(ready[0])
    }
}

/// Keeps what fits of a chunk of output within its stream's cap and passes it to the sink;
/// a chunk past the cap marks the stream truncated.
fn keep_output(
    run: &mut FramedRun,
    ex: &FramedExec<'_>,
    stream: OutputStream,
    data: &[u8],
    sink: &mut dyn OutputSink,
) {
    let (buf, trunc, cap) = match stream {
        OutputStream::Stdout => (&mut run.stdout, &mut run.stdout_truncated, ex.stdout_cap),
        OutputStream::Stderr => (&mut run.stderr, &mut run.stderr_truncated, ex.stderr_cap),
    };
    let room = (cap as usize).saturating_sub(buf.len());
    let keep = &data[..data.len().min(room)];
    if !keep.is_empty() {
        buf.extend_from_slice(keep);
        sink.output(stream, keep);
    }
    if data.len() > room {
        *trunc = true;
    }
}

/// How long output may still arrive on passed pipes after the program's end was reported
/// and the exec's deadline has passed (a process the program left holds them open).
const DRAIN_AFTER_DEADLINE: Duration = Duration::from_secs(2);

/// Drives one exec: hands over the request and its stdin by the exec's deadline, relays the
/// output to `sink` within the caps, and stops the program for the timeout, the output caps,
/// a sink whose reader went away ([`OutputSink::cancelled`]) or whatever `check` (the tier's
/// own watch, called every tick) returns.
pub fn run_framed(
    conn: &mut AgentConn,
    ex: &FramedExec<'_>,
    sink: &mut dyn OutputSink,
    check: &mut dyn FnMut() -> Option<Termination>,
) -> Result<FramedRun, ExecError> {
    let mut run = FramedRun {
        ended: Ended::Abandoned,
        stopped: None,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
    };
    let passed = matches!(
        ex.request,
        Request::Exec {
            stdio: StdioMode::Passed,
            ..
        }
    );
    match send_exec(conn, ex, passed)? {
        Ok(pipes) => drive(conn, ex, sink, check, run, pipes),
        Err(CallError::Timeout) => {
            run.stopped = Some(Termination::Timeout);
            Ok(run)
        }
        Err(e) => {
            run.ended = Ended::Lost(e);
            Ok(run)
        }
    }
}

/// Hands the agent the exec and its stdin: with passed stdio, the program's pipes go with
/// the request (the host keeps its ends); else the stdin follows in frames. The exec and its
/// stdin must be taken by the exec's own deadline: an agent that stops reading gets the same
/// timeout as a program that never exits.
fn send_exec<'a>(
    conn: &mut AgentConn,
    ex: &FramedExec<'a>,
    passed: bool,
) -> Result<Result<Option<Pipes<'a>>, CallError>, ExecError> {
    if passed {
        let (pipes, theirs) = Pipes::make(ex.stdin)
            .map_err(|e| ExecError::Refused(format!("no pipes for the program: {e}")))?;
        let fds = theirs.each_ref().map(|fd| fd.as_raw_fd());
        // `theirs` closes after the send: the agent holds its own copies then.
        return Ok(conn
            .send_with_fds(ex.request, b"", &fds, ex.deadline)
            .map(|()| Some(pipes)));
    }
    let mut sent = conn.send(ex.request, b"", ex.deadline);
    for chunk in ex.stdin.chunks(1 << 20) {
        sent = sent.and_then(|()| conn.send(&Request::Stdin { id: ex.id }, chunk, ex.deadline));
    }
    Ok(sent
        .and_then(|()| conn.send(&Request::Stdin { id: ex.id }, b"", ex.deadline))
        .map(|()| None))
}

/// Why the exec is to be stopped now, if it is: its deadline, its output caps, a reader
/// that went away, or the tier's own watch (asked only while the program runs).
fn stop_reason(
    run: &FramedRun,
    ex: &FramedExec<'_>,
    ended: bool,
    now: Instant,
    sink: &mut dyn OutputSink,
    check: &mut dyn FnMut() -> Option<Termination>,
) -> Option<Termination> {
    if now >= ex.deadline {
        Some(Termination::Timeout)
    } else if run.stdout_truncated || run.stderr_truncated {
        Some(Termination::OutputLimit)
    } else if !ended && sink.cancelled() {
        // The client went away: the program is killed, the sandbox lives on.
        Some(Termination::Cancelled)
    } else if !ended {
        check()
    } else {
        None
    }
}

/// The exec's loop once it is sent: stops the program when [`stop_reason`] says so, waits
/// for frames (and, with passed pipes, output), and ends with the program's end, a kill the
/// agent did not answer, or a lost channel.
fn drive(
    conn: &mut AgentConn,
    ex: &FramedExec<'_>,
    sink: &mut dyn OutputSink,
    check: &mut dyn FnMut() -> Option<Termination>,
    mut run: FramedRun,
    mut pipes: Option<Pipes<'_>>,
) -> Result<FramedRun, ExecError> {
    let passed = pipes.is_some();
    // No frame of an exec's carries more than the larger output cap (agents send output in
    // 64 KiB chunks).
    let max_frame = (ex.stdout_cap.max(ex.stderr_cap).max(64 << 10) as usize)
        .saturating_add(HEADER_ROOM)
        .min(proto::MAX_FRAME);
    let mut kill_sent_at: Option<Instant> = None;
    // The program's end as reported; with passed pipes, output may still be on its way.
    let mut exit: Option<Exit> = None;
    // The agent closed the channel after reporting the end: only the pipes are left.
    let mut closed = false;
    loop {
        let now = Instant::now();
        if run.stopped.is_none() {
            run.stopped = stop_reason(&run, ex, exit.is_some(), now, sink, check);
        }
        if let Some(e) = &exit
            && (pipes.as_ref().is_none_or(Pipes::drained)
                || now > ex.deadline + DRAIN_AFTER_DEADLINE)
        {
            run.ended = Ended::Exited(e.clone());
            return Ok(run);
        }
        if let Some(why) = run.stopped
            && kill_sent_at.is_none()
            && exit.is_none()
        {
            if why == Termination::Timeout && !ex.kill_at_deadline {
                run.ended = Ended::Abandoned;
                return Ok(run);
            }
            kill_sent_at = Some(now);
            if conn
                .send(&Request::Kill { id: ex.id }, b"", now + ex.kill_grace)
                .is_err()
            {
                run.ended = Ended::KillUnanswered;
                return Ok(run);
            }
        }
        if let Some(k) = kill_sent_at
            && exit.is_none()
            && now.duration_since(k) > ex.kill_grace
        {
            run.ended = Ended::KillUnanswered;
            return Ok(run);
        }
        let wait = if kill_sent_at.is_some() || exit.is_some() {
            Duration::from_millis(50)
        } else {
            ex.deadline.saturating_duration_since(now).min(ex.tick)
        };
        let filled = match pipes.as_mut() {
            None => conn.fill(wait),
            Some(p) => match p.wait_and_move((!closed).then_some(&*conn), wait, &mut run, ex, sink)
            {
                Ok(true) => conn.take_ready(),
                Ok(false) => Ok(Filled::Nothing),
                Err(e) => Err(e),
            },
        };
        match filled {
            Ok(Filled::Data) => {}
            Ok(Filled::Nothing) => continue,
            Ok(Filled::Eof) if exit.is_some() => {
                closed = true;
                continue;
            }
            Ok(Filled::Eof) => {
                run.ended = Ended::Lost(CallError::Closed);
                return Ok(run);
            }
            Err(e) => {
                run.ended = Ended::Lost(e);
                return Ok(run);
            }
        }
        if read_frames(conn, max_frame, passed, &mut run, ex, sink, &mut exit)? {
            return Ok(run);
        }
    }
}

/// Takes the frames that arrived: relayed output (without passed pipes), the program's
/// end, or the agent's refusal. True when the run has ended (its end reported and no pipes
/// left to drain).
fn read_frames(
    conn: &mut AgentConn,
    max_frame: usize,
    passed: bool,
    run: &mut FramedRun,
    ex: &FramedExec<'_>,
    sink: &mut dyn OutputSink,
    exit: &mut Option<Exit>,
) -> Result<bool, ExecError> {
    while let Some(f) = conn
        .next_frame(max_frame)
        .map_err(|e| ExecError::Protocol(format!("a malformed frame ({e})")))?
    {
        match f.header {
            Reply::Started { .. } => {}
            Reply::Output { stream, .. } if !passed => {
                let stream = match stream {
                    Stream::Stdout => OutputStream::Stdout,
                    Stream::Stderr => OutputStream::Stderr,
                };
                keep_output(run, ex, stream, &f.body, sink);
            }
            Reply::Exited {
                code,
                signal,
                cpu_us,
                max_rss_bytes,
                disk_full,
                oom_killed,
                pids_limited,
                program_us,
                ..
            } if exit.is_none() => {
                let reported = Exit {
                    code,
                    signal,
                    cpu_us,
                    max_rss_bytes,
                    disk_full,
                    oom_killed,
                    pids_limited,
                    program_us,
                };
                if !passed {
                    run.ended = Ended::Exited(reported);
                    return Ok(true);
                }
                *exit = Some(reported);
            }
            Reply::Error {
                code: ErrorCode::SpawnFailed,
                message,
            } => {
                return Err(ExecError::SpawnFailed(message));
            }
            Reply::Error { message, .. } => return Err(ExecError::Refused(message)),
            other => {
                return Err(ExecError::Protocol(format!(
                    "an unexpected message during an exec ({other:?})"
                )));
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
