//! The snapshot store: agent-ready VMs saved once per shape, restored by every new sandbox
//! of that shape.
//!
//! QEMU never gets a path into it. The directory is root's (mode 0700); a template VM
//! writes its snapshot through a descriptor Cordon created there (QMP `getfd` + `migrate
//! fd:`), and a restoring QEMU reads one through a descriptor Cordon opened (`-incoming
//! fd:3`). Nothing in it is ever followed as a link or taken from a directory QEMU can
//! write. A snapshot is installed with the SHA-256 of its bytes beside it, and its bytes are
//! checked against that digest the first time this process restores from it. Snapshots
//! are collected least recently used first, beyond a count and a total size.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};

use crate::MicrovmError;

/// One file's identity: device, inode, size.
type Identity = (u64, u64, u64);

/// See the module documentation.
pub struct SnapshotStore {
    dir: PathBuf,
    /// Most snapshots kept, and their largest total size in bytes.
    max_count: usize,
    max_bytes: u64,
    /// One lock per key: a template boot holds only its own key's.
    making: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Snapshots whose bytes matched their digest in this process.
    verified: Mutex<HashMap<String, Identity>>,
}

fn io_err(what: &str, e: impl Into<io::Error>) -> MicrovmError {
    MicrovmError::io(what.to_string(), e.into())
}

fn snap_name(key: &str) -> String {
    format!("{key}.snap")
}

fn digest_name(key: &str) -> String {
    format!("{key}.sha256")
}

impl SnapshotStore {
    pub fn new(dir: PathBuf, max_count: usize, max_bytes: u64) -> Self {
        SnapshotStore {
            dir,
            max_count: max_count.max(1),
            max_bytes,
            making: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The store's directory, created root-only if missing; refused if anyone else could
    /// write in it.
    fn open_dir(&self) -> Result<OwnedFd, MicrovmError> {
        if let Some(parent) = self.dir.parent() {
            fs::create_dir_all(parent).map_err(|e| io_err("creating the snapshot directory", e))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating the snapshot directory", e)),
        }
        let fd = nix::fcntl::open(
            &self.dir,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("opening the snapshot directory", e))?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| io_err("the snapshot directory", e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            return Err(MicrovmError::Qemu(
                "the snapshot directory belongs to another user; remove it (it is remade)".into(),
            ));
        }
        if st.st_mode & 0o077 != 0 {
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))
                .map_err(|e| io_err("making the snapshot directory private", e))?;
        }
        Ok(fd)
    }

