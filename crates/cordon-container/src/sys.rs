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
