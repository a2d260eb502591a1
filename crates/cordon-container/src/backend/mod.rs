//! Host side of the container tier.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Error, Probe, Result, Sandbox, SandboxId, SandboxSpec, Tier, Weakening,
};
use cordon_guest::proto::{self, Reply};
use cordon_host::agent::AgentConn;

use crate::cgroup::{self, SandboxCgroup};
use crate::init::{InitBegin, InitEnd, InitJoin, InitSetup};
use crate::landlock_rules;
use crate::seccomp::SeccompPolicy;

mod attach;
mod exec;
mod life;
mod sandbox;

/// Where the sandbox init binary is and how sandboxes are set up.
#[derive(Debug, Clone)]
pub struct ContainerConfig {
    /// The `cordon-sandbox-init` binary.
    pub init_path: PathBuf,
    /// Where each sandbox leases its own range of host ids (its root maps to the range's
    /// first id, 65536 ids are mapped, and its user namespace is created by that id).
    pub ids: crate::idpool::IdPool,
    /// The uid programs run as inside.
    pub sandbox_uid: u32,
    pub hostname: String,
    /// How long a sandbox may take to come up before creation fails.
    pub start_timeout: Duration,
    /// How long the agent may take over one file call (each read or write on its socket)
    /// before the sandbox is declared failed and torn down.
    pub call_timeout: Duration,
    /// The cgroup (below each hierarchy's root) each sandbox's own cgroup is made in:
    /// `None` is `cordon/`; cordon-oci names the pod's (`cordon_host::cgroup::place`).
    pub cgroup_parent: Option<String>,
    /// A network namespace each sandbox joins instead of making its own (a kubelet's pod's,
    /// walled by cordon-oci: ADR 0029). `None`: its own, loopback only.
    pub netns: Option<PathBuf>,
    /// The loopback port of the sandbox's egress forwarder when it is not the default
    /// (a pod's containers share one loopback, so each has a port of its own).
    pub proxy_port: Option<u16>,
    /// How long the agent keeps a reaper readied for the next exec that none asks for
    /// (`cordon_guest::AgentConfig::standby_idle`); `None` keeps it for the sandbox's life.
    pub standby_idle: Option<Duration>,
    /// This process ends with its sandbox (a one-shot `cordon run`): a destroy kills every
    /// process of the sandbox and returns, and the sandbox init, holding the id lease,
    /// reaps them, removes the cgroup and lets the ids go once it is all gone (ADR 0044).
    /// A sandbox with volumes or host directories is ended here as always (the caller lets
    /// those go after the destroy). Never for a process that goes on making sandboxes:
    /// every range ended so stays this process's until it exits.
    pub end_in_init: bool,
    /// Each sandbox shows a boot id of its own in `/proc/sys/kernel/random/boot_id`, not
    /// the host's: one tenant's sandbox cannot tell from it that it shares a host with
    /// another's, and a sandbox started again from its files has a new one. It costs a bind
    /// mount in each exec's `/proc` (about 0.19 ms of CPU an exec, ADR 0047); a one-shot
    /// `cordon run`, on its user's own machine with no other tenant, keeps the host's.
    pub own_boot_id: bool,
}

/// Name of the init binary, looked up next to the running executable.
pub const INIT_BINARY: &str = "cordon-sandbox-init";

impl ContainerConfig {
    /// Finds the init binary: `$CORDON_SANDBOX_INIT`, else next to the current executable
    /// (or its parent, for test binaries under `deps/`).
    pub fn discover() -> Self {
        let init_path = std::env::var_os("CORDON_SANDBOX_INIT")
            .map(PathBuf::from)
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                let dir = exe.parent()?;
                [dir.join(INIT_BINARY), dir.parent()?.join(INIT_BINARY)]
                    .into_iter()
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| PathBuf::from(INIT_BINARY));
        Self::with_init(init_path)
    }

    pub fn with_init(init_path: PathBuf) -> Self {
        ContainerConfig {
            init_path,
            ids: crate::idpool::IdPool::system(),
            sandbox_uid: 1000,
            hostname: "sandbox".to_string(),
            start_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            cgroup_parent: None,
            netns: None,
            proxy_port: None,
            standby_idle: Some(cordon_guest::STANDBY_IDLE),
            end_in_init: false,
            own_boot_id: true,
        }
    }

    /// The loopback port the sandbox's egress forwarder listens on.
    fn forwarder_port(&self) -> u16 {
        self.proxy_port.unwrap_or(crate::egress::SANDBOX_PROXY_PORT)
    }
}

