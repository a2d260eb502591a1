//! Raw calls of the host side. No unsafe code: everything here goes through `nix`.

/// Sends SIGKILL to a pid; errors (already gone) are ignored.
pub fn kill_pid(pid: i32) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
