//! Many byte streams over one channel: the microVM's egress path. Each TCP connection a
//! program makes to the guest's forwarder (`127.0.0.1:<port>`) becomes a stream on the
//! VM's egress virtio-serial port; on the host each stream becomes one connection to the
//! sandbox's egress proxy. The VM has no network device, so this is the only way out.
//!
//! Both ends run this module: the guest carries accepted connections ([`Tunnel::carry`]),
//! the host dials the proxy for each stream the guest opens ([`Tunnel::start`] with a
//! [`Dial`]). A frame is `kind u8 | stream u32 LE | length u32 LE | payload`.
//!
//! Flow control is per stream and credit-based: a side sends at most [`WINDOW`] bytes the
//! other has not yet delivered to its end, so a slow connection never stalls the others, no
//! reader ever blocks, and what either side buffers is bounded by `WINDOW` × open streams.
//! The host treats the guest as hostile: an oversized frame, an unknown kind, data beyond
//! the window, credit never spent, a reused stream id, or an open request on the guest's
//! side ends the whole tunnel; more than [`MAX_STREAMS`] open streams are refused one by one.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 32 * 1024;
/// Bytes a side may send on one stream before the other reports them delivered.
pub const WINDOW: u64 = 256 * 1024;
/// Streams open at once; the proxy's own connection limit is lower by default.
pub const MAX_STREAMS: usize = 128;

const OPEN: u8 = 1;
const DATA: u8 = 2;
const EOF: u8 = 3;
const CLOSE: u8 = 4;
const CREDIT: u8 = 5;
const HEADER: usize = 9;
const THREAD_STACK: usize = 128 * 1024;

/// A local connection a stream is tied to.
pub trait Conn: Read + Write + Send + 'static {
    /// A second handle on the same connection (for the other direction).
    fn another(&self) -> io::Result<Box<dyn Conn>>;
    /// Shuts one or both directions down; errors (already closed) are ignored.
    fn shut(&self, how: Shutdown);
}

impl Conn for TcpStream {
    fn another(&self) -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl Conn for UnixStream {
    fn another(&self) -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// Opens the far end of a stream the other side asked for (the host: a connection to the
/// sandbox's proxy).
pub type Dial = Arc<dyn Fn() -> io::Result<Box<dyn Conn>> + Send + Sync>;

/// Dials a unix socket for every stream (the host: the sandbox's proxy).
pub fn dial_unix(path: std::path::PathBuf) -> Dial {
    Arc::new(move || Ok(Box::new(UnixStream::connect(&path)?) as Box<dyn Conn>))
}

/// How the channel's reader treats end-of-file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEof {
    /// The tunnel is over (a socket).
    End,
    /// Wait and read again: a virtio-serial port reads as empty while its host end is not
    /// connected (yet, or during a restore).
    Retry,
}

#[derive(Default)]
struct State {
    inbox: VecDeque<Vec<u8>>,
    queued: u64,
    peer_eof: bool,
    /// The peer ended the stream, or the tunnel died.
    closed: bool,
    /// Bytes this side may still send.
    credit: u64,
    /// Threads of this stream still running; the last one sends CLOSE.
    running: u8,
    close_sent: bool,
}

struct Stream {
    state: Mutex<State>,
    cv: Condvar,
    /// Set once the local connection exists (the host dials on a stream thread).
    conn: Mutex<Option<Box<dyn Conn>>>,
}

impl Stream {
    fn new() -> Arc<Stream> {
        Arc::new(Stream {
            state: Mutex::new(State {
                credit: WINDOW,
                running: 2,
                ..State::default()
            }),
            cv: Condvar::new(),
            conn: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peer ended the stream (or the tunnel died): stop reading the local end (which
    /// wakes a blocked read); data already queued is still delivered before it is shut.
    fn end(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
        if let Some(c) = self.conn.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            c.shut(Shutdown::Read);
        }
    }
}

struct Shared {
    out: Mutex<Box<dyn Write + Send>>,
    streams: Mutex<HashMap<u32, Arc<Stream>>>,
    dead: AtomicBool,
    next_id: AtomicU32,
    dial: Option<Dial>,
    /// Ends the channel so that the reader wakes up (shuts a socket down).
    stop: Box<dyn Fn() + Send + Sync>,
}

impl Shared {
    fn send(&self, kind: u8, id: u32, payload: &[u8]) -> io::Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "tunnel closed"));
        }
        let frame = encode_frame(kind, id, payload);
        let r = self
            .out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(&frame);
        if r.is_err() {
            self.die();
        }
        r
    }

