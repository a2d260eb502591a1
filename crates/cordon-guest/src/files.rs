//! Files in and out of a sandbox's workspace, opened beneath its root one component at a
//! time (every `*at` call takes a directory descriptor and one name, never a path the
//! kernel would resolve again): never through a symlink or onto another filesystem, never
//! blocking on a FIFO the sandbox planted, and only ever a regular file. Used by the agent inside a sandbox and by tiers that reach
//! the workspace from the host (gvisor).
//!
//! The same walk serves the sandbox's own root ([`Workspace::open_outside`], ADR 0031): the
//! agent's forked file call (crate::outside), already the sandbox's user, walks from `/`
//! never through a symlink, crossing into other mounts (`/tmp`'s tmpfs) but never into the
//! kernel's (procfs, sysfs, cgroupfs and the like: see [`kernel_fs`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cordon_core::{FileEntry, FileKind, FileReply, MAX_LIST_ENTRIES};
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, FcntlArg, OFlag, OpenHow, ResolveFlag, fcntl, openat2, renameat};
use nix::sys::stat::{FileStat, Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

use crate::proto::ErrorCode;

/// How deep a recursive remove or a download goes before it stops.
pub(crate) const MAX_DEPTH: usize = 256;

/// A refusal or failure, with the code the agent protocol carries and a message that names
/// only the sandbox path.
pub type FileError = (ErrorCode, String);

/// A workspace directory, held open; files are opened beneath it and owned by `uid`/`gid`.
pub struct Workspace {
    root: OwnedFd,
    uid: u32,
    gid: u32,
    /// The sandbox's own root rather than its workspace: paths are absolute, and a walk
    /// crosses into other mounts, never into the kernel's filesystems.
    outside: bool,
}

impl Workspace {
    /// Opens the workspace at `dir` (which must be a directory; a symlink is not followed).
    pub fn open(dir: &Path, uid: u32, gid: u32) -> io::Result<Self> {
        let root = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        Ok(Workspace {
            root,
            uid,
            gid,
            outside: false,
        })
    }

    /// Opens the sandbox's own root at `dir` (the agent's `/`) for calls outside the
    /// workspace: paths are absolute ([`cordon_core::classify_sandbox_path`]), walks cross
    /// into other mounts but never into a kernel filesystem, and never through a symlink.
    /// Only for a process that already is the sandbox's user (crate::outside).
    pub fn open_outside(dir: &Path, uid: u32, gid: u32) -> io::Result<Self> {
        Ok(Workspace {
            outside: true,
            ..Self::open(dir, uid, gid)?
        })
    }

    /// `path` checked and made relative to the root (a file's path).
    fn rel(&self, path: &str) -> Result<String, FileError> {
        if self.outside {
            outside_rel(path, false)
        } else {
            check_path(path)
        }
    }

    /// `path` checked and made relative to the root (a directory's: the root itself too).
    fn rel_dir(&self, path: &str) -> Result<String, FileError> {
        if self.outside {
            outside_rel(path, true)
        } else {
            check_dir(path)
        }
    }

    /// The entry `name` in `dir`, as [`open_at`] opens it; outside the workspace, also
    /// across a mount (never into a kernel filesystem).
    fn open_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
        flags: OFlag,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        open_step(dir, name, flags, mode, self.outside)
    }

    /// The workspace's directory, held open.
    pub(crate) fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The directory `rel` beneath the root (`rel` empty: the root itself), opened one
    /// component at a time, each beneath the descriptor of the one before and never through
    /// a symlink, so nothing the sandbox swaps in while the walk runs is followed; with
    /// `create`, missing directories are made on the way (each handed to the sandbox user).
    /// An error names the prefix of `rel` where the walk stopped.
    pub(crate) fn walk(&self, rel: &str, create: bool) -> Result<OwnedFd, Stuck> {
        walk_in(self.root.as_fd(), rel, create.then_some(self), self.outside)
    }

    /// A directory beneath the root, readable (`rel` empty: the root itself).
    pub(crate) fn open_dir(&self, rel: &str) -> Result<OwnedFd, Errno> {
        self.walk(rel, false).map_err(|s| s.errno)
    }

    /// The directory holding `rel` (not empty), and the last component's name.
    fn parent_of<'a>(&self, rel: &'a str) -> Result<(OwnedFd, &'a str), Errno> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        Ok((self.open_dir(dir)?, name))
    }

    pub(crate) fn hand_over(&self, fd: &OwnedFd) {
        let _ = fchown(
            fd,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
        );
    }

    /// Writes `data` to `path` (a sandbox path, `/work/...` or relative to it), creating
    /// missing parent directories. Refused: anything but a regular file at the end (a FIFO
    /// is opened without blocking, so a FIFO nobody reads fails at once, one somebody reads
    /// is refused), a symlink anywhere, a path leaving the workspace.
    pub fn put(&self, path: &str, mode: u32, data: &[u8]) -> Result<(), FileError> {
        let rel = self.rel(path)?;
        let mut f = self.create_file(&rel, path, mode)?;
        f.write_all(data).map_err(|e| write_error(path, &e))
    }

    /// Makes the directory `rel` and its missing parents, one by one, each opened beneath
    /// the one before without following symlinks and handed to the sandbox user; existing
    /// directories are kept. Returns the directory, held open.
    pub(crate) fn make_dirs(&self, rel: &str, shown: &str) -> Result<OwnedFd, FileError> {
        self.walk(rel, true).map_err(|s| match s.errno {
            Errno::ENOTDIR => (
                ErrorCode::PathRefused,
                format!(
                    "{shown}: {}/{} is not a directory",
                    if self.outside { "" } else { "/work" },
                    s.at
                ),
            ),
            e => refuse_errno(shown, e),
        })
    }

    /// Creates or truncates the regular file `rel` (parents made), owned by the sandbox
    /// user, with permission bits `mode & 0o777`. Refused: anything but a regular file at
    /// the end (a FIFO is opened without blocking), a symlink anywhere.
    pub(crate) fn create_file(&self, rel: &str, shown: &str, mode: u32) -> Result<File, FileError> {
        let (dirs, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let parent = self.make_dirs(dirs, shown)?;
        // Not O_TRUNC: only a file found to be regular is truncated.
        let fd = self
            .open_entry(
                parent.as_fd(),
                name,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK,
                Mode::from_bits_truncate(mode & 0o777),
            )
            .map_err(|e| match e {
                // A FIFO without a reader (or a socket), a directory: not a file.
                Errno::ENXIO | Errno::EISDIR => not_regular(shown),
                e => refuse_errno(shown, e),
            })?;
        let st = fstat(&fd).map_err(|e| refuse_errno(shown, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(not_regular(shown));
        }
        fcntl(&fd, FcntlArg::F_SETFL(OFlag::empty())).map_err(|e| refuse_errno(shown, e))?;
        crate::metadata::clear(&fd).map_err(|e| metadata_error(shown, e))?;
        self.hand_over(&fd);
        let f = File::from(fd);
        f.set_len(0).map_err(|e| write_error(shown, &e))?;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777));
        Ok(f)
    }

    /// Runs one [`cordon_core::FileOp`].
    pub fn op(&self, op: &cordon_core::FileOp) -> Result<FileReply, FileError> {
        use cordon_core::FileOp;
        match op {
            FileOp::List { path } => self.list(path),
            FileOp::Stat { path } => self.stat(path).map(|entry| FileReply::Entry { entry }),
            FileOp::Remove { path, recursive } => {
                self.remove(path, *recursive).map(|()| FileReply::Done)
            }
            FileOp::Rename { from, to } => self.rename(from, to).map(|()| FileReply::Done),
            FileOp::Mkdir { path, parents } => self.mkdir(path, *parents).map(|()| FileReply::Done),
            FileOp::SetMetadata { path, metadata } => {
                self.set_metadata(path, metadata).map(|()| FileReply::Done)
            }
        }
    }

    /// The entries of a directory, sorted by name, at most [`MAX_LIST_ENTRIES`]; symlinks
    /// are reported as symlinks, never followed.
    pub fn list(&self, path: &str) -> Result<FileReply, FileError> {
        let rel = self.rel_dir(path)?;
        let fd = self.open_dir(&rel).map_err(|e| dir_errno(path, e))?;
        let mut names = read_names(&fd).map_err(|e| refuse_errno(path, e))?;
        names.sort();
        let truncated = names.len() > MAX_LIST_ENTRIES;
        names.truncate(MAX_LIST_ENTRIES);
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            // An entry removed since the directory was read is left out.
            if let Ok(st) = fstatat(&fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                let target = link_text(&fd, &name, &st);
                let metadata = metadata_of(&fd, &name, &st);
                entries.push(FileEntry {
                    target,
                    metadata,
                    ..entry_of(name, &st)
                });
            }
        }
        Ok(FileReply::Entries { entries, truncated })
    }

    /// One entry; a symlink is reported as one, not followed.
    pub fn stat(&self, path: &str) -> Result<FileEntry, FileError> {
        let rel = self.rel_dir(path)?;
        if rel.is_empty() {
            let st = fstat(&self.root).map_err(|e| refuse_errno(path, e))?;
            let name = if self.outside {
                "/"
            } else {
                cordon_core::WORKDIR
            };
            return Ok(entry_of(name.to_string(), &st));
        }
        let (parent, name) = self.parent_of(&rel).map_err(|e| refuse_errno(path, e))?;
        let st = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| refuse_errno(path, e))?;
        Ok(FileEntry {
            target: link_text(&parent, name, &st),
            metadata: metadata_of(&parent, name, &st),
            ..entry_of(name.to_string(), &st)
        })
    }

    /// Makes the user metadata of a file or directory (not the workspace itself) exactly
    /// `metadata` (checked first): attributes in the namespace that are not in it are
    /// removed; see [`crate::metadata`].
    pub fn set_metadata(
        &self,
        path: &str,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), FileError> {
        let rel = check_path(path)?;
        let (parent, name) = self.parent_of(&rel).map_err(|e| refuse_errno(path, e))?;
        let st = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| refuse_errno(path, e))?;
        cordon_core::check_metadata(metadata).map_err(|e| (ErrorCode::BadRequest, e.0))?;
        let fd = open_entry(&parent, name, &st)
            .map_err(|e| metadata_error(path, e))?
            .ok_or_else(|| {
                (
                    ErrorCode::PathRefused,
                    format!(
                        "{path} is not a file or directory; metadata goes on files and directories"
                    ),
                )
            })?;
        crate::metadata::replace(&fd, metadata).map_err(|e| metadata_error(path, e))
    }

    /// Removes a file, a symlink (itself) or an empty directory; with `recursive`, a
    /// directory and everything beneath it, each level opened without following symlinks.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        let rel = self.rel(path)?;
        let (parent, name) = self.parent_of(&rel).map_err(|e| refuse_errno(path, e))?;
        let st = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| refuse_errno(path, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir)
                .map_err(|e| refuse_errno(path, e));
        }
        if recursive {
            return remove_tree(parent.as_fd(), name, 0).map_err(|e| match e {
                Errno::E2BIG => (
                    ErrorCode::Io,
                    format!("{path}: nested deeper than {MAX_DEPTH} levels; remove it in parts"),
                ),
                e => refuse_errno(path, e),
            });
        }
        unlinkat(&parent, name, UnlinkatFlags::RemoveDir).map_err(|e| match e {
            Errno::ENOTEMPTY | Errno::EEXIST => (
                ErrorCode::Io,
                format!(
                    "{path} is a directory that is not empty; remove it with recursive set, or \
                     empty it first"
                ),
            ),
            e => refuse_errno(path, e),
        })
    }

    /// Renames `from` to `to` (both under `/work`; a file at `to` is replaced). A symlink
    /// is renamed itself; neither path may pass through one.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), FileError> {
        let rf = self.rel(from)?;
        let rt = self.rel(to)?;
        let (pf, nf) = self.parent_of(&rf).map_err(|e| refuse_errno(from, e))?;
        let (pt, nt) = self.parent_of(&rt).map_err(|e| refuse_errno(to, e))?;
        renameat(&pf, nf, &pt, nt).map_err(|e| match e {
            Errno::ENOENT => (ErrorCode::NotFound, format!("{from} does not exist")),
            Errno::EISDIR | Errno::ENOTDIR | Errno::ENOTEMPTY | Errno::EEXIST => (
                ErrorCode::Io,
                format!(
                    "cannot rename {from} to {to}: {to} is a directory that is not empty, or \
                     one of them is a directory and the other is not; remove {to} first"
                ),
            ),
            Errno::EINVAL => (
                ErrorCode::Io,
                format!("cannot move {from} into itself ({to}); give another destination"),
            ),
            e => refuse_errno(from, e),
        })
    }

    /// Makes a directory; with `parents`, its missing parents too, and an existing
    /// directory is not an error.
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<(), FileError> {
        let rel = self.rel(path)?;
        if parents {
            return self.make_dirs(&rel, path).map(drop);
        }
        let (parent, name) = self.parent_of(&rel).map_err(|e| refuse_errno(path, e))?;
        mkdirat(&parent, name, Mode::from_bits_truncate(0o755)).map_err(|e| match e {
            Errno::EEXIST => (
                ErrorCode::Io,
                format!("{path} already exists; set parents to accept an existing directory"),
            ),
            Errno::ENOENT => (
                ErrorCode::NotFound,
                format!("the parent of {path} does not exist; set parents to make it too"),
            ),
            e => refuse_errno(path, e),
        })?;
        if let Ok(fd) = open_at(
            parent.as_fd(),
            name,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        ) {
            self.hand_over(&fd);
            let _ = fchmod(&fd, Mode::from_bits_truncate(0o755));
        }
        Ok(())
    }

    /// Reads at most `max` bytes of `path`; the flag says there was more. Refused as
    /// [`Workspace::put`] refuses.
    pub fn get(&self, path: &str, max: u64) -> Result<(Vec<u8>, bool), FileError> {
        let rel = self.rel(path)?;
        let (parent, name) = self.parent_of(&rel).map_err(|e| refuse_errno(path, e))?;
        let fd = self
            .open_entry(
                parent.as_fd(),
                name,
                OFlag::O_RDONLY | OFlag::O_NONBLOCK,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::ENXIO => not_regular(path),
                e => refuse_errno(path, e),
            })?;
        let st = fstat(&fd).map_err(|e| refuse_errno(path, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(not_regular(path));
        }
        let cap = max.min(crate::proto::MAX_FRAME as u64 - 4096);
        let mut data = Vec::new();
        File::from(fd)
            .take(cap + 1)
            .read_to_end(&mut data)
            .map_err(|e| (ErrorCode::Io, format!("reading {path}: {e}")))?;
        let truncated = data.len() as u64 > cap;
        data.truncate(cap as usize);
        Ok((data, truncated))
    }
}

