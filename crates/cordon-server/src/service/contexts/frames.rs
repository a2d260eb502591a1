//! The protocol between the server and a context's driver (`driver.py`, `driver.js`).
//!
//! Requests go to the driver's stdin, one JSON object a line ([`DriverRequest`]). Frames
//! come back on its stdout, one a line: [`MARK`] then the JSON of a [`DriverFrame`]. Bytes
//! on that stdout outside a frame (a JavaScript child process writing to its inherited
//! stdout) are the cell's stdout. A line is the unit of resynchronisation: when the agent
//! dropped bytes of a long-unread stdout, [`FrameReader::gap`] skips to the next line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{CellError, CellStatus};

/// What starts every frame line.
pub(super) const MARK: &[u8] = b"\x1ecordon ";

/// Frames longer than this are dropped (with a warning): a rich output this large does
/// not belong in an API answer.
pub(super) const MAX_FRAME: usize = 32 << 20;

/// A request to the driver.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum DriverRequest<'a> {
    /// Runs `code` as cell `cell`, interrupting it after `timeout_ms`, with `env` set for
    /// the cell only.
    Run {
        cell: u64,
        code: &'a str,
        timeout_ms: u64,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        env: &'a BTreeMap<String, String>,
        /// The cell's error without running it (a TypeScript cell that is not valid
        /// TypeScript): the driver answers it as the cell's.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a CellError>,
    },
    /// Interrupts cell `cell` if it is still running.
    Interrupt { cell: u64 },
}

impl DriverRequest<'_> {
    pub(super) fn line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// A standard stream of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum StreamName {
    Stdout,
    Stderr,
}

/// A frame from the driver.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum DriverFrame {
    /// The interpreter is up and waits for cells.
    Ready {
        lang: String,
        version: String,
        pid: u32,
    },
    /// Output of a cell (`cell` 0: between cells).
    Stream {
        cell: u64,
        name: StreamName,
        text: String,
    },
    /// A rich output: MIME type to data (binary types base64); `main` for the value of the
    /// cell's last expression.
    Display {
        cell: u64,
        data: BTreeMap<String, String>,
        main: bool,
    },
    /// The cell ended; `count` is its number in this interpreter.
    Done {
        cell: u64,
        status: CellStatus,
        error: Option<CellError>,
        count: u64,
    },
}

/// A piece of the driver's stdout.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece {
    /// Bytes outside any frame: stdout of the cell.
    Raw(Vec<u8>),
    Frame(DriverFrame),
    /// A line that began as a frame but was not one (or was too long); the reason.
    Bad(String),
}

/// Splits the driver's stdout into frames and raw bytes, incrementally.
#[derive(Debug, Default)]
pub(super) struct FrameReader {
    buf: Vec<u8>,
    /// How much of a frame in `buf` is known to hold no newline.
    scanned: usize,
    /// Bytes were lost: everything up to the next newline is dropped.
    skipping: bool,
}

impl FrameReader {
    /// Bytes were dropped before the next ones: the line they cut is lost.
    pub(super) fn gap(&mut self) {
        self.buf.clear();
        self.scanned = 0;
        self.skipping = true;
    }

    /// Takes the next bytes of stdout and returns the pieces complete so far.
    pub(super) fn push(&mut self, mut data: &[u8]) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.skipping {
            match memchr::memchr(b'\n', data) {
                Some(i) => {
                    self.skipping = false;
                    data = &data[i + 1..];
                }
                None => return out,
            }
        }
        self.buf.extend_from_slice(data);
        loop {
            match find(&self.buf, MARK) {
                Some(0) => {
                    let Some(end) =
                        memchr::memchr(b'\n', &self.buf[self.scanned..]).map(|i| i + self.scanned)
                    else {
                        self.scanned = self.buf.len();
                        if self.buf.len() > MAX_FRAME {
                            out.push(Piece::Bad(format!(
                                "a rich output larger than {MAX_FRAME} bytes was dropped"
                            )));
                            self.gap();
                        }
                        return out;
                    };
                    self.scanned = 0;
                    let line: Vec<u8> = self.buf.drain(..=end).collect();
                    let json = &line[MARK.len()..line.len() - 1];
                    out.push(match serde_json::from_slice::<DriverFrame>(json) {
                        Ok(f) => Piece::Frame(f),
                        Err(e) => Piece::Bad(format!("an unreadable frame from the driver: {e}")),
                    });
                }
                Some(i) => {
                    out.push(Piece::Raw(self.buf.drain(..i).collect()));
                }
                None => {
                    // Keep a tail that may be the start of a mark.
                    let keep = (1..MARK.len())
                        .rev()
                        .find(|n| self.buf.ends_with(&MARK[..*n]))
                        .unwrap_or(0);
                    let n = self.buf.len() - keep;
                    if n > 0 {
                        out.push(Piece::Raw(self.buf.drain(..n).collect()));
                    }
                    return out;
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(cell: u64) -> Vec<u8> {
        let mut v = MARK.to_vec();
        v.extend_from_slice(
            format!(r#"{{"t":"done","cell":{cell},"status":"ok","error":null,"count":1}}"#)
                .as_bytes(),
        );
        v.push(b'\n');
        v
    }

    #[test]
    fn frames_and_raw_bytes_split_across_reads() {
        let mut all = b"raw out".to_vec();
        all.extend(done(3));
        all.extend(b"tail\n");
        for cut in 0..all.len() {
            let mut r = FrameReader::default();
            let mut pieces = r.push(&all[..cut]);
            pieces.extend(r.push(&all[cut..]));
            let mut raw = Vec::new();
            let mut frames = Vec::new();
            for p in pieces {
                match p {
                    Piece::Raw(b) => raw.extend(b),
                    Piece::Frame(f) => frames.push(f),
                    Piece::Bad(e) => panic!("{e}"),
                }
            }
            assert_eq!(raw, b"raw outtail\n", "cut at {cut}");
            assert_eq!(frames.len(), 1, "cut at {cut}");
            assert!(matches!(frames[0], DriverFrame::Done { cell: 3, .. }));
        }
    }

    #[test]
    fn a_gap_drops_the_cut_line_only() {
        let mut r = FrameReader::default();
        let f = done(1);
        assert!(r.push(&f[..10]).is_empty());
        r.gap();
        let mut rest = f[20..].to_vec();
        rest.extend(done(2));
        let p = r.push(&rest);
        assert_eq!(p.len(), 1);
        assert!(matches!(
            p[0],
            Piece::Frame(DriverFrame::Done { cell: 2, .. })
        ));
    }

    /// Frames of a running driver, read on a thread of their own.
    fn frames_of(mut out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<DriverFrame> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut r = FrameReader::default();
            let mut buf = [0u8; 65536];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    return;
                }
                for p in r.push(&buf[..n]) {
                    if let Piece::Frame(f) = p
                        && tx.send(f).is_err()
                    {
                        return;
                    }
                }
            }
        });
        rx
    }

