//! How an exec ended: one classification for every tier (container, gvisor and microvm
//! through their agents, wasm from its guest's end) and for background execs.
//!
//! Each tier only gathers the [`Evidence`] in its own way (the agent's report, cgroup
//! counters, a log of refused forks, a look at the workspace) and asks [`classify`] what it
//! means; the precedence lives here, once, so the tiers cannot disagree about a row.

use crate::{ProcExit, Termination};

/// The signal a process gets for writing past its file-size limit (`RLIMIT_FSIZE`): 25 on
/// Linux for every architecture Cordon builds for (x86_64, aarch64).
const SIGXFSZ: i32 = 25;

/// The end of a program as the sandbox's agent reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitReport {
    /// The program's exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

impl ExitReport {
    /// The program exited by itself with code 0.
    pub fn clean(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }
}

/// What a tier observed of one exec's end. Every field is a fact the tier saw, not a
/// conclusion; [`classify`] draws the conclusion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Cordon's own reason to stop the program, decided while it ran: the deadline
    /// ([`Termination::Timeout`]), an output cap ([`Termination::OutputLimit`]), the client
    /// gone ([`Termination::Cancelled`]) or the tier's watch (a fork bomb,
    /// [`Termination::ProcessLimit`]). The first reason seen; what followed the stop (the
    /// kill's signal, a lost agent) is its consequence.
    pub stopped: Option<Termination>,
    /// The program's end as the agent reported it; `None` when the agent reported no end: its
    /// channel closed or failed, it did not answer a kill, or the sandbox around it ended
    /// (the agent was lost).
    pub reported: Option<ExitReport>,
    /// The kernel killed a process of this exec (the program, a child of it, or the sandbox
    /// process that held them) for the memory limit.
    pub oom_killed: bool,
    /// The process limit refused a fork during this exec.
    pub forks_refused: bool,
    /// The workspace (or a writable volume) was full after the exec.
    pub disk_full: bool,
}

impl Evidence {
    /// A background exec's end as evidence: `stopped` when a client's stop was asked for
    /// (a signal that then ended it is Cordon's stop, [`Termination::Killed`]; an exec that
    /// outlived the stop and exited by itself was not stopped).
    pub fn of_background(exit: &ProcExit, stopped: bool) -> Self {
        Evidence {
            stopped: (stopped && exit.signal.is_some()).then_some(Termination::Killed),
            reported: Some(ExitReport {
                code: exit.code,
                signal: exit.signal,
            }),
            oom_killed: exit.oom_killed,
            forks_refused: exit.pids_limited,
            disk_full: exit.disk_full,
        }
    }

    /// The agent reported no end of the program.
    pub fn agent_lost(&self) -> bool {
        self.reported.is_none()
    }
}

