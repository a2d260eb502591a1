//! The gvisor tier: one live runsc sandbox (gVisor's user-space kernel, ptrace platform,
//! `--network=none`) per Cordon sandbox, with Cordon's agent as its first process
//! ([`AGENT_BINARY`]), so an exec is a message to a running agent (the framed protocol over
//! the container's stdin and stdout, driven by [`cordon_host::agent`]) rather than a new
//! `runsc run`. The bundle: a read-only root with the host's `/usr`, a fresh `/proc`, a
//! size-limited `/tmp`, and `/work` bound from a per-sandbox size-limited tmpfs on the host
//! (so files put in and taken out are host-side operations, and survive a restart).
//!
//! Each exec runs as the container tier's do: under a reaper in its own PID and mount
//! namespace (killing it ends every process the program started), as the sandbox's uid
//! with no capabilities and `no_new_privs`.
//!
//! Limits and how each is reported:
//! - memory: a cgroup limit (swap off) on the sandbox's memory cgroup, which Cordon creates
//!   and runsc joins ([`cgroup`]); its OOM counters, read across an exec, give the
//!   out-of-memory reason. When the limit ends runsc's sentry itself, the exec reports it
//!   and the next exec starts the runsc sandbox again (`/work` is kept);
//! - processes: `RLIMIT_NPROC` set by the agent on each program, not a pids cgroup (runsc
//!   counts its own threads against a pids limit and the whole sandbox dies); refused forks
//!   are seen in the sentry's trace of process-creating calls ([`nproc`]);
//! - disk: `/work` is a tmpfs of the disk limit, and `RLIMIT_FSIZE` bounds each file;
//! - timeout and output caps are the host's own; reaching one makes the agent kill the
//!   exec's reaper (and the runsc sandbox is ended if the agent does not answer).
//!
//! Egress is the container tier's path: a per-sandbox proxy on a host unix socket, bound
//! into the sandbox and opened through runsc's `--host-uds=open`, and the forwarder on
//! `127.0.0.1:3128` inside, started by the agent. A killed Cordon's leftovers (runsc state,
//! cgroups, bundles) are reaped by the next backend ([`reap`]).

mod bundle;
mod nproc;
pub mod reap;
mod sys;
mod workspace;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Error, ExecOutcome, ExecRequest, OutputSink, Probe, Result, Sandbox,
    SandboxId, SandboxSpec, Termination, Tier, Weakening, validate_sandbox_path,
};
use cordon_guest::proto::{PROTOCOL_VERSION, ProcLimits, Reply, Request, StdioMode};
use cordon_host::agent::{self, AgentConn, CallError, HEADER_ROOM};
use cordon_host::egress::{EgressLink, SANDBOX_PROXY_PORT, SOCKET_INSIDE};

use crate::nproc::NprocWatch;
use cordon_host::cgroup::{self as cgroup, Counters, Limits, SandboxCgroup};

