//! What a container gets through the node's allowances ([`crate::node::Allow`]): the host
//! devices and host directories its bundle asked for and the node named exactly, checked
//! against the host as the container is created, and the record of every allowance used.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use cordon_engine::NodeAllowance;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use oci_spec::runtime::{LinuxDevice, LinuxDeviceType};

use crate::node::{DeviceAllow, HostPathAllow};
use crate::{OciError, Result};

/// What a bundle was given beyond Cordon's defaults.
#[derive(Debug, Default)]
pub struct Granted {
    /// Every allowance used, for the gate's decision.
    pub record: Vec<NodeAllowance>,
    /// Host devices for the sandbox's `/dev`, as names under it.
    pub devices: Vec<String>,
    /// Host directories, each open, for a place in the sandbox: the node's `[allow]
    /// host_path` entries (under `/work`) and the kubelet's pod volumes (anywhere).
    pub host_paths: Vec<HostDir>,
}

impl Granted {
    pub(crate) fn note(&mut self, a: NodeAllowance) {
        if !self.record.contains(&a) {
            self.record.push(a);
        }
    }

    /// A host directory given, noted as a host path on the decision.
    /// Grants the host directory `source` at `dest` (read-only when `read_only`), opened
    /// without following a symbolic link; `refusal` says why when it cannot be opened so.
    fn grant_dir(
        &mut self,
        (source, dest): (&Path, &str),
        read_only: bool,
        pod: bool,
        refusal: impl FnOnce(nix::Error) -> OciError,
    ) -> Result<()> {
        let d = HostDir {
            dir: open_dir(source).map_err(refusal)?,
            path: source.to_path_buf(),
            at: dest.to_string(),
            writable: !read_only,
            pod,
        };
        self.note(NodeAllowance::HostPath {
            path: d.path.display().to_string(),
            at: d.at.clone(),
            writable: d.writable,
        });
        self.host_paths.push(d);
        Ok(())
    }
}

/// A host directory opened for its bind: the exact directory the node allowed. Its bind is
/// made of the same directory opened again (as this one was) in the monitor's own mount
/// namespace, where a mount of the host's namespace cannot be bound from.
#[derive(Debug)]
pub struct HostDir {
    dir: OwnedFd,
    path: std::path::PathBuf,
    /// Where it goes: under `/work` (an `[allow] host_path` entry's), or anywhere the
    /// bundle says (a pod volume's, resolved in the image's root when it is bound).
    pub at: String,
    pub writable: bool,
    /// A pod volume of the kubelet's (its `at` may lie in the image's tree).
    pub pod: bool,
}

fn refused(what: String, fix: &str) -> OciError {
    OciError::Refused {
        what,
        fix: fix.to_string(),
    }
}

/// The host device `d` (a bundle's entry) if the node allows exactly it: the same path,
/// type and numbers as an `[[allow.device]]` entry, and the host's node at that path is
/// that device (no symbolic link). Returns its name under `/dev`.
pub fn device(d: &LinuxDevice, allowed: &[DeviceAllow], granted: &mut Granted) -> Result<()> {
    let path = d.path();
    let asked = format!(
        "a host device, {} ({} {}:{})",
        path.display(),
        d.typ().as_str(),
        d.major(),
        d.minor()
    );
    let fix = "remove the device (--device, --privileged), or ask the node's operator to name \
               exactly it (path, type, major and minor) in [[allow.device]]";
    let Some(entry) = allowed.iter().find(|a| {
        a.path == *path && a.typ == d.typ() && a.major == d.major() && a.minor == d.minor()
    }) else {
        return Err(refused(format!("it asks for {asked}"), fix));
    };
    // The node itself, as it is now: a device of that type and those numbers.
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let on_host = std::fs::symlink_metadata(&entry.path).ok().filter(|m| {
        let ft = m.file_type();
        let kind_ok = match entry.typ {
            LinuxDeviceType::C => ft.is_char_device(),
            LinuxDeviceType::B => ft.is_block_device(),
            _ => false,
        };
        let rdev = m.rdev();
        kind_ok
            && nix::sys::stat::major(rdev) as i64 == entry.major
            && nix::sys::stat::minor(rdev) as i64 == entry.minor
    });
    if on_host.is_none() {
        return Err(refused(
            format!("it asks for {asked}, which is not that device on this node"),
            "the node's operator must fix its [[allow.device]] entry or the node's /dev",
        ));
    }
    let name = entry
        .path
        .strip_prefix("/dev")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    granted.devices.push(name);
    granted.note(NodeAllowance::Device {
        path: entry.path.display().to_string(),
        device_type: entry.typ.as_str().to_string(),
        major: entry.major,
        minor: entry.minor,
    });
    Ok(())
}

