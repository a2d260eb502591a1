//! Raw system calls of the container tier that `nix` and the agent's `sys` do not wrap. Every
//! unsafe block of this crate lives here.

use std::io;

/// Sends SIGKILL to a pid; errors (already gone) are ignored.
pub fn kill_pid(pid: i32) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Brings the loopback interface of the current network namespace up (shared with the
/// microVM guest, which needs it for its egress forwarder).
pub use cordon_guest::sys::loopback_up;

/// The kernel's Landlock ABI version (landlock_create_ruleset with the VERSION flag).
pub fn landlock_abi() -> Result<i32, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the kernel only
    // returns an integer; no memory is read or written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel was built without Landlock".to_string(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is built in but disabled (add landlock to the lsm= boot parameter)"
                    .to_string()
            }
            _ => format!("Landlock query failed: {e}"),
        });
    }
    Ok(r as i32)
}