/// Where a walk stopped: the error, and the prefix of the path it was walking.
#[derive(Debug)]
pub(crate) struct Stuck {
    pub(crate) errno: Errno,
    pub(crate) at: String,
}

/// The directory `rel` beneath `top` (`rel` empty: `top` again), one component at a time
/// (see [`Workspace::walk`]); with `make`, missing directories are made and handed to its
/// user. A component that is a symlink is `ELOOP`, one that is not a directory `ENOTDIR`.
pub(crate) fn walk_from(
    top: BorrowedFd<'_>,
    rel: &str,
    make: Option<&Workspace>,
) -> Result<OwnedFd, Stuck> {
    walk_in(top, rel, make, false)
}

/// [`walk_from`]; with `crossing`, into other mounts too (never a kernel filesystem).
fn walk_in(
    top: BorrowedFd<'_>,
    rel: &str,
    make: Option<&Workspace>,
    crossing: bool,
) -> Result<OwnedFd, Stuck> {
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY;
    let stuck = |errno, end: usize| Stuck {
        errno,
        at: rel[..end].to_string(),
    };
    let mut cur =
        open_step(top, ".", dir_flags, Mode::empty(), crossing).map_err(|e| stuck(e, 0))?;
    if rel.is_empty() {
        return Ok(cur);
    }
    let mut end = 0;
    for part in rel.split('/') {
        end += if end == 0 { part.len() } else { part.len() + 1 };
        let next = match open_step(cur.as_fd(), part, dir_flags, Mode::empty(), crossing) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if make.is_some() => {
                let made = match mkdirat(&cur, part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) => true,
                    Err(Errno::EEXIST) => false,
                    Err(e) => return Err(stuck(e, end)),
                };
                let fd = open_step(cur.as_fd(), part, dir_flags, Mode::empty(), crossing)
                    .map_err(|e| stuck(e, end))?;
                if let (true, Some(ws)) = (made, make) {
                    ws.hand_over(&fd);
                }
                fd
            }
            // A symlink opened with O_DIRECTORY is ENOTDIR: told apart by a look at the
            // name itself (in the directory held, never through a link).
            Err(Errno::ENOTDIR) => {
                let st = fstatat(&cur, part, AtFlags::AT_SYMLINK_NOFOLLOW);
                return Err(match st {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        stuck(Errno::ELOOP, end)
                    }
                    _ => stuck(Errno::ENOTDIR, end),
                });
            }
            Err(e) => return Err(stuck(e, end)),
        };
        cur = next;
    }
    Ok(cur)
}

