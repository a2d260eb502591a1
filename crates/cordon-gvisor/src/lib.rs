//! The gvisor tier: every exec is an OCI container run by `runsc` (gVisor's user-space
//! kernel, ptrace platform, `--network=none`) on a bundle we generate: a read-only root with
//! the host's `/usr`, a fresh `/proc`, a size-limited `/tmp`, and `/work` bound from a
//! per-sandbox host directory (so files put in and taken out persist across execs).
//!
//! Limits: the timeout and output caps are the host's own; memory is an OCI cgroup limit
//! (holds as root); processes are bounded with `RLIMIT_NPROC`, not a pids cgroup, because
//! runsc counts its own threads against a pids limit and the whole sandbox dies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Command, Error, ExecOutcome, ExecRequest, Language, OutputSink,
    OutputStream, Probe, Result, Sandbox, SandboxId, SandboxSpec, Termination, Tier,
    validate_sandbox_path,
};

/// Where runsc is and where its state goes.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    pub runsc: PathBuf,
    /// runsc's `--root` (container state).
    pub state_root: PathBuf,
    /// Bundles (root skeleton, config.json, the /work directory) go here.
    pub scratch_root: PathBuf,
    /// `ptrace`: the only platform that works with Debian's 2022 runsc on this kind of host.
    pub platform: String,
}

impl GvisorConfig {
    pub fn discover() -> Self {
        let runsc = std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("runsc"))
                    .find(|c| c.is_file())
            })
            .unwrap_or_else(|| PathBuf::from("/usr/bin/runsc"));
        GvisorConfig {
            runsc,
            state_root: PathBuf::from("/run/cordon-gvisor"),
            scratch_root: std::env::temp_dir().join("cordon-gvisor"),
            platform: "ptrace".to_string(),
        }
    }
}

pub struct GvisorBackend {
    config: GvisorConfig,
}

impl GvisorBackend {
    pub fn new(config: GvisorConfig) -> Self {
        GvisorBackend { config }
    }
}

impl Backend for GvisorBackend {
    fn tier(&self) -> Tier {
        Tier::Gvisor
    }

    fn probe(&self) -> Probe {
        let runsc_ok = self.config.runsc.is_file();
        let root = nix::unistd::geteuid().is_root();
        Probe::from_capabilities(
            Tier::Gvisor,
            vec![
                Capability {
                    name: "runsc".into(),
                    ok: runsc_ok,
                    detail: self.config.runsc.display().to_string(),
                    fix: Some("apt-get install runsc (scripts/setup.d/60-gvisor.sh)".into()),
                    required: true,
                },
                Capability {
                    name: "root".into(),
                    ok: root,
                    detail: if root { "running as root" } else { "not root" }.into(),
                    fix: Some("run cordon as root (runsc needs it for its sandbox)".into()),
                    required: true,
                },
            ],
            vec![format!(
                "platform {}; processes bounded by RLIMIT_NPROC (a pids cgroup crashes runsc)",
                self.config.platform
            )],
        )
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        let t = Instant::now();
        let probe = self.probe();
        if !probe.available() {
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: "runsc is missing or cordon is not root".into(),
                fix: "run scripts/setup.d/60-gvisor.sh and run as root; see `cordon doctor`".into(),
            });
        }
        if !spec.egress.allow.is_empty() || !spec.grants.is_empty() {
            return Err(Error::Invalid(
                "the gvisor tier has no egress path yet (--network=none): drop --allow-host/--grant or use the container or microvm tier".into(),
            ));
        }
        let id = SandboxId::random()?;
        let bundle = self.config.scratch_root.join(id.as_str());
        let io = |what: &str, e| Error::io(format!("{what} in {}", bundle.display()), e);
        let rootfs = bundle.join("rootfs");
        for d in ["usr", "proc", "dev", "tmp", "work", "etc"] {
            std::fs::create_dir_all(rootfs.join(d)).map_err(|e| io("creating the root", e))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(to, rootfs.join(link)).map_err(|e| io("linking", e))?;
        }
        std::fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0::/:/bin/sh\nsandbox:x:1000:1000::/work:/bin/sh\n",
        )
        .map_err(|e| io("writing /etc/passwd", e))?;
        std::fs::write(rootfs.join("etc/group"), "root:x:0:\nsandbox:x:1000:\n")
            .map_err(|e| io("writing /etc/group", e))?;
        let work = bundle.join("work");
        std::fs::create_dir_all(&work).map_err(|e| io("creating /work", e))?;
        nix::unistd::chown(&work, Some(1000.into()), Some(1000.into()))
            .map_err(|e| Error::Sandbox(format!("chown of {}: {e}", work.display())))?;
        Ok(Box::new(GvisorSandbox {
            id,
            config: self.config.clone(),
            spec: spec.clone(),
            bundle,
            work,
            start_us: t.elapsed().as_micros() as u64,
            execs: 0,
            destroyed: false,
        }))
    }
}

