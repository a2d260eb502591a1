//! The host–agent wire protocol, version [`PROTOCOL_VERSION`].
//!
//! A frame is `u32 LE total length | u32 LE header length | header (JSON) | body (bytes)`,
//! where total length counts the header length field, the header and the body. Headers are
//! small JSON messages ([`Request`] from the host, [`Reply`] from the agent); bodies carry raw
//! bytes (file contents, output chunks). Every length is bounded: a frame that claims more
//! than [`MAX_FRAME`] bytes, a header over [`MAX_HEADER`], a header that is not valid JSON of
//! the expected type, or unknown fields, are rejected — whichever side sends them.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Bumped on any incompatible change; both sides refuse a different version.
pub const PROTOCOL_VERSION: u32 = 3;
/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;
/// Largest JSON header either side accepts.
pub const MAX_HEADER: usize = 1 << 20;
/// Named in [`Reply::Configured`] by agents that serve [`Request::FileOp`], [`Request::PutArchive`]
/// and [`Request::GetArchive`].
pub const FEATURE_FILES: &str = "files";
/// Named in [`Reply::Configured`] by agents that serve [`Request::Watch`].
pub const FEATURE_WATCH: &str = "watch";

/// Where a tier whose agent channel carries no descriptors binds the directory of the
/// sockets a [`Request::PortDial`] names: the egress socket's directory (a sandbox with
/// egress has both there; one without gets a directory of its own at the same place, a
/// mount point every root and template has).
pub const PORTS_DIR: &str = "/run/cordon";
/// `TERM` of a program on a pseudo-terminal unless its request sets one.
pub const PTY_TERM: &str = "xterm-256color";
/// The largest piece of an archive one frame carries.
pub const ARCHIVE_CHUNK: usize = 256 << 10;

/// Errors of the wire protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("agent channel closed")]
    Closed,
    #[error("agent channel I/O: {0}")]
    Io(#[from] io::Error),
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// How the agent wires a program's standard streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdioMode {
    /// Three descriptors (stdin, stdout, stderr) came with the request (`SCM_RIGHTS`); the
    /// host reads and writes them directly.
    Passed,
    /// The agent relays the streams as [`Reply::Output`] frames and [`Request::Stdin`] frames.
    Framed,
}

/// Resource limits the agent applies to each program it starts (a second layer under the
/// tier's own walls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcLimits {
    pub open_files: u64,
    /// Largest file a program may write, in bytes (RLIMIT_FSIZE).
    pub file_size: u64,
    /// Address-space cap per process in bytes, 0 for none.
    pub address_space: u64,
    /// Most processes and threads the sandbox user may have at once (`RLIMIT_NPROC`), 0
    /// for none: the gVisor tier's process limit (a pids cgroup would count the sentry's
    /// own threads). Tiers with a pids cgroup leave it 0 and it is not sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub processes: u64,
}

/// Who a program runs as inside the sandbox's user namespace (the type every tier's
/// `Sandbox` takes, carried on the wire as it is).
pub use cordon_core::ProcUser;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn framed() -> StdioMode {
    StdioMode::Framed
}

fn is_framed(m: &StdioMode) -> bool {
    *m == StdioMode::Framed
}

