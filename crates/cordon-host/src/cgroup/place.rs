//! A sandbox placed under a cgroup its caller names: cordon-oci's container in the
//! `linux.cgroupsPath` a kubelet gives through containerd (`/<root>/kubepods/<qos>/pod<uid>/
//! <container id>` with the cgroupfs driver), so the kubelet's pod limits hold it and the
//! CRI stats (containerd reads the cgroup of the container's process) and the kubelet's
//! summary (the pod's cgroup) count the workload (docs/adr/0029-oci-pod-cgroup-and-network.md).
//!
//! The caller's process (cordon-oci's monitor) moves into `<path>` in the hierarchies that
//! account (memory, cpu, cpuacct, pids, blkio); the tier makes its sandbox's own cgroup as a
//! child, `<path>/<sandbox>`, with Cordon's limits on it as everywhere else. On cgroup v2 the
//! caller stays where it is (a cgroup with processes hands no controller down): the pod's
//! cgroup still counts the sandbox.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use super::{CGROUP_ROOT, MOUNTS, Version, v1_mounts, version_in};
use crate::HostError;

/// The v1 controllers whose hierarchy the caller joins: those a runtime's stats and the
/// kubelet's accounting read.
const JOINED: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "blkio"];

/// The v1 controllers whose hierarchy gets the directory without the caller in it (the
/// tiers' freezer directory is made below it).
const MADE: [&str; 1] = ["freezer"];

/// A cgroup path a caller asked for, checked: relative to each hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    rel: String,
}

fn refuse(why: &str) -> HostError {
    HostError::Cgroup(format!(
        "{why}; give an absolute cgroup path of plain names whose last names the container \
         (the engine's cgroupfs form), or none"
    ))
}

impl Placement {
    /// Checks an OCI `linux.cgroupsPath` for container `id`: absolute, plain names (no `.`,
    /// `..` or empty ones), its last name containing the id (containerd's `<parent>/<id>`,
    /// podman's `libpod-<id>`), so removing it at the end removes the container's own cgroup
    /// and never another's. The systemd form (`slice:prefix:name`) is `None`: this runtime
    /// drives cgroupfs only, and such a container keeps Cordon's own place.
    pub fn from_oci(path: &str, id: &str) -> Result<Option<Placement>, HostError> {
        if path.is_empty() || (!path.starts_with('/') && path.contains(':')) {
            return Ok(None);
        }
        let Some(rel) = path.strip_prefix('/') else {
            return Err(refuse("the cgroup path is relative"));
        };
        let names: Vec<&str> = rel.split('/').collect();
        if names
            .iter()
            .any(|n| n.is_empty() || *n == "." || *n == ".." || n.contains('\0'))
        {
            return Err(refuse("the cgroup path has an empty, '.' or '..' name"));
        }
        if !names.last().is_some_and(|n| n.contains(id)) {
            return Err(refuse(
                "the cgroup path's last name does not name the container",
            ));
        }
        Ok(Some(Placement {
            rel: rel.to_string(),
        }))
    }

    /// The path below each hierarchy's root: the parent a tier makes its sandbox's cgroup in.
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// Makes the cgroup (and its parents) where it is missing and moves the calling
    /// process into it (v1; on v2 only makes it).
    pub fn enter(&self) -> Result<(), HostError> {
        let mounts = fs::read_to_string(MOUNTS).unwrap_or_default();
        let me = std::process::id().to_string();
        for (dir, join) in self.dirs_in(&mounts) {
            fs::create_dir_all(&dir)
                .map_err(|e| HostError::Cgroup(format!("making the pod's cgroup: {e}")))?;
            if join {
                fs::write(dir.join("cgroup.procs"), &me).map_err(|e| {
                    HostError::Cgroup(format!("moving the container into its cgroup: {e}"))
                })?;
            }
        }
        Ok(())
    }

    /// The directories of this cgroup: each with whether the caller joins it.
    fn dirs_in(&self, mounts: &str) -> Vec<(PathBuf, bool)> {
        match version_in(mounts) {
            Version::V2 => vec![(PathBuf::from(CGROUP_ROOT).join(&self.rel), false)],
            Version::V1 => v1_mounts(mounts)
                .into_iter()
                .filter_map(|(root, opts)| {
                    let has = |set: &[&str]| opts.iter().any(|o| set.contains(&o.as_str()));
                    let join = has(&JOINED);
                    (join || has(&MADE)).then(|| (root.join(&self.rel), join))
                })
                .collect(),
        }
    }

    /// Every directory of this cgroup that exists, in every hierarchy (runsc makes the
    /// other controllers' directories of its sandbox's cgroup below it).
    pub fn existing(&self) -> Vec<PathBuf> {
        super::parents(&self.rel)
            .into_iter()
            .filter(|d| d.is_dir())
            .collect()
    }

    /// Kills what is left in the cgroup and removes it, children first. False when
    /// something is still there after `patience`.
    pub fn remove(&self, patience: Duration) -> bool {
        super::remove_dirs(&self.existing(), patience)
    }

