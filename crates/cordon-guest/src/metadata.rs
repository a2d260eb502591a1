//! A file's user metadata as E2B's envd keeps it: extended attributes in the
//! [`METADATA_XATTR_PREFIX`] namespace, read and written through a descriptor of the entry
//! itself, which the caller opens beneath its directory (`crate::files`: never through a
//! symlink, never outside the workspace). Only regular files and directories carry it: the
//! kernel allows `user.*` attributes on nothing else. This module only reads and writes the
//! attributes of a descriptor it is given, so it sits below the file calls that use it.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use cordon_core::{MAX_METADATA_KEYS, MAX_METADATA_VALUE, METADATA_XATTR_PREFIX};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::FileStat;
use rustix::fs::XattrFlags;

use crate::proto::ErrorCode;

/// The kernel's largest attribute name list (`XATTR_LIST_MAX`).
const LIST_MAX: usize = 64 * 1024;

/// How to open an entry of `st`'s kind to read or set its attributes (read-only, never
/// blocking); `None` for kinds that carry none.
pub(crate) fn open_flags(st: &FileStat) -> Option<OFlag> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Some(OFlag::O_RDONLY | OFlag::O_DIRECTORY),
        // Non-blocking and no controlling tty: a FIFO swapped in is found by the caller's
        // check of the opened entry, not waited on.
        libc::S_IFREG => Some(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY),
        _ => None,
    }
}

/// The names of the entry's metadata attributes (prefix included).
fn names(fd: &OwnedFd) -> Result<Vec<String>, Errno> {
    let mut buf = vec![0u8; LIST_MAX];
    let n = rustix::fs::flistxattr(fd, &mut buf[..]).map_err(errno)?;
    Ok(buf[..n]
        .split(|b| *b == 0)
        .filter_map(|n| std::str::from_utf8(n).ok())
        .filter(|n| n.starts_with(METADATA_XATTR_PREFIX) && n.len() > METADATA_XATTR_PREFIX.len())
        .map(str::to_string)
        .collect())
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_raw(e.raw_os_error())
}

/// The metadata of the entry open on `fd`: empty when it cannot be read (a filesystem
/// without attributes). At most [`MAX_METADATA_KEYS`] keys; a value that is not UTF-8 or
/// longer than [`MAX_METADATA_VALUE`] is left out (the sandbox wrote it, not an upload).
pub(crate) fn read(fd: &OwnedFd) -> BTreeMap<String, String> {
    let Ok(names) = names(fd) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let mut value = vec![0u8; MAX_METADATA_VALUE];
    for full in names {
        if out.len() >= MAX_METADATA_KEYS {
            break;
        }
        let Ok(n) = rustix::fs::fgetxattr(fd, full.as_str(), &mut value[..]) else {
            continue;
        };
        if let Ok(v) = std::str::from_utf8(&value[..n]) {
            out.insert(
                full[METADATA_XATTR_PREFIX.len()..].to_string(),
                v.to_string(),
            );
        }
    }
    out
}

