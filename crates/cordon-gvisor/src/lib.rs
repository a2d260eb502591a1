//! The gvisor tier: every exec is an OCI container run by `runsc` (gVisor's user-space
//! kernel, ptrace platform, `--network=none`) on a bundle we generate: a read-only root with
//! the host's `/usr`, a fresh `/proc`, a size-limited `/tmp`, and `/work` bound from a
//! per-sandbox size-limited tmpfs on the host (so files put in and taken out persist across
//! execs).
//!
//! Limits and how each is reported:
//! - memory: a cgroup limit (swap off) on a memory cgroup Cordon creates and runsc joins
//!   ([`cgroup`]); its OOM counter, read after the exec, gives the out-of-memory reason;
//! - processes: `RLIMIT_NPROC`, not a pids cgroup (runsc counts its own threads against a
//!   pids limit and the whole sandbox dies); refused forks are seen in the sentry's trace of
//!   process-creating calls ([`nproc`]) and give the process-limit reason;
//! - disk: `/work` is a tmpfs of the disk limit, and `RLIMIT_FSIZE` bounds each file;
//! - timeout and output caps are the host's own; reaching one stops the container.
//!
//! Egress is the container tier's path: a per-sandbox proxy on a host unix socket, bound
//! into the sandbox and opened through runsc's `--host-uds=open`, and a forwarder on
//! `127.0.0.1:3128` inside ([`FORWARDER_BINARY`]). A killed Cordon's leftovers (runsc state,
//! cgroups, bundles) are reaped by the next backend ([`reap`]).

pub mod cgroup;
mod nproc;
pub mod reap;
mod sys;
mod workspace;

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Command, Error, ExecOutcome, ExecRequest, Language, OutputSink,
    OutputStream, Probe, Result, Sandbox, SandboxId, SandboxSpec, Termination, Tier, Weakening,
    validate_sandbox_path,
};
use cordon_host::egress::{EgressLink, SANDBOX_PROXY_PORT, SOCKET_INSIDE};

use crate::cgroup::{ExecCgroup, Layout};
use crate::nproc::NprocWatch;

/// Errors of the gvisor tier, turned into [`cordon_core::Error`] at the API boundary.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error("cgroup: {0}")]
    Cgroup(String),
    #[error("workspace: {0}")]
    Workspace(String),
    #[error("runsc: {0}")]
    Runsc(String),
}

/// Name of the in-sandbox forwarder binary, looked up next to the running executable.
pub const FORWARDER_BINARY: &str = "cordon-gvisor-forward";
/// Where the forwarder binary is bound inside the sandbox.
const FORWARDER_INSIDE: &str = "/.cordon/forward";

/// A process-limit refusal that keeps recurring this long after the first one stops the
/// exec (a fork bomb would otherwise run until its timeout).
const NPROC_GRACE: Duration = Duration::from_secs(2);

/// Where runsc is and where its state goes.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    pub runsc: PathBuf,
    /// runsc's `--root` (container state); root's alone (0700).
    pub state_root: PathBuf,
    /// Bundles (root skeleton, config.json, the /work mount) go here: a directory of root's
    /// alone (0700, refused when another user made it), under Cordon's data dir.
    pub scratch_root: PathBuf,
    /// `ptrace`: the only platform that works with Debian's 2022 runsc on this kind of host.
    pub platform: String,
    /// The `cordon-gvisor-forward` binary (needed only for egress).
    pub forwarder: PathBuf,
    /// Where each sandbox leases its host id (the container tier's pool): programs run as
    /// that uid and gid, which no login user has and no other live sandbox shares. gVisor
    /// does not remap ids, so it owns the sandbox's `/work` and egress socket on the host.
    pub ids: cordon_host::idpool::IdPool,
}

/// Cordon's data dir: `$CORDON_HOME`, else `/var/lib/cordon` (this tier runs as root).
fn data_dir() -> PathBuf {
    std::env::var_os("CORDON_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/var/lib/cordon"), PathBuf::from)
}

