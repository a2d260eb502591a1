//! File calls: one file in or out, or a [`cordon_core::FileOp`], in the workspace or
//! outside it (forked as the sandbox's user: [`crate::outside`], ADR 0031); archives over
//! the agent channel: an upload's tar stream read from the [`Request::ArchiveData`] frames
//! that follow its request, a download's written as [`Reply::ArchiveData`] frames. The
//! agent does nothing else meanwhile (the host keeps a sandbox busy during a file call).

use std::io::{self, Read, Write};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use cordon_core::{FileOp, FileReply, FileTarget, classify_sandbox_path};

use super::child::drop_privileges;
use super::state::{Agent, Channel};
use crate::files::{FileError, Workspace};
use crate::outside::Outside;
use crate::proto::{ARCHIVE_CHUNK, ErrorCode, FrameBuffer, ProtoError, Reply, Request, encode};

/// Whether `path` is served outside the workspace (or refused before anything is forked).
fn outside(path: &str) -> Result<bool, FileError> {
    match classify_sandbox_path(path, true) {
        Ok(FileTarget::Workspace(_)) => Ok(false),
        Ok(FileTarget::Outside(_)) => Ok(true),
        // The workspace's own refusals are its own to give.
        Err(_) if !path.starts_with('/') => Ok(false),
        Err(e) => Err((ErrorCode::PathRefused, e.to_string())),
    }
}

/// Whether a file call names the sandbox's boot id ([`cordon_core::BOOT_ID`]).
fn is_boot_id(path: &str) -> bool {
    matches!(
        classify_sandbox_path(path, false),
        Ok(FileTarget::Outside(rel)) if format!("/{rel}") == cordon_core::BOOT_ID
    )
}

impl Agent {
    /// The boot id as the sandbox's programs read it: the sandbox's own where its execs get
    /// one bound over the kernel's (the container tier's servers, ADR 0047), else the
    /// kernel's (gVisor's and a guest's own; a one-shot run's host one). Read by the agent:
    /// the file call's helper sees no exec's `/proc`.
    fn boot_id(&self) -> Result<(Vec<u8>, bool), FileError> {
        let from =
            (self.cfg.boot_id.as_deref()).unwrap_or(std::path::Path::new(cordon_core::BOOT_ID));
        std::fs::read(from)
            .map(|data| (data, false))
            .map_err(|e| (ErrorCode::Io, format!("reading the boot id: {e}")))
    }

    /// [`Workspace::put`] in the workspace or outside it.
    pub(super) fn put_file(&self, path: &str, mode: u32, data: &[u8]) -> Result<(), FileError> {
        if !outside(path)? {
            return self.work.put(path, mode, data);
        }
        self.outside_call(|ws| ws.put(path, mode, data).map(|()| ((), Vec::new())))
            .map(drop)
    }

    /// [`Workspace::get`] in the workspace or outside it.
    pub(super) fn get_file(&self, path: &str, max: u64) -> Result<(Vec<u8>, bool), FileError> {
        if is_boot_id(path) {
            return self.boot_id();
        }
        if !outside(path)? {
            return self.work.get(path, max);
        }
        self.outside_call(|ws| ws.get(path, max).map(|(data, truncated)| (truncated, data)))
            .map(|(truncated, data)| (data, truncated))
    }

    /// [`Workspace::op`] in the workspace or outside it (a move between the two is refused
    /// there: the outside call names the workspace's end).
    pub(super) fn file_op(&self, op: &FileOp) -> Result<FileReply, FileError> {
        let mut any = false;
        for p in op.paths() {
            any |= outside(p)?;
        }
        if !any {
            return self.work.op(op);
        }
        self.outside_call(|ws| ws.op(op).map(|r| (r, Vec::new())))
            .map(|(r, _)| r)
    }

    /// Runs `f` forked, as the sandbox's user under the tier's confinement, on the
    /// sandbox's root.
    fn outside_call<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<(T, Vec<u8>), FileError>,
    ) -> Result<(T, Vec<u8>), FileError> {
        let prepare = || -> io::Result<()> {
            if let Some(confine) = &self.cfg.confine {
                confine()?;
            }
            drop_privileges(&self.cfg, None)
        };
        Outside {
            root: std::path::Path::new("/"),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            prepare: &prepare,
        }
        .call(f)
    }
}

/// Reads an upload's bytes from the frames that follow its request.
pub(super) struct UploadReader<'a> {
    ctrl: &'a mut Channel,
    inbuf: &'a mut FrameBuffer,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
    /// The channel broke or the host sent another request mid-upload.
    broken: Option<ProtoError>,
}

impl<'a> UploadReader<'a> {
    pub(super) fn new(ctrl: &'a mut Channel, inbuf: &'a mut FrameBuffer) -> Self {
        UploadReader {
            ctrl,
            inbuf,
            cur: Vec::new(),
            pos: 0,
            done: false,
            broken: None,
        }
    }

    /// The next piece of the stream; `false` at its end.
    fn next_piece(&mut self) -> Result<bool, ProtoError> {
        loop {
            if let Some(frame) = self.inbuf.next_frame::<Request>()? {
                return match frame.header {
                    Request::ArchiveData if frame.body.is_empty() => {
                        self.done = true;
                        Ok(false)
                    }
                    Request::ArchiveData => {
                        self.cur = frame.body;
                        self.pos = 0;
                        Ok(true)
                    }
                    other => Err(ProtoError::Malformed(format!(
                        "a {other:?} request in the middle of an upload"
                    ))),
                };
            }
            let mut fds = [PollFd::new(self.ctrl.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
            let mut buf = vec![0u8; 64 * 1024];
            match self.ctrl.read_bytes(&mut buf) {
                Ok(0) => return Err(ProtoError::Closed),
                Ok(n) => self.inbuf.push(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads what is left of the stream, so the channel is ready for the next request.
    pub(super) fn drain(mut self) -> Result<(), ProtoError> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        while !self.done {
            self.next_piece()?;
        }
        Ok(())
    }
}

impl Read for UploadReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.cur.len() {
            if self.done || self.broken.is_some() {
                return Ok(0);
            }
            match self.next_piece() {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(e) => {
                    let msg = e.to_string();
                    self.broken = Some(e);
                    return Err(io::Error::other(msg));
                }
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Sends a download's bytes as frames of at most [`ARCHIVE_CHUNK`] bytes.
pub(super) struct DownloadWriter<'a> {
    ctrl: &'a mut Channel,
    buf: Vec<u8>,
}

impl<'a> DownloadWriter<'a> {
    pub(super) fn new(ctrl: &'a mut Channel) -> Self {
        DownloadWriter {
            ctrl,
            buf: Vec::with_capacity(ARCHIVE_CHUNK),
        }
    }

    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let bytes =
            encode(&Reply::ArchiveData, &self.buf).map_err(|e| io::Error::other(e.to_string()))?;
        self.ctrl.write_all(&bytes)?;
        self.buf.clear();
        Ok(())
    }

    /// Sends what is buffered.
    pub(super) fn flush_all(mut self) -> Result<(), ProtoError> {
        self.send_buf().map_err(ProtoError::from)
    }
}

impl Write for DownloadWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(ARCHIVE_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= ARCHIVE_CHUNK {
            self.send_buf()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
