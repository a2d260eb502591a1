//! Running an exec: starting it on a standby reaper, relaying its output and stdin,
//! and its end (status, usage, the exec's cgroup).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::sys::wait::waitpid;
use nix::unistd::{Gid, Uid};

use super::child::{ExecPlan, send_job};
use super::state::{
    Agent, ExecCgroups, FramedIo, Job, MAX_STDIN_BUFFER, Running, Standby, monotonic_us,
};
use crate::fdpass::recv_with_fds;
use crate::proto::{ErrorCode, ProcLimits, ProtoError, Reply, StdioMode, Stream, encode};
use crate::sys;

/// A program to start, as its request gave it (foreground or background).
pub(super) struct Launch {
    pub(super) id: u64,
    pub(super) argv: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) cwd: String,
    pub(super) stdio: StdioMode,
    pub(super) limits: ProcLimits,
    /// A pseudo-terminal of this size (background execs only).
    pub(super) pty: Option<cordon_core::PtySize>,
    /// Another user than the sandbox's (background execs only; checked by the caller).
    pub(super) user: Option<crate::proto::ProcUser>,
    /// The host said no exec follows this one (a one-shot run's only exec).
    pub(super) last: bool,
}

impl Agent {
    /// Starts a program on a standby reaper (made now if none is ready); with `pty`, on a
    /// new pseudo-terminal (framed: the agent holds its master); with `user` (checked by the
    /// caller: never id 0), as that user instead of the sandbox's.
    pub(super) fn launch(&mut self, l: Launch) -> io::Result<Running> {
        let Launch {
            id,
            argv,
            env,
            cwd,
            stdio,
            limits,
            pty,
            user,
            last,
        } = l;
        self.exec_seen = std::time::Instant::now();
        if argv.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
        }
        let (child_stdio, framed) = self.exec_stdio(stdio, pty)?;
        // Checked here, so a bad request is refused before a reaper is spent on it.
        ExecPlan::new(&argv, &env, &cwd)?;
        let cgroup = match &self.cgroups {
            Some(cg) => Some(cg.create(id)?),
            None => None,
        };
        let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(&status_r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let cpu_before_us = children_cpu_us();
        let mut job = Job {
            argv,
            env,
            cwd,
            limits,
            tty: pty.is_some(),
            // The program's process forked ahead has dropped to the sandbox's user already:
            // a job with a user of its own goes by the reaper, which forks one for it.
            user,
            direct: false,
            handed_us: 0,
            last,
        };
        let fds = [
            child_stdio[0].as_raw_fd(),
            child_stdio[1].as_raw_fd(),
            child_stdio[2].as_raw_fd(),
            status_w.as_raw_fd(),
        ];
        let sb = self.hand_job(&mut job, &fds, cgroup.as_deref())?;
        drop(status_w);
        drop(child_stdio);
        Ok(Running {
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
            chan: self.cgroups.is_none().then_some(sb.chan),
            served_cpu_us: sb.served_cpu_us,
        })
    }