impl GvisorConfig {
    /// runsc from `PATH`; the forwarder from `$CORDON_GVISOR_FORWARDER`, else next to the
    /// current executable (or its parent, for test binaries under `deps/`).
    pub fn discover() -> Self {
        let runsc = std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("runsc"))
                    .find(|c| c.is_file())
            })
            .unwrap_or_else(|| PathBuf::from("/usr/bin/runsc"));
        let forwarder = std::env::var_os("CORDON_GVISOR_FORWARDER")
            .map(PathBuf::from)
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                let dir = exe.parent()?;
                [
                    dir.join(FORWARDER_BINARY),
                    dir.parent()?.join(FORWARDER_BINARY),
                ]
                .into_iter()
                .find(|p| p.is_file())
            })
            .unwrap_or_else(|| PathBuf::from(FORWARDER_BINARY));
        GvisorConfig {
            runsc,
            state_root: PathBuf::from("/run/cordon-gvisor"),
            scratch_root: data_dir().join("scratch").join("gvisor"),
            platform: "ptrace".to_string(),
            forwarder,
            ids: cordon_host::idpool::IdPool::system(),
        }
    }
}

pub struct GvisorBackend {
    config: GvisorConfig,
    layout: OnceLock<Option<Layout>>,
}

fn quiet(mut p: Proc) -> Proc {
    p.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    p
}

/// The runsc command line every call starts with.
fn runsc_base(config: &GvisorConfig) -> Proc {
    let mut p = Proc::new(&config.runsc);
    p.arg("--root")
        .arg(&config.state_root)
        .arg("--network=none")
        .arg(format!("--platform={}", config.platform));
    p
}

/// Kills and force-deletes a container; quiet, best effort.
fn force_delete(config: &GvisorConfig, cid: &str) {
    let mut kill = runsc_base(config);
    kill.args(["kill", cid, "KILL"]);
    let _ = quiet(kill).status();
    let mut del = runsc_base(config);
    del.args(["delete", "--force", cid]);
    let _ = quiet(del).status();
    reap::remove_lock(&config.state_root, cid);
}

/// True while runsc holds state for a container.
fn has_state(config: &GvisorConfig, cid: &str) -> bool {
    config
        .state_root
        .join(format!("{cid}_sandbox:{cid}.state"))
        .exists()
}

impl GvisorBackend {
    pub fn new(config: GvisorConfig) -> Self {
        GvisorBackend {
            config,
            layout: OnceLock::new(),
        }
    }

    pub fn config(&self) -> &GvisorConfig {
        &self.config
    }

    fn layout(&self) -> Option<&Layout> {
        self.layout.get_or_init(Layout::detect).as_ref()
    }

    /// Removes what dead Cordon processes left: runsc containers, cgroups, bundles and
    /// egress sockets of sandboxes whose owning process is gone. Returns one line per thing
    /// removed. Runs at every `create`; safe beside live sandboxes of other processes.
    pub fn reap_orphans(&self) -> Vec<String> {
        let delete = |cid: &str| force_delete(&self.config, cid);
        let removed = reap::Sweep {
            scratch: &self.config.scratch_root,
            state_root: &self.config.state_root,
            layout: self.layout(),
            delete: &delete,
        }
        .run();
        for r in &removed {
            tracing::info!("gvisor: reaped an orphan: {r}");
        }
        removed
    }
}

impl Backend for GvisorBackend {
    fn tier(&self) -> Tier {
        Tier::Gvisor
    }

    /// Every gvisor sandbox whose owning process is gone (records or not): runsc state,
    /// cgroups, bundles, mounts.
    fn recover(&self, _orphans: &[String]) -> Vec<String> {
        self.reap_orphans()
            .into_iter()
            .map(|what| format!("gvisor: {what}"))
            .collect()
    }