/// Host → agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Hello {
        version: u32,
    },
    /// Start a program. Only one exec runs at a time.
    Exec {
        id: u64,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        stdio: StdioMode,
        limits: ProcLimits,
        /// No exec follows: the agent readies no reaper for a next one (new in version 2).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        last: bool,
    },
    /// Bytes for the running program's stdin (framed mode); an empty body closes stdin.
    Stdin {
        id: u64,
    },
    /// Kill the program and everything it started.
    Kill {
        id: u64,
    },
    /// Write the body to a file under /work (created or replaced; never through a symlink).
    PutFile {
        path: String,
        mode: u32,
    },
    /// Read a file under /work, at most `max` bytes (never through a symlink).
    GetFile {
        path: String,
        max: u64,
    },
    /// A [`cordon_core::FileOp`] on /work; answered by [`Reply::Files`] (agents whose hello
    /// lists [`FEATURE_FILES`]).
    FileOp {
        op: cordon_core::FileOp,
    },
    /// Extract the tar stream that follows, as [`Request::ArchiveData`] frames ending with
    /// an empty one, into the directory `path` under /work, at most `budget` bytes; answered
    /// by [`Reply::Archive`] once the whole stream was read, whatever happened to it.
    PutArchive {
        path: String,
        budget: u64,
    },
    /// A piece of an upload's tar stream (the body); an empty body ends it.
    ArchiveData,
    /// Write the directory `path` under /work as a tar stream: [`Reply::ArchiveData`]
    /// frames, then [`Reply::Archive`] (or [`Reply::Error`]). At most `max` bytes of file
    /// contents.
    GetArchive {
        path: String,
        max: u64,
    },
    /// Start a program in the background (new in version 3): its stdio are the agent's
    /// pipes, its output kept in the agent (the last [`cordon_core::BACKGROUND_KEEP`] bytes
    /// of each stream) for [`Request::BgRead`]; it runs beside the foreground exec and
    /// other background ones. Answered by [`Reply::Started`] at once.
    BgExec {
        id: u64,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        limits: ProcLimits,
        /// Run it on a pseudo-terminal of this size, allocated in the sandbox's own devpts:
        /// its stdin, stdout and stderr and its controlling terminal; what it writes is
        /// stdout, its stderr stays empty. `TERM` defaults to [`PTY_TERM`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pty: Option<cordon_core::PtySize>,
        /// [`StdioMode::Passed`]: three descriptors came with the request (`SCM_RIGHTS`) and
        /// are the program's stdin, stdout and stderr themselves; nothing of its I/O passes
        /// through the agent and [`Request::BgRead`] reports only its end. With `pty` too,
        /// they are one terminal the host opened in the sandbox's own devpts, which the
        /// program takes as its controlling terminal (its size is the host's to set).
        /// Absent: [`StdioMode::Framed`], the agent's pipes as above.
        #[serde(default = "framed", skip_serializing_if = "is_framed")]
        stdio: StdioMode,
        /// Run it as this user instead of the sandbox's (an OCI image's `process.user`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<ProcUser>,
        /// Keep every byte of its output (framed stdio): the agent stops reading a stream
        /// while it holds [`cordon_core::BACKGROUND_KEEP`] bytes of it not yet read, so the
        /// program waits on its pipe instead of its output being dropped, and a
        /// [`Request::BgRead`] from an offset releases what lies before it. For a host
        /// that relays the output to a reader of its own (cordon-oci).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
    },
    /// The new window size of background exec `id`'s pseudo-terminal (its program gets
    /// `SIGWINCH`); answered by [`Reply::Ok`], or an error for an exec without one.
    BgResize {
        id: u64,
        size: cordon_core::PtySize,
    },
    /// Output of background exec `id` from the given stream offsets, at most `max` bytes
    /// of each; answered by [`Reply::BgOutput`].
    BgRead {
        id: u64,
        stdout_from: u64,
        stderr_from: u64,
        max: u64,
    },
    /// Bytes (the body) for background exec `id`'s stdin; an empty body closes it.
    BgStdin {
        id: u64,
    },
    /// A signal for background exec `id`'s whole process tree.
    BgSignal {
        id: u64,
        signal: cordon_core::ProcSignal,
    },
    /// Signal number `signal` (1 to 64) for background exec `id`'s program itself, as if
    /// sent to it alone (`all`: to every process of the exec). Answered by [`Reply::Ok`].
    BgRaise {
        id: u64,
        signal: i32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    /// Connect the stream socket that came with the request (`SCM_RIGHTS`) to `port` on
    /// the sandbox's own loopback: the agent's port relay connects `127.0.0.1:port` (or
    /// `[::1]:port`), writes [`cordon_core::PORT_CONNECTED`] (or another byte when nothing
    /// listens there, and ends it) on the socket, then relays bytes both ways. Answered by
    /// [`Reply::Ok`] once the relay has the socket. Agents on a socket channel only.
    PortOpen {
        port: u16,
    },
    /// [`Request::PortOpen`] for an agent whose channel carries no descriptors (the gvisor
    /// tier's pipes): the agent connects the unix socket the host listens on at `socket`, a
    /// name in [`PORTS_DIR`] (a directory the tier binds in read-only), and hands that
    /// connection to its port relay as if it had come with the request. Answered by
    /// [`Reply::Ok`] once the relay has it, so the host's accept finds it waiting.
    PortDial {
        port: u16,
        socket: String,
    },
    /// A [`cordon_core::WatchOp`] on the sandbox's directory watchers; answered by
    /// [`Reply::Watch`] (agents whose features list [`FEATURE_WATCH`]).
    Watch {
        op: cordon_core::WatchOp,
    },
    /// Stop serving and exit.
    Shutdown,
    /// Per-sandbox settings for an agent that may have been started from a snapshot shared
    /// by many sandboxes (the microVM tier): identity, limits, clock. The body carries fresh
    /// random bytes the agent mixes into the guest kernel's randomness before it reseeds.
    /// Agents that take no configuration refuse it.
    Configure {
        hostname: String,
        /// Memory limit of each exec's process tree (a cgroup inside the guest), in bytes.
        memory_bytes: u64,
        /// Most processes and threads of each exec at once.
        pids: u32,
        /// Sizes of /work and /tmp, in bytes.
        disk_bytes: u64,
        tmp_bytes: u64,
        /// The host's wall clock, in milliseconds since the Unix epoch.
        unix_time_ms: u64,
        /// The egress path, when the sandbox has one; without it the guest keeps no route.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress: Option<EgressSetup>,
    },
}

