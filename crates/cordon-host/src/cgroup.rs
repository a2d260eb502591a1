//! The one cgroup manager of the native tiers, on cgroup v1 and v2: a sandbox's cgroup is a
//! directory per hierarchy (v1: one per controller's mount; v2: one in the unified tree), its
//! limits and counters files in it. The two versions differ only in where the directories
//! are, which files hold a limit or a counter, and how a parent hands controllers down (v2's
//! `cgroup.subtree_control`): the `Hierarchy` trait, with its `V1` and `V2` implementations,
//! is where that difference lives, and the manager above it never asks which one it has.
//!
//! A sandbox's cgroup is `<parent>/<name>` under each hierarchy's root: memory (swap off),
//! CPU quota and, where the tier asks, a process limit. The container and microvm tiers use
//! `cordon/<sandbox id>` with all three; the gvisor tier `cordon-gvisor/<container id>`
//! without pids (runsc joins the cgroup Cordon made and sets nothing on it; on v1 it makes
//! the other controllers' directories itself, so removal and the orphan sweep look in
//! every hierarchy mounted).
//!
//! Written on the cgroup filesystem directly rather than through a crate: the one crate for
//! it (cgroups-rs 0.5) carries a systemd D-Bus client (zbus, 31 crates) into every build,
//! the static front's included, for none of what Cordon does (docs/adr/0009).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::HostError;
pub mod gauge;
pub mod place;
/// Memory cgroups kept for the next sandbox (a crate of its own: the sandbox init ends a
/// one-shot run's cgroup with it, ADR 0044).
pub use cordon_cgroup_pool as pool;
pub use cordon_cgroup_pool::remove_ended;

use cordon_cgroup_pool::files::parse_number;
pub use cordon_cgroup_pool::files::{keyed, number, parse_keyed, read_pids};

/// The calling thread's own view of the mounts: a process whose threads see different
/// mount namespaces (cordon-oci's monitor shows its first thread only the container's root)
/// finds the cgroup hierarchies where this thread does.
const MOUNTS: &str = "/proc/thread-self/mounts";

/// Name of the parent cgroup under which every sandbox's cgroup lives.
pub const PARENT: &str = "cordon";

/// Which cgroup version this host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

pub fn host_version() -> Version {
    version_in(&fs::read_to_string(MOUNTS).unwrap_or_default())
}

/// v2 when the cgroup root is itself a cgroup2 mount (the unified layout); v1 otherwise
/// (legacy and hybrid, whose cgroup2 mount below the root holds no controllers).
fn version_in(mounts: &str) -> Version {
    let unified = mounts.lines().any(|line| {
        let mut f = line.split_whitespace().skip(1);
        f.next() == Some(CGROUP_ROOT) && f.next() == Some("cgroup2")
    });
    if unified { Version::V2 } else { Version::V1 }
}

/// Counters read from a sandbox's cgroup (an exec's share is the difference across it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Processes the kernel killed for memory in this cgroup.
    pub oom_kills: u64,
    /// Times a memory charge hit the limit (v1 `failcnt`, v2 `max` events).
    pub limit_hits: u64,
    pub pids_max_hits: u64,
    /// The cgroup's CPU time; `None` where this layout has no usage file here (cgroup v1
    /// with cpuacct mounted apart from cpu: the agent's figure for the exec's tree is used).
    pub cpu_us: Option<u64>,
    pub peak_memory: u64,
}

impl Counters {
    /// What was counted between `before` and this reading (the peak is this reading's).
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            oom_kills: self.oom_kills.saturating_sub(before.oom_kills),
            limit_hits: self.limit_hits.saturating_sub(before.limit_hits),
            pids_max_hits: self.pids_max_hits.saturating_sub(before.pids_max_hits),
            cpu_us: self
                .cpu_us
                .zip(before.cpu_us)
                .map(|(a, b)| a.saturating_sub(b)),
            peak_memory: self.peak_memory,
        }
    }

    /// True when the memory limit ended a process: an OOM kill was counted, or (kernels
    /// without the kill counter) the limit was hit and the process died of SIGKILL.
    pub fn out_of_memory(&self, died_of_sigkill: bool) -> bool {
        self.oom_kills > 0 || (self.limit_hits > 0 && died_of_sigkill)
    }
}