/// The container tier.
pub struct ContainerBackend {
    cfg: ContainerConfig,
    seccomp: OnceLock<std::result::Result<SeccompPolicy, String>>,
    landlock: OnceLock<std::result::Result<i32, String>>,
    /// A sandbox init started ahead of the request (see [`ContainerBackend::start_init_early`]).
    early: Mutex<Option<Started>>,
}

impl ContainerBackend {
    pub fn new(cfg: ContainerConfig) -> Self {
        ContainerBackend {
            cfg,
            seccomp: OnceLock::new(),
            landlock: OnceLock::new(),
            early: Mutex::new(None),
        }
    }

    /// Starts a sandbox init now, for the next [`create`](Backend::create) to use: it makes
    /// the sandbox's namespaces (the costliest step of a create) while the caller is still
    /// parsing its request. A CLI that runs one sandbox calls this first thing. If no create
    /// follows, dropping the backend stops the init. (Off the main thread the init is started
    /// by a process-lifetime thread, as every init is: it dies with the thread that started
    /// it.)
    pub fn start_init_early(&self) -> Result<()> {
        let started = start_init(&self.cfg)?;
        let old = self
            .early
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(started);
        if let Some(old) = old {
            stop_unused_init(old);
        }
        Ok(())
    }

    fn seccomp(&self) -> &std::result::Result<SeccompPolicy, String> {
        // Cached and shown as the seccomp layer's reason (`Error::LayerUnavailable` and the
        // probe carry text): the typed error ends here.
        self.seccomp
            .get_or_init(|| SeccompPolicy::default_policy().map_err(|e| e.to_string()))
    }

    fn landlock_abi(&self) -> &std::result::Result<i32, String> {
        self.landlock.get_or_init(landlock_rules::probe)
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl Backend for ContainerBackend {
    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

    fn tier(&self) -> Tier {
        Tier::Container
    }

    /// Container sandboxes' cgroups (and every process still in them) that the records
    /// name, cgroups no record names that stay empty (a create cut short), and egress
    /// socket directories (and CA bundles) whose proxy died.
    fn recover(&self, orphans: &[String]) -> Vec<String> {
        let ids: std::collections::BTreeSet<&str> = orphans.iter().map(String::as_str).collect();
        let mut removed: Vec<String> = if ids.is_empty() {
            Vec::new()
        } else {
            crate::cgroup::reap_orphans(|name| !ids.contains(name))
                .into_iter()
                .map(|name| format!("cgroup cordon/{name} (and its processes)"))
                .collect()
        };
        // A process killed mid-create leaves a cgroup no row names; its init died with it
        // (parent-death signal), so the cgroup is empty.
        removed.extend(
            crate::cgroup::reap_empty(std::time::Duration::from_secs(1))
                .into_iter()
                .map(|name| format!("empty cgroup cordon/{name}")),
        );
        removed.extend(
            crate::egress::reap_stale()
                .into_iter()
                .map(|id| format!("egress socket dir of {id}")),
        );
        removed
    }

    fn probe(&self) -> Probe {
        let mut caps = Vec::new();
        caps.push(if self.cfg.init_path.is_file() {
            Capability::ok("sandbox init binary", self.cfg.init_path.display().to_string())
        } else {
            Capability::missing(
                "sandbox init binary",
                format!("{} not found", self.cfg.init_path.display()),
                "build it (`cargo build --release`) and keep it next to `cordon`, or set CORDON_SANDBOX_INIT",
            )
        });
        caps.push(if is_root() {
            Capability::ok("root", "running as root: id maps and cgroups can be set up")
        } else {
            Capability::missing(
                "root",
                "not running as root",
                "run Cordon as root (rootless mode is not supported yet)",
            )
        });
        caps.push(match userns_works() {
            Ok(()) => Capability::ok("user namespaces", "a user+pid+mount+net namespace can be created"),
            Err(e) => Capability::missing(
                "user namespaces",
                e,
                "enable them: sysctl user.max_user_namespaces=10000 (and kernel.unprivileged_userns_clone=1 on Debian kernels)",
            ),
        });
        let mut landlock = match self.landlock_abi() {
            Ok(abi) if *abi >= 4 => Capability::ok("landlock", format!("ABI {abi}")),
            Ok(abi) => Capability::missing(
                "landlock",
                format!("ABI {abi}, need 4 (filesystem + TCP rules)"),
                "use a Linux 6.7+ kernel, or pass --allow-weaker landlock",
            ),
            Err(e) => Capability::missing(
                "landlock",
                e.clone(),
                "boot with Landlock enabled (lsm=...,landlock), or pass --allow-weaker landlock",
            ),
        };
        landlock.required = true;
        caps.push(landlock);
        caps.push(match self.seccomp() {
            Ok(p) => Capability::ok(
                "seccomp",
                format!("policy v1 compiled to {} filters", p.programs.len()),
            ),
            Err(e) => Capability::missing(
                "seccomp",
                e.clone(),
                "fix crates/cordon-init/policy/seccomp.json",
            ),
        });
        caps.push(match cgroup_probe() {
            Ok(d) => Capability::ok("cgroups", d),
            Err(e) => Capability::missing(
                "cgroups",
                e,
                "mount the memory, pids and cpu controllers (v1) or enable them in the root subtree_control (v2), run as root; or pass --allow-weaker cgroups",
            ),
        });
        let mut py = if std::path::Path::new("/usr/bin/python3").exists() {
            Capability::ok("python3 in /usr", "/usr/bin/python3")
        } else {
            Capability::missing("python3 in /usr", "absent", "apt-get install python3")
        };
        py.required = false;
        caps.push(py);
        let notes = vec![
            "one shared kernel: good hygiene against accidents, not a boundary against an adversary; use gvisor or microvm for untrusted input".to_string(),
        ];
        Probe::from_capabilities(Tier::Container, caps, notes)
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.create_sandbox(spec)?))
    }

