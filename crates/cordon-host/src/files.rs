//! The host's end of the agent's file calls beyond one file in and out: a
//! [`FileOp`](cordon_core::FileOp), and directories moved as tar streams in frames of at
//! most [`ARCHIVE_CHUNK`] bytes, so neither side ever holds a whole archive. Every tier
//! that drives an agent (container over its socket, microvm over virtio-serial) passes its
//! channel as a [`FrameIo`].
//!
//! Each call answers twice: the outer `Result` is the channel (a failure there leaves the
//! sandbox unusable, and the tier tears it down), the inner one the request (refused by the
//! agent, or the client's stream broke; the channel is fine and the sandbox lives on).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use cordon_core::{ArchiveReport, Error, FileOp, FileReply, SandboxSpec, WatchOp, WatchReply};
use cordon_guest::proto::{ARCHIVE_CHUNK, ErrorCode, Frame, Reply, Request};

use crate::agent::{AgentConn, CallError, HEADER_ROOM, file_error};

/// One tier's agent channel, each send and receive bounded by the tier's own deadline.
pub trait FrameIo {
    fn send(&mut self, req: &Request, body: &[u8]) -> Result<(), CallError>;
    /// Sends one frame with descriptors attached (`SCM_RIGHTS`); a channel that cannot
    /// carry descriptors refuses.
    fn send_with_fds(
        &mut self,
        req: &Request,
        body: &[u8],
        fds: &[std::os::fd::RawFd],
    ) -> Result<(), CallError> {
        let _ = (req, body, fds);
        Err(CallError::Io(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this agent channel cannot carry descriptors",
        )))
    }
    /// The next frame, refused from its length when longer than `max_frame`.
    fn recv(&mut self, max_frame: usize) -> Result<Frame<Reply>, CallError>;
}

/// An [`AgentConn`] as a [`FrameIo`]: each frame sent or received within `timeout`.
pub struct ConnIo<'a> {
    pub conn: &'a mut AgentConn,
    pub timeout: Duration,
}

impl FrameIo for ConnIo<'_> {
    fn send(&mut self, req: &Request, body: &[u8]) -> Result<(), CallError> {
        self.conn.send(req, body, Instant::now() + self.timeout)
    }

    fn send_with_fds(
        &mut self,
        req: &Request,
        body: &[u8],
        fds: &[std::os::fd::RawFd],
    ) -> Result<(), CallError> {
        self.conn
            .send_with_fds(req, body, fds, Instant::now() + self.timeout)
    }

    fn recv(&mut self, max_frame: usize) -> Result<Frame<Reply>, CallError> {
        self.conn.recv(Instant::now() + self.timeout, max_frame)
    }
}

/// A request's own outcome, inside the channel's.
pub type Answer<T> = Result<Result<T, Error>, CallError>;

/// The largest reply a listing or an archive report may come in (entries of up to 255-byte
/// names, at most `MAX_LIST_ENTRIES` of them).
const MAX_REPLY: usize = 8 << 20;

