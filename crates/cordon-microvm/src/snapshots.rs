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
//!
//! A snapshot taken with its RAM in a file (`<key>.ram`, beside the device state in
//! `<key>.snap`) holds the guest's memory there instead of in the stream. Cordon creates that
//! file too; the template's QEMU gets it (owned by its uid, bound into its private root) only
//! for its life. Once that QEMU is dead the file is taken back: root's, mode 0444, one link,
//! exactly the guest's RAM size, then hashed; the digest file records both digests. Restores
//! map it private and copy-on-write, read-only: the page cache of pages no VM writes is
//! shared by every VM of that snapshot. It is never written, truncated or replaced in place
//! (a private mapping of a file changed underneath would change the running VMs' memory):
//! a bad or collected one is only unlinked, and VMs mapping it keep its inode.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use nix::fcntl::{Flock, FlockArg, OFlag, openat, renameat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};

use crate::MicrovmError;

/// One file's identity: device, inode, size.
type Identity = (u64, u64, u64);

/// A snapshot opened for a restore: the device state (with the whole RAM when `ram` is
/// `None`, the old format) and the RAM file.
pub struct Snapshot {
    pub stream: fs::File,
    pub ram: Option<fs::File>,
    /// Where `ram` is in the store (QEMU's private root binds it from there, and checks
    /// that the bound file is `ram`'s inode).
    pub ram_path: Option<PathBuf>,
}

/// A snapshot being made: files Cordon created in the store, not installed yet.
pub struct Partial {
    name: String,
    pub stream: fs::File,
    /// The RAM file (opened read-write), when the template's RAM is kept in a file.
    pub ram: Option<fs::File>,
    pub ram_path: Option<PathBuf>,
    ram_bytes: u64,
}

/// See the module documentation.
pub struct SnapshotStore {
    dir: PathBuf,
    /// Most snapshots kept, and their largest total size in bytes.
    max_count: usize,
    max_bytes: u64,
    /// Snapshots whose bytes (stream, RAM file) matched their digests in this process.
    verified: Mutex<HashMap<String, (Identity, Option<Identity>)>>,
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

fn ram_name(key: &str) -> String {
    format!("{key}.ram")
}

/// The digest file: the stream's digest on its first line and, for a snapshot whose RAM is
/// a file, `ram <digest>` on the second. A snapshot of the old format has the first only.
struct Digests {
    stream: String,
    ram: Option<String>,
}

impl Digests {
    /// The digests of a snapshot's files.
    fn of(stream: &fs::File, ram: Option<&fs::File>) -> Result<Digests, MicrovmError> {
        Ok(Digests {
            stream: digest_of(stream).map_err(|e| io_err("reading a snapshot", e))?,
            ram: ram
                .map(digest_of_sparse)
                .transpose()
                .map_err(|e| io_err("reading a snapshot's memory", e))?,
        })
    }

    fn parse(text: &str) -> Option<Digests> {
        let mut lines = text.lines();
        let stream = lines.next()?.trim().to_string();
        let ram = match lines.next() {
            None => None,
            Some(l) => Some(l.strip_prefix("ram ")?.trim().to_string()),
        };
        Some(Digests { stream, ram })
    }

