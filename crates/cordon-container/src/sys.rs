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

/// Opens a pidfd for `pid` and sends SIGKILL through it, so a pid reused since it was read
/// is never hit. `Ok(Some(pidfd))`: sent, and the pidfd turns readable once the process has
/// exited; `Ok(None)`: the process is already gone; `Err`: this kernel has no pidfds (older
/// than 5.3), so the caller has only the plain pid to go by.
pub fn kill_by_pidfd(pid: i32) -> io::Result<Option<std::os::fd::OwnedFd>> {
    let fd = match cordon_guest::sys::pidfd_open(nix::unistd::Pid::from_raw(pid)) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: pidfd_send_signal takes a descriptor we own, a signal number and a null
    // siginfo (the kernel fills in a default one); it touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if r == 0 {
        return Ok(Some(fd));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        e => Err(e),
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

/// `SECBIT_NO_SETUID_FIXUP`: changing a uid leaves the capability sets alone.
pub const SECBIT_NO_SETUID_FIXUP: u64 = 1 << 2;

/// This thread's securebits (prctl PR_GET_SECUREBITS).
pub fn securebits() -> io::Result<u64> {
    // SAFETY: PR_GET_SECUREBITS takes no pointer; the kernel returns the bits or -1.
    let r = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// Sets this thread's securebits (prctl PR_SET_SECUREBITS; needs CAP_SETPCAP).
pub fn set_securebits(bits: u64) -> io::Result<()> {
    // SAFETY: PR_SET_SECUREBITS takes the bits by value; no memory is read or written.
    let r = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
