use serde::{Deserialize, Serialize};

use crate::{
    ArchiveReport, ExecOutcome, ExecRequest, FileOp, FileReply, OutputStream, ProcOutput,
    ProcSignal, Result, SandboxId, SandboxSpec, SnapshotDir, SnapshotImage, SnapshotMode, Tier,
};

/// One thing a tier needs from the host, probed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub name: String,
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do when it is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// When false, the tier can still run without it if the caller allows weaker.
    #[serde(default = "yes")]
    pub required: bool,
}

fn yes() -> bool {
    true
}

impl Capability {
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Capability {
            name: name.into(),
            ok: true,
            detail: detail.into(),
            fix: None,
            required: true,
        }
    }

    pub fn missing(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Capability {
            name: name.into(),
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
            required: true,
        }
    }
}

/// Whether a tier can run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum TierStatus {
    Available,
    /// Runs, but some optional capability is missing or a slower path is used.
    Degraded,
    Unavailable,
}

/// The result of probing a tier once; callers cache it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub tier: Tier,
    pub status: TierStatus,
    pub capabilities: Vec<Capability>,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl Probe {
    /// Builds a probe whose status follows from its capabilities.
    pub fn from_capabilities(
        tier: Tier,
        capabilities: Vec<Capability>,
        notes: Vec<String>,
    ) -> Self {
        let required_missing = capabilities.iter().any(|c| !c.ok && c.required);
        let optional_missing = capabilities.iter().any(|c| !c.ok && !c.required);
        let status = if required_missing {
            TierStatus::Unavailable
        } else if optional_missing {
            TierStatus::Degraded
        } else {
            TierStatus::Available
        };
        Probe {
            tier,
            status,
            capabilities,
            notes,
        }
    }

    pub fn available(&self) -> bool {
        self.status != TierStatus::Unavailable
    }
}

/// Receives output as it is produced, before the outcome.
pub trait OutputSink {
    fn output(&mut self, stream: OutputStream, data: &[u8]);

    /// Whoever reads the output went away (a client that disconnected): the exec should be
    /// stopped ([`crate::Termination::Cancelled`]). Tiers look at it as often as they look
    /// at their other reasons to stop.
    fn cancelled(&self) -> bool {
        false
    }
}

impl<F: FnMut(OutputStream, &[u8])> OutputSink for F {
    fn output(&mut self, stream: OutputStream, data: &[u8]) {
        self(stream, data)
    }
}

/// An isolation tier.
pub trait Backend: Send + Sync {
    fn tier(&self) -> Tier;

    /// What this tier can do ([`Tier::features`]): every "can this tier do X" check and
    /// "unsupported" message derives from it.
    fn features(&self) -> crate::Features {
        self.tier().features()
    }

    /// Checks what this host offers the tier. Cheap enough to run once per process.
    fn probe(&self) -> Probe;

    /// Removes what sandboxes of this tier left when the process that owned them died
    /// without destroying them: `orphans` are the ids a dead server's records name; a tier
    /// may also sweep what no record names (a create cut short), never what a live process
    /// still uses. Returns one line per thing removed. No default: a wrapper that forgot to
    /// pass it on would leave a crashed server's sandboxes behind.
    fn recover(&self, orphans: &[String]) -> Vec<String>;

    /// Creates a fresh, never-used sandbox. Fails closed when a wall cannot be applied and
    /// the spec does not allow running weaker.
    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>>;

