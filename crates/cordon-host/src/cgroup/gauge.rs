//! A sandbox's live figures from its cgroup (CPU time, memory charged, page cache) and its
//! workspace's file system (bytes used), as a [`Gauge`] a sampler keeps apart from the
//! sandbox: it holds the cgroup's directories, not the sandbox, and opens each file for a
//! reading (no descriptor is held between readings, as for the exec counters).

use std::path::{Path, PathBuf};

use cordon_core::{Gauge, Reading};

use super::{Dirs, Hierarchy, SandboxCgroup, Version, keyed, number, read_open};

/// Where a sandbox's workspace is, for its bytes used.
#[derive(Debug, Clone)]
pub enum Workspace {
    /// A directory on the host (gvisor's tmpfs).
    Host(PathBuf),
    /// `/work` as the cgroup's first process sees it (`/proc/<pid>/root/work`): the
    /// container tier's tmpfs, mounted inside the sandbox's own mount namespace.
    Inside,
    /// Not known on the host (a VM's disk).
    Unknown,
}

/// A cgroup's figures and a workspace's size, read on demand.
pub struct CgroupGauge {
    hier: &'static dyn Hierarchy,
    memory_dir: PathBuf,
    cpu_dir: PathBuf,
    workspace: Workspace,
}

impl SandboxCgroup {
    /// A gauge of this cgroup (and the workspace at `workspace`), for a sampler.
    pub fn gauge(&self, workspace: Workspace) -> CgroupGauge {
        CgroupGauge {
            hier: self.hier,
            memory_dir: self.memory_dir.clone(),
            cpu_dir: self.cpu_dir.clone(),
            workspace,
        }
    }
}

/// Bytes used on the file system holding `dir`.
fn used_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let frag = st.fragment_size() as u64;
    Some(
        (st.blocks() as u64)
            .saturating_sub(st.blocks_free() as u64)
            .saturating_mul(frag),
    )
}

impl CgroupGauge {
    fn disk(&self) -> Option<u64> {
        match &self.workspace {
            Workspace::Host(dir) => used_bytes(dir),
            Workspace::Inside => {
                let pid = super::read_pids(&self.memory_dir.join("cgroup.procs"))
                    .into_iter()
                    .next()?;
                used_bytes(&PathBuf::from(format!("/proc/{pid}/root/work")))
            }
            Workspace::Unknown => None,
        }
    }
}

impl Gauge for CgroupGauge {
    fn read(&self) -> Option<Reading> {
        // A cgroup that went (its sandbox ended, or a new start replaced it) reads nothing.
        if !self.memory_dir.is_dir() {
            return None;
        }
        let dirs = Dirs {
            memory: &self.memory_dir,
            cpu: &self.cpu_dir,
            pids: None,
        };
        let cpu = self.hier.open_counters(&dirs).cpu;
        let cpu_us = cpu
            .as_ref()
            .map_or(0, |f| self.hier.cpu_us(&read_open(Some(f))));
        let (current, cache_key) = match self.hier.version() {
            Version::V2 => ("memory.current", "file"),
            Version::V1 => ("memory.usage_in_bytes", "total_cache"),
        };
        Some(Reading {
            cpu_us,
            memory_bytes: number(&self.memory_dir.join(current)),
            cache_bytes: keyed(&self.memory_dir.join("memory.stat"), cache_key),
            disk_used_bytes: self.disk(),
        })
    }
}
