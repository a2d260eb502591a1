//! The join's volumes in the container tier's sandbox: leased volumes under /work and the
//! host directories a node allowed (cordon-oci's `[allow] host_path` entries and the
//! kubelet's pod volumes), each a copy of the host's mount idmapped through the sandbox's
//! user namespace, attached once the root is built.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};
use serde::{Deserialize, Serialize};

/// One volume of the join: its file system as the host mounted it (a root-only directory),
/// bound into the sandbox idmapped through the sandbox's own user namespace, so the files
/// its user writes are stored as its inside ids (1000), whatever host range it ran as.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitVolume {
    pub host_dir: PathBuf,
    /// Where, relative to /work (validated by the host: no `..`, not nested in another).
    pub path: String,
    pub read_only: bool,
    /// A host bind outside /work: its absolute path in the sandbox (validated by the host,
    /// `cordon_core::validate_bind_target`; `path` is then unused). Its mount point is made
    /// in Cordon's layer of the root, never through a link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

impl InitVolume {
    /// Where it appears in the sandbox, for messages.
    fn inside(&self) -> String {
        match &self.at {
            Some(at) => at.clone(),
            None => format!("/work/{}", self.path),
        }
    }
}

/// The volumes' mounts for the sandbox `child`: a detached copy of each host mount, idmapped
/// through the child's user namespace (its ids 0..65536 are the file system's 0..65536),
/// read-only where asked, never suid or devices.
pub(crate) fn volume_mounts(
    child: nix::unistd::Pid,
    volumes: &[InitVolume],
) -> Result<Vec<OwnedFd>, String> {
    if volumes.is_empty() {
        return Ok(Vec::new());
    }
    let userns = fs::File::open(format!("/proc/{child}/ns/user"))
        .map_err(|e| format!("opening the sandbox's user namespace: {e}"))?;
    volumes
        .iter()
        .map(|v| {
            let m = cordon_guest::sys::open_tree_clone(&v.host_dir)
                .map_err(|e| format!("volume at {}: copying its mount: {e}", v.inside()))?;
            let mut set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
            if v.read_only {
                set |= libc::MOUNT_ATTR_RDONLY;
            }
            cordon_guest::sys::mount_setattr(&m, set, Some(&userns)).map_err(|e| {
                format!(
                    "volume at {}: mapping its ids (idmapped mount): {e}",
                    v.inside()
                )
            })?;
            Ok(m)
        })
        .collect()
}

/// Attaches each volume's mount (idmapped by the host) at its path under the new root's
/// /work: a fresh tmpfs nothing has run in yet, so no symlink can be on the way; the
/// directories made for it belong to the sandbox's user. Mount points never lie inside
/// another volume (the host refuses nested paths), so nothing is ever made in one.
pub(crate) fn mount_volumes(
    root: &Path,
    uid: u32,
    volumes: &[InitVolume],
    fds: Vec<OwnedFd>,
) -> Result<(), String> {
    let work = root.join("work");
    for (v, fd) in volumes.iter().zip(fds) {
        if let Some(at) = &v.at {
            let point = bind_point(root, at)?;
            cordon_guest::sys::move_mount_to(&fd, &point)
                .map_err(|e| format!("volume at {at}: attaching it: {e}"))?;
            continue;
        }
        if v.path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!(
                "volume path {:?} is not a plain path under /work",
                v.path
            ));
        }
        let mut at = work.clone();
        for c in v.path.split('/') {
            at.push(c);
            match fs::create_dir(&at) {
                Ok(()) => {
                    nix::unistd::chown(&at, Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid)))
                        .map_err(|e| format!("volume at /work/{}: {e}", v.path))?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(format!(
                        "volume at /work/{}: making its mount point: {e}",
                        v.path
                    ));
                }
            }
        }
        let md =
            fs::symlink_metadata(&at).map_err(|e| format!("volume at /work/{}: {e}", v.path))?;
        if !md.file_type().is_dir() {
            return Err(format!(
                "volume at /work/{}: its mount point is not a directory",
                v.path
            ));
        }
        cordon_guest::sys::move_mount_to(&fd, &at)
            .map_err(|e| format!("volume at /work/{}: attaching it: {e}", v.path))?;
    }
    Ok(())
}

/// Makes the mount points of the volumes bound outside /work (`at`) under `base` (Cordon's
/// layer of the root, or a writable root), each directory on the way made where missing,
/// never through a link.
pub(crate) fn make_bind_points(base: &Path, volumes: &[InitVolume]) -> Result<(), String> {
    for at in volumes.iter().filter_map(|v| v.at.as_deref()) {
        let mut p = base.to_path_buf();
        for c in at.trim_start_matches('/').split('/') {
            p.push(c);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(format!(
                        "volume at {at}: something not a directory is in the way"
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&p)
                    .map_err(|e| format!("volume at {at}: making its mount point: {e}"))?,
                Err(e) => return Err(format!("volume at {at}: {e}")),
            }
        }
    }
    Ok(())
}

/// The mount point of a volume bound at `at` in the finished root `root`: a directory,
/// every component of the way a directory (no link).
fn bind_point(root: &Path, at: &str) -> Result<PathBuf, String> {
    let mut p = root.to_path_buf();
    for c in at.trim_start_matches('/').split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return Err(format!("volume path {at:?} is not a plain absolute path"));
        }
        p.push(c);
        let m = fs::symlink_metadata(&p).map_err(|e| format!("volume at {at}: {e}"))?;
        if !m.is_dir() {
            return Err(format!(
                "volume at {at}: its mount point is not a directory"
            ));
        }
    }
    Ok(p)
}

/// The sandbox paths of the writable host binds outside /work (the Landlock ruleset lets
/// the sandbox write beneath them, as beneath /work).
pub(crate) fn writable_binds(volumes: &[InitVolume]) -> Vec<String> {
    volumes
        .iter()
        .filter(|v| !v.read_only)
        .filter_map(|v| v.at.clone())
        .collect()
}

/// The workspace bound again at `/home/user` (E2B's home), its volumes with it: one tmpfs
/// under two names, so a process that starts in `/home/user` is there by its own name
/// (`getcwd` answers `/home/user`) and Cordon's `/work` names the same files. Landlock's
/// rules are on the workspace's inodes, so they hold under either name. An image whose
/// own `/home/user` holds files keeps them: nothing is bound over them.
pub(crate) fn bind_home(root: &Path) -> Result<(), String> {
    let at = root.join("home/user");
    if fs::read_dir(&at).map_or(true, |mut d| d.next().is_some()) {
        return Ok(());
    }
    cordon_guest::sys::bind_recursive(&root.join("work"), &at)
        .map_err(|e| format!("binding the workspace at /home/user: {e}"))
}