/// What a sandbox's cgroup limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory: u64,
    /// A process limit (the pids controller), or none.
    pub pids: Option<u32>,
    pub cpus: f64,
}

/// A sandbox's control group.
pub struct SandboxCgroup {
    hier: &'static dyn Hierarchy,
    parent: String,
    name: String,
    /// Directory of each controller (one for v2).
    memory_dir: PathBuf,
    pids_dir: Option<PathBuf>,
    cpu_dir: PathBuf,
    /// Where the freezer is (v1: its own hierarchy; v2: the one directory).
    freezer_dir: Option<PathBuf>,
    /// Its memory directory goes back to the pool when it ends clean (`pool`).
    pooled: bool,
}

/// Counter files, opened for one reading (`None` where a file is missing: it reads as
/// zero). None is held for the sandbox's life: five descriptors per live sandbox on v1
/// cost more (the server's descriptor budget, and every spawn's copy of its descriptor
/// table) than the few microseconds of a path walk through cgroupfs per read (issue 49).
struct CounterFiles {
    /// v1 `memory.oom_control`, v2 `memory.events` (which also counts the limit's hits).
    oom: Option<fs::File>,
    /// v1 `memory.failcnt` and `memory.memsw.failcnt`.
    failcnt: [Option<fs::File>; 2],
    cpu: Option<fs::File>,
    peak: Option<fs::File>,
}

/// Opens `path` read-only; `None` when it is missing.
fn open_ro(path: PathBuf) -> Option<fs::File> {
    fs::File::open(path).ok()
}

/// Opens `path` read-write where the kernel allows it (v1, and v2's memory.peak from Linux
/// 6.12), so a peak can be reset; read-only otherwise (the peak is still read).
fn open_rw(path: PathBuf) -> Option<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .or_else(|_| fs::File::open(&path))
        .ok()
}

/// One write that sets a limit: the file (in the controller's directory), its value, and
/// what failing it means (empty: a best-effort write whose failure is ignored).
struct LimitWrite {
    file: PathBuf,
    value: String,
    what: &'static str,
}

/// What differs between cgroup v1 and v2.
trait Hierarchy: Sync {
    fn version(&self) -> Version;
    /// Where `kind`'s hierarchy is rooted, or `None` where that controller is not available.
    fn root(&self, mounts: &str, kind: &str) -> Option<PathBuf>;
    /// Makes `<root>/<parent>`, handing `kinds` down to its children where the version needs
    /// it.
    fn prepare_parent(&self, root: &Path, parent: &str, kinds: &[&str]) -> Result<(), HostError>;
    /// The writes that set `limits` on a cgroup whose controllers are in `dirs`, in order.
    fn limit_writes(&self, dirs: &Dirs<'_>, limits: &Limits) -> Vec<LimitWrite>;
    fn open_counters(&self, dirs: &Dirs<'_>) -> CounterFiles;
    /// The memory controller's peak file (writing 0 resets it).
    fn peak_file(&self) -> &'static str;
    /// Times a memory charge hit the limit, from the open files (`events`: the oom file's
    /// text, already read).
    fn limit_hits(&self, files: &CounterFiles, events: &str) -> u64;
    /// Microseconds of CPU from the CPU counter file's text.
    fn cpu_us(&self, text: &str) -> u64;
    /// Where the freezer's hierarchy is rooted, or `None` where this host has none.
    fn freezer_root(&self, mounts: &str) -> Option<PathBuf>;
    /// The file and value that freeze (`true`) or thaw a cgroup whose freezer is in `dir`.
    fn freeze_write(&self, frozen: bool) -> (&'static str, &'static str);
    /// True once every process of the cgroup in `dir` is frozen.
    fn is_frozen(&self, dir: &Path) -> bool;
}

/// The directories of a sandbox cgroup's controllers.
struct Dirs<'a> {
    memory: &'a Path,
    cpu: &'a Path,
    pids: Option<&'a Path>,
}

/// cgroup v1: a hierarchy per mount, each with its controllers' files.
struct V1;
/// cgroup v2: one tree, controllers handed down through `cgroup.subtree_control`.
struct V2;

fn hierarchy(version: Version) -> &'static dyn Hierarchy {
    match version {
        Version::V1 => &V1,
        Version::V2 => &V2,
    }
}