/// The virtio-serial port a microVM's egress streams travel on ([`crate::tunnel`]).
pub const EGRESS_PORT_NAME: &str = "cordon.egress";
/// Where a microVM guest keeps the per-sandbox CA certificate (its root is read-only).
pub const GUEST_CA_CERT_PATH: &str = "/run/cordon/egress-ca.pem";
/// The container tier's own boot id, bound over `/proc/sys/kernel/random/boot_id` in each
/// exec's `/proc` ([`crate::AgentConfig::boot_id`]).
pub const BOOT_ID_INSIDE: &str = "/run/cordon/boot_id";

/// Where a native sandbox finds its egress proxy's unix socket (bound in from the host); a
/// forwarder relays the sandbox's `127.0.0.1:<port>` to it.
pub const EGRESS_SOCKET_INSIDE: &str = "/run/cordon/egress.sock";
/// Where a microVM guest keeps the CA bundle programs trust (that CA plus the host's roots).
pub const GUEST_CA_BUNDLE_PATH: &str = "/run/cordon/ca-bundle.pem";

/// What a guest needs for its egress path: a forwarder on `127.0.0.1:<port>` that carries
/// each connection over the [`EGRESS_PORT_NAME`] port to the host's proxy, and the CA files
/// (written at [`GUEST_CA_CERT_PATH`] and [`GUEST_CA_BUNDLE_PATH`]). No secret is in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSetup {
    pub port: u16,
    pub ca_cert_pem: String,
    pub ca_bundle_pem: String,
}

