//! The file API's battery, run by every tier that has a workspace: a list/stat/mkdir/
//! rename/remove round trip, symlinks and a FIFO planted by the sandboxed program, and
//! hostile tar archives. Archives are built here byte by byte so that names `tar::Builder`
//! refuses to write (`..`, absolute) can be sent.

use cordon_core::{
    ArchiveReport, Error, ExecRequest, FileEntry, FileKind, FileOp, FileReply, Language, Sandbox,
};

/// One entry of a hand-made archive.
pub struct TarEntry<'a> {
    pub name: &'a str,
    /// `b'0'` file, `b'5'` directory, `b'2'` symlink, `b'1'` hard link, `b'3'` char device,
    /// `b'6'` FIFO.
    pub kind: u8,
    pub mode: u32,
    pub data: &'a [u8],
    pub link: &'a str,
}

impl<'a> TarEntry<'a> {
    pub fn file(name: &'a str, data: &'a [u8]) -> Self {
        TarEntry {
            name,
            kind: b'0',
            mode: 0o644,
            data,
            link: "",
        }
    }
    pub fn dir(name: &'a str) -> Self {
        TarEntry {
            name,
            kind: b'5',
            mode: 0o755,
            data: b"",
            link: "",
        }
    }
    pub fn link(name: &'a str, kind: u8, target: &'a str) -> Self {
        TarEntry {
            name,
            kind,
            mode: 0o777,
            data: b"",
            link: target,
        }
    }
}

/// An archive of `entries`, names written as given (no checks).
pub fn tarball(entries: &[TarEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_old();
        {
            let old = h.as_old_mut();
            old.name[..e.name.len()].copy_from_slice(e.name.as_bytes());
            old.linkname[..e.link.len()].copy_from_slice(e.link.as_bytes());
        }
        h.set_entry_type(tar::EntryType::new(e.kind));
        h.set_mode(e.mode);
        h.set_size(e.data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, e.data).unwrap();
    }
    b.into_inner().unwrap()
}

/// One entry read back from an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: String,
    pub kind: u8,
    pub mode: u32,
    pub data: Vec<u8>,
    pub link: Option<String>,
}

/// The entries of `bytes`, in order.
pub fn read_tar(bytes: &[u8]) -> Vec<Found> {
    use std::io::Read;
    let mut a = tar::Archive::new(bytes);
    let mut out = Vec::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        out.push(Found {
            path: String::from_utf8(e.path_bytes().into_owned()).unwrap(),
            kind: e.header().entry_type().as_byte(),
            mode: e.header().mode().unwrap(),
            data,
            link: e
                .link_name_bytes()
                .map(|l| String::from_utf8(l.into_owned()).unwrap()),
        });
    }
    out
}

fn sh(sb: &mut dyn Sandbox, code: &str) -> String {
    let o = sb
        .exec(
            &ExecRequest::code(Language::Sh, code),
            &mut |_, _: &[u8]| {},
        )
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.exit_code,
        Some(0),
        "{code}: {out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn list(sb: &mut dyn Sandbox, path: &str) -> Vec<FileEntry> {
    match sb.file_op(&FileOp::List { path: path.into() }).unwrap() {
        FileReply::Entries { entries, .. } => entries,
        other => panic!("list answered {other:?}"),
    }
}

fn stat(sb: &mut dyn Sandbox, path: &str) -> Result<FileEntry, Error> {
    sb.file_op(&FileOp::Stat { path: path.into() })
        .map(|r| match r {
            FileReply::Entry { entry } => entry,
            other => panic!("stat answered {other:?}"),
        })
}

fn names(entries: &[FileEntry]) -> Vec<(&str, FileKind)> {
    entries.iter().map(|e| (e.name.as_str(), e.kind)).collect()
}

fn refused<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    assert!(
        matches!(r, Err(Error::PathRefused { .. })),
        "{what}: expected a path refusal, got {r:?}"
    );
}