    fn start_from_snapshot(
        &self,
        image: &cordon_core::SnapshotImage,
        dir: &cordon_core::SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Sandbox>> {
        crate::snapshot::start(image, dir, || Ok(Box::new(self.create_sandbox(spec)?)))
    }
}

fn userns_works() -> std::result::Result<(), String> {
    use cordon_guest::sys::{Forked, fork_into};
    match fork_into(
        libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET,
    ) {
        Ok(Forked::Child) => cordon_guest::sys::exit_now(0),
        Ok(Forked::Parent(pid)) => {
            let _ = nix::sys::wait::waitpid(pid, None);
            Ok(())
        }
        Err(e) => Err(format!("cannot create namespaces: {e}")),
    }
}

fn cgroup_probe() -> std::result::Result<String, String> {
    let version = cgroup::host_version();
    let name = format!("probe-{}", std::process::id());
    // A probe's answer is the text `cordon doctor` shows.
    let cg = SandboxCgroup::create(&name, 64 << 20, 8, 0.5).map_err(|e| e.to_string())?;
    cg.remove();
    Ok(format!("{version:?}: memory, pids, cpu"))
}

impl ContainerBackend {
    pub fn create_sandbox(&self, spec: &SandboxSpec) -> Result<ContainerSandbox> {
        let t0 = Instant::now();
        spec.validate()?;
        volumes_of(spec)?;
        if spec.tier != Tier::Container {
            return Err(Error::OtherTier {
                backend: Tier::Container,
                asked: spec.tier,
            });
        }
        let mut weakened = Vec::new();
        let mut warnings = Vec::new();
        let allow = |w: Weakening| spec.allow_weaker.contains(&w);
        let landlock = match self.landlock_abi() {
            Ok(abi) if *abi >= landlock_rules::REQUIRED_ABI as i32 => true,
            other => {
                let reason = match other {
                    Ok(abi) => format!("kernel Landlock ABI {abi} < 4"),
                    Err(e) => e.clone(),
                };
                if !allow(Weakening::Landlock) {
                    return Err(Error::LayerUnavailable {
                        layer: "landlock".into(),
                        reason,
                    });
                }
                weakened.push(Weakening::Landlock);
                warnings.push(format!("running without Landlock: {reason}"));
                false
            }
        };
        let seccomp = match self.seccomp() {
            Ok(p) => Some(p.to_wire()),
            Err(e) => {
                if !allow(Weakening::Seccomp) {
                    return Err(Error::LayerUnavailable {
                        layer: "seccomp".into(),
                        reason: e.clone(),
                    });
                }
                weakened.push(Weakening::Seccomp);
                warnings.push(format!("running without seccomp: {e}"));
                None
            }
        };
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "create: checks done");
        let limits = &spec.limits;
        let template_root = match (&spec.template, &spec.resolved_template) {
            (_, Some(t)) => Some(t.root.clone()),
            (Some(name), None) => {
                return Err(Error::NotPrepared(cordon_core::Unprepared::Template(
                    name.clone(),
                )));
            }
            (None, None) => None,
        };
        let setup = InitSetup {
            sandbox_uid: self.cfg.sandbox_uid,
            hostname: self.cfg.hostname.clone(),
            disk_bytes: limits.disk_bytes,
            tmp_bytes: limits.tmp_bytes,
            landlock,
            seccomp,
            template_root,
            template_writable: spec.resolved_template.as_ref().is_some_and(|t| t.writable),
            devices: spec.devices.clone(),
            own_boot_id: self.cfg.own_boot_id,
            standby_idle_ms: self
                .cfg
                .standby_idle
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)),
        };
        let early = self.early.lock().unwrap_or_else(|p| p.into_inner()).take();
        let used_early = early.is_some();
        match self.assemble(spec, &setup, &weakened, &warnings, early, t0) {
            // An init started early may have died before the sandbox came up (killed, or
            // it failed): the create is tried once more with a fresh one, so starting
            // ahead never fails a create that would have worked without it.
            Err(e) if used_early => {
                tracing::debug!(error = %e, "create: the init started early failed; retrying");
                self.assemble(spec, &setup, &weakened, &warnings, None, t0)
            }
            done => done,
        }
    }

    /// Makes the sandbox's cgroup with its limits; without one (where the spec allows
    /// running without cgroups) the sandbox runs weakened and says so.
    fn make_cgroup(&self, sb: &mut ContainerSandbox, spec: &SandboxSpec) -> Result<()> {
        let limits = &spec.limits;
        let cgroup_limits = cordon_host::cgroup::Limits {
            memory: limits.memory_bytes,
            pids: Some(limits.pids),
            cpus: limits.cpus,
        };
        let parent = self.cfg.cgroup_parent.as_deref();
        match SandboxCgroup::create_in(
            parent.unwrap_or(cordon_host::cgroup::PARENT),
            sb.id.as_str(),
            &cgroup_limits,
        ) {
            Ok(cg) => sb.cgroup = Some(cg),
            Err(e) => {
                if !spec.allow_weaker.contains(&Weakening::Cgroups) {
                    return Err(Error::LayerUnavailable {
                        layer: "cgroups".into(),
                        reason: e.to_string(),
                    });
                }
                sb.weakened.push(Weakening::Cgroups);
                sb.warnings.push(format!(
                    "running without cgroups ({e}): memory, process and CPU limits are rlimits only"
                ));
            }
        }
        Ok(())
    }

    /// The rest of a create, its checks passed: the init (`early`, or a fresh one) told its
    /// setup at once, so it makes the namespaces and most of the root while the proxy and
    /// the cgroup are set up here; then the join, and the agent's hello.
    fn assemble(
        &self,
        spec: &SandboxSpec,
        setup: &InitSetup,
        weakened: &[Weakening],
        warnings: &[String],
        early: Option<Started>,
        t0: Instant,
    ) -> Result<ContainerSandbox> {
        let id = spec.sandbox_id()?;
        let (outer, mut host, ids) = match early {
            Some(started) => started,
            None => start_init(&self.cfg)?,
        };
        let sent = proto::write_frame(&mut host, setup, b"");
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "create: init spawned");
        let mut sb = ContainerSandbox {
            id,
            spec: spec.clone(),
            outer: Some(outer),
            init_sock: Some(host),
            ctrl: None,
            cgroup: None,
            start_us: 0,
            weakened: weakened.to_vec(),
            warnings: warnings.to_vec(),
            gone: None,
            next_exec: 1,
            egress: None,
            file_findings: Vec::new(),
            call_timeout: self.cfg.call_timeout,
            ids: Some(ids),
            sandbox_uid: self.cfg.sandbox_uid,
            paused: false,
            ends_in_init: false,
            bg_counters: std::collections::HashMap::new(),
        };
        if let Err(e) = sent {
            sb.teardown();
            return Err(Error::failed("sending the setup", e));
        }
        // The proxy before the cgroup: its start (a CA, a listener) takes a while, and the
        // cgroup should be empty for as short a time as possible before the sandbox joins
        // it (crash recovery removes sandbox cgroups that stay empty).
        if crate::egress::wanted(spec) {
            let owner = sb.ids.as_ref().map_or(u32::MAX, |r| r.base());
            let port = self.cfg.forwarder_port();
            let tune = |c: &mut cordon_egress::ProxyConfig| c.sandbox_proxy_port = port;
            match crate::egress::EgressLink::start_with(sb.id.as_str(), spec, owner, tune) {
                Ok(link) => sb.egress = Some(link),
                Err(e) => {
                    sb.teardown();
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.make_cgroup(&mut sb, spec) {
            sb.teardown();
            return Err(e);
        }
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "create: cgroup ready");
        // Checked before anything was started (create_sandbox).
        let volumes = volumes_of(spec).unwrap_or_default();
        // Only a sandbox with nothing the caller lets go after the destroy: no volume, no
        // host directory.
        let own_only = spec.volumes.is_empty() && spec.host_binds.is_empty();
        let end = (self.cfg.end_in_init && own_only).then(|| {
            let (cgroups, keepable) = sb.cgroup.as_ref().map(|c| c.end_plan()).unwrap_or_default();
            InitEnd { cgroups, keepable }
        });
        sb.ends_in_init = end.is_some();
        let join = InitJoin {
            cgroup_procs: sb
                .cgroup
                .as_ref()
                .map(|c| c.procs_files())
                .unwrap_or_default(),
            extra_files: sb.egress.as_ref().map(|l| l.files()).unwrap_or_default(),
            extra_copies: sb.egress.as_ref().map(|l| l.copies()).unwrap_or_default(),
            connect_port: sb.egress.as_ref().map(|_| self.cfg.forwarder_port()),
            egress_socket: sb.egress.as_ref().map(|l| l.socket().to_path_buf()),
            volumes,
            end,
        };
        if let Err(e) = sb.start(&self.cfg, &join) {
            sb.teardown();
            return Err(e);
        }
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "create: agent ready");
        sb.start_us = t0.elapsed().as_micros() as u64;
        Ok(sb)
    }
}

