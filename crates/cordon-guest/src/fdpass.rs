//! Descriptors passed over Unix sockets (`SCM_RIGHTS`): the agent's channel, a reaper's
//! job socket and the port relay's all receive them with [`recv_with_fds`].

use std::io::IoSliceMut;
use std::os::fd::{OwnedFd, RawFd};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

use crate::sys;

/// One recvmsg(2) on `fd` into `buf`: the bytes read and the descriptors passed along
/// (up to eight), owned.
pub fn recv_with_fds(
    fd: RawFd,
    buf: &mut [u8],
    flags: MsgFlags,
) -> nix::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), flags)?;
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // The kernel installed these descriptors for us (SCM_RIGHTS).
                fds.extend(raw.into_iter().map(sys::own_fd));
            }
        }
    }
    Ok((msg.bytes, fds))
}
