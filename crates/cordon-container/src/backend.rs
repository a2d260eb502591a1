//! Host side of the container tier.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    ArchiveReport, Backend, Capability, Error, ExecOutcome, ExecRequest, FileOp, FileReply,
    OutputSink, OutputStream, Probe, Result, Sandbox, SandboxId, SandboxSpec, Termination, Tier,
    Weakening,
};
use cordon_guest::proto::{
    self, ErrorCode, FrameBuffer, PROTOCOL_VERSION, ProcLimits, Reply, Request, StdioMode,
};
use cordon_host::agent::CallError;
use cordon_host::files::{FrameIo, refuse_unscanned};
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

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
        }
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
    let cg = SandboxCgroup::create(&name, 64 << 20, 8, 0.5).map_err(|e| e.to_string())?;
    cg.remove();
    Ok(format!("{version:?}: memory, pids, cpu"))
}

impl ContainerBackend {
    pub fn create_sandbox(&self, spec: &SandboxSpec) -> Result<ContainerSandbox> {
        let t0 = Instant::now();
        spec.validate()?;
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
        let setup = InitSetup {
            sandbox_uid: self.cfg.sandbox_uid,
            hostname: self.cfg.hostname.clone(),
            disk_bytes: limits.disk_bytes,
            tmp_bytes: limits.tmp_bytes,
            landlock,
            seccomp,
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
            ctrl: Some(host),
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
        };
        if let Err(e) = sent {
            sb.teardown();
            return Err(sandbox_err("sending the setup", e));
        }
        // The proxy before the cgroup: its start (a CA, a listener) takes a while, and the
        // cgroup should be empty for as short a time as possible before the sandbox joins
        // it (crash recovery removes sandbox cgroups that stay empty).
        if crate::egress::wanted(spec) {
            let owner = sb.ids.as_ref().map_or(u32::MAX, |r| r.base());
            match crate::egress::EgressLink::start(sb.id.as_str(), spec, owner) {
                Ok(link) => sb.egress = Some(link),
                Err(e) => {
                    sb.teardown();
                    return Err(e);
                }
            }
        }
        match SandboxCgroup::create(
            sb.id.as_str(),
            limits.memory_bytes,
            limits.pids,
            limits.cpus,
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
            connect_port: sb
                .egress
                .as_ref()
                .map(|_| crate::egress::SANDBOX_PROXY_PORT),
            egress_socket: sb.egress.as_ref().map(|l| l.socket().to_path_buf()),
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

/// One container sandbox.
pub struct ContainerSandbox {
    id: SandboxId,
    spec: SandboxSpec,
    outer: Option<Child>,
    ctrl: Option<UnixStream>,
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
}

fn sandbox_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Sandbox(format!("{what}: {e}"))
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
    };
    if let Err(e) = proto::write_frame(&mut host, &begin, b"") {
        let _ = outer.kill();
        let _ = outer.wait();
        return Err(sandbox_err("starting the sandbox init", e));
    }
    Ok((outer, host, ids))
}

impl ContainerSandbox {
    /// Sends the init its join and waits for the agent's hello.
    fn start(&mut self, cfg: &ContainerConfig, join: &InitJoin) -> Result<()> {
        let Some(host) = self.ctrl.take() else {
            return Err(Error::Sandbox("the sandbox init was not started".into()));
        };
        let mut host = host;
        proto::write_frame(&mut host, join, b"").map_err(|e| sandbox_err("sending the join", e))?;
        host.set_read_timeout(Some(cfg.start_timeout))
            .map_err(|e| Error::io("agent socket", e))?;
        let hello = proto::read_frame::<Reply>(&mut host);
        host.set_read_timeout(None)
            .map_err(|e| Error::io("agent socket", e))?;
        match hello {
            Ok(f) => match f.header {
                Reply::Hello { version, .. } if version == PROTOCOL_VERSION => {}
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
                    return Err(sandbox_err(
                        "unexpected first message from the sandbox",
                        format!("{other:?}"),
                    ));
                }
            },
            Err(e) => return Err(sandbox_err("the sandbox did not come up", e)),
        }
        self.ctrl = Some(host);
        Ok(())
    }

