//! The crate's one unsafe operation: code run in the forked child before `runsc` is
//! executed.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the kernel SIGKILL `runsc` when the thread that started it dies, so a killed Cordon
/// does not leave a sandbox running (runsc's sandbox in turn dies with runsc; what is left on
/// disk is reaped by the next backend).
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; prctl(PR_SET_PDEATHSIG) is a plain system call
    // that allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}