/// Opens the entry `name` (one component: no `/`) in `dir`: never through a symlink, a
/// magic link or onto another filesystem, never `name` itself if it is a symlink. A path
/// of several components is `EINVAL`: those are walked with [`walk_from`], one directory
/// descriptor at a time, so the kernel never resolves a path the sandbox could change
/// under it.
pub(crate) fn open_at(
    dir: BorrowedFd<'_>,
    name: &str,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    open_one(dir, name, flags, mode, true)
}

/// [`open_at`], or with `crossing` its twin that may cross into another mount (the sandbox's
/// `/tmp` from its root): never through a symlink or a magic link either way, and never
/// onto a kernel filesystem ([`kernel_fs`]: `EXDEV`).
fn open_step(
    dir: BorrowedFd<'_>,
    name: &str,
    flags: OFlag,
    mode: Mode,
    crossing: bool,
) -> Result<OwnedFd, Errno> {
    if !crossing {
        return open_at(dir, name, flags, mode);
    }
    let fd = open_one(dir, name, flags, mode, false)?;
    if kernel_fs(&fd)? {
        return Err(Errno::EXDEV);
    }
    Ok(fd)
}

/// One name opened beneath `dir`, never through a symlink or a magic link, and with
/// `same_fs` never onto another filesystem.
fn open_one(
    dir: BorrowedFd<'_>,
    name: &str,
    flags: OFlag,
    mode: Mode,
    same_fs: bool,
) -> Result<OwnedFd, Errno> {
    if name.contains('/') || name.is_empty() || name == ".." {
        return Err(Errno::EINVAL);
    }
    let mut resolve = ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if same_fs {
        resolve |= ResolveFlag::RESOLVE_NO_XDEV;
    }
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(resolve);
    match openat2(dir, name, how) {
        // A kernel without openat2 (gVisor's): one name (never `..`, never a path) opened
        // with O_NOFOLLOW is the same step, a symlink (magic or not) `ELOOP`; another
        // filesystem is told by its device. Never with O_DIRECTORY, with which gVisor
        // follows a symlink O_NOFOLLOW refuses: a directory is asked for by its type
        // instead, opened without blocking (so a FIFO in its place never stalls the walk).
        Err(Errno::ENOSYS) => {
            let dir_only = flags.contains(OFlag::O_DIRECTORY);
            let mut plain = (flags - OFlag::O_DIRECTORY) | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            if dir_only {
                plain |= OFlag::O_NONBLOCK;
            }
            let fd = nix::fcntl::openat(dir, name, plain, mode)?;
            let st = fstat(&fd)?;
            if dir_only && st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(Errno::ENOTDIR);
            }
            if same_fs && st.st_dev != fstat(dir)?.st_dev {
                return Err(Errno::EXDEV);
            }
            Ok(fd)
        }
        other => other,
    }
}

