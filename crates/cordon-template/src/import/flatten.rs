//! Flattening layers onto one root: entries placed without following a link the image
//! made, modes sanitized, whiteouts applied, files written sparse, sizes bounded.

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use crate::error::{Result, TemplateError};
use crate::manifest::Compression;

use super::image::{HashingReader, clean, create_new, open_layer};
use super::stage::{
    DropReason, Dropped, ImportLimits, LOOK_EVERY, MOUNT_POINTS, SPENT_FILE, Stage, WriteBudget,
    store_budget_spent,
};

pub(super) fn layer_io(i: usize) -> impl FnOnce(io::Error) -> TemplateError {
    move |e| {
        if e.kind() == io::ErrorKind::FileTooLarge {
            return TemplateError::Limit {
                what: "uncompressed layer bytes",
                flag: "unpacked-bytes",
                limit: e
                    .get_ref()
                    .and_then(|x| x.to_string().parse().ok())
                    .unwrap_or(0),
            };
        }
        TemplateError::Malformed(format!("layer {i} is not a readable tar: {e}"))
    }
}

/// Layers applied one after the other onto one directory.
pub(crate) struct Flatten {
    pub(super) root: PathBuf,
    /// Whether the root is made here (else only hashed: a root of that digest exists).
    pub(super) made: bool,
    pub(super) dropped: Vec<Dropped>,
    pub(super) setid_cleared: u64,
    pub(super) files: u64,
    pub(super) unpacked: u64,
    /// Bytes written on the host: file data (holes skipped), and a block per directory.
    pub(super) written: u64,
    /// Bytes of the last layer stream read by [`Flatten::entries`].
    pub(crate) stream_bytes: u64,
    pub(super) budget: WriteBudget,
    pub(super) limits: ImportLimits,
    /// The staging dir, where [`SPENT_FILE`] is published.
    pub(super) stage: PathBuf,
    /// `written` at which the store's budget is looked at next.
    pub(super) next_look: u64,
}

/// Where a checked path lands.
pub(super) enum Place {
    At(PathBuf),
    Drop(DropReason),
}