    fn ctrl(&mut self) -> Result<&mut UnixStream> {
        if let Some(reason) = &self.gone {
            return Err(Error::Gone {
                id: self.id.to_string(),
                reason: reason.clone(),
            });
        }
        self.ctrl.as_mut().ok_or_else(|| Error::Gone {
            id: self.id.to_string(),
            reason: "destroyed".into(),
        })
    }

    /// Sends one request and waits for its single reply (file operations), each read and
    /// write on the socket bounded by the call deadline. An agent that misses it (stuck, or
    /// stopped) leaves the sandbox failed: it is torn down, and every later call says so.
    fn call(&mut self, req: &Request, body: &[u8]) -> Result<proto::Frame<Reply>> {
        self.with_ctrl(|io| {
            io.send(req, body)?;
            io.recv(proto::MAX_FRAME)
        })
    }

    /// Runs `f` on the agent socket, each of its reads and writes bounded by the call
    /// deadline; a channel failure leaves the sandbox failed, as [`Self::call`] says.
    fn with_ctrl<T>(
        &mut self,
        f: impl FnOnce(&mut SocketIo<'_>) -> std::result::Result<T, CallError>,
    ) -> Result<T> {
        let limit = self.call_timeout;
        let ctrl = self.ctrl()?;
        let bounded = ctrl
            .set_read_timeout(Some(limit))
            .and_then(|_| ctrl.set_write_timeout(Some(limit)));
        if let Err(e) = bounded {
            return Err(Error::io("agent socket", e));
        }
        let reply = f(&mut SocketIo(ctrl));
        let _ = ctrl
            .set_read_timeout(None)
            .and_then(|_| ctrl.set_write_timeout(None));
        match reply {
            Ok(f) => Ok(f),
            Err(CallError::Timeout) => {
                let secs = limit.as_secs_f64();
                self.gone = Some(format!(
                    "its agent did not answer a file call within {secs:.0} s"
                ));
                self.teardown();
                Err(Error::Sandbox(format!(
                    "the sandbox did not answer within {secs:.0} s and was stopped; create a new sandbox"
                )))
            }
            Err(e) => {
                self.gone = Some(format!("the sandbox agent stopped ({e})"));
                self.teardown();
                Err(sandbox_err("the sandbox agent stopped", e))
            }
        }
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
        if let Some(cg) = &self.cgroup {
            for pid in cg.pids() {
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
        if let Some(mut ctrl) = self.ctrl.take()
            && !had_cgroup
        {
            // Without a cgroup to watch, the agent's end of the socket closing is the sign
            // that it is gone.
            let _ = ctrl.set_read_timeout(Some(Duration::from_secs(2)));
            let mut sink = [0u8; 4096];
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                match ctrl.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
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

    fn run_exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        let argv = cordon_host::agent::argv_for(req, Tier::Container, true)?;
        let env = self.env_for(req);
        let cwd = req.cwd.clone().unwrap_or_else(|| "/work".to_string());
        let limits = self.spec.limits.clone();
        let timeout = Duration::from_millis(req.timeout_ms.unwrap_or(limits.timeout_ms));
        let id = self.next_exec;
        self.next_exec += 1;
        let pipe = || {
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::io("creating a pipe", e.into()))
        };
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
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
            stdio: StdioMode::Passed,
            limits: ProcLimits {
                open_files: limits.open_files,
                // A second layer only: the workspace's own size limit answers first (ENOSPC).
                file_size: limits.disk_bytes.max(limits.tmp_bytes) + (1 << 20),
                address_space: 0,
                processes: 0,
            },
            last: req.last,
        };
        let bytes = proto::encode(&request, b"").map_err(|e| Error::Invalid(e.to_string()))?;
        {
            let ctrl = self.ctrl()?;
            let fds = [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
            let iov = [IoSlice::new(&bytes)];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let sent = sendmsg::<()>(ctrl.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
                .map_err(|e| sandbox_err("sending the exec", e))?;
            if sent < bytes.len() {
                ctrl.write_all(&bytes[sent..])
                    .map_err(|e| sandbox_err("sending the exec", e))?;
            }
        }
        drop((in_r, out_w, err_w));
        tracing::debug!("exec: request sent");
        let stdin_data = req.stdin.clone().unwrap_or_default();
        let mut ex = ExecIo {
            stdout: Some(File::from(out_r)),
            stderr: Some(File::from(err_r)),
            stdin: if stdin_data.is_empty() {
                // No stdin: close our end now, so a program that reads it sees end-of-file
                // at once instead of waiting out its timeout.
                drop(in_w);
                None
            } else {
                Some(File::from(in_w))
            },
            stdin_data,
            stdin_off: 0,
            out: Vec::new(),
            err: Vec::new(),
            out_trunc: false,
            err_trunc: false,
            out_cap: limits.stdout_bytes,
            err_cap: limits.stderr_bytes,
        };
        if let Some(f) = &ex.stdin {
            let _ = nix::fcntl::fcntl(f, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        }
        let deadline = t0 + timeout;
        let mut reason: Option<Termination> = None;
        let mut kill_sent_at: Option<Instant> = None;
        let mut exited: Option<Reply> = None;
        let mut frames = FrameBuffer::default();
        let mut agent_lost = false;
        let mut last_pids_check = Instant::now();
        loop {
            let now = Instant::now();
            // Our own reasons to stop the program.
            if reason.is_none() {
                if now >= deadline {
                    reason = Some(Termination::Timeout);
                } else if ex.out_trunc || ex.err_trunc {
                    reason = Some(Termination::OutputLimit);
                } else if now.duration_since(last_pids_check) >= Duration::from_millis(20) {
                    last_pids_check = now;
                    if let (Some(cg), Some(b)) = (&self.cgroup, &before)
                        && cg.counters().pids_max_hits > b.pids_max_hits
                    {
                        reason = Some(Termination::ProcessLimit);
                    }
                }
            }
            if reason.is_some() && kill_sent_at.is_none() && exited.is_none() {
                kill_sent_at = Some(now);
                let _ = proto::write_frame(self.ctrl()?, &Request::Kill { id }, b"");
            }
            if exited.is_some() && ex.stdout.is_none() && ex.stderr.is_none() {
                break;
            }
            if agent_lost {
                break;
            }
            // A program that will not die, or an agent that stopped answering: end the sandbox.
            if let Some(k) = kill_sent_at
                && exited.is_none()
                && now.duration_since(k) > Duration::from_secs(3)
            {
                self.gone = Some("its agent did not answer a kill".into());
                self.teardown();
                break;
            }
            if let Some(_e) = &exited
                && now > deadline + Duration::from_secs(2)
            {
                // Output pipes still open after the program was reaped: give up on the rest.
                break;
            }
            let wait_ms = if exited.is_some() {
                50
            } else {
                let left = deadline.saturating_duration_since(now).as_millis() as u64;
                left.clamp(1, 20)
            };
            let mut ready = [false; 4];
            {
                let ctrl = self.ctrl()?;
                let mut fds = vec![PollFd::new(ctrl.as_fd(), PollFlags::POLLIN)];
                let mut map = vec![0usize];
                for (k, f) in [&ex.stdout, &ex.stderr].into_iter().enumerate() {
                    if let Some(f) = f {
                        fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                        map.push(k + 1);
                    }
                }
                if let Some(f) = &ex.stdin {
                    fds.push(PollFd::new(f.as_fd(), PollFlags::POLLOUT));
                    map.push(3);
                }
                match poll(&mut fds, PollTimeout::from(wait_ms as u16)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(sandbox_err("waiting for the program", e)),
                }
                for (i, fd) in fds.iter().enumerate() {
                    if fd.revents().is_some_and(|r| !r.is_empty()) {
                        ready[map[i]] = true;
                    }
                }
            }
            if ready[1] {
                ex.read_stream(OutputStream::Stdout, sink);
            }
            if ready[2] {
                ex.read_stream(OutputStream::Stderr, sink);
            }
            if ready[3] {
                ex.write_stdin();
            }
            if ready[0] {
                let mut buf = [0u8; 8192];
                let n = match self.ctrl()?.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => 0,
                };
                if n == 0 {
                    agent_lost = true;
                    self.gone = Some("its agent exited".into());
                    continue;
                }
                frames.push(&buf[..n]);
                loop {
                    match frames.next_frame::<Reply>() {
                        Ok(Some(f)) => match f.header {
                            Reply::Started { .. } => tracing::debug!("exec: started"),
                            r @ Reply::Exited { .. } => {
                                tracing::debug!("exec: exited");
                                exited = Some(r)
                            }
                            Reply::Error { code, message } => {
                                let spawn_refused = code == ErrorCode::SpawnFailed;
                                let pids_hit = match (&self.cgroup, &before) {
                                    (Some(cg), Some(b)) => {
                                        cg.counters().pids_max_hits > b.pids_max_hits
                                    }
                                    _ => false,
                                };
                                if spawn_refused && pids_hit {
                                    let mut o = ExecOutcome::new(
                                        Tier::Container,
                                        Termination::ProcessLimit,
                                    );
                                    o.stderr = format!("cordon: {message}\n").into_bytes();
                                    return Ok(o);
                                }
                                return Err(Error::Sandbox(format!(
                                    "the program could not be started: {message}"
                                )));
                            }
                            other => {
                                return Err(sandbox_err(
                                    "unexpected message from the sandbox",
                                    format!("{other:?}"),
                                ));
                            }
                        },
                        Ok(None) => break,
                        Err(e) => {
                            self.gone = Some(format!("its agent sent a malformed frame ({e})"));
                            self.teardown();
                            return Err(sandbox_err("malformed frame from the sandbox agent", e));
                        }
                    }
                }
            }
        }
        let wall = t0.elapsed();
        let after = self.cgroup.as_ref().map(|c| c.counters());
        let mut o = ExecOutcome::new(Tier::Container, Termination::Exited);
        o.stdout = std::mem::take(&mut ex.out);
        o.stderr = std::mem::take(&mut ex.err);
        o.stdout_truncated = ex.out_trunc;
        o.stderr_truncated = ex.err_trunc;
        o.weakened = self.weakened.clone();
        o.warnings = self.warnings.clone();
        o.usage.wall_time_us = wall.as_micros() as u64;
        o.timings.run_us = wall.as_micros() as u64;
        let (mut disk_full, mut agent_cpu, mut rss) = (false, 0, 0);
        if let Some(Reply::Exited {
            code,
            signal,
            cpu_us,
            max_rss_bytes,
            disk_full: full,
            program_us,
            ..
        }) = exited
        {
            o.timings.program_us = program_us;
            o.exit_code = code;
            o.signal = signal;
            disk_full = full;
            agent_cpu = cpu_us;
            rss = max_rss_bytes;
        }
        let (oom, pids_hit) = match (&before, &after) {
            (Some(b), Some(a)) => {
                o.usage.cpu_time_us = match (a.cpu_us, b.cpu_us) {
                    (Some(a), Some(b)) => a.saturating_sub(b),
                    _ => agent_cpu,
                };
                o.usage.peak_memory_bytes = a.peak_memory.max(rss);
                (a.oom_kills > b.oom_kills, a.pids_max_hits > b.pids_max_hits)
            }
            _ => {
                o.usage.cpu_time_us = agent_cpu;
                o.usage.peak_memory_bytes = rss;
                (false, false)
            }
        };
        let clean = o.exit_code == Some(0);
        o.termination = if let Some(r) = reason {
            r
        } else if oom {
            // A process of this exec was killed for memory, even if the main one survived.
            Termination::OutOfMemory
        } else if pids_hit {
            // The process limit refused a fork during this exec (a fork bomb, however its
            // main process ended).
            Termination::ProcessLimit
        } else if o.signal == Some(libc::SIGXFSZ) || (disk_full && !clean) {
            Termination::DiskLimit
        } else if agent_lost || (exited.is_none() && self.gone.is_some()) {
            Termination::SandboxFailure
        } else if o.signal.is_some() {
            Termination::Signalled
        } else {
            Termination::Exited
        };
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

struct ExecIo {
    stdout: Option<File>,
    stderr: Option<File>,
    stdin: Option<File>,
    stdin_data: Vec<u8>,
    stdin_off: usize,
    out: Vec<u8>,
    err: Vec<u8>,
    out_trunc: bool,
    err_trunc: bool,
    out_cap: u64,
    err_cap: u64,
}

impl ExecIo {
    fn read_stream(&mut self, which: OutputStream, sink: &mut dyn OutputSink) {
        let (slot, buf, trunc, cap) = match which {
            OutputStream::Stdout => (
                &mut self.stdout,
                &mut self.out,
                &mut self.out_trunc,
                self.out_cap,
            ),
            OutputStream::Stderr => (
                &mut self.stderr,
                &mut self.err,
                &mut self.err_trunc,
                self.err_cap,
            ),
        };
        let Some(f) = slot.as_mut() else { return };
        let mut chunk = [0u8; 64 * 1024];
        match f.read(&mut chunk) {
            Ok(0) => *slot = None,
            Ok(n) => {
                let data = &chunk[..n];
                let room = (cap as usize).saturating_sub(buf.len());
                let keep = &data[..n.min(room)];
                if !keep.is_empty() {
                    buf.extend_from_slice(keep);
                    sink.output(which, keep);
                }
                if n > room {
                    *trunc = true;
                }
            }
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => *slot = None,
        }
    }

    fn write_stdin(&mut self) {
        let Some(f) = self.stdin.as_mut() else { return };
        match f.write(&self.stdin_data[self.stdin_off..]) {
            Ok(n) => {
                self.stdin_off += n;
                if self.stdin_off >= self.stdin_data.len() {
                    self.stdin = None;
                }
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => self.stdin = None,
        }
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
        )?;
        match reply.header {
            Reply::Ok => Ok(()),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(sandbox_err(
                "unexpected reply to a file write",
                format!("{other:?}"),
            )),
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
            other => Err(sandbox_err(
                "unexpected reply to a file read",
                format!("{other:?}"),
            )),
        }
    }

    fn file_op(&mut self, op: &FileOp) -> Result<FileReply> {
        self.with_ctrl(|io| cordon_host::files::file_op(io, op))?
    }

    fn put_archive(&mut self, dir: &str, tar: &mut dyn Read) -> Result<ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        let budget = self.spec.limits.disk_bytes;
        self.with_ctrl(|io| cordon_host::files::put_archive(io, dir, budget, tar))?
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn Write,
    ) -> Result<ArchiveReport> {
        cordon_core::validate_sandbox_dir(dir)?;
        refuse_unscanned(&self.spec, dir)?;
        self.with_ctrl(|io| cordon_host::files::get_archive(io, dir, max_bytes, out))?
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
        let outer = self.outer.as_ref().map(|c| c.id() as i32);
        Some(std::sync::Arc::new(move || {
            if let Some(p) = &procs {
                crate::cgroup::kill_listed(p);
            }
            if let Some(pid) = outer {
                crate::sys::kill_pid(pid);
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

impl Drop for ContainerSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

/// The container's agent socket as a [`FrameIo`]; its read and write timeouts are set.
struct SocketIo<'a>(&'a mut UnixStream);

fn socket_error(e: proto::ProtoError) -> CallError {
    match e {
        proto::ProtoError::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            CallError::Timeout
        }
        proto::ProtoError::Closed => CallError::Closed,
        e => CallError::Proto(e),
    }
}

impl FrameIo for SocketIo<'_> {
    fn send(&mut self, req: &Request, body: &[u8]) -> std::result::Result<(), CallError> {
        proto::write_frame(self.0, req, body).map_err(socket_error)
    }

    fn recv(&mut self, max_frame: usize) -> std::result::Result<proto::Frame<Reply>, CallError> {
        let _ = max_frame;
        proto::read_frame(self.0).map_err(socket_error)
    }
}
