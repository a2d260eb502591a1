//! A writable root for a bundle whose `root.readonly` is false (podman's, Docker's and
//! containerd's default): the workload sees the image's root and may write anywhere in it,
//! and every write goes to an upper layer of the container's own, bounded by its disk limit
//! (docs/adr/0023-oci-writable-root.md). Nothing is written to the bundle's root filesystem
//! or to the image's layers the engine shares between containers.
//!
//! In the monitor's own mount namespace (see `monitor::bind_rootfs`):
//! - the image's layers (the layers of the engine's overlay when the bundle's root is one,
//!   else the root directory itself) are each bound read-only, never set-id or devices,
//!   with their owners mapped into the container's host id range: the image's root (0) is
//!   seen as the sandbox's user (1000, the user a root process runs as), every other id `n`
//!   of the image as `n` (and the image's 1000, which has no place left, as nobody);
//! - the upper layer is an ext4 file system of the disk limit's size on a loop device, its
//!   image file unlinked once mounted ([`Upper::Disk`]), or a tmpfs of that size, counted
//!   against the container's memory ([`Upper::Memory`]): past it a write fails with ENOSPC;
//! - an overlay of the two, never set-id or devices, is the sandbox's root (the container
//!   tier's writable-root mode, as `cordon template build` uses it).
//!
//! All of it lives in mounts of the monitor's namespace: when the monitor ends (or is
//! killed), they go with it and the loop device clears itself; no file is left on the host.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use crate::{OciError, Result};

/// Where the upper layer's ext4 image is made; it is unlinked as soon as it is mounted.
pub const UPPERS: &str = "/var/lib/cordon/oci/uppers";

/// The smallest upper layer: ext4 needs room for its own metadata.
const MIN_UPPER: u64 = 8 << 20;

/// Where the writes of a writable root go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upper {
    /// An ext4 file system of the disk limit's size, on a loop device (the default).
    Disk,
    /// A tmpfs of the disk limit's size: its pages are the container's memory.
    Memory,
}

/// Whether the bundle asks for a writable root: `root.readonly` false or left out (the OCI
/// default).
pub fn asked(spec: &Spec) -> bool {
    spec.root()
        .as_ref()
        .is_some_and(|r| !r.readonly().unwrap_or(false))
}

/// Whose files a writable root's layers hold, and so how their owners are mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// An image's, from the engine's storage: its root (0) is the sandbox's user.
    Image,
    /// A node directory's (`[allow] rootfs`): its root-owned files are the sandbox's root
    /// (its agent, which makes the root's mount points), never the workload's user's.
    Node,
}

/// A writable root made, and the host id range it was made for (held for the monitor's
/// life: the sandbox must be created with exactly these ids).
pub struct Writable {
    /// The overlay: the sandbox's root.
    pub root: PathBuf,
    pub ids: cordon_host::idpool::IdRange,
}

/// The uid the sandbox's programs run as (and the image's root is seen as).
const SANDBOX_UID: u32 = crate::bundle::SANDBOX_ID;

/// Makes the writable root over `rootfs` under `base` (the monitor's roots tmpfs) for
/// container `id`, its upper layer of `size` bytes. Call in the monitor's own mount
/// namespace.
pub fn mount(
    rootfs: &Path,
    base: &Path,
    id: &str,
    size: u64,
    upper: Upper,
    owners: Owners,
) -> Result<Writable> {
    let ids = cordon_host::idpool::IdPool::system()
        .allocate()
        .map_err(|e| OciError::Core(e.into_core()))?;
    let root = mount_for(rootfs, base, id, size, upper, ids.base(), owners)?;
    Ok(Writable { root, ids })
}

/// The pool the container tier takes the sandbox's ids from: exactly `ids`, which the root
/// was made for (and which stay leased from the system pool by the monitor).
pub fn pool(ids: &cordon_host::idpool::IdRange) -> cordon_host::idpool::IdPool {
    cordon_host::idpool::IdPool::new(
        cordon_host::idpool::run_dir("oci-ids"),
        ids.base(),
        1,
        cordon_host::idpool::RANGE,
    )
}

