//! Volumes on the host (ADR 0011): each is a sparse file holding an ext4 file system of the
//! volume's size, so its quota is the file system's own size (writing past it is `ENOSPC`
//! inside, as with `--disk`) and one file serves every tier.
//!
//! ```text
//! <root>/                 0700 root
//!   images/<owner hex>/<name>.img    the volume (0600)
//!   mnt/<random>/                    one lease's mount of it, while a sandbox uses it
//! ```
//!
//! A lease is a lock on the image (`flock`: exclusive to write, shared to read) and a loop
//! mount of it: read-write for one sandbox at a time, read-only for many, enforced by the
//! kernel's lock whoever holds it (a server, a `cordon run`), and let go by the kernel when
//! its holder dies. The tiers never see the image: they bind the leased mount into the
//! sandbox with the sandbox's ids mapped onto the file system's canonical ones (an idmapped
//! mount), so no file is ever chowned and no sandbox's host ids are written to disk.
//!
//! Nothing here reads or follows anything inside a volume: its contents are an earlier
//! sandbox's writing and may hold any symlink.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};

/// How long a lock conflict must last before a mount is refused (see [`VolumeStore::mount`]).
const LOCK_SETTLE: Duration = Duration::from_millis(300);

/// Takes a volume image's lock, reporting a conflict only once it has lasted LOCK_SETTLE.
/// A lease just let go can hold its lock a moment longer: the lock belongs to the image's
/// open file, which the loop device references until the kernel drops it from a work queue
/// after the device clears (measured: a few ms under load, past 300 ms never seen).
fn settled(
    try_lock: impl Fn() -> Result<(), std::fs::TryLockError>,
) -> Result<(), std::fs::TryLockError> {
    let mut locked = try_lock();
    let settle = Instant::now() + LOCK_SETTLE;
    while matches!(locked, Err(std::fs::TryLockError::WouldBlock)) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(5));
        locked = try_lock();
    }
    locked
}

/// The uid and gid that own a new volume's root, and that the sandbox's user is inside
/// every native tier: files are stored with these ids whatever host ids the sandbox had.
pub const VOLUME_OWNER: u32 = 1000;

/// The file system's own overhead is not counted: a volume of `size` bytes holds a little
/// less (the journal, inode tables), as a disk of that size does.
const MKFS: &str = "mkfs.ext4";

/// What went wrong with a volume. Messages say what to do and name no host path.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no volume {0:?}; create it first (`cordon volume create` or POST /v1/volumes)")]
    NotFound(String),
    #[error("volume {0:?} exists already; pick another name or delete it first")]
    Exists(String),
    #[error("volume {name:?} is {how}; {fix}")]
    InUse {
        name: String,
        how: &'static str,
        fix: &'static str,
    },
    #[error("invalid volume request: {0}")]
    Invalid(String),
    /// The host could not do it; the detail is logged, not shown.
    #[error("the volume {what} failed on the host ({errno}); retry, or tell the operator")]
    Host { what: &'static str, errno: String },
}

impl VolumeError {
    fn host(what: &'static str, detail: impl std::fmt::Display) -> Self {
        tracing::warn!(%detail, "volume: {what}");
        let errno = detail.to_string();
        // Only the error's kind goes to the caller: the detail may name host paths.
        let errno = errno
            .rsplit_once(": ")
            .map_or(errno.as_str(), |(_, e)| e)
            .to_string();
        VolumeError::Host { what, errno }
    }
}

impl From<VolumeError> for cordon_core::Error {
    fn from(e: VolumeError) -> Self {
        match e {
            VolumeError::Invalid(m) => cordon_core::Error::Invalid(m),
            other => cordon_core::Error::failed("a volume of the sandbox", other),
        }
    }
}

/// One volume as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VolumeFacts {
    pub name: String,
    /// Its quota: the file system's size.
    pub size: u64,
    /// Bytes of the host's disk its file holds now (sparse: grows as it is written).
    pub allocated: u64,
}

/// Where volumes are kept.
#[derive(Debug, Clone)]
pub struct VolumeStore {
    root: PathBuf,
}