    /// The program's stdin, stdout and stderr: a new pseudo-terminal's slave (framed, with
    /// `pty`), the three descriptors that came with the request (passed; with a terminal,
    /// the host's terminal in the sandbox's devpts), or pipes whose other ends are framed.
    fn exec_stdio(
        &mut self,
        stdio: StdioMode,
        pty: Option<cordon_core::PtySize>,
    ) -> io::Result<([OwnedFd; 3], Option<FramedIo>)> {
        match (stdio, pty) {
            (StdioMode::Framed, Some(size)) => self.open_terminal(size),
            (StdioMode::Passed, _) => {
                if self.fds.len() < 3 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "passed stdio needs three descriptors with the request",
                    ));
                }
                let mut take = || self.fds.pop_front().ok_or(io::ErrorKind::InvalidInput);
                Ok(([take()?, take()?, take()?], None))
            }
            (StdioMode::Framed, None) => framed_pipes(),
        }
    }

    /// Hands `job` with its descriptors (`fds`: stdin, stdout, stderr, the status pipe) to
    /// a standby reaper, joined to the exec's `cgroup` first, and to the program's process
    /// it forked ahead where there is one. A standby that died (or never came up) is
    /// replaced once. Returns the reaper that has the job.
    fn hand_job(
        &mut self,
        job: &mut Job,
        fds: &[RawFd; 4],
        cgroup: Option<&Path>,
    ) -> io::Result<Standby> {
        let encoded = |job: &Job| {
            encode(job, b"").map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
        };
        for _ in 0..2 {
            let mut sb = match self.standby.take() {
                Some(sb) => sb,
                None => self.spawn_standby()?,
            };
            // A reaper kept from the last exec sent its next program's socket when it was
            // ready; if it is not here yet, the job goes by the reaper, which forks anew.
            if sb.program.is_none() && self.cgroups.is_none() {
                sb.program = take_program_socket(&sb.chan);
            }
            let joined = match cgroup {
                Some(dir) => std::fs::write(dir.join("cgroup.procs"), sb.pid.to_string()),
                None => Ok(()),
            };
            // The program's process first (it is on the critical path), then its reaper,
            // told whether the program has its job. A send refused here means that process
            // is gone (its reaper forks another).
            job.handed_us = monotonic_us();
            job.direct = false;
            if let Some(program) = sb.program.as_ref().filter(|_| job.user.is_none()) {
                job.direct = send_job(program, &encoded(job)?, &fds[..3]).is_ok();
            }
            // The reaper gets the stdio too: one that failed its set-up reports on the
            // program's stderr.
            let sent =
                encoded(job).and_then(|job| joined.and_then(|_| send_job(&sb.chan, &job, fds)));
            match sent {
                Ok(()) => return Ok(sb),
                Err(_) => {
                    let _ = kill(sb.pid, Signal::SIGKILL);
                    let _ = waitpid(sb.pid, None);
                    // The program's process had its job and may have started on it (the
                    // reaper's end takes it down): the exec fails rather than run twice.
                    if job.direct {
                        break;
                    }
                }
            }
        }
        Err(io::Error::other(
            "the exec's reaper could not be started or joined to its cgroup",
        ))
    }

    /// A foreground exec's start: refused while one runs (with the descriptors sent along),
    /// else [`Agent::launch`]ed.
    pub(super) fn launch_foreground(&mut self, l: Launch) -> Result<Running, (ErrorCode, String)> {
        if self.running.is_some() {
            // Descriptors sent along are dropped with the refusal.
            self.fds.clear();
            return Err((ErrorCode::Busy, "an exec is already running".into()));
        }
        self.launch(l)
            .map_err(|e| (ErrorCode::SpawnFailed, e.to_string()))
    }

    /// Tells the host how a foreground start went; a started exec is the running one
    /// (`last`: the host said no exec follows it).
    pub(super) fn foreground_started(
        &mut self,
        id: u64,
        last: bool,
        launched: Result<Running, (ErrorCode, String)>,
    ) -> Result<(), ProtoError> {
        match launched {
            Ok(mut run) => {
                run.last = last;
                self.running = Some(run);
                self.send(&Reply::Started { id }, b"")
            }
            Err((code, msg)) => self.error(code, msg),
        }
    }

    /// Queues [`crate::proto::Request::Stdin`]'s bytes for the running exec `id` (an empty
    /// body closes its stdin; a chunk that would fill it past [`MAX_STDIN_BUFFER`] is dropped).
    pub(super) fn foreground_stdin(&mut self, id: u64, body: Vec<u8>) {
        if let Some(fr) = self
            .running
            .as_mut()
            .filter(|r| r.id == id)
            .and_then(|r| r.framed.as_mut())
        {
            if body.is_empty() {
                fr.stdin_close = true;
            } else if fr.stdin_buf.len() + body.len() <= MAX_STDIN_BUFFER {
                fr.stdin_buf.extend(body);
            }
        }
    }

    /// A pseudo-terminal of `size` for a program: the slave as its stdin, stdout and
    /// stderr (owned by the sandbox user, so the program may reopen it), the master framed.
    fn open_terminal(
        &self,
        size: cordon_core::PtySize,
    ) -> io::Result<([OwnedFd; 3], Option<FramedIo>)> {
        let (master, slave) = sys::open_pty(size).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot allocate a pseudo-terminal in the sandbox: {e}"),
            )
        })?;
        // Best effort: the program's own user owns its terminal, as a login's does.
        let _ = nix::unistd::fchown(
            &slave,
            Some(Uid::from_raw(self.cfg.uid)),
            Some(Gid::from_raw(self.cfg.gid)),
        );
        // One open file shared by both ends here: non-blocking for stdin's writes, and the
        // output side treats "nothing yet" as such.
        let reader = master.try_clone()?;
        let writer = master.try_clone()?;
        nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        Ok((
            [slave.try_clone()?, slave.try_clone()?, slave],
            Some(FramedIo {
                stdout: Some(File::from(reader)),
                stderr: None,
                stdin: Some(File::from(writer)),
                stdin_buf: VecDeque::new(),
                stdin_close: false,
                tty: Some(File::from(master)),
            }),
        ))
    }

    /// Reads what the reaper wrote on its status pipe; true once the line is whole or the
    /// pipe closed (the reaper died without a report).
    pub(super) fn status_complete(&mut self) -> bool {
        self.running.as_mut().is_some_and(Running::status_complete)
    }
}

