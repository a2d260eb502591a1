//! The memory cgroup of one live gvisor sandbox (each start of its runsc sandbox), created
//! by Cordon before `runsc run` and named in the OCI `cgroupsPath`.
//!
//! runsc sets no limit on a cgroup it finds already there and never removes one it did not
//! create. Creating the memory cgroup ourselves (with the limit set) therefore lets the
//! out-of-memory counters outlive the sandbox, so an exec can be classified even when the
//! limit ended runsc's sentry; Cordon removes the cgroup itself. On cgroup v1 runsc still creates (and removes)
//! the other controllers' directories, CPU quota included; on v2 there is one directory,
//! ours, and Cordon writes the memory and CPU limits.
//!
//! Every cgroup lives under [`PARENT`] at the root of each hierarchy, as `<sandbox id>-<n>`,
//! so that the orphan sweep can find what a killed Cordon left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_host::cgroup::{keyed, number, read_pids};

use crate::GvisorError;

/// Parent of every gvisor sandbox's cgroup, under each hierarchy's root.
pub const PARENT: &str = "cordon-gvisor";

/// The cgroup layout of this host, as runsc sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Unified hierarchy mounted at this path.
    V2(PathBuf),
    /// Legacy hierarchies (hybrid hosts count as v1, as they do for runsc): the memory
    /// controller's mount, and every cgroup v1 mount point.
    V1 { memory: PathBuf, all: Vec<PathBuf> },
}

impl Layout {
    /// Reads the layout from `/proc/self/mounts`; `None` when no memory controller is
    /// mounted.
    pub fn detect() -> Option<Layout> {
        let root = Path::new("/sys/fs/cgroup");
        let v2 = nix::sys::statfs::statfs(root)
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        if v2 {
            return Some(Layout::V2(root.to_path_buf()));
        }
        let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
        Layout::from_mounts(&mounts)
    }

    fn from_mounts(mounts: &str) -> Option<Layout> {
        let mut memory = None;
        let mut all = Vec::new();
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 || f[2] != "cgroup" {
                continue;
            }
            let dir = PathBuf::from(f[1]);
            if f[3].split(',').any(|o| o == "memory") {
                memory = Some(dir.clone());
            }
            all.push(dir);
        }
        Some(Layout::V1 {
            memory: memory?,
            all,
        })
    }

    /// Every directory named `name` under [`PARENT`] that exists in some hierarchy.
    pub fn dirs_of(&self, name: &str) -> Vec<PathBuf> {
        self.parents()
            .into_iter()
            .map(|p| p.join(name))
            .filter(|d| d.is_dir())
            .collect()
    }

    /// [`PARENT`] in every hierarchy.
    pub fn parents(&self) -> Vec<PathBuf> {
        match self {
            Layout::V2(root) => vec![root.join(PARENT)],
            Layout::V1 { all, .. } => all.iter().map(|m| m.join(PARENT)).collect(),
        }
    }
}

/// What the cgroup has counted so far (an exec's share is the difference across it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Processes the kernel killed for memory in this cgroup.
    pub oom_kills: u64,
    /// Times a charge hit the limit (v1 `failcnt`, v2 `max` events).
    pub limit_hits: u64,
    /// Peak memory of the whole sandbox (user-space kernel included), in bytes.
    pub peak_bytes: u64,
}

impl Counters {
    /// True when the memory limit ended a process: an OOM kill was counted, or (kernels
    /// without the kill counter) the limit was hit and the sandbox died of SIGKILL.
    pub fn out_of_memory(&self, died_of_sigkill: bool) -> bool {
        self.oom_kills > 0 || (self.limit_hits > 0 && died_of_sigkill)
    }
}

/// One live sandbox's memory cgroup (runsc, its sentry and gofer), owned by Cordon.
pub struct SandboxCgroup {
    layout: Layout,
    name: String,
    dir: PathBuf,
}

fn cg_err(what: &str, path: &Path, e: std::io::Error) -> GvisorError {
    GvisorError::Cgroup(format!("{what} {}: {e}", path.display()))
}

impl SandboxCgroup {
    /// Creates `PARENT/<name>` with the memory limit (swap off) and, on v2, the CPU quota.
    pub fn create(
        layout: &Layout,
        name: &str,
        memory: u64,
        cpus: f64,
    ) -> Result<SandboxCgroup, GvisorError> {
        let dir = match layout {
            Layout::V1 { memory, .. } => memory.join(PARENT).join(name),
            Layout::V2(root) => {
                enable_controllers(root)?;
                let parent = root.join(PARENT);
                fs::create_dir_all(&parent).map_err(|e| cg_err("cannot create", &parent, e))?;
                enable_controllers(&parent)?;
                parent.join(name)
            }
        };
        fs::create_dir_all(&dir).map_err(|e| cg_err("cannot create", &dir, e))?;
        let cg = SandboxCgroup {
            layout: layout.clone(),
            name: name.to_string(),
            dir,
        };
        if let Err(e) = cg.set_limits(memory, cpus) {
            cg.remove(Duration::from_secs(1));
            return Err(e);
        }
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), GvisorError> {
        let p = self.dir.join(file);
        fs::write(&p, value).map_err(|e| cg_err(&format!("cannot write {value:?} to"), &p, e))
    }

