//! One-shot runs: create a sandbox, put files in, exec, take files out, destroy.

use std::time::Instant;

use crate::{Backend, ExecOutcome, ExecRequest, OutputSink, Result, SandboxSpec};

/// A file to place in the sandbox before the exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIn {
    /// Path inside the sandbox, under `/work`.
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// A file taken out after the exec, or why it could not be.
#[derive(Debug)]
pub struct FileOut {
    pub path: String,
    pub data: Result<Vec<u8>>,
}

/// Runs `req` once in a fresh sandbox, which is destroyed before returning (also on error).
/// Output files are fetched whatever the outcome, each with its own result.
pub fn run_once(
    backend: &dyn Backend,
    spec: &SandboxSpec,
    files_in: &[FileIn],
    mut req: ExecRequest,
    files_out: &[String],
    max_file_bytes: u64,
    sink: &mut dyn OutputSink,
) -> Result<(ExecOutcome, Vec<FileOut>)> {
    let mut sb = backend.create(spec)?;
    let result = (|| -> Result<(ExecOutcome, Vec<FileOut>)> {
        for f in files_in {
            sb.put_file(&f.path, &f.data, f.mode)?;
        }
        // Nothing runs after this exec.
        req.last = true;
        let mut outcome = sb.exec(&req, sink)?;
        let outs = files_out
            .iter()
            .map(|p| FileOut {
                path: p.clone(),
                data: sb.get_file(p, max_file_bytes),
            })
            .collect();
        outcome.extra.merge(sb.report());
        outcome.timings.start_us = sb.start_us();
        Ok((outcome, outs))
    })();
    let t = Instant::now();
    let destroyed = sb.destroy();
    let destroy_us = t.elapsed().as_micros() as u64;
    let (mut outcome, outs) = result?;
    destroyed?;
    outcome.timings.destroy_us = destroy_us;
    Ok((outcome, outs))
}
