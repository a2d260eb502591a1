//! Each container's state under the runtime root (`--root`): `<root>/<id>/state.json`
//! (written whole, by rename), the monitor's socket `ctl.sock` and the mount point of the
//! root filesystem. It outlives the caller (containerd's shim asks for `state` later) and,
//! under `/run`, not the node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{OciError, Result};

/// The runtime root when `--root` is not given.
pub const DEFAULT_ROOT: &str = "/run/cordon-oci";

/// A container's status as the OCI runtime spec names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Creating,
    Created,
    Running,
    Stopped,
}

/// What is kept of one container.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    pub bundle: PathBuf,
    /// The monitor's pid and its start time (clock ticks since boot, `/proc/<pid>/stat`
    /// field 22): a pid alone may name another process once the monitor is gone.
    pub pid: i32,
    pub pid_start: u64,
    pub status: Status,
    /// RFC 3339, UTC.
    pub created: String,
    pub annotations: BTreeMap<String, String>,
    /// The Cordon sandbox behind it (its cgroup's name), once made.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// How the workload ended, once it has.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The tier its sandbox runs on (absent: the container tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<cordon_core::Tier>,
    /// The cgroup the bundle named (`linux.cgroupsPath`, checked), below each hierarchy's
    /// root: the monitor is in it and the sandbox's own cgroup below it. Absent: Cordon's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The pod's network namespace (`crate::podnet`): walled by this monitor (a pod's
    /// sandbox container) or joined by its sandbox. Absent: the sandbox's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
}

/// The runtime root.
#[derive(Debug, Clone)]
pub struct Root(pub PathBuf);

impl Root {
    pub fn new(path: Option<&Path>) -> Root {
        Root(path.map_or_else(|| PathBuf::from(DEFAULT_ROOT), Path::to_path_buf))
    }

    pub fn dir(&self, id: &str) -> PathBuf {
        self.0.join(id)
    }

    /// Makes the root (mode 0711: the sandbox's ids pass through to the root filesystem's
    /// mount point, and list nothing) and the container's directory, which must be new.
    pub fn create_dir(&self, id: &str) -> Result<PathBuf> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        crate::check_id(id)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&self.0)
            .map_err(|e| {
                OciError::io(format!("making the runtime root {}", self.0.display()), e)
            })?;
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o711));
        let dir = self.dir(id);
        match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
            Ok(()) => Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(OciError::State(
                format!("container {id:?} already exists; delete it first or pick another id"),
            )),
            Err(e) => Err(OciError::io("making the container's state directory", e)),
        }
    }

    /// Marks container `id`'s directory as its monitor's for the monitor's life (a lock
    /// the kernel lets go of when the monitor ends, killed or not): a `delete` of a
    /// container without a record leaves alone what a live monitor is making.
    pub fn hold(&self, id: &str) -> Result<nix::fcntl::Flock<std::fs::File>> {
        crate::check_id(id)?;
        let dir = std::fs::File::open(self.dir(id))
            .map_err(|e| OciError::io("opening the container's state directory", e))?;
        nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
            |(_, e)| {
                OciError::State(format!(
                    "container {id:?} is held by another monitor ({e}); delete it first or pick another id"
                ))
            },
        )
    }

    /// Whether a live monitor holds container `id`'s directory ([`Root::hold`]).
    pub fn held(&self, id: &str) -> bool {
        let Ok(dir) = std::fs::File::open(self.dir(id)) else {
            return false;
        };
        nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
    }

    pub fn load(&self, id: &str) -> Result<Record> {
        crate::check_id(id)?;
        let path = self.dir(id).join("state.json");
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(OciError::NotFound(id.to_string()));
            }
            Err(e) => return Err(OciError::io("reading the container's state", e)),
        };
        serde_json::from_slice(&text).map_err(|source| OciError::DamagedState {
            id: id.to_string(),
            source,
        })
    }

    pub fn save(&self, r: &Record) -> Result<()> {
        let dir = self.dir(&r.id);
        let tmp = dir.join("state.json.tmp");
        let body = serde_json::to_vec(r).map_err(OciError::EncodeState)?;
        // Root's alone (0600): the record names the bundle, the annotations and the
        // sandbox; the directory above lets every user pass, and ids are no secret.
        write_private(&tmp, &body)
            .and_then(|()| std::fs::rename(&tmp, dir.join("state.json")))
            .map_err(|e| OciError::io("writing the container's state", e))
    }

    /// The record of the live monitor `pid` under this root, if one is there.
    pub fn by_monitor(&self, pid: i32) -> Option<Record> {
        let start = start_time(pid)?;
        self.ids()
            .iter()
            .filter_map(|id| self.load(id).ok())
            .find(|r| r.pid == pid && r.pid_start == start)
    }

    /// Ids of every container under the root.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::check_id(n).is_ok())
            .collect();
        ids.sort();
        ids
    }
}

/// Writes `body` to a new file at `path` that only its owner may read (0600 from its
/// making: a left `.tmp` of another mode is replaced, not reused).
fn write_private(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(body)
}

/// The start time of process `pid` (`/proc/<pid>/stat` field 22), if it is alive and not a
/// zombie.
pub fn start_time(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

impl Record {
    /// Whether its monitor (the container's process) is still the process it was.
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.pid_start)
    }

    /// Its status now: what the monitor wrote while it lives, stopped once it is gone.
    pub fn status_now(&self) -> Status {
        if self.alive() {
            self.status
        } else {
            Status::Stopped
        }
    }
}

/// Now, as RFC 3339 in UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_pid_zero_none() {
        assert!(start_time(std::process::id() as i32).is_some());
        assert_eq!(start_time(0), None);
    }

    /// A container's record is root's alone: another local user reads nothing of it,
    /// though the state directories let every user pass (issue 44, item 17).
    #[test]
    fn the_state_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(Some(&dir.path().join("r")));
        root.create_dir("c1").unwrap();
        let record = Record {
            id: "c1".into(),
            bundle: "/b".into(),
            pid: 1,
            pid_start: 1,
            status: Status::Created,
            created: now_rfc3339(),
            annotations: BTreeMap::new(),
            sandbox: None,
            exit_code: None,
            tier: None,
            cgroup: None,
            netns: None,
        };
        // A left temporary file of a wider mode is not reused.
        std::fs::write(root.dir("c1").join("state.json.tmp"), "x").unwrap();
        root.save(&record).unwrap();
        root.save(&record).unwrap();
        let mode = std::fs::metadata(root.dir("c1").join("state.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "state.json is {mode:o}");
        assert_eq!(root.load("c1").unwrap().id, "c1");
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = now_rfc3339();
        assert!(t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }
}