impl VolumeStore {
    /// Opens (making them) the store's root-only directories under `root`.
    pub fn open(root: &Path) -> Result<Self, VolumeError> {
        for dir in [root.to_path_buf(), root.join("images"), root.join("mnt")] {
            crate::idpool::private_dir(&dir).map_err(|e| VolumeError::host("store", e))?;
        }
        Ok(VolumeStore {
            root: root.to_path_buf(),
        })
    }

    fn owner_dir(&self, owner: &str) -> PathBuf {
        // Hex: any tenant name is a safe, distinct directory name.
        self.root.join("images").join(hex(owner.as_bytes()))
    }

    fn image(&self, owner: &str, name: &str) -> Result<PathBuf, VolumeError> {
        cordon_core::validate_volume_name(name).map_err(|e| VolumeError::Invalid(e.to_string()))?;
        Ok(self.owner_dir(owner).join(format!("{name}.img")))
    }

    /// Makes a volume of `size` bytes (rounded down to 4 KiB) for `owner`. The file system
    /// is made in a temporary file and renamed into place, so a volume is either whole or
    /// not there.
    pub fn create(&self, owner: &str, name: &str, size: u64) -> Result<VolumeFacts, VolumeError> {
        let path = self.image(owner, name)?;
        let size = size & !4095;
        if size < cordon_core::MIN_VOLUME_BYTES {
            return Err(VolumeError::Invalid(format!(
                "a volume holds at least {} MiB; give a larger size",
                cordon_core::MIN_VOLUME_BYTES >> 20
            )));
        }
        crate::idpool::private_dir(&self.owner_dir(owner))
            .map_err(|e| VolumeError::host("create", e))?;
        if path.exists() {
            return Err(VolumeError::Exists(name.into()));
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let made = (|| -> Result<(), VolumeError> {
            make_ext4(&tmp, size, VOLUME_OWNER, "cordon-volume")
                .map_err(|e| VolumeError::host("create (mkfs.ext4; is e2fsprogs installed?)", e))?;
            // A link, not a rename: it refuses an existing name atomically on every libc
            // (musl builds of this crate have no renameat2); the temporary name goes below.
            std::fs::hard_link(&tmp, &path).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => VolumeError::Exists(name.into()),
                _ => VolumeError::host("create", e),
            })
        })();
        let _ = std::fs::remove_file(&tmp);
        made?;
        self.facts(owner, name)
    }

    /// One volume of `owner`.
    pub fn facts(&self, owner: &str, name: &str) -> Result<VolumeFacts, VolumeError> {
        let path = self.image(owner, name)?;
        let md = std::fs::symlink_metadata(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VolumeError::NotFound(name.into()),
            _ => VolumeError::host("lookup", e),
        })?;
        if !md.file_type().is_file() {
            return Err(VolumeError::NotFound(name.into()));
        }
        Ok(VolumeFacts {
            name: name.into(),
            size: md.len(),
            allocated: md.blocks() * 512,
        })
    }

    /// Every volume of `owner`, by name.
    pub fn list(&self, owner: &str) -> Result<Vec<VolumeFacts>, VolumeError> {
        let dir = match std::fs::read_dir(self.owner_dir(owner)) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(VolumeError::host("list", e)),
        };
        let mut v = Vec::new();
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = name.strip_suffix(".img")
                && let Ok(f) = self.facts(owner, n)
            {
                v.push(f);
            }
        }
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    /// Deletes a volume that no sandbox has mounted (refused while one has).
    pub fn delete(&self, owner: &str, name: &str) -> Result<(), VolumeError> {
        let path = self.image(owner, name)?;
        let f = open_image(&path, name, false)?;
        match settled(|| f.try_lock()) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(VolumeError::InUse {
                    name: name.into(),
                    how: "mounted by a sandbox",
                    fix: "destroy the sandboxes that mount it, then delete it",
                });
            }
            Err(TryLockError::Error(e)) => return Err(VolumeError::host("delete", e)),
        }
        // Unlinked while locked: a lease that opened it meanwhile finds it gone (below).
        std::fs::remove_file(&path).map_err(|e| VolumeError::host("delete", e))
    }

    /// Leases a volume: read-write (no other lease at all) or read-only (no read-write
    /// lease), and mounts it on the host for a tier to bind into a sandbox.
    pub fn mount(
        &self,
        owner: &str,
        name: &str,
        read_only: bool,
    ) -> Result<VolumeLease, VolumeError> {
        let t0 = Instant::now();
        let path = self.image(owner, name)?;
        let file = open_image(&path, name, !read_only)?;
        let try_lock = || {
            if read_only {
                file.try_lock_shared()
            } else {
                file.try_lock()
            }
        };
        match settled(try_lock) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(if read_only {
                    VolumeError::InUse {
                        name: name.into(),
                        how: "mounted read-write by another sandbox",
                        fix: "destroy that sandbox first, or mount the volume when it is done",
                    }
                } else {
                    VolumeError::InUse {
                        name: name.into(),
                        how: "mounted by another sandbox (read-write takes it alone)",
                        fix: "destroy the sandboxes that mount it, or mount it read-only (read_only: true / :ro)",
                    }
                });
            }
            Err(TryLockError::Error(e)) => return Err(VolumeError::host("mount", e)),
        }
        // Deleted between the open and the lock: the name is gone.
        if file.metadata().map(|m| m.nlink()).unwrap_or(0) == 0 {
            return Err(VolumeError::NotFound(name.into()));
        }
        let dir = self.root.join("mnt").join(random_name()?);
        crate::idpool::private_dir(&dir).map_err(|e| VolumeError::host("mount", e))?;
        let mount = LoopMount::attach(&file, &path, &dir, read_only)
            .map_err(|e| VolumeError::host("mount (loop device, ext4)", e))?;
        tracing::debug!(
            us = t0.elapsed().as_micros() as u64,
            name,
            read_only,
            "volume mounted"
        );
        Ok(VolumeLease {
            mount,
            read_only,
            _lock: file,
        })
    }

    /// Unmounts whatever a dead holder left mounted under the store (crash recovery): its
    /// locks went with it. Returns one line per mount removed.
    pub fn sweep(&self) -> Vec<String> {
        let mut done = Vec::new();
        let Ok(dir) = std::fs::read_dir(self.root.join("mnt")) else {
            return done;
        };
        for e in dir.flatten() {
            let p = e.path();
            if nix::mount::umount2(&p, MntFlags::MNT_DETACH).is_ok() {
                done.push(format!("volume mount {}", e.file_name().to_string_lossy()));
            }
            let _ = std::fs::remove_dir(&p);
        }
        done
    }
}