/// [`mount`] for the host id range starting at `id_base`.
pub fn mount_for(
    rootfs: &Path,
    base: &Path,
    id: &str,
    size: u64,
    upper: Upper,
    id_base: u32,
    owners: Owners,
) -> Result<PathBuf> {
    let layers = layers(rootfs)?;
    let map = cordon_host::volume::IdMap::new(&id_map(id_base, owners))
        .map_err(|e| OciError::io("a user namespace for the image's ids", e))?;
    let mut lower = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let at = base.join(format!("l{i}"));
        std::fs::create_dir(&at).map_err(|e| OciError::io("making a layer's mount point", e))?;
        map.bind(layer, &at, true).map_err(|e| {
            OciError::io(
                "mapping the image's ids onto a layer of the root (an idmapped mount; the \
                 layers' file system must support them: ext4, xfs, btrfs, tmpfs)",
                e,
            )
        })?;
        lower.push(at);
    }
    let up = base.join("up");
    std::fs::create_dir(&up)
        .map_err(|e| OciError::io("making the upper layer's mount point", e))?;
    let size = size.max(MIN_UPPER);
    match upper {
        Upper::Disk => disk(&up, id, size)?,
        Upper::Memory => nix::mount::mount(
            Some("tmpfs"),
            &up,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0700").as_str()),
        )
        .map_err(|e| OciError::io("mounting the upper layer's tmpfs", e.into()))?,
    }
    let (upper_dir, work) = (up.join("upper"), up.join("work"));
    for d in [&upper_dir, &work] {
        std::fs::create_dir(d).map_err(|e| OciError::io("making the upper layer", e))?;
    }
    // The root directory takes its owner and mode from the upper layer's: the image's.
    let top = std::fs::metadata(&lower[0])
        .map_err(|e| OciError::io("reading the image's root directory", e))?;
    std::os::unix::fs::chown(&upper_dir, Some(top.uid()), Some(top.gid()))
        .map_err(|e| OciError::io("giving the upper layer the root's owner", e))?;
    std::fs::set_permissions(
        &upper_dir,
        std::os::unix::fs::PermissionsExt::from_mode(top.mode() & 0o1777),
    )
    .map_err(|e| OciError::io("giving the upper layer the root's mode", e))?;
    let root = base.join("wroot");
    std::fs::create_dir(&root).map_err(|e| OciError::io("making the root's mount point", e))?;
    let lowerdir: Vec<String> = lower.iter().map(|l| l.display().to_string()).collect();
    // index off: a layer the engine's own overlay writes to (its container layer) is one of
    // these lower layers, read-only here. The layers' directory redirects are followed (as
    // the engine's overlay follows them), none is made; metadata-only copies are not
    // followed (a file the engine's overlay copied up so is unreadable here).
    let options = format!(
        "lowerdir={},upperdir={},workdir={},index=off,metacopy=off,redirect_dir=follow",
        lowerdir.join(":"),
        upper_dir.display(),
        work.display()
    );
    nix::mount::mount(
        Some("overlay"),
        &root,
        Some("overlay"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| OciError::io("mounting the writable root (overlayfs)", e.into()))?;
    Ok(root)
}

/// The map of the layers' ids onto the container's host range from `base`: `n` is `n` (1
/// to 65535, but the sandbox's user's own id, which is nobody); an image's 0 is the
/// sandbox's user (a root process of the image runs as it), a node directory's 0 is the
/// sandbox's root, never the workload's user.
pub fn id_map(base: u32, owners: Owners) -> String {
    let u = SANDBOX_UID;
    let top = cordon_host::idpool::RANGE;
    let root = match owners {
        Owners::Image => base + u,
        Owners::Node => base,
    };
    let root = format!("0 {root} 1\n");
    format!(
        "{root}1 {} {}\n{} {} {}\n",
        base + 1,
        u - 1,
        u + 1,
        base + u + 1,
        top - u - 1
    )
}

