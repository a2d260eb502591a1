//! The monitor: the process a caller sees as the container's. `create` starts it; it
//! admits the bundle through the gate, makes the Cordon sandbox (the container tier, the
//! bundle's root filesystem as its read-only root), reports ready, and then serves the
//! control socket: the container's process and each `exec` run as background execs of the
//! sandbox whose stdin, stdout and stderr are the descriptors the caller gave, passed into
//! the sandbox as they are (a pipe, a FIFO, a terminal of the sandbox's devpts whose
//! master went to the caller's console socket): no byte of their I/O passes through the
//! monitor, nothing is copied or capped. When the container's
//! process ends the sandbox is destroyed and the monitor ends the same way (exit code or
//! signal), which is what the caller's `waitpid` reports.
//!
//! Everything the sandbox holds on the host (its init, egress proxy, cgroup, id range) is
//! tied to the monitor: killed, it takes the sandbox with it (the inits' parent-death
//! signal), and `delete` removes the cgroup it may leave.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use cordon_core::{ExecRequest, ProcSignal, Sandbox};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;

use crate::audit::Audited;
use crate::bundle::ProcessSpec;
use crate::ctl::{Conn, Listener, Reply, Request};
use crate::state::{Record, Root, Status};
use crate::tiers::{Relay, Started};
use crate::{OciError, Result};

pub use crate::prepare::{Prepared, ROOTS_AT, Setup, prepare};

/// How the container (or a process) ended: its exit code, or the signal that ended it.
type Ended = (Option<i32>, Option<i32>);

/// One process of the container: the first is the container's own. Its stdin, stdout and
/// stderr are the caller's own descriptors, passed to the sandbox; none is held here.
struct Proc {
    bg: u64,
    /// An exec's connection: its end is told how the process ended; its closing kills it.
    conn: Option<Conn>,
    /// On a tier that cannot take the caller's descriptors: the copy to and from them.
    relay: Option<Relay>,
}

fn exec_request(p: &ProcessSpec) -> ExecRequest {
    let mut req = ExecRequest::argv(p.args.clone());
    req.env = p.env.clone();
    req.cwd = Some(p.cwd.clone());
    req
}

/// Signals the monitor takes for the container's process when it is sent them itself (an
/// engine may signal the pid it knows for the container): each is passed on as itself.
const FORWARDED: [Signal; 20] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTERM,
    Signal::SIGSTKFLT,
    Signal::SIGCONT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGURG,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGWINCH,
    Signal::SIGIO,
    Signal::SIGPWR,
];

/// Whether `signal` ends a process by default: sent before the container's process ran,
/// it ends the container (as runc's waiting init would end).
fn ends_by_default(signal: i32) -> bool {
    ![
        libc::SIGCHLD,
        libc::SIGCONT,
        libc::SIGURG,
        libc::SIGWINCH,
        libc::SIGSTOP,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ]
    .contains(&signal)
}

/// The shortest and longest waits between two looks at whether a process ended: short
/// after a start (a short-lived process ends quickly), growing while nothing happens, so
/// an idle container costs a look every quarter second.
const LOOK_MIN_MS: u16 = 5;
const LOOK_MAX_MS: u16 = 250;
/// The longest wait between two looks at a relayed process's output while it is quiet.
const RELAY_LOOK_MAX_MS: u16 = 50;

/// The monitor's life once the sandbox is up: serve the control socket until the
/// container's process ends, then destroy the sandbox and end as it did.
pub fn serve(root: &Root, prepared: Prepared, listener: Listener) -> ! {
    let Prepared {
        sandbox,
        process,
        record,
        terminal,
    } = prepared;
    let mut m = Monitor {
        root,
        listener,
        sigfd: forwarded_signals(),
        sandbox,
        process,
        record,
        terminal,
        procs: Vec::new(),
        main: None,
        ended: None,
        look_ms: LOOK_MIN_MS,
        relay_moved: false,
    };
    while m.ended.is_none() {
        m.round();
    }
    m.finish()
}

/// The signals an engine sends the container's pid, blocked and read as data, not handled
/// asynchronously.
fn forwarded_signals() -> Option<SignalFd> {
    let mut mask = SigSet::empty();
    for s in FORWARDED {
        mask.add(s);
    }
    let _ = mask.thread_block();
    SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_NONBLOCK | nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
    )
    .ok()
}