    fn streams(&self) -> MutexGuard<'_, HashMap<u32, Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the tunnel and every stream on it.
    fn die(&self) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        (self.stop)();
        let all: Vec<Arc<Stream>> = self.streams().drain().map(|(_, s)| s).collect();
        for s in all {
            s.end();
        }
    }

    /// A stream thread is done; the last one releases the id and tells the peer.
    fn thread_done(&self, id: u32, s: &Stream) {
        let last = {
            let mut st = s.lock();
            st.running = st.running.saturating_sub(1);
            let last = st.running == 0 && !st.close_sent;
            if last {
                st.close_sent = true;
            }
            last
        };
        if last {
            self.streams().remove(&id);
            if let Some(c) = s.conn.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                c.shut(Shutdown::Both);
            }
            let _ = self.send(CLOSE, id, &[]);
        }
    }
}

/// One end of a tunnel. Dropping it does not end it: call [`Tunnel::shutdown`].
#[derive(Clone)]
pub struct Tunnel {
    shared: Arc<Shared>,
}

impl Tunnel {
    /// Starts the tunnel's reader thread on `reader`; frames go out through `writer`. With
    /// `dial`, streams the other side opens are connected through it; without, an open
    /// request is a protocol violation. `stop` must make a blocked read of `reader` return.
    pub fn start(
        reader: Box<dyn Read + Send>,
        writer: Box<dyn Write + Send>,
        dial: Option<Dial>,
        on_eof: OnEof,
        stop: Box<dyn Fn() + Send + Sync>,
    ) -> io::Result<Tunnel> {
        let shared = Arc::new(Shared {
            out: Mutex::new(writer),
            streams: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            next_id: AtomicU32::new(1),
            dial,
            stop,
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("tunnel-reader".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let why = read_loop(&s, reader, on_eof);
                if let Err(e) = why {
                    tracing_free_log(&format!("egress tunnel ended: {e}"));
                }
                s.die();
            })?;
        Ok(Tunnel { shared })
    }

    /// A tunnel over a unix socket (the host's end of QEMU's egress chardev), ended by
    /// shutting that socket down.
    pub fn over_socket(chan: UnixStream, dial: Option<Dial>) -> io::Result<Tunnel> {
        let reader = chan.try_clone()?;
        let stopper = chan.try_clone()?;
        Tunnel::start(
            Box::new(reader),
            Box::new(chan),
            dial,
            OnEof::End,
            Box::new(move || {
                let _ = stopper.shutdown(Shutdown::Both);
            }),
        )
    }

    /// Carries one local connection over a new stream (the guest's side).
    pub fn carry(&self, conn: Box<dyn Conn>) -> io::Result<()> {
        if self.is_dead() {
            conn.shut(Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "tunnel closed"));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let stream = Stream::new();
        self.shared.streams().insert(id, stream.clone());
        if let Err(e) = self.shared.send(OPEN, id, &[]) {
            self.shared.streams().remove(&id);
            conn.shut(Shutdown::Both);
            return Err(e);
        }
        let shared = self.shared.clone();
        let st = stream.clone();
        std::thread::Builder::new()
            .name("tunnel-up".into())
            .stack_size(THREAD_STACK)
            .spawn(move || run_stream(shared, id, st, Ok(conn)))
            .map(|_| ())
            .inspect_err(|_| refuse(&self.shared, id, &stream))
    }

    /// True once the channel failed or was shut down.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.shared.streams().len()
    }

    /// Ends the tunnel: the channel is shut and every stream's connection closed.
    pub fn shutdown(&self) {
        self.shared.die();
    }
}

/// The guest has no logger: problems go to stderr (the VM console), the host's to tracing
/// through its own caller. Kept quiet unless asked, so a program cannot flood the console.
fn tracing_free_log(msg: &str) {
    if std::env::var_os("CORDON_TUNNEL_DEBUG").is_some() {
        eprintln!("cordon tunnel: {msg}");
    }
}

fn violation(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// A frame's head: what it is, which stream, how many payload bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    kind: u8,
    id: u32,
    len: usize,
}