fn unexpected(what: &str, other: &Reply) -> CallError {
    CallError::Proto(cordon_guest::proto::ProtoError::Malformed(format!(
        "unexpected reply to {what}: {other:?}"
    )))
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, CallError> {
    serde_json::from_slice(body).map_err(|e| {
        CallError::Proto(cordon_guest::proto::ProtoError::Malformed(format!(
            "a malformed answer to {what}: {e}"
        )))
    })
}

/// Runs one file operation.
pub fn file_op(io: &mut dyn FrameIo, op: &FileOp) -> Answer<FileReply> {
    io.send(&Request::FileOp { op: op.clone() }, b"")?;
    let f = io.recv(MAX_REPLY + HEADER_ROOM)?;
    match f.header {
        Reply::Files => Ok(Ok(decode(op.name(), &f.body)?)),
        Reply::Error { code, message } => Ok(Err(file_error(op.path(), code, message))),
        other => Err(unexpected(op.name(), &other)),
    }
}

/// Writes one file (the gvisor tier's calls outside the workspace, ADR 0031; the other
/// tiers send [`Request::PutFile`] on their own channel).
pub fn put_file(io: &mut dyn FrameIo, path: &str, mode: u32, data: &[u8]) -> Answer<()> {
    let req = Request::PutFile {
        path: path.to_string(),
        mode,
    };
    io.send(&req, data)?;
    let f = io.recv(HEADER_ROOM)?;
    match f.header {
        Reply::Ok => Ok(Ok(())),
        Reply::Error { code, message } => Ok(Err(file_error(path, code, message))),
        other => Err(unexpected("a file write", &other)),
    }
}

/// Reads one file, at most `max` bytes (a longer frame is refused from its length); the
/// flag says there was more.
pub fn get_file(io: &mut dyn FrameIo, path: &str, max: u64) -> Answer<(Vec<u8>, bool)> {
    let req = Request::GetFile {
        path: path.to_string(),
        max,
    };
    io.send(&req, b"")?;
    let max_frame = usize::try_from(max)
        .unwrap_or(usize::MAX)
        .saturating_add(HEADER_ROOM)
        .min(cordon_guest::proto::MAX_FRAME);
    let f = io.recv(max_frame)?;
    match f.header {
        Reply::File { truncated } if f.body.len() as u64 <= max => Ok(Ok((f.body, truncated))),
        Reply::Error { code, message } => Ok(Err(file_error(path, code, message))),
        other => Err(unexpected("a file read", &other)),
    }
}

/// Runs one operation on the sandbox's directory watchers.
pub fn watch(io: &mut dyn FrameIo, op: &WatchOp) -> Answer<WatchReply> {
    io.send(&Request::Watch { op: op.clone() }, b"")?;
    let f = io.recv(MAX_REPLY + HEADER_ROOM)?;
    match f.header {
        Reply::Watch => Ok(Ok(decode("a watch", &f.body)?)),
        Reply::Error { code, message } => Ok(Err(watch_error(op, code, message))),
        other => Err(unexpected("a watch", &other)),
    }
}

/// A watcher operation refused (by the agent, or by the host's own watchers).
pub fn watch_error(op: &WatchOp, code: ErrorCode, message: String) -> Error {
    match (op, code) {
        (_, ErrorCode::Busy) => Error::Busy {
            what: message,
            retry_after_secs: 0,
        },
        (WatchOp::Start { path, .. }, code) => file_error(path, code, message),
        (WatchOp::Read { id } | WatchOp::Stop { id }, _) => Error::File {
            path: format!("watcher {id}"),
            reason: message,
        },
    }
}

/// Sends the tar stream `src` to be extracted into `dir`, at most `budget` bytes. A
/// source that fails midway ends the stream early (the agent reports what it made of it)
/// and its error is the answer.
pub fn put_archive(
    io: &mut dyn FrameIo,
    dir: &str,
    budget: u64,
    src: &mut dyn Read,
) -> Answer<ArchiveReport> {
    io.send(
        &Request::PutArchive {
            path: dir.to_string(),
            budget,
        },
        b"",
    )?;
    let mut buf = vec![0u8; ARCHIVE_CHUNK];
    let mut src_error = None;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                src_error = Some(e);
                break;
            }
        };
        io.send(&Request::ArchiveData, &buf[..n])?;
    }
    io.send(&Request::ArchiveData, b"")?;
    let f = io.recv(MAX_REPLY + HEADER_ROOM)?;
    let answer = match f.header {
        Reply::Archive => Ok(decode::<ArchiveReport>("an upload", &f.body)?),
        Reply::Error { code, message } => Err(file_error(dir, code, message)),
        other => return Err(unexpected("an upload", &other)),
    };
    if let Some(e) = src_error {
        return Ok(Err(Error::File {
            path: dir.to_string(),
            reason: format!("the upload's stream broke ({e}); send the archive again"),
        }));
    }
    Ok(answer)
}

/// Receives the directory `dir` as a tar stream into `out`, at most `max` bytes of file
/// contents. When `out` fails (the client went away) the rest is read and dropped, so the
/// channel stays in step, and that error is the answer.
pub fn get_archive(
    io: &mut dyn FrameIo,
    dir: &str,
    max: u64,
    out: &mut dyn Write,
) -> Answer<ArchiveReport> {
    io.send(
        &Request::GetArchive {
            path: dir.to_string(),
            max,
        },
        b"",
    )?;
    let mut out_error = None;
    loop {
        let f = io.recv(ARCHIVE_CHUNK.max(MAX_REPLY) + HEADER_ROOM)?;
        match f.header {
            Reply::ArchiveData => {
                if out_error.is_none()
                    && let Err(e) = out.write_all(&f.body)
                {
                    out_error = Some(e);
                }
            }
            Reply::Archive => {
                let report = decode::<ArchiveReport>("a download", &f.body)?;
                if let Some(e) = out_error {
                    return Ok(Err(Error::File {
                        path: dir.to_string(),
                        reason: format!("the download's receiver went away ({e})"),
                    }));
                }
                let _ = out.flush();
                return Ok(Ok(report));
            }
            Reply::Error { code, message } => return Ok(Err(file_error(dir, code, message))),
            other => return Err(unexpected("a download", &other)),
        }
    }
}

/// What a tier answers when its agent predates file operations (an old microVM image).
pub fn agent_too_old(what: &str) -> Error {
    Error::Unsupported {
        what: format!("{what} with this sandbox's agent (built before file operations)"),
        fix: "rebuild the guest image from this source tree (`cordon image build`)".into(),
    }
}

/// Files taken out one by one are scanned for the secrets of the sandbox's grants (and
/// masked); a tar stream is not, so a sandbox holding grants gives none.
pub fn refuse_unscanned(spec: &SandboxSpec, dir: &str) -> Result<(), Error> {
    if spec.grants.is_empty() {
        return Ok(());
    }
    Err(Error::Unsupported {
        what: format!("downloading {dir} as an archive from a sandbox that holds grants"),
        fix: "download its files one by one (each is scanned for the grants' secrets)".into(),
    })
}