    fn set_limits(&self, memory: u64, cpus: f64) -> Result<(), GvisorError> {
        let mem = memory.to_string();
        match self.layout {
            Layout::V1 { .. } => {
                self.write("memory.limit_in_bytes", &mem)?;
                // Swap off: memory+swap bounded by the same figure, where swap is accounted.
                if self.dir.join("memory.memsw.limit_in_bytes").exists() {
                    self.write("memory.memsw.limit_in_bytes", &mem)?;
                }
                let _ = self.write("memory.swappiness", "0");
            }
            Layout::V2(_) => {
                self.write("memory.max", &mem)?;
                if self.dir.join("memory.swap.max").exists() {
                    self.write("memory.swap.max", "0")?;
                }
                let period = 100_000u64;
                let quota = ((cpus * period as f64).round() as u64).max(1000);
                self.write("cpu.max", &format!("{quota} {period}"))?;
            }
        }
        Ok(())
    }

    /// The OCI `linux.cgroupsPath` that puts runsc in this cgroup.
    pub fn oci_path(&self) -> String {
        format!("/{PARENT}/{}", self.name)
    }

    pub fn counters(&self) -> Counters {
        match self.layout {
            Layout::V1 { .. } => Counters {
                oom_kills: keyed(&self.dir.join("memory.oom_control"), "oom_kill"),
                limit_hits: number(&self.dir.join("memory.failcnt"))
                    .max(number(&self.dir.join("memory.memsw.failcnt"))),
                peak_bytes: number(&self.dir.join("memory.max_usage_in_bytes")),
            },
            Layout::V2(_) => Counters {
                oom_kills: keyed(&self.dir.join("memory.events"), "oom_kill"),
                limit_hits: keyed(&self.dir.join("memory.events"), "max"),
                peak_bytes: number(&self.dir.join("memory.peak")),
            },
        }
    }

    /// Starts the peak-memory figure again from the current use (v1; v2 kernels before 6.12
    /// cannot reset `memory.peak`, so there it stays the sandbox's peak).
    pub fn reset_peak(&self) {
        if let Layout::V1 { .. } = self.layout {
            let _ = fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
        }
    }

    /// Kills what is left in this sandbox's cgroups (every hierarchy) and removes them.
    pub fn remove(&self, patience: Duration) -> bool {
        remove_dirs(&self.layout.dirs_of(&self.name), patience)
    }
}

/// Enables the memory and cpu controllers for the children of a v2 cgroup.
fn enable_controllers(dir: &Path) -> Result<(), GvisorError> {
    let control = dir.join("cgroup.subtree_control");
    let on = fs::read_to_string(&control).unwrap_or_default();
    for c in ["memory", "cpu"] {
        if !on.split_whitespace().any(|x| x == c) {
            fs::write(&control, format!("+{c}")).map_err(|e| {
                cg_err(&format!("cannot enable the {c} controller in"), &control, e)
            })?;
        }
    }
    Ok(())
}

/// Kills every process in `dirs` and removes them, deepest first; waits up to `patience`
/// for the processes to go. False when something is still there.
pub fn remove_dirs(dirs: &[PathBuf], patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        let mut left = false;
        for d in dirs {
            if !d.exists() {
                continue;
            }
            // Children first (runsc makes none today, but a v2 sandbox could).
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
            if d.join("cgroup.kill").exists() {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
            for pid in read_pids(&d.join("cgroup.procs")) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
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
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_host::cgroup::parse_keyed;

    #[test]
    fn hybrid_mounts_are_v1_with_the_memory_controller_found() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
            cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
            cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
            cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n\
            cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        let Some(Layout::V1 { memory, all }) = Layout::from_mounts(mounts) else {
            panic!("not v1");
        };
        assert_eq!(memory, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(all.len(), 3);
        assert!(Layout::from_mounts("cgroup /x cgroup rw,cpu 0 0\n").is_none());
    }

    #[test]
    fn oom_counters_parse_and_decide() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_keyed(v1, "oom_kill"), 2);
        let v2 = "low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_keyed(v2, "max"), 17);
        assert_eq!(parse_keyed(v2, "oom_kill"), 1);
        assert_eq!(parse_keyed(v2, "missing"), 0);
        let none = Counters::default();
        assert!(!none.out_of_memory(true));
        let hit = Counters {
            limit_hits: 3,
            ..Counters::default()
        };
        assert!(hit.out_of_memory(true) && !hit.out_of_memory(false));
        let killed = Counters {
            oom_kills: 1,
            ..Counters::default()
        };
        assert!(killed.out_of_memory(false));
    }

    #[test]
    fn v2_limits_are_written_by_cordon_and_counters_read_back() {
        // A directory standing in for a v2 root: runsc writes nothing into a cgroup it finds
        // already there, so every limit must come from here.
        let root = std::env::temp_dir().join(format!("cordon-cg2-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        let layout = Layout::V2(root.clone());
        let cg = SandboxCgroup::create(&layout, "sb-x-1", 64 << 20, 0.5).unwrap();
        let dir = root.join(PARENT).join("sb-x-1");
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "50000 100000"
        );
        // Controllers were enabled for the children of the root and of the parent.
        for d in [root.clone(), root.join(PARENT)] {
            let on = fs::read_to_string(d.join("cgroup.subtree_control")).unwrap();
            assert!(on.starts_with('+'), "{on}");
        }
        assert_eq!(cg.oci_path(), "/cordon-gvisor/sb-x-1");
        fs::write(dir.join("memory.events"), "max 4\noom 1\noom_kill 1\n").unwrap();
        fs::write(dir.join("memory.peak"), "1234\n").unwrap();
        let c = cg.counters();
        assert_eq!((c.oom_kills, c.limit_hits, c.peak_bytes), (1, 4, 1234));
        assert!(c.out_of_memory(false));
        fs::remove_dir_all(&root).unwrap();
    }
}
