//! The template store under `<data dir>/templates`, owned by root:
//! ```text
//! names/<name>.json   one manifest per template (typed: `Manifest`)
//! layers/<hex>        layer blobs as imported, each stored once by its digest
//! roots/<hex>/        the flattened read-only root of each template digest
//! leases/<hex>        a lock file per root: every live sandbox holds a shared lock on it
//! staging/            imports in progress (removed when they end)
//! .lock               taken shared to resolve, exclusively to commit, remove or collect
//! ```
//! Directories are mode 0711: a sandbox's unprivileged ids may pass through to a root (to
//! mount it) but not list the store.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_core::{Language, ResolvedTemplate, SANDBOX_PATH, SandboxSpec, validate_template_name};
use nix::fcntl::{Flock, FlockArg};

use crate::error::{Result, TemplateError};
use crate::manifest::Manifest;

/// The template store of one data dir.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// What a removal or collection freed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub layers_removed: usize,
    pub roots_removed: usize,
    /// Roots no template names that a live sandbox still uses (collected later).
    pub roots_in_use: usize,
    /// Staging dirs of builds and imports that died mid-way (their scratch file systems
    /// unmounted, their loop devices freed).
    pub staging_removed: usize,
}

/// A shared lock on a template root's lease file, held while a sandbox uses the root.
#[derive(Debug)]
pub struct Lease(#[allow(dead_code)] Flock<fs::File>);

impl Store {
    /// The store of the data dir `data_dir`, created if missing.
    pub fn open(data_dir: &Path) -> Result<Store> {
        let dir = data_dir.join("templates");
        let store = Store { dir };
        for sub in ["", "names", "layers", "roots", "leases", "staging"] {
            let d = store.dir.join(sub);
            match fs::DirBuilder::new().mode(0o711).create(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(TemplateError::io("creating the template store")(e)),
            }
        }
        Ok(store)
    }

    /// The store's directory (for the operator; never shown to a tenant).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn root_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("roots").join(hex)
    }

    pub(crate) fn layer_path(&self, hex: &str) -> PathBuf {
        self.dir.join("layers").join(hex)
    }

    #[cfg_attr(not(feature = "import"), allow(dead_code))]
    pub(crate) fn staging_dir(&self) -> PathBuf {
        self.dir.join("staging")
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.dir.join("names").join(format!("{name}.json"))
    }

    /// The store lock: shared to resolve, exclusive to change what the store holds.
    pub(crate) fn lock(&self, exclusive: bool) -> Result<Flock<fs::File>> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(".lock"))
            .map_err(TemplateError::io("opening the template store's lock"))?;
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        Flock::lock(f, arg).map_err(|(_, e)| TemplateError::Io {
            what: "locking the template store".into(),
            source: e.into(),
        })
    }

    /// Every template, by name.
    pub fn list(&self) -> Result<Vec<Manifest>> {
        let mut out = Vec::new();
        let dir = self.dir.join("names");
        for entry in fs::read_dir(&dir).map_err(TemplateError::io("listing templates"))? {
            let entry = entry.map_err(TemplateError::io("listing templates"))?;
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if validate_template_name(name).is_ok() {
                out.push(self.get(name)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The template named `name`.
    pub fn get(&self, name: &str) -> Result<Manifest> {
        validate_template_name(name).map_err(|e| TemplateError::Invalid(e.to_string()))?;
        let bytes = match fs::read(self.manifest_path(name)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TemplateError::NotFound(name.to_string()));
            }
            Err(e) => return Err(TemplateError::io("reading a template's manifest")(e)),
        };
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| TemplateError::Damaged {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        if m.name != name {
            return Err(TemplateError::Damaged {
                name: name.to_string(),
                reason: format!("its manifest names {:?}", m.name),
            });
        }
        Ok(m)
    }

    /// Records a manifest whose layers and root are in place (under the exclusive lock).
    #[cfg_attr(not(feature = "import"), allow(dead_code))]
    pub(crate) fn write_manifest(&self, m: &Manifest) -> Result<()> {
        let path = self.manifest_path(&m.name);
        if path.exists() {
            return Err(TemplateError::Exists(m.name.clone()));
        }
        let tmp = self.dir.join("names").join(format!(".{}.tmp", m.name));
        let body = serde_json::to_vec_pretty(m).map_err(|e| TemplateError::Io {
            what: "encoding a template's manifest".into(),
            source: std::io::Error::other(e),
        })?;
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(TemplateError::io("writing a template's manifest"))?;
        f.write_all(&body)
            .and_then(|_| f.sync_all())
            .and_then(|_| fs::rename(&tmp, &path))
            .map_err(TemplateError::io("writing a template's manifest"))
    }

    /// Resolves a template for one sandbox: its root, digest, default environment and
    /// interpreters, with a lease that keeps the root while the result (or a clone) lives.
    pub fn resolve(&self, name: &str) -> Result<ResolvedTemplate> {
        let _guard = self.lock(false)?;
        let m = self.get(name)?;
        let hex = m.digest_hex().to_string();
        let root = self.root_dir(&hex);
        if !root.is_dir() {
            return Err(TemplateError::Damaged {
                name: name.to_string(),
                reason: "its root is missing".into(),
            });
        }
        let lease = self.lease(&hex)?;
        let path = m
            .image
            .env
            .get("PATH")
            .map(String::as_str)
            .unwrap_or(SANDBOX_PATH);
        let languages = [
            Language::Python,
            Language::Bash,
            Language::Sh,
            Language::Javascript,
        ]
        .into_iter()
        .filter(|l| find_program(&root, path, l.program()))
        .collect::<BTreeSet<_>>();
        Ok(ResolvedTemplate {
            name: m.name.clone(),
            digest: m.digest.clone(),
            root,
            env: m.image.env.clone(),
            languages,
            lease: Some(Arc::new(lease)),
            writable: false,
        })
    }

    /// Resolves the spec's template, if it names one and it is not resolved yet.
    pub fn resolve_spec(&self, spec: &mut SandboxSpec) -> Result<()> {
        if let (Some(name), None) = (&spec.template, &spec.resolved_template) {
            spec.resolved_template = Some(self.resolve(name)?);
        }
        Ok(())
    }

    /// Takes a shared lease on the root `hex`.
    fn lease(&self, hex: &str) -> Result<Lease> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join("leases").join(hex))
            .map_err(TemplateError::io("opening a template's lease"))?;
        Flock::lock(f, FlockArg::LockShared)
            .map(Lease)
            .map_err(|(_, e)| TemplateError::Io {
                what: "leasing a template".into(),
                source: e.into(),
            })
    }

    /// Removes the template `name`, then collects what no template uses any more.
    pub fn remove(&self, name: &str) -> Result<GcReport> {
        {
            let _guard = self.lock(true)?;
            self.get(name)?;
            fs::remove_file(self.manifest_path(name))
                .map_err(TemplateError::io("removing a template's manifest"))?;
        }
        self.gc()
    }

    /// What the store takes of the host's disk: each root once (as its manifest recorded
    /// it), the kept layer blobs and the microvm tier's disks.
    pub fn usage(&self) -> Result<u64> {
        let mut roots = std::collections::HashMap::new();
        for m in self.list()? {
            let bytes = if m.stored_bytes > 0 {
                m.stored_bytes
            } else {
                m.size_bytes
            };
            roots.insert(m.digest_hex().to_string(), bytes);
        }
        let mut total: u64 = roots.values().sum();
        for sub in ["layers", "disks"] {
            let Ok(dir) = fs::read_dir(self.dir.join(sub)) else {
                continue;
            };
            for e in dir.flatten() {
                if let Ok(m) = e.metadata() {
                    total = total.saturating_add(m.blocks() * 512);
                }
            }
        }
        Ok(total)
    }

    /// Removes what builds and imports that died mid-way left in `staging/`: a staging dir
    /// whose lock nobody holds (a live one holds it until it is removed). Whatever is
    /// mounted under it (a build's scratch ext4) is unmounted first, which frees its loop
    /// device. Returns how many were removed.
    #[cfg(feature = "sweep")]
    pub fn sweep_staging(&self) -> Result<usize> {
        let _guard = self.lock(true)?;
        Ok(self.sweep_staging_locked())
    }

    /// [`Store::sweep_staging`] under the store's exclusive lock, which a new staging dir
    /// holds shared until it is locked itself.
    #[cfg(feature = "sweep")]
    fn sweep_staging_locked(&self) -> usize {
        let Ok(dir) = fs::read_dir(self.staging_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in dir.flatten() {
            let p = e.path();
            let Ok(f) = fs::File::open(&p) else {
                continue;
            };
            // Held: a live build or import.
            let Ok(lock) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            cordon_host::volume::unmount_all_under(&p);
            if remove_tree(&p).is_ok() {
                removed += 1;
            }
            drop(lock);
        }
        removed
    }

    /// Removes layers and roots no template uses, and roots no live sandbox holds, and
    /// what dead builds and imports left in `staging/`.
    pub fn gc(&self) -> Result<GcReport> {
        let _guard = self.lock(true)?;
        #[cfg_attr(not(feature = "sweep"), allow(unused_mut))]
        let mut report = GcReport::default();
        #[cfg(feature = "sweep")]
        {
            report.staging_removed = self.sweep_staging_locked();
        }
        let mut roots = HashSet::new();
        let mut layers = HashSet::new();
        for m in self.list()? {
            roots.insert(m.digest_hex().to_string());
            for l in &m.layers {
                layers.insert(l.digest.trim_start_matches("sha256:").to_string());
            }
        }
        for entry in read_names(&self.dir.join("layers"))? {
            if !layers.contains(&entry) {
                fs::remove_file(self.layer_path(&entry))
                    .map_err(TemplateError::io("removing an unused layer"))?;
                report.layers_removed += 1;
            }
        }
        for hex in read_names(&self.dir.join("roots"))? {
            if roots.contains(&hex) {
                continue;
            }
            let lease = self.dir.join("leases").join(&hex);
            let held = match fs::OpenOptions::new().write(true).open(&lease) {
                Ok(f) => match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => {
                        // Nobody uses it: the lease file goes with the root.
                        let _ = fs::remove_file(&lease);
                        drop(lock);
                        false
                    }
                    Err(_) => true,
                },
                Err(_) => false,
            };
            if held {
                report.roots_in_use += 1;
                continue;
            }
            remove_tree(&self.root_dir(&hex))?;
            report.roots_removed += 1;
        }
        // Disk images made from roots that are gone.
        if let Ok(names) = read_names(&self.dir.join("disks")) {
            for disk in names {
                let hex = disk.trim_end_matches(".ext4");
                if !self.root_dir(hex).is_dir() {
                    let _ = fs::remove_file(self.dir.join("disks").join(&disk));
                }
            }
        }
        Ok(report)
    }
}

