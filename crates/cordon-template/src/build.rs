//! `cordon template build`'s store side: the build's working copy of its base (a host
//! directory the step's sandbox gets as its writable root, never the base itself), the
//! cache keyed by the digest of the build's inputs, and the seal, which packs the working
//! copy into one layer and flattens it with the same rules as an import (device nodes,
//! FIFOs and set-id bits dropped, links never followed, sizes and counts bounded).
//! Running the steps is the caller's (a container-tier sandbox, `cordon-cli`).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use cordon_core::{ResolvedTemplate, validate_template_name};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Result, TemplateError};
use crate::import::{FLATTEN_VERSION, Flatten, ImportLimits, ImportReport, Installed, Stage};
use crate::manifest::{BuiltFrom, Compression, ImageDefaults, Layer, Manifest};
use crate::store::Store;

/// Bumped whenever a build's result for the same inputs would differ.
const BUILD_VERSION: &str = "cordon-template-build-v1";

/// What a build is made of: two builds with the same inputs make the same template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildInputs {
    /// `host`, `debian` or `template NAME`.
    pub base: String,
    /// The base's identity: a template's digest, the Debian root's hash.
    pub base_digest: String,
    pub steps: Vec<String>,
    /// Environment of the steps and of every sandbox on the template.
    pub env: BTreeMap<String, String>,
    /// The steps' egress allow-list (hosts and CIDRs).
    pub allow: Vec<String>,
}

impl BuildInputs {
    /// `sha256:<hex>` over Cordon's build version and the inputs.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(BUILD_VERSION.as_bytes());
        h.update(b"\n");
        // A struct of strings, vectors and a sorted map: its JSON is deterministic.
        h.update(serde_json::to_vec(self).unwrap_or_default());
        format!("sha256:{}", hex::encode(h.finalize()))
    }
}

/// A build's working copy of its base, owned by the step sandbox's host uid; removed when
/// dropped, however the build ends.
pub struct BuildRoot {
    root: PathBuf,
    /// The size-limited file system the working copy lives in, when the build has a disk
    /// limit: unmounted (dropped) before the stage around it is removed.
    disk: Option<cordon_host::volume::ScratchDisk>,
    /// The size of `disk`.
    disk_bytes: Option<u64>,
    stage: Stage,
}

impl BuildRoot {
    /// The working copy on the host (for the container tier; never shown to a tenant).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the build's disk limit is (nearly) reached: what a step that failed ran into.
    pub fn disk_full(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| d.nearly_full(1 << 20))
    }
}

/// The egress socket's mount point, made in the working copy when the base lacks it.
const EGRESS_MOUNT_POINT: &str = "run/cordon/egress.sock";

