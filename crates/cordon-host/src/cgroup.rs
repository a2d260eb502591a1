//! The one cgroup manager of the native tiers, on cgroup v1 and v2 through cgroups-rs (whose
//! `Hierarchy` trait, with its v1 and v2 implementations, is where the two versions differ
//! in creating cgroups and setting limits; the counter files each version keeps are read
//! here, as numbers, for every exec).
//!
//! A sandbox's cgroup is `<parent>/<name>` under each hierarchy's root: memory (swap off),
//! CPU quota and, where the tier asks, a process limit. The container and microvm tiers use
//! `cordon/<sandbox id>` with all three; the gvisor tier `cordon-gvisor/<container id>`
//! without pids (runsc joins the cgroup Cordon made and sets nothing on it; on v1 it makes
//! the other controllers' directories itself, so removal and the orphan sweep look in
//! every hierarchy mounted).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::fs::MaxValue;
use cgroups_rs::fs::cgroup::Cgroup;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::hierarchies;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;

use crate::HostError;

/// Name of the parent cgroup under which every sandbox's cgroup lives.
pub const PARENT: &str = "cordon";

/// Which cgroup version this host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

pub fn host_version() -> Version {
    if hierarchies::is_cgroup2_unified_mode() {
        Version::V2
    } else {
        Version::V1
    }
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
    cg: Cgroup,
    version: Version,
    parent: String,
    name: String,
    /// Directory of each controller (one for v2).
    memory_dir: PathBuf,
    pids_dir: Option<PathBuf>,
    cpu_dir: PathBuf,
    /// Where the freezer is (v1: its own hierarchy; v2: the one directory).
    freezer_dir: Option<PathBuf>,
    /// The counter files, open for the sandbox's life: each exec reads them twice, and an
    /// open descriptor saves a path walk through cgroupfs every time.
    files: CounterFiles,
}

/// Open counter files (`None` where a file is missing: it reads as zero).
struct CounterFiles {
    /// v1 `memory.oom_control`, v2 `memory.events` (which also counts the limit's hits).
    oom: Option<fs::File>,
    /// v1 `memory.failcnt` and `memory.memsw.failcnt`.
    failcnt: [Option<fs::File>; 2],
    pids: Option<fs::File>,
    cpu: Option<fs::File>,
    /// Read-write: writing 0 resets the peak.
    peak: Option<fs::File>,
}