/// The join's volumes: each must have been leased (its host mount filled in) first; then
/// the host directories the node allowed (`host_binds`), under /work or elsewhere.
fn volumes_of(spec: &SandboxSpec) -> Result<Vec<crate::init::InitVolume>> {
    let binds = spec.host_binds.iter().map(|b| {
        cordon_core::validate_bind_target(&b.target)?;
        Ok(crate::init::InitVolume {
            host_dir: b.source.clone(),
            path: b.under_work().unwrap_or_default().to_string(),
            read_only: b.read_only,
            at: b.under_work().is_none().then(|| b.target.clone()),
        })
    });
    spec.volumes
        .iter()
        .map(|v| match &v.source {
            Some(src) => Ok(crate::init::InitVolume {
                host_dir: src.host_dir.clone(),
                path: v.path.clone(),
                read_only: v.read_only,
                at: None,
            }),
            None => Err(Error::NotPrepared(cordon_core::Unprepared::Volume(
                v.name.clone(),
            ))),
        })
        .chain(binds)
        .collect()
}

/// One container sandbox.
pub struct ContainerSandbox {
    id: SandboxId,
    spec: SandboxSpec,
    outer: Option<Child>,
    /// The agent socket until the agent's hello (blocking, read with a timeout).
    init_sock: Option<UnixStream>,
    /// The agent channel once it is up.
    ctrl: Option<AgentConn>,
    cgroup: Option<SandboxCgroup>,
    start_us: u64,
    weakened: Vec<Weakening>,
    warnings: Vec<String>,
    /// Set once the sandbox can no longer be used, with the reason.
    gone: Option<String>,
    next_exec: u64,
    egress: Option<crate::egress::EgressLink>,
    /// Scan findings of files taken out, until reported.
    file_findings: Vec<cordon_core::Finding>,
    /// Deadline of each read and write of a file call.
    call_timeout: Duration,
    /// The sandbox's host id range, held until its last process is gone.
    ids: Option<crate::idpool::IdRange>,
    /// The uid (and gid) programs run as inside.
    sandbox_uid: u32,
    /// Its processes are frozen.
    paused: bool,
    /// Its init ends it once this process is gone ([`ContainerConfig::end_in_init`]).
    ends_in_init: bool,
    /// The cgroup's OOM kills when each background exec started, then whether the OOM
    /// killer ended it (see [`ContainerSandbox::bg_oom`]).
    bg_counters: std::collections::HashMap<u64, BgOom>,
}

