//! The `Sandbox` trait for the container tier: each call to its verb's module.

use std::time::Duration;

use cordon_core::{
    ArchiveReport, Error, ExecOutcome, ExecRequest, FileOp, FileReply, OutputSink, ProcOutput,
    ProcSignal, Result, Sandbox, SandboxId,
};
use cordon_guest::proto::{Reply, Request};
use cordon_host::files::refuse_unscanned;

use super::life::sandbox_init_of;
use super::{BgOom, ContainerSandbox, Terminal, unexpected_reply};

impl Sandbox for ContainerSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        self.ctrl()?;
        self.run_exec(req, sink)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        cordon_core::classify_sandbox_path(path, false)?;
        let reply = self.call(
            &Request::PutFile {
                path: path.to_string(),
                mode,
            },
            data,
            0,
        )?;
        match reply.header {
            Reply::Ok => Ok(()),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(unexpected_reply("unexpected reply to a file write", &other)),
        }
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        cordon_core::classify_sandbox_path(path, false)?;
        let reply = self.call(
            &Request::GetFile {
                path: path.to_string(),
                max: max_bytes,
            },
            b"",
            usize::try_from(max_bytes).unwrap_or(usize::MAX),
        )?;
        match reply.header {
            Reply::File { truncated: false } => {
                let (clean, found) =
                    crate::egress::scan_file(self.egress.as_ref(), path, &reply.body);
                self.file_findings.extend(found);
                Ok(clean)
            }
            Reply::File { truncated: true } => Err(Error::File {
                path: path.to_string(),
                reason: format!(
                    "larger than the {max_bytes}-byte limit for files out; raise it or write less"
                ),
            }),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(unexpected_reply("unexpected reply to a file read", &other)),
        }
    }

    fn file_op(&mut self, op: &FileOp) -> Result<FileReply> {
        self.file_call(|io| cordon_host::files::file_op(io, op))
    }

    fn gauge(&self) -> Option<std::sync::Arc<dyn cordon_core::Gauge>> {
        let cg = self.cgroup.as_ref()?;
        Some(std::sync::Arc::new(
            cg.gauge(cordon_host::cgroup::gauge::Workspace::Inside),
        ))
    }

    fn watch(&mut self, op: &cordon_core::WatchOp) -> Result<cordon_core::WatchReply> {
        self.file_call(|io| cordon_host::files::watch(io, op))
    }

    fn put_archive(&mut self, dir: &str, tar: &mut dyn std::io::Read) -> Result<ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        let budget = self.spec.limits.disk_bytes;
        self.file_call(|io| cordon_host::files::put_archive(io, dir, budget, tar))
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        refuse_unscanned(&self.spec, dir)?;
        self.file_call(|io| cordon_host::files::get_archive(io, dir, max_bytes, out))
    }

    fn start_background(&mut self, req: &ExecRequest) -> Result<u64> {
        self.ctrl()?;
        let parts = self.exec_parts(req)?;
        let id = self.next_exec;
        self.next_exec += 1;
        let request = parts.background(id);
        if let Some(c) = self.cgroup.as_ref().map(|c| c.counters()) {
            self.bg_counters.insert(
                id,
                BgOom::Started {
                    oom_kills: c.oom_kills,
                },
            );
        }
        self.file_call(|io| cordon_host::procs::start(io, &request))?;
        Ok(id)
    }

    fn read_background(&mut self, id: u64, from: [u64; 2], max: u64) -> Result<ProcOutput> {
        let mut out = self.file_call(|io| cordon_host::procs::read(io, id, from, max))?;
        if let Some(exit) = out.exit.as_mut() {
            exit.oom_killed |= self.bg_oom(id, exit.signal);
        }
        Ok(out)
    }

    fn write_background(&mut self, id: u64, data: &[u8]) -> Result<()> {
        self.file_call(|io| cordon_host::procs::write(io, id, data))
    }

    fn resize_background(&mut self, id: u64, size: cordon_core::PtySize) -> Result<()> {
        self.file_call(|io| cordon_host::procs::resize(io, id, size))
    }

    fn start_attached(
        &mut self,
        req: &ExecRequest,
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
        terminal: bool,
        user: Option<cordon_core::ProcUser>,
    ) -> Result<u64> {
        ContainerSandbox::start_attached(self, req, stdio, terminal, user)
    }

    fn open_terminal(&mut self, size: cordon_core::PtySize) -> Result<Terminal> {
        ContainerSandbox::open_terminal(self, size)
    }

    fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        ContainerSandbox::raise_background(self, id, signal, all)
    }

    fn open_port(&mut self, port: u16) -> Result<std::os::unix::net::UnixStream> {
        cordon_host::egress::check_own_port(port)?;
        self.file_call(|io| cordon_host::ports::open(io, port))
    }

    fn signal_background(&mut self, id: u64, signal: ProcSignal) -> Result<()> {
        self.file_call(|io| cordon_host::procs::signal(io, id, signal))
    }

    fn snapshot(
        &mut self,
        mode: cordon_core::SnapshotMode,
        dir: &cordon_core::SnapshotDir,
    ) -> Result<cordon_core::SnapshotImage> {
        let (paused, max) = (self.is_paused(), self.disk_limit());
        crate::snapshot::take(paused, mode, dir, |out| {
            self.file_call(|io| cordon_host::files::get_archive(io, "/work", max, out))
        })
    }

    fn pause(&mut self) -> Result<()> {
        self.ctrl()?;
        let Some(cg) = &self.cgroup else {
            return Err(Error::Unsupported {
                what: "pausing a sandbox that runs without cgroups".into(),
                fix: "run Cordon where it can make cgroups (see `cordon doctor`)".into(),
            });
        };
        cg.freeze(Duration::from_secs(5))?;
        self.paused = true;
        Ok(())
    }

    fn resize(&mut self, memory_bytes: u64, cpus: f64) -> Result<()> {
        self.ctrl()?;
        let Some(cg) = &self.cgroup else {
            return Err(Error::Unsupported {
                what: "resizing a sandbox that runs without cgroups".into(),
                fix: "run Cordon where it can make cgroups (see `cordon doctor`)".into(),
            });
        };
        cg.resize(memory_bytes, cpus)?;
        self.spec.limits.memory_bytes = memory_bytes;
        self.spec.limits.cpus = cpus;
        Ok(())
    }

    fn resume(&mut self) -> Result<()> {
        self.ctrl()?;
        if let Some(cg) = &self.cgroup {
            cg.thaw()?;
        }
        self.paused = false;
        Ok(())
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn report(&mut self) -> cordon_core::Details {
        crate::egress::report(&mut self.file_findings, self.egress.as_mut())
    }

    fn interrupter(&self) -> Option<cordon_core::Interrupter> {
        // Every process of the sandbox (the agent's and the exec's) is in its cgroup, and the
        // outer init is our unreaped child, so neither pid can name another process yet.
        let procs = self
            .cgroup
            .as_ref()
            .and_then(|c| c.procs_files().first().cloned());
        let outer = self.outer.as_ref().map(|c| c.id());
        Some(std::sync::Arc::new(move || {
            // The sandbox's PID 1 first, as in a teardown (`kill_order`): its death ends its
            // whole PID namespace before any process of an exec can report an ordinary exit.
            if let Some(agent) = outer.and_then(sandbox_init_of) {
                crate::sys::kill_pid(agent);
            }
            if let Some(p) = &procs {
                crate::cgroup::kill_listed(p);
            }
            if let Some(pid) = outer {
                crate::sys::kill_pid(pid as i32);
            }
        }))
    }

    fn destroy(&mut self) -> Result<()> {
        if self.gone.as_deref() == Some("destroyed") {
            return Ok(());
        }
        if self.ends_in_init {
            self.end_in_init();
        } else {
            self.teardown();
        }
        self.gone = Some("destroyed".into());
        Ok(())
    }
}
