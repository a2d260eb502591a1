//! Directories in and out of a workspace as tar streams ([`Workspace::unpack`],
//! [`Workspace::pack`]), with the workspace's rules: everything opened beneath its root,
//! never through a symlink, FIFOs and devices never opened.
//!
//! Extraction trusts nothing in the archive: an entry that leaves the target directory
//! (absolute, `..`, a name that is not UTF-8) stops it; links (symbolic or hard), device
//! nodes, FIFOs and other special entries are skipped and reported; setuid, setgid and
//! sticky bits are dropped; every byte and every entry counts against a budget (the
//! sandbox's disk limit), checked from the entry's header before its contents are read.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use cordon_core::{ArchiveReport, FileKind, Skipped};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, readlinkat};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat};
use tar::{EntryType, Header};

use crate::files::{
    FileError, MAX_DEPTH, Workspace, check_dir, dir_errno, kind_of, open_at, read_names,
    refuse_errno, walk_from, write_error,
};
use crate::proto::ErrorCode;

/// What each entry costs against the budget beyond its bytes (its inode and header), so
/// an archive of millions of empty files is stopped too.
pub const ENTRY_COST: u64 = 512;
/// The largest long-name or pax header an upload may hold.
pub const MAX_EXTENSION: u64 = 64 << 10;
/// Most entries a download holds.
pub const MAX_ARCHIVE_ENTRIES: usize = 200_000;