/// Whether `fd` is on one of the kernel's own filesystems (its views of processes, devices,
/// cgroups, security modules, tracing, namespaces), which the file API never reaches
/// whatever their name: a `/proc` mounted elsewhere too.
pub(crate) fn kernel_fs(fd: &OwnedFd) -> Result<bool, Errno> {
    // The magic numbers of linux/magic.h, raw: nix names only some of them on musl.
    const KERNEL: [u32; 20] = [
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x0027_e0eb, // cgroup
        0x6367_7270, // cgroup2
        0x1cd1,      // devpts
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0x7363_6673, // securityfs
        0xf97c_ff8c, // selinuxfs
        0x4341_5d53, // smackfs
        0xcafe_4a11, // bpf
        0x6e73_6673, // nsfs
        0x0765_5821, // resctrl
        0x9fa2,      // usbdevfs
        0x4249_4e4d, // binfmt_misc
        0x6265_6570, // configfs
        0xde5e_81e4, // efivarfs
        0x6165_676c, // pstore
        0x6573_5543, // fusectl
        0x1980_0202, // mqueue
    ];
    let kind = nix::sys::statfs::fstatfs(fd)?.filesystem_type().0 as u64 as u32;
    Ok(KERNEL.contains(&kind))
}

/// A path outside the workspace, relative to the sandbox's root, or why it is refused.
fn outside_rel(path: &str, dir: bool) -> Result<String, FileError> {
    match cordon_core::classify_sandbox_path(path, dir) {
        Ok(cordon_core::FileTarget::Outside(rel)) => Ok(rel),
        Ok(cordon_core::FileTarget::Workspace(_)) => Err((
            ErrorCode::PathRefused,
            format!(
                "{path} is in the workspace and the call's other path is not; move a file \
                 between /work and the rest of the sandbox with an exec (mv)"
            ),
        )),
        Err(e) => Err((ErrorCode::PathRefused, e.to_string())),
    }
}