/// What the cgroup says of one background exec's memory.
#[derive(Debug, Clone, Copy)]
enum BgOom {
    Started { oom_kills: u64 },
    Ended { oom_killed: bool },
}

/// A reply the agent should not have sent at this point. The reply is no error of its own,
/// so there is no source to keep (`Error::Failed`): it is shown in the message.
fn unexpected_reply(what: &str, reply: &Reply) -> Error {
    Error::Sandbox(format!("{what}: {reply:?}"))
}

impl Drop for ContainerBackend {
    fn drop(&mut self) {
        if let Some(started) = self
            .early
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            stop_unused_init(started);
        }
    }
}

/// A started sandbox init, its end of the agent socket and the host ids it was given.
type Started = (Child, UnixStream, crate::idpool::IdRange);

/// Stops an init started early that no create used; its ids go back once it is gone.
fn stop_unused_init((mut outer, host, ids): Started) {
    drop(host);
    let _ = outer.kill();
    let _ = outer.wait();
    drop(ids);
}

/// Leases a host id range, starts the sandbox init with the agent socket as its stdin and
/// sends it the id maps, so it makes the namespaces at once; it then waits for its setup.
fn start_init(cfg: &ContainerConfig) -> Result<Started> {
    let ids = cfg
        .ids
        .allocate()
        .map_err(crate::idpool::IdPoolError::into_core)?;
    let (mut host, child) =
        UnixStream::pair().map_err(|e| Error::io("creating the agent socket", e))?;
    // The agent socket is the init's stdin: no pre-exec hook is needed, so the standard
    // library can use posix_spawn (vfork) rather than fork this whole process.
    let mut cmd = Command::new(&cfg.init_path);
    // The sandbox's PID 1 is this process: its argv is readable inside (/proc/1/cmdline),
    // so it carries its name, never the host path it was started from.
    std::os::unix::process::CommandExt::arg0(&mut cmd, crate::INIT_BINARY);
    cmd.env_clear()
        .stdin(Stdio::from(OwnedFd::from(child)))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // From a process-lifetime thread: the init's parent-death signal must follow this
    // process, not the (possibly short-lived) thread that asked for the sandbox.
    let mut outer = cordon_host::spawn_tied(cmd).map_err(|e| Error::Unavailable {
        tier: Tier::Container,
        reason: format!("cannot start {}: {e}", cfg.init_path.display()),
        fix: "build cordon-sandbox-init and keep it next to cordon, or set CORDON_SANDBOX_INIT"
            .into(),
    })?;
    let begin = InitBegin {
        id_base: ids.base(),
        id_count: crate::idpool::RANGE,
        netns: cfg.netns.clone(),
    };
    if let Err(e) = proto::write_frame(&mut host, &begin, b"") {
        let _ = outer.kill();
        let _ = outer.wait();
        return Err(Error::failed("starting the sandbox init", e));
    }
    Ok((outer, host, ids))
}

/// A pseudo-terminal of the sandbox's own devpts, opened by the host for a caller that
/// holds the master itself (an OCI engine's console).
pub use cordon_core::Terminal;
