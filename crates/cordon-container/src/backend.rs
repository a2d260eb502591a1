//! Host side of the container tier.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    ArchiveReport, Backend, Capability, Error, ExecOutcome, ExecRequest, FileOp, FileReply,
    OutputSink, Probe, ProcOutput, ProcSignal, Result, Sandbox, SandboxId, SandboxSpec,
    Termination, Tier, Weakening,
};
use cordon_guest::proto::{self, PROTOCOL_VERSION, Reply, Request, StdioMode};
use cordon_host::agent::{self, AgentConn, Filled};
use cordon_host::files::{Answer, ConnIo, refuse_unscanned};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::cgroup::{self, SandboxCgroup};
use crate::init::{InitBegin, InitJoin, InitSetup};
use crate::landlock_rules;
use crate::seccomp::SeccompPolicy;

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
        Ok(Box::new(crate::snapshot::start(self, image, dir, spec)?))
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
            return Err(Error::Invalid(format!(
                "the container backend was asked for a {} sandbox",
                spec.tier
            )));
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
                return Err(Error::Invalid(format!(
                    "template {name:?} was not resolved before the create; resolve it with \
                     the template store (cordon_template::Store::resolve_spec) first"
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
        let limits = &spec.limits;
        let id = SandboxId::random()?;
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
                    sb.teardown();
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
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "create: cgroup ready");
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
            // Checked before anything was started (create_sandbox).
            volumes: volumes_of(spec).unwrap_or_default(),
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
            None => Err(Error::Invalid(format!(
                "volume {:?} was not leased before the create; lease it with \
                 cordon_host::volume::VolumeStore::mount first",
                v.name
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

/// The major and minor numbers of a pseudo-terminal multiplexer (`ptmx`).
const PTMX: (u32, u32) = (5, 2);

impl ContainerSandbox {
    /// Starts `req` in the background with `stdio` (stdin, stdout, stderr) as the
    /// program's own descriptors: nothing of its I/O passes through the agent or the host,
    /// and no byte is kept or capped; [`Sandbox::read_background`] reports only its end.
    /// With `terminal`, the three are one [`Terminal`]'s slave, which becomes the program's
    /// controlling terminal. With `user`, the program runs as that user of the sandbox's
    /// user namespace (never id 0: refused) instead of the sandbox's own. The sandbox's
    /// limits, walls and reaper hold as for any exec.
    pub fn start_attached(
        &mut self,
        req: &ExecRequest,
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
        terminal: bool,
        user: Option<cordon_guest::proto::ProcUser>,
    ) -> Result<u64> {
        use std::os::fd::AsRawFd;
        self.ctrl()?;
        let mut parts = self.exec_parts(req)?;
        // The agent takes the passed terminal as it is; the size is the host's to set.
        parts.pty = terminal.then_some(cordon_core::PtySize { rows: 24, cols: 80 });
        let id = self.next_exec;
        self.next_exec += 1;
        let mut request = parts.background_with(id, StdioMode::Passed);
        if let Request::BgExec { user: u, .. } = &mut request {
            *u = user;
        }
        if let Some(c) = self.cgroup.as_ref().map(|c| c.counters()) {
            self.bg_counters.insert(
                id,
                BgOom::Started {
                    oom_kills: c.oom_kills,
                },
            );
        }
        let fds = stdio.map(|f| f.as_raw_fd());
        self.file_call(|io| cordon_host::procs::start_passed(io, &request, fds))?;
        Ok(id)
    }

    /// Delivers signal number `signal` (1 to 64) to background exec `id`'s program itself,
    /// as `kill(2)` would to that process (`all`: to every process of the exec): a trap in
    /// the program sees it as sent.
    pub fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        self.file_call(|io| cordon_host::procs::raise(io, id, signal, all))
    }

    /// A new pseudo-terminal of `size` in the sandbox's own devpts instance, opened from
    /// the host: its multiplexer beneath the sandbox's root (never through a symbolic or
    /// magic link, and checked to be a `ptmx`), the slave by `TIOCGPTPEER` (no path), owned
    /// by the sandbox's user. Neither end becomes a controlling terminal here.
    pub fn open_terminal(&mut self, size: cordon_core::PtySize) -> Result<Terminal> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        size.validate()?;
        self.ctrl()?;
        let fail = |what: &str, e: rustix::io::Errno| {
            Error::failed(
                format!(
                    "cannot open a terminal in the sandbox ({what}; run the process without a \
                     terminal)"
                ),
                e,
            )
        };
        let agent = self
            .outer
            .as_ref()
            .and_then(|o| sandbox_init_of(o.id()))
            .ok_or_else(|| self.gone_error())?;
        let root = rustix::fs::open(
            format!("/proc/{agent}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("its root", e))?;
        let master = rustix::fs::openat2(
            &root,
            "dev/pts/ptmx",
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| fail("its /dev/pts/ptmx", e))?;
        let st = rustix::fs::fstat(&master).map_err(|e| fail("its ptmx", e))?;
        let is_ptmx = rustix::fs::FileType::from_raw_mode(st.st_mode)
            == rustix::fs::FileType::CharacterDevice
            && (
                rustix::fs::major(st.st_rdev as _),
                rustix::fs::minor(st.st_rdev as _),
            ) == PTMX;
        if !is_ptmx {
            return Err(Error::Sandbox(
                "the sandbox's /dev/pts/ptmx is not a terminal multiplexer; destroy the \
                 sandbox"
                    .into(),
            ));
        }
        rustix::pty::unlockpt(&master).map_err(|e| fail("unlocking it", e))?;
        let slave = rustix::pty::ioctl_tiocgptpeer(
            &master,
            rustix::pty::OpenptFlags::RDWR
                | rustix::pty::OpenptFlags::NOCTTY
                | rustix::pty::OpenptFlags::CLOEXEC,
        )
        .map_err(|e| fail("its slave", e))?;
        let name = rustix::pty::ptsname(&master, Vec::new())
            .map_err(|e| fail("its name", e))?
            .to_string_lossy()
            .into_owned();
        rustix::termios::tcsetwinsize(
            &master,
            rustix::termios::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .map_err(|e| fail("its size", e))?;
        // Its program's own user owns it, as a login's terminal is owned (host ids: the
        // sandbox's range).
        if let Some(base) = self.ids.as_ref().map(|r| r.base()) {
            let id = base + self.sandbox_uid;
            rustix::fs::fchown(
                &slave,
                Some(rustix::fs::Uid::from_raw(id)),
                Some(rustix::fs::Gid::from_raw(id)),
            )
            .map_err(|e| fail("giving it to the sandbox's user", e))?;
        }
        Ok(Terminal {
            master,
            slave,
            name,
        })
    }

    /// Whether the OOM killer ended background exec `id`, which ended by `signal`: the
    /// agent cannot tell on this tier (the sandbox's cgroup is the host's), so the host
    /// compares the cgroup's OOM count with the one at its start. A SIGKILL while that
    /// count rose is taken for the OOM killer's (another process's OOM kill at the same
    /// moment would be taken for it too); the first answer is kept.
    fn bg_oom(&mut self, id: u64, signal: Option<i32>) -> bool {
        let now = self.cgroup.as_ref().map(|c| c.counters());
        let Some(entry) = self.bg_counters.get_mut(&id) else {
            return false;
        };
        if let BgOom::Started { oom_kills } = *entry {
            let oom = now.is_some_and(|c| signal == Some(9) && c.oom_kills > oom_kills);
            *entry = BgOom::Ended { oom_killed: oom };
        }
        matches!(*entry, BgOom::Ended { oom_killed: true })
    }

    /// Sends the init its join and waits for the agent's hello.
    fn start(&mut self, cfg: &ContainerConfig, join: &InitJoin) -> Result<()> {
        let Some(host) = self.init_sock.take() else {
            return Err(Error::Sandbox("the sandbox init was not started".into()));
        };
        let mut host = host;
        proto::write_frame(&mut host, join, b"")
            .map_err(|e| Error::failed("sending the join", e))?;
        host.set_read_timeout(Some(cfg.start_timeout))
            .map_err(|e| Error::io("agent socket", e))?;
        let hello = proto::read_frame::<Reply>(&mut host);
        host.set_read_timeout(None)
            .map_err(|e| Error::io("agent socket", e))?;
        match hello {
            Ok(f) => match f.header {
                Reply::Hello { version, .. } if version == PROTOCOL_VERSION => {}
                // A mismatch and the init's own words: messages, with no error to keep.
                Reply::Hello { version, .. } => {
                    return Err(Error::Sandbox(format!(
                        "sandbox init speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild both from one source tree"
                    )));
                }
                Reply::Error { message, .. } => {
                    return Err(Error::Sandbox(format!(
                        "the sandbox could not be built: {message}"
                    )));
                }
                other => {
                    return Err(unexpected_reply(
                        "unexpected first message from the sandbox",
                        &other,
                    ));
                }
            },
            Err(e) => return Err(Error::failed("the sandbox did not come up", e)),
        }
        self.ctrl = Some(AgentConn::new(host).map_err(|e| Error::io("agent socket", e))?);
        Ok(())
    }

    /// Why the sandbox can no longer be used.
    fn gone_error(&self) -> Error {
        Error::Gone {
            id: self.id.to_string(),
            reason: self.gone.clone().unwrap_or_else(|| "destroyed".into()),
        }
    }

    fn ctrl(&mut self) -> Result<&mut AgentConn> {
        if self.gone.is_some() || self.ctrl.is_none() {
            return Err(self.gone_error());
        }
        self.ctrl
            .as_mut()
            .ok_or_else(|| Error::Sandbox("no agent channel".into()))
    }

    /// Sends one request and waits for its single reply (file operations), all of the call
    /// bounded by one deadline. An agent that misses it (stuck, or stopped) leaves the
    /// sandbox failed: it is torn down, and every later call says so.
    fn call(
        &mut self,
        req: &Request,
        body: &[u8],
        max_reply: usize,
    ) -> Result<proto::Frame<Reply>> {
        let limit = self.call_timeout;
        let deadline = Instant::now() + limit;
        let ctrl = self.ctrl()?;
        let reply = ctrl
            .send(req, body, deadline)
            .and_then(|()| ctrl.recv(deadline, max_reply.saturating_add(agent::HEADER_ROOM)));
        reply.map_err(|e| self.channel_failed(e))
    }

    /// One file call of several frames (directory operations, archives), each frame sent
    /// or received within the call deadline; a channel failure ends the sandbox as in
    /// [`Self::call`].
    /// The workspace's size limit (what a snapshot of it may hold at most).
    pub(crate) fn disk_limit(&self) -> u64 {
        self.spec.limits.disk_bytes
    }

    /// Its processes are frozen (its agent too: no file call is answered until a resume).
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    pub(crate) fn file_call<T>(
        &mut self,
        f: impl FnOnce(&mut ConnIo<'_>) -> Answer<T>,
    ) -> Result<T> {
        let timeout = self.call_timeout;
        let conn = self.ctrl()?;
        match f(&mut ConnIo { conn, timeout }) {
            Ok(answer) => answer,
            Err(e) => Err(self.channel_failed(e)),
        }
    }

    /// The agent missed a deadline or its channel broke: the sandbox is torn down and
    /// every later call says why.
    fn channel_failed(&mut self, e: agent::CallError) -> Error {
        if matches!(e, agent::CallError::Timeout) {
            let secs = self.call_timeout.as_secs_f64();
            self.gone = Some(format!(
                "its agent did not answer a file call within {secs:.0} s"
            ));
            self.teardown();
            // The deadline is this process's own decision: the message says all of it.
            return Error::Sandbox(format!(
                "the sandbox did not answer within {secs:.0} s and was stopped; create a new sandbox"
            ));
        }
        self.gone = Some(format!("the sandbox agent stopped ({e})"));
        self.teardown();
        Error::failed("the sandbox agent stopped", e)
    }

    fn env_for(&self, req: &ExecRequest) -> BTreeMap<String, String> {
        let tier_env = self.egress.iter().flat_map(|l| l.env());
        cordon_core::sandbox_env(&self.spec, tier_env, req)
    }

    /// Kills everything and removes what the sandbox left on the host.
    fn teardown(&mut self) {
        tracing::debug!("teardown: begin");
        // Every process of the sandbox is in its cgroup: kill them all at once rather than
        // waiting for parent-death signals to travel down the chain. The outer init is not
        // in it and is killed last: it is the parent of the sandbox's PID-1 agent and reaps
        // it at once, and the kernel reaps the rest of the PID namespace with it. Killed
        // first, the outer init would orphan the agent to the host's init, which reaps when
        // it gets to it.
        let mut killed = 0;
        let mut dying = Vec::new();
        let had_cgroup = self.cgroup.is_some();
        if let Some(cg) = &self.cgroup
            && self.paused
        {
            // Frozen processes take no signal until thawed (cgroup v1).
            let _ = cg.thaw();
            self.paused = false;
        }
        if let Some(cg) = &self.cgroup {
            let agent = self.outer.as_ref().and_then(|o| sandbox_init_of(o.id()));
            for pid in kill_order(cg.pids(), agent) {
                killed += 1;
                match crate::sys::kill_by_pidfd(pid) {
                    Ok(Some(pidfd)) => dying.push(pidfd),
                    Ok(None) => {}
                    Err(_) => crate::sys::kill_pid(pid),
                }
            }
        }
        // Once they have exited the cgroup is empty and can go, while the outer init reaps
        // the agent and unmounts the sandbox's filesystems (it holds their namespace for
        // that): the two run side by side.
        let deadline = Instant::now() + Duration::from_millis(500);
        while !dying.is_empty() && Instant::now() < deadline {
            let mut fds: Vec<PollFd> = dying
                .iter()
                .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).max(1);
            if poll(&mut fds, PollTimeout::from(ms)).is_err() {
                break;
            }
            let exited: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(true)).collect();
            dying = dying
                .into_iter()
                .zip(exited)
                .filter_map(|(fd, gone)| (!gone).then_some(fd))
                .collect();
        }
        if let Some(cg) = self.cgroup.take()
            && !cg.kill_and_remove(Duration::from_secs(5))
        {
            tracing::warn!(sandbox = %self.id, "cgroup could not be removed; the next `cordon serve` start reaps it");
        }
        if let Some(mut outer) = self.outer.take() {
            // The outer init exits once it has reaped the agent; a few ms at most.
            if killed > 0
                && let Ok(pidfd) =
                    cordon_guest::sys::pidfd_open(nix::unistd::Pid::from_raw(outer.id() as i32))
            {
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(500u16));
            }
            let _ = outer.kill();
            let _ = outer.wait();
        }
        self.init_sock = None;
        if let Some(mut ctrl) = self.ctrl.take()
            && !had_cgroup
        {
            // Without a cgroup to watch, the agent's end of the socket closing is the sign
            // that it is gone.
            let deadline = Instant::now() + Duration::from_secs(2);
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match ctrl.fill(left) {
                    Ok(Filled::Data) => ctrl.discard(),
                    Ok(Filled::Nothing) => {}
                    Ok(Filled::Eof) | Err(_) => break,
                }
            }
        }
        tracing::debug!("teardown: processes killed");
        // The proxy (and with it every placeholder) ends with the sandbox.
        self.egress = None;
        // Every process of the sandbox is gone: its host ids may serve another.
        self.ids = None;
        tracing::debug!("teardown: done");
    }

    /// The argv, environment, working directory and per-process limits of an exec.
    fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
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

    fn run_exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
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
        let before = self.cgroup.as_ref().map(|c| {
            c.reset_peak();
            c.counters()
        });
        let t0 = Instant::now();
        let request = Request::Exec {
            id,
            argv,
            env,
            cwd,
            // The program's stdio are pipes whose ends go to the agent with the request: its
            // output never passes through the agent.
            stdio: StdioMode::Passed,
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
            kill_at_deadline: true,
            // A program that will not die, or an agent that stopped answering, ends the
            // sandbox.
            kill_grace: Duration::from_secs(3),
            // The process limit's refusals are watched this often.
            tick: Duration::from_millis(20),
        };
        let cgroup = self.cgroup.as_ref();
        let pids_hit = || match (cgroup, &before) {
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
        let driven = agent::run_framed(conn, &plan, sink, &mut fork_refused);
        let pids_hit = pids_hit();
        let run = match driven {
            Ok(run) => run,
            Err(agent::ExecError::SpawnFailed(message)) if pids_hit => {
                // The program never started: the refused fork is what ended the exec.
                let seen = cordon_core::Evidence {
                    forks_refused: true,
                    ..cordon_core::Evidence::default()
                };
                let mut o = ExecOutcome::new(Tier::Container, cordon_core::classify(&seen));
                o.stderr = format!("cordon: {message}\n").into_bytes();
                return Ok(o);
            }
            Err(e @ (agent::ExecError::SpawnFailed(_) | agent::ExecError::Refused(_))) => {
                return Err(Error::failed("starting the exec", e));
            }
            Err(e @ agent::ExecError::Protocol(_)) => {
                self.gone = Some(format!("its agent broke the protocol ({e})"));
                self.teardown();
                return Err(Error::failed("malformed frame from the sandbox agent", e));
            }
        };
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
        match (&before, &after) {
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
        Ok(o)
    }
}

impl Sandbox for ContainerSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        self.ctrl()?;
        self.run_exec(req, sink)
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        cordon_core::validate_sandbox_path(path)?;
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
        cordon_core::validate_sandbox_path(path)?;
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
        crate::snapshot::take(self, mode, dir)
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
        self.teardown();
        self.gone = Some("destroyed".into());
        Ok(())
    }
}

/// The sandbox's PID 1 (its agent): the one child of the outer init `outer`.
fn sandbox_init_of(outer: u32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The order a teardown kills a sandbox's processes in: its PID 1 (the agent) first. Its
/// death takes every process of its PID namespace with it, and once it is dead nothing
/// reports to the host. Killed one by one in the cgroup's order instead (ascending pids,
/// which wrap at `pid_max`), an exec's program could be killed before the shell waiting on
/// it, which then saw its child die and reported an ordinary exit (`Killed`, 137) through
/// the agent while the destroy was still under way.
fn kill_order(mut pids: Vec<i32>, agent: Option<i32>) -> Vec<i32> {
    pids.sort_by_key(|p| Some(*p) != agent);
    pids
}

impl Drop for ContainerSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
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

    #[test]
    fn a_teardown_kills_the_sandbox_init_first_even_after_pids_wrapped() {
        // After pids wrapped, the exec's processes have lower pids than the agent.
        assert_eq!(
            kill_order(vec![301, 302, 30000, 30001], Some(30000)),
            vec![30000, 301, 302, 30001]
        );
        assert_eq!(kill_order(vec![5, 6], None), vec![5, 6]);
        assert_eq!(kill_order(vec![5, 6], Some(9)), vec![5, 6]);
    }

    #[test]
    fn the_sandbox_init_is_the_outer_inits_child() {
        let mut outer = Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(outer.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let child: i32 = line.trim().parse().unwrap();
        assert_eq!(sandbox_init_of(outer.id()), Some(child));
        let _ = Command::new("kill").arg(child.to_string()).status();
        outer.wait().unwrap();
        assert_eq!(sandbox_init_of(outer.id()), None);
    }
}