    /// Creates a sandbox without the state this tier prepares ahead for its starts (the
    /// microvm tier's snapshot: a full boot instead of a restore), i.e. what the first
    /// sandbox of a kind costs; `None` for a tier whose every start is [`Backend::create`].
    /// `cordon bench` reports both where they differ. No default, like `recover`.
    fn create_unprepared(&self, spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>>;

    /// A sandbox that a previous process paused to disk ([`Sandbox::pause_to_disk`]),
    /// holding nothing but its files until [`Sandbox::resume`] restores it; `None` where
    /// this tier keeps no such sandbox of that id.
    fn revive(&self, id: &str) -> Option<Result<Box<dyn Sandbox>>> {
        let _ = id;
        None
    }

    /// Starts a new sandbox from a snapshot this tier wrote ([`Sandbox::snapshot`]), in the
    /// image's directory `dir`; called any number of times on one image (a fork of N is N
    /// calls, possibly from several threads at once), each call independent of the others
    /// and of the source, which may be running, destroyed, or from before a restart.
    ///
    /// `spec` is the new sandbox's, as for [`Backend::create`]: its limits, environment,
    /// egress policy, grants (with their secrets resolved for the new sandbox: re-minted by
    /// the server, never the source's), volumes, template (the source's, resolved again by
    /// the server) and owner. The tier applies every wall of `spec` exactly as `create`
    /// does, and gives the sandbox a fresh identity: a new [`SandboxId`], its own egress
    /// proxy (new grant placeholders, so the source's are worthless in it), and where the
    /// tier has them a new MAC, hostname and a reseeded kernel random pool. What the new
    /// sandbox has of the source's state follows [`SnapshotImage::mode`]:
    /// - [`SnapshotMode::Full`](crate::SnapshotMode::Full): its memory, processes (code
    ///   contexts and background execs, their ids kept) and files as at the snapshot;
    /// - [`SnapshotMode::Filesystem`](crate::SnapshotMode::Filesystem): the files of the
    ///   workspace and of what the root let it write; no process; contexts start fresh.
    ///
    /// Changes in one sandbox started from an image are seen by no other and never reach
    /// the image (each gets its own copy or copy-on-write layer). An image of another tier
    /// or an unknown [`SnapshotImage::format`] is refused with [`crate::Error::Invalid`].
    /// The default refuses with the mode's feature's error, naming the tiers that can.
    fn start_from_snapshot(
        &self,
        image: &SnapshotImage,
        dir: &SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Sandbox>> {
        let _ = (dir, spec);
        Err(image
            .mode
            .feature()
            .unsupported(self.tier(), "starting a sandbox from a snapshot"))
    }
}

/// A handle another thread calls to end a sandbox's running exec at once (see
/// [`Sandbox::interrupter`]).
pub type Interrupter = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Who a program runs as inside the sandbox's user namespace, when not the sandbox's own
/// user: never id 0 (the agent's), always within the sandbox's mapped ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups besides `gid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
}

/// A pseudo-terminal of a sandbox's own, opened from the host for a caller that holds the
/// master itself (an OCI engine's console): see [`Sandbox::open_terminal`].
#[derive(Debug)]
pub struct Terminal {
    pub master: std::os::fd::OwnedFd,
    /// Its program's end, to pass to [`Sandbox::start_attached`].
    pub slave: std::os::fd::OwnedFd,
    /// The slave's path as the sandbox sees it (`/dev/pts/N`).
    pub name: String,
}

/// One live sandbox. Dropping it destroys it too; `destroy` reports how that went.
/// The first byte of a [`Sandbox::open_port`] stream when the connection was made.
pub const PORT_CONNECTED: u8 = 0;

pub trait Sandbox: Send {
    fn id(&self) -> &SandboxId;

    /// Runs one command, streaming output to `sink`, and returns how it ended. Limits are
    /// enforced here; a limit reached is an outcome, not an error.
    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome>;

    /// Writes a file under `/work`. Refuses paths outside it and symlinks.
    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()>;

    /// Reads a file under `/work`, at most `max_bytes`. Refuses paths outside it and symlinks.
    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>>;

    /// Lists, stats, removes, renames or makes a directory under `/work`, never through a
    /// symlink (a symlink is reported, or removed or renamed itself). Tiers without a
    /// workspace answer [`crate::Error::Unsupported`]; so do tiers without
    /// [`crate::Feature::FileMetadata`] for [`FileOp::SetMetadata`].
    fn file_op(&mut self, op: &FileOp) -> Result<FileReply> {
        if matches!(op, FileOp::SetMetadata { .. }) {
            return Err(crate::Feature::FileMetadata.unsupported_here("metadata on a file"));
        }
        Err(unsupported_files(op.name()))
    }

