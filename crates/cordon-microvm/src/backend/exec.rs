//! Running a program in the guest: its argv, environment and limits, the framed exec on the
//! agent channel, and the outcome (how it ended, what it used, what the VM's failure was).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cordon_core::{Error, ExecOutcome, ExecRequest, OutputSink, Result, Termination, Tier};
use cordon_guest::proto::{Request, StdioMode};
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
        cordon_host::agent::refuse_foreground_pty(req)?;
        let cordon_host::agent::ExecParts {
            argv,
            env,
            cwd,
            limits: proc_limits,
            pty: _,
        } = self.exec_parts(req)?;
        let limits = self.spec.limits.clone();
        let timeout = Duration::from_millis(req.timeout_ms.unwrap_or(limits.timeout_ms));
        let id = self.next_exec;
        self.next_exec += 1;
        let t0 = Instant::now();
        let request = Request::Exec {
            id,
            argv,
            env,
            cwd,
            stdio: StdioMode::Framed,
            limits: proc_limits,
            last: req.last,
        };
        let stdin = req.stdin.clone().unwrap_or_default();
        let plan = agent::FramedExec {
            id,
            request: &request,
            stdin: &stdin,
            deadline: t0 + timeout,
            stdout_cap: limits.stdout_bytes,
            stderr_cap: limits.stderr_bytes,
            // The wall clock ends the VM, not just the program.
            kill_at_deadline: false,
            kill_grace: Duration::from_secs(5),
            tick: Duration::from_millis(100),
        };
        let driven = agent::run_framed(self.ctrl()?, &plan, sink, &mut || None);
        let run = match driven {
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
        let exit = match run.ended {
            agent::Ended::Exited(exit) => Some(exit),
            agent::Ended::Abandoned => {
                self.gone = Some("its exec reached the timeout and the VM was killed".into());
                self.teardown();
                None
            }
            agent::Ended::KillUnanswered => {
                self.gone = Some("its agent did not answer a kill".into());
                self.teardown();
                None
            }
            agent::Ended::Lost(CallError::Timeout | CallError::Proto(_)) => {
                self.gone = Some("its agent channel failed during an exec".into());
                self.teardown();
                None
            }
            agent::Ended::Lost(_) => {
                self.diagnose("the agent channel closed during an exec");
                None
            }
        };
        let wall = t0.elapsed();
        let mut o = ExecOutcome::new(Tier::Microvm, Termination::Exited);
        o.stdout = run.stdout;
        o.stderr = run.stderr;
        o.stdout_truncated = run.stdout_truncated;
        o.stderr_truncated = run.stderr_truncated;
        o.warnings = self.warnings.clone();
        o.usage.wall_time_us = wall.as_micros() as u64;
        o.timings.run_us = wall.as_micros() as u64;
        o.extra.accelerator = Some(self.accel.as_str().to_string());
        let exit = exit.unwrap_or_default();
        // The guest's own clock measured the program: it is the guest's word, and a restored
        // guest's clock under emulation can run ahead of the host's. Never more than the exec
        // the host timed.
        o.timings.program_us = exit.program_us.min(o.timings.run_us);
        o.exit_code = exit.code;
        o.signal = exit.signal;
        o.usage.cpu_time_us = exit.cpu_us;
        o.usage.peak_memory_bytes = exit.max_rss_bytes;
        o.termination = cordon_core::classify(&seen);
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
        Ok(o)
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
    /// Starts `req` in the background for a host that relays its output to a reader of its
    /// own (cordon-oci): its output is held in the agent until read, never dropped (the
    /// program waits on its pipe instead), and it runs as `user` when one is given.
    pub fn start_relayed(
        &mut self,
        req: &ExecRequest,
        user: Option<cordon_guest::proto::ProcUser>,
    ) -> Result<u64> {
        self.ctrl()?;
        let parts = self.exec_parts(req)?;
        let id = self.next_exec;
        self.next_exec += 1;
        let mut request = parts.background(id);
        if let cordon_guest::proto::Request::BgExec {
            hold, user: who, ..
        } = &mut request
        {
            *hold = true;
            *who = user;
        }
        self.file_call("a background exec", |io| {
            cordon_host::procs::start(io, &request)
        })?;
        Ok(id)
    }

    /// Sends signal number `signal` to background exec `id`'s program (`all`: to every
    /// process of it), as itself.
    pub fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        self.file_call("a background exec", |io| {
            cordon_host::procs::raise(io, id, signal, all)
        })
    }
}
