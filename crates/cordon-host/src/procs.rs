//! The host's end of background execs ([`Request::BgExec`] and the calls on one), over any
//! tier's agent channel ([`FrameIo`]). Answers come twice as in [`crate::files`]: the outer
//! `Result` is the channel, the inner one the request.

use cordon_core::{Error, ProcOutput, ProcSignal, PtySize};
use cordon_guest::proto::{ErrorCode, ProtoError, Reply, Request};

use crate::agent::{CallError, HEADER_ROOM};
use crate::files::{Answer, FrameIo};

fn unexpected(what: &str, other: &Reply) -> CallError {
    CallError::Proto(ProtoError::Malformed(format!(
        "unexpected reply to {what}: {other:?}"
    )))
}

/// An agent's refusal of a call on a background exec.
fn refused(code: ErrorCode, message: String) -> Error {
    match code {
        ErrorCode::Busy => Error::Invalid(message),
        _ => Error::Invalid(format!("{message}; list the sandbox's execs for the ids")),
    }
}

/// Starts the [`Request::BgExec`] `request`; answered as soon as it runs.
pub fn start(io: &mut dyn FrameIo, request: &Request) -> Answer<()> {
    io.send(request, b"")?;
    started(io)
}

/// Starts the [`Request::BgExec`] `request` (its stdio [`StdioMode::Passed`](cordon_guest::proto::StdioMode::Passed))
/// with `stdio`, the program's stdin, stdout and stderr, attached.
pub fn start_passed(
    io: &mut dyn FrameIo,
    request: &Request,
    stdio: [std::os::fd::RawFd; 3],
) -> Answer<()> {
    io.send_with_fds(request, b"", &stdio)?;
    started(io)
}

fn started(io: &mut dyn FrameIo) -> Answer<()> {
    let f = io.recv(HEADER_ROOM)?;
    match f.header {
        Reply::Started { .. } => Ok(Ok(())),
        // `message` is the guest agent's own words, not an error of this process: there is
        // no source to keep (`Error::Failed`), so it stays a message.
        Reply::Error {
            code: ErrorCode::SpawnFailed,
            message,
        } => Ok(Err(Error::Sandbox(format!(
            "the background exec could not be started: {message}"
        )))),
        Reply::Error { code, message } => Ok(Err(refused(code, message))),
        other => Err(unexpected("a background start", &other)),
    }
}

/// Output of background exec `id` from the offsets `from`, at most `max` bytes a stream.
pub fn read(io: &mut dyn FrameIo, id: u64, from: [u64; 2], max: u64) -> Answer<ProcOutput> {
    io.send(
        &Request::BgRead {
            id,
            stdout_from: from[0],
            stderr_from: from[1],
            max,
        },
        b"",
    )?;
    let limit = usize::try_from(max.saturating_mul(2)).unwrap_or(usize::MAX);
    let f = io.recv(limit.saturating_add(HEADER_ROOM))?;
    match f.header {
        Reply::BgOutput {
            stdout_from,
            stdout_len,
            stderr_from,
            exit,
        } => {
            let split = usize::try_from(stdout_len)
                .ok()
                .filter(|n| *n <= f.body.len())
                .ok_or_else(|| {
                    CallError::Proto(ProtoError::Malformed(
                        "background output longer than its frame".into(),
                    ))
                })?;
            let mut stdout = f.body;
            let stderr = stdout.split_off(split);
            if stdout.len() as u64 > max || stderr.len() as u64 > max {
                return Err(CallError::Proto(ProtoError::Malformed(
                    "more background output than asked for".into(),
                )));
            }
            Ok(Ok(ProcOutput {
                stdout_from,
                stdout,
                stderr_from,
                stderr,
                exit,
            }))
        }
        Reply::Error { code, message } => Ok(Err(refused(code, message))),
        other => Err(unexpected("a background read", &other)),
    }
}

/// Bytes for background exec `id`'s stdin; empty closes it.
pub fn write(io: &mut dyn FrameIo, id: u64, data: &[u8]) -> Answer<()> {
    io.send(&Request::BgStdin { id }, data)?;
    ok_or_refused(io, "a background stdin")
}

/// A signal for background exec `id`'s process tree.
pub fn signal(io: &mut dyn FrameIo, id: u64, signal: ProcSignal) -> Answer<()> {
    io.send(&Request::BgSignal { id, signal }, b"")?;
    ok_or_refused(io, "a background signal")
}

/// Signal number `signal` for background exec `id`'s program (`all`: every process of
/// it).
pub fn raise(io: &mut dyn FrameIo, id: u64, signal: i32, all: bool) -> Answer<()> {
    io.send(&Request::BgRaise { id, signal, all }, b"")?;
    ok_or_refused(io, "a background signal")
}

/// A new window size for background exec `id`'s pseudo-terminal.
pub fn resize(io: &mut dyn FrameIo, id: u64, size: PtySize) -> Answer<()> {
    if let Err(e) = size.validate() {
        return Ok(Err(e));
    }
    io.send(&Request::BgResize { id, size }, b"")?;
    ok_or_refused(io, "a background resize")
}

fn ok_or_refused(io: &mut dyn FrameIo, what: &str) -> Answer<()> {
    let f = io.recv(HEADER_ROOM)?;
    match f.header {
        Reply::Ok => Ok(Ok(())),
        Reply::Error { code, message } => Ok(Err(refused(code, message))),
        other => Err(unexpected(what, &other)),
    }
}
