//! The raw system calls of the microvm tier's host side. Every unsafe block of this crate
//! lives here.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

/// How QEMU is confined before it runs (set up between fork and exec).
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the owner group of `/dev/kvm` on the KVM path), else none.
    pub groups: Vec<u32>,
    /// `cgroup.procs` files to join, as C strings prepared before the fork.
    pub cgroup_procs: Vec<CString>,
    /// A descriptor QEMU inherits (`from`, opened by Cordon) under a fixed number (`to`):
    /// the snapshot a restore reads.
    pub incoming: Option<(RawFd, RawFd)>,
    /// The root disk QEMU reads (`from`, opened read-only by Cordon, numbered above `to`
    /// and the snapshot's number) under a fixed number (`to`): QEMU never opens the disk's
    /// path, so the disk may be root's alone (mode 0600).
    pub root_disk: Option<(RawFd, RawFd)>,
    /// The private root QEMU is moved into.
    pub jail: Jail,
    /// Cordon's system call allow-list, installed last before exec.
    pub seccomp: seccompiler::BpfProgram,
}

/// A private root made of a small tmpfs and read-only bind mounts, every path prepared
/// before the fork (nothing is allocated between fork and exec).
pub struct Jail {
    /// An empty host directory the tmpfs is mounted on (in QEMU's own mount namespace).
    pub root: CString,
    /// Directories to make in the tmpfs (absolute host paths under `root`), in order.
    pub dirs: Vec<CString>,
    /// Empty files to make as mount points for file binds.
    pub files: Vec<CString>,
    /// Links `(target, path)` to make.
    pub links: Vec<(CString, CString)>,
    /// Bind mounts `(source, destination, writable, devices)`.
    pub binds: Vec<(CString, CString, bool, bool)>,
    /// Bound files `(destination, device, inode)` that must be those inodes once bound.
    pub expect: Vec<(CString, u64, u64)>,
    /// `root/.old`, where the host's root goes before it is detached.
    pub old: CString,
    /// Where QEMU starts, inside the new root.
    pub workdir: CString,
}

/// `file` opened again (a new descriptor of the same open file) numbered `min` or above,
/// close-on-exec: a descriptor a child's fixed numbers below `min` cannot land on.
pub fn dup_at_least(file: &std::fs::File, min: RawFd) -> io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor `file` owns returns a new descriptor or
    // -1; it touches no memory.
    let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// A file in memory (`memfd`), for logs QEMU writes and Cordon reads: no path exists that
