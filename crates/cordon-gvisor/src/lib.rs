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

// The modules by verb, each using only those listed before it: the runsc command line,
// the bundle's config, the root, the running sandbox, an exec's parts, then the `Backend`
// and `Sandbox` impls over them.
mod backend;
mod bundle;
mod config;
mod error;
mod exec;
mod live;
mod nproc;
pub mod reap;
mod root;
mod runsc;
pub mod snapshot;
mod sys;
mod tier;
mod watching;
mod workspace;

use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cordon_core::{SandboxId, SandboxSpec, Weakening};
use cordon_host::agent::AgentConn;
use cordon_host::cgroup::{self as cgroup, SandboxCgroup};
use cordon_host::egress::EgressLink;

pub use crate::config::{AGENT_BINARY, CGROUP_PARENT, GvisorConfig};
pub use crate::error::GvisorError;
use crate::nproc::NprocWatch;
use crate::runsc::force_delete;

/// A process-limit refusal that keeps recurring this long after the first one stops the
/// exec (a fork bomb would otherwise run until its timeout).
const NPROC_GRACE: Duration = Duration::from_secs(2);
/// How long an exec's end waits for the fork-refusal log reader to catch up.
const NPROC_SYNC: Duration = Duration::from_millis(250);

pub struct GvisorBackend {
    config: GvisorConfig,
    /// Where this host's memory controller is, found once.
    memory_controller: OnceLock<Option<(cgroup::Version, PathBuf)>>,
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

pub struct GvisorSandbox {
    id: SandboxId,
    /// The host uid and gid programs run as (the first id of the leased range).
    uid: u32,
    /// The sandbox's lease on `uid`, given back once its last process is gone.
    ids: Option<cordon_host::idpool::IdRange>,
    /// `/work`: each file call runs on a thread confined to it (its own mount namespace
    /// holding `/work` alone, the sandbox's uid, no capabilities) and walks beneath it.
    workspace: Option<cordon_guest::confined::ConfinedWorkspace>,
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
    /// Directory watchers on `/work` (inotify on the host's own directory), opened at the
    /// first watch and closed with the sandbox.
    watches: Option<crate::watching::HostWatches>,
}

impl GvisorSandbox {
    /// Before a file call changes the workspace: the watchers take what came before it
    /// (nothing to do without watchers).
    pub(crate) fn take_events(&mut self) {
        if let Some(w) = self.watches.as_mut() {
            w.pump();
        }
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn etc_has_no_host_secrets_and_names_the_sandbox_user() {
        let files = crate::root::etc_files(1000);
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        assert!(!names.contains(&"shadow"));
        assert!(
            files
                .iter()
                .any(|(n, c)| *n == "passwd" && c.contains(":1000:1000:"))
        );
    }
}