/// The names in a directory (not `.` and `..`), unsorted.
pub(crate) fn read_names(dir: &OwnedFd) -> Result<Vec<String>, Errno> {
    let mut d = Dir::from_fd(dir.try_clone().map_err(|_| Errno::EMFILE)?)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy();
        if name != "." && name != ".." {
            names.push(name.into_owned());
        }
    }
    Ok(names)
}

pub(crate) fn kind_of(st: &FileStat) -> FileKind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::File,
    }
}

pub(crate) fn entry_of(name: String, st: &FileStat) -> FileEntry {
    FileEntry {
        name,
        kind: kind_of(st),
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        mtime_ms: st.st_mtime.saturating_mul(1000) + st.st_mtime_nsec / 1_000_000,
        target: None,
        metadata: Default::default(),
    }
}

/// A symlink's text (read, never followed), for the entry `name` in `dir` that `st` is of.
fn link_text(dir: &OwnedFd, name: &str, st: &FileStat) -> Option<String> {
    if kind_of(st) != FileKind::Symlink {
        return None;
    }
    nix::fcntl::readlinkat(dir, name)
        .ok()
        .map(|t| t.to_string_lossy().into_owned())
}

/// Removes the directory `name` in `parent` and everything beneath it; `E2BIG` past
/// [`MAX_DEPTH`] levels.
fn remove_tree(parent: BorrowedFd<'_>, name: &str, depth: usize) -> Result<(), Errno> {
    if depth >= MAX_DEPTH {
        return Err(Errno::E2BIG);
    }
    let dir = open_at(
        parent,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )?;
    for child in read_names(&dir)? {
        let st = match fstatat(&dir, child.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            remove_tree(dir.as_fd(), &child, depth + 1)?;
        } else {
            match unlinkat(&dir, child.as_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    unlinkat(parent, name, UnlinkatFlags::RemoveDir)
}

pub(crate) fn check_path(path: &str) -> Result<String, FileError> {
    cordon_core::validate_sandbox_path(path).map_err(|e| (ErrorCode::PathRefused, e.to_string()))
}

pub(crate) fn check_dir(path: &str) -> Result<String, FileError> {
    cordon_core::validate_sandbox_dir(path).map_err(|e| (ErrorCode::PathRefused, e.to_string()))
}

/// A directory that could not be opened as one.
pub(crate) fn dir_errno(path: &str, e: Errno) -> FileError {
    match e {
        Errno::ENOTDIR => (
            ErrorCode::PathRefused,
            format!("{path} is not a directory; give a directory path"),
        ),
        e => refuse_errno(path, e),
    }
}

pub(crate) fn not_regular(path: &str) -> FileError {
    (
        ErrorCode::PathRefused,
        format!("{path} is not a regular file (a FIFO, socket or directory); give a file path"),
    )
}

pub(crate) fn write_error(path: &str, e: &io::Error) -> FileError {
    let what = if e.raw_os_error() == Some(libc::ENOSPC) {
        "no space left in /work (the sandbox's disk limit)".to_string()
    } else {
        e.to_string()
    };
    (ErrorCode::Io, format!("writing {path}: {what}"))
}

/// Opens the entry `name` in `dir` that `st` (from `fstatat` without following) describes,
/// to read or set its attributes: beneath `dir` by [`open_at`] (never through a symlink);
/// `None` for kinds that carry none. `ESTALE` when what is there now is not the entry `st`
/// described.
fn open_entry(dir: &OwnedFd, name: &str, st: &FileStat) -> Result<Option<OwnedFd>, Errno> {
    let Some(flags) = crate::metadata::open_flags(st) else {
        return Ok(None);
    };
    let fd = open_at(dir.as_fd(), name, flags, Mode::empty())?;
    let now = fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(Errno::ESTALE);
    }
    Ok(Some(fd))
}

/// The user metadata of the entry `name` in `dir` (`st` its `fstatat` without following):
/// empty for kinds that carry none, or when it cannot be read (gone, unreadable).
fn metadata_of(
    dir: &OwnedFd,
    name: &str,
    st: &FileStat,
) -> std::collections::BTreeMap<String, String> {
    match open_entry(dir, name, st) {
        Ok(Some(fd)) => crate::metadata::read(&fd),
        _ => std::collections::BTreeMap::new(),
    }
}

/// A failed metadata write of `path`: the attributes' own errors, else the file's.
fn metadata_error(path: &str, e: Errno) -> FileError {
    crate::metadata::set_error(path, e).unwrap_or_else(|| refuse_errno(path, e))
}

pub(crate) fn refuse_errno(path: &str, e: Errno) -> FileError {
    match e {
        Errno::ELOOP | Errno::EXDEV => (
            ErrorCode::PathRefused,
            format!(
                "refused path {path:?}: it is or passes through a symlink or another filesystem"
            ),
        ),
        Errno::ENOENT => (ErrorCode::NotFound, format!("{path} does not exist")),
        Errno::ENOTDIR => (
            ErrorCode::PathRefused,
            format!("{path}: a parent is not a directory"),
        ),
        Errno::ENOSPC => (
            ErrorCode::Io,
            format!("{path}: no space left in /work (the sandbox's disk limit)"),
        ),
        e => (ErrorCode::Io, format!("{path}: {e}")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A workspace over a fresh temporary directory, owned by this process's ids.
    pub(crate) fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let ws = Workspace::open(dir.path(), uid, gid).unwrap();
        (dir, ws)
    }

    #[test]
    fn files_go_in_and_come_out_beneath_the_root() {
        let (dir, ws) = workspace();
        ws.put("/work/a/b/c.txt", 0o640, b"hello").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("a/b/c.txt")).unwrap(),
            b"hello"
        );
        // A shorter write replaces the whole file.
        ws.put("a/b/c.txt", 0o640, b"hi").unwrap();
        assert_eq!(
            ws.get("/work/a/b/c.txt", 100).unwrap(),
            (b"hi".to_vec(), false)
        );
        assert_eq!(ws.get("a/b/c.txt", 1).unwrap(), (b"h".to_vec(), true));
        assert_eq!(ws.get("/work/none", 10).unwrap_err().0, ErrorCode::NotFound);
    }

    #[test]
    fn symlinks_fifos_and_directories_are_refused_without_blocking() {
        let (dir, ws) = workspace();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        assert_eq!(
            ws.put("/work/link/x", 0o644, b"x").unwrap_err().0,
            ErrorCode::PathRefused
        );
        assert!(!outside.path().join("x").exists());
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("host")).unwrap();
        assert_eq!(ws.get("host", 10).unwrap_err().0, ErrorCode::PathRefused);
        // A FIFO nobody reads: before, the open blocked for as long as nobody read.
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::from_bits_truncate(0o666)).unwrap();
        let e = ws.put("/work/fifo", 0o644, b"x").unwrap_err();
        assert_eq!(e.0, ErrorCode::PathRefused, "{e:?}");
        assert!(e.1.contains("not a regular file"), "{e:?}");
        assert_eq!(
            ws.get("/work/fifo", 10).unwrap_err().0,
            ErrorCode::PathRefused
        );
        // A FIFO somebody holds open for reading is refused too, and gets no bytes.
        let reader = nix::fcntl::open(
            &dir.path().join("fifo"),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .unwrap();
        assert_eq!(
            ws.put("/work/fifo", 0o644, b"x").unwrap_err().0,
            ErrorCode::PathRefused
        );
        let mut buf = [0u8; 4];
        let got = nix::unistd::read(&reader, &mut buf);
        assert!(matches!(got, Ok(0) | Err(Errno::EAGAIN)), "{got:?}");
        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert_eq!(
            ws.put("d", 0o644, b"x").unwrap_err().0,
            ErrorCode::PathRefused
        );
        assert_eq!(ws.get("d", 10).unwrap_err().0, ErrorCode::PathRefused);
    }

    #[test]
    fn only_one_name_reaches_an_at_call() {
        let (dir, ws) = workspace();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY;
        let root = ws.root.as_fd();
        for name in ["a/b", "", "..", "/a"] {
            let got = open_at(root, name, flags, Mode::empty()).map(drop);
            assert_eq!(got, Err(Errno::EINVAL), "{name:?}");
        }
        assert!(open_at(root, "a", flags, Mode::empty()).is_ok());
        assert!(ws.walk("a/b", false).is_ok());
        // Where a walk stops is named by the prefix walked.
        std::fs::write(dir.path().join("a/f"), b"").unwrap();
        std::os::unix::fs::symlink("b", dir.path().join("a/l")).unwrap();
        let s = ws.walk("a/f/x", true).unwrap_err();
        assert_eq!((s.errno, s.at.as_str()), (Errno::ENOTDIR, "a/f"));
        let s = ws.walk("a/l/x", true).unwrap_err();
        assert_eq!((s.errno, s.at.as_str()), (Errno::ELOOP, "a/l"));
        assert!(!dir.path().join("a/b/x").exists());
    }
}