    /// The host pids of every process in the cgroup and below it.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut todo = self.existing();
        while let Some(d) = todo.pop() {
            pids.extend(super::read_pids(&d.join("cgroup.procs")));
            if let Ok(rd) = fs::read_dir(&d) {
                todo.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Changes the memory limit and the CPU quota of this cgroup (not of the sandbox's own
    /// below it: [`super::SandboxCgroup::resize`]): `runc update` for a resize in place.
    /// `None` leaves that limit as it is.
    pub fn resize(&self, memory: Option<u64>, cpus: Option<f64>) -> Result<(), HostError> {
        let mounts = fs::read_to_string(MOUNTS).unwrap_or_default();
        let version = version_in(&mounts);
        let dir = |kind: &str| self.dir(&mounts, kind);
        if let Some(bytes) = memory {
            resize_memory(version, &dir("memory")?, bytes)?;
        }
        if let Some(cpus) = cpus {
            let (quota, period) = super::cpu_quota(cpus);
            let d = dir("cpu")?;
            match version {
                Version::V2 => write(&d, "cpu.max", &format!("{quota} {period}"))?,
                Version::V1 => {
                    write(&d, "cpu.cfs_period_us", &period.to_string())?;
                    write(&d, "cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The CPUs this cgroup's quota gives; `None` without a quota.
    pub fn cpus(&self) -> Option<f64> {
        let mounts = fs::read_to_string(MOUNTS).unwrap_or_default();
        let d = self.dir(&mounts, "cpu").ok()?;
        let text = |f: &str| fs::read_to_string(d.join(f)).unwrap_or_default();
        let (quota, period) = match version_in(&mounts) {
            Version::V1 => (text("cpu.cfs_quota_us"), text("cpu.cfs_period_us")),
            Version::V2 => {
                let t = text("cpu.max");
                let mut f = t.split_whitespace();
                (
                    f.next().unwrap_or("").to_string(),
                    f.next().unwrap_or("").to_string(),
                )
            }
        };
        let (q, p) = (
            quota.trim().parse::<i64>().ok()?,
            period.trim().parse::<i64>().ok()?,
        );
        (q > 0 && p > 0).then(|| q as f64 / p as f64)
    }

    /// This cgroup's directory in `kind`'s hierarchy.
    fn dir(&self, mounts: &str, kind: &str) -> Result<PathBuf, HostError> {
        super::hierarchy(version_in(mounts))
            .root(mounts, kind)
            .map(|r| r.join(&self.rel))
            .ok_or_else(|| HostError::Cgroup(format!("the {kind} controller is not mounted")))
    }
}

/// Sets one cgroup's memory limit (swap off: v1's memory+swap limit follows it, in the
/// order that keeps it at least the memory limit).
fn resize_memory(version: Version, dir: &std::path::Path, bytes: u64) -> Result<(), HostError> {
    let v = bytes.to_string();
    match version {
        Version::V2 => write(dir, "memory.max", &v),
        Version::V1 => {
            let memsw = dir.join("memory.memsw.limit_in_bytes").exists();
            let now = super::number(&dir.join("memory.limit_in_bytes"));
            if memsw && bytes > now {
                write(dir, "memory.memsw.limit_in_bytes", &v)?;
            }
            write(dir, "memory.limit_in_bytes", &v)?;
            if memsw && bytes <= now {
                write(dir, "memory.memsw.limit_in_bytes", &v)?;
            }
            Ok(())
        }
    }
}

fn write(dir: &std::path::Path, file: &str, value: &str) -> Result<(), HostError> {
    fs::write(dir.join(file), value)
        .map_err(|e| HostError::Cgroup(format!("resizing the container's cgroup ({file}): {e}")))
}

impl super::SandboxCgroup {
    /// Changes the memory limit (swap still off) and the CPU quota of a live sandbox's
    /// cgroup; its process limit stays.
    pub fn resize(&self, memory: u64, cpus: f64) -> Result<(), HostError> {
        let (version, memory_dir) = (self.version(), self.memory_dir.clone());
        resize_memory(version, &memory_dir, memory)?;
        let (quota, period) = match version {
            Version::V1 => super::within_ancestors(&self.cpu_dir, super::cpu_quota(cpus)),
            Version::V2 => super::cpu_quota(cpus),
        };
        match version {
            Version::V1 => {
                write(&self.cpu_dir, "cpu.cfs_period_us", &period.to_string())?;
                write(&self.cpu_dir, "cpu.cfs_quota_us", &quota.to_string())
            }
            Version::V2 => write(&self.cpu_dir, "cpu.max", &format!("{quota} {period}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_path_is_checked() {
        let id = "0123abcd";
        let p = Placement::from_oci("/cordon-k8s/kubepods/besteffort/pod1/0123abcd", id).unwrap();
        assert_eq!(
            p.unwrap().rel(),
            "cordon-k8s/kubepods/besteffort/pod1/0123abcd"
        );
        let podman = Placement::from_oci("/libpod_parent/libpod-0123abcd", id).unwrap();
        assert!(podman.is_some());
        assert_eq!(Placement::from_oci("", id).unwrap(), None);
        assert_eq!(
            Placement::from_oci("system.slice:cri:0123abcd", id).unwrap(),
            None
        );
        for bad in [
            "kubepods/0123abcd",
            "/kubepods/../0123abcd",
            "/kubepods//0123abcd",
            "/kubepods/./0123abcd",
            "/kubepods/other",
            "/",
        ] {
            assert!(Placement::from_oci(bad, id).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn the_v1_directories_are_the_accounting_hierarchies() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
            cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
            cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n\
            cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n\
            cgroup /sys/fs/cgroup/freezer cgroup rw,freezer 0 0\n\
            cgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0\n";
        let p = Placement::from_oci("/k/pod/c1", "c1").unwrap().unwrap();
        let dirs = p.dirs_in(mounts);
        assert_eq!(
            dirs,
            vec![
                (PathBuf::from("/sys/fs/cgroup/cpu/k/pod/c1"), true),
                (PathBuf::from("/sys/fs/cgroup/memory/k/pod/c1"), true),
                (PathBuf::from("/sys/fs/cgroup/freezer/k/pod/c1"), false),
            ]
        );
    }
}