/// One frame: `kind u8 | stream u32 LE | length u32 LE | payload`.
fn encode_frame(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    frame.push(kind);
    frame.extend_from_slice(&id.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Reads a frame's head; a payload over [`MAX_PAYLOAD`] is a violation.
fn parse_head(head: &[u8; HEADER]) -> io::Result<Head> {
    let [kind, i0, i1, i2, i3, l0, l1, l2, l3] = *head;
    let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
    if len > MAX_PAYLOAD {
        return Err(violation(format!("frame of {len} bytes")));
    }
    Ok(Head {
        kind,
        id: u32::from_le_bytes([i0, i1, i2, i3]),
        len,
    })
}

fn read_loop(s: &Arc<Shared>, mut r: Box<dyn Read + Send>, on_eof: OnEof) -> io::Result<()> {
    let mut head = [0u8; HEADER];
    let mut payload = vec![0u8; MAX_PAYLOAD];
    loop {
        match read_full(&mut r, &mut head, on_eof, s)? {
            Filled::Done => {}
            Filled::Eof => return Ok(()),
        }
        let Head { kind, id, len } = parse_head(&head)?;
        if len > 0 {
            match read_full(&mut r, &mut payload[..len], on_eof, s)? {
                Filled::Done => {}
                Filled::Eof => return Ok(()),
            }
        }
        let body = &payload[..len];
        let stream = s.streams().get(&id).cloned();
        match kind {
            OPEN => {
                let Some(dial) = s.dial.clone() else {
                    return Err(violation("open request from the side that dials"));
                };
                if stream.is_some() {
                    return Err(violation(format!("stream {id} opened twice")));
                }
                if s.streams().len() >= MAX_STREAMS {
                    s.send(CLOSE, id, &[])?;
                    continue;
                }
                let st = Stream::new();
                s.streams().insert(id, st.clone());
                let shared = s.clone();
                // Dialled on the stream's own thread: the reader never blocks.
                run_stream_dialled(shared, id, st, dial);
            }
            DATA => {
                let Some(st) = stream else { continue };
                let mut g = st.lock();
                if g.queued + len as u64 > WINDOW {
                    return Err(violation(format!("stream {id}: data beyond the window")));
                }
                if !g.closed && len > 0 {
                    g.queued += len as u64;
                    // Small frames join the last chunk while it has room: what a window
                    // holds costs the same heap (and the same delivery and credit work)
                    // whether the peer sends it in one frame or in 1-byte frames.
                    match g.inbox.back_mut() {
                        Some(last) if last.len() + len <= MAX_PAYLOAD => {
                            last.extend_from_slice(body)
                        }
                        _ => {
                            let mut chunk = Vec::with_capacity(MAX_PAYLOAD.min(len.max(4096)));
                            chunk.extend_from_slice(body);
                            g.inbox.push_back(chunk);
                        }
                    }
                }
                drop(g);
                st.cv.notify_all();
            }
            EOF => {
                if let Some(st) = stream {
                    st.lock().peer_eof = true;
                    st.cv.notify_all();
                }
            }
            CLOSE => {
                if let Some(st) = stream {
                    st.end();
                }
            }
            CREDIT => {
                if len != 4 {
                    return Err(violation("credit frame without a 4-byte amount"));
                }
                let Some(st) = stream else { continue };
                let n = u32::from_le_bytes([body[0], body[1], body[2], body[3]]) as u64;
                let mut g = st.lock();
                if g.credit + n > WINDOW {
                    return Err(violation(format!("stream {id}: credit for unsent bytes")));
                }
                g.credit += n;
                drop(g);
                st.cv.notify_all();
            }
            k => return Err(violation(format!("unknown frame kind {k}"))),
        }
    }
}

enum Filled {
    Done,
    Eof,
}

fn read_full(
    r: &mut Box<dyn Read + Send>,
    buf: &mut [u8],
    on_eof: OnEof,
    s: &Shared,
) -> io::Result<Filled> {
    let mut got = 0;
    while got < buf.len() {
        if s.dead.load(Ordering::Acquire) {
            return Ok(Filled::Eof);
        }
        match r.read(&mut buf[got..]) {
            Ok(0) => match on_eof {
                OnEof::End => {
                    if got > 0 {
                        return Err(violation("channel ended inside a frame"));
                    }
                    return Ok(Filled::Eof);
                }
                OnEof::Retry => std::thread::sleep(Duration::from_millis(10)),
            },
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Filled::Done)
}

fn run_stream_dialled(shared: Arc<Shared>, id: u32, st: Arc<Stream>, dial: Dial) {
    let s2 = shared.clone();
    let st2 = st.clone();
    let spawned = std::thread::Builder::new()
        .name("tunnel-dial".into())
        .stack_size(THREAD_STACK)
        .spawn(move || run_stream(s2, id, st2, dial()));
    if spawned.is_err() {
        refuse(&shared, id, &st);
    }
}

/// Ends a stream that never got its connection.
fn refuse(shared: &Shared, id: u32, st: &Stream) {
    st.end();
    st.lock().running = 1;
    shared.thread_done(id, st);
}

/// Runs a stream's two directions over `conn` (on the calling thread and one more).
fn run_stream(shared: Arc<Shared>, id: u32, st: Arc<Stream>, conn: io::Result<Box<dyn Conn>>) {
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            tracing_free_log(&format!("stream {id}: cannot connect: {e}"));
            refuse(&shared, id, &st);
            return;
        }
    };
    let (reader, writer) = match (conn.another(), conn.another()) {
        (Ok(r), Ok(w)) => (r, w),
        _ => {
            conn.shut(Shutdown::Both);
            refuse(&shared, id, &st);
            return;
        }
    };
    *st.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
    if st.lock().closed {
        // Ended (peer close, tunnel death) before the connection was stored.
        st.end();
    }
    let (s2, st2) = (shared.clone(), st.clone());
    let down = std::thread::Builder::new()
        .name("tunnel-down".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            down_loop(&s2, id, &st2, writer);
            s2.thread_done(id, &st2);
        });
    if down.is_err() {
        st.end();
        st.lock().running = 1;
    }
    up_loop(&shared, id, &st, reader);
    shared.thread_done(id, &st);
}

