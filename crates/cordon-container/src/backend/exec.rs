//! Foreground execs: the request, the framed run and the outcome with the cgroup's counters.

use std::time::{Duration, Instant};

use cordon_core::{Error, ExecOutcome, ExecRequest, OutputSink, Result, Termination, Tier};
use cordon_guest::proto::StdioMode;
use cordon_host::agent;

use crate::cgroup::Counters;

use super::ContainerSandbox;

impl ContainerSandbox {
    /// The argv, environment, working directory and per-process limits of an exec.
    pub(super) fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
        let mut limits = cordon_host::agent::ExecParts::workspace_limits(&self.spec.limits);
        if self
            .spec
            .resolved_template
            .as_ref()
            .is_some_and(|t| t.writable)
        {
            // A build's root is a file system of the build's own size (`--disk`): it answers
            // ENOSPC itself, and a file as large as it (a sparse one larger) is the step's.
            limits.file_size = u64::MAX;
        }
        cordon_host::agent::ExecParts::new(
            req,
            &self.spec,
            (Tier::Container, true),
            self.env_for(req),
            limits,
        )
    }

    pub(super) fn run_exec(
        &mut self,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecOutcome> {
        let id = self.next_exec;
        // The program's stdio are pipes whose ends go to the agent with the request: its
        // output never passes through the agent.
        let exec = self.exec_parts(req)?.foreground(
            req,
            (id, StdioMode::Passed, req.last),
            &self.spec.limits,
        )?;
        self.next_exec += 1;
        let before = self.cgroup.as_ref().map(|c| {
            c.reset_peak();
            c.counters()
        });
        let t0 = Instant::now();
        let plan = exec.plan(
            t0,
            agent::Ending {
                kill_at_deadline: true,
                // A program that will not die, or an agent that stopped answering, ends the
                // sandbox.
                kill_grace: Duration::from_secs(3),
                // The process limit's refusals are watched this often.
                tick: Duration::from_millis(20),
            },
        );
        let (driven, pids_hit) = self.drive(&plan, sink, before.as_ref())?;
        match driven {
            Ok(run) => Ok(self.outcome(run, t0, before.as_ref())),
            Err(e) => self.ended_early(e, pids_hit),
        }
    }

    /// Runs the exec through the agent, watching the cgroup's refused forks; says whether
    /// the process limit refused a fork during it.
    fn drive(
        &mut self,
        plan: &agent::FramedExec<'_>,
        sink: &mut dyn OutputSink,
        before: Option<&Counters>,
    ) -> Result<(
        std::result::Result<agent::FramedRun, agent::ExecError>,
        bool,
    )> {
        let cgroup = self.cgroup.as_ref();
        let pids_hit = || match (cgroup, before) {
            (Some(cg), Some(b)) => cg.pids_refusals() > b.pids_max_hits,
            _ => false,
        };
        // The driver calls the watch whenever it wakes; the counter is read at most every
        // 20 ms, so a chatty program does not pay a cgroupfs read per chunk of output.
        let mut last_look = Instant::now();
        let mut fork_refused = || {
            let now = Instant::now();
            if now.duration_since(last_look) < Duration::from_millis(20) {
                return None;
            }
            last_look = now;
            pids_hit().then_some(Termination::ProcessLimit)
        };
        let Some(conn) = self.ctrl.as_mut().filter(|_| self.gone.is_none()) else {
            return Err(self.gone_error());
        };
        let driven = agent::run_framed(conn, plan, sink, &mut fork_refused);
        Ok((driven, pids_hit()))
    }

    /// An exec the driver could not run to an end: a fork the process limit refused is the
    /// exec's outcome, a broken protocol ends the sandbox.
    fn ended_early(&mut self, e: agent::ExecError, pids_hit: bool) -> Result<ExecOutcome> {
        match e {
            agent::ExecError::SpawnFailed(message) if pids_hit => {
                // The program never started: the refused fork is what ended the exec.
                let seen = cordon_core::Evidence {
                    forks_refused: true,
                    ..cordon_core::Evidence::default()
                };
                let mut o = ExecOutcome::new(Tier::Container, cordon_core::classify(&seen));
                o.stderr = format!("cordon: {message}\n").into_bytes();
                Ok(o)
            }
            e @ (agent::ExecError::SpawnFailed(_) | agent::ExecError::Refused(_)) => {
                Err(Error::failed("starting the exec", e))
            }
            e @ agent::ExecError::Protocol(_) => {
                self.gone = Some(format!("its agent broke the protocol ({e})"));
                self.teardown();
                Err(Error::failed("malformed frame from the sandbox agent", e))
            }
        }
    }

    /// The outcome of a run the driver saw to its end, with the cgroup's counters since
    /// `before` and the scan of what leaves the sandbox.
    fn outcome(
        &mut self,
        run: agent::FramedRun,
        t0: Instant,
        before: Option<&Counters>,
    ) -> ExecOutcome {
        // What the driver and the agent saw; the sandbox's cgroup adds its counters below.
        let mut seen = run.evidence();
        let exited = match run.ended {
            agent::Ended::Exited(exit) => Some(exit),
            agent::Ended::KillUnanswered | agent::Ended::Abandoned => {
                self.gone = Some("its agent did not answer a kill".into());
                self.teardown();
                None
            }
            agent::Ended::Lost(e) => {
                self.gone = Some(format!("its agent exited ({e})"));
                None
            }
        };
        let wall = t0.elapsed();
        let after = self.cgroup.as_ref().map(|c| c.counters());
        let mut o = ExecOutcome::new(Tier::Container, Termination::Exited);
        o.stdout = run.stdout;
        o.stderr = run.stderr;
        o.stdout_truncated = run.stdout_truncated;
        o.stderr_truncated = run.stderr_truncated;
        o.weakened = self.weakened.clone();
        o.warnings = self.warnings.clone();
        o.usage.wall_time_us = wall.as_micros() as u64;
        o.timings.run_us = wall.as_micros() as u64;
        let (mut agent_cpu, mut rss) = (0, 0);
        if let Some(exit) = exited {
            o.timings.program_us = exit.program_us;
            o.exit_code = exit.code;
            o.signal = exit.signal;
            agent_cpu = exit.cpu_us;
            rss = exit.max_rss_bytes;
        }
        match (before, &after) {
            (Some(b), Some(a)) => {
                o.usage.cpu_time_us = match (a.cpu_us, b.cpu_us) {
                    (Some(a), Some(b)) => a.saturating_sub(b),
                    _ => agent_cpu,
                };
                o.usage.peak_memory_bytes = a.peak_memory.max(rss);
                // The sandbox's cgroup counted an OOM kill or a refused fork during this
                // exec (of any of its processes, not only the main one).
                seen.oom_killed |= a.oom_kills > b.oom_kills;
                seen.forks_refused |= a.pids_max_hits > b.pids_max_hits;
            }
            _ => {
                o.usage.cpu_time_us = agent_cpu;
                o.usage.peak_memory_bytes = rss;
            }
        }
        o.termination = cordon_core::classify(&seen);
        // Everything leaving the sandbox is scanned: known secrets redacted, credential
        // formats flagged.
        crate::egress::scan_outcome(&mut o, self.egress.as_mut());
        if o.termination == Termination::SandboxFailure {
            o.warnings.push(format!(
                "the sandbox failed: {}",
                self.gone.clone().unwrap_or_else(|| "unknown".into())
            ));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Core's classification names the file-size signal by number: it must be this host's.
    #[test]
    fn the_file_size_signal_is_the_disk_limit() {
        let seen = cordon_core::Evidence {
            reported: Some(cordon_core::ExitReport {
                code: None,
                signal: Some(libc::SIGXFSZ),
            }),
            ..cordon_core::Evidence::default()
        };
        assert_eq!(cordon_core::classify(&seen), Termination::DiskLimit);
    }
}