impl Hierarchy for V1 {
    fn version(&self) -> Version {
        Version::V1
    }

    /// The mount listing `kind` among its options (`cpu,cpuacct` names both).
    fn root(&self, mounts: &str, kind: &str) -> Option<PathBuf> {
        v1_mounts(mounts)
            .into_iter()
            .find(|(_, options)| options.iter().any(|o| o == kind))
            .map(|(dir, _)| dir)
    }

    fn prepare_parent(&self, root: &Path, parent: &str, _: &[&str]) -> Result<(), HostError> {
        make_dir(&root.join(parent))
    }

    fn limit_writes(&self, dirs: &Dirs<'_>, limits: &Limits) -> Vec<LimitWrite> {
        let (quota, period) = within_ancestors(dirs.cpu, cpu_quota(limits.cpus));
        let mut w = vec![write(
            dirs.memory,
            "memory.limit_in_bytes",
            limits.memory,
            MEM,
        )];
        // Swap off: memory+swap limited to the same figure. Hosts without swap accounting
        // have no memsw file; there is no swap to bound then.
        if dirs.memory.join("memory.memsw.limit_in_bytes").exists() {
            w.push(write(
                dirs.memory,
                "memory.memsw.limit_in_bytes",
                limits.memory,
                SWAP,
            ));
        }
        // Best effort (`what` empty): swappiness only matters with swap, which the memsw limit
        // already bounds.
        w.push(write(dirs.memory, "memory.swappiness", 0, ""));
        w.push(write(dirs.cpu, "cpu.cfs_period_us", period, CPU));
        w.push(write(dirs.cpu, "cpu.cfs_quota_us", quota, CPU));
        if let (Some(pids), Some(dir)) = (limits.pids, dirs.pids) {
            w.push(write(dir, "pids.max", pids, PIDS));
        }
        w
    }

    fn open_counters(&self, dirs: &Dirs<'_>) -> CounterFiles {
        CounterFiles {
            oom: open_ro(dirs.memory.join("memory.oom_control")),
            failcnt: [
                open_ro(dirs.memory.join("memory.failcnt")),
                open_ro(dirs.memory.join("memory.memsw.failcnt")),
            ],
            // Only where cpu and cpuacct share a hierarchy (`cpu,cpuacct`, the usual layout):
            // a separate cpuacct cgroup would cost a mkdir, a join and an rmdir per sandbox
            // for a figure the agent measures anyway.
            cpu: open_ro(dirs.cpu.join("cpuacct.usage")),
            peak: open_ro(dirs.memory.join(self.peak_file())),
        }
    }

    fn peak_file(&self) -> &'static str {
        "memory.max_usage_in_bytes"
    }

    fn limit_hits(&self, files: &CounterFiles, _: &str) -> u64 {
        files
            .failcnt
            .iter()
            .map(|c| parse_number(&read_open(c.as_ref())))
            .max()
            .unwrap_or(0)
    }

    /// `cpuacct.usage` is nanoseconds.
    fn cpu_us(&self, text: &str) -> u64 {
        parse_number(text) / 1000
    }

    fn freezer_root(&self, mounts: &str) -> Option<PathBuf> {
        self.root(mounts, "freezer")
    }

    fn freeze_write(&self, frozen: bool) -> (&'static str, &'static str) {
        ("freezer.state", if frozen { "FROZEN" } else { "THAWED" })
    }

    /// `freezer.state` reads FREEZING until every task has stopped.
    fn is_frozen(&self, dir: &Path) -> bool {
        fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
    }
}

impl Hierarchy for V2 {
    fn version(&self) -> Version {
        Version::V2
    }

    fn root(&self, _: &str, kind: &str) -> Option<PathBuf> {
        let root = Path::new(CGROUP_ROOT);
        let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        available
            .split_whitespace()
            .any(|c| c == kind)
            .then(|| root.to_path_buf())
    }