/// Binds a leased volume at `target` on the host with its ids mapped for a sandbox whose
/// user is host id `host_uid` (uid and gid), as the gvisor tier runs its programs: the
/// sandbox's files are stored as [`VOLUME_OWNER`], and the file system's root (0) stays
/// root's. `read_only` makes the bind read-only whatever the lease.
pub fn bind_mapped(
    lease: &Path,
    target: &Path,
    host_uid: u32,
    read_only: bool,
) -> Result<(), VolumeError> {
    let map = IdMap::new(&format!("0 0 1\n{VOLUME_OWNER} {host_uid} 1\n"))
        .map_err(|e| VolumeError::host("mount (a user namespace for its ids)", e))?;
    map.bind(lease, target, read_only)
        .map_err(|e| VolumeError::host("mount (idmapped)", e))
}

/// The id maps of idmapped mounts: a user namespace whose maps (`uid_map` lines, the same
/// for gids: file system id, host id, count) say which host id each file system id is seen
/// as through a mount made with it. Root only.
pub struct IdMap(std::os::fd::OwnedFd);

impl IdMap {
    pub fn new(map: &str) -> std::io::Result<Self> {
        crate::sys::userns_with_maps(map, map).map(IdMap)
    }

    /// Binds the mount at (or the directory tree under) `src` at `target`, an existing
    /// directory, with its owners mapped: never set-id programs or device nodes, read-only
    /// where asked. Submounts of `src` are not taken.
    pub fn bind(&self, src: &Path, target: &Path, read_only: bool) -> std::io::Result<()> {
        let m = cordon_guest::sys::open_tree_clone(src)?;
        let mut set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
        if read_only {
            set |= libc::MOUNT_ATTR_RDONLY;
        }
        cordon_guest::sys::mount_setattr(&m, set, Some(&self.0))?;
        cordon_guest::sys::move_mount_to(&m, target)
    }
}

