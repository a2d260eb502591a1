//! The host's end of [`Request::PortOpen`]: a connection to a port a program serves on the
//! sandbox's own loopback, over a tier whose agent channel carries descriptors, and of
//! [`Request::PortDial`] over one whose channel does not (the agent connects a socket the
//! host listens on in a directory bound into the sandbox). Answers
//! come twice as in [`crate::files`]: the outer `Result` is the channel, the inner one the
//! request.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

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

/// How long the host waits for the agent's connection once the agent said it made it.
const DIAL_WAIT: Duration = Duration::from_secs(5);

/// [`open`] over a channel that carries no descriptors: listens on a socket of a fresh,
/// unguessable name in `host_dir` (the host side of [`cordon_guest::proto::PORTS_DIR`]),
/// asks the agent to connect it and relay it to `port`, and answers the accepted end. The
/// socket's file is removed before this returns, whatever happens.
///
/// A program of the sandbox that connected the socket before the agent would be handed
/// the caller's connection instead of the port's server; it could as well have served the
/// port itself, so that wins it nothing it did not have. The name is still random, so it
/// must at least watch the directory to try.
pub fn dial(io: &mut dyn FrameIo, port: u16, host_dir: &Path) -> Answer<UnixStream> {
    // Nothing is asked of the agent until the socket listens: a failure here is this
    // call's, never the channel's (the sandbox runs on).
    let (listener, path, name) = match listen(host_dir) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("a port socket in {}: {e}", host_dir.display());
            return Ok(Err(Error::failed(
                "making the host's end of a port connection; try again",
                e,
            )));
        }
    };
    let _remove = RemoveOnDrop(&path);
    io.send(
        &Request::PortDial {
            port,
            socket: name.clone(),
        },
        b"",
    )?;
    let f = io.recv(HEADER_ROOM)?;
    match f.header {
        Reply::Ok => {}
        Reply::Error { message, .. } => {
            return Ok(Err(Error::Sandbox(format!(
                "the sandbox cannot relay a connection to port {port}: {message}"
            ))));
        }
        other => {
            return Err(CallError::Proto(ProtoError::Malformed(format!(
                "unexpected reply to a port request: {other:?}"
            ))));
        }
    }
    // The agent connected before it answered: the connection waits in the backlog.
    Ok(accept_within(&listener, DIAL_WAIT).map_err(|e| match e {
        None => Error::Sandbox(format!(
            "the sandbox's agent said it connected port {port}'s relay, but no connection \
             came within {} s; try again",
            DIAL_WAIT.as_secs()
        )),
        Some(e) => Error::failed("taking a port connection from the sandbox", e),
    }))
}

/// The first connection to `listener` within `wait`; `Err(None)` when none came.
fn accept_within(
    listener: &UnixListener,
    wait: Duration,
) -> Result<UnixStream, Option<std::io::Error>> {
    listener.set_nonblocking(true).map_err(Some)?;
    let deadline = Instant::now() + wait;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).map_err(Some)?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(None);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Some(e)),
        }
    }
}

/// A listening socket of a fresh, unguessable name in `dir`: the listener, a path that
/// names it for its removal, and its name. Bound through the directory's descriptor
/// (`/proc/self/fd/N/name`), so a deep data dir never meets the 108-byte limit of a
/// socket's path.
fn listen(dir: &Path) -> std::io::Result<(UnixListener, std::path::PathBuf, String)> {
    let mut nonce = [0u8; 12];
    getrandom::fill(&mut nonce).map_err(std::io::Error::other)?;
    let name = format!("p-{}.sock", hex::encode(nonce));
    let d = std::fs::File::open(dir)?;
    let short = std::path::PathBuf::from(format!("/proc/self/fd/{}/{name}", d.as_raw_fd()));
    let listener = UnixListener::bind(&short)?;
    Ok((listener, dir.join(&name), name))
}

struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}