    /// The lock of one key (held while its template boots and is saved).
    pub fn key_lock(&self, key: &str) -> Arc<Mutex<()>> {
        self.making
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// The snapshot of `key`, opened read-only, if there is a good one. A file that is not a
    /// plain root-owned file, or whose bytes do not match its digest, is removed.
    pub fn open(&self, key: &str) -> Result<Option<fs::File>, MicrovmError> {
        let dir = self.open_dir()?;
        let fd = match openat(
            &dir,
            snap_name(key).as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(_) => {
                self.remove(&dir, key);
                return Ok(None);
            }
        };
        let file = fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| io_err("reading a snapshot", e))?;
        let owner = nix::unistd::geteuid().as_raw();
        if !meta.is_file() || meta.uid() != owner || meta.nlink() != 1 || meta.mode() & 0o022 != 0 {
            tracing::warn!(key, "a snapshot that is not a private file was removed");
            self.remove(&dir, key);
            return Ok(None);
        }
        let id = (meta.dev(), meta.ino(), meta.size());
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            == Some(&id);
        if !known {
            let want = self.read_digest(&dir, key);
            let have = digest_of(&file).map_err(|e| io_err("reading a snapshot", e))?;
            if want.as_deref() != Some(have.as_str()) {
                tracing::warn!(key, "a snapshot did not match its digest and was removed");
                self.remove(&dir, key);
                return Ok(None);
            }
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_string(), id);
        }
        // Used now: the least recently used snapshots are collected first.
        let _ = file.set_modified(SystemTime::now());
        Ok(Some(file))
    }

    fn read_digest(&self, dir: &OwnedFd, key: &str) -> Option<String> {
        let fd = openat(
            dir,
            digest_name(key).as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut text = String::new();
        fs::File::from(fd)
            .take(128)
            .read_to_string(&mut text)
            .ok()?;
        Some(text.trim().to_string())
    }

    fn remove(&self, dir: &OwnedFd, key: &str) {
        let _ = unlinkat(dir, snap_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        let _ = unlinkat(dir, digest_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// A new, empty, private file for a template VM to write its snapshot into, and its name.
    pub fn create_partial(&self) -> Result<(fs::File, String), MicrovmError> {
        let dir = self.open_dir()?;
        let mut suffix = [0u8; 6];
        getrandom::fill(&mut suffix)
            .map_err(|e| MicrovmError::Qemu(format!("no randomness: {e}")))?;
        let name = format!("partial-{}", hex::encode(suffix));
        let fd = openat(
            &dir,
            name.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("creating a snapshot file", e))?;
        Ok((fs::File::from(fd), name))
    }

    /// Removes a partial snapshot that will not be installed.
    pub fn discard_partial(&self, name: &str) {
        if let Ok(dir) = self.open_dir() {
            let _ = unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir);
        }
    }

    /// Installs a partial snapshot as `key`'s: its digest is recorded first, then it is
    /// renamed into place. Returns it opened read-only.
    pub fn install(
        &self,
        partial: &str,
        file: fs::File,
        key: &str,
    ) -> Result<fs::File, MicrovmError> {
        let dir = self.open_dir()?;
        file.sync_all()
            .map_err(|e| io_err("writing the snapshot", e))?;
        let reader = openat(
            &dir,
            partial,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(fs::File::from)
        .map_err(|e| io_err("reading the snapshot back", e))?;
        drop(file);
        let sum = digest_of(&reader).map_err(|e| io_err("reading the snapshot back", e))?;
        let digest_tmp = format!("{partial}.sha256");
        let fd = openat(
            &dir,
            digest_tmp.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("recording the snapshot digest", e))?;
        let mut df = fs::File::from(fd);
        df.write_all(sum.as_bytes())
            .and_then(|_| df.sync_all())
            .map_err(|e| io_err("recording the snapshot digest", e))?;
        renameat(&dir, digest_tmp.as_str(), &dir, digest_name(key).as_str())
            .map_err(|e| io_err("recording the snapshot digest", e))?;
        renameat(&dir, partial, &dir, snap_name(key).as_str())
            .map_err(|e| io_err("installing the snapshot", e))?;
        let meta = reader
            .metadata()
            .map_err(|e| io_err("reading the snapshot back", e))?;
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), (meta.dev(), meta.ino(), meta.size()));
        Ok(reader)
    }

    /// Removes the least recently used snapshots (never `keep`) until at most `max_count`
    /// remain and they take at most `max_bytes` together. Restored VMs keep reading theirs
    /// through their own descriptors. Returns the keys removed.
    pub fn collect(&self, keep: &str) -> Vec<String> {
        let Ok(dir) = self.open_dir() else {
            return Vec::new();
        };
        let mut snaps: Vec<(SystemTime, u64, String)> = Vec::new();
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(key) = name.strip_suffix(".snap") else {
                    continue;
                };
                let Ok(meta) = e.metadata() else { continue };
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                snaps.push((used, meta.len(), key.to_string()));
            }
        }
        // Newest first; the one just made or used counts as newest.
        snaps.sort_by_key(|s| std::cmp::Reverse((s.2 == keep, s.0)));
        let (mut count, mut bytes) = (0usize, 0u64);
        let mut removed = Vec::new();
        for (_, size, key) in snaps {
            if key != keep && (count + 1 > self.max_count || bytes + size > self.max_bytes) {
                self.remove(&dir, &key);
                removed.push(key);
                continue;
            }
            count += 1;
            bytes += size;
        }
        removed
    }

    /// Removes every snapshot (they are remade on demand).
    pub fn clear(&self) -> io::Result<()> {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// SHA-256 of a whole file, read through the descriptor from offset 0.
fn digest_of(f: &fs::File) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(hex::encode(h.finalize()))
}
