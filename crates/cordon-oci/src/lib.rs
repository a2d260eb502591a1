//! `cordon-oci`: an OCI runtime with runc's command line, so containerd, Docker, Podman and
//! (through containerd) Kubernetes run a bundle behind Cordon's container tier instead of
//! runc's walls.
//!
//! A bundle's `config.json` is read with the `oci-spec` types, checked ([`bundle::check`]:
//! privileged mode, host namespaces, host devices and host paths are refused), turned into a
//! Cordon request (its resources, then the `cordon.*` annotations) and admitted by the same
//! gate as `cordon run` and `cordon serve`, under the node's ceiling ([`node::NodeConfig`]).
//! Each container is one Cordon sandbox held by a monitor process ([`monitor`]) that the
//! caller sees as the container's process: its exit status is the workload's. The other
//! commands reach the monitor over a socket in the state directory ([`ctl`]).

pub mod allow;
pub mod audit;
pub mod bundle;
pub mod ctl;
mod error;
pub mod monitor;
pub mod node;
pub mod podnet;
pub mod prepare;
pub mod rootfs;
pub mod state;
mod sys;
pub mod tiers;
pub mod update;

pub use error::{OciError, Result};

/// The readiness pipe a `create` (or a detached `exec`) handed its child by number.
pub fn ready_pipe(fd: i32) -> std::io::Result<std::fs::File> {
    sys::inherited(fd).map(std::fs::File::from)
}

/// Another descriptor a `create` handed the monitor by number (the console socket it
/// connected to), made close-on-exec.
pub fn inherited_fd(fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    sys::inherited(fd)
}

/// Closes every descriptor this process inherited above stderr but `keep` (the ones it
/// was told the numbers of): the caller's other open files never reach the sandbox. Call
/// first thing in the monitor and the exec relay.
pub fn close_inherited(keep: &[i32]) -> std::io::Result<()> {
    sys::close_inherited(keep)
}

/// Ends this process as a workload ended by `signal` (see the monitor).
pub fn die_by(signal: i32) -> ! {
    sys::die_by(signal)
}

/// A container id as runc accepts it: letters, digits, `_`, `-`, `.`, not starting with a
/// dot, at most 1024 bytes. Anything else (a `/`, `..`) would name a path outside the root.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(OciError::Invalid(format!(
            "invalid container id {id:?}: use letters, digits, '_', '-' and '.' (not first)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_name_paths_are_refused() {
        for bad in ["", "../x", "a/b", ".hidden", "..", "a b", "x\0"] {
            assert!(check_id(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["abc", "c4fad014de91", "my_ctr-1.2"] {
            assert!(check_id(good).is_ok(), "{good:?} was refused");
        }
    }
}
