//! The `Sandbox` impl: each verb of the tier, over the modules below.

use std::time::{Duration, Instant};

use cordon_core::{
    Error, ExecOutcome, ExecRequest, FileTarget, OutputSink, Result, Sandbox, SandboxId,
    Termination, Tier, classify_sandbox_path, validate_sandbox_path,
};
use cordon_guest::proto::StdioMode;
use cordon_host::agent;
use cordon_host::cgroup::Counters;

use crate::{GvisorSandbox, NPROC_GRACE, NPROC_SYNC, reap, workspace};

impl Sandbox for GvisorSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        if self.destroyed {
            return Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            });
        }
        let id = self.next_exec;
        let exec = self.exec_parts(req)?.foreground(
            req,
            (id, StdioMode::Framed, false),
            &self.spec.limits,
        )?;
        let t0 = Instant::now();
        let restarted = self.ensure_live()?;
        self.next_exec += 1;
        let plan = exec.plan(
            t0,
            agent::Ending {
                kill_at_deadline: true,
                kill_grace: Duration::from_secs(3),
                tick: Duration::from_millis(100),
            },
        );
        let Some(live) = self.live.as_mut() else {
            return Err(Error::Sandbox("the gvisor sandbox is not running".into()));
        };
        let before = live.cgroup.as_ref().map(|c| {
            c.reset_peak();
            c.counters()
        });
        live.watch.reset();
        let watch = &live.watch;
        let mut fork_bomb = || {
            let r = watch.refusals();
            let now = Instant::now();
            // Forks are still being refused long after the first refusal: a fork bomb.
            (r.first
                .is_some_and(|f| now.duration_since(f) >= NPROC_GRACE)
                && r.last
                    .is_some_and(|l| now.duration_since(l) < NPROC_GRACE / 2))
            .then_some(Termination::ProcessLimit)
        };
        let driven = agent::run_framed(&mut live.conn, &plan, sink, &mut fork_bomb);
        // A program that did not exit 0 may have ended at a refused fork, which the log
        // reader may not have read yet: it catches up first (a clean exit skips the wait).
        let clean = matches!(&driven, Ok(r) if matches!(&r.ended, agent::Ended::Exited(e) if e.code == Some(0)));
        if !clean {
            live.watch.sync(NPROC_SYNC);
        }
        let refused = live.watch.refusals().count;
        let after = live.cgroup.as_ref().map(|c| c.counters());
        let run = match driven {
            Ok(run) => run,
            Err(e @ agent::ExecError::SpawnFailed(_)) => {
                return Err(Error::failed("starting the exec", e));
            }
            Err(e) => {
                let detail = self.stop_live();
                tracing::warn!(sandbox = %self.id, "gvisor: {e}; runsc said: {detail}");
                return Err(Error::failed(
                    "the sandbox agent failed (the next exec starts the sandbox again)",
                    e,
                ));
            }
        };
        Ok(self.outcome(run, refused > 0, (before, after), t0, restarted))
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        if let FileTarget::Outside(_) = classify_sandbox_path(path, false)? {
            return self.outside_call(|io| cordon_host::files::put_file(io, path, mode, data));
        }
        validate_sandbox_path(path)?;
        self.take_events();
        self.workspace()?
            .put(path, mode, data)
            .map_err(|(code, message)| cordon_host::agent::file_error(path, code, message))
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let (data, truncated) = match classify_sandbox_path(path, false)? {
            FileTarget::Outside(_) => {
                self.outside_call(|io| cordon_host::files::get_file(io, path, max_bytes))?
            }
            FileTarget::Workspace(_) => self
                .workspace()?
                .get(path, max_bytes)
                .map_err(|(code, message)| cordon_host::agent::file_error(path, code, message))?,
        };
        if truncated {
            return Err(Error::File {
                path: path.into(),
                reason: format!(
                    "larger than the {max_bytes}-byte limit for files out; raise it or write less"
                ),
            });
        }
        let (clean, found) = cordon_host::egress::scan_file(self.egress.as_ref(), path, &data);
        self.file_findings.extend(found);
        Ok(clean)
    }

    fn gauge(&self) -> Option<std::sync::Arc<dyn cordon_core::Gauge>> {
        let cg = self.live.as_ref()?.cgroup.as_ref()?;
        Some(std::sync::Arc::new(cg.gauge(
            cordon_host::cgroup::gauge::Workspace::Host(self.work.clone()),
        )))
    }

    fn watch(&mut self, op: &cordon_core::WatchOp) -> Result<cordon_core::WatchReply> {
        self.workspace()?;
        if self.watches.is_none() {
            self.watches = Some(crate::watching::HostWatches::open(&self.work, self.uid)?);
        }
        match self.watches.as_mut() {
            Some(w) => w.handle(op),
            None => Err(cordon_core::Feature::Watch.unsupported_here("watching a directory")),
        }
    }

    fn file_op(&mut self, op: &cordon_core::FileOp) -> Result<cordon_core::FileReply> {
        let mut outside = false;
        for p in op.paths() {
            outside |= matches!(classify_sandbox_path(p, true)?, FileTarget::Outside(_));
        }
        if outside {
            return self.outside_call(|io| cordon_host::files::file_op(io, op));
        }
        self.take_events();
        self.workspace()?
            .op(op)
            .map_err(|(code, message)| cordon_host::agent::file_error(op.path(), code, message))
    }

    fn put_archive(
        &mut self,
        dir: &str,
        tar: &mut dyn std::io::Read,
    ) -> Result<cordon_core::ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        self.take_events();
        // /work is a tmpfs of the disk limit on the host: it stops a larger archive too.
        let budget = self.spec.limits.disk_bytes;
        self.workspace()?
            .unpack(dir, tar, budget)
            .map_err(|(code, message)| cordon_host::agent::file_error(dir, code, message))
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<cordon_core::ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        cordon_host::files::refuse_unscanned(&self.spec, dir)?;
        self.workspace()?
            .pack(dir, max_bytes, out)
            .map_err(|(code, message)| cordon_host::agent::file_error(dir, code, message))
    }

    fn snapshot(
        &mut self,
        mode: cordon_core::SnapshotMode,
        dir: &cordon_core::SnapshotDir,
    ) -> Result<cordon_core::SnapshotImage> {
        match mode {
            cordon_core::SnapshotMode::Full => self.snapshot_full(dir),
            cordon_core::SnapshotMode::Filesystem => self.snapshot_files(dir),
        }
    }

    fn pause(&mut self) -> Result<()> {
        self.runsc_on_live("pause")
    }

    fn resume(&mut self) -> Result<()> {
        self.runsc_on_live("resume")
    }

    /// The live runsc sandbox's cgroup (the sentry and its gofer, whose memory is the
    /// workload's), and the limits of every later start.
    fn resize(&mut self, memory_bytes: u64, cpus: f64) -> Result<()> {
        if let Some(cg) = self.live.as_ref().and_then(|l| l.cgroup.as_ref()) {
            cg.resize(memory_bytes, cpus)?;
        }
        self.spec.limits.memory_bytes = memory_bytes;
        self.spec.limits.cpus = cpus;
        Ok(())
    }

    fn start_background(&mut self, req: &ExecRequest) -> Result<u64> {
        let parts = self.exec_parts(req)?;
        if self.destroyed {
            return Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            });
        }
        if self
            .live
            .as_mut()
            .is_none_or(|l| !matches!(l.runsc.try_wait(), Ok(None)))
        {
            self.stop_live();
            self.start_live()?;
        }
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.background(id);
        self.bg_call(|io| cordon_host::procs::start(io, &request))?;
        Ok(id)
    }

    fn read_background(
        &mut self,
        id: u64,
        from: [u64; 2],
        max: u64,
    ) -> Result<cordon_core::ProcOutput> {
        let mut out = self.bg_call(|io| cordon_host::procs::read(io, id, from, max))?;
        // The disk as a foreground exec's end measures it (the sentry's view of the
        // workspace is not the host's).
        if let Some(exit) = out.exit.as_mut() {
            exit.disk_full |= self.disk_full();
        }
        Ok(out)
    }

    fn write_background(&mut self, id: u64, data: &[u8]) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::write(io, id, data))
    }

    fn resize_background(&mut self, id: u64, size: cordon_core::PtySize) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::resize(io, id, size))
    }

    fn start_relayed(
        &mut self,
        req: &ExecRequest,
        user: Option<cordon_core::ProcUser>,
    ) -> Result<u64> {
        let parts = self.exec_parts(req)?;
        self.running_live(|| {
            "the gvisor sandbox is not running; create the container again".into()
        })?;
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.relayed(id, user);
        self.bg_call(|io| cordon_host::procs::start(io, &request))?;
        Ok(id)
    }

    fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::raise(io, id, signal, all))
    }

    fn signal_background(&mut self, id: u64, signal: cordon_core::ProcSignal) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::signal(io, id, signal))
    }

    fn open_port(&mut self, port: u16) -> Result<std::os::unix::net::UnixStream> {
        cordon_host::egress::check_own_port(port)?;
        let dir = self.ports_dir()?;
        self.bg_call(|io| cordon_host::ports::dial(io, port, &dir))
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn report(&mut self) -> cordon_core::Details {
        cordon_host::egress::report(&mut self.file_findings, self.egress.as_mut())
    }

    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        let t = Instant::now();
        self.stop_live_with(true);
        let stopped_us = t.elapsed().as_micros() as u64;
        // The proxy (and every placeholder with it) ends with the sandbox.
        self.egress = None;
        self.workspace = None;
        self.watches = None;
        // Before the bundle is removed: nothing under a volume's bind may be.
        for (bind, _, _) in self.volumes.drain(..) {
            workspace::unmount(&bind);
        }
        workspace::unmount(&self.work);
        // Whatever else is mounted in the bundle: the removal never crosses into a mount.
        cordon_host::volume::unmount_all_under(&self.bundle);
        let removed = std::fs::remove_dir_all(&self.bundle)
            .map_err(|e| Error::io(format!("removing the bundle of {}", self.id), e));
        // runsc has been waited for: nothing runs as the sandbox's id.
        self.ids = None;
        reap::unregister(&self.config.state_root, self.id.as_str());
        tracing::debug!(sandbox = %self.id, stopped_us, destroyed_us = t.elapsed().as_micros() as u64, "gvisor: destroyed");
        removed
    }
}