/// The upper layer on an ext4 file system of `size` bytes at `at`: its image is made under
/// [`UPPERS`], loop-mounted and unlinked at once, so that only the mount holds it (and the
/// loop device clears itself when the monitor's namespace goes).
fn disk(at: &Path, id: &str, size: u64) -> Result<()> {
    std::fs::create_dir_all(UPPERS).map_err(|e| OciError::io("making the uppers' directory", e))?;
    let image = Path::new(UPPERS).join(format!("{id}.img"));
    // A file a killed monitor left between its making and its unlinking.
    let _ = std::fs::remove_file(&image);
    let made = cordon_host::volume::make_ext4(&image, size & !4095, 0, "cordon-oci-upper")
        .and_then(|()| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&image)?;
            cordon_host::volume::LoopMount::attach(&file, &image, at, false)
        });
    let _ = std::fs::remove_file(&image);
    // Said by kind only: mkfs's own words name the image's path on the node.
    let mount = made.map_err(|e| OciError::Refused {
        what: format!(
            "its writable root's disk could not be made ({})",
            e.kind()
        ),
        fix: "the node needs mkfs.ext4 (e2fsprogs), a free loop device and room under               /var/lib/cordon/oci; or run it with a read-only root (--read-only)"
            .into(),
    })?;
    // Held for the monitor's life: its namespace's end unmounts it.
    std::mem::forget(mount);
    Ok(())
}

/// What a killed monitor of container `id` may have left on the host: the upper layer's
/// image, if it died between making and unlinking it.
pub fn sweep(id: &str) {
    let _ = std::fs::remove_file(Path::new(UPPERS).join(format!("{id}.img")));
}

/// The image's layers, top first: those of the engine's overlay when the bundle's root is
/// an overlay mount (its upper layer, the container's, then its lower layers), else the
/// root directory itself.
fn layers(rootfs: &Path) -> Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| OciError::io("reading the mount table", e))?;
    let mut options = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        if Path::new(&unescape(point)) != rootfs {
            continue;
        }
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("");
        let _source = r.next();
        options = (fstype == "overlay").then(|| r.next().unwrap_or("").to_string());
    }
    let Some(options) = options else {
        return Ok(vec![rootfs.to_path_buf()]);
    };
    let mut upper = None;
    let mut lower = Vec::new();
    for opt in options.split(',') {
        if let Some(v) = opt.strip_prefix("upperdir=") {
            upper = Some(layer_path(v)?);
        } else if let Some(v) = opt.strip_prefix("lowerdir=") {
            if v.contains("::") {
                return Err(unusable("it has data-only lower layers"));
            }
            for l in v.split(':') {
                lower.push(layer_path(l)?);
            }
        } else if opt.starts_with("lowerdir+=") || opt.starts_with("datadir+=") {
            return Err(unusable("its layers were given by descriptor"));
        }
    }
    if lower.is_empty() {
        return Err(unusable(
            "its lower layers are not named in the mount table",
        ));
    }
    Ok(upper.into_iter().chain(lower).collect())
}

fn layer_path(s: &str) -> Result<PathBuf> {
    let p = PathBuf::from(unescape(s));
    if s.contains('\\') || !p.is_absolute() || !p.is_dir() {
        return Err(unusable(
            "a layer of it is not named by a plain absolute path in the mount table",
        ));
    }
    Ok(p)
}

fn unusable(why: &str) -> OciError {
    OciError::Refused {
        what: format!("its root filesystem (an overlay) cannot be given writable: {why}"),
        fix: "run it with a read-only root (--read-only, readOnlyRootFilesystem: true)".into(),
    }
}

/// A path of the mount table with its octal escapes (`\040`) undone.
pub(crate) use cordon_host::volume::unescape_mountinfo as unescape;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_root_is_the_sandbox_user_and_no_id_is_mapped_twice() {
        let m = id_map(200_000, Owners::Image);
        assert_eq!(m, "0 201000 1\n1 200001 999\n1001 201001 64535\n");
        // A node directory's root is the sandbox's root, not its user.
        assert_eq!(
            id_map(200_000, Owners::Node),
            "0 200000 1\n1 200001 999\n1001 201001 64535\n"
        );
        let total: u32 = m
            .lines()
            .map(|l| l.split(' ').nth(2).unwrap().parse::<u32>().unwrap())
            .sum();
        assert_eq!(total, 65535);
    }

    #[test]
    fn mount_table_escapes_are_undone() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
