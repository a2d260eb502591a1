//! Raw system calls the agent needs that `nix` does not wrap safely. Every unsafe block in
//! this crate lives here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

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

/// A child's end, from wait4(2): its status and the resources it and its waited-for
/// descendants used.
pub struct Reaped {
    pub pid: Pid,
    pub end: End,
    /// User plus system CPU time, in microseconds.
    pub cpu_us: u64,
    /// Largest resident set, in KiB.
    pub max_rss_kb: u64,
}

/// How a reaped child ended. Any signal number is kept, real-time ones included (which
/// `nix`'s `WaitStatus` cannot represent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
    /// Stopped or continued: not an end.
    Other,
}

/// Waits for any child (`__WALL`), with its resource usage: a reaper that serves several
/// execs sums its own exec's children this way, where `getrusage(RUSAGE_CHILDREN)` would
/// count every exec it ever served.
pub fn wait_any() -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes only to the status and rusage it is given, both live locals of
    // the right types.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::__WALL, &mut usage) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = Pid::from_raw(pid);
    let end = if libc::WIFEXITED(status) {
        End::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        End::Signaled(libc::WTERMSIG(status))
    } else {
        End::Other
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Ok(Reaped {
        pid,
        end,
        cpu_us: us(usage.ru_utime) + us(usage.ru_stime),
        max_rss_kb: usage.ru_maxrss as u64,
    })
}

/// Closes every descriptor from `first` up (close_range(2)). The last one is given as
/// `INT_MAX`, the largest descriptor there can be: gVisor refuses a larger bound (EINVAL).
pub fn close_from(first: u32) -> io::Result<()> {
    close_between(first, i32::MAX as u32)
}

/// Closes the descriptors `first` to `last` (close_range(2)).
pub fn close_between(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; callers own every descriptor in the
    // range (it is used in a freshly forked child).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set once this process (or an ancestor it was forked from) has emptied its bounding set.
static BOUNDING_SET_EMPTY: AtomicBool = AtomicBool::new(false);

/// Drops every capability from the bounding set, so nothing exec'd can regain one.
///
/// The set is inherited across `fork` and can never grow back, so after one complete drop
/// the agent's children skip the ~40 calls (each a trap into gVisor's sentry on its ptrace
/// platform). One capability is still read first: a new user namespace would have reset
/// the whole set to full, and then the drop is done again.
pub fn drop_bounding_set() -> io::Result<()> {
    if BOUNDING_SET_EMPTY.load(Ordering::Relaxed) {
        // SAFETY: prctl(PR_CAPBSET_READ, cap) reads only its integer arguments.
        let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, 0 as libc::c_ulong, 0, 0, 0) };
        if held == 0 {
            return Ok(());
        }
    }
    thread_drop_bounding_set()?;
    BOUNDING_SET_EMPTY.store(true, Ordering::Relaxed);
    Ok(())
}

/// Clears the ambient capability set. A kernel that refuses the call with `EINVAL` has no
/// ambient set to clear (Linux before 4.3, gVisor's kernel).
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
    // Unknown: this kernel has no ambient set, so nothing to clear.
    prctl_result(r)?;
    Ok(())
}

/// What a `prctl` call that returned `r` did: `EINVAL` is the kernel saying it knows no such
/// option or capability, every other failure is an error.
enum Prctl {
    Done,
    Unknown,
}

fn prctl_result(r: libc::c_int) -> io::Result<Prctl> {
    if r >= 0 {
        return Ok(Prctl::Done);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINVAL) {
        return Ok(Prctl::Unknown);
    }
    Err(err)
}