impl Drop for GvisorSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

impl crate::GvisorSandbox {
    /// A file call outside the workspace (ADR 0031): served by the agent inside the
    /// sandbox, as the sandbox's user, never by the host (whose confined view is /work's
    /// alone); the sandbox is started first if it is not running.
    fn outside_call<T>(
        &mut self,
        f: impl FnOnce(&mut dyn cordon_host::files::FrameIo) -> cordon_host::files::Answer<T>,
    ) -> Result<T> {
        self.ensure_live()?;
        self.bg_call(f)
    }

    /// Starts the runsc sandbox again when it was lost (its memory limit ended the sentry,
    /// or its agent stopped answering): /work lives on the host and survives it. True when
    /// a sandbox that had run was replaced.
    fn ensure_live(&mut self) -> Result<bool> {
        let mut restarted = false;
        if self
            .live
            .as_mut()
            .is_none_or(|l| !matches!(l.runsc.try_wait(), Ok(None)))
        {
            // Created sandboxes were started once: any start here replaces a lost one.
            restarted = self.starts > 0;
            self.stop_live();
            self.start_live()?;
        }
        Ok(restarted)
    }

    /// The outcome of a run the driver saw to its end: what the driver and the agent saw,
    /// the refused forks, the workspace and the cgroup's counters from `before` to `after`;
    /// a lost runsc sandbox is stopped (the next exec starts it again).
    fn outcome(
        &mut self,
        run: agent::FramedRun,
        forks_refused: bool,
        (before, after): (Option<Counters>, Option<Counters>),
        t0: Instant,
        restarted: bool,
    ) -> ExecOutcome {
        // What the driver and the agent saw; the log of refused forks, the workspace and
        // the sandbox's cgroup add theirs.
        let mut seen = run.evidence();
        seen.forks_refused |= forks_refused;
        seen.disk_full |= self.disk_full();
        let mut out = ExecOutcome::new(Tier::Gvisor, Termination::Exited);
        let mut lost_why = None;
        match run.ended {
            agent::Ended::Exited(exit) => {
                out.exit_code = exit.code;
                out.signal = exit.signal;
                out.usage.cpu_time_us = exit.cpu_us;
                out.usage.peak_memory_bytes = exit.max_rss_bytes;
                out.timings.program_us = exit.program_us;
            }
            agent::Ended::KillUnanswered | agent::Ended::Abandoned => {
                // The program is stopped with the whole runsc sandbox.
                out.signal = Some(9);
                lost_why = Some("its agent did not answer a kill in time".to_string());
            }
            agent::Ended::Lost(e) => {
                lost_why = Some(format!("the runsc sandbox ended during the exec ({e})"));
            }
        }
        if let Some(why) = &lost_why {
            let detail = self.stop_live();
            tracing::warn!(sandbox = %self.id, "gvisor: {why}; runsc said: {detail}");
        }
        if let (Some(b), Some(a)) = (before, after) {
            out.usage.peak_memory_bytes = out.usage.peak_memory_bytes.max(a.peak_memory);
            let hits: Counters = a.since(&b);
            // The cgroup holds the sentry too: a limit hit with the program (or the whole
            // runsc sandbox) dead of SIGKILL is the memory limit's doing.
            seen.oom_killed |= hits.out_of_memory(seen.agent_lost() || out.signal == Some(9));
        }
        let termination = cordon_core::classify(&seen);
        out.termination = termination;
        out.timings.run_us = t0.elapsed().as_micros() as u64;
        out.usage.wall_time_us = out.timings.run_us;
        out.timings.start_us = self.start_us;
        out.weakened = self.weakened.clone();
        out.warnings = self.warnings.clone();
        if restarted {
            out.warnings.push(
                "the gvisor sandbox was started again before this exec (the last one ended it); /work was kept, /tmp and processes were not"
                    .into(),
            );
        }
        if let Some(why) = lost_why
            && termination == Termination::SandboxFailure
        {
            out.warnings.push(format!("the sandbox failed: {why}"));
        }
        // Output leaving the sandbox is scanned: known secrets redacted, credential
        // formats flagged (the container tier's scanner).
        out.stdout = run.stdout;
        out.stderr = run.stderr;
        out.stdout_truncated = run.stdout_truncated;
        out.stderr_truncated = run.stderr_truncated;
        cordon_host::egress::scan_outcome(&mut out, self.egress.as_mut());
        out
    }
}
