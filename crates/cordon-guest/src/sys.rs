//! Raw system calls the agent needs that `nix` does not wrap safely. Every unsafe block in
//! this crate lives here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::unistd::Pid;

/// What a fork-like clone returned.
pub enum Forked {
    Parent(Pid),
    Child,
}

/// Forks into new namespaces (`flags` are CLONE_NEW* bits), like `fork` otherwise.
///
/// Only call this while the process is single-threaded: the child continues on a copy of
/// the caller's stack, as after `fork`.
pub fn fork_into(flags: libc::c_int) -> io::Result<Forked> {
    // SAFETY: a raw clone with a null stack behaves as fork(2): the child gets a copy of the
    // address space and resumes here with return value 0. The agent is single-threaded when
    // it calls this (documented above), so no lock held by another thread is copied locked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as i32))),
    }
}

/// A pollable descriptor for a child process (pidfd_open(2), Linux 5.3+).
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Closes every descriptor from `first` up (close_range(2)).
pub fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; callers own every descriptor >= first
    // (it is used in a freshly forked child just before exec).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drops every capability from the bounding set, so nothing exec'd can regain one.
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) reads only its integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r < 0 {
            let err = io::Error::last_os_error();
            // EINVAL: the kernel knows no capability with this number; we are done.
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(err);
        }
    }
    Ok(())
}

/// Clears the ambient capability set.
pub fn clear_ambient() -> io::Result<()> {
    // SAFETY: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) reads only integers.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the calling process at once, without running destructors or atexit handlers (the
/// right exit for a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Takes ownership of a descriptor number this process holds and nothing else owns: one the
/// kernel just passed through SCM_RIGHTS, or one dup2'd into place by the caller.
pub fn own_fd(raw: RawFd) -> OwnedFd {
    // SAFETY: callers only pass descriptors that are open and have no other owner (see the
    // doc comment); the OwnedFd closes it exactly once.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Duplicates `fd` onto the number `target` (dup2(2)), replacing whatever was there. Used in
/// a freshly forked child to put descriptors in their fixed places before exec.
pub fn dup2_to(fd: &impl std::os::fd::AsRawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 only manipulates the descriptor table. The caller is a forked child that
    // owns every descriptor it holds, so replacing `target` cannot close a descriptor some
    // other live object still uses in a way that matters before exec.
    let r = unsafe { libc::dup2(fd.as_raw_fd(), target) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

nix::ioctl_none!(rnd_reseed_crng, b'R', 0x07);

/// Makes the kernel's random generator reseed now from its input pool (RNDRESEEDCRNG), so
/// bytes just written to `/dev/urandom` take effect at once. Needs CAP_SYS_ADMIN.
pub fn reseed_crng(urandom: &impl std::os::fd::AsRawFd) -> io::Result<()> {
    // SAFETY: RNDRESEEDCRNG takes no argument and only touches kernel state; the descriptor
    // is an open /dev/urandom the caller holds for the duration of the call.
    unsafe { rnd_reseed_crng(urandom.as_raw_fd()) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the result is checked and wrapped.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let sock = own_fd(fd);
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the interface named in `req` and writes its flags into the
    // union of the same struct, which lives on our stack for the duration of the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialised one.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads `req`, which is fully initialised above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the calling process's nice value (inherited by its children); only lowering the
/// priority needs no privilege.
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