fn read_names(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(TemplateError::io("reading the template store"))? {
        let entry = entry.map_err(TemplateError::io("reading the template store"))?;
        if let Some(n) = entry.file_name().to_str()
            && !n.starts_with('.')
        {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// Removes a tree the store made (its directories may be read-only).
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    // Directories of a root are made writable again for their owner first (root ignores
    // modes, but keep it correct for a store not run as root).
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TemplateError::io("removing a template's root")(e)),
    }
}

/// Where a tier keeps a disk image made from `root`, a root of a template store (the
/// microvm tier's ext4 of it): `disks/<hex>.ext4` of the same store, removed with the root.
/// `None` when `root` is not a store's root.
pub fn disk_image_path(root: &Path) -> Option<PathBuf> {
    let hex = root.file_name()?.to_str()?;
    let roots = root.parent()?;
    if roots.file_name()? != "roots" {
        return None;
    }
    Some(roots.parent()?.join("disks").join(format!("{hex}.ext4")))
}

/// Resolves `path` inside the tree `root` as a process chrooted there would: symlinks
/// (absolute ones from `root`) followed, `..` never above `root`. `None` when a component
/// is missing or links loop.
pub fn resolve_in_root(root: &Path, path: &str) -> Option<PathBuf> {
    let mut todo: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(String::from)
        .collect();
    let mut at: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => {}
        }
        let mut cand = root.to_path_buf();
        cand.extend(&at);
        cand.push(&c);
        let md = fs::symlink_metadata(&cand).ok()?;
        if md.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = fs::read_link(&cand).ok()?;
            let target = target.to_str()?;
            if target.starts_with('/') {
                at.clear();
            }
            todo.extend(
                target
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .rev()
                    .map(String::from),
            );
        } else {
            at.push(c);
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&at);
    Some(out)
}

