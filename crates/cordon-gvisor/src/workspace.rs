//! The sandbox's `/work`: a size-limited tmpfs mounted on the host in the bundle, owned by
//! the sandbox user and closed to every other host user (0700), and bound into the sandbox
//! by runsc. Filling it is `ENOSPC` inside and
//! the disk-limit reason outside; it vanishes with the sandbox.

use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

use crate::GvisorError;

/// Mounts a tmpfs of `bytes` on `dir`, owned by `uid` and open to it alone.
pub fn mount(dir: &Path, bytes: u64, uid: u32) -> Result<(), GvisorError> {
    let opts = format!("size={bytes},mode=0700,uid={uid},gid={uid}");
    nix::mount::mount(
        Some("cordon-work"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| {
        GvisorError::Workspace(format!(
            "mounting a {bytes}-byte tmpfs on {}: {e}",
            dir.display()
        ))
    })
}

/// Detaches the workspace mount, if there is one.
pub fn unmount(dir: &Path) {
    let _ = nix::mount::umount2(dir, MntFlags::MNT_DETACH);
}

/// True when the workspace has (almost) no room left.
pub fn full(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size() <= 64 * 1024)
        .unwrap_or(false)
}

/// True when a volume (ext4) has refused or is about to refuse a write: ext4 keeps a
/// reserve of a few percent for metadata and allocations in flight, so it counts as full
/// below 4% free.
pub fn volume_full(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks() > 0 && s.blocks_available().saturating_mul(25) < s.blocks())
        .unwrap_or(false)
}
