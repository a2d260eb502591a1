//! Files in and out of a sandbox's scratch dir (`/work`), through the agent's
//! [`Workspace`](cordon_guest::files::Workspace): walked one component at a time by
//! descriptor, refusing symlinks anywhere on the path, so a component swapped while a call
//! runs is never followed; each call on a thread confined to the scratch dir
//! ([`ConfinedWorkspace`]: a mount namespace holding it alone, no capabilities).

use std::io::{Read, Write};
use std::path::Path;

use cordon_core::{
    ArchiveReport, Error, FileKind, FileOp, FileReply, Result, validate_sandbox_path,
};

use cordon_guest::confined::ConfinedWorkspace;

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
    let used = ledger.remeasure(root);
    // One confined call: the file's size now, the check, the write.
    let after = workspace(root)?
        .run(|ws| {
            let existing = match ws.stat(path) {
                Ok(e) if e.kind == FileKind::File => e.size,
                _ => 0,
            };
            let after = used
                .saturating_sub(existing)
                .saturating_add(data.len() as u64 + ENTRY_COST);
            if after > disk_limit {
                return Ok(None);
            }
            ws.put(path, mode, data).map(|()| Some(after))
        })
        .map_err(ws_error(path))?;
    let Some(after) = after else {
        return Err(Error::File {
            path: path.to_string(),
            reason: format!(
                "does not fit the sandbox's disk limit of {} bytes; give a larger --disk",
                disk_limit
            ),
        });
    };
    ledger.set(after);
    Ok(())
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

/// The scratch dir as a confined workspace: every call opens beneath it, never through a
/// symlink, on a thread that reaches nothing else; files owned by the scratch dir's owner.
fn workspace(root: &Path) -> Result<ConfinedWorkspace> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(root).map_err(|e| Error::io("the sandbox's /work", e))?;
    ConfinedWorkspace::new(root, m.uid(), m.gid())
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