/// Errors of the gvisor tier, turned into [`cordon_core::Error`] at the API boundary.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error("workspace: {0}")]
    Workspace(String),
    #[error("runsc: {0}")]
    Runsc(String),
    /// A host call of the tier failed. `what` names it and never a host path (a tenant may
    /// read it); the path goes to the operator's log.
    #[error("{what}: {source}")]
    Host {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Name of the in-sandbox agent binary, looked up next to the running executable.
pub const AGENT_BINARY: &str = "cordon-gvisor-agent";

/// A process-limit refusal that keeps recurring this long after the first one stops the
/// exec (a fork bomb would otherwise run until its timeout).
const NPROC_GRACE: Duration = Duration::from_secs(2);
/// How long an exec's end waits for the fork-refusal log reader to catch up.
const NPROC_SYNC: Duration = Duration::from_millis(250);

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
    /// The `cordon-gvisor-agent` binary: the first process of every sandbox.
    pub agent: PathBuf,
    /// How long runsc may take to start a sandbox and its agent to say hello.
    pub start_timeout: Duration,
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
    /// runsc from `PATH`; the agent from `$CORDON_GVISOR_AGENT`, else next to the current
    /// executable (or its parent, for test binaries under `deps/`).
    pub fn discover() -> Self {
        let runsc = std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("runsc"))
                    .find(|c| c.is_file())
            })
            .unwrap_or_else(|| PathBuf::from("/usr/bin/runsc"));
        // Absolute: it is the source of a bind in the bundle, which runsc resolves from
        // its own working directory.
        let agent = std::env::var_os("CORDON_GVISOR_AGENT")
            .map(PathBuf::from)
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                let dir = exe.parent()?;
                [dir.join(AGENT_BINARY), dir.parent()?.join(AGENT_BINARY)]
                    .into_iter()
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| PathBuf::from(AGENT_BINARY));
        GvisorConfig {
            runsc,
            state_root: PathBuf::from("/run/cordon-gvisor"),
            scratch_root: data_dir().join("scratch").join("gvisor"),
            platform: "ptrace".to_string(),
            agent,
            start_timeout: Duration::from_secs(30),
            ids: cordon_host::idpool::IdPool::system(),
        }
    }
}

pub struct GvisorBackend {
    config: GvisorConfig,
    /// Where this host's memory controller is, found once.
    memory_controller: OnceLock<Option<(cgroup::Version, PathBuf)>>,
}

/// Parent of every gvisor sandbox's cgroup, under each hierarchy's root (each start of a
/// sandbox's runsc gets `<sandbox id>-<n>` below it, so the orphan sweep finds what a
/// killed Cordon left).
pub const CGROUP_PARENT: &str = "cordon-gvisor";

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
            memory_controller: OnceLock::new(),
        }
    }

    pub fn config(&self) -> &GvisorConfig {
        &self.config
    }

    fn memory_controller(&self) -> Option<&(cgroup::Version, PathBuf)> {
        self.memory_controller
            .get_or_init(cgroup::memory_controller)
            .as_ref()
    }

    /// Removes what dead Cordon processes left: runsc containers, cgroups, bundles and
    /// egress sockets of sandboxes whose owning process is gone. Returns one line per thing
    /// removed. Runs at every `create`; safe beside live sandboxes of other processes.
    pub fn reap_orphans(&self) -> Vec<String> {
        let delete = |cid: &str| force_delete(&self.config, cid);
        let removed = reap::Sweep {
            scratch: &self.config.scratch_root,
            state_root: &self.config.state_root,
            cgroups: self.memory_controller().is_some(),
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
    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

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
        let memory = self.memory_controller();
        let agent_ok = self.config.agent.is_file();
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
                    ok: memory.is_some(),
                    detail: match memory {
                        Some((cgroup::Version::V2, p)) => format!("cgroup v2 at {}", p.display()),
                        Some((cgroup::Version::V1, p)) => {
                            format!("cgroup v1 memory controller at {}", p.display())
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
                    name: "agent".into(),
                    ok: agent_ok,
                    detail: self.config.agent.display().to_string(),
                    fix: Some(format!(
                        "build it (cargo build --workspace --bins) and keep {AGENT_BINARY} \
                         next to cordon, or set CORDON_GVISOR_AGENT"
                    )),
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
        if !self.config.runsc.is_file() || !nix::unistd::geteuid().is_root() {
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: "runsc is missing or cordon is not root".into(),
                fix: "run scripts/setup.d/60-gvisor.sh and run as root; see `cordon doctor`".into(),
            });
        }
        let egress = !spec.egress.allow.is_empty() || !spec.grants.is_empty();
        if !self.config.agent.is_file() {
            tracing::error!(agent = %self.config.agent.display(), "gvisor: the agent binary is missing");
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: format!("its in-sandbox agent ({AGENT_BINARY}) is not installed"),
                fix: format!(
                    "build it (cargo build --workspace --bins) and keep {AGENT_BINARY} next \
                     to cordon, or set CORDON_GVISOR_AGENT"
                ),
            });
        }
        if let (Some(name), None) = (&spec.template, &spec.resolved_template) {
            return Err(Error::Invalid(format!(
                "template {name:?} was not resolved before the create; resolve it with the \
                 template store (cordon_template::Store::resolve_spec) first"
            )));
        }
        let mut weakened = Vec::new();
        let mut warnings = Vec::new();
        let cgroups = match self.memory_controller() {
            Some(_) => true,
            None if spec.allow_weaker.contains(&Weakening::Cgroups) => {
                weakened.push(Weakening::Cgroups);
                warnings.push(
                    "running without a memory cgroup: the memory limit is not enforced".into(),
                );
                false
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
        let swept_us = t.elapsed().as_micros() as u64;
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
            cgroups,
            egress: None,
            live: None,
            starts: 0,
            next_exec: 1,
            start_us: 0,
            destroyed: false,
            weakened,
            warnings,
            file_findings: Vec::new(),
            volumes: Vec::new(),
        };
        let built = sb.build(egress);
        let built_us = t.elapsed().as_micros() as u64;
        if let Err(e) = built.and_then(|()| sb.start_live()) {
            let _ = sb.destroy();
            return Err(e);
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, swept_us, built_us, ready_us = sb.start_us, "gvisor: created");
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
    /// Whether each start of its runsc gets a memory cgroup (none only where allowed weaker).
    cgroups: bool,
    egress: Option<EgressLink>,
    /// The running runsc sandbox and its agent; None before the first start, once
    /// destroyed, and after the sandbox was lost (the next exec starts it again).
    live: Option<Live>,
    /// runsc sandboxes started so far (each is `<id>-<n>`).
    starts: u32,
    next_exec: u64,
    start_us: u64,
    destroyed: bool,
    weakened: Vec<Weakening>,
    warnings: Vec<String>,
    /// Scan findings of files taken out, until reported.
    file_findings: Vec<cordon_core::Finding>,
    /// The volumes' idmapped binds in the bundle: (bind, path inside, read-only).
    volumes: Vec<(PathBuf, String, bool)>,
}