/// Ends the calling process at once, without running destructors or atexit handlers (the
/// right exit for a forked child).
/// Makes SIGTERM and SIGWINCH to this process (a PID namespace's init: the exec's reaper)
/// pass on to every other process of its namespace, so a terminate reaches the program's
/// whole tree, and a terminal's resize reaches its programs where the kernel does not
/// signal it (gVisor; SIGWINCH is ignored by default, so only programs that watch for it
/// see it); without a handler the init would ignore both. A process forked from the
/// reaper inherits the handler until it execs; there the signal takes its default action,
/// as if no handler were installed.
pub fn forward_signals_to_namespace() -> io::Result<()> {
    extern "C" fn forward(sig: libc::c_int) {
        // SAFETY: getpid(2), sigaction(2) and kill(2) are async-signal-safe; -1 from a PID
        // namespace's init means every other process of that namespace. The action struct
        // is a zeroed local (SIG_DFL, no flags, empty mask).
        unsafe {
            if libc::getpid() == 1 {
                libc::kill(-1, sig);
            } else {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                libc::kill(libc::getpid(), sig);
            }
        }
    }
    let action = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(forward),
        nix::sys::signal::SaFlags::SA_RESTART,
        nix::sys::signal::SigSet::empty(),
    );
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGWINCH,
    ] {
        // SAFETY: the handler above only calls kill(2), which is async-signal-safe; it
        // touches no Rust state.
        unsafe { nix::sys::signal::sigaction(sig, &action) }.map_err(io::Error::from)?;
    }
    // The relay: a signal queued by the agent carries the number of the one to deliver.
    let relay = libc::sigaction {
        sa_sigaction: relay as *const () as libc::sighandler_t,
        sa_flags: libc::SA_SIGINFO | libc::SA_RESTART,
        // SAFETY: an all-zero sigset_t is a valid (empty) set; it is filled below.
        sa_mask: unsafe { std::mem::zeroed() },
        sa_restorer: None,
    };
    // SAFETY: `relay` only reads the siginfo the kernel passes, loads an atomic and calls
    // getpid(2) and kill(2), all async-signal-safe; the action struct is a local that
    // outlives the call.
    let r = unsafe { libc::sigaction(RELAY_SIGNAL, &relay, std::ptr::null_mut()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restores the default action of every signal an ancestor left ignored (SIGPIPE, by the
/// runtime of the agent itself), in a forked child about to exec. Handlers need no reset:
/// exec resets them.
pub fn default_signal_actions() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction(2) with a null new action only reads the current one into a
        // zeroed local.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            // SAFETY: installing SIG_DFL runs no code of ours.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// The signal the agent sends an exec's reaper to have it deliver another to its program
/// ([`relay_signal`]): the last real-time signal, which neither glibc nor musl uses.
pub const RELAY_SIGNAL: libc::c_int = 64;
/// In a relayed value: deliver to every process of the exec, not the program alone.
const RELAY_ALL: usize = 1 << 8;
/// `si_code` of a signal sent with sigqueue(3).
const SI_QUEUE: libc::c_int = -1;

/// The program's pid in the reaper's namespace, while it runs (0: none yet, or reaped).
static RELAY_TARGET: AtomicI32 = AtomicI32::new(0);

/// The agent's own pid, noted before it forks any reaper (which inherits it): the sender a
/// reaper takes a relayed signal from besides pid 0. A Linux kernel reports a sender
/// outside the receiver's PID namespace as pid 0; gVisor's passes on the pid the sender
/// gave (sigqueue(3) gives its own). Either can be claimed by a sender of rt_sigqueueinfo
/// alike: what keeps the relay the agent's is that no program may signal its reaper (the
/// program runs as another user, without capabilities).
static RELAY_SENDER: AtomicI32 = AtomicI32::new(0);

/// Notes this process (the agent) as the sender of relayed signals; called before the
/// first reaper is forked.
pub fn note_relay_sender() {
    RELAY_SENDER.store(std::process::id() as i32, Ordering::SeqCst);
}

/// Names the reaper's program, the process a relayed signal goes to (0: none).
pub fn set_relay_target(pid: i32) {
    RELAY_TARGET.store(pid, Ordering::SeqCst);
}

unsafe extern "C" {
    // Both glibc and musl export it; the libc crate declares it for other systems only.
    fn sigqueue(pid: libc::pid_t, sig: libc::c_int, value: libc::sigval) -> libc::c_int;
}

/// Has exec reaper `reaper` deliver `signal` to its program (`all`: to every process of
/// its namespace). The reaper is its PID namespace's init, so a signal sent to the program
/// by number from here would need its pid there; the reaper knows it.
///
/// The relay is a queued real-time signal, charged to the reaper's user, which is the
/// program's: a program that fills that user's pending-signal queue (RLIMIT_SIGPENDING) makes
/// the queue refuse it (EAGAIN). Then the signal goes without a queue ([`signal_unqueued`]),
/// so no program can make itself unstoppable (a kubelet's stop comes this way through
/// cordon-oci).
pub fn relay_signal(reaper: Pid, signal: libc::c_int, all: bool) -> io::Result<()> {
    let value = (signal as usize & 0xff) | if all { RELAY_ALL } else { 0 };
    let v = libc::sigval {
        sival_ptr: value as *mut libc::c_void,
    };
    // SAFETY: sigqueue(3) takes its arguments by value and only makes the system call.
    let r = unsafe { sigqueue(reaper.as_raw(), RELAY_SIGNAL, v) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return signal_unqueued(reaper, signal, all);
        }
        return Err(e);
    }
    Ok(())
}

/// Delivers `signal` without a queue, through what a reaper takes from outside by plain
/// kill(2) (which queues nothing for a signal below SIGRTMIN): SIGKILL to the reaper itself
/// (its namespace's init, so every process of the exec dies with it), SIGTERM and SIGWINCH
/// to the reaper, which passes them on to every process of its namespace
/// ([`forward_signals_to_namespace`]). So a stop (TERM, then KILL) always arrives; another
/// signal is refused with the reason, since its number could not be carried.
fn signal_unqueued(reaper: Pid, signal: libc::c_int, all: bool) -> io::Result<()> {
    let _ = all; // every process of the exec gets TERM and WINCH; KILL ends them all
    if ![libc::SIGKILL, libc::SIGTERM, libc::SIGWINCH].contains(&signal) {
        return Err(io::Error::other(format!(
            "the sandbox's programs have filled their queue of pending signals, so signal \
             {signal} cannot be relayed; send TERM or KILL, which still arrive"
        )));
    }
    // SAFETY: kill(2) takes its arguments by value and only makes the system call.
    if unsafe { libc::kill(reaper.as_raw(), signal) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The reaper's handler of [`RELAY_SIGNAL`]: only a value queued from outside its PID
/// namespace (the agent's: the kernel reports such a sender as pid 0, whatever it claims)
/// is acted on; a process forked from the reaper ignores it until it execs.
extern "C" fn relay(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    if info.is_null() {
        return;
    }
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; for SI_QUEUE its
    // pid and value fields are the ones set. getpid(2) and kill(2) are async-signal-safe.
    unsafe {
        let info = &*info;
        let sender = info.si_pid();
        if libc::getpid() != 1
            || info.si_code != SI_QUEUE
            || (sender != 0 && sender != RELAY_SENDER.load(Ordering::SeqCst))
        {
            return;
        }
        let value = info.si_value().sival_ptr as usize;
        let sig = (value & 0xff) as libc::c_int;
        let target = RELAY_TARGET.load(Ordering::SeqCst);
        if value & RELAY_ALL != 0 || target <= 0 {
            libc::kill(-1, sig);
        } else {
            libc::kill(target, sig);
        }
    }
}

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

/// A global allocator for the short-lived static (musl) binaries on every `cordon run`'s
/// path: a fixed arena in `.bss` served by bumping a pointer, in front of the system
/// allocator. musl's allocator hands memory back to the kernel as soon as it is freed, so a
/// short run that allocates and frees small buffers pays an `mmap`, a page fault and a
/// `munmap` again and again; from the arena, each page faults in once. Frees give memory back
/// only when they undo the latest allocation; the rest is kept until the process exits. Once
/// the arena is used up (or for a request larger than an eighth of it), the system allocator
/// serves, so a long-lived process stays bounded by `N` plus what it really uses.
///
/// Every claim is aligned to at least [`MIN_ALIGN`], as `malloc`'s are: crates that lay a C
/// struct into a byte buffer rely on it (nix builds a `cmsghdr` in a `Vec<u8>` for
/// `sendmsg`; byte-aligned, a debug build of the static front stopped on the misaligned
/// write, and a release build wrote it misaligned).
pub struct BumpArena<const N: usize> {
    buf: std::cell::UnsafeCell<[u8; N]>,
    /// End of the claimed part: the next claim starts here (or after, aligned).
    next: std::sync::atomic::AtomicUsize,
    /// End of everything ever handed out: bytes past it are still the zeroes of `.bss`.
    high: std::sync::atomic::AtomicUsize,
}

/// The alignment of every claim from a [`BumpArena`] (`max_align_t` on x86-64).
pub const MIN_ALIGN: usize = 16;

// SAFETY: the arena hands out disjoint ranges of `buf`, claimed by compare-and-swap on
// `next`; no range is given to two owners at once, so sharing it between threads is sound.
unsafe impl<const N: usize> Sync for BumpArena<N> {}

impl<const N: usize> Default for BumpArena<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> BumpArena<N> {
    /// An empty arena (in `.bss` when it is a `static`: no file space, no page until used).
    pub const fn new() -> Self {
        Self {
            buf: std::cell::UnsafeCell::new([0; N]),
            next: std::sync::atomic::AtomicUsize::new(0),
            high: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn base(&self) -> usize {
        self.buf.get() as usize
    }

    /// The offset of `ptr` in the arena, if the arena gave it out.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        (ptr as usize)
            .checked_sub(self.base())
            .filter(|off| *off < N)
    }

    /// Claims a range for `layout`; `None` when it does not fit. Also returns the end of
    /// everything handed out before this claim: the range's bytes past it are still zero.
    fn bump(&self, layout: std::alloc::Layout) -> Option<(*mut u8, usize)> {
        use std::sync::atomic::Ordering;
        if layout.size() == 0 || layout.size() > N / 8 {
            return None;
        }
        let base = self.base();
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let align = layout.align().max(MIN_ALIGN);
            let start = (base + cur).checked_next_multiple_of(align)? - base;
            let end = start.checked_add(layout.size()).filter(|e| *e <= N)?;
            match self
                .next
                .compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    // Done before the range can be given back (after this returns): whoever
                    // claims it later reads this end, or a larger one. Acquire on `next`
                    // above orders this after any earlier holder's own update.
                    let before = self.high.fetch_max(end, Ordering::AcqRel);
                    return Some((self.buf.get().cast::<u8>().wrapping_add(start), before));
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Moves the end of the latest allocation (at `off`, `old` bytes long) to `off + new`;
    /// false if it is not the latest or `new` does not fit.
    fn resize_last(&self, off: usize, old: usize, new: usize) -> bool {
        use std::sync::atomic::Ordering;
        let Some(end) = off.checked_add(new).filter(|e| *e <= N) else {
            return false;
        };
        let moved = self
            .next
            .compare_exchange(off + old, end, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if moved {
            // A range grown in place counts as handed out, as in `bump`.
            self.high.fetch_max(end, Ordering::AcqRel);
        }
        moved
    }
}

// SAFETY: every pointer returned is either a range of `buf` claimed exclusively by `bump`
// (aligned and sized as asked, inside the arena) or comes from `System`; `dealloc` and
// `realloc` tell the two apart by address and send `System`'s back to it unchanged.
unsafe impl<const N: usize> std::alloc::GlobalAlloc for BumpArena<N> {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        match self.bump(layout) {
            Some((p, _)) => p,
            // SAFETY: the caller's contract for `alloc` (non-zero size) is passed on as is.
            None => unsafe { std::alloc::System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        match self.bump(layout) {
            Some((p, fresh_from)) => {
                let off = p as usize - self.base();
                let dirty = fresh_from.saturating_sub(off).min(layout.size());
                // SAFETY: `p` starts a claimed range of `layout.size()` bytes, and
                // `dirty <= layout.size()`.
                unsafe { std::ptr::write_bytes(p, 0, dirty) };
                p
            }
            // SAFETY: as in `alloc`.
            None => unsafe { std::alloc::System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        match self.offset_of(ptr) {
            // Only the latest allocation is given back; the rest waits for the exit.
            Some(off) => {
                self.resize_last(off, layout.size(), 0);
            }
            // SAFETY: not from the arena, so `System` allocated it with this layout.
            None => unsafe { std::alloc::System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let Some(off) = self.offset_of(ptr) else {
            // SAFETY: not from the arena, so `System` allocated it with this layout; the
            // caller's contract for `new_size` is passed on.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        };
        if new_size <= N / 8 && self.resize_last(off, layout.size(), new_size) {
            return ptr;
        }
        if new_size <= layout.size() {
            // Shrinking in place is always valid; the tail stays unused.
            return ptr;
        }
        // SAFETY: `new_size` is non-zero and, by the caller's contract, a valid size for
        // this alignment.
        let new_layout =
            unsafe { std::alloc::Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as in `alloc`.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both ranges are valid for `layout.size()` bytes (the old one by the
            // caller's contract, the new one is larger) and do not overlap (the new one was
            // just claimed).
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
            // SAFETY: `ptr` came from the arena with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

// ---- one confined thread (the host side of the gvisor and wasm file calls) -------------

/// Sets the calling thread's supplementary groups to none and its real, effective and
/// saved ids to `uid` and `gid`. Only this thread: these are the raw system calls, whereas
/// libc's wrappers change every thread of the process. A thread that leaves uid 0 this way
/// loses its effective and permitted capabilities.
pub fn thread_set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups(0, NULL) reads no memory (an empty list); it changes the calling
    // thread's credentials only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            0 as libc::size_t,
            std::ptr::null::<libc::gid_t>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresgid and setresuid take three integer ids and touch no memory.
    let r = unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `struct __user_cap_header_struct` of capget(2)/capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`; version 3 passes two (capabilities 0-31 and 32-63).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties the calling thread's bounding set, so no `exec` could regain a capability
/// (needs CAP_SETPCAP). Only this thread; unlike [`drop_bounding_set`], nothing is noted
/// for the process.
pub fn thread_drop_bounding_set() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) reads only its integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        // Unknown: the kernel knows no capability with this number; we are done.
        if let Prctl::Unknown = prctl_result(r)? {
            return Ok(());
        }
    }
    Ok(())
}

/// Empties the calling thread's effective, permitted, inheritable and ambient capability
/// sets. Only this thread.
pub fn thread_clear_capabilities() -> io::Result<()> {
    clear_ambient()?;
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads the header and two data structs of the kernel's layout (version
    // 3), all of which outlive the call; pid 0 is the calling thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's effective and permitted capability sets, as bit masks.
pub fn thread_capabilities() -> io::Result<(u64, u64)> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget reads the header and writes two data structs of the kernel's layout
    // (version 3), all owned here and outliving the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let wide = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        wide(data[0].effective, data[1].effective),
        wide(data[0].permitted, data[1].permitted),
    ))
}

// ---- mount namespaces -----------------------------------------------------------------

/// Makes every mount of the caller's mount namespace private (`/` recursively), so that
/// what it mounts from now on never propagates back to the namespace it was copied from.
/// Allocates nothing: safe to call between fork and exec.
pub fn make_mounts_private() -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
}

/// Moves the calling thread into a copy of its mount namespace whose mounts are all private
/// (see [`make_mounts_private`]): what it mounts from now on stays in the copy.
pub fn own_mount_namespace() -> nix::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    make_mounts_private()
}

/// Binds `src` on `dst` with every mount beneath it (`MS_BIND | MS_REC`).
pub fn bind_recursive(src: &std::path::Path, dst: &std::path::Path) -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some(src),
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
}

// ---- detached and idmapped mounts (volumes) ---------------------------------------------

/// A detached copy of the mount at `path` (open_tree(2) with OPEN_TREE_CLONE, not
/// recursive): attached nowhere until [`move_mount_to`], gone with its last descriptor.
pub fn open_tree_clone(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_tree reads a NUL-terminated path that outlives the call and returns a
    // new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sets a detached mount's attributes (mount_setattr(2)): `MOUNT_ATTR_*` bits in `set`,
/// and, with `idmap`, the user namespace whose id maps translate its files' owners (an
/// idmapped mount: ids are stored as the namespace's inside ids).
pub fn mount_setattr(
    mount: &impl AsRawFd,
    set: u64,
    idmap: Option<&impl AsRawFd>,
) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set | idmap.map_or(0, |_| libc::MOUNT_ATTR_IDMAP),
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: idmap.map_or(0, |u| u.as_raw_fd() as u64),
    };
    let empty = c"";
    // SAFETY: mount_setattr reads `attr` (the kernel's `struct mount_attr`, passed with its
    // size) and an empty path; both outlive the call. No memory is written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches a detached mount (from [`open_tree_clone`]) at `target` (move_mount(2)).
pub fn move_mount_to(mount: &impl AsRawFd, target: &std::path::Path) -> io::Result<()> {
    let c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let empty = c"";
    // SAFETY: move_mount reads two NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;

nix::ioctl_write_ptr_bad!(tiocswinsz, libc::TIOCSWINSZ, libc::winsize);
nix::ioctl_write_int_bad!(tiocsctty, libc::TIOCSCTTY);

fn winsize(size: cordon_core::PtySize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A new pseudo-terminal of `size` from the devpts instance behind this mount namespace's
/// `/dev/ptmx`: (master, slave), both close-on-exec. The slave is opened without becoming
/// the caller's controlling terminal (`O_NOCTTY`).
pub fn open_pty(size: cordon_core::PtySize) -> io::Result<(OwnedFd, OwnedFd)> {
    let pty = nix::pty::openpty(Some(&winsize(size)), None)?;
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }
    Ok((pty.master, pty.slave))
}

/// Sets a terminal's window size (TIOCSWINSZ); on a master, the slave's foreground process
/// group gets `SIGWINCH`.
pub fn set_window_size(fd: &impl AsRawFd, size: cordon_core::PtySize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points at a
    // live, initialised local for the duration of the call; a descriptor that is not a
    // terminal fails with ENOTTY.
    unsafe { tiocswinsz(fd.as_raw_fd(), &ws) }?;
    Ok(())
}

/// Makes the terminal on `fd` the controlling terminal of the calling session leader
/// (TIOCSCTTY with 0: never stolen from another session).
pub fn take_controlling_terminal(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument and touches no memory of ours.
    unsafe { tiocsctty(fd, 0) }?;
    Ok(())
}

/// A TCP listener on `addr` made without `SO_REUSEADDR` or `SO_REUSEPORT` (std's
/// `TcpListener::bind` sets `SO_REUSEADDR`): no later socket may bind that address and port,
/// or a wildcard over it, whatever options it sets; gVisor's netstack lets a second
/// `SO_REUSEADDR` socket bind a wildcard beside a listening one. An IPv6 one is `V6ONLY`.
pub fn exclusive_listener(addr: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    let family = match addr {
        std::net::SocketAddr::V4(_) => libc::AF_INET,
        std::net::SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: socket(2) with constant arguments; the result is checked and wrapped.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let sock = own_fd(fd);
    let r = match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: bind(2) reads a sockaddr_in of the given size from our stack.
            unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    std::ptr::from_ref(&sin).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        std::net::SocketAddr::V6(a) => {
            let on: libc::c_int = 1;
            // SAFETY: setsockopt(2) reads one c_int from our stack.
            let r = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IPV6,
                    libc::IPV6_V6ONLY,
                    std::ptr::from_ref(&on).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: bind(2) reads a sockaddr_in6 of the given size from our stack.
            unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    std::ptr::from_ref(&sin6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on a socket we own; no memory is passed.
    if unsafe { libc::listen(sock.as_raw_fd(), 128) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::net::TcpListener::from(sock))
}