impl Store {
    /// The template `name` (or `sha256:<hex>` digest, or a prefix of at least 12 hex digits
    /// that starts the digest of one template only) as a build's base, resolved with its
    /// lease. A prefix that several digests start with is refused, with them listed.
    pub fn resolve_base(&self, name_or_digest: &str) -> Result<ResolvedTemplate> {
        let wanted = name_or_digest
            .strip_prefix("sha256:")
            .unwrap_or(name_or_digest);
        if validate_template_name(name_or_digest).is_ok() && self.get(name_or_digest).is_ok() {
            return self.resolve(name_or_digest);
        }
        let is_hex = wanted.len() >= 12
            && wanted.len() <= 64
            && wanted
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !is_hex {
            return Err(TemplateError::NotFound(name_or_digest.to_string()));
        }
        // Names of the same digest share one root: one digest is one base.
        let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in self.list()? {
            if m.digest_hex().starts_with(wanted) {
                found
                    .entry(m.digest_hex().to_string())
                    .or_default()
                    .push(m.name);
            }
        }
        match found.len() {
            0 => Err(TemplateError::NotFound(name_or_digest.to_string())),
            1 => {
                let names = found.into_values().next().unwrap_or_default();
                match names.first() {
                    Some(n) => self.resolve(n),
                    None => Err(TemplateError::NotFound(name_or_digest.to_string())),
                }
            }
            _ => Err(TemplateError::Ambiguous {
                prefix: wanted.to_string(),
                candidates: found
                    .iter()
                    .map(|(hex, names)| {
                        // Enough digits to tell each apart, and its names.
                        let n = distinct_prefix(hex, found.keys()).min(hex.len());
                        format!("sha256:{} ({})", &hex[..n], names.join(", "))
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            }),
        }
    }

    /// A build with these inputs made before: the template `name` if it is that build
    /// (an error if `name` is another template), else a new name for the template of the
    /// same inputs (its root shared). `None`: no such build yet.
    pub fn cached_build(&self, name: &str, inputs_digest: &str) -> Result<Option<Manifest>> {
        let same = |m: &Manifest| matches!(&m.built_from, BuiltFrom::Build { inputs_digest: d, .. } if d == inputs_digest);
        match self.get(name) {
            Ok(m) if same(&m) => return Ok(Some(m)),
            Ok(_) => return Err(TemplateError::Exists(name.to_string())),
            Err(TemplateError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let _guard = self.lock(true)?;
        let Some(mut m) = self.list()?.into_iter().find(same) else {
            return Ok(None);
        };
        if !self.root_dir(m.digest_hex()).is_dir() {
            return Ok(None);
        }
        m.name = name.to_string();
        m.created_unix = now();
        self.write_manifest(&m)?;
        Ok(Some(m))
    }

    /// A working copy of the root `base` for a build, owned by `owner` (the host uid the
    /// step's sandbox user maps to) so that the step may write anywhere in it. The base is
    /// only read. With `disk_bytes`, the copy lives in a file system of that size of its
    /// own (an ext4 image, loop-mounted), so the base and everything the steps write fit in
    /// it or fail with `ENOSPC`: a step cannot fill the host's disk.
    pub fn build_root(
        &self,
        base: &Path,
        owner: u32,
        disk_bytes: Option<u64>,
    ) -> Result<BuildRoot> {
        // What dead imports and builds left goes first: it is not the store's to keep.
        self.sweep_staging()?;
        let stage = Stage::new(self)?;
        // The stage is passable for the sandbox's ids (its root is bound by them).
        fs::set_permissions(&stage.0, fs::Permissions::from_mode(0o711))
            .map_err(TemplateError::io("preparing a build dir"))?;
        let disk = match disk_bytes {
            Some(size) => Some(
                cordon_host::volume::ScratchDisk::new(&stage.0, size, owner).map_err(
                    TemplateError::io("making the build's disk (mkfs.ext4, a loop device)"),
                )?,
            ),
            None => None,
        };
        let root = disk
            .as_ref()
            .map_or(stage.0.as_path(), |d| d.dir())
            // Not `root`: the seal flattens into the stage's `root`.
            .join("work");
        copy_tree(base, &root, owner).map_err(|e| {
            if e.raw_os_error() == Some(libc_enospc()) {
                TemplateError::Invalid(
                    "the base does not fit in the build's disk limit; give a larger --disk".into(),
                )
            } else {
                TemplateError::io("copying the build's base")(e)
            }
        })?;
        Ok(BuildRoot {
            root,
            disk,
            disk_bytes,
            stage,
        })
    }

    /// Seals a build's working copy (its sandbox gone) into the template `name`: packed
    /// into one layer, then flattened as an import is.
    pub fn seal_build(
        &self,
        build: BuildRoot,
        name: &str,
        inputs: &BuildInputs,
        defaults: ImageDefaults,
        limits: &ImportLimits,
    ) -> Result<ImportReport> {
        validate_template_name(name).map_err(|e| TemplateError::Invalid(e.to_string()))?;
        // Bound in this order so an early return drops the disk (unmounts) before the stage.
        let BuildRoot {
            stage,
            disk,
            root,
            disk_bytes,
        } = build;
        let sock = root.join(EGRESS_MOUNT_POINT);
        if fs::symlink_metadata(&sock).is_ok_and(|m| m.is_file() && m.len() == 0) {
            let _ = fs::remove_file(&sock);
        }
        // What the new root may write: the build's disk limit and the store's budget.
        let budget = self.write_budget(disk_bytes, 0, limits)?;
        let mut flat = Flatten::new(&stage, limits, budget, true)?;
        // The working copy is packed into a tar stream (its digest is the template's) and
        // flattened from it as it is made: no layer file is written, and hard links go
        // through as links.
        let (reader, writer) =
            io::pipe().map_err(TemplateError::io("streaming the build's layer"))?;
        let hex = std::thread::scope(|scope| {
            let packer = scope.spawn(|| pack(&root, writer, limits));
            let flattened = flat.entries(0, reader);
            let packed = packer.join().unwrap_or_else(|_| {
                Err(TemplateError::Io {
                    what: "packing the build's root".into(),
                    source: io::Error::other("the packing thread panicked"),
                })
            });
            match (packed, flattened) {
                // The packer's own limits first; a flatten that stopped (its budget) ends
                // the packer with a broken pipe, which says nothing more.
                (Err(e @ TemplateError::Limit { .. }), _) => Err(e),
                (_, Err(e)) => Err(e),
                (Err(e), Ok(_)) => Err(e),
                (Ok(()), Ok(hex)) => Ok(hex),
            }
        })?;
        match disk {
            // The working copy goes with its file system.
            Some(disk) => drop(disk),
            None => crate::store::remove_tree(&root)?,
        }
        let digest = format!("sha256:{hex}");
        let mut h = Sha256::new();
        h.update(FLATTEN_VERSION.as_bytes());
        h.update(b"\n");
        h.update(digest.as_bytes());
        let hex_digest = hex::encode(h.finalize());
        let built_from = BuiltFrom::Build {
            base: inputs.base.clone(),
            base_digest: inputs.base_digest.clone(),
            inputs_digest: inputs.digest(),
            steps: inputs.steps.clone(),
            allow: inputs.allow.clone(),
        };
        // One layer, the whole root; its blob is not kept (the root is the template).
        let layers = vec![Layer {
            digest: digest.clone(),
            diff_id: digest,
            size_bytes: flat.stream_bytes,
            compression: Compression::None,
        }];
        self.install(
            flat,
            &hex_digest,
            Installed {
                name,
                layers,
                kept: &[],
                built_from,
                defaults,
            },
        )
    }
}

/// How many leading digits of `hex` tell it apart from every other of `all` (at least 12).
fn distinct_prefix<'a>(hex: &str, all: impl Iterator<Item = &'a String>) -> usize {
    all.filter(|o| o.as_str() != hex)
        .map(|o| {
            hex.bytes()
                .zip(o.bytes())
                .take_while(|(a, b)| a == b)
                .count()
                + 1
        })
        .max()
        .unwrap_or(0)
        .max(12)
}

/// `ENOSPC`, the error of a write past a file system's size.
fn libc_enospc() -> i32 {
    nix::errno::Errno::ENOSPC as i32
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Copies the tree `src` to `dst` (directories, regular files, symbolic links; nothing
/// else), everything owned by `owner`. Links are copied as links, never followed.
fn copy_tree(src: &Path, dst: &Path, owner: u32) -> io::Result<()> {
    let mut todo = vec![(src.to_path_buf(), dst.to_path_buf())];
    while let Some((from, to)) = todo.pop() {
        let m = fs::symlink_metadata(&from)?;
        let ft = m.file_type();
        if ft.is_dir() {
            fs::DirBuilder::new()
                .mode((m.permissions().mode() & 0o7777) | 0o700)
                .create(&to)?;
            for e in fs::read_dir(&from)? {
                let e = e?;
                todo.push((e.path(), to.join(e.file_name())));
            }
        } else if ft.is_symlink() {
            symlink(fs::read_link(&from)?, &to)?;
        } else if ft.is_file() {
            // The kernel's copy (copy_file_range); the mode comes with it.
            fs::copy(&from, &to)?;
        } else {
            continue;
        }
        lchown(&to, Some(owner), Some(owner))?;
        if ft.is_dir() || ft.is_file() {
            // chown cleared set-id bits; keep the rest of the mode (dirs get u+rwx).
            let mode = (m.permissions().mode() & 0o777) | if ft.is_dir() { 0o700 } else { 0 };
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// Packs the tree `root` into the tar stream `out`: directories, regular files, symbolic
/// links (as links) and hard links (a file's second name as a link to its first), in a
/// stable order; anything else a step made (sockets, FIFOs) is left out. The import limits
/// on entries and bytes apply (a hard-linked file's bytes once).
fn pack(root: &Path, out: impl io::Write, limits: &ImportLimits) -> Result<()> {
    let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 16, out));
    tar.follow_symlinks(false);
    let (mut files, mut bytes) = (0u64, 0u64);
    // (device, inode) of each file with several names: the first name packed.
    let mut first_names: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut todo = vec![PathBuf::new()];
    let werr = TemplateError::io("writing the build's layer");
    while let Some(rel) = todo.pop() {
        let dir = root.join(&rel);
        let mut entries = fs::read_dir(&dir)
            .and_then(|r| r.collect::<io::Result<Vec<_>>>())
            .map_err(TemplateError::io("reading the build's root"))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries.into_iter().rev() {
            let sub = rel.join(e.file_name());
            let ft = e
                .file_type()
                .map_err(TemplateError::io("reading the build's root"))?;
            if !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
                continue;
            }
            limits.count_entry(&mut files)?;
            if ft.is_file() {
                let m = e
                    .metadata()
                    .map_err(TemplateError::io("reading the build's root"))?;
                if m.nlink() > 1 {
                    if let Some(first) = first_names.get(&(m.dev(), m.ino())) {
                        let mut h = tar::Header::new_gnu();
                        h.set_metadata(&m);
                        h.set_entry_type(tar::EntryType::Link);
                        h.set_size(0);
                        tar.append_link(&mut h, &sub, first)
                            .map_err(|e| TemplateError::Io {
                                what: "packing the build's root".into(),
                                source: e,
                            })?;
                        continue;
                    }
                    first_names.insert((m.dev(), m.ino()), sub.clone());
                }
                limits.count_unpacked(&mut bytes, m.len())?;
            }
            tar.append_path_with_name(e.path(), &sub)
                .map_err(|e| TemplateError::Io {
                    what: "packing the build's root".into(),
                    source: e,
                })?;
            if ft.is_dir() {
                todo.push(sub);
            }
        }
    }
    tar.into_inner()
        .and_then(|mut w| io::Write::flush(&mut w))
        .map_err(werr)?;
    Ok(())
}