/// One running runsc sandbox with Cordon's agent as its first process.
struct Live {
    /// `<sandbox id>-<n>`: runsc's container id and the cgroup's name.
    cid: String,
    /// `runsc run`, in the foreground: it exits with the sandbox.
    runsc: Child,
    /// The agent's channel: the container's stdout (read) and stdin (written).
    conn: AgentConn,
    cgroup: Option<SandboxCgroup>,
    /// Refused forks, from the sentry's trace of process-creating calls.
    watch: NprocWatch,
    /// The last bytes runsc and the agent wrote on stderr (why a start failed).
    stderr: Arc<Mutex<Vec<u8>>>,
    /// `runsc pause` stopped it.
    paused: bool,
}

/// How much of runsc's stderr is kept for diagnostics.
const STDERR_TAIL: usize = 4096;

use bundle::AGENT_INSIDE;

/// Regular files under `dir`, recursively.
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                todo.push(e.path());
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    Ok(out)
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
    /// Binds each leased volume into the bundle, idmapped so the sandbox's host uid writes
    /// files stored as the volumes' canonical owner, and makes its mount point in the fresh
    /// /work (nothing has run there yet, so no symlink can be in the way).
    fn bind_volumes(&mut self) -> Result<()> {
        for (i, v) in self.spec.volumes.iter().enumerate() {
            let Some(src) = &v.source else {
                return Err(Error::Invalid(format!(
                    "volume {:?} was not leased before the create; lease it with \
                     cordon_host::volume::VolumeStore::mount first",
                    v.name
                )));
            };
            let mut at = self.work.clone();
            for c in v.path.split('/') {
                at.push(c);
                match std::fs::create_dir(&at) {
                    Ok(()) => nix::unistd::chown(
                        &at,
                        Some(nix::unistd::Uid::from_raw(self.uid)),
                        Some(nix::unistd::Gid::from_raw(self.uid)),
                    )
                    .map_err(|e| Error::io("making a volume's mount point", e.into()))?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::io("making a volume's mount point", e)),
                }
            }
            let bind = self.bundle.join(format!("volume-{i}"));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&bind)
                .map_err(|e| Error::io("making a volume's bind", e))?;
            cordon_host::volume::bind_mapped(&src.host_dir, &bind, self.uid, v.read_only)?;
            self.volumes.push((bind, v.path.clone(), v.read_only));
        }
        Ok(())
    }

    /// Lays out the bundle: owner record, root skeleton, /etc, the /work tmpfs, egress.
    fn build(&mut self, egress: bool) -> Result<()> {
        let bundle = self.bundle.clone();
        let sid = self.id.to_string();
        let io = |what: &str, e| Error::io(format!("{what} in the bundle of {sid}"), e);
        // First, so that a Cordon killed from here on leaves something the sweep can judge.
        std::fs::write(bundle.join(reap::OWNER_FILE), reap::owner_record())
            .map_err(|e| io("writing the owner record", e))?;
        // And host-wide, before any runsc container or cgroup of it exists: sweeps from
        // other data dirs see those and not this bundle.
        reap::register(&self.config.state_root, &sid)
            .map_err(|e| io("writing the host-wide owner record", e))?;
        let rootfs = bundle.join("rootfs");
        for d in [
            "usr",
            "proc",
            "dev",
            "tmp",
            "work",
            "etc",
            "home",
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
            // E2B's home names the workspace, as code written for E2B expects.
            ("home/user", "/work"),
        ] {
            std::os::unix::fs::symlink(to, rootfs.join(link)).map_err(|e| io("linking", e))?;
        }
        std::fs::write(rootfs.join(AGENT_INSIDE.trim_start_matches('/')), b"")
            .map_err(|e| io("making the agent's mount point", e))?;
        // Mount points of the host /etc entries a root of the host's /usr shows (see
        // `config_json`); a template has its own /etc.
        let host_etc = if self.spec.resolved_template.is_none() {
            &cordon_core::HOST_ETC[..]
        } else {
            &[]
        };
        for name in host_etc {
            let host = Path::new("/etc").join(name);
            let inside = rootfs.join("etc").join(name);
            if host.is_dir() {
                std::fs::create_dir(&inside).map_err(|e| io("making /etc's mount points", e))?;
            } else if host.is_file() {
                std::fs::write(&inside, b"").map_err(|e| io("making /etc's mount points", e))?;
            }
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
        self.bind_volumes()?;
        if egress {
            // gVisor checks the sandbox user's permission on the socket itself (uids are
            // not remapped), so the socket and its 0700 directory belong to that uid.
            let link = EgressLink::start(self.id.as_str(), &self.spec, self.uid)?;
            std::fs::write(
                bundle.join(reap::EGRESS_FILE),
                link.socket().display().to_string(),
            )
            .map_err(|e| io("recording the egress socket", e))?;
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

    /// The OCI bundle's config for one start (crate::bundle has every field and why).
    fn config(&self, cgroup: Option<&SandboxCgroup>) -> Result<oci_spec::runtime::Spec> {
        let template = self.spec.resolved_template.as_ref();
        let egress = match &self.egress {
            Some(link) => Some(bundle::Egress {
                host_dir: link
                    .socket()
                    .parent()
                    .ok_or_else(|| Error::Sandbox("the egress socket has no directory".into()))?,
                inside_dir: Path::new(SOCKET_INSIDE)
                    .parent()
                    .ok_or_else(|| Error::Sandbox("bad egress socket path".into()))?,
                socket_inside: SOCKET_INSIDE,
                port: SANDBOX_PROXY_PORT,
            }),
            None => None,
        };
        // Without a template: the few host /etc entries that /usr points into, read-only
        // (made in `build`). With one: Cordon's /etc files (and the egress CA) over the
        // template's own.
        let (host_etc, etc_overlays) = match template {
            None => (
                cordon_core::HOST_ETC
                    .iter()
                    .map(|name| Path::new("/etc").join(name))
                    .filter(|p| p.exists())
                    .collect(),
                Vec::new(),
            ),
            Some(_) => {
                let etc = self.bundle.join("rootfs/etc");
                let files =
                    files_under(&etc).map_err(|e| Error::io("listing the bundle's /etc", e))?;
                let overlays = files
                    .into_iter()
                    .map(|file| {
                        let rel = file.strip_prefix(&etc).unwrap_or(&file);
                        (Path::new("/etc").join(rel), file.clone())
                    })
                    .collect();
                (Vec::new(), overlays)
            }
        };
        let spec = bundle::config(&bundle::Inputs {
            uid: self.uid,
            limits: &self.spec.limits,
            work: &self.work,
            agent: &self.config.agent,
            volumes: &self.volumes,
            egress,
            template_root: template.map(|t| t.root.as_path()),
            host_etc,
            etc_overlays,
            cgroups_path: cgroup.map(SandboxCgroup::oci_path),
        })?;
        if let Some(t) = template {
            // runsc makes a missing bind destination in the root it is given: every one must
            // be in the template already (import makes them), or the template would change.
            for dest in bundle::bind_destinations(&spec) {
                let dest = dest.to_string_lossy();
                if cordon_template::resolve_in_root(&t.root, &dest).is_none_or(|p| !p.exists()) {
                    return Err(Error::Invalid(format!(
                        "template {:?} lacks the mount point {dest} the gvisor tier needs; \
                         import it again with this version of cordon (cordon template rm, then \
                         cordon template import)",
                        t.name
                    )));
                }
            }
        }
        Ok(spec)
    }

    /// Starts the runsc sandbox with the agent and waits for its hello.
    fn start_live(&mut self) -> Result<()> {
        self.starts += 1;
        let cid = format!("{}-{}", self.id.as_str(), self.starts);
        let l = self.spec.limits.clone();
        // Memory (swap off) and the CPU quota; no pids controller: processes are bounded by
        // RLIMIT_NPROC inside (a pids cgroup crashes runsc).
        let limits = Limits {
            memory: l.memory_bytes,
            pids: None,
            cpus: l.cpus,
        };
        let cgroup = if self.cgroups {
            Some(
                SandboxCgroup::create_in(CGROUP_PARENT, &cid, &limits).map_err(|e| {
                    Error::LayerUnavailable {
                        layer: "cgroups".into(),
                        reason: e.to_string(),
                    }
                })?,
            )
        } else {
            None
        };
        let remove_cgroup = |cg: &Option<SandboxCgroup>| {
            if let Some(cg) = cg {
                cg.remove_everywhere(Duration::from_secs(2));
            }
        };
        let cfg = match self.config(cgroup.as_ref()).and_then(|c| {
            serde_json::to_vec(&c).map_err(|e| Error::failed("encoding config.json", e))
        }) {
            Ok(c) => c,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(e);
            }
        };
        if let Err(e) = write_private(&self.bundle.join("config.json"), &cfg) {
            remove_cgroup(&cgroup);
            return Err(Error::io("writing config.json", e));
        }
        let log = self.bundle.join(format!("sentry-{}.log", self.starts));
        let watch = match NprocWatch::start(&log) {
            Ok(w) => w,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(Error::failed("watching the sandbox's process limit", e));
            }
        };
        let mut cmd = runsc_base(&self.config);
        if self.egress.is_some() {
            // Lets the gofer open host unix sockets the sandbox can see: only the egress
            // proxy's, bound read-only at /run/cordon.
            cmd.arg("--host-uds=open");
        }
        if cgroup.is_none() {
            cmd.arg("--ignore-cgroups");
        }
        if self.spec.resolved_template.is_some() {
            // The template's root stays as it is on the host: the sandbox's writes to it go
            // to an overlay upper in the sentry's memory, charged to the sandbox's cgroup.
            cmd.arg("--overlay2=root:memory");
        }
        cmd.arg(format!("--debug-log={}", log.display()))
            .args(["--debug-command=boot", "--strace"])
            .arg(format!("--strace-syscalls={}", nproc::TRACED))
            .args(["run", "--bundle"])
            .arg(&self.bundle)
            .arg(&cid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        sys::die_with_parent(&mut cmd);
        // runsc outlives this call: it is tied to a thread that lives as long as the
        // process, not to the (possibly short-lived) thread that creates the sandbox.
        let mut runsc = match cordon_host::spawn_tied(cmd) {
            Ok(c) => c,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(Error::io("starting runsc", e));
            }
        };
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = runsc.stderr.take() {
            keep_tail(err, stderr.clone());
        }
        let conn = match (runsc.stdout.take(), runsc.stdin.take()) {
            (Some(out), Some(inp)) => AgentConn::pipes(OwnedFd::from(out), OwnedFd::from(inp))
                .map_err(|e| Error::io("the agent's channel", e)),
            _ => Err(Error::Sandbox("runsc was started without its pipes".into())),
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                let _ = runsc.kill();
                let _ = runsc.wait();
                remove_cgroup(&cgroup);
                return Err(e);
            }
        };
        self.live = Some(Live {
            cid,
            runsc,
            conn,
            cgroup,
            watch,
            stderr,
            paused: false,
        });
        let deadline = Instant::now() + self.config.start_timeout;
        let hello = match self.live.as_mut() {
            Some(live) => live.conn.recv(deadline, HEADER_ROOM),
            None => Err(CallError::Closed),
        };
        let failed = match hello.map(|f| f.header) {
            Ok(Reply::Hello { version, .. }) if version == PROTOCOL_VERSION => return Ok(()),
            Ok(Reply::Hello { version, .. }) => format!(
                "the sandbox agent speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild both from one source tree"
            ),
            Ok(other) => format!("an unexpected first message from the sandbox agent ({other:?})"),
            Err(CallError::Timeout) => format!(
                "runsc did not start the sandbox within {} s",
                self.config.start_timeout.as_secs()
            ),
            Err(e) => format!("the sandbox did not come up ({e})"),
        };
        let detail = self.stop_live();
        tracing::warn!(sandbox = %self.id, "gvisor: {failed}; runsc said: {detail}");
        // runsc's own words may name host paths: they go to the log, the tenant gets this
        // message (with no source to keep).
        Err(Error::Sandbox(format!(
            "{failed}; see `cordon doctor` (runsc's own message is in the server log)"
        )))
    }

    /// Ends the runsc sandbox (every process in it) and removes its runsc state and
    /// cgroup. Returns the tail of what runsc wrote on stderr.
    fn stop_live(&mut self) -> String {
        self.stop_live_with(false)
    }

    /// As [`Self::stop_live`]; `graceful` first asks a healthy agent to shut down, which
    /// ends the container and lets `runsc run` remove it itself (two fewer runsc starts
    /// than a kill and a forced delete).
    fn stop_live_with(&mut self, graceful: bool) -> String {
        let Some(live) = self.live.take() else {
            return String::new();
        };
        let Live {
            cid,
            mut runsc,
            mut conn,
            cgroup,
            watch,
            stderr,
            paused,
        } = live;
        if paused {
            // A paused sandbox is resumed first: its processes take the kill then.
            let mut p = runsc_base(&self.config);
            p.arg("resume").arg(&cid);
            let _ = quiet(p).status();
        }
        let t = Instant::now();
        if graceful && matches!(runsc.try_wait(), Ok(None)) {
            let by = Instant::now() + Duration::from_millis(500);
            if conn.send(&Request::Shutdown, b"", by).is_ok() {
                drop(conn);
                let until = Instant::now() + Duration::from_secs(2);
                while matches!(runsc.try_wait(), Ok(None)) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        let exited_us = t.elapsed().as_micros() as u64;
        let forced = matches!(runsc.try_wait(), Ok(None)) || has_state(&self.config, &cid);
        if forced {
            force_delete(&self.config, &cid);
        }
        let deleted_us = t.elapsed().as_micros() as u64;
        let _ = runsc.kill();
        let _ = runsc.wait();
        reap::remove_lock(&self.config.state_root, &cid);
        watch.finish();
        if let Some(cg) = &cgroup
            && !cg.remove_everywhere(Duration::from_secs(5))
        {
            tracing::warn!(cgroup = %cg.oci_path(), "could not remove a sandbox cgroup; the next create reaps it");
        }
        tracing::debug!(%cid, graceful, exited_us, forced, deleted_us, done_us = t.elapsed().as_micros() as u64, "gvisor: runsc sandbox stopped");
        let tail = stderr.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&tail).trim().to_string()
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

/// Keeps the last [`STDERR_TAIL`] bytes of `r` (runsc's and the agent's stderr) on a
/// thread of its own, so the pipe never fills.
fn keep_tail(mut r: impl Read + Send + 'static, tail: Arc<Mutex<Vec<u8>>>) {
    let spawned = std::thread::Builder::new()
        .name("gvisor-stderr".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(PoisonError::into_inner);
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("gvisor: no thread to read runsc's stderr: {e}");
    }
}

impl GvisorSandbox {
    /// The argv, environment, working directory and per-process limits of an exec.
    fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
        let tier_env = self.egress.iter().flat_map(|e| e.env());
        let env = cordon_core::sandbox_env(&self.spec, tier_env, req);
        let l = &self.spec.limits;
        let limits = ProcLimits {
            open_files: l.open_files,
            file_size: l.disk_bytes,
            address_space: 0,
            // gVisor's kernel enforces RLIMIT_NPROC per user: the sandbox's programs
            // share one uid, so this bounds all of them at once.
            processes: u64::from(l.pids),
        };
        cordon_host::agent::ExecParts::new(req, &self.spec, (Tier::Gvisor, false), env, limits)
    }

    /// One call on a background exec over the running sandbox's agent channel; a channel
    /// that fails stops the sandbox (the next exec starts it again, without them).
    fn bg_call<T>(
        &mut self,
        f: impl FnOnce(&mut dyn cordon_host::files::FrameIo) -> cordon_host::files::Answer<T>,
    ) -> Result<T> {
        let live = self.running_live(|| {
            "the sandbox is not running, so neither are its background execs; start them again"
                .into()
        })?;
        let mut io = cordon_host::files::ConnIo {
            conn: &mut live.conn,
            timeout: BG_CALL_TIMEOUT,
        };
        match f(&mut io) {
            Ok(answer) => answer,
            Err(e) => {
                let detail = self.stop_live();
                tracing::warn!(sandbox = %self.id, "gvisor: {e}; runsc said: {detail}");
                Err(Error::failed(
                    "the sandbox agent failed (the next exec starts the sandbox again)",
                    e,
                ))
            }
        }
    }
}

impl GvisorSandbox {
    /// The live sandbox while its runsc runs; `Gone` once destroyed, and `idle`'s message
    /// when runsc is not running.
    fn running_live(&mut self, idle: impl FnOnce() -> String) -> Result<&mut Live> {
        if self.destroyed {
            return Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            });
        }
        let running = self
            .live
            .as_mut()
            .is_some_and(|l| matches!(l.runsc.try_wait(), Ok(None)));
        self.live
            .as_mut()
            .filter(|_| running)
            .ok_or_else(|| Error::Invalid(idle()))
    }

    /// `runsc pause` or `runsc resume` on the running sandbox.
    fn runsc_on_live(&mut self, verb: &str) -> Result<()> {
        let mut p = runsc_base(&self.config);
        let live =
            self.running_live(|| format!("the sandbox is not running; nothing to {verb}"))?;
        p.arg(verb).arg(&live.cid);
        match quiet(p).status() {
            Ok(st) if st.success() => {
                live.paused = verb == "pause";
                Ok(())
            }
            // An exit status is no error of its own (`ExitStatusError` is unstable).
            Ok(st) => Err(Error::Sandbox(format!(
                "runsc {verb} failed ({st}); see the server log"
            ))),
            Err(e) => Err(Error::io(format!("running runsc {verb}"), e)),
        }
    }
}

