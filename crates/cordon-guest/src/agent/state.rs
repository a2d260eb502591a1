//! What the agent's parts share: its configuration, the host channel, the state of its
//! execs (running, standby, background) and the agent itself, with the replies every part
//! sends. Below every other module of the agent: it uses none of them but the ring.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use cordon_core::ProcExit;
use nix::unistd::Pid;

use super::ring::Ring;
use crate::files::Workspace;
use crate::proto::{EgressSetup, ErrorCode, FrameBuffer, ProcLimits, ProtoError, Reply, encode};

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
    /// A file bound over `/proc/sys/kernel/random/boot_id` in each exec's fresh `/proc`:
    /// the sandbox's own boot id where the kernel is the host's (the container tier).
    pub boot_id: Option<PathBuf>,
    pub confine: Option<Confine>,
    /// After a terminal's resize, send `SIGWINCH` to the exec's reaper, which passes it on
    /// to every process of the exec: for kernels whose pseudo-terminals send none (gVisor's).
    pub winch_on_resize: bool,
    /// A reaper readied for the next exec that none has asked for this long is let go, with
    /// the program it forked ahead: an idle sandbox is then its init and this agent alone
    /// (issue 49: host processes per live sandbox), and the next exec readies a reaper
    /// anew. `None`: kept for as long as the sandbox lives.
    pub standby_idle: Option<std::time::Duration>,
}

/// How long a readied reaper waits for an exec before it is let go
/// ([`AgentConfig::standby_idle`]; ADR 0039).
pub const STANDBY_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) struct Running {
    pub(super) id: u64,
    pub(super) reaper: Pid,
    /// None where the kernel has no `pidfd_open` (gVisor): the status pipe's end is the sign.
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) status: File,
    /// What the reaper wrote so far on its status pipe.
    pub(super) report: Vec<u8>,
    pub(super) framed: Option<FramedIo>,
    pub(super) cpu_before_us: u64,
    pub(super) cgroup: Option<PathBuf>,
    /// The host said no exec follows, or the exec runs in the background: its reaper
    /// serves no other exec, and none is readied after it.
    pub(super) last: bool,
    /// The reaper's job socket, held until the exec ends (a foreground exec's reaper may
    /// then serve the next one, see [`super::child::standby_main`]); dropping it lets the
    /// reaper exit once it reported.
    pub(super) chan: Option<UnixStream>,
    /// [`Standby::served_cpu_us`] of its reaper.
    pub(super) served_cpu_us: u64,
}

/// A reaper made ahead of its exec, waiting for the job on `chan`.
pub(super) struct Standby {
    pub(super) pid: Pid,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) chan: UnixStream,
    /// The program's process the reaper forks ahead waits for its job on the other end:
    /// the agent hands it over itself, so the program does not wait for the reaper to
    /// wake and pass it on (on gVisor's ptrace platform each such wake costs 1-3 ms).
    /// None with per-exec cgroups, where the program is forked only once the reaper is in
    /// its exec's cgroup.
    pub(super) program: Option<UnixStream>,
    /// CPU time of the execs this reaper already served and reported: not the next one's,
    /// should the reaper die without a report (its whole life is then counted).
    pub(super) served_cpu_us: u64,
}

/// What a standby reaper is sent (with the program's stdin, stdout, stderr and the status
/// pipe as descriptors).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Job {
    pub(super) argv: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) cwd: String,
    pub(super) limits: ProcLimits,
    /// Its stdin is a terminal, to become the program's controlling terminal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) tty: bool,
    /// Who it runs as, when not the sandbox's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) user: Option<crate::proto::ProcUser>,
    /// (To a reaper) the agent already handed this job to the program's process the
    /// reaper forked ahead; without it, that process is replaced by one the reaper forks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) direct: bool,
    /// When the agent handed the job to the program (`CLOCK_MONOTONIC`, µs): the reaper
    /// may get its own copy only after the program has run, and times it from here.
    #[serde(default)]
    pub(super) handed_us: u64,
    /// No exec follows this one: once it is reported, the reaper forks no next program and
    /// exits (the sandbox's teardown then has one process fewer to make and kill).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) last: bool,
}

/// `CLOCK_MONOTONIC` in microseconds: the clock `Instant` reads, comparable across the
/// agent's processes.
pub(super) fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

