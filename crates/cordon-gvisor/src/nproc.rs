//! Seeing the process limit refuse a fork.
//!
//! Processes are bounded by `RLIMIT_NPROC`, which gVisor's kernel enforces per user inside
//! the sandbox (threads count too): a fork or thread creation past it fails with `EAGAIN`.
//! Nothing on the host counts those refusals, so the sentry tells us: runsc traces only the
//! process-creating system calls (`--strace --strace-syscalls=clone,fork,vfork,clone3`) and
//! writes its log into a FIFO that Cordon reads while the exec runs. A traced call that
//! returned `errno=11` is a refusal. The FIFO keeps the log off the disk however many forks a
//! program tries.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::GvisorError;

/// How long the idle reader waits for the log at a time (also how late it sees a stop).
const IDLE_WAIT_MS: u8 = 25;

/// The system calls runsc is asked to trace.
pub const TRACED: &str = "clone,fork,vfork,clone3";

/// Forks refused so far in one exec (since the last [`NprocWatch::reset`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Refusals {
    pub count: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

/// Reads the sentry's log FIFO on a thread of its own.
pub struct NprocWatch {
    fifo: PathBuf,
    stop: Arc<AtomicBool>,
    /// Written once to wake the reader when `stop` is set (it would otherwise notice only
    /// at its next idle timeout, which a destroy used to wait out: ~20 ms).
    wake: Option<std::os::fd::OwnedFd>,
    seen: Arc<Mutex<Refusals>>,
    /// One byte per [`NprocWatch::sync`] asks the reader to drain the log and say so.
    sync_tx: std::os::fd::OwnedFd,
    asked: AtomicU64,
    /// How many sync requests the reader has answered, after draining the log.
    answered: Arc<(Mutex<u64>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// A host call on `path` that failed: the path goes to the operator's log, the error (what
/// and why, no path) to the caller.
fn host_path_error(what: &'static str, path: &Path, source: std::io::Error) -> GvisorError {
    tracing::warn!(path = %path.display(), "gvisor: {what}: {source}");
    GvisorError::Host { what, source }
}

impl NprocWatch {
    /// Makes the FIFO at `fifo` and starts reading it.
    pub fn start(fifo: &Path) -> Result<NprocWatch, GvisorError> {
        let _ = std::fs::remove_file(fifo);
        nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| host_path_error("making the sentry log's FIFO", fifo, e.into()))?;
        // Opened for reading without blocking, so runsc's open for writing finds a reader
        // and our open does not wait for a writer.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(fifo)
            .map_err(|e| host_path_error("opening the sentry log's FIFO", fifo, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Refusals::default()));
        let (wake_rx, wake) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| GvisorError::Host {
                what: "making the log reader's wake pipe",
                source: e.into(),
            })?;
        let (sync_rx, sync_tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(|e| GvisorError::Host {
                    what: "making the log reader's sync pipe",
                    source: e.into(),
                })?;
        let answered = Arc::new((Mutex::new(0u64), Condvar::new()));
        let (stop2, seen2, answered2) = (stop.clone(), seen.clone(), answered.clone());
        let thread = std::thread::Builder::new()
            .name("gvisor-nproc".into())
            .spawn(move || {
                let ends = Ends {
                    wake: &wake_rx,
                    sync: &sync_rx,
                    answered: &answered2,
                };
                read_log(file, &ends, &stop2, &seen2)
            })
            .map_err(|source| GvisorError::Host {
                what: "starting the log reader",
                source,
            })?;
        Ok(NprocWatch {
            fifo: fifo.to_path_buf(),
            stop,
            wake: Some(wake),
            seen,
            sync_tx,
            asked: AtomicU64::new(0),
            answered,
            thread: Some(thread),
        })
    }

    /// Waits (at most `patience`) until the reader has read everything the sentry wrote
    /// before this call. The sentry logs a refused fork as the call returns, before the
    /// program can exit, but the reader thread may not have run since: without this, an
    /// exec that ended at its first refusal was now and then counted as an ordinary exit.
    pub fn sync(&self, patience: Duration) {
        let n = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        if nix::unistd::write(&self.sync_tx, &[1]).is_err() {
            return;
        }
        let (done, cv) = &*self.answered;
        let guard = done.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = cv
            .wait_timeout_while(guard, patience, |answered| *answered < n)
            .unwrap_or_else(PoisonError::into_inner);
    }

    pub fn refusals(&self) -> Refusals {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the refusals seen so far: one live sandbox runs many execs, each counted from
    /// its own start.
    pub fn reset(&self) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Refusals::default();
    }

    /// Stops reading (after draining what runsc wrote) and removes the FIFO.
    pub fn finish(mut self) -> Refusals {
        self.stop_now();
        self.refusals()
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Closing the write end wakes the reader's poll (the read end hangs up).
        self.wake = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.fifo);
    }
}