/// How long one call on a background exec may take over the agent channel.
const BG_CALL_TIMEOUT: Duration = Duration::from_secs(10);

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
        cordon_host::agent::refuse_foreground_pty(req)?;
        let cordon_host::agent::ExecParts {
            argv,
            env,
            cwd,
            limits,
            pty: _,
        } = self.exec_parts(req)?;
        let t0 = Instant::now();
        // A runsc sandbox that was lost (its memory limit ended the sentry, or its agent
        // stopped answering) is started again: /work lives on the host and survives it.
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
        let l = self.spec.limits.clone();
        let id = self.next_exec;
        self.next_exec += 1;
        let request = Request::Exec {
            id,
            argv,
            env,
            cwd,
            stdio: StdioMode::Framed,
            limits,
            last: false,
        };
        let stdin = req.stdin.clone().unwrap_or_default();
        let plan = agent::FramedExec {
            id,
            request: &request,
            stdin: &stdin,
            deadline: t0 + Duration::from_millis(req.timeout_ms.unwrap_or(l.timeout_ms)),
            stdout_cap: l.stdout_bytes,
            stderr_cap: l.stderr_bytes,
            kill_at_deadline: true,
            kill_grace: Duration::from_secs(3),
            tick: Duration::from_millis(100),
        };
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
        // What the driver and the agent saw; the log of refused forks, the workspace and
        // the sandbox's cgroup add theirs.
        let mut seen = run.evidence();
        seen.forks_refused |= refused > 0;
        seen.disk_full |= workspace::full(&self.work)
            || self
                .volumes
                .iter()
                .any(|(bind, _, ro)| !ro && workspace::volume_full(bind));
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
        Ok(out)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        validate_sandbox_path(path)?;
        self.workspace()?
            .put(path, mode, data)
            .map_err(|(code, message)| cordon_host::agent::file_error(path, code, message))
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        validate_sandbox_path(path)?;
        let (data, truncated) = self
            .workspace()?
            .get(path, max_bytes)
            .map_err(|(code, message)| cordon_host::agent::file_error(path, code, message))?;
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

    fn file_op(&mut self, op: &cordon_core::FileOp) -> Result<cordon_core::FileReply> {
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

    fn pause(&mut self) -> Result<()> {
        self.runsc_on_live("pause")
    }

    fn resume(&mut self) -> Result<()> {
        self.runsc_on_live("resume")
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
        self.bg_call(|io| cordon_host::procs::read(io, id, from, max))
    }

    fn write_background(&mut self, id: u64, data: &[u8]) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::write(io, id, data))
    }

    fn resize_background(&mut self, id: u64, size: cordon_core::PtySize) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::resize(io, id, size))
    }

    fn signal_background(&mut self, id: u64, signal: cordon_core::ProcSignal) -> Result<()> {
        self.bg_call(|io| cordon_host::procs::signal(io, id, signal))
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

#[cfg(test)]
mod tests {
    use super::*;

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
