//! Per-sandbox control groups on cgroup v1 and v2, through cgroups-rs.
//!
//! The sandbox's cgroup is `cordon/<sandbox id>` under each hierarchy's root: memory (swap
//! off), pids and CPU quota. Limits and counters (OOM kills, process-limit hits, peak memory,
//! CPU time) are read from the cgroup files directly, as numbers, for every exec.

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

/// Counters read from a sandbox's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub oom_kills: u64,
    pub pids_max_hits: u64,
    /// The cgroup's CPU time; `None` where this layout has no usage file here (cgroup v1
    /// with cpuacct mounted apart from cpu: the agent's figure for the exec's tree is used).
    pub cpu_us: Option<u64>,
    pub peak_memory: u64,
}

/// A sandbox's control group.
pub struct SandboxCgroup {
    cg: Cgroup,
    version: Version,
    /// Directory of each controller (one for v2).
    memory_dir: PathBuf,
    pids_dir: PathBuf,
    cpu_dir: PathBuf,
    /// The counter files, open for the sandbox's life: each exec reads them twice, and an
    /// open descriptor saves a path walk through cgroupfs every time.
    files: CounterFiles,
}

/// Open counter files (`None` where a file is missing: it reads as zero).
struct CounterFiles {
    oom: Option<fs::File>,
    pids: Option<fs::File>,
    cpu: Option<fs::File>,
    /// Read-write: writing 0 resets the peak.
    peak: Option<fs::File>,
}

impl CounterFiles {
    fn open(version: Version, memory: &Path, pids: &Path, cpu: &Path) -> Self {
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
                pids: ro(pids.join("pids.events")),
                // Only where cpu and cpuacct share a hierarchy (`cpu,cpuacct`, the usual
                // layout): a separate cpuacct cgroup would cost a mkdir, a join and an rmdir
                // per sandbox for a figure the agent measures anyway.
                cpu: ro(cpu.join("cpuacct.usage")),
                peak: rw(memory.join("memory.max_usage_in_bytes")),
            },
            Version::V2 => CounterFiles {
                oom: ro(memory.join("memory.events")),
                pids: ro(pids.join("pids.events")),
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
        let version = host_version();
        let hier = hierarchies::auto();
        let path = format!("{PARENT}/{name}");
        let controllers = match version {
            Version::V1 => vec!["memory", "pids", "cpu"],
            Version::V2 => vec!["memory", "pids", "cpu"],
        };
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
        let (memory_dir, pids_dir, cpu_dir) = (need("memory")?, need("pids")?, need("cpu")?);
        let files = CounterFiles::open(version, &memory_dir, &pids_dir, &cpu_dir);
        let this = SandboxCgroup {
            memory_dir,
            pids_dir,
            cpu_dir,
            files,
            version,
            cg,
        };
        if let Err(e) = this.set_limits(memory, pids, cpus) {
            this.remove();
            return Err(e);
        }
        Ok(this)
    }

    fn set_limits(&self, memory: u64, pids: u32, cpus: f64) -> Result<(), HostError> {
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
        let pid: &PidController = self
            .cg
            .controller_of()
            .ok_or_else(|| err("pids controller", "missing"))?;
        pid.set_pid_max(MaxValue::Value(pids as i64))
            .map_err(|e| err("setting the process limit", e))?;
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
        let mut dirs = vec![
            self.memory_dir.clone(),
            self.pids_dir.clone(),
            self.cpu_dir.clone(),
        ];
        dirs.sort();
        dirs.dedup();
        dirs.into_iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Reads the counters; missing files read as zero, except the CPU time, which is `None`
    /// without its file.
    pub fn counters(&self) -> Counters {
        // The files were opened for this version (CounterFiles::open); only the CPU one
        // differs in shape: v1's cpuacct.usage is nanoseconds, v2's cpu.stat is keyed.
        let f = &self.files;
        Counters {
            oom_kills: parse_keyed(&read_open(f.oom.as_ref()), "oom_kill"),
            pids_max_hits: parse_keyed(&read_open(f.pids.as_ref()), "max"),
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

    /// Resets the peak-memory mark so the next exec's peak is its own (where supported).
    pub fn reset_peak(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.files.peak {
            let _ = f.write_at(b"0", 0);
        }
    }

    /// Pids currently in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        read_pids(&self.pids_dir.join("cgroup.procs"))
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
        left.is_empty() || kill_and_remove_dirs(&left, self.version, patience)
    }

    fn all_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![
            self.memory_dir.clone(),
            self.pids_dir.clone(),
            self.cpu_dir.clone(),
        ];
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Removes the cgroup directories (they must be empty).
    pub fn remove(&self) -> bool {
        let _ = self.cg.delete();
        self.all_dirs()
            .iter()
            .all(|d| !d.exists() || fs::remove_dir(d).is_ok())
    }
}

fn kill_and_remove_dirs(dirs: &[PathBuf], version: Version, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        let mut busy = false;
        for d in dirs {
            if !d.exists() {
                continue;
            }
            if version == Version::V2 && d.join("cgroup.kill").exists() {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
            for pid in read_pids(&d.join("cgroup.procs")) {
                busy = true;
                crate::sys::kill_pid(pid);
            }
            if fs::remove_dir(d).is_err() && d.exists() {
                busy = true;
            }
        }
        if !busy {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Removes sandbox cgroups a dead Cordon process left behind; returns their names.
/// The directories sandbox cgroups live in: `cordon/` under each hierarchy's root.
fn sandbox_roots(version: Version) -> Vec<PathBuf> {
    match version {
        Version::V1 => ["memory", "pids", "cpu", "cpuacct", "cpu,cpuacct"]
            .iter()
            .map(|c| Path::new("/sys/fs/cgroup").join(c).join(PARENT))
            .collect(),
        Version::V2 => vec![Path::new("/sys/fs/cgroup").join(PARENT)],
    }
}

pub fn reap_orphans(is_live: impl Fn(&str) -> bool) -> Vec<String> {
    let version = host_version();
    let roots = sandbox_roots(version);
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
            if kill_and_remove_dirs(&[e.path()], version, Duration::from_secs(2))
                && !removed.contains(&name)
            {
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
    let version = host_version();
    let roots = sandbox_roots(version);
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
}
