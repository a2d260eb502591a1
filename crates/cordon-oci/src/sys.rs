//! The few raw operations of `cordon-oci` that `nix` leaves unsafe. Every unsafe block of
//! this crate lives here.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Takes ownership of descriptors that arrived with a message (`SCM_RIGHTS`).
pub fn received(fds: Vec<RawFd>) -> Vec<OwnedFd> {
    fds.into_iter()
        .filter(|fd| *fd >= 0)
        // SAFETY: the kernel installed each descriptor in this process as the message was
        // received; nothing else in the process knows its number, so it is owned here alone.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}

/// Takes ownership of the descriptor `accept` just returned.
pub fn accepted(fd: RawFd) -> OwnedFd {
    // SAFETY: accept4 returned this descriptor to this thread a moment ago; nothing else in
    // the process knows its number.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Takes ownership of a descriptor this process inherited and was told the number of (the
/// readiness pipe of `create`), after checking it is open.
pub fn inherited(fd: RawFd) -> std::io::Result<OwnedFd> {
    // Close-on-exec at once: the sandbox's init (spawned later) must not hold the pipe, or
    // its reader never sees the end.
    nix::fcntl::fcntl(
        // SAFETY: a borrow for the duration of the F_SETFD call only; fcntl on a closed
        // number fails with EBADF, which is returned.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    // SAFETY: the descriptor is open (checked above) and was passed to this process for it
    // alone by its parent; no other owner exists in this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ends this process the way its workload ended: by `signal`, its default action restored
/// first, so the caller's `waitpid` sees the same signal; a signal that does not kill by
/// default (or is caught despite all) ends it with 128 + the signal.
pub fn die_by(signal: i32) -> ! {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
    if let Ok(sig) = Signal::try_from(signal) {
        // SAFETY: restoring the default disposition installs no handler of ours.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
        let mut set = SigSet::empty();
        set.add(sig);
        let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
        let _ = nix::sys::signal::raise(sig);
    }
    std::process::exit(128 + signal)
}

/// Closes every descriptor this process inherited above stderr but those in `keep`: what
/// the caller (an engine, a shell, `--preserve-fds`) left open must not reach the sandbox,
/// whose helpers (its init, runsc, QEMU) inherit what the monitor holds. Call first, before
/// this process opens anything of its own.
pub fn close_inherited(keep: &[RawFd]) -> std::io::Result<()> {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor (in the list) is closed by now.
    for fd in open {
        if fd <= 2 || keep.contains(&fd) {
            continue;
        }
        // SAFETY: nothing in this process owns a descriptor it inherited and was not told
        // about (`keep` are the ones it was told about): this runs before any `OwnedFd` or
        // `File` of the process exists beyond those, so no owner sees its number closed
        // under it. A number already closed (the listing's own) fails with EBADF, ignored.
        unsafe {
            libc::close(fd);
        }
    }
    Ok(())
}