/// Agent → host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Hello {
        version: u32,
        agent: String,
    },
    /// The answer to [`Request::Configure`] from agents that list what they can do beyond
    /// the protocol version's core ([`FEATURE_FILES`]); older agents answer [`Reply::Ok`].
    /// (A microVM restored from a snapshot never says hello again, so this is where the
    /// host learns what its agent can do.)
    Configured {
        features: Vec<String>,
    },
    Started {
        id: u64,
    },
    /// A chunk of output (framed mode); the body holds the bytes.
    Output {
        id: u64,
        stream: Stream,
    },
    /// The program and every process it started are gone.
    Exited {
        id: u64,
        code: Option<i32>,
        signal: Option<i32>,
        cpu_us: u64,
        max_rss_bytes: u64,
        /// /work or /tmp had no space left when the program ended.
        disk_full: bool,
        /// The agent's own per-exec cgroup saw an OOM kill (agents that keep one).
        #[serde(default)]
        oom_killed: bool,
        /// The agent's own per-exec cgroup refused a fork at its process limit.
        #[serde(default)]
        pids_limited: bool,
        /// The program's own time, from its hand-off (or fork) to its exit, in µs.
        #[serde(default)]
        program_us: u64,
    },
    /// Output of a background exec: the body holds `stdout_len` bytes of stdout from offset
    /// `stdout_from`, then stderr's from `stderr_from`; `exit` once it has ended and all of
    /// its output was read.
    BgOutput {
        stdout_from: u64,
        stdout_len: u64,
        stderr_from: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit: Option<cordon_core::ProcExit>,
    },
    /// The body holds the file's bytes; `truncated` when it was larger than asked.
    File {
        truncated: bool,
    },
    /// The answer to [`Request::FileOp`]: the body holds a [`cordon_core::FileReply`] as
    /// JSON (a listing may be larger than a header may be).
    Files,
    /// A piece of a download's tar stream (the body).
    ArchiveData,
    /// The answer to [`Request::Watch`]: the body holds a [`cordon_core::WatchReply`] as
    /// JSON.
    Watch,
    /// An archive moved: the body holds a [`cordon_core::ArchiveReport`] as JSON.
    Archive,
    Ok,
    Error {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Stable error codes the agent reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    PathRefused,
    NotFound,
    Busy,
    SpawnFailed,
    Io,
    VersionMismatch,
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<T> {
    pub header: T,
    pub body: Vec<u8>,
}

/// Encodes a frame into bytes ready to send.
pub fn encode<T: Serialize>(header: &T, body: &[u8]) -> Result<Vec<u8>, ProtoError> {
    let h = serde_json::to_vec(header)
        .map_err(|e| ProtoError::Malformed(format!("cannot encode header: {e}")))?;
    if h.len() > MAX_HEADER {
        return Err(ProtoError::Malformed(format!(
            "header of {} bytes exceeds {MAX_HEADER}",
            h.len()
        )));
    }
    let total = 4 + h.len() + body.len();
    if total > MAX_FRAME {
        return Err(ProtoError::Malformed(format!(
            "frame of {total} bytes exceeds {MAX_FRAME}; send large files in pieces"
        )));
    }
    let mut out = Vec::with_capacity(4 + total);
    out.extend_from_slice(&(total as u32).to_le_bytes());
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(body);
    Ok(out)
}

/// Writes one frame.
pub fn write_frame<T: Serialize>(
    w: &mut impl Write,
    header: &T,
    body: &[u8],
) -> Result<(), ProtoError> {
    let bytes = encode(header, body)?;
    w.write_all(&bytes)?;
    Ok(())
}

/// Decodes the part of a frame after its 4-byte total length.
pub fn decode_payload<T: DeserializeOwned>(payload: Vec<u8>) -> Result<Frame<T>, ProtoError> {
    if payload.len() < 4 {
        return Err(ProtoError::Malformed(
            "frame shorter than its header length".into(),
        ));
    }
    let hlen = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
    if hlen > MAX_HEADER || 4 + hlen > payload.len() {
        return Err(ProtoError::Malformed(format!(
            "header length {hlen} does not fit the frame of {} bytes",
            payload.len()
        )));
    }
    let header: T = serde_json::from_slice(&payload[4..4 + hlen])
        .map_err(|e| ProtoError::Malformed(format!("bad header: {e}")))?;
    let body = payload[4 + hlen..].to_vec();
    Ok(Frame { header, body })
}

/// Reads the 4-byte total length that starts a frame and checks it.
pub fn check_total(len_bytes: [u8; 4]) -> Result<usize, ProtoError> {
    let total = u32::from_le_bytes(len_bytes) as usize;
    if !(4..=MAX_FRAME).contains(&total) {
        return Err(ProtoError::Malformed(format!(
            "frame length {total} outside 4..={MAX_FRAME}"
        )));
    }
    Ok(total)
}

/// Reads one whole frame (blocking).
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> Result<Frame<T>, ProtoError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtoError::Closed),
        Err(e) => return Err(e.into()),
    }
    let total = check_total(len)?;
    let mut payload = vec![0u8; total];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ProtoError::Malformed("frame cut short".into())
        } else {
            e.into()
        }
    })?;
    decode_payload(payload)
}

