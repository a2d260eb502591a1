//! Raw calls of the host side: through `nix` where it wraps them; the loop-device ioctls
//! (volumes), which it does not, are the one unsafe code of this crate.

/// Sends SIGKILL to a pid; errors (already gone) are ignored.
pub fn kill_pid(pid: i32) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

// ---- loop devices (volumes) ------------------------------------------------------------

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>` (Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `backing` to a free loop device in one call (LOOP_CONFIGURE), auto-cleared on
/// its last close (so it goes with the file system mounted from it), read-only if asked.
/// Returns the device, open, and its path.
pub fn loop_attach(
    backing: &std::fs::File,
    read_only: bool,
) -> std::io::Result<(std::fs::File, String)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = std::io::Error::from_raw_os_error(libc::EBUSY);
    // Another process may take the free device between the two calls: try again.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = format!("/dev/loop{n}");
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        let mut info = LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: LO_FLAGS_AUTOCLEAR | if read_only { LO_FLAGS_READ_ONLY } else { 0 },
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        };
        let name = b"cordon-volume";
        info.lo_file_name[..name.len()].copy_from_slice(name);
        let cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info,
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `cfg` is (repr(C),
        // the kernel's layout) and outlives the call; the descriptors are open.
        let r = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &cfg as *const LoopConfig,
            )
        };
        if r == 0 {
            return Ok((dev, path));
        }
        last = std::io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

/// A user namespace with the given id maps (`/proc/PID/uid_map` lines), as a descriptor
/// for an idmapped mount: a child is cloned into a new user namespace, its maps written,
/// the namespace opened, and the child let go. Root only (maps of other ids).
pub fn userns_with_maps(uid_map: &str, gid_map: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    let (r, w) = nix::unistd::pipe()?;
    let (r_raw, w_raw) = (r.as_raw_fd(), w.as_raw_fd());
    // SAFETY: a clone without CLONE_VM is a fork into a new user namespace. This process
    // may have other threads, so the child calls nothing but close(2), read(2) and
    // _exit(2) (all async-signal-safe) on descriptors it inherited; it touches no lock
    // and no allocation of the parent.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    if pid == 0 {
        let mut b = 0u8;
        // SAFETY: see above; the child waits for the parent to close the pipe, then exits.
        // It first closes every descriptor but its end of the pipe (close_range(2) is a
        // plain syscall): a copy of another thread's descriptor held here would keep that
        // descriptor's flock, a volume lease the other thread has just let go.
        unsafe {
            let keep = r_raw as libc::c_uint;
            if keep > 3 {
                libc::syscall(
                    libc::SYS_close_range,
                    3 as libc::c_uint,
                    keep - 1,
                    0 as libc::c_uint,
                );
            }
            libc::syscall(
                libc::SYS_close_range,
                keep + 1,
                libc::c_uint::MAX,
                0 as libc::c_uint,
            );
            libc::close(w_raw);
            libc::read(r_raw, (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(r);
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let made = std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)
        .and_then(|()| std::fs::write(format!("/proc/{pid}/gid_map"), gid_map))
        .and_then(|()| std::fs::File::open(format!("/proc/{pid}/ns/user")));
    drop(w);
    let _ = nix::sys::wait::waitpid(pid, None);
    Ok(made?.into())
}