/// QEMU could replace. Its pages are charged to the cgroup of whoever writes them.
pub fn memory_file(name: &CStr) -> io::Result<std::fs::File> {
    // SAFETY: memfd_create reads a NUL-terminated name and returns a new descriptor or -1;
    // the descriptor is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Makes `cmd` start QEMU confined: in its cgroup; in new mount, network, IPC, UTS and PID
/// namespaces (no network device exists and no host network is reachable; it is PID 1 of
/// its own namespace and sees no other process); moved into its private root (its own
/// directory, its image files, the read-only system libraries, nothing else of the host);
/// as its own unprivileged uid with no supplementary groups, no way to gain privileges,
/// killed if Cordon dies; and filtered by Cordon's system call allow-list. The binary it
/// runs is an execute-only copy (`Jail` binds it), which its uid cannot read: the kernel
/// then makes the process non-dumpable at exec (no `/proc/<pid>/mem`, no ptrace, even by
/// its own uid) without the credential change that would also clear its parent-death
/// signal.
///
/// PID 1 of a new namespace must be a child of the process that made it, so the forked
/// child stays outside as a small waiter (closing every descriptor it inherited) and
/// mirrors QEMU's end: its exit code, or the signal that killed QEMU. Killing the waiter
/// kills QEMU (its parent-death signal).
pub fn confine(cmd: &mut Command, c: Confinement) {
    let hook = move || -> io::Result<()> {
        for path in &c.cgroup_procs {
            let fd = nix::fcntl::open(
                path.as_c_str(),
                nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            nix::unistd::write(&fd, b"0")?;
        }
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        nix::sched::unshare(
            CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWNET
                | CloneFlags::CLONE_NEWIPC
                | CloneFlags::CLONE_NEWUTS
                | CloneFlags::CLONE_NEWPID,
        )?;
        cordon_guest::sys::make_mounts_private()?;
        enter_jail(&c.jail)?;
        become_pid_one()?;
        set_groups(&c.groups)?;
        let gid = nix::unistd::Gid::from_raw(c.gid);
        let uid = nix::unistd::Uid::from_raw(c.uid);
        nix::unistd::setresgid(gid, gid, gid)?;
        nix::unistd::setresuid(uid, uid, uid)?;
        // After the credential change, which clears it.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        nix::sys::prctl::set_no_new_privs()?;
        // The snapshot's first: the disk's descriptor is numbered above both targets, so
        // neither move can close it.
        if let Some((from, to)) = c.incoming {
            inherit_fd(from, to)?;
        }
        if let Some((from, to)) = c.root_disk {
            inherit_fd(from, to)?;
        }
        if seccompiler::apply_filter(&c.seccomp).is_err() {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only makes system calls on
    // data prepared before the fork (C strings, integers, the compiled filter): open/write,
    // prctl, unshare, mount, mkdir, symlink, pivot_root, umount2, chdir, fork, waitpid,
    // kill, setgroups/setresgid/setresuid, dup2/fcntl, seccomp. It takes no locks; the
    // only memory touched is the stack.
    unsafe {
        cmd.pre_exec(hook);
    }
}

fn set_groups(groups: &[u32]) -> io::Result<()> {
    let list: [libc::gid_t; 1];
    let (ptr, n) = match groups.first() {
        Some(g) => {
            list = [*g];
            (list.as_ptr(), 1)
        }
        None => (std::ptr::null(), 0),
    };
    // SAFETY: setgroups reads `n` gids from `ptr` (a live local array, or none).
    if unsafe { libc::setgroups(n, ptr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Builds the private root on a tmpfs and moves into it.
fn enter_jail(j: &Jail) -> io::Result<()> {
    mount(
        Some(c"cordon-vm"),
        j.root.as_c_str(),
        Some(c"tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(c"size=1m,nr_inodes=256,mode=0755"),
    )?;
    for d in &j.dirs {
        nix::unistd::mkdir(d.as_c_str(), Mode::from_bits_truncate(0o755))?;
    }
    for f in &j.files {
        drop(nix::fcntl::open(
            f.as_c_str(),
            nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )?);
    }
    for (target, path) in &j.links {
        // SAFETY: symlink reads two NUL-terminated strings prepared before the fork.
        if unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for (src, dst, writable, devices) in &j.binds {
        mount(
            Some(src.as_c_str()),
            dst.as_c_str(),
            None::<&CStr>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&CStr>,
        )?;
        let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID;
        if !writable {
            flags |= MsFlags::MS_RDONLY;
        }
        if !devices {
            flags |= MsFlags::MS_NODEV;
        }
        mount(
            None::<&CStr>,
            dst.as_c_str(),
            None::<&CStr>,
            flags,
            None::<&CStr>,
        )?;
    }
    for (path, dev, ino) in &j.expect {
        let st = nix::sys::stat::stat(path.as_c_str())?;
        if st.st_dev != *dev || st.st_ino != *ino {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
    }
    nix::unistd::chdir(j.root.as_c_str())?;
    nix::unistd::pivot_root(c".", j.old.as_c_str())?;
    nix::unistd::chdir(c"/")?;
    umount2(c"/.old", MntFlags::MNT_DETACH)?;
    // SAFETY: rmdir reads a NUL-terminated literal.
    if unsafe { libc::rmdir(c"/.old".as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // The tmpfs itself becomes read-only: QEMU writes only in its own directory.
    mount(
        None::<&CStr>,
        c"/",
        None::<&CStr>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NOEXEC,
        None::<&CStr>,
    )?;
    nix::unistd::chdir(j.workdir.as_c_str())?;
    Ok(())
}

/// Forks: the child returns (and goes on to exec QEMU as PID 1 of the new namespace); this
/// process stays outside as the waiter and never returns.
fn become_pid_one() -> io::Result<()> {
    // SAFETY: called between fork and exec in a single-threaded child; the waiter branch
    // only makes async-signal-safe calls (signal, close_range, waitpid, kill, _exit).
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(()),
        nix::unistd::ForkResult::Parent { child } => wait_and_mirror(child.as_raw()),
    }
}

fn wait_and_mirror(child: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe calls on integers only, in the waiter process.
    unsafe {
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGABRT,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
        // Nothing of Cordon's stays open in the waiter (other VMs' channels, the spawn
        // pipe that tells Cordon the exec happened).
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        loop {
            let mut status = 0;
            let r = libc::waitpid(child, &mut status, 0);
            if r < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            if libc::WIFEXITED(status) {
                libc::_exit(libc::WEXITSTATUS(status));
            }
            if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                libc::signal(sig, libc::SIG_DFL);
                libc::kill(libc::getpid(), sig);
                libc::_exit(128 + sig);
            }
        }
    }
}

/// Makes `from` available as `to` across exec (after the fork, before exec).
fn inherit_fd(from: RawFd, to: RawFd) -> io::Result<()> {
    if from == to {
        // SAFETY: fcntl on a descriptor number; clearing FD_CLOEXEC touches no memory.
        if unsafe { libc::fcntl(to, libc::F_SETFD, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(());
    }
    // SAFETY: dup2 on descriptor numbers; the new one has FD_CLOEXEC clear. `to` is not one
    // of the standard streams (those are already in place) and nothing else uses it here.
    if unsafe { libc::dup2(from, to) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
