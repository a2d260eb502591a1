//! A file's entry as envd reports it (`EntryInfo`), and envd's `Stat` of one path: what
//! the filesystem service and the watcher's events both answer.

use cordon_core::{FileEntry, FileKind};

use super::connect::ConnectError;
use super::wire::EntryInfo;
use super::{E2b, connect_error, retry_busy, rfc3339, to_e2b_path};
use crate::keys::Tenant;

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// An entry as envd reports it; `path` is the sandbox path of the entry.
pub(super) fn entry_info(entry: &FileEntry, path: &str) -> EntryInfo {
    let shown = to_e2b_path(path);
    let name = shown.rsplit('/').next().unwrap_or("").to_string();
    EntryInfo {
        name,
        kind: kind_name(entry.kind),
        path: shown,
        // A directory's size is its own (st_size), as envd reports it.
        size: entry.size.to_string(),
        mode: entry.mode,
        permissions: permissions(entry.kind, entry.mode),
        owner: "user".into(),
        group: "user".into(),
        modified_time: rfc3339(entry.mtime_ms),
        is_symlink: entry.kind == FileKind::Symlink,
        symlink_target: entry
            .target
            .as_deref()
            .map(|t| to_e2b_path(&super::link_target(path, t))),
        metadata: entry.metadata.clone(),
    }
}

/// What envd's `Stat` answers for the sandbox path `path`.
pub(super) async fn stat_of(
    e: &E2b,
    tenant: &Tenant,
    id: &str,
    path: &str,
) -> Result<EntryInfo, ConnectError> {
    let st = retry_busy(|| e.svc.files().stat(tenant, id, path.to_string()))
        .await
        .map_err(connect_error)?;
    Ok(entry_info(&st.entry, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
    }
}
