//! Where runsc is, where its state goes, and what each sandbox of the tier is made with.

use std::path::PathBuf;
use std::time::Duration;

/// Name of the in-sandbox agent binary, looked up next to the running executable.
pub const AGENT_BINARY: &str = "cordon-gvisor-agent";

/// Parent of every gvisor sandbox's cgroup, under each hierarchy's root (each start of a
/// sandbox's runsc gets `<sandbox id>-<n>` below it, so the orphan sweep finds what a
/// killed Cordon left).
pub const CGROUP_PARENT: &str = "cordon-gvisor";

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
    /// The cgroup (below each hierarchy's root) each runsc sandbox's cgroup is made in:
    /// `None` is [`CGROUP_PARENT`]; cordon-oci names the pod's.
    pub cgroup_parent: Option<String>,
    /// A kubelet pod's network namespace each runsc sandbox joins, its sentry on the host
    /// network of that namespace (`--network=host`: the pod's containers are separate runsc
    /// sandboxes and only one netstack could own the pod's interface; cordon-oci walls the
    /// namespace first, ADR 0029). `None`: gVisor's own network, no interface (`none`).
    pub netns: Option<PathBuf>,
    /// The loopback port of the agent's egress forwarder when it is not the default (a
    /// pod's containers share one loopback).
    pub proxy_port: Option<u16>,
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
            cgroup_parent: None,
            netns: None,
            proxy_port: None,
        }
    }
}
