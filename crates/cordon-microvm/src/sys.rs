//! The raw system calls of the microvm tier's host side. Every unsafe block of this crate
//! lives here.

use std::ffi::CString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::CloneFlags;

/// How QEMU is confined before it runs (set up between fork and exec).
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    /// `cgroup.procs` files to join, as C strings prepared before the fork.
    pub cgroup_procs: Vec<CString>,
}

/// Makes `cmd` start QEMU in new mount, network, IPC and UTS namespaces (no network device
/// exists and no host network is reachable), inside its cgroup, as an unprivileged user with
/// no supplementary groups and no way to gain privileges, killed if its parent dies.
pub fn confine(cmd: &mut Command, c: Confinement) {
    let hook = move || -> io::Result<()> {
        for path in &c.cgroup_procs {
            let fd = nix::fcntl::open(
                path.as_c_str(),
                nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )?;
            nix::unistd::write(&fd, b"0")?;
        }
        nix::sched::unshare(
            CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWNET
                | CloneFlags::CLONE_NEWIPC
                | CloneFlags::CLONE_NEWUTS,
        )?;
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
            None::<&str>,
        )?;
        nix::unistd::setgroups(&[])?;
        let gid = nix::unistd::Gid::from_raw(c.gid);
        let uid = nix::unistd::Uid::from_raw(c.uid);
        nix::unistd::setresgid(gid, gid, gid)?;
        nix::unistd::setresuid(uid, uid, uid)?;
        // After the credential change, which clears it.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        nix::sys::prctl::set_no_new_privs()?;
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only makes system calls on
    // data prepared before the fork (C strings, integers): open/write, unshare, mount,
    // setgroups/setresgid/setresuid, prctl. It allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}