pub(super) struct FramedIo {
    pub(super) stdout: Option<File>,
    pub(super) stderr: Option<File>,
    pub(super) stdin: Option<File>,
    pub(super) stdin_buf: VecDeque<u8>,
    pub(super) stdin_close: bool,
    /// On a pseudo-terminal: its master (`stdout` and `stdin` are copies of it), held until
    /// the exec ends, so closing stdin sends the terminal's end-of-file character and never
    /// hangs the terminal up; resizes act on it.
    pub(super) tty: Option<File>,
}

/// The host channel: a Unix socket (which can carry descriptors), a character device such
/// as a virtio-serial port, or a pair of pipes (the gVisor tier's stdin and stdout); the
/// last two carry bytes only: use [`crate::proto::StdioMode::Framed`].
pub(super) enum Channel {
    Socket(UnixStream),
    Port(File),
    Pipes { rx: File, tx: File },
}

impl Channel {
    /// What is polled for input.
    pub(super) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Channel::Socket(s) => s.as_fd(),
            Channel::Port(f) => f.as_fd(),
            Channel::Pipes { rx, .. } => rx.as_fd(),
        }
    }

    pub(super) fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Channel::Socket(s) => s.write_all(bytes),
            Channel::Port(f) => f.write_all(bytes),
            Channel::Pipes { tx, .. } => tx.write_all(bytes),
        }
    }

    /// Reads bytes (descriptors sent along on a socket are dropped).
    pub(super) fn read_bytes(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Channel::Socket(s) => s.read(buf),
            Channel::Port(f) => f.read(buf),
            Channel::Pipes { rx, .. } => rx.read(buf),
        }
    }

    /// The byte stream to read from, for channels that carry no descriptors.
    pub(super) fn bytes_in(&mut self) -> Option<&mut File> {
        match self {
            Channel::Socket(_) => None,
            Channel::Port(f) => Some(f),
            Channel::Pipes { rx, .. } => Some(rx),
        }
    }
}

/// Per-sandbox settings the host sent with [`crate::proto::Request::Configure`].
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
pub(super) struct ExecCgroups {
    pub(super) root: PathBuf,
    pub(super) memory_bytes: u64,
    pub(super) pids: u32,
}

/// Serves one host connection until it closes or sends `Shutdown`.
pub struct Agent {
    pub(super) cfg: AgentConfig,
    pub(super) ctrl: Channel,
    pub(super) work: Workspace,
    pub(super) inbuf: FrameBuffer,
    pub(super) fds: VecDeque<OwnedFd>,
    pub(super) running: Option<Running>,
    /// Background execs by id, running or ended and not yet dropped.
    pub(super) background: BTreeMap<u64, Background>,
    pub(super) standby: Option<Standby>,
    /// When an exec last started or ended (or the agent started): the standby's idle clock.
    pub(super) exec_seen: std::time::Instant,
    /// Reapers that reported their program's end and are still exiting (namespace teardown).
    pub(super) exiting: Vec<(Pid, Option<OwnedFd>)>,
    pub(super) configure: Option<ConfigureHook>,
    pub(super) cgroups: Option<ExecCgroups>,
    /// The port relay ([`crate::ports`]), forked at the first [`crate::proto::Request::PortOpen`].
    pub(super) ports: Option<crate::ports::Relay>,
    /// Directory watchers ([`crate::proto::Request::Watch`]); their inotify descriptor is polled while
    /// any exists.
    pub(super) watches: crate::watch::Watches,
}

pub(super) const MAX_STDIN_BUFFER: usize = 16 << 20;

/// A background exec: its reaper while it runs, and what it wrote (see `background`).
pub(super) struct Background {
    /// The exec while it runs.
    pub(super) run: Option<Running>,
    pub(super) out: [Ring; 2],
    /// Set once its reaper reported and every byte of output is in.
    pub(super) exit: Option<ProcExit>,
}

/// The replies every part of the agent sends.
impl Agent {
    pub(super) fn send(&mut self, reply: &Reply, body: &[u8]) -> Result<(), ProtoError> {
        let bytes = encode(reply, body)?;
        self.ctrl.write_all(&bytes)?;
        Ok(())
    }

    pub(super) fn archive_reply(
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

    pub(super) fn error(
        &mut self,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Result<(), ProtoError> {
        self.send(
            &Reply::Error {
                code,
                message: message.into(),
            },
            b"",
        )
    }
}