pub struct GvisorSandbox {
    id: SandboxId,
    config: GvisorConfig,
    spec: SandboxSpec,
    bundle: PathBuf,
    work: PathBuf,
    start_us: u64,
    execs: u32,
    destroyed: bool,
}

fn argv_of(cmd: &Command) -> Result<Vec<String>> {
    let shell = |sh: &str, src: &str, args: &[String]| {
        let mut v = vec![sh.to_string(), "-c".into(), src.to_string(), sh.to_string()];
        v.extend(args.iter().cloned());
        v
    };
    Ok(match cmd {
        Command::Argv(a) if !a.is_empty() => a.clone(),
        Command::Code {
            language,
            source,
            args,
        } => match language {
            Language::Python => {
                let mut v = vec!["python3".into(), "-c".into(), source.clone()];
                v.extend(args.iter().cloned());
                v
            }
            Language::Bash => shell("bash", source, args),
            Language::Sh => shell("sh", source, args),
            Language::Javascript => {
                return Err(Error::Invalid(
                    "the gvisor tier has no JavaScript runtime in its root; use the wasm or runtime tier".into(),
                ));
            }
        },
        _ => {
            return Err(Error::Invalid(
                "the gvisor tier runs programs and code, not wasm modules or empty commands".into(),
            ));
        }
    })
}

