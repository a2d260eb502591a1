//! Files in and out of a sandbox's workspace, opened beneath its root: never through a
//! symlink or onto another filesystem, never blocking on a FIFO the sandbox planted, and
//! only ever a regular file. Used by the agent inside a sandbox and by tiers that reach
//! the workspace from the host (gvisor).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, OpenHow, ResolveFlag, fcntl, openat2};
use nix::sys::stat::{Mode, fstat, mkdirat};
use nix::unistd::{Gid, Uid, fchown};

use crate::proto::ErrorCode;

/// A refusal or failure, with the code the agent protocol carries and a message that names
/// only the sandbox path.
pub type FileError = (ErrorCode, String);

/// A workspace directory, held open; files are opened beneath it and owned by `uid`/`gid`.
pub struct Workspace {
    root: OwnedFd,
    uid: u32,
    gid: u32,
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
        Ok(Workspace { root, uid, gid })
    }

    fn open_beneath(&self, rel: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        openat2(self.root.as_fd(), rel, how)
    }

    fn hand_over(&self, fd: &OwnedFd) {
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
        let rel = check_path(path)?;
        // Create parent directories one by one, each opened without following symlinks.
        if let Some((dirs, _)) = rel.rsplit_once('/') {
            let mut sofar = String::new();
            for part in dirs.split('/') {
                if !sofar.is_empty() {
                    sofar.push('/');
                }
                sofar.push_str(part);
                match self.open_beneath(&sofar, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
                {
                    Ok(_) => {}
                    Err(Errno::ENOENT) => {
                        mkdirat(
                            self.root.as_fd(),
                            sofar.as_str(),
                            Mode::from_bits_truncate(0o755),
                        )
                        .map_err(|e| refuse_errno(path, e))?;
                        let fd = self
                            .open_beneath(
                                &sofar,
                                OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                                Mode::empty(),
                            )
                            .map_err(|e| refuse_errno(path, e))?;
                        self.hand_over(&fd);
                    }
                    Err(e) => return Err(refuse_errno(path, e)),
                }
            }
        }
        // Not O_TRUNC: only a file found to be regular is truncated.
        let fd = self
            .open_beneath(
                &rel,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK,
                Mode::from_bits_truncate(mode & 0o777),
            )
            .map_err(|e| match e {
                // A FIFO without a reader (or a socket), a directory: not a file.
                Errno::ENXIO | Errno::EISDIR => not_regular(path),
                e => refuse_errno(path, e),
            })?;
        let st = fstat(&fd).map_err(|e| refuse_errno(path, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(not_regular(path));
        }
        fcntl(&fd, FcntlArg::F_SETFL(OFlag::empty())).map_err(|e| refuse_errno(path, e))?;
        self.hand_over(&fd);
        let mut f = File::from(fd);
        f.set_len(0).map_err(|e| write_error(path, &e))?;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777));
        f.write_all(data).map_err(|e| write_error(path, &e))
    }

    /// Reads at most `max` bytes of `path`; the flag says there was more. Refused as
    /// [`Workspace::put`] refuses.
    pub fn get(&self, path: &str, max: u64) -> Result<(Vec<u8>, bool), FileError> {
        let rel = check_path(path)?;
        let fd = self
            .open_beneath(&rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())
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

fn check_path(path: &str) -> Result<String, FileError> {
    cordon_core::validate_sandbox_path(path).map_err(|e| (ErrorCode::PathRefused, e.to_string()))
}

fn not_regular(path: &str) -> FileError {
    (
        ErrorCode::PathRefused,
        format!("{path} is not a regular file (a FIFO, socket or directory); give a file path"),
    )
}

fn write_error(path: &str, e: &io::Error) -> FileError {
    let what = if e.raw_os_error() == Some(libc::ENOSPC) {
        "no space left in /work (the sandbox's disk limit)".to_string()
    } else {
        e.to_string()
    };
    (ErrorCode::Io, format!("writing {path}: {what}"))
}

fn refuse_errno(path: &str, e: Errno) -> FileError {
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
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
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
}