/// True when `program` is an executable regular file on `path` (a `PATH` value) inside
/// the tree `root`.
pub fn find_program(root: &Path, path: &str, program: &str) -> bool {
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .filter_map(|d| resolve_in_root(root, &format!("{d}/{program}")))
        .any(|p| fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn resolution_stays_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("usr/bin/python3.11"), b"").unwrap();
        fs::set_permissions(
            root.join("usr/bin/python3.11"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        symlink("python3.11", root.join("usr/bin/python3")).unwrap();
        // Out of the root: resolved inside it, where nothing is.
        symlink("../../../../../../usr/bin/env", root.join("usr/bin/env")).unwrap();
        symlink("/etc/passwd", root.join("usr/bin/sh")).unwrap();
        symlink("loop", root.join("usr/bin/loop")).unwrap();
        assert!(find_program(root, "/bin", "python3"));
        assert!(!find_program(root, "/bin", "sh"));
        assert!(!find_program(root, "/bin", "loop"));
        assert!(!find_program(root, "/bin", "bash"));
        // `env` points at /usr/bin/env of the root itself, through ../.. above it: absent.
        assert_eq!(resolve_in_root(root, "/usr/bin/env"), None);
        assert_eq!(
            resolve_in_root(root, "/bin/../../../bin/python3"),
            Some(root.join("usr/bin/python3.11"))
        );
        assert!(!find_program(root, "/usr/bin", "env"));
    }
}