/// List, stat, mkdir, rename and remove, and a tar round trip of a directory.
pub fn round_trip(sb: &mut dyn Sandbox) {
    sb.file_op(&FileOp::Mkdir {
        path: "/work/d/e".into(),
        parents: true,
    })
    .unwrap();
    // Again with parents: fine; without: it exists.
    sb.file_op(&FileOp::Mkdir {
        path: "/work/d/e".into(),
        parents: true,
    })
    .unwrap();
    assert!(
        sb.file_op(&FileOp::Mkdir {
            path: "/work/d/e".into(),
            parents: false,
        })
        .is_err()
    );
    sb.put_file("/work/d/e/f.txt", b"hello", 0o640).unwrap();
    assert_eq!(names(&list(sb, "/work/d")), vec![("e", FileKind::Dir)]);
    let f = stat(sb, "/work/d/e/f.txt").unwrap();
    assert_eq!(
        (f.name.as_str(), f.kind, f.size, f.mode),
        ("f.txt", FileKind::File, 5, 0o640)
    );
    assert!(f.mtime_ms > 1_600_000_000_000, "{f:?}");
    assert_eq!(stat(sb, "/work").unwrap().kind, FileKind::Dir);
    assert!(list(sb, "/work").iter().any(|e| e.name == "d"));
    sb.file_op(&FileOp::Rename {
        from: "/work/d/e/f.txt".into(),
        to: "/work/d/g.txt".into(),
    })
    .unwrap();
    assert_eq!(
        names(&list(sb, "/work/d")),
        vec![("e", FileKind::Dir), ("g.txt", FileKind::File)]
    );
    assert_eq!(sb.get_file("/work/d/g.txt", 100).unwrap(), b"hello");
    // The program sees what the API did.
    assert_eq!(sh(sb, "cat /work/d/g.txt; ls /work/d"), "helloe\ng.txt\n");
    // A directory that is not empty goes only with `recursive`.
    assert!(
        sb.file_op(&FileOp::Remove {
            path: "/work/d".into(),
            recursive: false
        })
        .is_err()
    );
    // Not a directory: not listed.
    refused(
        sb.file_op(&FileOp::List {
            path: "/work/d/g.txt".into(),
        }),
        "listing a file",
    );
    refused(
        sb.file_op(&FileOp::Remove {
            path: "/work".into(),
            recursive: true,
        }),
        "removing /work",
    );
    // Outside /work the sandbox's own files are reached (ADR 0031), its kernel's are not.
    refused(stat(sb, "/proc/self/environ"), "stat in /proc");
    refused(stat(sb, "/work/../etc/passwd"), "stat with ..");

    // A directory out as a tar stream and into another place.
    sb.put_file("/work/d/e/deep.bin", &[7u8; 70_000], 0o600)
        .unwrap();
    let mut tar = Vec::new();
    let r = sb.get_archive("/work/d", 1 << 20, &mut tar).unwrap();
    assert_eq!((r.files, r.dirs, r.bytes), (2, 1, 70_005), "{r:?}");
    let found = read_tar(&tar);
    let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, vec!["e/", "e/deep.bin", "g.txt"]);
    assert_eq!(found[1].mode, 0o600);
    // Too large for the limit: refused before a byte is written.
    let mut none = Vec::new();
    assert!(sb.get_archive("/work/d", 1000, &mut none).is_err());
    assert!(none.is_empty());
    let r = sb.put_archive("/work/copy", &mut &tar[..]).unwrap();
    assert_eq!((r.files, r.dirs, r.bytes), (2, 1, 70_005), "{r:?}");
    assert_eq!(
        sb.get_file("/work/copy/e/deep.bin", 1 << 20).unwrap(),
        vec![7u8; 70_000]
    );
    assert_eq!(stat(sb, "/work/copy/e/deep.bin").unwrap().mode, 0o600);
    sb.file_op(&FileOp::Remove {
        path: "/work/d".into(),
        recursive: true,
    })
    .unwrap();
    sb.file_op(&FileOp::Remove {
        path: "/work/copy".into(),
        recursive: true,
    })
    .unwrap();
    assert!(matches!(stat(sb, "/work/d"), Err(Error::File { .. })));
    assert_eq!(sh(sb, "ls -d /work/d /work/copy 2>/dev/null; true"), "");
}

/// Symlinks (one to `/etc`, one to a directory outside `/work` the program owns) and a
/// FIFO, planted by the program: never followed, never opened, by any file call.
/// `fifos_visible` is false where the file calls do not see the program's FIFOs at all
/// (gVisor keeps them in its own kernel): they must then be absent, not opened.
pub fn planted_links(sb: &mut dyn Sandbox, fifos_visible: bool) {
    sh(
        sb,
        "mkdir -p /tmp/outside && echo keep > /tmp/outside/keep.txt && \
         ln -s /etc /work/etc-link && ln -s /tmp/outside /work/out && mkfifo /work/fifo",
    );
    links_are_seen_not_followed(sb, fifos_visible);
    file_calls_refuse_links(sb);
    archives_keep_links_as_links(sb, fifos_visible);
    removing_a_link_keeps_its_target(sb, fifos_visible);
}