/// The monitor, serving: the sandbox, the container's processes and what it waits on.
struct Monitor<'a> {
    root: &'a Root,
    listener: Listener,
    sigfd: Option<SignalFd>,
    sandbox: Audited,
    process: ProcessSpec,
    record: Record,
    terminal: Option<OwnedFd>,
    procs: Vec<Proc>,
    /// The container's own process, once started.
    main: Option<u64>,
    /// How the container ended (exit code, signal), once it has.
    ended: Option<Ended>,
    /// How long until the next look at the processes; grows while nothing happens.
    look_ms: u16,
    /// A relay moved bytes in the last round: look again at once.
    relay_moved: bool,
}

/// What one round's poll found ready.
struct Polled {
    /// A control connection waits on the socket.
    request: bool,
    /// A forwarded signal came.
    signal: bool,
    /// Processes whose exec caller went away (its connection turned readable).
    gone: Vec<usize>,
    /// Relayed processes whose caller has more stdin for them.
    stdin: Vec<usize>,
}

impl Monitor<'_> {
    /// One round: waits, then takes signals, a control request, callers that went away,
    /// and looks at every process.
    fn round(&mut self) {
        let polled = self.wait();
        self.look_ms = self.look_ms.saturating_mul(3).div_ceil(2).min(LOOK_MAX_MS);
        if polled.signal {
            self.take_signals();
        }
        if polled.request {
            self.accept();
        }
        // Exec connections closed by their caller (the exec's relay was killed).
        for i in polled.gone {
            let p = &mut self.procs[i];
            let _ = self.sandbox.signal_background(p.bg, ProcSignal::Kill);
            p.conn = None;
        }
        self.look_at_procs(&polled.stdin);
    }

    /// Polls the control socket, the signals, exec callers and relays, at most until the
    /// next look at the processes is due.
    fn wait(&self) -> Polled {
        let procs = &self.procs;
        let mut fds = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        if let Some(s) = &self.sigfd {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        let fixed = fds.len();
        // An exec's connection turns readable when its caller goes away.
        let watched: Vec<usize> = (0..procs.len())
            .filter(|i| procs[*i].conn.is_some())
            .collect();
        for i in &watched {
            if let Some(c) = &procs[*i].conn {
                fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            }
        }
        // A relayed process's stdin, while the caller has more of it.
        let fed: Vec<usize> = (0..procs.len())
            .filter(|i| {
                procs[*i]
                    .relay
                    .as_ref()
                    .is_some_and(|r| r.stdin().is_some())
            })
            .collect();
        for i in &fed {
            if let Some(fd) = procs[*i].relay.as_ref().and_then(Relay::stdin) {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
        }
        // Room on the caller's stdout or stderr for output that waits for it.
        for p in procs {
            for fd in p.relay.iter().flat_map(Relay::out_waiting) {
                fds.push(PollFd::new(fd, PollFlags::POLLOUT));
            }
        }
        let _ = poll(&mut fds, PollTimeout::from(self.timeout_ms()));
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        let at = |k: usize| ready.get(k).copied().unwrap_or(false);
        Polled {
            request: at(0),
            signal: self.sigfd.is_some() && at(1),
            gone: (watched.iter().enumerate())
                .filter(|(k, _)| at(fixed + k))
                .map(|(_, i)| *i)
                .collect(),
            stdin: (fed.iter().enumerate())
                .filter(|(k, _)| at(fixed + watched.len() + k))
                .map(|(_, i)| *i)
                .collect(),
        }
    }

    /// How long a round waits: a second with no process, none after a relay moved bytes,
    /// else until the next look (sooner with a relay).
    fn timeout_ms(&self) -> u16 {
        if self.procs.is_empty() {
            1000
        } else if self.relay_moved {
            0
        } else if self.procs.iter().any(|p| p.relay.is_some()) {
            self.look_ms.min(RELAY_LOOK_MAX_MS)
        } else {
            self.look_ms
        }
    }

    /// Forwarded signals go to the container's process; before it started, one that ends a
    /// process by default ends the container.
    fn take_signals(&mut self) {
        while let Some(Ok(Some(info))) = self.sigfd.as_ref().map(|s| s.read_signal()) {
            let signal = info.ssi_signo as i32;
            match self.main {
                Some(bg) => {
                    let _ = self.sandbox.inner().raise_background(bg, signal, false);
                }
                None if ends_by_default(signal) => self.ended = Some((None, Some(signal))),
                None => {}
            }
        }
    }

    /// Serves one control connection.
    fn accept(&mut self) {
        let Ok(conn) = self.listener.accept() else {
            return;
        };
        let _ = conn.set_timeout(Some(Duration::from_secs(5)));
        let mut cx = Ctx {
            sandbox: &mut self.sandbox,
            procs: &mut self.procs,
            main: &mut self.main,
            process: &self.process,
            terminal: &mut self.terminal,
            root: self.root,
            record: &mut self.record,
        };
        if let Some(done) = handle(&mut cx, &conn) {
            self.ended = Some(done);
        }
        self.look_ms = LOOK_MIN_MS;
    }

    /// Relays each process's I/O and takes its end: the agent tells a process's end once it
    /// has been reaped with its tree (a relayed one's with the last of its output, copied
    /// on the way). `stdin_ready`: relayed processes with stdin to pass on.
    fn look_at_procs(&mut self, stdin_ready: &[usize]) {
        self.relay_moved = false;
        let mut i = 0;
        while i < self.procs.len() {
            let bg = self.procs[i].bg;
            let looked = match self.procs[i].relay.as_mut() {
                Some(r) => r
                    .pass(&mut self.sandbox, bg, stdin_ready.contains(&i))
                    .map(|p| {
                        self.relay_moved |= p.moved;
                        p.exit
                    }),
                None => self.sandbox.read_background(bg, [0, 0], 0).map(|o| o.exit),
            };
            let exit = match looked {
                Ok(exit) => exit,
                // The sandbox is gone: its processes with it.
                Err(_) => Some(cordon_core::ProcExit {
                    signal: Some(libc::SIGKILL),
                    ..Default::default()
                }),
            };
            let Some(exit) = exit else {
                i += 1;
                continue;
            };
            let signal = if exit.oom_killed {
                Some(libc::SIGKILL)
            } else {
                exit.signal
            };
            let (code, signal) = (exit.code.filter(|_| signal.is_none()), signal);
            if Some(bg) == self.main {
                self.ended = Some((code, signal));
            } else if let Some(c) = &self.procs[i].conn {
                let _ = c.send(&Reply::Exited { code, signal }, &[]);
            }
            self.procs.remove(i);
        }
    }

    /// The container ended: the other processes' callers are told they were killed, the
    /// sandbox is destroyed, the record says stopped, and the monitor ends as the container
    /// did.
    fn finish(self) -> ! {
        let (code, signal) = self.ended.unwrap_or((None, Some(libc::SIGKILL)));
        for p in &self.procs {
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
        let Monitor {
            root,
            mut sandbox,
            mut record,
            ..
        } = self;
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
}

/// What a control request may touch.
struct Ctx<'a> {
    sandbox: &'a mut Audited,
    procs: &'a mut Vec<Proc>,
    main: &'a mut Option<u64>,
    process: &'a ProcessSpec,
    /// The container's process's terminal slave, until it starts.
    terminal: &'a mut Option<OwnedFd>,
    root: &'a Root,
    record: &'a mut Record,
}

/// One control request. Returns how the container ended when the request ended it (a
/// signal before it started).
fn handle(cx: &mut Ctx<'_>, conn: &Conn) -> Option<Ended> {
    let (req, fds) = match conn.recv::<Request>() {
        Ok(Some(r)) => r,
        _ => return None,
    };
    let err = |m: String| Reply::Error { message: m };
    let (reply, ended) = match req {
        Request::Start if cx.main.is_some() => {
            (err("the container was started already".into()), None)
        }
        Request::Start => (start_main(cx), None),
        Request::Signal { signal, .. } if !(1..=64).contains(&signal) => (
            err(format!(
                "signal {signal} does not exist; give a name (TERM, USR1) or a number from 1 to 64"
            )),
            None,
        ),
        Request::Signal { signal, all } => raise(cx, signal, all),
        Request::Exec { .. } if cx.main.is_none() => (
            err("the container is not running; start it first".into()),
            None,
        ),
        Request::Exec { process } => match start_exec(cx, conn, &process, fds) {
            Ok(()) => return None,
            Err(e) => (err(format!("starting the process: {e}")), None),
        },
        Request::Resize { memory_bytes, cpus } => match cx.sandbox.resize(memory_bytes, cpus) {
            Ok(()) => (Reply::Ok, None),
            Err(e) => (err(format!("resizing the sandbox: {e}")), None),
        },
        Request::Ps => (
            Reply::Pids {
                pids: cx
                    .record
                    .sandbox
                    .as_deref()
                    .map(|s| sandbox_pids(s, cx.record.cgroup.as_deref()))
                    .unwrap_or_default(),
            },
            None,
        ),
    };
    let _ = conn.send(&reply, &[]);
    ended
}

/// Starts the container's own process on the caller's descriptors: the monitor's own stdio
/// (what `create` was given), or its terminal. The record then says running.
fn start_main(cx: &mut Ctx<'_>) -> Reply {
    let req = exec_request(cx.process);
    let started = match cx.terminal.as_ref() {
        Some(t) => start(cx.sandbox, &req, [t.as_fd(); 3], true, cx.process),
        None => start(
            cx.sandbox,
            &req,
            [
                std::io::stdin().as_fd(),
                std::io::stdout().as_fd(),
                std::io::stderr().as_fd(),
            ],
            false,
            cx.process,
        ),
    };
    match started {
        Ok((bg, relay)) => {
            // The process holds its terminal now; the monitor keeps no copy.
            *cx.terminal = None;
            *cx.main = Some(bg);
            cx.procs.push(Proc {
                bg,
                conn: None,
                relay,
            });
            cx.record.status = Status::Running;
            let _ = cx.root.save(cx.record);
            Reply::Ok
        }
        Err(e) => Reply::Error {
            message: format!("starting the container's process: {e}"),
        },
    }
}

/// Raises `signal` in the container's process (in every process of it with `all`). Before
/// it started, a signal that ends a process ends the container here.
fn raise(cx: &mut Ctx<'_>, signal: i32, all: bool) -> (Reply, Option<Ended>) {
    match *cx.main {
        Some(bg) => match cx.sandbox.inner().raise_background(bg, signal, all) {
            Ok(()) => (Reply::Ok, None),
            Err(e) => (
                Reply::Error {
                    message: format!("signalling the container: {e}"),
                },
                None,
            ),
        },
        None if ends_by_default(signal) => (Reply::Ok, Some((None, Some(signal)))),
        None => (Reply::Ok, None),
    }
}

/// Starts an exec'd process on a terminal of its own or on the descriptors that came with
/// the request, and answers the caller (with the terminal's master, if any); the caller's
/// connection is kept to tell it the process's end, and a caller gone already takes the
/// process with it. Refusals are the caller's to answer.
fn start_exec(
    cx: &mut Ctx<'_>,
    conn: &Conn,
    process: &ProcessSpec,
    fds: Vec<OwnedFd>,
) -> Result<()> {
    let req = exec_request(process);
    let started = if process.terminal {
        let tier = cx.sandbox.tier();
        let size = process
            .console_size
            .unwrap_or(crate::prepare::DEFAULT_CONSOLE);
        crate::tiers::open_terminal(cx.sandbox.inner(), tier, size).and_then(|t| {
            let slave = t.slave.as_fd();
            let (bg, relay) = start(cx.sandbox, &req, [slave; 3], true, process)?;
            Ok((bg, Some(t), relay))
        })
    } else {
        stdio_of(&fds).and_then(|stdio| {
            start(cx.sandbox, &req, stdio, false, process).map(|(bg, relay)| (bg, None, relay))
        })
    };
    // The process holds what it was given; none is kept here.
    drop(fds);
    let (bg, terminal, relay) = started?;
    let sent = match &terminal {
        Some(t) => conn.send(
            &Reply::Console {
                name: t.name.clone(),
            },
            &[t.master.as_raw_fd()],
        ),
        None => conn.send(&Reply::Ok, &[]),
    };
    drop(terminal);
    let conn = sent.and_then(|()| conn_clone(conn)).ok();
    if conn.is_none() {
        // Its caller is gone already: so is the process.
        let _ = cx.sandbox.signal_background(bg, ProcSignal::Kill);
    }
    cx.procs.push(Proc { bg, conn, relay });
    Ok(())
}

/// Starts `req` with `stdio` on the sandbox's tier: passed into the sandbox, or relayed by
/// the monitor (the relay holds its own copies of them).
fn start(
    sandbox: &mut Audited,
    req: &ExecRequest,
    stdio: [BorrowedFd<'_>; 3],
    terminal: bool,
    process: &ProcessSpec,
) -> Result<(u64, Option<Relay>)> {
    let tier = sandbox.tier();
    let relay = if crate::tiers::relays(tier) {
        Some(Relay::new(stdio, terminal)?)
    } else {
        None
    };
    let user = user_of(process);
    match crate::tiers::start(sandbox.inner(), tier, req, stdio, terminal, user)? {
        Started::Passed(bg) => Ok((bg, None)),
        Started::Relayed(bg) => Ok((bg, relay)),
    }
}

/// Who the process runs as in the sandbox (`None`: the sandbox's own user).
fn user_of(p: &ProcessSpec) -> Option<cordon_core::ProcUser> {
    p.user.as_ref().map(|u| cordon_core::ProcUser {
        uid: u.uid,
        gid: u.gid,
        groups: u.groups.clone(),
    })
}

/// An exec's stdin, stdout and stderr, as they came with its request.
fn stdio_of(fds: &[OwnedFd]) -> Result<[BorrowedFd<'_>; 3]> {
    match fds {
        [a, b, c, ..] => Ok([a.as_fd(), b.as_fd(), c.as_fd()]),
        _ => Err(OciError::Invalid(
            "the process's stdin, stdout and stderr were not passed".into(),
        )),
    }
}

fn conn_clone(c: &Conn) -> std::io::Result<Conn> {
    let fd: OwnedFd = c.as_fd().try_clone_to_owned()?;
    Ok(crate::ctl::Conn::from_owned(fd))
}

/// The host pids of every process in the sandbox's cgroup (made in `parent`, else Cordon's).
pub fn sandbox_pids(sandbox: &str, parent: Option<&str>) -> Vec<i32> {
    let parent = parent.unwrap_or(cordon_host::cgroup::PARENT);
    let mut pids: Vec<i32> = cordon_host::cgroup::dirs_of(parent, sandbox)
        .iter()
        .flat_map(|d| cordon_host::cgroup::read_pids(&d.join("cgroup.procs")))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Removes what a container whose monitor is gone may have left: its sandbox's cgroup (and
/// any process still in it), on the gvisor and microvm tiers what the tier's own sweep
/// finds of sandboxes whose owner is gone (a runsc sandbox, a VM's directory and cgroup).
/// Returns whether anything was left.
pub fn sweep(record: &Record) -> bool {
    let Some(name) = &record.sandbox else {
        return false;
    };
    let mut left = false;
    if let Some(tier) = record.tier {
        let removed = crate::tiers::sweep(tier, name);
        for r in &removed {
            eprintln!("cordon-oci: container {}: removed {r}", record.id);
        }
        left |= !removed.is_empty();
    }
    let dirs = cordon_host::cgroup::dirs_of(cordon_host::cgroup::PARENT, name);
    if !dirs.is_empty() {
        cordon_host::cgroup::remove_dirs(&dirs, Duration::from_secs(5));
        left = true;
    }
    // The pod's cgroup it was given (the monitor's, with the sandbox's below it), as runc
    // removes a container's cgroup at delete.
    if let Some(place) = record.cgroup.as_deref().and_then(crate::tiers::placed) {
        left |= !place.existing().is_empty();
        place.remove(Duration::from_secs(5));
    }
    // Its proxy's socket directory and CA bundle under /run (the proxy ran in the
    // monitor), once nothing of the sandbox is left to hold them.
    if cordon_host::egress::remove_left(name) {
        eprintln!(
            "cordon-oci: container {}: removed its egress proxy's socket and CA bundle",
            record.id
        );
        left = true;
    }
    left
}

/// Raw descriptor numbers of the calling process's stdio, for an `exec` request.
pub fn own_stdio() -> [i32; 3] {
    [
        std::io::stdin().as_raw_fd(),
        std::io::stdout().as_raw_fd(),
        std::io::stderr().as_raw_fd(),
    ]
}