/// How an exec ended, from what was observed. One precedence, first match wins:
///
/// 1. **Cordon stopped it** ([`Evidence::stopped`]): that reason. The stop caused what
///    followed (a kill signal, an agent that did not answer the kill).
/// 2. **An OOM kill** during the exec: [`Termination::OutOfMemory`], however the main
///    process ended (a child killed for memory counts too) and *even when the agent was lost
///    with it*: the memory limit is what ended the exec, the agent (or the runsc sentry, or
///    the VM) dying is its consequence, not a failure of the sandbox machinery.
/// 3. **A refused fork** during the exec: [`Termination::ProcessLimit`], however the main
///    process ended (a fork bomb) and even when the program never started.
/// 4. **The disk**: the program died of `SIGXFSZ`, or the workspace was full and the program
///    did not exit cleanly: [`Termination::DiskLimit`]. A full disk after a clean exit is
///    the program's business.
/// 5. **The agent lost** with nothing above to explain it: [`Termination::SandboxFailure`].
/// 6. **A signal** in the report: [`Termination::Signalled`].
/// 7. Otherwise the program exited by itself: [`Termination::Exited`].
///
/// [`Termination::Killed`] comes only as a stop: a background exec a client's signal ended
/// (the server's process table); no tier observes a foreground exec killed on request
/// apart from losing its agent. The wasm tier's evidence is its guest's end: a trap is a
/// reported signal, a host error a lost agent, a full resource table a refused fork.
pub fn classify(e: &Evidence) -> Termination {
    let clean = e.reported.is_some_and(|r| r.clean());
    let signal = e.reported.and_then(|r| r.signal);
    if let Some(stop) = e.stopped {
        stop
    } else if e.oom_killed {
        Termination::OutOfMemory
    } else if e.forks_refused {
        Termination::ProcessLimit
    } else if signal == Some(SIGXFSZ) || (e.disk_full && !clean) {
        Termination::DiskLimit
    } else if e.agent_lost() {
        Termination::SandboxFailure
    } else if signal.is_some() {
        Termination::Signalled
    } else {
        Termination::Exited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> Option<ExitReport> {
        Some(ExitReport {
            code: Some(code),
            signal: None,
        })
    }

    fn signalled(signal: i32) -> Option<ExitReport> {
        Some(ExitReport {
            code: None,
            signal: Some(signal),
        })
    }

    const LOST: Option<ExitReport> = None;

    use Termination as T;

    /// The specification of how an exec ends, for every tier that calls [`classify`].
    #[test]
    fn classification_table() {
        let timeout = Some(T::Timeout);
        let output = Some(T::OutputLimit);
        let cancelled = Some(T::Cancelled);
        let bomb = Some(T::ProcessLimit);
        #[rustfmt::skip]
        let rows = [
            //   name                                        stopped    reported       oom    forks  disk   want
            ("clean exit",                                None,      exited(0),     false, false, false, T::Exited),
            ("nonzero exit",                              None,      exited(7),     false, false, false, T::Exited),
            ("signal exit",                               None,      signalled(15), false, false, false, T::Signalled),
            ("SIGKILL from outside Cordon",               None,      signalled(9),  false, false, false, T::Signalled),
            // Each reason alone.
            ("timeout",                                   timeout,   signalled(9),  false, false, false, T::Timeout),
            ("timeout, no kill asked (the VM ended)",     timeout,   LOST,          false, false, false, T::Timeout),
            ("output cap",                                output,    signalled(9),  false, false, false, T::OutputLimit),
            ("client gone",                               cancelled, signalled(9),  false, false, false, T::Cancelled),
            ("fork bomb stopped by the watch",            bomb,      signalled(9),  false, true,  false, T::ProcessLimit),
            ("oom kill of the program",                   None,      signalled(9),  true,  false, false, T::OutOfMemory),
            ("refused fork, program gave up",             None,      exited(1),     false, true,  false, T::ProcessLimit),
            ("SIGXFSZ",                                   None,      signalled(SIGXFSZ), false, false, false, T::DiskLimit),
            ("disk full, program failed",                 None,      exited(1),     false, false, true,  T::DiskLimit),
            ("agent lost alone",                          None,      LOST,          false, false, false, T::SandboxFailure),
            // The disputed row: the memory limit ended the exec, the agent died of it.
            ("oom kill + agent lost",                     None,      LOST,          true,  false, false, T::OutOfMemory),
            // A process of the exec was killed or refused, the main one survived.
            ("oom kill of a child, clean exit",           None,      exited(0),     true,  false, false, T::OutOfMemory),
            ("refused fork, clean exit",                  None,      exited(0),     false, true,  false, T::ProcessLimit),
            ("refused fork, program never started",       None,      LOST,          false, true,  false, T::ProcessLimit),
            ("disk full, clean exit",                     None,      exited(0),     false, false, true,  T::Exited),
            ("disk full + agent lost",                    None,      LOST,          false, false, true,  T::DiskLimit),
            // Cordon's stop wins over what followed it.
            ("timeout + oom kill",                        timeout,   signalled(9),  true,  false, false, T::Timeout),
            ("timeout + refused forks",                   timeout,   signalled(9),  false, true,  false, T::Timeout),
            ("timeout + agent lost (kill unanswered)",    timeout,   LOST,          false, false, false, T::Timeout),
            ("output cap + nonzero exit",                 output,    exited(1),     false, false, false, T::OutputLimit),
            ("output cap + clean exit",                   output,    exited(0),     false, false, false, T::OutputLimit),
            ("output cap + disk full",                    output,    exited(1),     false, false, true,  T::OutputLimit),
            ("client gone + oom kill",                    cancelled, LOST,          true,  false, false, T::Cancelled),
            // Between the limits: memory, then processes, then disk.
            ("oom kill + refused forks",                  None,      signalled(9),  true,  true,  false, T::OutOfMemory),
            ("oom kill + disk full",                      None,      exited(1),     true,  false, true,  T::OutOfMemory),
            ("refused forks + SIGXFSZ",                   None,      signalled(SIGXFSZ), false, true, false, T::ProcessLimit),
            ("refused forks + disk full",                 None,      exited(1),     false, true,  true,  T::ProcessLimit),
            ("SIGXFSZ + disk full",                       None,      signalled(SIGXFSZ), false, false, true, T::DiskLimit),
        ];
        let mut wrong = Vec::new();
        for (name, stopped, reported, oom_killed, forks_refused, disk_full, want) in rows {
            let got = classify(&Evidence {
                stopped,
                reported,
                oom_killed,
                forks_refused,
                disk_full,
            });
            if got != want {
                wrong.push(format!("{name}: {got:?}, want {want:?}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "rows classified wrong:\n{}",
            wrong.join("\n")
        );
    }

    /// Every combination of the evidence, checked against the precedence's rules (the table
    /// above names the rows; this makes sure no combination between them breaks a rule).
    #[test]
    fn every_combination_follows_the_precedence() {
        let stops = [
            None,
            Some(T::Timeout),
            Some(T::OutputLimit),
            Some(T::Cancelled),
            Some(T::ProcessLimit),
        ];
        let reports = [
            LOST,
            exited(0),
            exited(1),
            signalled(9),
            signalled(15),
            signalled(SIGXFSZ),
            // An exit code of 0 with a signal is not clean.
            Some(ExitReport {
                code: Some(0),
                signal: Some(9),
            }),
        ];
        let mut seen = 0;
        for stopped in stops {
            for reported in reports {
                for bits in 0..8u8 {
                    let e = Evidence {
                        stopped,
                        reported,
                        oom_killed: bits & 1 != 0,
                        forks_refused: bits & 2 != 0,
                        disk_full: bits & 4 != 0,
                    };
                    let t = classify(&e);
                    seen += 1;
                    if let Some(s) = stopped {
                        assert_eq!(t, s, "{e:?}");
                        continue;
                    }
                    // Nothing but a limit's evidence or a lost agent yields a limit or a
                    // failure, and a lost agent is never Exited or Signalled.
                    assert_eq!(t == T::OutOfMemory, e.oom_killed, "{e:?}");
                    assert_eq!(
                        t == T::ProcessLimit,
                        e.forks_refused && !e.oom_killed,
                        "{e:?}"
                    );
                    assert!(t != T::Timeout && t != T::Cancelled && t != T::OutputLimit);
                    assert!(t != T::Killed, "{e:?}");
                    if e.agent_lost() {
                        assert!(
                            !matches!(t, T::Exited | T::Signalled),
                            "a lost agent reported as the program's own end: {e:?}"
                        );
                    }
                    if t == T::SandboxFailure {
                        assert!(e.agent_lost(), "{e:?}");
                    }
                    if reported.is_some_and(|r| r.clean()) {
                        assert!(
                            matches!(t, T::Exited | T::OutOfMemory | T::ProcessLimit),
                            "{e:?}"
                        );
                    }
                }
            }
        }
        assert_eq!(seen, 5 * 7 * 8);
    }

    /// A background exec's end goes through the one classification with its own evidence:
    /// a full disk it failed on is the disk limit (it was reported `exited` before: its disk
    /// was never looked at), a client's stop that ended it is `killed`, one it outlived is
    /// not.
    #[test]
    fn a_background_end_is_classified_as_a_foreground_one() {
        let end = |code: Option<i32>, signal: Option<i32>| ProcExit {
            code,
            signal,
            ..ProcExit::default()
        };
        let full = ProcExit {
            disk_full: true,
            ..end(Some(1), None)
        };
        assert_eq!(
            classify(&Evidence::of_background(&full, false)),
            T::DiskLimit
        );
        let full_but_clean = ProcExit {
            disk_full: true,
            ..end(Some(0), None)
        };
        assert_eq!(
            classify(&Evidence::of_background(&full_but_clean, false)),
            T::Exited
        );
        assert_eq!(
            classify(&Evidence::of_background(&end(None, Some(15)), true)),
            T::Killed
        );
        assert_eq!(
            classify(&Evidence::of_background(&end(None, Some(15)), false)),
            T::Signalled
        );
        assert_eq!(
            classify(&Evidence::of_background(&end(Some(0), None), true)),
            T::Exited
        );
        let oom = ProcExit {
            oom_killed: true,
            ..end(None, Some(9))
        };
        assert_eq!(
            classify(&Evidence::of_background(&oom, false)),
            T::OutOfMemory
        );
        // A stop asked for wins over what followed it, as in the foreground.
        assert_eq!(classify(&Evidence::of_background(&oom, true)), T::Killed);
    }
}