    /// Extracts the tar stream `tar` into the directory `dir` under `/work` (made if
    /// missing). Entries leaving `dir` (absolute, `..`) stop it with
    /// [`crate::Error::PathRefused`]; links, device nodes and FIFOs are skipped and
    /// reported; setuid, setgid and sticky bits are dropped; past the sandbox's disk limit
    /// it stops with an error. What was read of `tar` is consumed either way.
    fn put_archive(&mut self, dir: &str, tar: &mut dyn std::io::Read) -> Result<ArchiveReport> {
        let _ = (dir, tar);
        Err(unsupported_files("uploading a directory"))
    }

    /// Writes the directory `dir` under `/work` to `out` as a tar stream, at most
    /// `max_bytes` of file contents (refused before the first byte when the directory is
    /// larger). Symlinks go in as links, never followed; FIFOs, sockets and devices are
    /// skipped and never opened.
    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<ArchiveReport> {
        let _ = (dir, max_bytes, out);
        Err(unsupported_files("downloading a directory"))
    }

    /// Starts `req` in the background: its output is kept in the sandbox (the last
    /// [`crate::BACKGROUND_KEEP`] bytes of each stream) and read with
    /// [`Sandbox::read_background`]; the sandbox's limits hold for it as for any exec, and its
    /// destroy ends it. Returns the exec's id in this sandbox. Tiers without a process
    /// supervisor answer [`crate::Error::Unsupported`].
    fn start_background(&mut self, req: &ExecRequest) -> Result<u64> {
        Err(unsupported_start(req))
    }

    /// What background exec `id` wrote from the stream offsets `from` (stdout, stderr) on,
    /// at most `max` bytes of each, and its end once it has ended and all of its output is
    /// in.
    fn read_background(&mut self, id: u64, from: [u64; 2], max: u64) -> Result<ProcOutput> {
        let _ = (id, from, max);
        Err(unsupported_background())
    }

    /// Writes `data` to background exec `id`'s stdin; an empty `data` closes it.
    fn write_background(&mut self, id: u64, data: &[u8]) -> Result<()> {
        let _ = (id, data);
        Err(unsupported_background())
    }

    /// Sends background exec `id` a signal: `Term` to its program's whole process tree,
    /// `Kill` to end the tree at once.
    fn signal_background(&mut self, id: u64, signal: ProcSignal) -> Result<()> {
        let _ = (id, signal);
        Err(unsupported_background())
    }

    /// Sets the window size of background exec `id`'s pseudo-terminal (its program gets
    /// `SIGWINCH`); an exec started without one is refused.
    fn resize_background(&mut self, id: u64, size: crate::PtySize) -> Result<()> {
        let _ = (id, size);
        Err(unsupported_background())
    }

    /// Starts `req` in the background with `stdio` (stdin, stdout, stderr) as the
    /// program's own descriptors, passed into the sandbox as they are: nothing of its I/O
    /// passes through the agent or the host (`terminal`: the three are one terminal of the
    /// sandbox's own, from [`Sandbox::open_terminal`]), as `user` (`None`: the sandbox's
    /// own user). Its end is read with [`Sandbox::read_background`]. Tiers with
    /// [`crate::Feature::Attached`] (cordon-oci passes an engine's descriptors this way).
    fn start_attached(
        &mut self,
        req: &ExecRequest,
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
        terminal: bool,
        user: Option<ProcUser>,
    ) -> Result<u64> {
        let _ = (req, stdio, terminal, user);
        Err(crate::Feature::Attached.unsupported_here("a process on the caller's own descriptors"))
    }

    /// A new pseudo-terminal of `size` of the sandbox's own, opened from the host for a
    /// caller that holds its master: its slave is for [`Sandbox::start_attached`]. Tiers
    /// with [`crate::Feature::Attached`].
    fn open_terminal(&mut self, size: crate::PtySize) -> Result<Terminal> {
        let _ = size;
        Err(crate::Feature::Attached.unsupported_here("a terminal the caller holds"))
    }