    fn probe(&self) -> Probe {
        let runsc_ok = self.config.runsc.is_file();
        let root = nix::unistd::geteuid().is_root();
        let layout = self.layout();
        let fwd_ok = self.config.forwarder.is_file();
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
                Capability {
                    name: "memory-cgroup".into(),
                    ok: layout.is_some(),
                    detail: match layout {
                        Some(Layout::V2(p)) => format!("cgroup v2 at {}", p.display()),
                        Some(Layout::V1 { memory, .. }) => {
                            format!("cgroup v1 memory controller at {}", memory.display())
                        }
                        None => "no memory controller mounted".into(),
                    },
                    fix: Some(
                        "mount the cgroup memory controller; without it the memory limit is \
                         not enforced (--allow-weaker cgroups)"
                            .into(),
                    ),
                    required: false,
                },
                Capability {
                    name: "egress-forwarder".into(),
                    ok: fwd_ok,
                    detail: self.config.forwarder.display().to_string(),
                    fix: Some(format!(
                        "build it (cargo build --workspace --bins) and keep {FORWARDER_BINARY} \
                         next to cordon, or set CORDON_GVISOR_FORWARDER; without it egress \
                         specs are refused"
                    )),
                    required: false,
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
        if !self.config.runsc.is_file() || !nix::unistd::geteuid().is_root() {
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: "runsc is missing or cordon is not root".into(),
                fix: "run scripts/setup.d/60-gvisor.sh and run as root; see `cordon doctor`".into(),
            });
        }
        let egress = !spec.egress.allow.is_empty() || !spec.grants.is_empty();
        if egress && !self.config.forwarder.is_file() {
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: format!(
                    "egress was asked for but the in-sandbox forwarder {} is missing",
                    self.config.forwarder.display()
                ),
                fix: format!(
                    "build it (cargo build --workspace --bins) and keep {FORWARDER_BINARY} next \
                     to cordon, or set CORDON_GVISOR_FORWARDER"
                ),
            });
        }
        let mut weakened = Vec::new();
        let mut warnings = Vec::new();
        let layout = match self.layout() {
            Some(l) => Some(l.clone()),
            None if spec.allow_weaker.contains(&Weakening::Cgroups) => {
                weakened.push(Weakening::Cgroups);
                warnings.push(
                    "running without a memory cgroup: the memory limit is not enforced".into(),
                );
                None
            }
            None => {
                return Err(Error::LayerUnavailable {
                    layer: "cgroups".into(),
                    reason: "no cgroup memory controller is mounted".into(),
                });
            }
        };
        // Bundles and runsc's state are root's alone: a directory another user made first
        // (to swap a bundle before runsc reads it) is refused, not adopted.
        for dir in [&self.config.scratch_root, &self.config.state_root] {
            cordon_host::idpool::private_dir(dir).map_err(|detail| {
                tracing::error!("gvisor: {detail}");
                Error::Unavailable {
                    tier: Tier::Gvisor,
                    reason:
                        "a gvisor state directory is not root's alone (the operator's log names it)"
                            .into(),
                    fix: "remove that directory; Cordon makes it again, root's alone (0700)".into(),
                }
            })?;
        }
        self.reap_orphans();
        let ids = self
            .config
            .ids
            .allocate()
            .map_err(cordon_host::idpool::IdPoolError::into_core)?;
        let id = SandboxId::random()?;
        let bundle = self.config.scratch_root.join(id.as_str());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&bundle)
            .map_err(|e| Error::io(format!("creating the bundle of {id}"), e))?;
        let mut sb = GvisorSandbox {
            id,
            uid: ids.base(),
            ids: Some(ids),
            workspace: None,
            config: self.config.clone(),
            spec: spec.clone(),
            work: bundle.join("work"),
            bundle,
            layout,
            egress: None,
            start_us: 0,
            execs: 0,
            destroyed: false,
            weakened,
            warnings,
            file_findings: Vec::new(),
        };
        if let Err(e) = sb.build(egress) {
            let _ = sb.destroy();
            return Err(e);
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        Ok(Box::new(sb))
    }
}