/// Stat and list see the planted links (and the FIFO, where visible) as themselves, and
/// nothing through them.
fn links_are_seen_not_followed(sb: &mut dyn Sandbox, fifos_visible: bool) {
    refused(
        sb.file_op(&FileOp::List {
            path: "/work/etc-link".into(),
        }),
        "listing through a symlink",
    );
    let l = stat(sb, "/work/etc-link").unwrap();
    assert_eq!(l.kind, FileKind::Symlink, "{l:?}");
    refused(stat(sb, "/work/etc-link/passwd"), "stat through a symlink");
    let all = list(sb, "/work");
    if fifos_visible {
        assert_eq!(stat(sb, "/work/fifo").unwrap().kind, FileKind::Fifo);
        assert!(all.contains(&stat(sb, "/work/fifo").unwrap()), "{all:?}");
    } else {
        assert!(stat(sb, "/work/fifo").is_err());
        assert!(!all.iter().any(|e| e.name == "fifo"), "{all:?}");
    }
}

/// Remove, rename (out and in) and mkdir through a planted link are refused.
fn file_calls_refuse_links(sb: &mut dyn Sandbox) {
    refused(
        sb.file_op(&FileOp::Remove {
            path: "/work/out/keep.txt".into(),
            recursive: false,
        }),
        "removing through a symlink",
    );
    refused(
        sb.file_op(&FileOp::Rename {
            from: "/work/out/keep.txt".into(),
            to: "/work/stolen".into(),
        }),
        "renaming out through a symlink",
    );
    sb.put_file("/work/mine", b"x", 0o644).unwrap();
    refused(
        sb.file_op(&FileOp::Rename {
            from: "/work/mine".into(),
            to: "/work/out/mine".into(),
        }),
        "renaming in through a symlink",
    );
    refused(
        sb.file_op(&FileOp::Mkdir {
            path: "/work/out/new".into(),
            parents: true,
        }),
        "mkdir through a symlink",
    );
}

/// Downloads: the links as links, the FIFO skipped, nothing beneath the links; an archive
/// down or up through a link is refused.
fn archives_keep_links_as_links(sb: &mut dyn Sandbox, fifos_visible: bool) {
    let mut tar = Vec::new();
    let r = sb.get_archive("/work", 1 << 20, &mut tar).unwrap();
    let found = read_tar(&tar);
    let link = found.iter().find(|f| f.path == "etc-link").unwrap();
    assert_eq!((link.kind, link.link.as_deref()), (b'2', Some("/etc")));
    assert!(
        found
            .iter()
            .all(|f| !f.path.starts_with("etc-link/") && !f.path.starts_with("out/")),
        "{found:?}"
    );
    assert!(!found.iter().any(|f| f.path == "fifo"));
    assert_eq!(
        r.skipped.iter().any(|s| s.path == "fifo"),
        fifos_visible,
        "{r:?}"
    );
    refused(
        sb.get_archive("/work/out", 1 << 20, &mut Vec::new()),
        "downloading through a symlink",
    );
    refused(
        sb.put_archive("/work/out", &mut &tarball(&[TarEntry::file("x", b"x")])[..]),
        "uploading through a symlink",
    );
}

/// Removing a link removes the link, recursive or not; what it pointed to stays.
fn removing_a_link_keeps_its_target(sb: &mut dyn Sandbox, fifos_visible: bool) {
    sb.file_op(&FileOp::Remove {
        path: "/work/out".into(),
        recursive: true,
    })
    .unwrap();
    sb.file_op(&FileOp::Rename {
        from: "/work/etc-link".into(),
        to: "/work/renamed-link".into(),
    })
    .unwrap();
    assert_eq!(
        stat(sb, "/work/renamed-link").unwrap().kind,
        FileKind::Symlink
    );
    if fifos_visible {
        sb.file_op(&FileOp::Remove {
            path: "/work/fifo".into(),
            recursive: false,
        })
        .unwrap();
    } else {
        sh(sb, "rm /work/fifo");
    }
    assert_eq!(
        sh(
            sb,
            "cat /tmp/outside/keep.txt; ls /tmp/outside; test -d /etc && echo etc; ls -A /work"
        ),
        "keep\nkeep.txt\netc\nmine\nrenamed-link\n"
    );
}

