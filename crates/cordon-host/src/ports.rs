//! The host's end of [`Request::PortOpen`]: a connection to a port a program serves on the
//! sandbox's own loopback, over a tier whose agent channel carries descriptors. Answers
//! come twice as in [`crate::files`]: the outer `Result` is the channel, the inner one the
//! request.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use cordon_core::Error;
use cordon_guest::proto::{ProtoError, Reply, Request};

use crate::agent::{CallError, HEADER_ROOM};
use crate::files::{Answer, FrameIo};

/// Asks the agent to connect a new stream socket to `port` on the sandbox's loopback, and
/// answers the host's end. Its first byte says whether the connection was made
/// ([`cordon_core::PORT_CONNECTED`]); the caller reads it, off the agent channel.
pub fn open(io: &mut dyn FrameIo, port: u16) -> Answer<UnixStream> {
    let (ours, theirs) = UnixStream::pair()?;
    io.send_with_fds(&Request::PortOpen { port }, b"", &[theirs.as_raw_fd()])?;
    drop(theirs);
    let f = io.recv(HEADER_ROOM)?;
    match f.header {
        Reply::Ok => Ok(Ok(ours)),
        // The guest agent's own words, not an error of this process.
        Reply::Error { message, .. } => Ok(Err(Error::Sandbox(format!(
            "the sandbox cannot relay a connection to port {port}: {message}"
        )))),
        other => Err(CallError::Proto(ProtoError::Malformed(format!(
            "unexpected reply to a port request: {other:?}"
        )))),
    }
}
