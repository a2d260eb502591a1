//! An exec through a container tool's own command line (`podman exec`, `kubectl exec`): the
//! way a caller of cordon-oci reaches its workload, with no Cordon API in between. The tools
//! differ only in how the command is spelled; streaming, the deadline and reading the exit
//! status are the same, here.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_core::{
    Command as Cmd, Error, ExecOutcome, ExecRequest, OutputSink, OutputStream, Result, Termination,
    Tier,
};

/// How long an exec may take when its request names no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The argv a request runs (code through its language's interpreter's `-c`).
pub fn argv(req: &ExecRequest) -> Result<Vec<String>> {
    match &req.command {
        Cmd::Argv(a) => Ok(a.clone()),
        Cmd::Code {
            language,
            source,
            args,
        } => {
            let mut v = vec![language.program().to_string(), "-c".into(), source.clone()];
            v.extend(args.iter().cloned());
            Ok(v)
        }
        Cmd::Wasm { .. } => Err(Error::Invalid(
            "a wasm program does not run through a container tool".into(),
        )),
    }
}

/// Runs `c` (the tool's exec command, already holding the request's argv), its stdout handed
/// to `sink` as it comes and its stderr at the end. Past the request's deadline `kill` ends
/// the workload (the tool's own kill) and the outcome is a timeout. The tool's exit status is
/// the workload's, 128+N for a signal N (as both podman and kubectl report it).
pub fn exec(
    mut c: Command,
    req: &ExecRequest,
    sink: &mut dyn OutputSink,
    kill: &dyn Fn(),
) -> Result<ExecOutcome> {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = c
        .spawn()
        .map_err(|e| Error::Sandbox(format!("exec: {e}")))?;
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    // Stdout as it comes, on this thread (the sink may act while the exec runs); a reader
    // thread hands it over so the deadline is kept.
    let mut stdout_pipe = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match stdout_pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let deadline = started
        + req
            .timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
    let mut stdout = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(chunk) => {
                sink.output(OutputStream::Stdout, &chunk);
                stdout.extend_from_slice(&chunk);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if !timed_out {
                    timed_out = true;
                    kill();
                }
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::Sandbox(format!("exec: {e}")))?;
    let stderr = err_reader.join().unwrap_or_default();
    sink.output(OutputStream::Stderr, &stderr);
    use std::os::unix::process::ExitStatusExt;
    let mut o = ExecOutcome::new(
        Tier::Container,
        if timed_out {
            Termination::Timeout
        } else {
            Termination::Exited
        },
    );
    match (status.code(), status.signal()) {
        (Some(c), _) if c > 128 && c < 160 => {
            o.termination = Termination::Signalled;
            o.signal = Some(c - 128);
        }
        (Some(c), _) => o.exit_code = Some(c),
        (None, s) => {
            o.termination = Termination::Signalled;
            o.signal = s;
        }
    }
    o.stdout = stdout;
    o.stderr = stderr;
    o.timings.run_us = started.elapsed().as_micros() as u64;
    Ok(o)
}