impl Workspace {
    /// Extracts the tar stream `src` into the directory `dir` (a sandbox path; made if
    /// missing), at most `budget` bytes (contents plus [`ENTRY_COST`] per entry).
    pub fn unpack(
        &self,
        dir: &str,
        src: &mut dyn Read,
        budget: u64,
    ) -> Result<ArchiveReport, FileError> {
        let base = check_dir(dir)?;
        if !base.is_empty() {
            self.make_dirs(&base, dir)?;
        }
        let mut report = ArchiveReport::default();
        let mut used: u64 = 0;
        let mut archive = tar::Archive::new(src);
        // Raw: long names and pax headers are read here, each bounded, rather than by the
        // tar crate, which would buffer one of any size the archive claims.
        let entries = archive.entries().map_err(bad_archive)?.raw(true);
        let mut long_name: Option<Vec<u8>> = None;
        for entry in entries {
            let mut entry = entry.map_err(bad_archive)?;
            let kind = entry.header().entry_type();
            if kind.is_gnu_longname()
                || kind.is_gnu_longlink()
                || kind.is_pax_local_extensions()
                || kind.is_pax_global_extensions()
            {
                let size = entry.size();
                if size > MAX_EXTENSION {
                    return Err((
                        ErrorCode::BadRequest,
                        format!(
                            "an archive's long-name or pax header holds {size} bytes, more than \
                             {MAX_EXTENSION}; use shorter names"
                        ),
                    ));
                }
                used = used.saturating_add(size);
                let mut data = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut data).map_err(bad_archive)?;
                if kind.is_gnu_longname() {
                    while data.last() == Some(&0) {
                        data.pop();
                    }
                    long_name = Some(data);
                } else if kind.is_pax_local_extensions() {
                    for ext in tar::PaxExtensions::new(&data) {
                        let ext = ext.map_err(bad_archive)?;
                        match ext.key_bytes() {
                            b"path" => long_name = Some(ext.value_bytes().to_vec()),
                            b"size" => {
                                return Err((
                                    ErrorCode::BadRequest,
                                    "pax `size` records (files of 8 GiB or more) are not \
                                     supported; send smaller files"
                                        .to_string(),
                                ));
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            let raw = long_name
                .take()
                .unwrap_or_else(|| entry.path_bytes().into_owned());
            let Some(rel) = entry_path(&raw)? else {
                continue;
            };
            let target = if base.is_empty() {
                rel.clone()
            } else {
                format!("{base}/{rel}")
            };
            let shown = format!("{}/{target}", cordon_core::WORKDIR);
            used = used.saturating_add(ENTRY_COST);
            if used > budget {
                return Err(too_big(budget));
            }
            let header = entry.header();
            let mode = header.mode().unwrap_or(0o644);
            match header.entry_type() {
                EntryType::Regular | EntryType::Continuous => {
                    let size = entry.size();
                    if used.saturating_add(size) > budget {
                        return Err(too_big(budget));
                    }
                    let mut f = self.create_file(&target, &shown, mode & 0o777)?;
                    let n = io::copy(&mut (&mut entry).take(size), &mut f).map_err(|e| {
                        if e.raw_os_error().is_some() {
                            write_error(&shown, &e)
                        } else {
                            bad_archive(e)
                        }
                    })?;
                    used += n;
                    report.files += 1;
                    report.bytes += n;
                }
                EntryType::Directory => {
                    let fd = self.make_dirs(&target, &shown)?;
                    // The owner keeps rwx, so what follows can go in.
                    let _ = fchmod(&fd, Mode::from_bits_truncate((mode & 0o777) | 0o700));
                    report.dirs += 1;
                }
                EntryType::Symlink | EntryType::Link => report.skipped.push(Skipped {
                    path: shown,
                    reason: "links are not extracted (one could point outside /work)".into(),
                }),
                EntryType::Char | EntryType::Block | EntryType::Fifo => {
                    report.skipped.push(Skipped {
                        path: shown,
                        reason: "device nodes and FIFOs are not extracted".into(),
                    })
                }
                other => report.skipped.push(Skipped {
                    path: shown,
                    reason: format!(
                        "entries of tar type {:?} are not extracted",
                        other.as_byte()
                    ),
                }),
            }
        }
        Ok(report)
    }

    /// Writes the directory `dir` (a sandbox path) to `out` as a tar stream: directories,
    /// regular files and symlinks (as links, never followed), at most `max_bytes` of file
    /// contents (refused before anything is written when the directory holds more); FIFOs,
    /// sockets and devices are skipped and never opened.
    pub fn pack(
        &self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn Write,
    ) -> Result<ArchiveReport, FileError> {
        let base = check_dir(dir)?;
        let top = self.open_dir(&base).map_err(|e| dir_errno(dir, e))?;
        let mut items = Vec::new();
        let mut report = ArchiveReport::default();
        walk(&top, "", 0, &mut items, &mut report.skipped).map_err(|e| match e {
            Errno::E2BIG => (
                ErrorCode::Io,
                format!(
                    "{dir} holds more than {MAX_ARCHIVE_ENTRIES} entries or is nested deeper \
                     than {MAX_DEPTH} levels; download its subdirectories one by one"
                ),
            ),
            e => refuse_errno(dir, e),
        })?;
        let total: u64 = items
            .iter()
            .filter(|i| i.kind == FileKind::File)
            .map(|i| i.size)
            .sum();
        if total > max_bytes {
            return Err((
                ErrorCode::Io,
                format!(
                    "{dir} holds {total} bytes of files, more than the {max_bytes}-byte limit \
                     for downloads; download a subdirectory or remove what you do not need"
                ),
            ));
        }
        let werr = |e: io::Error| (ErrorCode::Io, format!("writing the archive of {dir}: {e}"));
        let mut b = tar::Builder::new(out);
        for item in items {
            let mut h = Header::new_gnu();
            h.set_mode(item.mode & 0o777);
            h.set_mtime(item.mtime.max(0) as u64);
            h.set_uid(0);
            h.set_gid(0);
            match item.kind {
                FileKind::Dir => {
                    h.set_entry_type(EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, format!("{}/", item.rel), io::empty())
                        .map_err(werr)?;
                    report.dirs += 1;
                }
                FileKind::Symlink => {
                    h.set_entry_type(EntryType::Symlink);
                    h.set_size(0);
                    let target = item.link.unwrap_or_default();
                    b.append_link(&mut h, &item.rel, &target).map_err(werr)?;
                    report.symlinks += 1;
                }
                _ => {
                    // Opened again beneath the top, one component at a time, never
                    // through a symlink, without blocking; it must still be a regular file.
                    let (parent, name) = item.rel.rsplit_once('/').unwrap_or(("", &item.rel));
                    let opened = walk_from(top.as_fd(), parent, None)
                        .map_err(|s| s.errno)
                        .and_then(|p| {
                            open_at(
                                p.as_fd(),
                                name,
                                OFlag::O_RDONLY | OFlag::O_NONBLOCK,
                                Mode::empty(),
                            )
                        });
                    let fd = match opened {
                        Ok(fd) => fd,
                        Err(e) => {
                            report.skipped.push(Skipped {
                                path: item.rel,
                                reason: format!("changed while the archive was made ({e})"),
                            });
                            continue;
                        }
                    };
                    let st = fstat(&fd).map_err(|e| refuse_errno(dir, e))?;
                    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                        report.skipped.push(Skipped {
                            path: item.rel,
                            reason: "no longer a regular file".into(),
                        });
                        continue;
                    }
                    let size = st.st_size.max(0) as u64;
                    if report.bytes + size > max_bytes {
                        return Err((
                            ErrorCode::Io,
                            format!(
                                "{dir} grew past the {max_bytes}-byte limit for downloads \
                                 while the archive was made; download it again"
                            ),
                        ));
                    }
                    h.set_entry_type(EntryType::Regular);
                    h.set_size(size);
                    // Exactly `size` bytes: a file that shrank meanwhile is padded.
                    let body = std::fs::File::from(fd)
                        .take(size)
                        .chain(io::repeat(0))
                        .take(size);
                    b.append_data(&mut h, &item.rel, body).map_err(werr)?;
                    report.files += 1;
                    report.bytes += size;
                }
            }
        }
        b.finish().map_err(werr)?;
        Ok(report)
    }
}

/// One entry found for a download, relative to its top directory.
struct Item {
    rel: String,
    kind: FileKind,
    size: u64,
    mode: u32,
    mtime: i64,
    link: Option<String>,
}

fn walk(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    items: &mut Vec<Item>,
    skipped: &mut Vec<Skipped>,
) -> Result<(), Errno> {
    if depth >= MAX_DEPTH {
        return Err(Errno::E2BIG);
    }
    let mut names = read_names(dir)?;
    names.sort();
    for name in names {
        if items.len() >= MAX_ARCHIVE_ENTRIES {
            return Err(Errno::E2BIG);
        }
        let Ok(st) = fstatat(dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let kind = kind_of(&st);
        let mut item = Item {
            rel,
            kind,
            size: st.st_size.max(0) as u64,
            mode: st.st_mode & 0o7777,
            mtime: st.st_mtime,
            link: None,
        };
        match kind {
            FileKind::File => items.push(item),
            FileKind::Symlink => {
                // The link's text, read without following it.
                let Ok(target) = readlinkat(dir, name.as_str()) else {
                    continue;
                };
                item.link = Some(target.to_string_lossy().into_owned());
                items.push(item);
            }
            FileKind::Dir => {
                let child = open_at(
                    dir.as_fd(),
                    &name,
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                    Mode::empty(),
                )?;
                let rel = item.rel.clone();
                items.push(item);
                walk(&child, &rel, depth + 1, items, skipped)?;
            }
            other => skipped.push(Skipped {
                path: item.rel,
                reason: format!("a {other:?} is not archived (never opened)"),
            }),
        }
    }
    Ok(())
}

/// The entry's path relative to the target directory; `None` for the directory itself
/// (`.`, `./`). An absolute path, `..` or a name that is not UTF-8 stops the extraction.
fn entry_path(raw: &[u8]) -> Result<Option<String>, FileError> {
    let name = std::str::from_utf8(raw).map_err(|_| {
        (
            ErrorCode::PathRefused,
            "an archive entry's name is not UTF-8; nothing after it was extracted".to_string(),
        )
    })?;
    let refuse = |why: &str| {
        Err((
            ErrorCode::PathRefused,
            format!(
                "the archive entry {name:?} {why}; entries must stay inside the target \
                 directory: nothing from it on was extracted"
            ),
        ))
    };
    if name.starts_with('/') {
        return refuse("is an absolute path");
    }
    if name.contains('\0') {
        return refuse("contains a NUL byte");
    }
    let mut parts = Vec::new();
    for comp in name.split('/') {
        match comp {
            "" | "." => {}
            ".." => return refuse("contains '..'"),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    Ok(Some(parts.join("/")))
}

fn too_big(budget: u64) -> FileError {
    (
        ErrorCode::Io,
        format!(
            "the archive is larger than the sandbox's disk limit ({budget} bytes, counting \
             {ENTRY_COST} bytes per entry); upload less or create the sandbox with a larger disk"
        ),
    )
}

fn bad_archive(e: io::Error) -> FileError {
    (
        ErrorCode::BadRequest,
        format!("not a valid tar stream ({e}); send an uncompressed tar (application/x-tar)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_stay_inside_the_target() {
        assert_eq!(entry_path(b"a/./b").unwrap(), Some("a/b".into()));
        assert_eq!(entry_path(b"./").unwrap(), None);
        assert_eq!(entry_path(b"dir/").unwrap(), Some("dir".into()));
        for bad in [&b"/etc/passwd"[..], b"../x", b"a/../../x", b"a/..", b"\xff"] {
            let e = entry_path(bad).unwrap_err();
            assert_eq!(e.0, ErrorCode::PathRefused, "{bad:?}");
        }
    }

    #[test]
    fn the_budget_is_checked_from_the_header_before_any_byte() {
        let dir = tempfile::tempdir().unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let ws = Workspace::open(dir.path(), uid, gid).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_size(10_000);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "f", &[0u8; 10_000][..]).unwrap();
        let tar = b.into_inner().unwrap();
        let e = ws.unpack("/work", &mut &tar[..], 9_000).unwrap_err();
        assert!(e.1.contains("disk limit"), "{e:?}");
        assert!(!dir.path().join("f").exists());
        let r = ws.unpack("/work", &mut &tar[..], 20_000).unwrap();
        assert_eq!((r.files, r.bytes), (1, 10_000));
    }

    use crate::files::tests::workspace;

    /// One extension entry (`L` long name, `x` pax) followed by a file.
    fn with_extension(kind: u8, data: &[u8]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(EntryType::new(kind));
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
        let mut f = Header::new_gnu();
        f.as_gnu_mut().unwrap().name[..5].copy_from_slice(b"short");
        f.set_size(2);
        f.set_mode(0o644);
        f.set_cksum();
        b.append(&f, &b"ok"[..]).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn long_names_and_pax_paths_apply_and_are_bounded() {
        let (dir, ws) = workspace();
        let long = format!("{}/{}", "d".repeat(150), "f".repeat(150));
        let mut name = long.clone().into_bytes();
        name.push(0);
        ws.unpack("/work", &mut &with_extension(b'L', &name)[..], 1 << 20)
            .unwrap();
        assert_eq!(std::fs::read(dir.path().join(&long)).unwrap(), b"ok");
        // A pax record: "LEN key=value\n", LEN counting the whole record, its own digits too.
        let record = |k: &str, v: &str| {
            let body = format!(" {k}={v}\n");
            let mut len = body.len() + 1;
            while len != body.len() + len.to_string().len() {
                len = body.len() + len.to_string().len();
            }
            format!("{len}{body}")
        };
        let pax = record("path", "via-pax.txt");
        ws.unpack(
            "/work",
            &mut &with_extension(b'x', pax.as_bytes())[..],
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("via-pax.txt")).unwrap(),
            b"ok"
        );
        // A pax path may not leave the target either.
        let pax = record("path", "../out.txt");
        let e = ws
            .unpack(
                "/work",
                &mut &with_extension(b'x', pax.as_bytes())[..],
                1 << 20,
            )
            .unwrap_err();
        assert_eq!(e.0, ErrorCode::PathRefused, "{e:?}");
        // A long name larger than any name: refused before it is read whole.
        let huge = vec![b'a'; (MAX_EXTENSION + 1) as usize];
        let e = ws
            .unpack("/work", &mut &with_extension(b'L', &huge)[..], 1 << 30)
            .unwrap_err();
        assert!(e.1.contains("long-name"), "{e:?}");
    }
}