/// Pipes for a framed exec's stdin, stdout and stderr: the program's ends, and the agent's
/// (its stdin's non-blocking).
fn framed_pipes() -> io::Result<([OwnedFd; 3], Option<FramedIo>)> {
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    nix::fcntl::fcntl(&in_w, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok((
        [in_r, out_w, err_w],
        Some(FramedIo {
            stdout: Some(File::from(out_r)),
            stderr: Some(File::from(err_r)),
            stdin: Some(File::from(in_w)),
            stdin_buf: VecDeque::new(),
            stdin_close: false,
            tty: None,
        }),
    ))
}

impl Running {
    /// Reads what the reaper wrote on its status pipe; true once the line is whole or the
    /// pipe closed (the reaper died without a report).
    pub(super) fn status_complete(&mut self) -> bool {
        let run = self;
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
}

/// What closing a terminal's stdin writes: `VEOF`, ^D.
const EOF_CHAR: u8 = 0x04;

impl FramedIo {
    /// One read of stdout (`which` 0) or stderr (1); `None` when nothing came (the stream
    /// is marked closed at its end).
    pub(super) fn read_chunk(&mut self, which: usize) -> Option<Vec<u8>> {
        let slot = if which == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        let f = slot.as_mut()?;
        let mut buf = vec![0u8; 64 * 1024];
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                return None;
            }
            // A pseudo-terminal's master reads EIO once every slave descriptor is closed.
            Err(_) => 0,
        };
        if n == 0 {
            *slot = None;
            return None;
        }
        buf.truncate(n);
        Some(buf)
    }

    /// What is left in both output pipes once every writer is gone (the reaper reported).
    pub(super) fn drain(&mut self) -> Vec<(Stream, Vec<u8>)> {
        self.stdin = None;
        self.tty = None;
        let mut rest = Vec::new();
        for (stream, slot) in [
            (Stream::Stdout, &mut self.stdout),
            (Stream::Stderr, &mut self.stderr),
        ] {
            if let Some(f) = slot.take() {
                let mut data = Vec::new();
                let _ = f.take(MAX_STDIN_BUFFER as u64).read_to_end(&mut data);
                if !data.is_empty() {
                    rest.push((stream, data));
                }
            }
        }
        rest
    }

    /// Queues bytes for stdin (an empty `data` closes it once the queue is written); false
    /// when the queue is full.
    pub(super) fn queue_stdin(&mut self, data: Vec<u8>) -> bool {
        if data.is_empty() {
            // A terminal has no end of its own: its end-of-file character (^D) makes a read
            // at the start of a line return nothing, as a keyboard's ^D does.
            if self.tty.is_some() && !self.stdin_close {
                self.stdin_buf.push_back(EOF_CHAR);
            }
            self.stdin_close = true;
        } else if self.stdin_buf.len() + data.len() <= MAX_STDIN_BUFFER {
            self.stdin_buf.extend(data);
        } else {
            return false;
        }
        true
    }

    pub(super) fn feed_stdin(&mut self) {
        let fr = self;
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
}

impl Agent {
    pub(super) fn relay_output(&mut self, which: usize) -> Result<(), ProtoError> {
        let Some(run) = self.running.as_mut() else {
            return Ok(());
        };
        let id = run.id;
        let Some(data) = run.framed.as_mut().and_then(|fr| fr.read_chunk(which)) else {
            return Ok(());
        };
        let stream = if which == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        self.send(&Reply::Output { id, stream }, &data)
    }

    pub(super) fn feed_stdin(&mut self) {
        if let Some(fr) = self.running.as_mut().and_then(|r| r.framed.as_mut()) {
            fr.feed_stdin();
        }
    }

    pub(super) fn finish_exec(&mut self) -> Result<(), ProtoError> {
        let Some(mut run) = self.running.take() else {
            return Ok(());
        };
        // Relay whatever output is still buffered in framed pipes.
        if let Some(fr) = run.framed.as_mut() {
            for (stream, data) in fr.drain() {
                for chunk in data.chunks(1 << 20) {
                    self.send(&Reply::Output { id: run.id, stream }, chunk)?;
                }
            }
        }
        let ended = self.conclude(run);
        self.send(
            &Reply::Exited {
                id: ended.id,
                code: ended.report.code,
                signal: ended.report.signal,
                cpu_us: ended.report.cpu_us,
                max_rss_bytes: ended.report.max_rss_bytes,
                disk_full: ended.disk_full,
                oom_killed: ended.oom_killed,
                pids_limited: ended.pids_limited,
                program_us: ended.report.program_us,
            },
            b"",
        )?;
        // The next exec's reaper gets ready while the host reads this reply, unless the host
        // said none follows (a one-shot run: the sandbox is torn down next).
        if self.standby.is_none() && !ended.last {
            self.standby = self.spawn_standby().ok();
        }
        Ok(())
    }

    /// An exec whose reaper reported (or died): its figures, and its reaper and cgroup
    /// seen to.
    pub(super) fn conclude(&mut self, run: Running) -> Ended {
        self.exec_seen = std::time::Instant::now();
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
                match run.chan {
                    // The reaper serves the next exec: its tree is gone, and it is
                    // forking that exec's program (ADR 0021).
                    Some(chan) if self.standby.is_none() && !run.last => {
                        self.standby = Some(Standby {
                            pid: run.reaper,
                            pidfd: run.pidfd,
                            chan,
                            program: None,
                            served_cpu_us: run.served_cpu_us.saturating_add(r.cpu_us),
                        });
                    }
                    // Its closed socket tells it to exit.
                    _ => self.exiting.push((run.reaper, run.pidfd)),
                }
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
                let cpu = children_cpu_us()
                    .saturating_sub(run.cpu_before_us)
                    .saturating_sub(run.served_cpu_us);
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
        Ended {
            id: run.id,
            last: run.last,
            report: Report {
                code,
                signal,
                max_rss_bytes,
                cpu_us,
                program_us,
            },
            disk_full,
            oom_killed,
            pids_limited,
        }
    }
}

/// What [`Agent::conclude`] found of an exec.
pub(super) struct Ended {
    pub(super) id: u64,
    pub(super) last: bool,
    pub(super) report: Report,
    pub(super) disk_full: bool,
    pub(super) oom_killed: bool,
    pub(super) pids_limited: bool,
}

impl ExecCgroups {
    /// Makes the cgroup of exec `id`, limits set, ready for the reaper to join.
    pub(super) fn create(&self, id: u64) -> io::Result<PathBuf> {
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
    pub(super) fn finish(dir: &Path) -> (bool, bool, u64) {
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

/// The newest program socket a kept reaper sent on `chan` (one byte with the descriptor,
/// per program it forked ahead), without waiting; older ones belong to programs it has
/// since replaced and are closed here.
fn take_program_socket(chan: &UnixStream) -> Option<UnixStream> {
    let mut newest = None;
    // Bounded: a reaper sends one per exec it served.
    for _ in 0..64 {
        let mut byte = [0u8; 1];
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC;
        match recv_with_fds(chan.as_raw_fd(), &mut byte, flags) {
            Ok((1, fds)) => {
                if let Some(fd) = fds.into_iter().last() {
                    newest = Some(UnixStream::from(fd));
                }
            }
            _ => break,
        }
    }
    newest
}

pub(super) fn children_cpu_us() -> u64 {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| cpu_us_of(&u))
        .unwrap_or(0)
}

/// User plus system CPU time of a usage record, in microseconds.
pub(super) fn cpu_us_of(u: &nix::sys::resource::Usage) -> u64 {
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    us(u.user_time()) + us(u.system_time())
}

pub(super) fn is_full(p: &Path) -> bool {
    // One statfs(2) gives both the counts and the file system's type.
    match nix::sys::statfs::statfs(p) {
        Ok(s) if s.blocks() > 0 => {
            let avail = s.blocks_available();
            // ext4 (a volume) refuses a write while a little is still free: its reserve for
            // metadata and allocations in flight, ~3% of a small file system. Below 4% free
            // it counts as full; a tmpfs is full at 0.
            let ext4 = s.filesystem_type() == nix::sys::statfs::EXT4_SUPER_MAGIC;
            avail == 0 || (ext4 && avail.saturating_mul(25) < s.blocks())
        }
        _ => false,
    }
}

/// What a reaper reports of its exec on the status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Report {
    pub(super) code: Option<i32>,
    pub(super) signal: Option<i32>,
    pub(super) max_rss_bytes: u64,
    pub(super) cpu_us: u64,
    /// The program's own time: from its hand-off (or fork) to its exit; 0 when it never ran.
    pub(super) program_us: u64,
}

/// Parses `exit|signal VALUE RSS_KB CPU_US [PROGRAM_US]`.
pub(super) fn parse_report(s: &str) -> Option<Report> {
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
}