/// Makes the metadata of the entry open on `fd` exactly `metadata` (checked by the caller):
/// attributes in the namespace that are not in it are removed.
pub(crate) fn replace(fd: &OwnedFd, metadata: &BTreeMap<String, String>) -> Result<(), Errno> {
    // A filesystem without attributes answers the listing already; an empty map on it is
    // nothing to clear.
    let old = match names(fd) {
        Err(Errno::EOPNOTSUPP) if metadata.is_empty() => return Ok(()),
        r => r?,
    };
    for full in old {
        if !metadata.contains_key(&full[METADATA_XATTR_PREFIX.len()..]) {
            match rustix::fs::fremovexattr(fd, full.as_str()).map_err(errno) {
                Ok(()) | Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for (k, v) in metadata {
        let full = format!("{METADATA_XATTR_PREFIX}{k}");
        rustix::fs::fsetxattr(fd, full.as_str(), v.as_bytes(), XattrFlags::empty())
            .map_err(errno)?;
    }
    Ok(())
}

/// Removes every metadata attribute from a file just opened for writing (an upload without
/// metadata leaves none from before, as envd does). A filesystem without attributes has
/// none to remove.
pub(crate) fn clear(fd: &OwnedFd) -> Result<(), Errno> {
    let old = match names(fd) {
        Err(Errno::EOPNOTSUPP) => return Ok(()),
        r => r?,
    };
    for full in old {
        match rustix::fs::fremovexattr(fd, full.as_str()).map_err(errno) {
            Ok(()) | Err(Errno::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a failed attribute write of `shown` (a sandbox path) answers, for the errors that
/// are the attributes' own; `None` for the rest (the caller's file errors).
pub(crate) fn set_error(shown: &str, e: Errno) -> Option<(ErrorCode, String)> {
    Some(match e {
        Errno::EOPNOTSUPP => (
            ErrorCode::Io,
            format!(
                "{shown}: this sandbox's workspace filesystem does not keep extended attributes, \
                 so file metadata cannot be stored; upload without metadata"
            ),
        ),
        Errno::ENOSPC | Errno::E2BIG | Errno::ERANGE => (
            ErrorCode::Io,
            format!("{shown}: the filesystem has no room for this metadata; send less of it"),
        ),
        Errno::EACCES | Errno::EPERM => (
            ErrorCode::Io,
            format!(
                "{shown}: permission denied setting its metadata; make the file writable by \
                 the sandbox user (chmod u+rw)"
            ),
        ),
        Errno::ESTALE => (
            ErrorCode::Io,
            format!("{shown} changed while its metadata was set; try again"),
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cordon_core::{FileOp, FileReply};

    use crate::files::tests::workspace;
    use crate::proto::ErrorCode;

    fn md(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn set_shows_in_stat_and_list_and_a_write_clears_it() {
        let (dir, ws) = workspace();
        ws.put("/work/d/a.txt", 0o644, b"a").unwrap();
        ws.set_metadata("/work/d/a.txt", &md(&[("author", "mish"), ("k", "v")]))
            .unwrap();
        // Another tool's user attribute is not metadata.
        xattr_set(&dir.path().join("d/a.txt"), "user.other", b"x");
        assert_eq!(
            ws.stat("/work/d/a.txt").unwrap().metadata,
            md(&[("author", "mish"), ("k", "v")])
        );
        // Set again: exactly the new map.
        ws.set_metadata("/work/d/a.txt", &md(&[("k", "w")]))
            .unwrap();
        let FileReply::Entries { entries, .. } = ws
            .op(&FileOp::List {
                path: "/work/d".into(),
            })
            .unwrap()
        else {
            panic!("not a listing")
        };
        assert_eq!(entries[0].metadata, md(&[("k", "w")]));
        ws.put("/work/d/a.txt", 0o644, b"again").unwrap();
        assert!(ws.stat("/work/d/a.txt").unwrap().metadata.is_empty());
        assert_eq!(
            rustix::fs::getxattr(dir.path().join("d/a.txt"), "user.other", &mut [0u8; 8][..])
                .unwrap(),
            1,
            "a write clears only the e2b namespace"
        );
    }

    fn xattr_set(p: &std::path::Path, name: &str, v: &[u8]) {
        rustix::fs::setxattr(p, name, v, rustix::fs::XattrFlags::empty()).unwrap();
    }

    #[test]
    fn a_symlink_is_never_followed_for_metadata() {
        let (dir, ws) = workspace();
        // A file outside the workspace, and one inside, each with metadata.
        let outside = tempfile::NamedTempFile::new().unwrap();
        xattr_set(outside.path(), "user.e2b.secret", b"host");
        ws.put("/work/t.txt", 0o644, b"t").unwrap();
        ws.set_metadata("/work/t.txt", &md(&[("secret", "in")]))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("t.txt", dir.path().join("in")).unwrap();
        for link in ["/work/out", "/work/in"] {
            assert!(ws.stat(link).unwrap().metadata.is_empty(), "{link}");
            let e = ws.set_metadata(link, &md(&[("secret", "x")])).unwrap_err();
            assert_eq!(e.0, ErrorCode::PathRefused, "{e:?}");
            assert!(
                !e.1.contains(&outside.path().display().to_string()),
                "{e:?}"
            );
        }
        let FileReply::Entries { entries, .. } = ws
            .op(&FileOp::List {
                path: "/work".into(),
            })
            .unwrap()
        else {
            panic!("not a listing")
        };
        for e in entries {
            let want = if e.name == "t.txt" {
                md(&[("secret", "in")])
            } else {
                BTreeMap::new()
            };
            assert_eq!(e.metadata, want, "{}", e.name);
        }
        let mut v = [0u8; 8];
        let n = rustix::fs::getxattr(outside.path(), "user.e2b.secret", &mut v[..]).unwrap();
        assert_eq!(&v[..n], b"host");
    }

    #[test]
    fn oversize_metadata_is_refused_before_anything_is_set() {
        let (_dir, ws) = workspace();
        ws.put("/work/a", 0o644, b"a").unwrap();
        let big = md(&[("k", &"v".repeat(cordon_core::MAX_METADATA_VALUE + 1))]);
        let e = ws.set_metadata("/work/a", &big).unwrap_err();
        assert_eq!(e.0, ErrorCode::BadRequest);
        assert!(ws.stat("/work/a").unwrap().metadata.is_empty());
    }
}
