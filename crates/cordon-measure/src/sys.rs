//! This crate's only unsafe code: a hook run in a forked child before it execs a peer runtime
//! for `cordon bench`.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::mount::{MntFlags, umount2};

/// Makes `cmd` run in a private copy of this host's mount namespace with the empty cgroup v2
/// mount at `unified` detached. crun refuses "hybrid" hosts (v1 controllers plus a v2 mount
/// it would have to use); without that mount it sees a plain cgroup v1 host. The host's
/// own mounts are untouched: the change lives only in the child's namespace.
pub fn exec_without_unified_cgroup(cmd: &mut Command, unified: &Path) {
    let target = unified.to_path_buf();
    // SAFETY: the closure runs in the child between fork and exec; it only makes raw
    // syscalls (unshare, mount, umount2) through nix, allocates nothing (the path was
    // cloned before the fork; nix converts it on the stack for short paths) and takes no
    // locks.
    unsafe {
        cmd.pre_exec(move || {
            cordon_guest::sys::own_mount_namespace()?;
            umount2(target.as_path(), MntFlags::MNT_DETACH)?;
            Ok(())
        });
    }
}