/// Hostile archives: `..` and absolute names stop the upload; a symlink out and a file
/// through it, a hard link, a device node and a FIFO are neutralised; setuid is dropped;
/// an archive larger than the disk limit is refused. `disk_bytes` is the sandbox's limit.
pub fn hostile_archives(sb: &mut dyn Sandbox, disk_bytes: u64) {
    sh(sb, "mkdir -p /tmp/outside");
    for bad in [
        "../escape.txt",
        "/abs.txt",
        "a/../../escape.txt",
        "/work/abs.txt",
    ] {
        let tar = tarball(&[TarEntry::file(bad, b"pwned")]);
        refused(sb.put_archive("/work/up", &mut &tar[..]), bad);
    }
    odd_entries_are_neutralised(sb);
    a_planted_link_stops_the_upload(sb);
    // Larger than the disk: refused from the header, before its bytes are written.
    let big = vec![0u8; disk_bytes as usize + 4096];
    let tar = tarball(&[TarEntry::file("big", &big)]);
    let e = sb.put_archive("/work/up", &mut &tar[..]).unwrap_err();
    assert!(e.to_string().contains("disk limit"), "{e}");
    assert!(stat(sb, "/work/up/big").is_err());
    // Not a tar at all.
    assert!(sb.put_archive("/work/up", &mut &[1u8; 1000][..]).is_err());
    sb.file_op(&FileOp::Remove {
        path: "/work/up".into(),
        recursive: true,
    })
    .unwrap();
}

/// An entry of `kind` with no data and no link target.
fn bare_entry(name: &'static str, kind: u8, mode: u32) -> TarEntry<'static> {
    TarEntry {
        name,
        kind,
        mode,
        data: b"",
        link: "",
    }
}

/// A symlink out and a file through it, a hard link, a device node and a FIFO are skipped
/// (the file lands in a real directory); setuid and setgid bits are dropped.
fn odd_entries_are_neutralised(sb: &mut dyn Sandbox) {
    let tar = tarball(&[
        TarEntry::link("ln", b'2', "/tmp/outside"),
        TarEntry::file("ln/pwned", b"through the link"),
        TarEntry::link("hard", b'1', "/etc/passwd"),
        bare_entry("dev", b'3', 0o666),
        bare_entry("pipe", b'6', 0o666),
        TarEntry {
            data: b"#!/bin/sh\n",
            ..bare_entry("suid", b'0', 0o4755)
        },
        bare_entry("sgid-dir", b'5', 0o2775),
    ]);
    let r: ArchiveReport = sb.put_archive("/work/up", &mut &tar[..]).unwrap();
    let skipped: Vec<&str> = r.skipped.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        skipped,
        vec![
            "/work/up/ln",
            "/work/up/hard",
            "/work/up/dev",
            "/work/up/pipe"
        ],
        "{r:?}"
    );
    // The file meant to go through the link landed in a real directory of that name.
    assert_eq!(stat(sb, "/work/up/ln").unwrap().kind, FileKind::Dir);
    assert_eq!(
        sb.get_file("/work/up/ln/pwned", 100).unwrap(),
        b"through the link"
    );
    assert_eq!(stat(sb, "/work/up/suid").unwrap().mode, 0o755);
    assert_eq!(stat(sb, "/work/up/sgid-dir").unwrap().mode, 0o775);
    for gone in [
        "/work/up/hard",
        "/work/up/dev",
        "/work/up/pipe",
        "/work/escape.txt",
    ] {
        assert!(stat(sb, gone).is_err(), "{gone} exists");
    }
    assert_eq!(
        sh(
            sb,
            "ls -A /tmp/outside; test ! -e /work/escape.txt && echo clean"
        ),
        "clean\n"
    );
}

/// A planted symlink where the archive writes stops it, and nothing goes through.
fn a_planted_link_stops_the_upload(sb: &mut dyn Sandbox) {
    sh(sb, "ln -s /tmp/outside /work/up/planted");
    let tar = tarball(&[TarEntry::file("planted/x", b"x")]);
    refused(
        sb.put_archive("/work/up", &mut &tar[..]),
        "a file through a planted symlink",
    );
    assert_eq!(sh(sb, "ls -A /tmp/outside"), "");
}
