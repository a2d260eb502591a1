//! Raw system calls of the sandbox init that `nix` and the agent's `sys` do not wrap. Every
//! unsafe block of this crate lives here.

use std::io;

/// Brings the loopback interface of the current network namespace up (shared with the
/// microVM guest, which needs it for its egress forwarder).
pub use cordon_guest::sys::loopback_up;

/// Moves this (single-threaded) process into the network namespace at `path`, checked to
/// be one (`setns` with `CLONE_NEWNET` refuses any other kind of file).
pub fn join_netns(path: &std::path::Path) -> io::Result<()> {
    let ns = std::fs::File::open(path)?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

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

/// Sets SIGCHLD's disposition back to the default (a child's exit is reported, and waited
/// for), whatever this process inherited.
pub fn default_sigchld() -> nix::Result<()> {
    // SAFETY: SIG_DFL installs no handler, so no code of this process runs in a signal
    // context; the previous disposition returned is not used.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGCHLD,
            nix::sys::signal::SigHandler::SigDfl,
        )
    }
    .map(|_| ())
}
