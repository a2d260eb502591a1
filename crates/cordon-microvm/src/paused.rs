//! Sandboxes paused to disk: one root-only directory per sandbox, `<paused_dir>/<id>/`,
//! holding the VM's whole state (`state`: a QEMU migration stream with every RAM page,
//! written by QEMU through a descriptor Cordon created) and `manifest.json` (what the VM
//! was started with, the host side's counters, and the stream's size and SHA-256).
//!
//! QEMU never gets a path here: the directory and both files are root's (0700, 0600). The
//! stream is hashed through Cordon's own descriptor once its QEMU is dead, and checked
//! against the manifest before a resume hands it to the new QEMU (a mismatch removes the
//! sandbox's files: nothing is run from them). Nothing here is followed as a link.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use cordon_core::{SandboxId, SandboxSpec};
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::{Deserialize, Serialize};

use crate::MicrovmError;
use crate::qemu::Accel;

const STATE: &str = "state";
const MANIFEST: &str = "manifest.json";
const MANIFEST_TMP: &str = "manifest.json.tmp";
/// The format of `manifest.json` this build writes and reads.
pub const FORMAT: u32 = 1;

/// What a paused VM is restored with, recorded beside its state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub id: String,
    pub spec: SandboxSpec,
    /// `qemu-system-x86_64 --version` of the QEMU that saved it: another cannot load it.
    pub qemu_version: String,
    pub accel: Accel,
    pub vcpus: u32,
    pub ram_mib: u64,
    /// The guest's RAM was the memory backend named `ram` (a VM restored from a snapshot
    /// whose RAM is a file): the resumed VM gets an anonymous backend of that name.
    pub named_ram: bool,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
    pub image_id: String,
    pub kernel_version: String,
    /// The next exec id the host hands out (the guest's background execs keep theirs).
    pub next_exec: u64,
    /// The guest agent serves file operations.
    pub files: bool,
    pub start_us: u64,
    pub state_bytes: u64,
    pub state_sha256: String,
}

/// The store of paused sandboxes.
#[derive(Debug, Clone)]
pub struct PausedStore {
    dir: PathBuf,
}

/// A state file being written by a QEMU (through the descriptor).
pub struct Pending {
    dir: OwnedFd,
    pub state: fs::File,
}

fn io_err(what: &str, e: impl Into<io::Error>) -> MicrovmError {
    MicrovmError::io(what.to_string(), e.into())
}

fn private_dir(path: &Path, parent: bool) -> Result<OwnedFd, MicrovmError> {
    if parent && let Some(p) = path.parent() {
        fs::create_dir_all(p).map_err(|e| io_err("creating the paused sandboxes' directory", e))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("creating the paused sandboxes' directory", e)),
    }
    let fd = nix::fcntl::open(
        path,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("opening the paused sandboxes' directory", e))?;
    let st =
        nix::sys::stat::fstat(&fd).map_err(|e| io_err("the paused sandboxes' directory", e))?;
    if st.st_uid != nix::unistd::geteuid().as_raw() {
        return Err(MicrovmError::Qemu(
            "the paused sandboxes' directory belongs to another user; remove it".into(),
        ));
    }
    if st.st_mode & 0o077 != 0 {
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))
            .map_err(|e| io_err("making the paused sandboxes' directory private", e))?;
    }
    Ok(fd)
}

impl PausedStore {
    pub fn new(dir: PathBuf) -> Self {
        PausedStore { dir }
    }

    fn sandbox_dir(&self, id: &str) -> Result<PathBuf, MicrovmError> {
        // Only the exact shape of an id names a directory (no `..`, no `/`).
        let id = SandboxId::parse(id)
            .ok_or_else(|| MicrovmError::Qemu(format!("{id:?} is not a sandbox id")))?;
        Ok(self.dir.join(id.as_str()))
    }

    /// A new, empty state file for `id`, in a fresh private directory (a stale one of the
    /// same id is removed first).
    pub fn create(&self, id: &str) -> Result<Pending, MicrovmError> {
        private_dir(&self.dir, true)?;
        let path = self.sandbox_dir(id)?;
        self.remove(id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| io_err("creating the sandbox's paused directory", e))?;
        let dir = private_dir(&path, false)?;
        let fd = openat(
            &dir,
            STATE,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("creating the sandbox's state file", e))?;
        Ok(Pending {
            dir,
            state: fs::File::from(fd),
        })
    }

