//! Files in and out of a sandbox's scratch dir (`/work`), refusing symlinks anywhere on the
//! path. The guest cannot run while these run (exec takes the sandbox mutably and leaves no
//! guest code behind), so nothing can swap a component between the check and the open; the
//! final open also uses `O_NOFOLLOW`.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_core::{ArchiveReport, Error, FileOp, FileReply, Result, validate_sandbox_path};

use crate::host::{DiskLedger, ENTRY_COST};

fn refuse(path: &str, reason: &str) -> Error {
    Error::PathRefused {
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

/// Resolves `path` under `root`, checking every existing component is a real directory
/// (not a symlink); creates missing directories when `create` is set.
fn resolve(root: &Path, path: &str, create: bool) -> Result<PathBuf> {
    let rel = validate_sandbox_path(path)?;
    let parts: Vec<&str> = rel.split('/').collect();
    let mut cur = root.to_path_buf();
    for dir in &parts[..parts.len() - 1] {
        cur.push(dir);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refuse(path, "a directory on the path is a symlink"));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(refuse(path, "a component of the path is not a directory")),
            Err(_) if create => std::fs::create_dir(&cur)
                .map_err(|e| Error::io(format!("creating {}", cur.display()), e))?,
            Err(_) => return Err(refuse(path, "no such file under /work")),
        }
    }
    cur.push(parts[parts.len() - 1]);
    if let Ok(m) = std::fs::symlink_metadata(&cur)
        && m.file_type().is_symlink()
    {
        return Err(refuse(
            path,
            "is a symlink; only regular files move in and out",
        ));
    }
    Ok(cur)
}

pub(crate) fn put(
    root: &Path,
    disk_limit: u64,
    ledger: &DiskLedger,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let target = resolve(root, path, true)?;
    let existing = std::fs::symlink_metadata(&target)
        .map(|m| m.len())
        .unwrap_or(0);
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
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)
        .map_err(|e| Error::File {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
    ledger.set(after);
    f.write_all(data)
        .and_then(|_| f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777)))
        .map_err(|e| Error::File {
            path: path.to_string(),
            reason: e.to_string(),
        })
}

pub(crate) fn get(root: &Path, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let target = resolve(root, path, false)?;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&target)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(path, "is a symlink; only regular files move in and out"),
            _ => Error::File {
                path: path.to_string(),
                reason: e.to_string(),
            },
        })?;
    let meta = f.metadata().map_err(|e| Error::io("stat", e))?;
    if !meta.is_file() {
        return Err(refuse(path, "is not a regular file"));
    }
    if meta.len() > max_bytes {
        return Err(Error::File {
            path: path.to_string(),
            reason: format!("is {} bytes, more than the {max_bytes} allowed", meta.len()),
        });
    }
    let mut out = Vec::new();
    f.take(max_bytes)
        .read_to_end(&mut out)
        .map_err(|e| Error::io(format!("reading {path}"), e))?;
    Ok(out)
}

/// The scratch dir as a workspace: every call opens beneath it, never through a symlink
/// (the guest cannot run meanwhile), files owned by this process's user.
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