impl Flatten {
    /// A flatten into `stage`'s `root` (made when `make`; else the layers are only hashed).
    pub(crate) fn new(
        stage: &Stage,
        limits: &ImportLimits,
        budget: WriteBudget,
        make: bool,
    ) -> Result<Flatten> {
        let root = stage.0.join("root");
        if make {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&root)
                .map_err(TemplateError::io("creating a template root"))?;
        }
        Ok(Flatten {
            root,
            made: make,
            dropped: Vec::new(),
            setid_cleared: 0,
            files: 0,
            unpacked: 0,
            written: 0,
            stream_bytes: 0,
            budget,
            limits: limits.clone(),
            stage: stage.0.clone(),
            next_look: LOOK_EVERY,
        })
    }

    /// Counts `n` bytes written on the host against the budget. Every [`LOOK_EVERY`]
    /// bytes the count is published in the stage and the store's whole budget looked at
    /// again, with what the builds and imports beside this one have written meanwhile.
    fn spend(&mut self, n: u64) -> Result<()> {
        self.written = self.written.saturating_add(n);
        if self.written > self.budget.bytes {
            return Err(TemplateError::DiskLimit {
                limit: self.budget.limit.clone(),
                what: self.budget.what.clone(),
                fix: self.budget.fix.clone(),
            });
        }
        if self.written >= self.next_look {
            self.next_look = self.written.saturating_add(LOOK_EVERY);
            self.look_at_store()?;
        }
        Ok(())
    }

    /// Publishes what this flatten spends (written and kept) and refuses to go on when,
    /// with the store's templates and every other running build and import, it is past
    /// the store's budget.
    fn look_at_store(&self) -> Result<()> {
        let mine = self.written.saturating_add(self.budget.kept);
        fs::write(self.stage.join(SPENT_FILE), mine.to_le_bytes())
            .map_err(TemplateError::io("publishing a flatten's count"))?;
        let store = &self.budget.store;
        let others = store.staged_spent(Some(&self.stage));
        let used = store.usage()?.saturating_add(others);
        if used.saturating_add(mine) > self.budget.store_bytes {
            return Err(store_budget_spent(used, self.budget.store_bytes));
        }
        Ok(())
    }

    /// Applies layer `i` from `blob`: whiteouts first (they hide what lower layers made),
    /// then its entries. Returns the hex digest of the uncompressed layer.
    pub(super) fn apply(&mut self, i: usize, blob: &Path) -> Result<(Compression, String)> {
        // Pass 1: the whiteouts, read within the same bound as the entries (a layer that
        // inflates past it stops there, not at its end).
        let (_, r) = open_layer(blob)?;
        let budget = self.limits.unpacked_bytes.saturating_sub(self.unpacked);
        self.whiteouts(i, HashingReader::new(r, budget))?;
        let (compression, r) = open_layer(blob)?;
        Ok((compression, self.entries(i, r)?))
    }

    /// Applies the whiteouts and opaque markers of layer `i` to what lower layers made.
    fn whiteouts(&mut self, i: usize, r: impl Read) -> Result<()> {
        let mut ar = tar::Archive::new(r);
        for entry in ar.entries().map_err(layer_io(i))? {
            let e = entry.map_err(layer_io(i))?;
            let path = e.path().map_err(layer_io(i))?.into_owned();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(hidden) = name.strip_prefix(".wh.") else {
                continue;
            };
            // `./dir/.wh.x` and `/dir/.wh.x` name `dir/x` as `dir/.wh.x` does (as entries'
            // paths do); a parent that leaves the root hides nothing.
            let parent = path.parent().unwrap_or(Path::new(""));
            let parent = match clean(parent) {
                Some(p) => p,
                None if parent.components().any(|c| c == Component::ParentDir) => continue,
                None => PathBuf::new(),
            };
            let dir = match self.place(&parent, true) {
                Place::At(d) => d,
                Place::Drop(_) => continue,
            };
            if !fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            if hidden == ".wh..opq" {
                for child in fs::read_dir(&dir).map_err(TemplateError::io("applying a whiteout"))? {
                    let child = child.map_err(TemplateError::io("applying a whiteout"))?;
                    remove_any(&child.path())?;
                }
            } else if !hidden.is_empty() && hidden != "." && hidden != ".." && !hidden.contains('/')
            {
                remove_any(&dir.join(hidden))?;
            }
        }
        Ok(())
    }

    /// Applies the entries of layer `i` from its uncompressed (or gzip-decoded) stream `r`,
    /// hashing the stream: returns its hex digest.
    pub(crate) fn entries(&mut self, i: usize, r: impl Read) -> Result<String> {
        let budget = self.limits.unpacked_bytes.saturating_sub(self.unpacked);
        let mut hr = HashingReader::new(r, budget);
        let mut ar = tar::Archive::new(&mut hr);
        for entry in ar.entries().map_err(layer_io(i))? {
            let mut e = entry.map_err(layer_io(i))?;
            let path = e.path().map_err(layer_io(i))?.into_owned();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".wh."))
            {
                continue;
            }
            self.limits.count_entry(&mut self.files)?;
            let placed = match clean(&path) {
                Some(rel) => match self.place(&rel, false) {
                    Place::At(to) => self.put(i, &mut e, &to)?,
                    Place::Drop(reason) => Some(reason),
                },
                // The layer's own root (`./`) is fine; anything else left it.
                None => path
                    .components()
                    .any(|c| c == Component::ParentDir)
                    .then_some(DropReason::EscapesRoot),
            };
            if let Some(reason) = placed {
                self.dropped.push(Dropped {
                    layer: i,
                    path: path.display().to_string(),
                    reason,
                });
            }
        }
        // The rest of the stream (end-of-archive blocks, padding) is part of the digest.
        io::copy(&mut hr, &mut io::sink()).map_err(layer_io(i))?;
        self.stream_bytes = hr.count;
        Ok(hr.finish())
    }

    /// Writes entry `e` of layer `i` at `to` (a path inside the root): a directory, a
    /// file (sparse where it has holes), a link as the image has it, or a hard link to a
    /// file of the root. Says why when the entry is dropped instead.
    fn put<R: Read>(
        &mut self,
        i: usize,
        e: &mut tar::Entry<'_, R>,
        to: &Path,
    ) -> Result<Option<DropReason>> {
        let to = to.to_path_buf();
        let mode = e.header().mode().unwrap_or(0o644);
        let ty = e.header().entry_type();
        use tar::EntryType as T;
        match ty {
            T::Directory => {
                let perm = sanitize(mode, true, &mut self.setid_cleared);
                if !fs::symlink_metadata(&to).is_ok_and(|m| m.is_dir()) {
                    remove_any(&to)?;
                    self.spend(DIR_BYTES)?;
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&to)
                        .map_err(TemplateError::io("creating a directory"))?;
                }
                fs::set_permissions(&to, fs::Permissions::from_mode(perm))
                    .map_err(TemplateError::io("setting a directory's mode"))?;
            }
            // A sparse file (GNU's sparse entry, as tar writes one) is read back whole, its
            // holes as zeros, and written with its holes again.
            T::Regular | T::Continuous | T::GNUSparse => {
                // A sparse entry's length is what it expands to, not what the stream
                // carries: bounded here, before its zeros are read.
                self.limits.count_unpacked(&mut self.unpacked, e.size())?;
                remove_any(&to)?;
                let perm = sanitize(mode, false, &mut self.setid_cleared);
                let mut out = create_new(&to).map_err(TemplateError::io("creating a file"))?;
                self.write_sparse(i, e, &mut out)?;
                fs::set_permissions(&to, fs::Permissions::from_mode(perm))
                    .map_err(TemplateError::io("setting a file's mode"))?;
            }
            T::Symlink => {
                let Some(target) = e.link_name().map_err(layer_io(i))? else {
                    return Ok(Some(DropReason::Unsupported(
                        "symlink without target".into(),
                    )));
                };
                remove_any(&to)?;
                // Kept as the image has it: inside a sandbox it resolves in the
                // sandbox's own root. Cordon itself never follows it on the host.
                symlink(&*target, &to).map_err(TemplateError::io("creating a link"))?;
            }
            T::Link => {
                let source = e
                    .link_name()
                    .map_err(layer_io(i))?
                    .and_then(|t| clean(&t))
                    .map(|t| self.place(&t, false));
                let Some(Place::At(source)) = source else {
                    return Ok(Some(DropReason::HardlinkOutside));
                };
                if !fs::symlink_metadata(&source).is_ok_and(|m| m.is_file()) {
                    return Ok(Some(DropReason::HardlinkOutside));
                }
                if source != to {
                    remove_any(&to)?;
                    fs::hard_link(&source, &to)
                        .map_err(TemplateError::io("creating a hard link"))?;
                }
            }
            T::Char | T::Block => return Ok(Some(DropReason::DeviceNode)),
            T::Fifo => return Ok(Some(DropReason::Fifo)),
            other => return Ok(Some(DropReason::Unsupported(format!("{other:?}")))),
        }
        Ok(None)
    }

    /// Copies a file's data from `src` to the new file `out`, leaving a hole where a whole
    /// block is zeros (a sparse file stays sparse, and a file of zeros costs the host
    /// nothing): only the blocks written spend the budget.
    fn write_sparse(&mut self, i: usize, src: &mut impl Read, out: &mut fs::File) -> Result<()> {
        let mut buf = vec![0u8; SPARSE_BLOCK];
        let mut len = 0u64;
        loop {
            // A whole block (or the file's end), so holes fall on block boundaries.
            let mut n = 0;
            while n < buf.len() {
                match src.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(layer_io(i)(e)),
                }
            }
            if n == 0 {
                break;
            }
            len += n as u64;
            if buf[..n].iter().all(|&b| b == 0) {
                out.seek(io::SeekFrom::Current(n as i64))
                    .map_err(TemplateError::io("writing a file"))?;
            } else {
                self.spend(n as u64)?;
                out.write_all(&buf[..n])
                    .map_err(TemplateError::io("writing a file"))?;
            }
            if n < buf.len() {
                break;
            }
        }
        // A hole at the end is made by the length.
        out.set_len(len)
            .map_err(TemplateError::io("writing a file"))?;
        Ok(())
    }

    /// Makes the [`MOUNT_POINTS`] the image lacks.
    pub(super) fn seal(&self) -> Result<()> {
        for (path, dir) in MOUNT_POINTS {
            let Place::At(at) = self.place(Path::new(path), false) else {
                continue;
            };
            if fs::symlink_metadata(&at).is_ok() {
                continue;
            }
            let made = if dir {
                fs::DirBuilder::new().mode(0o755).create(&at)
            } else {
                create_new(&at).and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o644)))
            };
            made.map_err(TemplateError::io("making a mount point"))?;
        }
        Ok(())
    }

    /// Where `rel` lands under the root, its parents made: never through a link the image
    /// made, never below something that is not a directory.
    fn place(&self, rel: &Path, whole: bool) -> Place {
        let mut at = self.root.clone();
        let comps: Vec<_> = rel.components().collect();
        let parents = if whole {
            comps.len()
        } else {
            comps.len().saturating_sub(1)
        };
        for c in &comps[..parents] {
            let Component::Normal(n) = c else {
                return Place::Drop(DropReason::EscapesRoot);
            };
            at.push(n);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Place::Drop(DropReason::ThroughSymlink);
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Place::Drop(DropReason::ParentNotDirectory),
                Err(_) if whole => return Place::At(self.root.join(rel)),
                Err(_) => {
                    if fs::DirBuilder::new().mode(0o755).create(&at).is_err() {
                        return Place::Drop(DropReason::ParentNotDirectory);
                    }
                }
            }
        }
        match comps.get(parents) {
            Some(Component::Normal(n)) => Place::At(at.join(n)),
            None => Place::At(at),
            Some(_) => Place::Drop(DropReason::EscapesRoot),
        }
    }
}