    /// Hashes the written state (its QEMU is dead) and records the manifest; returns the
    /// bytes the sandbox holds on disk.
    pub fn finish(&self, pending: Pending, mut manifest: Manifest) -> Result<u64, MicrovmError> {
        let Pending { dir, state } = pending;
        state
            .sync_all()
            .map_err(|e| io_err("writing the sandbox's state", e))?;
        manifest.state_bytes = state
            .metadata()
            .map_err(|e| io_err("writing the sandbox's state", e))?
            .len();
        manifest.state_sha256 =
            crate::snapshots::digest_of(&state).map_err(|e| io_err("hashing the state", e))?;
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| MicrovmError::failed("encoding the manifest", e))?;
        let _ = unlinkat(&dir, MANIFEST_TMP, UnlinkatFlags::NoRemoveDir);
        let fd = openat(
            &dir,
            MANIFEST_TMP,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("recording the sandbox's manifest", e))?;
        let mut f = fs::File::from(fd);
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(|e| io_err("recording the sandbox's manifest", e))?;
        renameat(&dir, MANIFEST_TMP, &dir, MANIFEST)
            .map_err(|e| io_err("recording the sandbox's manifest", e))?;
        nix::unistd::fsync(&dir).map_err(|e| io_err("recording the sandbox's manifest", e))?;
        Ok(manifest.state_bytes + text.len() as u64)
    }

    /// The manifest of `id`'s paused state, if there is one.
    pub fn manifest(&self, id: &str) -> Result<Option<Manifest>, MicrovmError> {
        let path = self.sandbox_dir(id)?;
        if !path.exists() {
            return Ok(None);
        }
        let dir = private_dir(&path, false)?;
        let f = open_private(&dir, MANIFEST)?;
        let mut text = String::new();
        f.take(1 << 20)
            .read_to_string(&mut text)
            .map_err(|e| io_err("reading the sandbox's manifest", e))?;
        let m: Manifest = serde_json::from_str(&text)
            .map_err(|e| MicrovmError::failed("the sandbox's manifest is unreadable", e))?;
        if m.format != FORMAT || m.id != id {
            return Err(MicrovmError::Qemu(
                "the sandbox's manifest is of another format or sandbox".into(),
            ));
        }
        Ok(Some(m))
    }

    /// `id`'s state, opened read-only and checked against its manifest (size, SHA-256).
    pub fn open_state(&self, id: &str) -> Result<(Manifest, fs::File), MicrovmError> {
        let m = self
            .manifest(id)?
            .ok_or_else(|| MicrovmError::Qemu("the sandbox's saved state is missing".into()))?;
        let dir = private_dir(&self.sandbox_dir(id)?, false)?;
        let f = open_private(&dir, STATE)?;
        let len = f
            .metadata()
            .map_err(|e| io_err("reading the sandbox's state", e))?
            .len();
        let sum = crate::snapshots::digest_of(&f)
            .map_err(|e| io_err("reading the sandbox's state", e))?;
        if len != m.state_bytes || sum != m.state_sha256 {
            return Err(MicrovmError::Qemu(
                "the sandbox's saved state does not match its recorded digest".into(),
            ));
        }
        Ok((m, f))
    }

    /// Bytes `id` holds on disk (its directory's files).
    pub fn bytes(&self, id: &str) -> u64 {
        let Ok(path) = self.sandbox_dir(id) else {
            return 0;
        };
        fs::read_dir(path)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.blocks() * 512)
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Removes `id`'s paused state, if any (never following a link).
    pub fn remove(&self, id: &str) -> bool {
        let Ok(path) = self.sandbox_dir(id) else {
            return false;
        };
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path).is_ok(),
            Ok(_) => fs::remove_file(&path).is_ok(),
            Err(_) => false,
        }
    }

    /// The ids with a paused directory.
    pub fn ids(&self) -> Vec<String> {
        fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| SandboxId::parse(n).is_some())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A file of a sandbox's directory, read-only, if it is a plain private file of this user's
/// with one link.
fn open_private(dir: &OwnedFd, name: &str) -> Result<fs::File, MicrovmError> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("opening the sandbox's saved state", e))?;
    let f = fs::File::from(fd);
    let m = f
        .metadata()
        .map_err(|e| io_err("opening the sandbox's saved state", e))?;
    if !m.is_file()
        || m.uid() != nix::unistd::geteuid().as_raw()
        || m.nlink() != 1
        || m.mode() & 0o077 != 0
    {
        return Err(MicrovmError::Qemu(
            "the sandbox's saved state is not a private file of Cordon's".into(),
        ));
    }
    Ok(f)
}
