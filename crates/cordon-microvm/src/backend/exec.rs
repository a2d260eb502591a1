//! Running a program in the guest: its argv, environment and limits, the framed exec on the
//! agent channel, and the outcome (how it ended, what it used, what the VM's failure was).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cordon_core::{Error, ExecOutcome, ExecRequest, OutputSink, Result, Termination, Tier};
use cordon_guest::proto::StdioMode;
use cordon_host::agent::{self, CallError};
use cordon_host::egress as shared_egress;

use super::state::MicrovmSandbox;

impl MicrovmSandbox {
    pub(super) fn env_for(&self, req: &ExecRequest) -> BTreeMap<String, String> {
        let tier_env = self.egress.iter().flat_map(|e| e.link.env());
        cordon_core::sandbox_env(&self.spec, tier_env, req)
    }

    /// The argv, environment, working directory and per-process limits of an exec (a
    /// template without the exec's interpreter refuses it here, foreground or background).
    pub(super) fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
        let limits = cordon_host::agent::ExecParts::workspace_limits(&self.spec.limits);
        cordon_host::agent::ExecParts::new(
            req,
            &self.spec,
            (Tier::Microvm, false),
            self.env_for(req),
            limits,
        )
    }

    /// `Sandbox::exec`: a gone sandbox refuses it before anything else.
    pub(super) fn run_exec(
        &mut self,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecOutcome> {
        self.ctrl()?;
        let id = self.next_exec;
        let exec = self.exec_parts(req)?.foreground(
            req,
            (id, StdioMode::Framed, req.last),
            &self.spec.limits,
        )?;
        self.next_exec += 1;
        let t0 = Instant::now();
        let plan = exec.plan(
            t0,
            agent::Ending {
                // The wall clock ends the VM, not just the program.
                kill_at_deadline: false,
                kill_grace: Duration::from_secs(5),
                tick: Duration::from_millis(100),
            },
        );
        let run = match agent::run_framed(self.ctrl()?, &plan, sink, &mut || None) {
            Ok(run) => run,
            Err(e @ agent::ExecError::Protocol(_)) => {
                self.failure = Some("agent-protocol".into());
                self.gone = Some(format!("its agent broke the protocol: {e}"));
                self.teardown();
                return Err(Error::failed("the guest agent broke the protocol", e));
            }
            Err(e @ (agent::ExecError::SpawnFailed(_) | agent::ExecError::Refused(_))) => {
                return Err(Error::failed("starting the exec", e));
            }
        };
        // What the driver and the guest agent saw (the agent reads the exec's own cgroup in
        // the guest: OOM kills and refused forks come with its report).
        let mut seen = run.evidence();
        if seen.agent_lost() {
            // QEMU is the only process of its cgroup, made with the VM: an OOM kill counted
            // there is the memory limit ending the VM, and the agent with it. Read before a
            // teardown removes the cgroup.
            seen.oom_killed |= self
                .cgroup
                .as_ref()
                .is_some_and(|c| c.counters().oom_kills > 0);
        }
        let exit = self.exit_of(&run.ended);
        Ok(self.outcome(run, exit.unwrap_or_default(), &seen, t0.elapsed()))
    }

    /// The program's exit as the agent reported it; none when the exec ended the VM (its
    /// timeout, an agent that did not answer a kill, a failed channel), which is then torn
    /// down, or the channel closed (diagnosed).
    fn exit_of(&mut self, ended: &agent::Ended) -> Option<agent::Exit> {
        let gone = match ended {
            agent::Ended::Exited(exit) => return Some(exit.clone()),
            agent::Ended::Abandoned => "its exec reached the timeout and the VM was killed",
            agent::Ended::KillUnanswered => "its agent did not answer a kill",
            agent::Ended::Lost(CallError::Timeout | CallError::Proto(_)) => {
                "its agent channel failed during an exec"
            }
            agent::Ended::Lost(_) => {
                self.diagnose("the agent channel closed during an exec");
                return None;
            }
        };
        self.gone = Some(gone.into());
        self.teardown();
        None
    }

    /// The exec's outcome from what the driver kept, the program's `exit`, the evidence
    /// `seen` and the `wall` time the host measured.
    fn outcome(
        &mut self,
        run: agent::FramedRun,
        exit: agent::Exit,
        seen: &cordon_core::Evidence,
        wall: Duration,
    ) -> ExecOutcome {
        let mut o = ExecOutcome::new(Tier::Microvm, Termination::Exited);
        o.stdout = run.stdout;
        o.stderr = run.stderr;
        o.stdout_truncated = run.stdout_truncated;
        o.stderr_truncated = run.stderr_truncated;
        o.warnings = self.warnings.clone();
        o.usage.wall_time_us = wall.as_micros() as u64;
        o.timings.run_us = wall.as_micros() as u64;
        o.extra.accelerator = Some(self.accel.as_str().to_string());
        // The guest's own clock measured the program: it is the guest's word, and a restored
        // guest's clock under emulation can run ahead of the host's. Never more than the exec
        // the host timed.
        o.timings.program_us = exit.program_us.min(o.timings.run_us);
        o.exit_code = exit.code;
        o.signal = exit.signal;
        o.usage.cpu_time_us = exit.cpu_us;
        o.usage.peak_memory_bytes = exit.max_rss_bytes;
        o.termination = cordon_core::classify(seen);
        shared_egress::scan_outcome(&mut o, self.egress.as_mut().map(|e| &mut e.link));
        if o.termination == Termination::OutOfMemory && seen.agent_lost() {
            o.warnings.push(
                "the microVM's memory limit ended it (QEMU was killed for memory); destroy this sandbox and create another"
                    .into(),
            );
        }
        if o.termination == Termination::SandboxFailure {
            let why = self.gone.clone().unwrap_or_else(|| "unknown".into());
            o.warnings.push(format!("the microVM failed: {why}"));
            if let Some(f) = &self.failure {
                o.extra.failure = Some(f.clone());
            }
        }
        o
    }
}

impl MicrovmSandbox {
    /// `Sandbox::start_background`.
    pub(super) fn start_background_exec(&mut self, req: &ExecRequest) -> Result<u64> {
        self.ctrl()?;
        let parts = self.exec_parts(req)?;
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.background(id);
        self.file_call("a background exec", |io| {
            cordon_host::procs::start(io, &request)
        })?;
        Ok(id)
    }
}

impl MicrovmSandbox {
    /// `Sandbox::start_relayed`.
    pub(super) fn start_relayed_exec(
        &mut self,
        req: &ExecRequest,
        user: Option<cordon_guest::proto::ProcUser>,
    ) -> Result<u64> {
        self.ctrl()?;
        let parts = self.exec_parts(req)?;
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.relayed(id, user);
        self.file_call("a background exec", |io| {
            cordon_host::procs::start(io, &request)
        })?;
        Ok(id)
    }
}