/// Incremental decoder for non-blocking readers: feed bytes, take whole frames.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
}

impl FrameBuffer {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole frame, if one has arrived; an error for a malformed one.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<Frame<T>>, ProtoError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let total = check_total([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])?;
        if self.buf.len() < 4 + total {
            return Ok(None);
        }
        let payload = self.buf[4..4 + total].to_vec();
        self.buf.drain(..4 + total);
        decode_payload(payload).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let req = Request::PutFile {
            path: "a.txt".into(),
            mode: 0o644,
        };
        let bytes = encode(&req, b"hello").unwrap();
        let f: Frame<Request> = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(f.header, req);
        assert_eq!(f.body, b"hello");
    }

    #[test]
    fn a_terminal_travels_with_a_background_start_and_a_resize() {
        let size = cordon_core::PtySize { rows: 24, cols: 80 };
        let start = Request::BgExec {
            id: 3,
            argv: vec!["sh".into()],
            env: BTreeMap::new(),
            cwd: "/work".into(),
            limits: ProcLimits {
                open_files: 64,
                file_size: 1 << 20,
                address_space: 0,
                processes: 0,
            },
            pty: Some(size),
            stdio: StdioMode::Framed,
            user: None,
            hold: true,
        };
        for req in [start, Request::BgResize { id: 3, size }] {
            let bytes = encode(&req, b"").unwrap();
            assert_eq!(read_frame::<Request>(&mut &bytes[..]).unwrap().header, req);
        }
        // A start without one says nothing of it (what an agent before it reads), and a
        // size with a stray field is refused.
        let plain = serde_json::json!({"type": "bg_exec", "id": 1, "argv": ["true"], "env": {},
            "cwd": "/work", "limits": {"open_files": 1, "file_size": 1, "address_space": 0}});
        let f: Request = serde_json::from_value(plain).unwrap();
        assert!(matches!(
            f,
            Request::BgExec {
                pty: None,
                stdio: StdioMode::Framed,
                ..
            }
        ));
        let said = serde_json::to_string(&f).unwrap();
        assert!(
            !said.contains("pty") && !said.contains("stdio") && !said.contains("hold"),
            "{said}"
        );
        // Passed descriptors and a raised signal say so.
        let passed = serde_json::json!({"type": "bg_exec", "id": 1, "argv": ["true"], "env": {},
            "cwd": "/work", "limits": {"open_files": 1, "file_size": 1, "address_space": 0},
            "stdio": "passed"});
        let f: Request = serde_json::from_value(passed).unwrap();
        assert!(matches!(
            f,
            Request::BgExec {
                stdio: StdioMode::Passed,
                ..
            }
        ));
        let raise = Request::BgRaise {
            id: 1,
            signal: 10,
            all: false,
        };
        let bytes = encode(&raise, b"").unwrap();
        assert_eq!(
            read_frame::<Request>(&mut &bytes[..]).unwrap().header,
            raise
        );
        let odd = serde_json::json!({"type": "bg_resize", "id": 1,
            "size": {"rows": 1, "cols": 1, "x": 0}});
        assert!(serde_json::from_value::<Request>(odd).is_err());
    }

    #[test]
    fn file_ops_and_an_old_hello_decode() {
        let req = Request::FileOp {
            op: cordon_core::FileOp::Remove {
                path: "/work/a".into(),
                recursive: true,
            },
        };
        let bytes = encode(&req, b"").unwrap();
        assert_eq!(read_frame::<Request>(&mut &bytes[..]).unwrap().header, req);
        let configured = encode(
            &serde_json::json!({"type": "configured", "features": [FEATURE_FILES]}),
            b"",
        )
        .unwrap();
        assert!(matches!(
            read_frame::<Reply>(&mut &configured[..]).unwrap().header,
            Reply::Configured { features } if features == [FEATURE_FILES]
        ));
    }

    #[test]
    fn rejects_malformed_frames() {
        // Claims 4 GiB.
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Request>(&mut r),
            Err(ProtoError::Malformed(_))
        ));
        // Header length larger than the frame.
        let mut bad = Vec::new();
        bad.extend_from_slice(&8u32.to_le_bytes());
        bad.extend_from_slice(&100u32.to_le_bytes());
        bad.extend_from_slice(b"{}{}");
        assert!(matches!(
            read_frame::<Request>(&mut &bad[..]),
            Err(ProtoError::Malformed(_))
        ));
        // Valid JSON, unknown message type.
        let bytes = encode(&serde_json::json!({"type": "format_disk"}), b"").unwrap();
        assert!(read_frame::<Request>(&mut &bytes[..]).is_err());
        // Unknown field on a known message.
        let bytes = encode(
            &serde_json::json!({"type": "kill", "id": 1, "all": true}),
            b"",
        )
        .unwrap();
        assert!(read_frame::<Request>(&mut &bytes[..]).is_err());
        // Cut short.
        let bytes = encode(&Request::Shutdown, b"abc").unwrap();
        assert!(read_frame::<Request>(&mut &bytes[..bytes.len() - 1]).is_err());
        // Empty input is a clean close.
        assert!(matches!(
            read_frame::<Request>(&mut &[][..]),
            Err(ProtoError::Closed)
        ));
    }

    #[test]
    fn frame_buffer_splits_and_joins() {
        let a = encode(&Reply::Ok, b"").unwrap();
        let b = encode(&Reply::File { truncated: false }, b"xyz").unwrap();
        let mut all = a.clone();
        all.extend_from_slice(&b);
        let mut fb = FrameBuffer::default();
        fb.push(&all[..3]);
        assert!(fb.next_frame::<Reply>().unwrap().is_none());
        fb.push(&all[3..]);
        assert_eq!(fb.next_frame::<Reply>().unwrap().unwrap().header, Reply::Ok);
        let f = fb.next_frame::<Reply>().unwrap().unwrap();
        assert_eq!(f.body, b"xyz");
        assert!(fb.next_frame::<Reply>().unwrap().is_none());
    }
}