    /// Hands `kinds` down from the root to `<parent>`'s children (each level's
    /// `cgroup.subtree_control`); a level that already delegates them is left as it is.
    fn prepare_parent(&self, root: &Path, parent: &str, kinds: &[&str]) -> Result<(), HostError> {
        let parent_dir = root.join(parent);
        make_dir(&parent_dir)?;
        for level in [root, parent_dir.as_path()] {
            let control = level.join("cgroup.subtree_control");
            let on = fs::read_to_string(&control).unwrap_or_default();
            let missing: Vec<String> = kinds
                .iter()
                .filter(|k| !on.split_whitespace().any(|c| c == **k))
                .map(|k| format!("+{k}"))
                .collect();
            if !missing.is_empty() {
                fs::write(&control, missing.join(" "))
                    .map_err(|e| err("delegating the controllers to the sandbox cgroup", e))?;
            }
        }
        Ok(())
    }

    fn limit_writes(&self, dirs: &Dirs<'_>, limits: &Limits) -> Vec<LimitWrite> {
        let (quota, period) = cpu_quota(limits.cpus);
        let mut w = vec![write(dirs.memory, "memory.max", limits.memory, MEM)];
        if dirs.memory.join("memory.swap.max").exists() {
            w.push(write(dirs.memory, "memory.swap.max", 0, SWAP));
        }
        w.push(write(dirs.cpu, "cpu.max", format!("{quota} {period}"), CPU));
        if let (Some(pids), Some(dir)) = (limits.pids, dirs.pids) {
            w.push(write(dir, "pids.max", pids, PIDS));
        }
        w
    }

    fn open_counters(&self, dirs: &Dirs<'_>) -> CounterFiles {
        CounterFiles {
            // memory.events also counts the limit's hits (`max`).
            oom: open_ro(dirs.memory.join("memory.events")),
            failcnt: [None, None],
            cpu: open_ro(dirs.cpu.join("cpu.stat")),
            peak: open_ro(dirs.memory.join(self.peak_file())),
        }
    }

    fn peak_file(&self) -> &'static str {
        "memory.peak"
    }

    fn limit_hits(&self, _: &CounterFiles, events: &str) -> u64 {
        parse_keyed(events, "max")
    }

    fn cpu_us(&self, text: &str) -> u64 {
        parse_keyed(text, "usage_usec")
    }

    /// Every v2 cgroup but the root has `cgroup.freeze`; no controller to hand down.
    fn freezer_root(&self, _: &str) -> Option<PathBuf> {
        Some(PathBuf::from(CGROUP_ROOT))
    }

    fn freeze_write(&self, frozen: bool) -> (&'static str, &'static str) {
        ("cgroup.freeze", if frozen { "1" } else { "0" })
    }

    /// `cgroup.events` says `frozen 1` once the whole cgroup is.
    fn is_frozen(&self, dir: &Path) -> bool {
        keyed(&dir.join("cgroup.events"), "frozen") == 1
    }
}

const MEM: &str = "setting the memory limit";
const SWAP: &str = "turning swap off for the sandbox";
const CPU: &str = "setting the CPU quota";
const PIDS: &str = "setting the process limit";

fn write(dir: &Path, file: &str, value: impl ToString, what: &'static str) -> LimitWrite {
    LimitWrite {
        file: dir.join(file),
        value: value.to_string(),
        what,
    }
}

/// The CFS quota and period (microseconds) that give `cpus` CPUs; at least 1% of one.
fn cpu_quota(cpus: f64) -> (u64, u64) {
    let period: u64 = 100_000;
    let quota = (cpus * period as f64).round().max(1000.0) as u64;
    (quota, period)
}