impl Drop for NprocWatch {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The reader's other descriptors: the stop's wake pipe and the sync requests.
struct Ends<'a> {
    wake: &'a std::os::fd::OwnedFd,
    sync: &'a std::os::fd::OwnedFd,
    answered: &'a (Mutex<u64>, Condvar),
}

fn read_log(mut file: std::fs::File, ends: &Ends<'_>, stop: &AtomicBool, seen: &Mutex<Refusals>) {
    let wake = ends.wake;
    let mut buf = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    // Sync requests taken but not yet answered: answered after the next read that finds
    // nothing more, which comes after the request was made.
    let mut pending = 0u64;
    loop {
        // Read the flag before reading, so the last read after it was set drains everything.
        let stopping = stop.load(Ordering::SeqCst);
        match file.read(&mut buf) {
            Ok(n) if n > 0 => {
                for &b in &buf[..n] {
                    if b == b'\n' {
                        if is_refusal(&String::from_utf8_lossy(&line)) {
                            let now = Instant::now();
                            let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
                            s.count += 1;
                            s.first.get_or_insert(now);
                            s.last = Some(now);
                        }
                        line.clear();
                    } else if line.len() < 4096 {
                        line.push(b);
                    }
                }
                continue;
            }
            // No data: no writer yet, runsc gone (EOF), or nothing new (EAGAIN).
            _ => {
                if stopping {
                    answer(ends.answered, pending);
                    return;
                }
                // This read found nothing more, and it came after the pending requests were
                // taken: everything written before them has been read.
                answer(ends.answered, pending);
                pending = 0;
                let mut bytes = [0u8; 64];
                let got = nix::unistd::read(ends.sync, &mut bytes).unwrap_or(0);
                if got > 0 {
                    // Read the log once more before answering.
                    pending = got as u64;
                    continue;
                }
                // Wait for data without spinning: a live sandbox holds this reader for its
                // whole life, mostly idle. poll wakes at once for data, a stop or a sync
                // request; with the writer gone (hang-up alone) the log would wake it at
                // once too, so then only the stop and sync requests are waited for.
                let mut fds = [
                    PollFd::new(file.as_fd(), PollFlags::POLLIN),
                    PollFd::new(wake.as_fd(), PollFlags::POLLIN),
                    PollFd::new(ends.sync.as_fd(), PollFlags::POLLIN),
                ];
                let woke = poll(&mut fds, PollTimeout::from(IDLE_WAIT_MS));
                let data = fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLIN));
                let stopped = fds[1].revents().is_some_and(|r| !r.is_empty());
                let asked = fds[2].revents().is_some_and(|r| !r.is_empty());
                if !stopped
                    && !asked
                    && ((matches!(woke, Ok(n) if n > 0) && !data) || woke.is_err())
                {
                    let mut idle = [
                        PollFd::new(wake.as_fd(), PollFlags::POLLIN),
                        PollFd::new(ends.sync.as_fd(), PollFlags::POLLIN),
                    ];
                    if poll(&mut idle, PollTimeout::from(IDLE_WAIT_MS)).is_err() {
                        std::thread::sleep(Duration::from_millis(u64::from(IDLE_WAIT_MS)));
                    }
                }
            }
        }
    }
}

fn answer(answered: &(Mutex<u64>, Condvar), n: u64) {
    if n == 0 {
        return;
    }
    let (done, cv) = answered;
    *done.lock().unwrap_or_else(PoisonError::into_inner) += n;
    cv.notify_all();
}