pub struct GvisorSandbox {
    id: SandboxId,
    /// The host uid and gid programs run as (the first id of the leased range).
    uid: u32,
    /// The sandbox's lease on `uid`, given back once its last process is gone.
    ids: Option<cordon_host::idpool::IdRange>,
    /// `/work`, held open: file calls are opened beneath it.
    workspace: Option<cordon_guest::files::Workspace>,
    config: GvisorConfig,
    spec: SandboxSpec,
    bundle: PathBuf,
    work: PathBuf,
    layout: Option<Layout>,
    egress: Option<EgressLink>,
    start_us: u64,
    execs: u32,
    destroyed: bool,
    weakened: Vec<Weakening>,
    warnings: Vec<String>,
    /// Scan findings of files taken out, until reported.
    file_findings: Vec<cordon_core::Finding>,
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

/// Files of the sandbox's `/etc` (the rest of the host's `/etc` is never visible).
fn etc_files(uid: u32) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!("root:x:0:0::/:/bin/sh\nsandbox:x:{uid}:{uid}::/work:/bin/sh\n"),
        ),
        ("group", format!("root:x:0:\nsandbox:x:{uid}:\n")),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n".into()),
        ("hostname", "cordon\n".into()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".into(),
        ),
    ]
}

impl GvisorSandbox {
    /// Lays out the bundle: owner record, root skeleton, /etc, the /work tmpfs, egress.
    fn build(&mut self, egress: bool) -> Result<()> {
        let bundle = self.bundle.clone();
        let sid = self.id.to_string();
        let io = |what: &str, e| Error::io(format!("{what} in the bundle of {sid}"), e);
        // First, so that a Cordon killed from here on leaves something the sweep can judge.
        std::fs::write(bundle.join(reap::OWNER_FILE), reap::owner_record())
            .map_err(|e| io("writing the owner record", e))?;
        let rootfs = bundle.join("rootfs");
        for d in [
            "usr",
            "proc",
            "dev",
            "tmp",
            "work",
            "etc",
            "run/cordon",
            ".cordon",
        ] {
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
        for (name, content) in etc_files(self.uid) {
            std::fs::write(rootfs.join("etc").join(name), content)
                .map_err(|e| io("writing /etc", e))?;
        }
        std::fs::create_dir_all(&self.work).map_err(|e| io("creating /work", e))?;
        workspace::mount(&self.work, self.spec.limits.disk_bytes, self.uid).map_err(|e| {
            Error::LayerUnavailable {
                layer: "workspace".into(),
                reason: e.to_string(),
            }
        })?;
        self.workspace = Some(
            cordon_guest::files::Workspace::open(&self.work, self.uid, self.uid)
                .map_err(|e| io("opening /work", e))?,
        );
        if egress {
            // gVisor checks the sandbox user's permission on the socket itself (uids are
            // not remapped), so the socket and its 0700 directory belong to that uid.
            let link = EgressLink::start(self.id.as_str(), &self.spec, self.uid)?;
            std::fs::write(
                bundle.join(reap::EGRESS_FILE),
                link.socket().display().to_string(),
            )
            .map_err(|e| io("recording the egress socket", e))?;
            std::fs::write(rootfs.join(".cordon/forward"), b"")
                .map_err(|e| io("making the forwarder's mount point", e))?;
            for (path, content) in link.files() {
                let rel = path.trim_start_matches('/');
                let dest = rootfs.join(rel);
                if let Some(d) = dest.parent() {
                    std::fs::create_dir_all(d).map_err(|e| io("creating /etc dirs", e))?;
                }
                std::fs::write(&dest, content).map_err(|e| io("writing the CA files", e))?;
            }
            for (from, path) in link.copies() {
                let dest = rootfs.join(path.trim_start_matches('/'));
                if let Some(d) = dest.parent() {
                    std::fs::create_dir_all(d).map_err(|e| io("creating /etc dirs", e))?;
                }
                std::fs::copy(&from, &dest)
                    .and_then(|_| {
                        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o644))
                    })
                    .map_err(|e| io("copying the CA bundle", e))?;
            }
            self.egress = Some(link);
        }
        Ok(())
    }

    fn env_for(&self, req: &ExecRequest) -> Vec<String> {
        let tier_env = self.egress.iter().flat_map(|l| l.env());
        cordon_core::sandbox_env(&self.spec, tier_env, req)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    fn config_json(
        &self,
        req: &ExecRequest,
        cgroup: Option<&ExecCgroup>,
    ) -> Result<serde_json::Value> {
        let l = &self.spec.limits;
        let mem = l.memory_bytes as i64;
        let mut args = argv_of(&req.command)?;
        let mut mounts = vec![
            serde_json::json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            serde_json::json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "size=64k"]}),
            serde_json::json!({"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"]}),
            serde_json::json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", format!("size={}", l.tmp_bytes)]}),
            serde_json::json!({"destination": "/work", "type": "bind", "source": self.work.display().to_string(), "options": ["rbind", "rw", "nosuid", "nodev"]}),
        ];
        if let Some(link) = &self.egress {
            let dir = link
                .socket()
                .parent()
                .ok_or_else(|| Error::Sandbox("the egress socket has no directory".into()))?;
            let inside = Path::new(SOCKET_INSIDE)
                .parent()
                .ok_or_else(|| Error::Sandbox("bad egress socket path".into()))?;
            mounts.push(serde_json::json!({"destination": inside.display().to_string(), "type": "bind", "source": dir.display().to_string(), "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}));
            mounts.push(serde_json::json!({"destination": FORWARDER_INSIDE, "type": "bind", "source": self.config.forwarder.display().to_string(), "options": ["bind", "ro", "nosuid", "nodev"]}));
            let mut wrapped = vec![
                FORWARDER_INSIDE.to_string(),
                SANDBOX_PROXY_PORT.to_string(),
                SOCKET_INSIDE.to_string(),
                "--".to_string(),
            ];
            wrapped.append(&mut args);
            args = wrapped;
        }
        let mut linux = serde_json::json!({
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "resources": {
                "memory": {"limit": mem, "swap": mem},
                "cpu": {"period": 100000u64, "quota": (l.cpus * 100000.0) as i64}
            }
        });
        if let Some(cg) = cgroup {
            linux["cgroupsPath"] = serde_json::json!(cg.oci_path());
        }
        let uid = self.uid;
        Ok(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": uid, "gid": uid},
                "args": args,
                "env": self.env_for(req),
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
            "mounts": mounts,
            "linux": linux
        }))
    }

    /// `/work`, held open since the sandbox was built.
    fn workspace(&self) -> Result<&cordon_guest::files::Workspace> {
        match (&self.workspace, self.destroyed) {
            (Some(w), false) => Ok(w),
            _ => Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            }),
        }
    }
}

