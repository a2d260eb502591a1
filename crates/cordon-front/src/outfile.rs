//! Writing a file taken out of a sandbox (`cordon run --out`) onto the host, as root, into a
//! directory the invoker names: never through a link someone planted there.
//!
//! The directory is reached one component at a time from `/` (or the working directory),
//! each opened beneath the one before with `O_NOFOLLOW`: a symbolic link anywhere on the path
//! (a user's directory swapped for a link to a root-only one) is refused, not followed, and
//! nothing on the path can be swapped between the check and the write (each step holds the
//! directory it checked open).
//!
//! The bytes go to a fresh file of an unguessable name, created exclusively and without
//! following links beneath the destination directory (held open), synced, then renamed onto
//! the destination (a rename replaces a link planted at that name; it never writes through
//! it). A directory other users may write without the sticky bit is refused: there they could
//! replace the temporary file between its write and its rename.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use anyhow::{Context, Result, anyhow, bail};
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Writes `data` to `dest` atomically (see the module docs).
pub fn write_atomically(dest: &Path, data: &[u8]) -> Result<()> {
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .ok_or_else(|| anyhow!("{} names no file; give a file path", dest.display()))?;
    let dirfd = open_dir_nofollow(dir)?;
    check_dir(&dirfd, dir)?;
    let tmp = format!(".cordon-out-{}", cordon_core::SandboxId::random()?);
    let fd = openat(
        &dirfd,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o666),
    )
    .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(data)
        .and_then(|_| file.sync_all())
        .with_context(|| format!("writing a temporary file in {}", dir.display()))
        .and_then(|_| {
            renameat(&dirfd, tmp.as_str(), &dirfd, name)
                .with_context(|| format!("renaming into {}", dest.display()))
        });
    if written.is_err() {
        let _ = unlinkat(&dirfd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        return written;
    }
    // The rename itself reaches the disk with the directory.
    let _ = nix::unistd::fsync(dirfd.as_fd());
    Ok(())
}

/// Opens `dir` as a directory, each component beneath the one before and none through a
/// symbolic link.
fn open_dir_nofollow(dir: &Path) -> Result<OwnedFd> {
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let start = if dir.is_absolute() { "/" } else { "." };
    let mut fd = nix::fcntl::open(start, dir_flags, Mode::empty())
        .with_context(|| format!("opening {start} to reach {}", dir.display()))?;
    let mut walked = std::path::PathBuf::from(if dir.is_absolute() { "/" } else { "" });
    for comp in dir.components() {
        let name = match comp {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => std::ffi::OsStr::new(".."),
            Component::Normal(n) => n,
            Component::Prefix(_) => bail!("{} is not a Linux path", dir.display()),
        };
        walked.push(name);
        let next = openat(&fd, name, dir_flags | OFlag::O_NOFOLLOW, Mode::empty());
        fd = match next {
            Ok(next) => next,
            Err(e) => {
                let link =
                    nix::sys::stat::fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits());
                if link {
                    bail!(
                        "{} is a symbolic link: --out writes only through real directories, \
                         so that a link on the path cannot carry the file elsewhere; give the \
                         path without links",
                        walked.display()
                    );
                }
                return Err(e)
                    .with_context(|| format!("opening the directory {}", walked.display()));
            }
        };
    }
    Ok(fd)
}

/// Refuses a directory someone other than us (or root) may write, unless it is sticky.
fn check_dir(dirfd: &OwnedFd, dir: &Path) -> Result<()> {
    let st = fstat(dirfd).with_context(|| format!("inspecting {}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    let others_write = mode & 0o022 != 0 || (st.st_uid != me && st.st_uid != 0);
    if others_write && !sticky {
        bail!(
            "{} can be written by other users (mode {mode:04o}, owner uid {}) and has no sticky bit, \
             so a file planted there could take the write; write into a directory only you can \
             write, or set its sticky bit (chmod +t)",
            dir.display(),
            st.st_uid
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_file_lands_whole_and_nothing_else_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.txt");
        write_atomically(&dest, b"first").unwrap();
        write_atomically(&dest, b"second").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    /// A link planted at the name the old code wrote its temporary file to (fixed, with
    /// our pid) or at the destination never carries the write to its target.
    #[test]
    fn planted_links_are_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o1777);
        let victim = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(victim.path(), b"precious").unwrap();
        let old_tmp = dir
            .path()
            .join(format!(".out.txt.cordon-tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(victim.path(), &old_tmp).unwrap();
        let dest = dir.path().join("out.txt");
        write_atomically(&dest, b"sandbox bytes").unwrap();
        assert_eq!(std::fs::read(victim.path()).unwrap(), b"precious");
        assert_eq!(std::fs::read(&dest).unwrap(), b"sandbox bytes");
        // A link at the destination itself is replaced by the file.
        let dest2 = dir.path().join("out2.txt");
        std::os::unix::fs::symlink(victim.path(), &dest2).unwrap();
        write_atomically(&dest2, b"more").unwrap();
        assert_eq!(std::fs::read(victim.path()).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&dest2).unwrap().is_file());
    }

    /// A user's directory on the path swapped for a link to a directory only root may
    /// write: the write is refused, nothing lands behind the link.
    #[test]
    fn a_link_in_a_parent_directory_is_refused_not_followed() {
        let top = tempfile::tempdir().unwrap();
        let private = top.path().join("root-only");
        std::fs::create_dir(&private).unwrap();
        chmod(&private, 0o700);
        let user = top.path().join("user");
        std::fs::create_dir(&user).unwrap();
        std::os::unix::fs::symlink(&private, user.join("out")).unwrap();
        let dest = user.join("out").join("cron-job");
        let e = format!(
            "{:#}",
            write_atomically(&dest, b"* * * * * root evil").unwrap_err()
        );
        assert!(
            e.contains("is a symbolic link") && e.contains("user/out"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0);
        // A link higher up, and a relative path through one, too.
        let up = top.path().join("up");
        std::os::unix::fs::symlink(top.path(), &up).unwrap();
        let e = format!("{:#}", write_atomically(&up.join("x"), b"x").unwrap_err());
        assert!(e.contains("is a symbolic link"), "{e}");
        assert!(!top.path().join("x").exists());
        // A real path still works, with `.` and `..` in it.
        let real = user.join("real");
        std::fs::create_dir(&real).unwrap();
        let via = user
            .join(".")
            .join("real")
            .join("..")
            .join("real")
            .join("f");
        write_atomically(&via, b"ok").unwrap();
        assert_eq!(std::fs::read(real.join("f")).unwrap(), b"ok");
    }

    #[test]
    fn a_directory_others_may_write_without_the_sticky_bit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o777);
        let dest = dir.path().join("out.txt");
        let e = format!("{:#}", write_atomically(&dest, b"x").unwrap_err());
        assert!(e.contains("no sticky bit") && e.contains("chmod +t"), "{e}");
        assert!(!dest.exists());
        chmod(dir.path(), 0o775);
        assert!(write_atomically(&dest, b"x").is_err(), "group-writable");
        chmod(dir.path(), 0o1777);
        write_atomically(&dest, b"x").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"x");
    }
}