    /// Starts `req` in the background for a host that relays its output to a reader of its
    /// own: its output is held in the sandbox until read, never dropped (the program waits
    /// on its pipe instead), and it runs as `user` when one is given. Tiers with
    /// [`crate::Feature::Held`] (cordon-oci relays a process this way where no host
    /// descriptor can be passed in).
    fn start_relayed(&mut self, req: &ExecRequest, user: Option<ProcUser>) -> Result<u64> {
        let _ = (req, user);
        Err(crate::Feature::Held
            .unsupported_here("a background process whose output is held until read"))
    }

    /// A connection to `port` on the sandbox's own loopback, where a program of the sandbox
    /// listens: a stream socket whose other end the sandbox relays, byte for byte, to
    /// `127.0.0.1:port` (or `[::1]:port`) inside. The first byte read from it says whether
    /// the connection was made: [`PORT_CONNECTED`], or another value when nothing listens
    /// there (then the socket ends). It closes when the sandbox ends. The egress proxy's
    /// port is refused. Tiers with [`crate::Feature::Ports`].
    fn open_port(&mut self, port: u16) -> Result<std::os::unix::net::UnixStream> {
        let _ = port;
        Err(crate::Feature::Ports.unsupported_here("a connection to a port in the sandbox"))
    }

    /// A handle that reads the sandbox's CPU, memory and disk figures from the tier's own
    /// accounting, for a sampler that reads it without this sandbox's lock; `None` where
    /// the tier keeps no such figures (or not yet: a tier that restarts its sandbox hands
    /// out a new one, so a sampler asks again now and then).
    fn gauge(&self) -> Option<std::sync::Arc<dyn crate::Gauge>> {
        None
    }

    /// One operation on the sandbox's directory watchers ([`crate::WatchOp`]): start one on
    /// a workspace directory, read what it queued, stop it. Watchers end with the sandbox.
    /// Tiers with [`crate::Feature::Watch`].
    fn watch(&mut self, op: &crate::WatchOp) -> Result<crate::WatchReply> {
        let _ = op;
        Err(crate::Feature::Watch.unsupported_here("watching a directory"))
    }

    /// Sends signal number `signal` (1 to 64) to background exec `id`'s program as itself
    /// (`all`: to every process of its tree).
    fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        let _ = (id, signal, all);
        Err(unsupported_background())
    }

    /// Stops every process of the sandbox where it is, keeping its memory, until
    /// [`Sandbox::resume`]: a paused sandbox uses no CPU. Tiers that cannot answer
    /// [`crate::Error::Unsupported`].
    fn pause(&mut self) -> Result<()> {
        Err(crate::Feature::Pause.unsupported_here("pausing a sandbox"))
    }

    /// Pauses the sandbox and saves all of it (processes, memory, devices) to disk, so that
    /// it holds no memory and no CPU on the host and outlives this process (see
    /// [`Backend::revive`]); [`Sandbox::resume`] restores it. Returns the bytes it holds on
    /// disk. Only the microvm tier can.
    fn pause_to_disk(&mut self) -> Result<u64> {
        Err(crate::Feature::PauseToDisk.unsupported_here("pausing a sandbox to disk"))
    }

    /// The bytes it holds on disk while paused to disk; `None` otherwise.
    fn on_disk_bytes(&self) -> Option<u64> {
        None
    }