/// Bounded fuzzing of the frame codec (docs/fuzzing.md); `CORDON_FUZZ_CASES` runs longer.
#[cfg(test)]
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::config;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), "[a-z/._\"\\\\]{0,12}"]
    }

    fn limits() -> impl Strategy<Value = ProcLimits> {
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(open_files, file_size, a, processes)| ProcLimits {
                open_files,
                file_size,
                address_space: a,
                processes,
            },
        )
    }

    fn egress() -> impl Strategy<Value = Option<EgressSetup>> {
        proptest::option::of(
            (any::<u16>(), text(), text()).prop_map(|(port, c, b)| EgressSetup {
                port,
                ca_cert_pem: c,
                ca_bundle_pem: b,
            }),
        )
    }

    fn request() -> impl Strategy<Value = Request> {
        let exec = (
            any::<u64>(),
            prop::collection::vec(text(), 0..4),
            prop::collection::btree_map(text(), text(), 0..4),
            text(),
            prop_oneof![Just(StdioMode::Passed), Just(StdioMode::Framed)],
            limits(),
            any::<bool>(),
        )
            .prop_map(|(id, argv, env, cwd, stdio, limits, last)| Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdio,
                limits,
                last,
            });
        let configure = (
            text(),
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            ),
            egress(),
        )
            .prop_map(
                |(hostname, (m, pids, d, t, now), egress)| Request::Configure {
                    hostname,
                    memory_bytes: m,
                    pids,
                    disk_bytes: d,
                    tmp_bytes: t,
                    unix_time_ms: now,
                    egress,
                },
            );
        prop_oneof![
            any::<u32>().prop_map(|version| Request::Hello { version }),
            exec,
            any::<u64>().prop_map(|id| Request::Stdin { id }),
            any::<u64>().prop_map(|id| Request::Kill { id }),
            (text(), any::<u32>()).prop_map(|(path, mode)| Request::PutFile { path, mode }),
            (text(), any::<u64>()).prop_map(|(path, max)| Request::GetFile { path, max }),
            Just(Request::Shutdown),
            configure,
        ]
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let code = prop_oneof![
            Just(ErrorCode::BadRequest),
            Just(ErrorCode::PathRefused),
            Just(ErrorCode::NotFound),
            Just(ErrorCode::Busy),
            Just(ErrorCode::SpawnFailed),
            Just(ErrorCode::Io),
            Just(ErrorCode::VersionMismatch),
        ];
        let exited = (
            (any::<u64>(), any::<Option<i32>>(), any::<Option<i32>>()),
            (any::<u64>(), any::<u64>(), any::<u64>()),
            (any::<bool>(), any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |((id, code, signal), (cpu_us, rss, program_us), (d, o, p))| Reply::Exited {
                    id,
                    code,
                    signal,
                    cpu_us,
                    max_rss_bytes: rss,
                    disk_full: d,
                    oom_killed: o,
                    pids_limited: p,
                    program_us,
                },
            );
        prop_oneof![
            (any::<u32>(), text()).prop_map(|(version, agent)| Reply::Hello { version, agent }),
            any::<u64>().prop_map(|id| Reply::Started { id }),
            (any::<u64>(), any::<bool>()).prop_map(|(id, err)| Reply::Output {
                id,
                stream: if err { Stream::Stderr } else { Stream::Stdout },
            }),
            exited,
            any::<bool>().prop_map(|truncated| Reply::File { truncated }),
            Just(Reply::Ok),
            (code, text()).prop_map(|(code, message)| Reply::Error { code, message }),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..300)
    }

    /// Feeds `bytes` to a frame buffer in pieces cut at `cuts`: the frames taken as they
    /// came, and the error that stopped it, if one did.
    fn split_decode<T: DeserializeOwned>(
        bytes: &[u8],
        cuts: &[usize],
    ) -> (Vec<Frame<T>>, Option<ProtoError>) {
        let mut fb = FrameBuffer::default();
        let mut out = Vec::new();
        let mut at = 0;
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        ends.push(bytes.len());
        ends.sort_unstable();
        for end in ends {
            fb.push(&bytes[at..end]);
            at = end;
            loop {
                match fb.next_frame() {
                    Ok(Some(f)) => out.push(f),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e)),
                }
            }
        }
        (out, None)
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn requests_round_trip_whole_and_in_pieces(
            frames in prop::collection::vec((request(), body()), 1..6),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut wire = Vec::new();
            for (h, b) in &frames {
                let one = encode(h, b)?;
                let f: Frame<Request> = read_frame(&mut &one[..])?;
                prop_assert_eq!(&f.header, h);
                prop_assert_eq!(&f.body, b);
                wire.extend_from_slice(&one);
            }
            let (got, err) = split_decode::<Request>(&wire, &cuts);
            prop_assert!(err.is_none(), "{err:?}");
            let want: Vec<Frame<Request>> = frames
                .into_iter()
                .map(|(header, body)| Frame { header, body })
                .collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn replies_round_trip_in_pieces(
            frames in prop::collection::vec((reply(), body()), 1..6),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut wire = Vec::new();
            for (h, b) in &frames {
                wire.extend_from_slice(&encode(h, b)?);
            }
            let (got, err) = split_decode::<Reply>(&wire, &cuts);
            prop_assert!(err.is_none(), "{err:?}");
            let want: Vec<Frame<Reply>> = frames
                .into_iter()
                .map(|(header, body)| Frame { header, body })
                .collect();
            prop_assert_eq!(got, want);
        }

        /// Arbitrary bytes, or a valid frame with bytes flipped: never a panic, and whole
        /// reads and piecewise reads agree on the first frame.
        #[test]
        fn hostile_bytes_never_panic_and_both_readers_agree(
            seed in (request(), body()),
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            junk in prop::collection::vec(any::<u8>(), 0..64),
            use_junk in any::<bool>(),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut bytes = if use_junk { junk } else { encode(&seed.0, &seed.1)? };
            if !bytes.is_empty() {
                for (at, x) in flips {
                    let n = bytes.len();
                    bytes[at % n] ^= x;
                }
            }
            let whole = read_frame::<Request>(&mut &bytes[..]);
            let (frames, _) = split_decode::<Request>(&bytes, &cuts);
            match whole {
                Ok(f) => prop_assert_eq!(frames.first(), Some(&f)),
                Err(_) => prop_assert!(frames.is_empty()),
            }
        }
    }
}
