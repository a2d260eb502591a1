//! Writing a file taken out of a sandbox (`cordon run --out`) onto the host, as root, into a
//! directory the invoker names: never through a link someone planted there.
//!
//! The bytes go to a fresh file of an unguessable name, created exclusively and without
//! following links beneath the destination directory (held open), synced, then renamed onto
//! the destination (a rename replaces a link planted at that name; it never writes through
//! it). A directory other users may write without the sticky bit is refused: there they could
//! replace the temporary file between its write and its rename.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, fstat};
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
    let dirfd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening the directory {}", dir.display()))?;
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