    /// Writes a snapshot of this sandbox of `mode` into `dir` (made by the server: empty,
    /// root-only, under its data dir; the tier writes nowhere else that outlives the call)
    /// and returns what it wrote, for [`Backend::start_from_snapshot`].
    ///
    /// The sandbox keeps running: it is paused for the shortest time the tier allows (its
    /// processes frozen while its state is copied or checkpointed, or not at all where the
    /// tier can copy without), then continues exactly as before, its processes, files, limits
    /// and deadlines untouched; a sandbox the caller had paused stays paused. On an error the
    /// sandbox runs on as before and the server deletes `dir`.
    ///
    /// [`SnapshotMode::Full`](crate::SnapshotMode::Full) keeps memory, processes and files;
    /// [`SnapshotMode::Filesystem`](crate::SnapshotMode::Filesystem) the workspace and
    /// whatever the root let the sandbox write (see [`crate::SnapshotMode`]). Neither keeps
    /// anything of the host's secrets: grants' secrets, minted tokens and the egress proxy's
    /// state stay out of `dir`. A mode the tier lacks is refused before anything is
    /// written: the default refuses both with the mode's feature's error, naming the tiers
    /// that can (a tier that lacks one mode for a reason of its own says that reason).
    fn snapshot(&mut self, mode: SnapshotMode, dir: &SnapshotDir) -> Result<SnapshotImage> {
        let _ = dir;
        Err(mode
            .feature()
            .unsupported_here(format!("a {mode} snapshot")))
    }

    /// Changes the running sandbox's memory limit and CPU quota in place (cordon-oci's
    /// `update`, a kubelet's pod resize). Tiers whose sandbox's size is fixed once it runs
    /// (a microVM's guest memory) answer [`crate::Error::Unsupported`].
    fn resize(&mut self, memory_bytes: u64, cpus: f64) -> Result<()> {
        let _ = (memory_bytes, cpus);
        Err(crate::Error::Unsupported {
            what: "changing a running sandbox's limits on this tier".into(),
            fix: "create the sandbox again with the new limits".into(),
        })
    }

    /// Continues a paused sandbox's processes where they stopped.
    fn resume(&mut self) -> Result<()> {
        Err(crate::Feature::Pause.unsupported_here("resuming a sandbox"))
    }

    /// Microseconds it took to create this sandbox.
    fn start_us(&self) -> u64;

    /// Destroys the sandbox and everything it left on the host. Idempotent.
    fn destroy(&mut self) -> Result<()>;

    /// What the sandbox recorded since the last call that belongs in the next outcome's
    /// details (scan findings of files taken out, egress decisions, ...).
    fn report(&mut self) -> crate::Details {
        crate::Details::default()
    }

    /// A handle that, called from another thread while an exec runs, kills what the sandbox
    /// runs so that the exec returns promptly; the sandbox may be unusable afterwards and is
    /// meant to be destroyed next. A service destroying a busy sandbox calls it instead of
    /// waiting for the exec's own timeout. `None` when the tier has no such handle.
    fn interrupter(&self) -> Option<Interrupter> {
        None
    }

    /// Hands a sandbox made ahead of time (a warm pool's) to `owner`, whose share of
    /// per-owner resources its execs then take (see `SandboxSpec::owner`). Tiers without
    /// such resources ignore it.
    fn set_owner(&mut self, owner: &str) {
        let _ = owner;
    }
}

fn unsupported_background() -> crate::Error {
    crate::Feature::Background.unsupported_here("a background exec")
}

/// A tier without background execs refusing `req`: one asked on a terminal is refused as a
/// terminal (the feature it asked for), any other as a background exec.
fn unsupported_start(req: &ExecRequest) -> crate::Error {
    if req.pty.is_some() {
        crate::Feature::Pty.unsupported_here("a background exec on a terminal")
    } else {
        unsupported_background()
    }
}

fn unsupported_files(what: &str) -> crate::Error {
    crate::Feature::Files.unsupported_here(format!("the file operation `{what}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_status() {
        let mut optional = Capability::missing("x", "absent", "install x");
        optional.required = false;
        let p = Probe::from_capabilities(Tier::Container, vec![optional], vec![]);
        assert_eq!(p.status, TierStatus::Degraded);
        let p = Probe::from_capabilities(
            Tier::Container,
            vec![Capability::missing("y", "absent", "install y")],
            vec![],
        );
        assert!(!p.available());
    }
}