/// Writes a file only root can read (config.json carries the environment and placeholders).
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
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

/// How an exec ended, from what was observed.
#[derive(Debug, Clone, Copy, Default)]
struct Observed {
    /// A reason Cordon stopped the exec for (timeout, output cap, fork bomb).
    stopped: Option<Termination>,
    /// runsc's exit code (the program's status, 128+N for a signal N).
    code: Option<i32>,
    /// A signal that ended runsc itself.
    runsc_signal: Option<i32>,
    oom: bool,
    forks_refused: bool,
    disk_full: bool,
}

/// Termination reason, exit code and signal.
fn classify(o: Observed) -> (Termination, Option<i32>, Option<i32>) {
    const SIGXFSZ: i32 = 25;
    let signal = o.code.filter(|c| *c > 128 && *c < 160).map(|c| c - 128);
    let exit = o.code.filter(|_| signal.is_none());
    let reason = if let Some(t) = o.stopped {
        t
    } else if o.oom {
        Termination::OutOfMemory
    } else if o.forks_refused {
        Termination::ProcessLimit
    } else if signal == Some(SIGXFSZ) || (o.disk_full && exit != Some(0)) {
        Termination::DiskLimit
    } else if o.runsc_signal.is_some() || o.code.is_none() {
        Termination::SandboxFailure
    } else if signal.is_some() {
        Termination::Signalled
    } else {
        Termination::Exited
    };
    (reason, exit, signal.or(o.runsc_signal))
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
        self.execs += 1;
        let cid = format!("{}-{}", self.id.as_str(), self.execs);
        let l = self.spec.limits.clone();
        let cgroup = match &self.layout {
            Some(layout) => Some(
                ExecCgroup::create(layout, &cid, l.memory_bytes, l.cpus).map_err(|e| {
                    Error::LayerUnavailable {
                        layer: "cgroups".into(),
                        reason: e.to_string(),
                    }
                })?,
            ),
            None => None,
        };
        let cfg = self.config_json(req, cgroup.as_ref())?;
        write_private(&self.bundle.join("config.json"), cfg.to_string().as_bytes())
            .map_err(|e| Error::io("writing config.json", e))?;
        let watch = NprocWatch::start(&self.bundle.join(format!("sentry-{}.log", self.execs)))
            .map_err(|e| Error::Sandbox(e.to_string()))?;
        let t0 = Instant::now();
        let mut cmd = runsc_base(&self.config);
        if self.egress.is_some() {
            // Lets the gofer open host unix sockets the sandbox can see: only the egress
            // proxy's, bound read-only at /run/cordon.
            cmd.arg("--host-uds=open");
        }
        if cgroup.is_none() {
            cmd.arg("--ignore-cgroups");
        }
        cmd.arg(format!(
            "--debug-log={}",
            self.bundle
                .join(format!("sentry-{}.log", self.execs))
                .display()
        ))
        .args(["--debug-command=boot", "--strace"])
        .arg(format!("--strace-syscalls={}", nproc::TRACED))
        .args(["run", "--bundle"])
        .arg(&self.bundle)
        .arg(&cid)
        .stdin(if req.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        sys::die_with_parent(&mut cmd);
        let spawned = cmd.spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                drop(watch);
                if let Some(cg) = &cgroup {
                    cg.remove(Duration::from_secs(2));
                }
                return Err(Error::io("starting runsc", e));
            }
        };
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
        let deadline = t0 + Duration::from_millis(req.timeout_ms.unwrap_or(l.timeout_ms));
        let mut out = ExecOutcome::new(Tier::Gvisor, Termination::Exited);
        let mut seen = Observed::default();
        loop {
            let now = Instant::now();
            if now >= deadline {
                seen.stopped = Some(Termination::Timeout);
                break;
            }
            let r = watch.refusals();
            if let (Some(first), Some(last)) = (r.first, r.last)
                && now.duration_since(first) >= NPROC_GRACE
                && now.duration_since(last) < NPROC_GRACE / 2
            {
                // Forks are still being refused long after the first refusal: a fork bomb.
                seen.stopped = Some(Termination::ProcessLimit);
                break;
            }
            let tick = (deadline - now).min(Duration::from_millis(100));
            match rx.recv_timeout(tick) {
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
                        seen.stopped = Some(Termination::OutputLimit);
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if seen.stopped.is_some() {
            force_delete(&self.config, &cid);
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
        // runsc removes a container it ran to the end; one it did not (killed, crashed)
        // is force-deleted here.
        if has_state(&self.config, &cid) {
            force_delete(&self.config, &cid);
        }
        // A container that was killed leaves its lock file even once deleted.
        reap::remove_lock(&self.config.state_root, &cid);
        let refused = watch.finish();
        {
            use std::os::unix::process::ExitStatusExt;
            seen.code = status.code();
            seen.runsc_signal = status.signal();
        }
        if let Some(cg) = &cgroup {
            let c = cg.counters();
            out.usage.peak_memory_bytes = c.peak_bytes;
            seen.oom = c.out_of_memory(seen.code == Some(137));
            if !cg.remove(Duration::from_secs(5)) {
                tracing::warn!(cgroup = %cg.oci_path(), "could not remove an exec cgroup; the next create reaps it");
            }
        }
        seen.forks_refused = refused.count > 0;
        seen.disk_full = workspace::full(&self.work);
        let (termination, exit, signal) = classify(seen);
        out.termination = termination;
        out.exit_code = exit;
        out.signal = signal;
        out.timings.run_us = t0.elapsed().as_micros() as u64;
        out.usage.wall_time_us = out.timings.run_us;
        out.timings.start_us = self.start_us;
        out.weakened = self.weakened.clone();
        out.warnings = self.warnings.clone();
        if let Some(s) = seen.runsc_signal {
            out.warnings
                .push(format!("runsc itself was killed by signal {s}"));
        }
        // Output leaving the sandbox is scanned: known secrets redacted, credential
        // formats flagged (the container tier's scanner).
        cordon_host::egress::scan_outcome(&mut out, self.egress.as_mut());
        Ok(out)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        validate_sandbox_path(path)?;
        self.workspace()?
            .put(path, mode, data)
            .map_err(|(code, message)| cordon_guest::host::file_error(path, code, message))
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        validate_sandbox_path(path)?;
        let (data, truncated) = self
            .workspace()?
            .get(path, max_bytes)
            .map_err(|(code, message)| cordon_guest::host::file_error(path, code, message))?;
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
        // The proxy (and every placeholder with it) ends with the sandbox.
        self.egress = None;
        self.workspace = None;
        workspace::unmount(&self.work);
        let removed = std::fs::remove_dir_all(&self.bundle)
            .map_err(|e| Error::io(format!("removing the bundle of {}", self.id), e));
        // Each exec's runsc has been waited for: nothing runs as the sandbox's id.
        self.ids = None;
        removed
    }
}

impl Drop for GvisorSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(code: i32) -> Observed {
        Observed {
            code: Some(code),
            ..Observed::default()
        }
    }

    #[test]
    fn classification_follows_what_was_observed() {
        assert_eq!(classify(seen(0)), (Termination::Exited, Some(0), None));
        assert_eq!(classify(seen(7)), (Termination::Exited, Some(7), None));
        assert_eq!(
            classify(seen(143)),
            (Termination::Signalled, None, Some(15))
        );
        let oom = Observed {
            oom: true,
            ..seen(137)
        };
        assert_eq!(classify(oom).0, Termination::OutOfMemory);
        let bomb = Observed {
            forks_refused: true,
            ..seen(1)
        };
        assert_eq!(classify(bomb).0, Termination::ProcessLimit);
        // A limit Cordon stopped the exec for wins over what followed.
        let stopped = Observed {
            stopped: Some(Termination::Timeout),
            forks_refused: true,
            ..seen(137)
        };
        assert_eq!(classify(stopped).0, Termination::Timeout);
        let full = Observed {
            disk_full: true,
            ..seen(1)
        };
        assert_eq!(classify(full).0, Termination::DiskLimit);
        assert_eq!(classify(seen(128 + 25)).0, Termination::DiskLimit);
        let full_ok = Observed {
            disk_full: true,
            ..seen(0)
        };
        assert_eq!(classify(full_ok).0, Termination::Exited);
        let crashed = Observed {
            runsc_signal: Some(9),
            ..Observed::default()
        };
        assert_eq!(
            classify(crashed),
            (Termination::SandboxFailure, None, Some(9))
        );
    }

    #[test]
    fn etc_has_no_host_secrets_and_names_the_sandbox_user() {
        let files = etc_files(1000);
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        assert!(!names.contains(&"shadow"));
        assert!(
            files
                .iter()
                .any(|(n, c)| *n == "passwd" && c.contains(":1000:1000:"))
        );
    }
}
