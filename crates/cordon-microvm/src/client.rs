//! The host's end of the agent channel, written for a hostile guest: every call has one
//! deadline covering all of its writes and reads (a guest that stops reading cannot hold a
//! call past it), every frame is checked against the largest one the call can need before
//! a byte of its body is buffered, and decoding costs the same per frame however small the
//! frames are (the buffer is consumed by an offset and compacted only when half is spent).

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use cordon_guest::proto::{self, Frame, ProtoError, Reply, Request};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Bytes a frame may carry beyond the payload a call asked for (its JSON header).
pub const HEADER_ROOM: usize = 64 << 10;
/// What one read takes from the socket at most.
const READ_CHUNK: usize = 256 << 10;

/// Why a call on the agent channel failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the guest agent did not take or answer the request in time")]
    Timeout,
    #[error("the agent channel closed")]
    Closed,
    #[error("agent channel I/O: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Proto(#[from] ProtoError),
}

/// What one wait for input found.
#[derive(Debug, PartialEq, Eq)]
pub enum Filled {
    /// New bytes were buffered.
    Data,
    /// Nothing arrived within the wait.
    Nothing,
    /// The guest closed the channel.
    Eof,
}

/// The agent channel: a non-blocking socket and the bytes received but not yet decoded.
pub struct AgentConn {
    sock: UnixStream,
    buf: Vec<u8>,
    /// Where the undecoded bytes start in `buf`.
    start: usize,
}

impl AgentConn {
    pub fn new(sock: UnixStream) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(AgentConn {
            sock,
            buf: Vec::new(),
            start: 0,
        })
    }

    /// Raw bytes, bypassing the encoder (tests of the guest's checks), by `deadline`.
    pub fn send_raw(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), CallError> {
        let mut sent = 0;
        while sent < bytes.len() {
            match (&self.sock).write(&bytes[sent..]) {
                Ok(0) => return Err(CallError::Closed),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(PollFlags::POLLOUT, deadline)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Sends one frame; the whole of it must be taken by `deadline`.
    pub fn send(
        &mut self,
        header: &Request,
        body: &[u8],
        deadline: Instant,
    ) -> Result<(), CallError> {
        let bytes = proto::encode(header, body)?;
        self.send_raw(&bytes, deadline)
    }

    /// The next frame, whole by `deadline`; a frame longer than `max_frame` bytes is refused
    /// as soon as its length arrives.
    pub fn recv(&mut self, deadline: Instant, max_frame: usize) -> Result<Frame<Reply>, CallError> {
        loop {
            if let Some(f) = self.next_frame(max_frame)? {
                return Ok(f);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CallError::Timeout);
            }
            match self.fill(deadline - now)? {
                Filled::Eof => return Err(CallError::Closed),
                Filled::Data | Filled::Nothing => {}
            }
        }
    }

    /// Waits up to `wait` for input and buffers what arrived (one read).
    pub fn fill(&mut self, wait: Duration) -> Result<Filled, CallError> {
        match self.read_some() {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(Filled::Nothing),
            Err(e) => return Err(e.into()),
        }
        let ms = wait.as_millis().clamp(1, u16::MAX as u128) as u16;
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(Filled::Nothing),
            Ok(_) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        match self.read_some() {
            Ok(f) => Ok(f),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(Filled::Nothing)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn read_some(&mut self) -> io::Result<Filled> {
        // Spent bytes are dropped only when they are at least half of the buffer: each byte
        // is moved at most once on average, whatever the frame sizes.
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + READ_CHUNK, 0);
        let r = (&self.sock).read(&mut self.buf[len..]);
        self.buf.truncate(len + *r.as_ref().unwrap_or(&0));
        match r? {
            0 => Ok(Filled::Eof),
            _ => Ok(Filled::Data),
        }
    }

    /// Decodes the next whole frame from what is buffered.
    pub fn next_frame(&mut self, max_frame: usize) -> Result<Option<Frame<Reply>>, ProtoError> {
        let rest = &self.buf[self.start..];
        if rest.len() < 4 {
            return Ok(None);
        }
        let total = proto::check_total([rest[0], rest[1], rest[2], rest[3]])?;
        if total > max_frame {
            return Err(ProtoError::Malformed(format!(
                "a frame of {total} bytes where at most {max_frame} fit"
            )));
        }
        if rest.len() < 4 + total {
            return Ok(None);
        }
        let payload = rest[4..4 + total].to_vec();
        self.start += 4 + total;
        proto::decode_payload(payload).map(Some)
    }

    /// Bytes buffered and not yet decoded, and the buffer's size (tests).
    pub fn buffered(&self) -> (usize, usize) {
        (self.buf.len() - self.start, self.buf.capacity())
    }

    fn wait(&self, events: PollFlags, deadline: Instant) -> Result<(), CallError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(CallError::Timeout);
        }
        let ms = (deadline - now).as_millis().clamp(1, u16::MAX as u128) as u16;
        let mut fds = [PollFd::new(self.sock.as_fd(), events)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(io::Error::from(e).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_stops_reading_cannot_hold_a_send_past_its_deadline() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut c = AgentConn::new(a).unwrap();
        let body = vec![7u8; 8 << 20];
        let deadline = Instant::now() + Duration::from_millis(200);
        let r = c.send(&Request::Stdin { id: 1 }, &body, deadline);
        assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
    }

    #[test]
    fn a_peer_that_dribbles_cannot_hold_a_receive_past_its_deadline() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = AgentConn::new(a).unwrap();
        let frame = proto::encode(&Reply::Ok, b"").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        // One byte every 50 ms: each read succeeds, the frame never completes in time.
        let t = std::thread::spawn(move || {
            for byte in frame.iter().take(frame.len() - 1) {
                if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let _ = b.write_all(&[*byte]);
                std::thread::sleep(Duration::from_millis(50));
            }
            b
        });
        let deadline = Instant::now() + Duration::from_millis(150);
        let r = c.recv(deadline, 1 << 20);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
        drop(t.join());
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_length() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = AgentConn::new(a).unwrap();
        // Only the length of a 48 MiB frame is sent: refused before any body is buffered.
        b.write_all(&((48u32 << 20) + 4).to_le_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let r = c.recv(deadline, (1 << 20) + HEADER_ROOM);
        assert!(matches!(r, Err(CallError::Proto(_))), "{r:?}");
    }

    #[test]
    fn one_byte_frames_cost_the_same_per_frame() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = AgentConn::new(a).unwrap();
        let one = proto::encode(
            &Reply::Output {
                id: 1,
                stream: proto::Stream::Stdout,
            },
            b"x",
        )
        .unwrap();
        let n = 20_000;
        let all: Vec<u8> = one.iter().copied().cycle().take(one.len() * n).collect();
        let w = std::thread::spawn(move || b.write_all(&all).map(|_| b));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        let mut moved_max = 0;
        while got < n {
            let f = c.recv(deadline, 1 << 20).unwrap();
            assert_eq!(f.body, b"x");
            got += 1;
            moved_max = moved_max.max(c.buffered().1);
        }
        // The buffer never grows beyond one read and what was left of the last one.
        assert!(moved_max <= 3 * READ_CHUNK, "buffer grew to {moved_max}");
        drop(w.join());
    }
}
