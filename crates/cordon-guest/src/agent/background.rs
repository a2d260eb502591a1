//! Background execs: programs that run beside the foreground exec, each under its own
//! reaper like any exec, their output kept here (the last [`BACKGROUND_KEEP`] bytes of each
//! stream) until the host reads it.

use cordon_core::{BACKGROUND_KEEP, ProcExit, ProcSignal};
use nix::sys::signal::{Signal, kill};

use super::exec::Launch;
use super::ring::Ring;
use super::state::{Agent, Background, FramedIo};
use crate::proto::{ErrorCode, ProtoError, Reply, StdioMode, Stream};
use crate::sys;

/// Most background execs the agent keeps, running or ended and not yet dropped; past it
/// the oldest ended one is dropped, and a start with every one still running is refused.
const MAX_BACKGROUND: usize = 64;

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
    /// Answers [`crate::proto::Request::BgExec`]'s start (see [`Agent::launch_background`]),
    /// `user` checked first. Descriptors sent along are the program's own only when its
    /// stdio says so, and none is left for a later request.
    pub(super) fn start_background(
        &mut self,
        l: Launch,
        hold: bool,
    ) -> Result<(), (ErrorCode, String)> {
        if l.stdio != StdioMode::Passed {
            self.fds.clear();
        }
        let started = match l.user.as_ref().map(check_user) {
            Some(Err(m)) => Err((ErrorCode::BadRequest, m)),
            _ => self.launch_background(l, hold),
        };
        // Whatever the start made of them, none is left for a later request.
        self.fds.clear();
        started
    }

    /// Tells the host how a background start went; after one, the next exec's reaper gets
    /// ready while the host reads the reply.
    pub(super) fn background_started(
        &mut self,
        id: u64,
        started: Result<(), (ErrorCode, String)>,
    ) -> Result<(), ProtoError> {
        match started {
            Ok(()) => {
                self.send(&Reply::Started { id }, b"")?;
                if self.standby.is_none() {
                    self.standby = self.spawn_standby().ok();
                }
                Ok(())
            }
            Err((code, msg)) => self.error(code, msg),
        }
    }

    /// Starts a background exec: its reaper, and its output kept here (in rings that
    /// `hold` what the host has not read).
    fn launch_background(&mut self, mut l: Launch, hold: bool) -> Result<(), (ErrorCode, String)> {
        let (id, pty, stdio) = (l.id, l.pty, l.stdio);
        if self.background.contains_key(&id) || self.running.as_ref().is_some_and(|r| r.id == id) {
            return Err((ErrorCode::BadRequest, format!("exec id {id} is in use")));
        }
        if self.background.len() >= MAX_BACKGROUND {
            let oldest_ended = self
                .background
                .iter()
                .find(|(_, b)| b.exit.is_some())
                .map(|(k, _)| *k);
            match oldest_ended {
                Some(k) => {
                    self.background.remove(&k);
                }
                None => {
                    return Err((
                        ErrorCode::Busy,
                        format!("{MAX_BACKGROUND} background execs are running; end one first"),
                    ));
                }
            }
        }
        if let Some(size) = pty {
            size.validate()
                .map_err(|e| (ErrorCode::BadRequest, e.to_string()))?;
            l.env
                .entry("TERM".into())
                .or_insert_with(|| crate::proto::PTY_TERM.into());
        }
        // Framed: the output passes through the agent (it is kept here), so the program's
        // stdio are the agent's own pipes (or its terminal) whatever the channel. Passed:
        // the host's descriptors are the program's, and nothing is kept here.
        if stdio == StdioMode::Passed && self.fds.len() < 3 {
            return Err((
                ErrorCode::BadRequest,
                "passed stdio needs three descriptors with the request (a channel that \
                 cannot carry descriptors cannot pass them)"
                    .into(),
            ));
        }
        let mut run = self
            .launch(l)
            .map_err(|e| (ErrorCode::SpawnFailed, e.to_string()))?;
        // A background exec's reaper exits once it has reported: only a foreground exec's
        // serves the next one. Its job socket is kept until then: a reaper kept from the
        // last exec may still be readying itself (sending its next program's socket), and a
        // socket closed under it now would read as "not kept", so it would exit with this
        // job unread and the exec would end with no report.
        run.last = true;
        self.background.insert(
            id,
            Background {
                run: Some(run),
                out: if hold {
                    [Ring::held(), Ring::held()]
                } else {
                    Default::default()
                },
                exit: None,
            },
        );
        Ok(())
    }

    /// Answers [`Request::BgRead`].
    pub(super) fn read_background(
        &mut self,
        id: u64,
        from: [u64; 2],
        max: u64,
    ) -> Result<(), ProtoError> {
        let max = max.min(BACKGROUND_KEEP);
        let Some(bg) = self.background.get_mut(&id) else {
            return self.error(ErrorCode::NotFound, format!("no background exec {id}"));
        };
        bg.out[0].release(from[0]);
        bg.out[1].release(from[1]);
        let (out_from, mut body) = bg.out[0].read(from[0], max);
        let (err_from, err) = bg.out[1].read(from[1], max);
        let stdout_len = body.len() as u64;
        // The end is told only with the last bytes, so a reader that sees it has them all.
        let all_read = out_from + stdout_len == bg.out[0].end()
            && err_from + err.len() as u64 == bg.out[1].end();
        let exit = bg.exit.clone().filter(|_| all_read);
        body.extend_from_slice(&err);
        self.send(
            &Reply::BgOutput {
                stdout_from: out_from,
                stdout_len,
                stderr_from: err_from,
                exit,
            },
            &body,
        )
    }

    /// Answers [`Request::BgStdin`].
    pub(super) fn write_background(&mut self, id: u64, data: Vec<u8>) -> Result<(), ProtoError> {
        let queued = match self.background.get_mut(&id) {
            None => Err(format!("no background exec {id}")),
            Some(bg) if bg.exit.is_some() => Err(format!("background exec {id} has ended")),
            Some(bg) => match bg.run.as_mut().and_then(|r| r.framed.as_mut()) {
                Some(fr) if fr.stdin.is_some() && !fr.stdin_close => {
                    if fr.queue_stdin(data) {
                        Ok(())
                    } else {
                        Err("its stdin buffer is full; send less at a time".into())
                    }
                }
                _ => Err(format!("background exec {id}'s stdin is closed")),
            },
        };
        match queued {
            Ok(()) => self.send(&Reply::Ok, b""),
            Err(m) => self.error(ErrorCode::NotFound, m),
        }
    }

    /// Answers [`Request::BgSignal`]: the reaper passes a terminate on to every process of
    /// its namespace; a kill of the reaper takes the whole namespace with it.
    pub(super) fn signal_background(
        &mut self,
        id: u64,
        signal: ProcSignal,
    ) -> Result<(), ProtoError> {
        let Some(bg) = self.background.get(&id) else {
            return self.error(ErrorCode::NotFound, format!("no background exec {id}"));
        };
        if let Some(run) = &bg.run {
            let sig = match signal {
                ProcSignal::Term => Signal::SIGTERM,
                ProcSignal::Kill => Signal::SIGKILL,
            };
            let _ = kill(run.reaper, sig);
        }
        self.send(&Reply::Ok, b"")
    }

    /// Answers [`Request::BgRaise`]: the exec's reaper (PID 1 of its namespace, which
    /// takes no signal for its program from outside) is sent [`sys::RELAY_SIGNAL`] with the
    /// signal's number as its value, and passes that signal on to its program, or to every
    /// process of the exec.
    pub(super) fn raise_background(
        &mut self,
        id: u64,
        signal: i32,
        all: bool,
    ) -> Result<(), ProtoError> {
        if !(1..=64).contains(&signal) {
            return self.error(
                ErrorCode::BadRequest,
                format!("signal {signal} does not exist; give a number from 1 to 64"),
            );
        }
        let Some(bg) = self.background.get(&id) else {
            return self.error(ErrorCode::NotFound, format!("no background exec {id}"));
        };
        let Some(run) = &bg.run else {
            return self.error(
                ErrorCode::NotFound,
                format!("background exec {id} has ended"),
            );
        };
        match sys::relay_signal(run.reaper, signal, all) {
            Ok(()) => self.send(&Reply::Ok, b""),
            Err(e) => self.error(
                ErrorCode::Io,
                format!("signalling background exec {id}: {e}"),
            ),
        }
    }

    /// Answers [`Request::BgResize`]: TIOCSWINSZ on the exec's terminal, so its foreground
    /// process group gets `SIGWINCH`.
    pub(super) fn resize_background(
        &mut self,
        id: u64,
        size: cordon_core::PtySize,
    ) -> Result<(), ProtoError> {
        if let Err(e) = size.validate() {
            return self.error(ErrorCode::BadRequest, e.to_string());
        }
        let Some(bg) = self.background.get(&id) else {
            return self.error(ErrorCode::NotFound, format!("no background exec {id}"));
        };
        let master = bg
            .run
            .as_ref()
            .and_then(|r| r.framed.as_ref())
            .and_then(|fr| fr.tty.as_ref());
        // Where the kernel sends no SIGWINCH, the reaper passes one on to its namespace.
        let winch = self
            .cfg
            .winch_on_resize
            .then(|| bg.run.as_ref().map(|r| r.reaper))
            .flatten();
        let done = match master {
            Some(m) => sys::set_window_size(m, size)
                .map_err(|e| format!("resizing background exec {id}'s terminal: {e}"))
                .map(|()| {
                    if let Some(reaper) = winch {
                        let _ = kill(reaper, Signal::SIGWINCH);
                    }
                }),
            None if bg.exit.is_some() || bg.run.is_none() => {
                Err(format!("background exec {id} has ended"))
            }
            None => Err(format!("background exec {id} has no terminal")),
        };
        match done {
            Ok(()) => self.send(&Reply::Ok, b""),
            Err(m) => self.error(ErrorCode::BadRequest, m),
        }
    }

    /// Moves what background exec `id` wrote into its rings.
    pub(super) fn relay_background(&mut self, id: u64, which: usize) {
        if let Some(bg) = self.background.get_mut(&id)
            && let Some(data) = bg
                .run
                .as_mut()
                .and_then(|r| r.framed.as_mut())
                .and_then(|fr| fr.read_chunk(which))
        {
            bg.out[which].push(&data);
        }
    }

    pub(super) fn feed_background(&mut self, id: u64) {
        if let Some(fr) = self
            .background
            .get_mut(&id)
            .and_then(|bg| bg.run.as_mut())
            .and_then(|r| r.framed.as_mut())
        {
            fr.feed_stdin();
        }
    }

    /// A background exec's reaper reported (or died): the rest of its output and its end.
    pub(super) fn finish_background(&mut self, id: u64) {
        let Some(mut run) = self.background.get_mut(&id).and_then(|bg| bg.run.take()) else {
            return;
        };
        let rest = run.framed.as_mut().map(FramedIo::drain).unwrap_or_default();
        let ended = self.conclude(run);
        let Some(bg) = self.background.get_mut(&id) else {
            return;
        };
        for (stream, data) in rest {
            let i = if stream == Stream::Stdout { 0 } else { 1 };
            bg.out[i].push(&data);
        }
        bg.exit = Some(ProcExit {
            code: ended.report.code,
            signal: ended.report.signal,
            cpu_us: ended.report.cpu_us,
            max_rss_bytes: ended.report.max_rss_bytes,
            oom_killed: ended.oom_killed,
            pids_limited: ended.pids_limited,
            disk_full: ended.disk_full,
        });
    }
}