/// The mode a file or directory gets in a root: no set-id bits, nothing writable but by
/// its owner (the root is immutable anyway); the sticky bit kept on directories.
pub(super) fn sanitize(mode: u32, dir: bool, cleared: &mut u64) -> u32 {
    let mut m = mode & 0o7777;
    if m & 0o6000 != 0 {
        if !dir {
            *cleared += 1;
        }
        m &= !0o6000;
    }
    if !dir {
        m &= !0o1000;
    }
    m & !0o022
}

/// Removes whatever is at `p` (never following a link), if anything.
pub(super) fn remove_any(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(p).map_err(TemplateError::io("replacing a directory"))
        }
        Ok(_) => fs::remove_file(p).map_err(TemplateError::io("replacing a file")),
        Err(_) => Ok(()),
    }
}

/// What [`count_tree`] measures.
pub(crate) struct Counts {
    /// Entries.
    pub(crate) files: u64,
    /// Bytes of regular files (their lengths, as `ls` shows them).
    pub(crate) bytes: u64,
    /// Bytes allocated on the disk, each inode once.
    pub(crate) stored: u64,
}

/// Entries, regular-file bytes and allocated bytes of a tree.
pub(crate) fn count_tree(root: &Path) -> Result<Counts> {
    let err = || TemplateError::io("measuring a template");
    let mut c = Counts {
        files: 0,
        bytes: 0,
        stored: fs::symlink_metadata(root).map_err(err())?.blocks() * 512,
    };
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).map_err(err())? {
            let entry = entry.map_err(err())?;
            let m = entry.metadata().map_err(err())?;
            c.files += 1;
            if m.is_dir() {
                todo.push(entry.path());
            } else if m.is_file() {
                c.bytes += m.len();
            }
            if m.nlink() < 2 || m.is_dir() || seen.insert((m.dev(), m.ino())) {
                c.stored += m.blocks() * 512;
            }
        }
    }
    Ok(c)
}

/// What a directory costs the budget.
pub(super) const DIR_BYTES: u64 = 4096;

/// The unit a file is copied in: a block of zeros this long becomes a hole.
pub(super) const SPARSE_BLOCK: usize = 64 << 10;