/// Local connection → tunnel, within the credit the peer gave.
fn up_loop(shared: &Shared, id: u32, st: &Stream, mut local: Box<dyn Conn>) {
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        let room = {
            let mut g = st.lock();
            while g.credit == 0 && !g.closed {
                g = st.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            if g.closed {
                return;
            }
            g.credit.min(MAX_PAYLOAD as u64) as usize
        };
        let n = match local.read(&mut buf[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 {
            let _ = shared.send(EOF, id, &[]);
            return;
        }
        st.lock().credit -= n as u64;
        if shared.send(DATA, id, &buf[..n]).is_err() {
            return;
        }
    }
}

/// Tunnel → local connection; delivered bytes are credited back to the peer. If the local
/// end stops taking data, what still arrives is dropped (and credited) until the peer ends.
fn down_loop(shared: &Shared, id: u32, st: &Stream, mut local: Box<dyn Conn>) {
    let mut sink_gone = false;
    loop {
        let chunk = {
            let mut g = st.lock();
            loop {
                if let Some(c) = g.inbox.pop_front() {
                    g.queued -= c.len() as u64;
                    break Some(c);
                }
                if g.peer_eof || g.closed {
                    break None;
                }
                g = st.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        };
        let Some(chunk) = chunk else {
            local.shut(Shutdown::Write);
            return;
        };
        if !sink_gone && local.write_all(&chunk).is_err() {
            sink_gone = true;
        }
        if shared
            .send(CREDIT, id, &(chunk.len() as u32).to_le_bytes())
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    /// A guest end and a host end joined by a socket pair; the host dials `target`.
    fn pair(target: std::path::PathBuf) -> (Tunnel, Tunnel) {
        let (g, h) = UnixStream::pair().unwrap();
        let guest = Tunnel::over_socket(g, None).unwrap();
        let host = Tunnel::over_socket(h, Some(dial_unix(target))).unwrap();
        (guest, host)
    }

    fn echo_server(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("echo.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut r = c.try_clone().unwrap();
                    let mut w = c;
                    let _ = io::copy(&mut r, &mut w);
                    let _ = w.shutdown(Shutdown::Write);
                });
            }
        });
        path
    }

    fn tmpdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cordon-tunnel-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn many_streams_carry_large_transfers_both_ways() {
        let dir = tmpdir();
        let (guest, host) = pair(echo_server(&dir));
        let mut workers = Vec::new();
        for k in 0..8u8 {
            let (a, b) = UnixStream::pair().unwrap();
            guest.carry(Box::new(b)).unwrap();
            workers.push(std::thread::spawn(move || {
                // 3 MiB each way: far beyond the window, so credit must flow.
                let data: Vec<u8> = (0..3 << 20).map(|i| (i as u8) ^ k).collect();
                let mut w = a.try_clone().unwrap();
                let d2 = data.clone();
                let t = std::thread::spawn(move || {
                    w.write_all(&d2).unwrap();
                    w.shutdown(Shutdown::Write).unwrap();
                });
                let mut got = Vec::new();
                (&a).read_to_end(&mut got).unwrap();
                t.join().unwrap();
                assert!(got == data, "stream {k} corrupted");
            }));
        }
        for w in workers {
            w.join().unwrap();
        }
        // Every stream is released on both sides.
        for _ in 0..200 {
            if guest.open_streams() == 0 && host.open_streams() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!((guest.open_streams(), host.open_streams()), (0, 0));
        host.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_refused_dial_closes_the_stream_and_shutdown_ends_all() {
        let dir = tmpdir();
        let (guest, host) = pair(dir.join("nobody-listens"));
        let (a, b) = UnixStream::pair().unwrap();
        guest.carry(Box::new(b)).unwrap();
        let mut got = Vec::new();
        (&a).read_to_end(&mut got).unwrap();
        assert!(got.is_empty());

        let echo = echo_server(&dir);
        let (guest, host2) = pair(echo);
        let (a, b) = UnixStream::pair().unwrap();
        guest.carry(Box::new(b)).unwrap();
        (&a).write_all(b"ping\n").unwrap();
        let mut line = String::new();
        BufReader::new(&a).read_line(&mut line).unwrap();
        assert_eq!(line, "ping\n");
        host2.shutdown();
        // The open stream ends with the tunnel.
        let mut rest = Vec::new();
        let _ = (&a).read_to_end(&mut rest);
        assert!(host2.is_dead());
        host.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hostile_peer_is_cut_off() {
        for frame in [
            // oversized
            {
                let mut f = vec![DATA, 1, 0, 0, 0];
                f.extend_from_slice(&(1u32 << 20).to_le_bytes());
                f
            },
            // unknown kind
            vec![9, 1, 0, 0, 0, 0, 0, 0, 0],
            // credit for bytes never sent
            {
                let mut f = vec![CREDIT, 1, 0, 0, 0, 4, 0, 0, 0];
                f.extend_from_slice(&1u32.to_le_bytes());
                f
            },
        ] {
            let dir = tmpdir();
            let echo = echo_server(&dir);
            let (evil, h) = UnixStream::pair().unwrap();
            let host = Tunnel::over_socket(h, Some(dial_unix(echo))).unwrap();
            (&evil).write_all(&[OPEN, 1, 0, 0, 0, 0, 0, 0, 0]).unwrap();
            (&evil).write_all(&frame).unwrap();
            for _ in 0..200 {
                if host.is_dead() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(host.is_dead(), "frame {frame:?} was accepted");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn one_byte_frames_cost_no_more_heap_than_one_big_one() {
        // The host dials a listener that accepts and never reads: what the guest sends
        // stays queued in the stream's inbox.
        let dir = tmpdir();
        let sock = dir.join("stuck.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let held = std::thread::spawn(move || listener.accept().map(|(c, _)| c));
        let (evil, h) = UnixStream::pair().unwrap();
        let host = Tunnel::over_socket(h, Some(dial_unix(sock))).unwrap();
        (&evil).write_all(&[OPEN, 1, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let n = WINDOW as usize;
        let mut frames = Vec::with_capacity(n * (HEADER + 1));
        for _ in 0..n {
            frames.extend_from_slice(&[DATA, 1, 0, 0, 0, 1, 0, 0, 0, b'x']);
        }
        let w = std::thread::spawn(move || (&evil).write_all(&frames).map(|_| evil));
        let _evil = w.join().unwrap().unwrap();
        // Wait until the reader has taken every frame (queued bytes stop changing).
        let st = host.shared.streams().get(&1).cloned().unwrap();
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let q = st.lock().queued;
            if q == last {
                break;
            }
            last = q;
        }
        assert!(!host.is_dead());
        let chunks = st.lock().inbox.len();
        assert!(
            chunks <= WINDOW as usize / MAX_PAYLOAD + 2,
            "{chunks} heap chunks for {last} queued bytes"
        );
        host.shutdown();
        drop(held.join());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Bounded fuzzing of the stream multiplexer (docs/fuzzing.md); `CORDON_FUZZ_CASES` runs
/// longer campaigns.
#[cfg(test)]
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::config;
    use proptest::prelude::*;
    use std::time::Instant;

    /// Dials an in-memory echo peer for every stream (no filesystem, no listener).
    fn echo_dial() -> Dial {
        Arc::new(|| {
            let (near, far) = UnixStream::pair()?;
            let mut r = far.try_clone()?;
            std::thread::spawn(move || {
                let mut w = far;
                let _ = io::copy(&mut r, &mut w);
                let _ = w.shutdown(Shutdown::Write);
            });
            Ok(Box::new(near) as Box<dyn Conn>)
        })
    }

    fn wait_until(what: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// A frame a hostile peer might send: any kind, a few stream ids, and a payload.
    fn frame() -> impl Strategy<Value = Vec<u8>> {
        let kind = prop_oneof![
            Just(OPEN),
            Just(DATA),
            Just(EOF),
            Just(CLOSE),
            Just(CREDIT),
            any::<u8>()
        ];
        let payload = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            (1usize..=4).prop_map(|n| vec![0xff; n]),
            any::<u32>().prop_map(|c| c.to_le_bytes().to_vec()),
        ];
        let well_formed = (kind, 0u32..4, payload).prop_map(|(k, id, p)| encode_frame(k, id, &p));
        prop_oneof![
            8 => well_formed,
            1 => prop::collection::vec(any::<u8>(), 0..20),
        ]
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn frame_heads_round_trip(kind in any::<u8>(), id in any::<u32>(), len in 0..=MAX_PAYLOAD) {
            let payload = vec![7u8; len];
            let bytes = encode_frame(kind, id, &payload);
            let head: [u8; HEADER] = bytes[..HEADER].try_into()?;
            prop_assert_eq!(parse_head(&head)?, Head { kind, id, len });
            prop_assert_eq!(&bytes[HEADER..], &payload[..]);
        }

        #[test]
        fn oversized_heads_are_refused(kind in any::<u8>(), id in any::<u32>(), extra in 1..=u32::MAX - MAX_PAYLOAD as u32) {
            let mut head = [0u8; HEADER];
            head[0] = kind;
            head[1..5].copy_from_slice(&id.to_le_bytes());
            head[5..].copy_from_slice(&(MAX_PAYLOAD as u32 + extra).to_le_bytes());
            prop_assert!(parse_head(&head).is_err());
        }
    }

    proptest! {
        #![proptest_config(config(24))]

        /// Streams carried guest → host → echo → host → guest come back byte for byte, however
        /// the program writes them and however many run at once.
        #[test]
        fn streams_come_back_byte_for_byte(
            streams in prop::collection::vec((any::<u8>(), 0usize..300_000, 1usize..70_000), 1..5),
        ) {
            let (g, h) = UnixStream::pair()?;
            let guest = Tunnel::over_socket(g, None)?;
            let host = Tunnel::over_socket(h, Some(echo_dial()))?;
            let mut workers = Vec::new();
            for (seed, len, chunk) in streams {
                let (a, b) = UnixStream::pair()?;
                guest.carry(Box::new(b))?;
                let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
                let mut w = a.try_clone()?;
                let sent = data.clone();
                let writer = std::thread::spawn(move || -> io::Result<()> {
                    for piece in sent.chunks(chunk) {
                        w.write_all(piece)?;
                    }
                    w.shutdown(Shutdown::Write)
                });
                workers.push(std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let read = (&a).read_to_end(&mut got);
                    let wrote = writer.join().map_err(|_| io::Error::other("writer panicked"));
                    (read.is_ok() && matches!(wrote, Ok(Ok(()))), got == data)
                }));
            }
            for w in workers {
                let (ok, same) = w.join().map_err(|_| TestCaseError::fail("stream panicked"))?;
                prop_assert!(ok && same, "a stream came back different (io ok: {ok})");
            }
            prop_assert!(wait_until(|| guest.open_streams() == 0 && host.open_streams() == 0));
            host.shutdown();
            guest.shutdown();
        }

        /// Whatever a hostile guest sends, the host's reader never panics: the tunnel ends
        /// cleanly when the guest hangs up, holding no more than the allowed streams.
        #[test]
        fn hostile_frames_end_the_tunnel_cleanly(frames in prop::collection::vec(frame(), 0..40)) {
            let (evil, h) = UnixStream::pair()?;
            let host = Tunnel::over_socket(h, Some(echo_dial()))?;
            let mut drain = evil.try_clone()?;
            let drained = std::thread::spawn(move || io::copy(&mut drain, &mut io::sink()));
            for f in &frames {
                if (&evil).write_all(f).is_err() {
                    break; // the host already cut the tunnel off
                }
            }
            let _ = evil.shutdown(Shutdown::Write);
            prop_assert!(host.open_streams() <= MAX_STREAMS);
            prop_assert!(wait_until(|| host.is_dead()), "the tunnel outlived its channel");
            let _ = evil.shutdown(Shutdown::Both);
            let _ = drained.join();
        }
    }
}