    /// The next frame that `want` picks, within 30 s.
    fn next_frame(
        rx: &std::sync::mpsc::Receiver<DriverFrame>,
        want: impl Fn(&DriverFrame) -> bool,
    ) -> DriverFrame {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(f) if want(&f) => return f,
                Ok(_) => continue,
                Err(e) => panic!("no frame from the driver: {e}"),
            }
        }
    }

    /// The Python driver itself on the host's python3 (no `FOO` in its environment), once
    /// it said it is ready: the child, its frames and its stdin.
    fn python_driver() -> (
        std::process::Child,
        std::sync::mpsc::Receiver<DriverFrame>,
        std::process::ChildStdin,
    ) {
        let mut child = std::process::Command::new("python3")
            .args(["-c", super::super::PYTHON_DRIVER])
            .env_remove("FOO")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs");
        let rx = frames_of(child.stdout.take().expect("stdout"));
        let stdin = child.stdin.take().expect("stdin");
        next_frame(&rx, |f| matches!(f, DriverFrame::Ready { .. }));
        (child, rx, stdin)
    }

    #[test]
    fn the_servers_interrupt_of_a_cell_past_its_timeout_is_a_timeout() {
        // The Python driver itself, on the host's python3. The server sends its interrupt
        // only when a cell ran past its timeout and the driver's own watchdog had not fired
        // (a starved thread under load); the cell must end `timeout`, not as an error.
        use std::io::Write as _;
        let (mut child, rx, mut stdin) = python_driver();
        let run = DriverRequest::Run {
            cell: 1,
            code: "print('started', flush=True)\nimport time\ntime.sleep(30)",
            timeout_ms: 60_000,
            env: &BTreeMap::new(),
            error: None,
        };
        stdin.write_all(&run.line()).expect("request");
        // The cell is running once its first output is framed.
        next_frame(&rx, |f| matches!(f, DriverFrame::Stream { cell: 1, .. }));
        stdin
            .write_all(&DriverRequest::Interrupt { cell: 1 }.line())
            .expect("interrupt");
        let done = next_frame(&rx, |f| matches!(f, DriverFrame::Done { cell: 1, .. }));
        let _ = child.kill();
        let _ = child.wait();
        let DriverFrame::Done { status, error, .. } = done else {
            unreachable!()
        };
        assert_eq!(status, CellStatus::Timeout, "{error:?}");
    }

    #[test]
    fn a_cells_env_is_set_for_that_cell_only() {
        // The Python driver on the host's python3: FOO is the cell's while it runs; after
        // it, the context's own value (here none) is back, and PATH is untouched.
        use std::io::Write as _;
        let (mut child, rx, mut stdin) = python_driver();
        let env = BTreeMap::from([("FOO".to_string(), "for-the-cell".to_string())]);
        let code = "import os\nprint(os.environ.get('FOO', 'unset'), bool(os.environ.get('PATH')))";
        for (cell, env) in [(1, &env), (2, &BTreeMap::new())] {
            let run = DriverRequest::Run {
                cell,
                code,
                timeout_ms: 10_000,
                env,
                error: None,
            };
            stdin.write_all(&run.line()).expect("request");
        }
        let mut out = [String::new(), String::new()];
        loop {
            match next_frame(&rx, |_| true) {
                DriverFrame::Stream { cell, text, .. } => out[cell as usize - 1].push_str(&text),
                DriverFrame::Done { cell: 2, .. } => break,
                _ => {}
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(out, ["for-the-cell True\n", "unset True\n"]);
    }

    #[test]
    fn unknown_fields_and_bad_json_are_reported_not_trusted() {
        let mut r = FrameReader::default();
        let mut v = MARK.to_vec();
        v.extend_from_slice(br#"{"t":"ready","lang":"python","version":"3","pid":1,"x":1}"#);
        v.push(b'\n');
        v.extend_from_slice(MARK);
        v.extend_from_slice(b"{not json\n");
        let p = r.push(&v);
        assert_eq!(p.len(), 2);
        assert!(p.iter().all(|p| matches!(p, Piece::Bad(_))));
    }

    #[test]
    fn requests_are_one_line() {
        let l = DriverRequest::Run {
            cell: 1,
            code: "a\nb",
            timeout_ms: 5,
            env: &BTreeMap::new(),
            error: None,
        }
        .line();
        assert_eq!(
            l,
            b"{\"op\":\"run\",\"cell\":1,\"code\":\"a\\nb\",\"timeout_ms\":5}\n"
        );
    }
}