/// Detaches every mount at or beneath `dir` (deepest first), so a recursive removal of
/// `dir` can never reach into a volume still mounted there; returns how many there were.
pub fn unmount_all_under(dir: &Path) -> usize {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
        .iter()
        .filter(|p| nix::mount::umount2(p.as_path(), MntFlags::MNT_DETACH).is_ok())
        .count()
}

/// A path of the mount table with its octal escapes undone: `/proc/self/mountinfo` writes
/// space, tab, newline and backslash as `\ooo` (three octal digits, nothing else).
pub fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn open_image(path: &Path, name: &str, write: bool) -> Result<File, VolumeError> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VolumeError::NotFound(name.into()),
            _ => VolumeError::host("open", e),
        })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn random_name() -> Result<String, VolumeError> {
    let mut b = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .map_err(|e| VolumeError::host("mount", e))?;
    Ok(hex(&b))
}

/// A volume leased and mounted on the host. Dropped once its sandbox is gone: the mount is
/// taken down and the lock let go only when the loop device is free again, so the next
/// read-write lease never meets a file system still mounted from the same image.
pub struct VolumeLease {
    /// Dropped first: the lock goes only once the file system is unmounted everywhere.
    mount: LoopMount,
    read_only: bool,
    _lock: File,
}

impl std::fmt::Debug for VolumeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeLease")
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl VolumeLease {
    /// The volume's file system on the host (a root-only directory): the source of the
    /// sandbox's idmapped bind.
    pub fn host_dir(&self) -> &Path {
        &self.mount.dir
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

/// An ext4 image loop-mounted at a directory, unmounted when dropped.
pub struct LoopMount {
    dir: PathBuf,
    dev: String,
    image: PathBuf,
}

impl LoopMount {
    /// Mounts the ext4 file system in `file` (the image at `image`) at `dir`, an existing
    /// empty directory: nosuid, nodev, noatime, read-only where asked. The loop device
    /// clears itself once the file system's last mount goes.
    pub fn attach(file: &File, image: &Path, dir: &Path, read_only: bool) -> std::io::Result<Self> {
        let (dev, dev_path) = crate::sys::loop_attach(file, read_only).inspect_err(|_| {
            let _ = std::fs::remove_dir(dir);
        })?;
        let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        let mounted = nix::mount::mount(
            Some(dev_path.as_str()),
            dir,
            Some("ext4"),
            flags,
            Some("errors=remount-ro"),
        );
        // The mount holds the device now; on its unmount the device clears itself.
        drop(dev);
        if let Err(e) = mounted {
            let _ = std::fs::remove_dir(dir);
            return Err(e.into());
        }
        Ok(LoopMount {
            dir: dir.to_path_buf(),
            dev: dev_path,
            image: image.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Makes an ext4 file system of `size` bytes in the new file `path` (0600, sparse: it takes
/// the host's disk only as it is written), its root directory owned by `owner`.
pub fn make_ext4(path: &Path, size: u64, owner: u32, label: &str) -> std::io::Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.set_len(size)?;
    drop(f);
    let out = Command::new(MKFS)
        .env_clear()
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .args(["-q", "-F", "-m", "0", "-L", label, "-E"])
        .arg(format!(
            "root_owner={owner}:{owner},nodiscard,lazy_itable_init=1,lazy_journal_init=1"
        ))
        .arg(path)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A size-limited scratch file system: an ext4 image of a fixed size, loop-mounted, that
/// a writer can fill only up to that size (then `ENOSPC`); its image is removed when dropped.
/// What a template build's steps write into (their working copy of the base).
pub struct ScratchDisk {
    /// Dropped after [`ScratchDisk`]'s own drop has unlinked the image: the loop device
    /// keeps the file until the unmount, and the wait for it to clear knows a deleted one.
    mount: LoopMount,
    image: PathBuf,
}

impl ScratchDisk {
    /// Makes one of `size` bytes in `dir` (an existing private directory): the image at
    /// `dir/disk.img`, mounted at `dir/fs` with its root owned by `owner`.
    pub fn new(dir: &Path, size: u64, owner: u32) -> std::io::Result<Self> {
        let image = dir.join("disk.img");
        let at = dir.join("fs");
        make_ext4(&image, size & !4095, owner, "cordon-scratch")?;
        let made = std::fs::create_dir(&at).and_then(|()| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&image)?;
            LoopMount::attach(&file, &image, &at, false)
        });
        match made {
            Ok(mount) => Ok(ScratchDisk { mount, image }),
            Err(e) => {
                let _ = std::fs::remove_dir(&at);
                let _ = std::fs::remove_file(&image);
                Err(e)
            }
        }
    }

    /// Where it is mounted.
    pub fn dir(&self) -> &Path {
        self.mount.dir()
    }

    /// Whether less than `margin` bytes are left in it (what a failed write ran into).
    pub fn nearly_full(&self, margin: u64) -> bool {
        nix::sys::statvfs::statvfs(self.dir())
            .is_ok_and(|s| s.blocks_available().saturating_mul(s.fragment_size()) < margin)
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        // The mount (a field) goes next: unmounted, its loop device cleared, its directory
        // removed.
        let _ = std::fs::remove_file(&self.image);
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let t0 = Instant::now();
        if let Err(e) = nix::mount::umount2(&self.dir, MntFlags::empty()) {
            tracing::warn!(error = %e, "loop mount: unmount busy; detaching");
            let _ = nix::mount::umount2(&self.dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir(&self.dir);
        // The loop device clears itself once no mount uses the file system: wait for that
        // (a sandbox's namespace that still holds a bind of it keeps it) before the lock
        // goes, so two mounts of one image never live at once.
        let backing = format!(
            "/sys/block/{}/loop/backing_file",
            self.dev.trim_start_matches("/dev/")
        );
        // The device's number may be taken again at once by another lease: it is ours only
        // while it is backed by this image.
        let ours = || {
            std::fs::read_to_string(&backing).is_ok_and(|b| {
                b.trim_end().trim_end_matches(" (deleted)") == self.image.as_os_str()
            })
        };
        let deadline = t0 + Duration::from_secs(10);
        while ours() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if ours() {
            tracing::error!(
                dev = %self.dev,
                "loop mount: its loop device is still in use 10 s after the unmount"
            );
        }
        tracing::debug!(us = t0.elapsed().as_micros() as u64, "loop mount released");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/a\\040b/c\\134d"), "/a b/c\\d");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        // Only three octal digits are an escape; anything else stays as written.
        assert_eq!(unescape_mountinfo("/a\\+12b"), "/a\\+12b");
        assert_eq!(unescape_mountinfo("/a\\777"), "/a\\777");
    }

    /// A removal after `unmount_all_under` never reaches into what was mounted beneath.
    #[test]
    fn nothing_mounted_beneath_survives_for_a_removal_to_cross() {
        if !crate::testing::root_or_skip("unmounting") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (outer, kept) = (dir.path().join("bundle"), dir.path().join("kept"));
        std::fs::create_dir_all(outer.join("volume-0")).unwrap();
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("data"), "keep me").unwrap();
        nix::mount::mount(
            Some(&kept),
            &outer.join("volume-0"),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        assert_eq!(unmount_all_under(&outer), 1);
        std::fs::remove_dir_all(&outer).unwrap();
        assert_eq!(
            std::fs::read_to_string(kept.join("data")).unwrap(),
            "keep me"
        );
    }
}
