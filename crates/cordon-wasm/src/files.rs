//! Files in and out of a sandbox's scratch dir (`/work`), through the agent's
//! [`Workspace`](cordon_guest::files::Workspace): walked one component at a time by
//! descriptor, refusing symlinks anywhere on the path, so a component swapped while a call
//! runs is never followed.

use std::io::{Read, Write};
use std::path::Path;

use cordon_core::{
    ArchiveReport, Error, FileKind, FileOp, FileReply, Result, validate_sandbox_path,
};

use crate::host::{DiskLedger, ENTRY_COST};

fn refuse(path: &str, reason: &str) -> Error {
    Error::PathRefused {
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

pub(crate) fn put(
    root: &Path,
    disk_limit: u64,
    ledger: &DiskLedger,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    validate_sandbox_path(path)?;
    let ws = workspace(root)?;
    let existing = match ws.stat(path) {
        Ok(e) if e.kind == FileKind::File => e.size,
        _ => 0,
    };
    let after = ledger
        .remeasure(root)
        .saturating_sub(existing)
        .saturating_add(data.len() as u64 + ENTRY_COST);
    if after > disk_limit {
        return Err(Error::File {
            path: path.to_string(),
            reason: format!(
                "does not fit the sandbox's disk limit of {} bytes; give a larger --disk",
                disk_limit
            ),
        });
    }
    ledger.set(after);
    ws.put(path, mode, data).map_err(ws_error(path))
}

pub(crate) fn get(root: &Path, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
    validate_sandbox_path(path)?;
    let (data, truncated) = workspace(root)?
        .get(path, max_bytes)
        .map_err(ws_error(path))?;
    if truncated {
        return Err(Error::File {
            path: path.to_string(),
            reason: format!("is more than the {max_bytes} bytes allowed; raise the limit"),
        });
    }
    Ok(data)
}

/// The scratch dir as a workspace: every call opens beneath it, never through a symlink,
/// files owned by the scratch dir's owner.
fn workspace(root: &Path) -> Result<cordon_guest::files::Workspace> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(root).map_err(|e| Error::io("the sandbox's /work", e))?;
    cordon_guest::files::Workspace::open(root, m.uid(), m.gid())
        .map_err(|e| Error::io("opening the sandbox's /work", e))
}

fn ws_error(path: &str) -> impl Fn(cordon_guest::files::FileError) -> Error + '_ {
    move |(code, message)| match code {
        cordon_guest::proto::ErrorCode::PathRefused => refuse(path, &message),
        _ => Error::File {
            path: path.to_string(),
            reason: message,
        },
    }
}

pub(crate) fn op(root: &Path, ledger: &DiskLedger, op: &FileOp) -> Result<FileReply> {
    let r = workspace(root)?.op(op).map_err(ws_error(op.path()));
    if !matches!(op, FileOp::List { .. } | FileOp::Stat { .. }) {
        ledger.remeasure(root);
    }
    r
}

pub(crate) fn unpack(
    root: &Path,
    disk_limit: u64,
    ledger: &DiskLedger,
    dir: &str,
    tar: &mut dyn Read,
) -> Result<ArchiveReport> {
    let budget = disk_limit.saturating_sub(ledger.remeasure(root));
    let r = workspace(root)?
        .unpack(dir, tar, budget)
        .map_err(ws_error(dir));
    ledger.remeasure(root);
    r
}

pub(crate) fn pack(
    root: &Path,
    dir: &str,
    max_bytes: u64,
    out: &mut dyn Write,
) -> Result<ArchiveReport> {
    workspace(root)?
        .pack(dir, max_bytes, out)
        .map_err(ws_error(dir))
}