impl GvisorSandbox {
    fn config_json(&self, req: &ExecRequest) -> Result<serde_json::Value> {
        let l = &self.spec.limits;
        let mut env: Vec<String> = vec![
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "HOME=/work".into(),
            "LANG=C.UTF-8".into(),
        ];
        for (k, v) in self.spec.env.iter().chain(req.env.iter()) {
            env.push(format!("{k}={v}"));
        }
        let mem = l.memory_bytes as i64;
        Ok(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 1000, "gid": 1000},
                "args": argv_of(&req.command)?,
                "env": env,
                "cwd": req.cwd.clone().unwrap_or_else(|| "/work".into()),
                "capabilities": {},
                "noNewPrivileges": true,
                "rlimits": [
                    {"type": "RLIMIT_NPROC", "hard": l.pids, "soft": l.pids},
                    {"type": "RLIMIT_NOFILE", "hard": l.open_files, "soft": l.open_files},
                    {"type": "RLIMIT_FSIZE", "hard": l.disk_bytes, "soft": l.disk_bytes}
                ]
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": "cordon",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "size=64k"]},
                {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"]},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", format!("size={}", l.tmp_bytes)]},
                {"destination": "/work", "type": "bind", "source": self.work.display().to_string(), "options": ["rbind", "rw", "nosuid", "nodev"]}
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
                "resources": {
                    "memory": {"limit": mem, "swap": mem},
                    "cpu": {"period": 100000u64, "quota": (l.cpus * 100000.0) as i64}
                }
            }
        }))
    }

    fn runsc(&self) -> Proc {
        let mut p = Proc::new(&self.config.runsc);
        p.arg("--root")
            .arg(&self.config.state_root)
            .arg("--network=none")
            .arg(format!("--platform={}", self.config.platform));
        p
    }

    fn cleanup(&self, cid: &str) {
        let _ = self
            .runsc()
            .args(["kill", cid, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self
            .runsc()
            .args(["delete", "--force", cid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    fn host_path(&self, path: &str) -> Result<PathBuf> {
        let clean = validate_sandbox_path(path)?;
        let rel = clean.trim_start_matches("/work").trim_start_matches('/');
        let mut p = self.work.clone();
        for part in Path::new(rel).components() {
            p.push(part);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(Error::PathRefused {
                    path: path.into(),
                    reason: "a symlink".into(),
                });
            }
        }
        Ok(p)
    }
}

fn pump(
    mut r: impl Read + Send + 'static,
    s: OutputStream,
    tx: mpsc::Sender<(OutputStream, Vec<u8>)>,
) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 || tx.send((s, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
}

fn wait(child: &mut Child) -> Option<std::process::ExitStatus> {
    child.try_wait().ok().flatten()
}

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
        let cfg = self.config_json(req)?;
        std::fs::write(self.bundle.join("config.json"), cfg.to_string())
            .map_err(|e| Error::io("writing config.json", e))?;
        self.execs += 1;
        let cid = format!("{}-{}", self.id.as_str(), self.execs);
        let t0 = Instant::now();
        let mut child = self
            .runsc()
            .args(["run", "--bundle"])
            .arg(&self.bundle)
            .arg(&cid)
            .stdin(if req.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("starting runsc", e))?;
        if let (Some(data), Some(mut w)) = (req.stdin.clone(), child.stdin.take()) {
            std::thread::spawn(move || {
                let _ = std::io::Write::write_all(&mut w, &data);
            });
        }
        let (tx, rx) = mpsc::channel();
        if let Some(o) = child.stdout.take() {
            pump(o, OutputStream::Stdout, tx.clone());
        }
        if let Some(e) = child.stderr.take() {
            pump(e, OutputStream::Stderr, tx.clone());
        }
        drop(tx);
        let l = &self.spec.limits;
        let deadline = t0 + Duration::from_millis(req.timeout_ms.unwrap_or(l.timeout_ms));
        let mut out = ExecOutcome::new(Tier::Gvisor, Termination::Exited);
        let mut stop: Option<Termination> = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                stop = Some(Termination::Timeout);
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok((s, data)) => {
                    let (buf, cap, trunc) = match s {
                        OutputStream::Stdout => {
                            (&mut out.stdout, l.stdout_bytes, &mut out.stdout_truncated)
                        }
                        OutputStream::Stderr => {
                            (&mut out.stderr, l.stderr_bytes, &mut out.stderr_truncated)
                        }
                    };
                    let room = cap.saturating_sub(buf.len() as u64) as usize;
                    let keep = &data[..data.len().min(room)];
                    buf.extend_from_slice(keep);
                    sink.output(s, keep);
                    if keep.len() < data.len() {
                        *trunc = true;
                        stop = Some(Termination::OutputLimit);
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if stop.is_some() {
            self.cleanup(&cid);
            let _ = child.kill();
        }
        let status = loop {
            if let Some(s) = wait(&mut child) {
                break s;
            }
            if Instant::now() > deadline + Duration::from_secs(5) {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        self.cleanup(&cid);
        out.timings.run_us = t0.elapsed().as_micros() as u64;
        out.usage.wall_time_us = out.timings.run_us;
        out.timings.start_us = self.start_us;
        match stop {
            Some(t) => out.termination = t,
            None => {
                use std::os::unix::process::ExitStatusExt;
                // runsc reports the program's exit status; 128+N for a signal N.
                match (status.code(), status.signal()) {
                    (Some(c), _) if c > 128 && c < 160 => {
                        out.termination = Termination::Signalled;
                        out.signal = Some(c - 128);
                    }
                    (Some(c), _) => out.exit_code = Some(c),
                    (None, Some(s)) => {
                        out.termination = Termination::Killed;
                        out.signal = Some(s);
                    }
                    _ => out.termination = Termination::SandboxFailure,
                }
            }
        }
        out.warnings.push(
            "gvisor tier: processes are bounded by RLIMIT_NPROC, not a pids cgroup; no egress"
                .into(),
        );
        Ok(out)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = self.host_path(path)?;
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|e| Error::File {
                path: path.into(),
                reason: e.to_string(),
            })?;
        }
        std::fs::write(&p, data).map_err(|e| Error::File {
            path: path.into(),
            reason: e.to_string(),
        })?;
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o777));
        nix::unistd::chown(&p, Some(1000.into()), Some(1000.into())).map_err(|e| Error::File {
            path: path.into(),
            reason: e.to_string(),
        })
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let p = self.host_path(path)?;
        let f = std::fs::File::open(&p).map_err(|e| Error::File {
            path: path.into(),
            reason: e.to_string(),
        })?;
        let mut data = Vec::new();
        f.take(max_bytes + 1)
            .read_to_end(&mut data)
            .map_err(|e| Error::File {
                path: path.into(),
                reason: e.to_string(),
            })?;
        if data.len() as u64 > max_bytes {
            return Err(Error::File {
                path: path.into(),
                reason: format!("larger than {max_bytes} bytes"),
            });
        }
        Ok(data)
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        std::fs::remove_dir_all(&self.bundle)
            .map_err(|e| Error::io(format!("removing {}", self.bundle.display()), e))
    }
}

impl Drop for GvisorSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}