/// The bind mount of host `source` at `dest` (read-only when `read_only`), if the node
/// allows exactly it: an `[[allow.host_path]]` entry with that path and `at`, writable if
/// the bind is not read-only. The directory is opened now, refusing a symbolic link
/// anywhere in its path, so the bind is of what was checked.
pub fn host_path(
    source: &Path,
    dest: &str,
    read_only: bool,
    allowed: &[HostPathAllow],
    granted: &mut Granted,
) -> Result<()> {
    let fix = "remove the volume or bind mount (files enter a Cordon sandbox through its API), \
               or ask the node's operator to name exactly this directory and its place under \
               /work in [[allow.host_path]]";
    let asked = || format!("it asks for a host path at {dest} ({})", source.display());
    if !crate::node::plain_absolute(source) {
        return Err(refused(
            format!("{}, which is not a plain absolute path", asked()),
            fix,
        ));
    }
    let Some(entry) = allowed.iter().find(|a| a.path == source && a.at == dest) else {
        return Err(refused(asked(), fix));
    };
    if !read_only && !entry.writable {
        return Err(refused(
            format!("{} writable, and the node allows it read-only", asked()),
            "mount it read-only (`:ro`, `readOnly: true`)",
        ));
    }
    granted.grant_dir((source, dest), read_only, false, |e| {
        refused(
            format!(
                "{}, which cannot be opened as a directory without following a symbolic link ({e})",
                asked()
            ),
            "the node's operator must name the directory itself, with no symbolic link in its path",
        )
    })
}

/// The bind mount of host `source` at `dest` when it is one of the kubelet's volumes of
/// this pod: a directory under `<kubelet root_dir>/pods/<pod_uid>/` (the pod's own
/// directory, named by containerd's `io.kubernetes.cri.sandbox-uid`), opened without
/// following a symbolic link anywhere in its path (every component walked by the kernel,
/// `RESOLVE_NO_SYMLINKS`), read-only when the bind is. Returns `Ok(false)` when `source`
/// is not under the pod's directory (then it is a host path like any other); refuses one
/// that is but cannot be opened so, or names no directory, or whose `dest` is no place
/// for it.
pub fn pod_volume(
    source: &Path,
    dest: &str,
    read_only: bool,
    kubelet: &crate::node::Kubelet,
    pod_uid: Option<&str>,
    granted: &mut Granted,
) -> Result<bool> {
    let (Some(root), Some(uid)) = (&kubelet.root_dir, pod_uid) else {
        return Ok(false);
    };
    if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
        return Ok(false);
    }
    let pod_dir = root.join("pods").join(uid);
    let inside = source
        .strip_prefix(&pod_dir)
        .ok()
        .filter(|r| !r.as_os_str().is_empty());
    if inside.is_none() || !crate::node::plain_absolute(source) {
        return Ok(false);
    }
    let asked = || format!("it asks for a pod volume at {dest}");
    cordon_core::validate_bind_target(dest).map_err(|e| {
        refused(
            format!("{}: {e}", asked()),
            "mount the volume at another path in the container",
        )
    })?;
    granted.grant_dir((source, dest), read_only, true, |e| {
        refused(
            format!(
                "{}, whose directory in the kubelet's pod directory cannot be opened as a \
                 directory without following a symbolic link ({e})",
                asked()
            ),
            "mount the volume's directory, not a single file of it (subPath of a file), and \
             keep links out of the kubelet's pod directory",
        )
    })?;
    Ok(true)
}

/// Opens the directory at the absolute `path` refusing every symbolic link on the way.
fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    nix::fcntl::openat2(
        &root,
        rel,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH),
    )
}

fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
    match (nix::sys::stat::fstat(a), nix::sys::stat::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Binds each granted directory under `base` (in the monitor's own mount namespace, where
/// the tier opens it) and returns the sandbox's binds of them: an `[allow] host_path`
/// entry's under `/work`, a pod volume's where the bundle says, every symbolic link of the
/// image's on the way resolved inside the image's root (`image_root`, as runc does), so
/// the mount point is made in the sandbox's own tree.
pub fn bind_host_paths(
    dirs: Vec<HostDir>,
    base: &Path,
    image_root: &Path,
) -> Result<Vec<cordon_core::HostBind>> {
    use nix::mount::{MsFlags, mount};
    if dirs.len() > cordon_core::MAX_HOST_BINDS {
        return Err(refused(
            format!(
                "it asks for {} host paths and pod volumes; a sandbox has at most {}",
                dirs.len(),
                cordon_core::MAX_HOST_BINDS
            ),
            "give the pod fewer volumes",
        ));
    }
    let mut binds = Vec::new();
    for (i, d) in dirs.into_iter().enumerate() {
        let target = if d.pod {
            resolve_in_root(image_root, &d.at)
        } else {
            d.at.clone()
        };
        cordon_core::validate_bind_target(&target).map_err(|e| {
            refused(
                format!("its mount at {}: {e}", d.at),
                "mount the volume at another path in the container",
            )
        })?;
        let at = base.join(format!("host-{i}"));
        std::fs::create_dir(&at)
            .map_err(|e| OciError::io("making a host path's mount point", e))?;
        // The same directory as checked, or nothing.
        let again = open_dir(&d.path).ok().filter(|f| same_file(f, &d.dir));
        let Some(again) = again else {
            return Err(refused(
                format!("its host path for {} changed while it was created", d.at),
                "create the container again",
            ));
        };
        let source = format!("/proc/self/fd/{}", again.as_raw_fd());
        mount(
            Some(source.as_str()),
            &at,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| OciError::io(format!("binding the host path for {}", d.at), e.into()))?;
        binds.push(cordon_core::HostBind {
            source: at,
            target,
            read_only: !d.writable,
        });
    }
    Ok(binds)
}

/// `target` (an absolute path in the container) with every symbolic link of the image's on
/// the way resolved inside `root` (an absolute link from the root, a relative one from where
/// it is; never above the root), as runc resolves a mount's destination. What the image
/// lacks is kept as given; more than 40 links leave the rest as given.
pub fn resolve_in_root(root: &Path, target: &str) -> String {
    let mut todo: std::collections::VecDeque<String> = target
        .split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        match c.as_str() {
            "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        let here = root.join(done.join("/")).join(&c);
        let link = (links < 40)
            .then(|| std::fs::read_link(&here).ok())
            .flatten();
        let Some(link) = link else {
            done.push(c);
            continue;
        };
        links += 1;
        let text = link.to_string_lossy().into_owned();
        if text.starts_with('/') {
            done.clear();
        }
        for (k, part) in text.split('/').filter(|p| !p.is_empty()).enumerate() {
            todo.insert(k, part.to_string());
        }
    }
    format!("/{}", done.join("/"))
}

/// A bundle's root filesystem, checked ([`root`]): the directory it names (links
/// followed), its identity, and whether it is a node directory the node's `[allow] rootfs`
/// names rather than a root the engine made.
#[derive(Debug, Clone)]
pub struct CheckedRoot {
    /// The directory, every symbolic link on the way resolved.
    pub path: std::path::PathBuf,
    dev: u64,
    ino: u64,
    /// A node directory (allowed by name), not the engine's: its root-owned files are
    /// never mapped to the workload.
    pub node_dir: bool,
}

impl CheckedRoot {
    /// The same directory opened again (in the monitor's own mount namespace, where a
    /// mount of the node's namespace cannot be bound from), or a refusal if it changed.
    pub fn reopen(&self) -> Result<OwnedFd> {
        nix::fcntl::open(
            &self.path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .filter(|f| {
            nix::sys::stat::fstat(f).is_ok_and(|s| s.st_dev == self.dev && s.st_ino == self.ino)
        })
        .ok_or_else(|| {
            refused(
                "its root filesystem changed while it was created".into(),
                "create the container again",
            )
        })
    }
}

/// Why a root was refused, and the way out.
const ROOT_FIX: &str = "run an image through the engine (its root is then the engine's own \
     overlay mount), not a directory of the node (podman --rootfs, ctr --rootfs, a \
     hand-written root.path); or ask the node's operator to name exactly that directory in \
     [allow] rootfs";

/// Checks the root filesystem a bundle names (`path`, as the bundle gives it): the root of
/// an overlay mount (the engine's own storage: podman's and Docker's graph drivers,
/// containerd's overlayfs snapshotter), or a directory the node's `[allow] rootfs` names
/// exactly (`allowed`, noted in `granted` as a host path at `/`). Anything else is refused,
/// a symbolic link to a node directory included: with a writable root, the image's files
/// owned by root are the workload's user's, and a node directory's would be too.
pub fn root(
    path: &Path,
    allowed: &[std::path::PathBuf],
    writable: bool,
    granted: &mut Granted,
) -> Result<CheckedRoot> {
    let unreadable = |e: std::io::Error| {
        refused(
            format!(
                "its root filesystem cannot be opened as a directory ({})",
                e.kind()
            ),
            "give the bundle a root filesystem the engine made",
        )
    };
    let canonical = std::fs::canonicalize(path).map_err(unreadable)?;
    let dir = nix::fcntl::open(
        &canonical,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| unreadable(e.into()))?;
    let st = nix::sys::stat::fstat(&dir).map_err(|e| unreadable(e.into()))?;
    let (dev, ino) = (st.st_dev, st.st_ino);
    let checked = |node_dir| CheckedRoot {
        path: canonical.clone(),
        dev,
        ino,
        node_dir,
    };
    if engine_overlay(&canonical, dev) {
        return Ok(checked(false));
    }
    let named = allowed.iter().find(|a| {
        open_dir(a).is_ok_and(|f| {
            nix::sys::stat::fstat(&f).is_ok_and(|s| s.st_dev == dev && s.st_ino == ino)
        })
    });
    let Some(entry) = named else {
        return Err(refused(
            "its root filesystem is not one the engine made (an overlay mount of its \
             storage), and the node's [allow] rootfs does not name it"
                .into(),
            ROOT_FIX,
        ));
    };
    granted.note(NodeAllowance::HostPath {
        path: entry.display().to_string(),
        at: "/".into(),
        writable,
    });
    Ok(checked(true))
}

/// Whether `dir` (a canonical path of device `dev`) is the root of an overlay mount: the
/// last mount at that point in this mount namespace's table (the one seen there) is an
/// overlay, of that device.
fn engine_overlay(dir: &Path, dev: u64) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let mut seen = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let (Some(numbers), Some(point)) = (fields.get(2), fields.get(4)) else {
            continue;
        };
        if Path::new(&crate::rootfs::unescape(point)) != dir {
            continue;
        }
        let fstype = right.split(' ').next().unwrap_or("");
        let same_dev = numbers.split_once(':').is_some_and(|(ma, mi)| {
            match (ma.parse::<u64>(), mi.parse::<u64>()) {
                (Ok(ma), Ok(mi)) => nix::sys::stat::makedev(ma, mi) == dev,
                _ => false,
            }
        });
        seen = Some(fstype == "overlay" && same_dev);
    }
    seen.unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount's destination through the image's links lands inside the image's root: an
    /// absolute link from the root, a relative one from where it is, `..` never above it.
    #[test]
    fn destinations_resolve_inside_the_images_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("var")).unwrap();
        std::os::unix::fs::symlink("../run", r.join("var/run")).unwrap();
        std::os::unix::fs::symlink("/etc", r.join("cfg")).unwrap();
        std::os::unix::fs::symlink("../../../../..", r.join("up")).unwrap();
        assert_eq!(
            resolve_in_root(r, "/var/run/secrets/kubernetes.io/serviceaccount"),
            "/run/secrets/kubernetes.io/serviceaccount"
        );
        assert_eq!(resolve_in_root(r, "/cfg/app"), "/etc/app");
        assert_eq!(resolve_in_root(r, "/up/data"), "/data");
        assert_eq!(resolve_in_root(r, "/scratch"), "/scratch");
    }

    /// A pod volume is the pod's own directory's, opened without a link anywhere; another
    /// pod's, or a path outside the kubelet's, is not one (a host path, refused elsewhere).
    #[test]
    fn pod_volumes_are_the_pods_own_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = crate::node::Kubelet {
            root_dir: Some(dir.path().to_path_buf()),
        };
        let pod = dir.path().join("pods/u1/volumes");
        std::fs::create_dir_all(pod.join("kubernetes.io~empty-dir/scratch")).unwrap();
        std::os::unix::fs::symlink("/etc", pod.join("linked")).unwrap();
        let mut g = Granted::default();
        let ok = pod.join("kubernetes.io~empty-dir/scratch");
        assert!(pod_volume(&ok, "/scratch", false, &kubelet, Some("u1"), &mut g).unwrap());
        assert_eq!(g.host_paths.len(), 1);
        assert!(g.host_paths[0].pod && g.host_paths[0].writable);
        // Another pod's, no pod at all, no kubelet named: not a pod volume.
        for (uid, k) in [
            (Some("u2"), &kubelet),
            (None, &kubelet),
            (Some("u1"), &crate::node::Kubelet::default()),
        ] {
            assert!(!pod_volume(&ok, "/scratch", false, k, uid, &mut g).unwrap());
        }
        for bad in [pod.join("linked"), pod.join("linked/ssl")] {
            let e = pod_volume(&bad, "/cfg", true, &kubelet, Some("u1"), &mut g).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        let e = pod_volume(&ok, "/proc/x", false, &kubelet, Some("u1"), &mut g).unwrap_err();
        assert!(e.to_string().contains("/proc"), "{e}");
        assert_eq!(g.host_paths.len(), 1);
    }
}
