//! Archives over the agent channel: an upload's tar stream read from the
//! [`Request::ArchiveData`] frames that follow its request, a download's written as
//! [`Reply::ArchiveData`] frames. The agent does nothing else meanwhile (the host keeps a
//! sandbox busy during a file call).

use std::io::{self, Read, Write};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::state::Channel;
use crate::proto::{ARCHIVE_CHUNK, FrameBuffer, ProtoError, Reply, Request, encode};

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