/// True for a strace exit line of a traced call that failed with `EAGAIN`, e.g.
/// `... strace.go:611] [   1:   1] python3 X clone(...) = 0 (0x0) errno=11 (try again) (5µs)`.
/// The task name before ` X ` is the program's to choose but is at most 15 bytes and comes
/// before the call, so it cannot forge the result that ends the line.
pub fn is_refusal(line: &str) -> bool {
    let Some(x) = line.find(" X ") else {
        return false;
    };
    let call = &line[x + 3..];
    let traced = TRACED.split(',').any(|name| {
        call.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('('))
    });
    traced
        && line
            .rfind(") = ")
            .is_some_and(|r| line[r..].contains(" errno=11 "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tenant's error names the step and keeps the host's error as its source, but not
    /// the FIFO's host path (it was in the message before).
    #[test]
    fn a_failed_watch_keeps_its_source_and_hides_the_host_path() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("no-such-dir").join("sentry-1.log");
        let Err(e) = NprocWatch::start(&fifo) else {
            panic!("a FIFO in a missing directory was made");
        };
        let e = cordon_core::Error::failed("watching the sandbox's process limit", e);
        let shown = e.to_string();
        assert!(!shown.contains(&*dir.path().to_string_lossy()), "{shown}");
        assert!(shown.contains("making the sentry log's FIFO"), "{shown}");
        let source = std::error::Error::source(&e).expect("the tier's error is kept");
        let gvisor = source
            .downcast_ref::<GvisorError>()
            .expect("as the tier's error");
        let io = std::error::Error::source(gvisor).expect("and the host's error under it");
        let io = io.downcast_ref::<std::io::Error>().expect("an io error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn refusals_are_recognised_and_successes_are_not() {
        let refused = "I1129 13:43:08.405195   29512 strace.go:611] [   1:   1] python3 X clone(CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7f7d2523f310, 0x0) = 0 (0x0) errno=11 (try again) (576.026µs)";
        assert!(is_refusal(refused));
        let ok = "I1129 13:43:08.396772   29512 strace.go:611] [   1:   1] python3 X clone(CLONE_CHILD_CLEARTID|0x11, 0x0, 0x0, 0x7f7d2523f310, 0x0) = 32 (0x20) (297.783µs)";
        assert!(!is_refusal(ok));
        let entry = "I1129 13:43:08.396453   29512 strace.go:573] [   1:   1] python3 E clone(0x11, 0x0, 0x0, 0x7f7d2523f310, 0x0)";
        assert!(!is_refusal(entry));
        let other_errno = "strace.go:611] [   3:   3] sh X vfork() = 0 (0x0) errno=12 (cannot allocate memory) (3µs)";
        assert!(!is_refusal(other_errno));
        let fork = "strace.go:611] [   3:   3] sh X fork() = 0 (0x0) errno=11 (try again) (3µs)";
        assert!(is_refusal(fork));
        let untraced = "strace.go:611] [   3:   3] sh X read(0x3, 0x0, 0x10) = 0 (0x0) errno=11 (try again) (3µs)";
        assert!(!is_refusal(untraced));
        assert!(!is_refusal(
            "I1129 boot.go:1] Args: [runsc-sandbox --strace-syscalls=clone]"
        ));
    }

    /// A watch on a FIFO in a directory of its own (removed by the caller).
    fn watch_in(name: &str) -> (PathBuf, PathBuf, NprocWatch) {
        let dir = std::env::temp_dir().join(format!("cordon-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("log");
        let w = NprocWatch::start(&fifo).unwrap();
        (dir, fifo, w)
    }

    #[test]
    fn a_sync_returns_once_everything_written_before_it_is_counted() {
        let (dir, fifo, w) = watch_in("nproc-sync");
        let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        use std::io::Write;
        for round in 1..=20u64 {
            writeln!(
                f,
                "x] [ 1: 1] a X clone(0x11) = 0 (0x0) errno=11 (try again) (1µs)"
            )
            .unwrap();
            // Answered at once (not after its patience), and after the line was read.
            let t = Instant::now();
            w.sync(Duration::from_secs(10));
            assert!(t.elapsed() < Duration::from_secs(5), "round {round}");
            assert_eq!(w.refusals().count, round);
        }
        // With nothing new to read, a sync still answers.
        w.sync(Duration::from_secs(10));
        drop(f);
        assert_eq!(w.finish().count, 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_watch_counts_lines_written_to_its_fifo() {
        let (dir, fifo, w) = watch_in("nproc");
        {
            let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            use std::io::Write;
            writeln!(
                f,
                "x] [ 1: 1] a X clone(0x11) = 0 (0x0) errno=11 (try again) (1µs)"
            )
            .unwrap();
            writeln!(f, "x] [ 1: 1] a X clone(0x11) = 7 (0x7) (1µs)").unwrap();
            writeln!(
                f,
                "x] [ 1: 1] a X fork() = 0 (0x0) errno=11 (try again) (1µs)"
            )
            .unwrap();
        }
        let r = w.finish();
        assert_eq!(r.count, 2);
        assert!(r.first.is_some() && r.last >= r.first);
        assert!(!fifo.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