impl CounterFiles {
    fn open(version: Version, memory: &Path, pids: Option<&Path>, cpu: &Path) -> Self {
        let ro = |p: PathBuf| fs::File::open(p).ok();
        // Read-write where the kernel allows it (v1, and v2's memory.peak from Linux 6.12),
        // so the peak can be reset; read-only otherwise (the peak is still read).
        let rw = |p: PathBuf| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .or_else(|_| fs::File::open(&p))
                .ok()
        };
        match version {
            Version::V1 => CounterFiles {
                oom: ro(memory.join("memory.oom_control")),
                failcnt: [
                    ro(memory.join("memory.failcnt")),
                    ro(memory.join("memory.memsw.failcnt")),
                ],
                pids: pids.and_then(|d| ro(d.join("pids.events"))),
                // Only where cpu and cpuacct share a hierarchy (`cpu,cpuacct`, the usual
                // layout): a separate cpuacct cgroup would cost a mkdir, a join and an rmdir
                // per sandbox for a figure the agent measures anyway.
                cpu: ro(cpu.join("cpuacct.usage")),
                peak: rw(memory.join("memory.max_usage_in_bytes")),
            },
            Version::V2 => CounterFiles {
                oom: ro(memory.join("memory.events")),
                failcnt: [None, None],
                pids: pids.and_then(|d| ro(d.join("pids.events"))),
                cpu: ro(cpu.join("cpu.stat")),
                peak: rw(memory.join("memory.peak")),
            },
        }
    }
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
        let version = host_version();
        let hier = hierarchies::auto();
        let path = format!("{parent}/{name}");
        let mut controllers = vec!["memory", "cpu"];
        if limits.pids.is_some() {
            controllers.push("pids");
        }
        // The freezer, for pause and resume: v2's `cgroup.freeze` is in every cgroup; v1's
        // is a hierarchy of its own, joined where the host mounts it.
        let freezer = match version {
            Version::V2 => true,
            Version::V1 => hier
                .subsystems()
                .iter()
                .any(|s| s.controller_name() == "freezer"),
        };
        if freezer {
            controllers.push("freezer");
        }
        let cg = Cgroup::new_with_specified_controllers(
            hier,
            &path,
            Some(controllers.iter().map(|s| s.to_string()).collect()),
        )
        .map_err(|e| err("creating the sandbox cgroup", e))?;
        let dir_of = |kind: &str| -> Option<PathBuf> {
            cg.subsystems().iter().find_map(|s| {
                let c = s.to_controller();
                (s.controller_name() == kind).then(|| c.path().to_path_buf())
            })
        };
        let need = |kind: &str| {
            dir_of(kind).ok_or_else(|| {
                HostError::Cgroup(format!(
                    "the {kind} controller is not mounted; mount it (cgroup v1) or enable it in \
                     the root's cgroup.subtree_control (v2)"
                ))
            })
        };
        let freezer_dir = dir_of("freezer");
        let memory_dir = need("memory")?;
        let cpu_dir = need("cpu")?;
        let pids_dir = match limits.pids {
            Some(_) => Some(need("pids")?),
            None => None,
        };
        let files = CounterFiles::open(version, &memory_dir, pids_dir.as_deref(), &cpu_dir);
        let this = SandboxCgroup {
            freezer_dir,
            memory_dir,
            pids_dir,
            cpu_dir,
            files,
            version,
            parent: parent.to_string(),
            name: name.to_string(),
            cg,
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

    fn set_limits(&self, limits: &Limits) -> Result<(), HostError> {
        let Limits { memory, pids, cpus } = *limits;
        let mem: &MemController = self
            .cg
            .controller_of()
            .ok_or_else(|| err("memory controller", "missing"))?;
        mem.set_limit(memory as i64)
            .map_err(|e| err("setting the memory limit", e))?;
        match self.version {
            Version::V1 => {
                // Swap off: memory+swap limited to the same figure. Hosts without swap
                // accounting have no memsw file; there is no swap to bound then.
                if self.memory_dir.join("memory.memsw.limit_in_bytes").exists() {
                    mem.set_memswap_limit(memory as i64)
                        .map_err(|e| err("turning swap off for the sandbox", e))?;
                }
                let _ = fs::write(self.memory_dir.join("memory.swappiness"), "0");
            }
            Version::V2 => {
                if self.memory_dir.join("memory.swap.max").exists() {
                    fs::write(self.memory_dir.join("memory.swap.max"), "0")
                        .map_err(|e| err("turning swap off for the sandbox", e))?;
                }
            }
        }
        if let Some(pids) = pids {
            let pid: &PidController = self
                .cg
                .controller_of()
                .ok_or_else(|| err("pids controller", "missing"))?;
            pid.set_pid_max(MaxValue::Value(pids as i64))
                .map_err(|e| err("setting the process limit", e))?;
        }
        let cpu: &CpuController = self
            .cg
            .controller_of()
            .ok_or_else(|| err("cpu controller", "missing"))?;
        let period: u64 = 100_000;
        let quota = (cpus * period as f64).round().max(1000.0) as i64;
        cpu.set_cfs_quota_and_period(Some(quota), Some(period))
            .map_err(|e| err("setting the CPU quota", e))?;
        Ok(())
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
        // The files were opened for this version (CounterFiles::open); only the CPU one
        // differs in shape: v1's cpuacct.usage is nanoseconds, v2's cpu.stat is keyed.
        let f = &self.files;
        let oom = read_open(f.oom.as_ref());
        Counters {
            oom_kills: parse_keyed(&oom, "oom_kill"),
            limit_hits: match self.version {
                Version::V1 => f
                    .failcnt
                    .iter()
                    .map(|c| parse_number(&read_open(c.as_ref())))
                    .max()
                    .unwrap_or(0),
                Version::V2 => parse_keyed(&oom, "max"),
            },
            pids_max_hits: self.pids_refusals(),
            cpu_us: f.cpu.as_ref().map(|cpu| {
                let text = read_open(Some(cpu));
                match self.version {
                    Version::V1 => parse_number(&text) / 1000,
                    Version::V2 => parse_keyed(&text, "usage_usec"),
                }
            }),
            peak_memory: parse_number(&read_open(f.peak.as_ref())),
        }
    }

    /// Forks the process limit has refused so far (one file read: the watch during an exec).
    pub fn pids_refusals(&self) -> u64 {
        parse_keyed(&read_open(self.files.pids.as_ref()), "max")
    }

    /// Resets the peak-memory mark so the next exec's peak is its own (where supported).
    pub fn reset_peak(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.files.peak {
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
        let dirs = self.all_dirs();
        // Usually every process is gone already (the caller waited for them): then the
        // directories just go, without reading each one's process list first.
        let mut left = Vec::new();
        for d in dirs {
            if fs::remove_dir(&d).is_err() && d.exists() {
                left.push(d);
            }
        }
        left.is_empty() || remove_dirs(&left, patience)
    }

    /// Kills what is left in this cgroup's directories in every hierarchy (those a runtime
    /// made beside Cordon's too) and removes them.
    pub fn remove_everywhere(&self, patience: Duration) -> bool {
        let _ = self.cg.delete();
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

    fn freezer(&self) -> Result<&cgroups_rs::fs::freezer::FreezerController, HostError> {
        self.cg
            .controller_of::<cgroups_rs::fs::freezer::FreezerController>()
            .filter(|_| self.freezer_dir.is_some())
            .ok_or_else(|| {
                HostError::Cgroup(
                    "this host has no cgroup freezer; mount the v1 freezer controller (or use cgroup v2)"
                        .into(),
                )
            })
    }

    /// Freezes every process of the cgroup (they keep their memory and use no CPU) and waits,
    /// at most `patience`, until the kernel reports them all frozen.
    pub fn freeze(&self, patience: Duration) -> Result<(), HostError> {
        use cgroups_rs::FreezerState;
        let f = self.freezer()?;
        f.freeze().map_err(|e| err("freezing the sandbox", e))?;
        let deadline = Instant::now() + patience;
        loop {
            match f.state() {
                Ok(FreezerState::Frozen) => return Ok(()),
                _ if Instant::now() >= deadline => {
                    let _ = f.thaw();
                    return Err(HostError::Cgroup(
                        "the sandbox's processes did not all stop in time; it was left running"
                            .into(),
                    ));
                }
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    /// Thaws a frozen cgroup; a thawed one is left as it is.
    pub fn thaw(&self) -> Result<(), HostError> {
        self.freezer()?
            .thaw()
            .map_err(|e| err("thawing the sandbox", e))
    }

    /// Removes the cgroup directories (they must be empty).
    pub fn remove(&self) -> bool {
        let _ = self.cg.delete();
        self.all_dirs()
            .iter()
            .all(|d| !d.exists() || fs::remove_dir(d).is_ok())
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
        Version::V1 => v1_mounts(&fs::read_to_string("/proc/self/mounts").ok()?)
            .into_iter()
            .find(|(_, controllers)| controllers.iter().any(|c| c == "memory"))
            .map(|(dir, _)| (Version::V1, dir)),
    }
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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
        Version::V1 => v1_mounts(&fs::read_to_string("/proc/self/mounts").unwrap_or_default())
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
            if !e.path().is_dir() || is_live(&name) {
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
            .filter(|p| p.is_dir() && read_pids(&p.join("cgroup.procs")).is_empty())
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

/// The pids listed in a `cgroup.procs` file (none when it cannot be read).
pub fn read_pids(p: &Path) -> Vec<i32> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A file holding one number; 0 when absent or unreadable.
pub fn number(p: &Path) -> u64 {
    parse_number(&fs::read_to_string(p).unwrap_or_default())
}

/// One number in a file's text; 0 when absent.
fn parse_number(text: &str) -> u64 {
    text.trim().parse().unwrap_or(0)
}

/// The value of `key` in a `key value` per line file; 0 when absent.
pub fn keyed(p: &Path, key: &str) -> u64 {
    parse_keyed(&fs::read_to_string(p).unwrap_or_default(), key)
}

/// The value of `key` in `key value` lines; 0 when absent.
pub fn parse_keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keyed_files() {
        let dir = std::env::temp_dir().join(format!("cordon-cg-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("memory.oom_control");
        fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(keyed(&f, "oom_kill"), 3);
        assert_eq!(keyed(&f, "missing"), 0);
        fs::write(&f, "12345\n").unwrap();
        assert_eq!(number(&f), 12345);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hybrid_mounts_list_every_v1_hierarchy() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
            cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
            cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
            cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n\
            cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        let v1 = v1_mounts(mounts);
        let dirs: Vec<&Path> = v1.iter().map(|(d, _)| d.as_path()).collect();
        assert_eq!(
            dirs,
            [
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/systemd"
            ]
            .map(Path::new)
        );
        assert!(v1[1].1.iter().any(|c| c == "memory"));
    }

    #[test]
    fn counters_diff_and_decide_out_of_memory() {
        let v2 = "low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_keyed(v2, "max"), 17);
        assert_eq!(parse_keyed(v2, "oom_kill"), 1);
        let before = Counters {
            limit_hits: 2,
            cpu_us: Some(10),
            ..Counters::default()
        };
        let after = Counters {
            limit_hits: 5,
            cpu_us: Some(25),
            peak_memory: 9,
            ..Counters::default()
        };
        let d = after.since(&before);
        assert_eq!((d.limit_hits, d.cpu_us, d.peak_memory), (3, Some(15), 9));
        assert!(d.out_of_memory(true) && !d.out_of_memory(false));
        assert!(!Counters::default().out_of_memory(true));
        let killed = Counters {
            oom_kills: 1,
            ..Counters::default()
        };
        assert!(killed.out_of_memory(false));
    }
}