    fn text(&self) -> String {
        match &self.ram {
            None => format!("{}\n", self.stream),
            Some(r) => format!("{}\nram {r}\n", self.stream),
        }
    }
}

impl SnapshotStore {
    pub fn new(dir: PathBuf, max_count: usize, max_bytes: u64) -> Self {
        SnapshotStore {
            dir,
            max_count: max_count.max(1),
            max_bytes,
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

    /// The lock of one key, held while its template boots and is saved: an exclusive
    /// `flock` on `/run/cordon/snapshot-keys/<key>.lock`, so one template boots per key
    /// however many threads and Cordon processes (a server, a `cordon run` beside it) share
    /// the store. Other keys' templates boot meanwhile. (A key names its shape, image and
    /// QEMU, so two stores of one host share a lock only for the same snapshot.)
    pub fn lock_key(&self, key: &str) -> Result<Flock<fs::File>, MicrovmError> {
        let dir = cordon_host::idpool::run_dir("snapshot-keys");
        cordon_host::idpool::private_dir(&dir).map_err(|e| {
            // The detail names host paths: the operator's log only.
            tracing::error!("microvm snapshot key locks: {e}");
            MicrovmError::Qemu(
                "the snapshot key locks' directory could not be made; the operator's log says why"
                    .into(),
            )
        })?;
        let fd = nix::fcntl::open(
            &dir.join(format!("{key}.lock")),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("opening a snapshot's lock", e))?;
        Flock::lock(fs::File::from(fd), FlockArg::LockExclusive)
            .map_err(|(_, e)| io_err("locking a snapshot's key", e))
    }

    /// The snapshot of `key`, opened read-only, if there is a good one of the format asked
    /// for (`with_ram`: its RAM in a file). A file that is not a plain root-owned file (a RAM
    /// file: mode 0444), or whose bytes do not match its digest, is removed.
    pub fn open(&self, key: &str, with_ram: bool) -> Result<Option<Snapshot>, MicrovmError> {
        let dir = self.open_dir()?;
        let Some(stream) = self.open_private(&dir, &snap_name(key), key, 0o022)? else {
            return Ok(None);
        };
        let ram = if with_ram {
            match self.open_private(&dir, &ram_name(key), key, 0o222)? {
                Some(f) => Some(f),
                None => {
                    self.remove(&dir, key);
                    return Ok(None);
                }
            }
        } else {
            None
        };
        let identity = |f: &fs::File| -> Result<Identity, MicrovmError> {
            let m = f.metadata().map_err(|e| io_err("reading a snapshot", e))?;
            Ok((m.dev(), m.ino(), m.size()))
        };
        let id = (identity(&stream)?, ram.as_ref().map(identity).transpose()?);
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            == Some(&id);
        if !known {
            let want = self.read_digest(&dir, key);
            let have = Digests::of(&stream, ram.as_ref())?;
            let matches = want
                .as_ref()
                .is_some_and(|w| w.stream == have.stream && w.ram == have.ram);
            if !matches {
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
        let _ = stream.set_modified(SystemTime::now());
        let ram_path = ram.as_ref().map(|_| self.dir.join(ram_name(key)));
        Ok(Some(Snapshot {
            stream,
            ram,
            ram_path,
        }))
    }

    /// One of `key`'s files, opened read-only, if it is a plain file of this user's with one
    /// link and none of the `forbidden` mode bits; otherwise the snapshot is removed.
    fn open_private(
        &self,
        dir: &OwnedFd,
        name: &str,
        key: &str,
        forbidden: u32,
    ) -> Result<Option<fs::File>, MicrovmError> {
        let fd = match openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(_) => {
                self.remove(dir, key);
                return Ok(None);
            }
        };
        let file = fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| io_err("reading a snapshot", e))?;
        let owner = nix::unistd::geteuid().as_raw();
        if !meta.is_file()
            || meta.uid() != owner
            || meta.nlink() != 1
            || meta.mode() & forbidden != 0
        {
            tracing::warn!(key, "a snapshot that is not a private file was removed");
            self.remove(dir, key);
            return Ok(None);
        }
        Ok(Some(file))
    }

    fn read_digest(&self, dir: &OwnedFd, key: &str) -> Option<Digests> {
        let fd = openat(
            dir,
            digest_name(key).as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let mut text = String::new();
        fs::File::from(fd)
            .take(512)
            .read_to_string(&mut text)
            .ok()?;
        Digests::parse(&text)
    }

    fn remove(&self, dir: &OwnedFd, key: &str) {
        // Unlinked only, never truncated: VMs mapping the RAM file keep its inode.
        let _ = unlinkat(dir, snap_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        let _ = unlinkat(dir, ram_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        let _ = unlinkat(dir, digest_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// New, empty, private files for a template VM to write its snapshot into: the stream
    /// and, with `ram_bytes`, the RAM file of that size (sparse).
    pub fn create_partial(&self, ram_bytes: Option<u64>) -> Result<Partial, MicrovmError> {
        let dir = self.open_dir()?;
        let mut suffix = [0u8; 6];
        getrandom::fill(&mut suffix).map_err(|e| MicrovmError::failed("no randomness", e))?;
        let name = format!("partial-{}", hex::encode(suffix));
        let create = |name: &str, flags: OFlag| {
            openat(
                &dir,
                name,
                OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | flags,
                Mode::from_bits_truncate(0o600),
            )
            .map(fs::File::from)
            .map_err(|e| io_err("creating a snapshot file", e))
        };
        let stream = create(&name, OFlag::O_WRONLY)?;
        let ram = match ram_bytes {
            None => None,
            Some(bytes) => {
                let made = create(&format!("{name}.ram"), OFlag::O_RDWR).and_then(|f| {
                    f.set_len(bytes)
                        .map(|()| f)
                        .map_err(|e| io_err("sizing a snapshot's memory file", e))
                });
                match made {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let _ = unlinkat(&dir, name.as_str(), UnlinkatFlags::NoRemoveDir);
                        let _ = unlinkat(
                            &dir,
                            format!("{name}.ram").as_str(),
                            UnlinkatFlags::NoRemoveDir,
                        );
                        return Err(e);
                    }
                }
            }
        };
        Ok(Partial {
            ram_path: ram.as_ref().map(|_| self.dir.join(format!("{name}.ram"))),
            name,
            stream,
            ram,
            ram_bytes: ram_bytes.unwrap_or(0),
        })
    }

    /// Lends a partial snapshot's RAM file to the template's QEMU (its uid and gid), which
    /// maps it shared for its life; [`SnapshotStore::reclaim`] takes it back.
    pub fn lend_ram(&self, partial: &Partial, uid: u32) -> Result<(), MicrovmError> {
        if let Some(ram) = &partial.ram {
            nix::unistd::fchown(
                ram,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(uid)),
            )
            .map_err(|e| io_err("lending the memory file to the template VM", e))?;
        }
        Ok(())
    }

    /// Takes a partial snapshot's RAM file back once the template's QEMU is dead: root's
    /// again, mode 0444, and refused unless it is still one plain file of one link and
    /// exactly the guest's RAM size with no more blocks than that.
    pub fn reclaim(&self, partial: &Partial) -> Result<(), MicrovmError> {
        let Some(ram) = &partial.ram else {
            return Ok(());
        };
        let me = nix::unistd::geteuid();
        nix::unistd::fchown(ram, Some(me), Some(nix::unistd::getegid()))
            .and_then(|()| nix::sys::stat::fchmod(ram, Mode::from_bits_truncate(0o444)))
            .map_err(|e| io_err("taking the memory file back from the template VM", e))?;
        let m = ram
            .metadata()
            .map_err(|e| io_err("taking the memory file back from the template VM", e))?;
        let blocks_bytes = m.blocks().saturating_mul(512);
        if !m.is_file()
            || m.nlink() != 1
            || m.size() != partial.ram_bytes
            || blocks_bytes > partial.ram_bytes + (1 << 20)
        {
            return Err(MicrovmError::Qemu(
                "the template VM left its memory file changed in shape (size, links); the \
                 snapshot was discarded and is remade on the next create"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Removes a partial snapshot that will not be installed.
    pub fn discard_partial(&self, partial: Partial) {
        self.discard(&partial.name);
    }

    fn discard(&self, name: &str) {
        if let Ok(dir) = self.open_dir() {
            for n in [
                name.to_string(),
                format!("{name}.ram"),
                format!("{name}.sha256"),
            ] {
                let _ = unlinkat(&dir, n.as_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
    }

    /// Installs a partial snapshot (see `install_files`); on failure its files are removed.
    pub fn install(&self, partial: Partial, key: &str) -> Result<Snapshot, MicrovmError> {
        let name = partial.name.clone();
        self.install_files(partial, key)
            .inspect_err(|_| self.discard(&name))
    }

    /// Installs a partial snapshot (its RAM file already reclaimed) as `key`'s: the digests
    /// are recorded first, then the files are renamed into place (the RAM file before the
    /// stream, which is what `open` looks for first). Returns it opened read-only.
    fn install_files(&self, partial: Partial, key: &str) -> Result<Snapshot, MicrovmError> {
        let dir = self.open_dir()?;
        let Partial {
            name, stream, ram, ..
        } = partial;
        let ram_partial = format!("{name}.ram");
        stream
            .sync_all()
            .map_err(|e| io_err("writing the snapshot", e))?;
        if let Some(r) = &ram {
            r.sync_all()
                .map_err(|e| io_err("writing the snapshot's memory", e))?;
        }
        let reopen = |n: &str| {
            openat(
                &dir,
                n,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map(fs::File::from)
            .map_err(|e| io_err("reading the snapshot back", e))
        };
        let reader = reopen(&name)?;
        drop(stream);
        let ram_reader = match ram {
            Some(r) => {
                let rr = reopen(&ram_partial)?;
                drop(r);
                Some(rr)
            }
            None => None,
        };
        let sums = Digests::of(&reader, ram_reader.as_ref())?;
        let digest_tmp = format!("{name}.sha256");
        let fd = openat(
            &dir,
            digest_tmp.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err("recording the snapshot digest", e))?;
        let mut df = fs::File::from(fd);
        df.write_all(sums.text().as_bytes())
            .and_then(|_| df.sync_all())
            .map_err(|e| io_err("recording the snapshot digest", e))?;
        renameat(&dir, digest_tmp.as_str(), &dir, digest_name(key).as_str())
            .map_err(|e| io_err("recording the snapshot digest", e))?;
        if ram_reader.is_some() {
            renameat(&dir, ram_partial.as_str(), &dir, ram_name(key).as_str())
                .map_err(|e| io_err("installing the snapshot's memory", e))?;
        } else {
            // A RAM file of an older snapshot of this key is not this one's.
            let _ = unlinkat(&dir, ram_name(key).as_str(), UnlinkatFlags::NoRemoveDir);
        }
        renameat(&dir, name.as_str(), &dir, snap_name(key).as_str())
            .map_err(|e| io_err("installing the snapshot", e))?;
        let identity = |f: &fs::File| -> Result<Identity, MicrovmError> {
            let m = f
                .metadata()
                .map_err(|e| io_err("reading the snapshot back", e))?;
            Ok((m.dev(), m.ino(), m.size()))
        };
        let id = (
            identity(&reader)?,
            ram_reader.as_ref().map(identity).transpose()?,
        );
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), id);
        Ok(Snapshot {
            stream: reader,
            ram_path: ram_reader.as_ref().map(|_| self.dir.join(ram_name(key))),
            ram: ram_reader,
        })
    }

    /// Removes the least recently used snapshots (never `keep`), each with its RAM file, until
    /// at most `max_count` remain and they take at most `max_bytes` together (a RAM file
    /// counts its allocated blocks). Restored VMs keep reading theirs through their own
    /// descriptors and mappings. Returns the keys removed.
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
                // A RAM file is sparse: what it takes on disk is its allocated blocks.
                let ram = fs::symlink_metadata(self.dir.join(ram_name(key)))
                    .map(|m| m.blocks().saturating_mul(512))
                    .unwrap_or(0);
                snaps.push((used, meta.len() + ram, key.to_string()));
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

/// SHA-256 of a sparse file's data, read through the descriptor: its size, then each data
/// extent's offset, length and bytes (`SEEK_DATA`/`SEEK_HOLE`), so the holes of a guest's
/// never-touched RAM cost nothing to hash. A change to any byte changes it.
fn digest_of_sparse(f: &fs::File) -> io::Result<String> {
    use nix::unistd::{Whence, lseek};
    let size = f.metadata()?.len();
    let mut h = Sha256::new();
    h.update(size.to_le_bytes());
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < size {
        let start = match lseek(f, off as i64, Whence::SeekData) {
            Ok(s) => s as u64,
            // No data past `off`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = match lseek(f, start as i64, Whence::SeekHole) {
            Ok(e) => (e as u64).min(size),
            Err(e) => return Err(e.into()),
        };
        h.update(start.to_le_bytes());
        h.update((end - start).to_le_bytes());
        let mut at = start;
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            let n = f.read_at(&mut buf[..want], at)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was hashed",
                ));
            }
            h.update(&buf[..n]);
            at += n as u64;
        }
        off = end;
    }
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 of a whole file, read through the descriptor from offset 0.
pub(crate) fn digest_of(f: &fs::File) -> io::Result<String> {
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