/// The whole content of an open cgroup file, read from its start (cgroupfs regenerates it
/// for every read at offset 0); empty when absent or unreadable.
fn read_open(f: Option<&fs::File>) -> String {
    use std::os::unix::fs::FileExt;
    let Some(f) = f else {
        return String::new();
    };
    let mut buf = [0u8; 4096];
    match f.read_at(&mut buf, 0) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(_) => String::new(),
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> HostError {
    HostError::Cgroup(format!("{what}: {e}"))
}

impl SandboxCgroup {
    /// Creates `cordon/<name>` with the memory, pids and CPU limits set.
    pub fn create(name: &str, memory: u64, pids: u32, cpus: f64) -> Result<Self, HostError> {
        let limits = Limits {
            memory,
            pids: Some(pids),
            cpus,
        };
        Self::create_in(PARENT, name, &limits)
    }

    /// Creates `<parent>/<name>` with `limits` set: memory and CPU always, the pids
    /// controller only with a process limit.
    pub fn create_in(parent: &str, name: &str, limits: &Limits) -> Result<Self, HostError> {
        // One read of the mount table gives both the version and the controllers' roots.
        let mounts = fs::read_to_string(MOUNTS).unwrap_or_default();
        let hier = hierarchy(version_in(&mounts));
        let mut kinds = vec!["memory", "cpu"];
        if limits.pids.is_some() {
            kinds.push("pids");
        }
        // The memory directory may be one kept from a sandbox that ended (`pool`).
        let pooled = pools(hier, &mounts, parent);
        // Each controller's directory (v2: the same one for all), made with its parent.
        let mut made: Vec<PathBuf> = Vec::new();
        let mut dirs: Vec<PathBuf> = Vec::new();
        for kind in &kinds {
            let dir = hier
                .root(&mounts, kind)
                .ok_or_else(|| {
                    HostError::Cgroup(format!(
                        "the {kind} controller is not mounted; mount it (cgroup v1) or enable \
                         it in the root's cgroup.subtree_control (v2)"
                    ))
                })
                .and_then(|root| {
                    let dir = root.join(parent).join(name);
                    if !made.contains(&dir) {
                        hier.prepare_parent(&root, parent, &kinds)?;
                        let kept =
                            pooled && *kind == "memory" && pool::claim(&root.join(parent), name);
                        if !kept {
                            make_dir(&dir)?;
                        }
                        made.push(dir.clone());
                    }
                    Ok(dir)
                });
            match dir {
                Ok(d) => dirs.push(d),
                Err(e) => {
                    for d in &made {
                        let _ = fs::remove_dir(d);
                    }
                    return Err(e);
                }
            }
        }
        let mut dirs = dirs.into_iter();
        let (Some(memory_dir), Some(cpu_dir)) = (dirs.next(), dirs.next()) else {
            return Err(err(
                "creating the sandbox cgroup",
                "no controller directory",
            ));
        };
        let pids_dir = dirs.next();
        // The freezer, for pause and resume: v2's `cgroup.freeze` is in every cgroup; v1's
        // is a hierarchy of its own, joined where the host mounts it (none: no pause).
        let freezer_dir = match hier.freezer_root(&mounts) {
            Some(root) => {
                let dir = root.join(parent).join(name);
                if !made.contains(&dir) {
                    let made_it = hier
                        .prepare_parent(&root, parent, &[])
                        .and_then(|()| make_dir(&dir));
                    if let Err(e) = made_it {
                        for d in &made {
                            let _ = fs::remove_dir(d);
                        }
                        return Err(e);
                    }
                }
                Some(dir)
            }
            None => None,
        };
        let this = SandboxCgroup {
            freezer_dir,
            memory_dir,
            pids_dir,
            cpu_dir,
            hier,
            parent: parent.to_string(),
            name: name.to_string(),
            pooled,
        };
        if let Err(e) = this.set_limits(limits) {
            this.remove();
            return Err(e);
        }
        Ok(this)
    }

    /// The OCI `linux.cgroupsPath` that puts a runtime in this cgroup.
    pub fn oci_path(&self) -> String {
        format!("/{}/{}", self.parent, self.name)
    }

    fn dirs(&self) -> Dirs<'_> {
        Dirs {
            memory: &self.memory_dir,
            cpu: &self.cpu_dir,
            pids: self.pids_dir.as_deref(),
        }
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), HostError> {
        for w in self.hier.limit_writes(&self.dirs(), limits) {
            match fs::write(&w.file, &w.value) {
                Err(e) if !w.what.is_empty() => return Err(err(w.what, e)),
                _ => {}
            }
        }
        Ok(())
    }

    /// The cgroup version this sandbox's cgroup is on.
    pub fn version(&self) -> Version {
        self.hier.version()
    }

    /// The `cgroup.procs` files a process writes its pid to, to join this cgroup.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.all_dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Reads the counters; missing files read as zero, except the CPU time, which is `None`
    /// without its file.
    pub fn counters(&self) -> Counters {
        // The files are opened by this version's `open_counters`; the limit's hits and the
        // CPU time differ in shape between versions and are read by it.
        let f = &self.hier.open_counters(&self.dirs());
        let oom = read_open(f.oom.as_ref());
        Counters {
            oom_kills: parse_keyed(&oom, "oom_kill"),
            limit_hits: self.hier.limit_hits(f, &oom),
            pids_max_hits: self.pids_refusals(),
            cpu_us: f
                .cpu
                .as_ref()
                .map(|cpu| self.hier.cpu_us(&read_open(Some(cpu)))),
            peak_memory: parse_number(&read_open(f.peak.as_ref())),
        }
    }

    /// Forks the process limit has refused so far (one file read: the watch during an exec).
    pub fn pids_refusals(&self) -> u64 {
        self.pids_dir
            .as_ref()
            .map_or(0, |d| keyed(&d.join("pids.events"), "max"))
    }

    /// Resets the peak-memory mark so the next exec's peak is its own (where supported).
    pub fn reset_peak(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = open_rw(self.memory_dir.join(self.hier.peak_file())) {
            let _ = f.write_at(b"0", 0);
        }
    }

    /// Pids currently in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        read_pids(&self.memory_dir.join("cgroup.procs"))
    }

    /// Kills every process in the cgroup and removes it, waiting up to `patience` for the
    /// processes to be gone. Returns false when something could not be removed.
    pub fn kill_and_remove(&self, patience: Duration) -> bool {
        let (dirs, keepable) = self.end_plan();
        let left = remove_ended(&dirs, keepable.as_deref());
        left.is_empty() || remove_dirs(&left, patience)
    }

    /// What ending this cgroup takes, for a process that does it after this one has gone
    /// (a one-shot run's sandbox init, ADR 0044): its directories in every hierarchy, and
    /// the one of them the pool may keep for the next sandbox.
    pub fn end_plan(&self) -> (Vec<PathBuf>, Option<PathBuf>) {
        (
            self.all_dirs(),
            self.pooled.then(|| self.memory_dir.clone()),
        )
    }

    /// Kills what is left in this cgroup's directories in every hierarchy (those a runtime
    /// made beside Cordon's too) and removes them.
    pub fn remove_everywhere(&self, patience: Duration) -> bool {
        remove_dirs(&dirs_of(&self.parent, &self.name), patience)
    }

    fn all_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.memory_dir.clone(), self.cpu_dir.clone()];
        dirs.extend(self.pids_dir.clone());
        dirs.extend(self.freezer_dir.clone());
        dirs.sort();
        dirs.dedup();
        dirs
    }

    fn freezer(&self) -> Result<&Path, HostError> {
        self.freezer_dir.as_deref().ok_or_else(|| {
            HostError::Cgroup(
                "this host has no cgroup freezer; mount the v1 freezer controller (or use cgroup v2)"
                    .into(),
            )
        })
    }

    fn set_frozen(&self, frozen: bool) -> Result<(), HostError> {
        let dir = self.freezer()?;
        let (file, value) = self.hier.freeze_write(frozen);
        fs::write(dir.join(file), value).map_err(|e| {
            err(
                if frozen {
                    "freezing the sandbox"
                } else {
                    "thawing the sandbox"
                },
                e,
            )
        })
    }

    /// Freezes every process of the cgroup (they keep their memory and use no CPU) and waits,
    /// at most `patience`, until the kernel reports them all frozen.
    pub fn freeze(&self, patience: Duration) -> Result<(), HostError> {
        self.set_frozen(true)?;
        let dir = self.freezer()?;
        let deadline = Instant::now() + patience;
        while !self.hier.is_frozen(dir) {
            if Instant::now() >= deadline {
                let _ = self.set_frozen(false);
                return Err(HostError::Cgroup(
                    "the sandbox's processes did not all stop in time; it was left running".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Thaws a frozen cgroup; a thawed one is left as it is.
    pub fn thaw(&self) -> Result<(), HostError> {
        self.set_frozen(false)
    }

    /// Removes the cgroup directories (they must be empty).
    pub fn remove(&self) -> bool {
        self.all_dirs()
            .iter()
            .all(|d| self.kept(d) || !d.exists() || fs::remove_dir(d).is_ok())
    }

    /// Whether `dir`, this cgroup's memory directory, was kept for the next sandbox instead
    /// of being removed (`pool::keep`).
    fn kept(&self, dir: &Path) -> bool {
        self.pooled && dir == self.memory_dir && pool::keep(dir)
    }
}

/// Kills every process in `dirs` and removes them, children first; waits up to `patience`
/// for the processes to go. False when something is still there.
pub fn remove_dirs(dirs: &[PathBuf], patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        let mut left = false;
        for d in dirs {
            if !d.exists() {
                continue;
            }
            if let Ok(rd) = fs::read_dir(d) {
                let subs: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect();
                if !subs.is_empty() && !remove_dirs(&subs, Duration::ZERO) {
                    left = true;
                }
            }
            // A frozen process takes no signal (v1): thaw before the kill.
            for (file, thawed) in [("freezer.state", "THAWED"), ("cgroup.freeze", "0")] {
                if d.join(file).exists() {
                    let _ = fs::write(d.join(file), thawed);
                }
            }
            if d.join("cgroup.kill").exists() {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
            for pid in read_pids(&d.join("cgroup.procs")) {
                crate::sys::kill_pid(pid);
            }
            if fs::remove_dir(d).is_err() && d.exists() {
                left = true;
            }
        }
        if !left {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Where this host's memory controller is: the v2 root, or the v1 memory hierarchy's mount.
pub fn memory_controller() -> Option<(Version, PathBuf)> {
    match host_version() {
        Version::V2 => Some((Version::V2, PathBuf::from(CGROUP_ROOT))),
        Version::V1 => v1_mounts(&fs::read_to_string(MOUNTS).ok()?)
            .into_iter()
            .find(|(_, controllers)| controllers.iter().any(|c| c == "memory"))
            .map(|(dir, _)| (Version::V1, dir)),
    }
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Whether sandboxes under `parent` on `hier` share memory cgroups through the pool: v1,
/// Cordon's own parent, and a memory hierarchy of its own (a directory kept there holds no
/// other controller's counters).
fn pools(hier: &dyn Hierarchy, mounts: &str, parent: &str) -> bool {
    if hier.version() != Version::V1 || parent != PARENT {
        return false;
    }
    let memory = hier.root(mounts, "memory");
    memory.is_some()
        && ["cpu", "pids"]
            .iter()
            .all(|kind| hier.root(mounts, kind) != memory)
        && hier.freezer_root(mounts) != memory
}

/// Where this host's pool of memory cgroups is (`pool`): Cordon's parent in the memory
/// hierarchy, when sandboxes there share memory cgroups through it.
pub fn pool_parent() -> Option<PathBuf> {
    let mounts = fs::read_to_string(MOUNTS).ok()?;
    let hier = hierarchy(version_in(&mounts));
    pools(hier, &mounts, PARENT)
        .then(|| hier.root(&mounts, "memory"))?
        .map(|root| root.join(PARENT))
}

/// Makes a cgroup directory; one that exists already is fine.
fn make_dir(dir: &Path) -> Result<(), HostError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(err("creating the sandbox cgroup", e)),
    }
}

/// Every cgroup v1 hierarchy in a mount table, with its controllers (and `name=` options).
fn v1_mounts(mounts: &str) -> Vec<(PathBuf, Vec<String>)> {
    mounts
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup").then(|| {
                let opts = f[3].split(',').map(str::to_string).collect();
                (PathBuf::from(f[1]), opts)
            })
        })
        .collect()
}

/// `<parent>` in every hierarchy this host has mounted (v2: its one root).
pub fn parents(parent: &str) -> Vec<PathBuf> {
    match host_version() {
        Version::V2 => vec![Path::new(CGROUP_ROOT).join(parent)],
        Version::V1 => v1_mounts(&fs::read_to_string(MOUNTS).unwrap_or_default())
            .into_iter()
            .map(|(dir, _)| dir.join(parent))
            .collect(),
    }
}

/// Every directory `<parent>/<name>` that exists in some hierarchy.
pub fn dirs_of(parent: &str, name: &str) -> Vec<PathBuf> {
    parents(parent)
        .into_iter()
        .map(|p| p.join(name))
        .filter(|d| d.is_dir())
        .collect()
}

/// Removes sandbox cgroups under `cordon/` a dead Cordon process left behind; returns their
/// names.
pub fn reap_orphans(is_live: impl Fn(&str) -> bool) -> Vec<String> {
    let roots = parents(PARENT);
    let mut removed = Vec::new();
    for root in roots {
        let Ok(entries) = fs::read_dir(&root) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.path().is_dir() || is_live(&name) || pool::is_slot(&name) {
                continue;
            }
            if remove_dirs(&[e.path()], Duration::from_secs(2)) && !removed.contains(&name) {
                removed.push(name);
            }
        }
    }
    removed
}

/// Removes sandbox cgroups that hold no process and still hold none after `settle`: what a
/// process killed between making a sandbox's cgroup and recording it (or between its
/// sandbox dying and removing it) left behind. A cgroup being set up right now by another
/// Cordon process is empty only for the moment before its init joins, so the second look
/// after `settle` spares it. Cgroups with processes are never touched.
pub fn reap_empty(settle: Duration) -> Vec<String> {
    let roots = parents(PARENT);
    let empty_dirs = || -> Vec<PathBuf> {
        roots
            .iter()
            .filter_map(|r| fs::read_dir(r).ok())
            .flat_map(|rd| rd.flatten().map(|e| e.path()))
            .filter(|p| {
                let slot = p
                    .file_name()
                    .is_some_and(|n| pool::is_slot(&n.to_string_lossy()));
                !slot && p.is_dir() && read_pids(&p.join("cgroup.procs")).is_empty()
            })
            .collect()
    };
    let first = empty_dirs();
    if first.is_empty() {
        return Vec::new();
    }
    std::thread::sleep(settle);
    let second: std::collections::BTreeSet<PathBuf> = empty_dirs().into_iter().collect();
    let mut removed = Vec::new();
    for d in first.into_iter().filter(|d| second.contains(d)) {
        if fs::remove_dir(&d).is_ok()
            && let Some(name) = d.file_name().map(|n| n.to_string_lossy().into_owned())
            && !removed.contains(&name)
        {
            removed.push(name);
        }
    }
    removed
}

/// Sends SIGKILL to every process listed in a `cgroup.procs` file.
pub fn kill_listed(procs_file: &Path) {
    for pid in read_pids(procs_file) {
        crate::sys::kill_pid(pid);
    }
}

/// A v1 CPU quota for a cgroup to be made in `dir`: `(quota, period)` lowered to the
/// smallest of its ancestors' quotas (v1 refuses a child's above its parent's), scaled to
/// the period.
fn within_ancestors(dir: &std::path::Path, (quota, period): (u64, u64)) -> (u64, u64) {
    let mut q = quota;
    let read = |d: &std::path::Path, f: &str| {
        fs::read_to_string(d.join(f))
            .ok()?
            .trim()
            .parse::<i64>()
            .ok()
    };
    let mut at = dir.parent();
    while let Some(d) = at {
        let (Some(aq), Some(ap)) = (read(d, "cpu.cfs_quota_us"), read(d, "cpu.cfs_period_us"))
        else {
            break;
        };
        if aq > 0 && ap > 0 {
            q = q.min((aq as u64).saturating_mul(period) / ap as u64);
        }
        at = d.parent();
    }
    (q.max(1000), period)
}

#[cfg(test)]
mod tests;
