//! Importing an image file (a tar of an OCI image layout, or a docker archive) into the
//! store. The image is untrusted input: every blob is checked against its digest, the
//! layers are flattened entry by entry without ever following a link the image made, device
//! nodes, FIFOs and set-id bits are dropped, paths that leave the root are refused, and the
//! sizes and counts are bounded.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use cordon_core::{Tier, validate_template_name};
use sha2::{Digest, Sha256};

use crate::error::{Result, TemplateError};
use crate::manifest::{BuiltFrom, ImageDefaults, Layer, Manifest};
use crate::store::{Store, remove_tree};

mod flatten;
mod image;
mod stage;

use flatten::layer_io;
pub(crate) use flatten::{Flatten, count_tree};
use image::{HashingReader, Parsed, open_layer, read_docker, read_oci, unpack_outer};
pub use stage::{
    DEFAULT_STORE_BYTES, DropReason, Dropped, ImportLimits, ImportReport, MOUNT_POINTS, Stage,
    human,
};
pub(crate) use stage::{FLATTEN_VERSION, WriteBudget};
use stage::{SPENT_FILE, store_budget_spent, store_budget_words};

impl Store {
    /// Imports the image file `archive` as template `name`.
    pub fn import(
        &self,
        archive: &Path,
        name: &str,
        limits: &ImportLimits,
    ) -> Result<ImportReport> {
        validate_template_name(name).map_err(|e| TemplateError::Invalid(e.to_string()))?;
        if self.get(name).is_ok() {
            return Err(TemplateError::Exists(name.to_string()));
        }
        // What dead imports and builds left goes first: it is not the store's to keep.
        self.sweep_staging()?;
        let stage = Stage::new(self)?;
        let unpacked = stage.0.join("image");
        unpack_outer(archive, &unpacked, limits)?;
        let parsed = if unpacked.join("index.json").is_file() {
            read_oci(&unpacked)?
        } else if unpacked.join("manifest.json").is_file() {
            read_docker(&unpacked)?
        } else {
            return Err(TemplateError::UnknownFormat(
                "the file holds neither index.json nor manifest.json".into(),
            ));
        };
        let file = archive
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let built_from = BuiltFrom::Import {
            format: parsed.format,
            file,
        };
        // The layer blobs are kept in the store: they spend its budget too.
        let mut blobs = 0u64;
        for (blob, _) in &parsed.layers {
            blobs = blobs.saturating_add(
                fs::metadata(blob)
                    .map_err(TemplateError::io("reading a layer"))?
                    .len(),
            );
        }
        let budget = self.write_budget(None, blobs, limits)?;
        self.commit(&stage, name, parsed, built_from, limits, budget)
    }

    /// What a new root may write on the host: the store's budget less what the store
    /// holds already and `more` (blobs the same import keeps), and at most `disk` (a
    /// build's disk limit).
    pub(crate) fn write_budget(
        &self,
        disk: Option<u64>,
        more: u64,
        limits: &ImportLimits,
    ) -> Result<WriteBudget> {
        let used = self
            .usage()?
            .saturating_add(self.staged_spent(None))
            .saturating_add(more);
        let left = limits.store_bytes.saturating_sub(used);
        let (bytes, limit, what, fix) = match disk {
            Some(d) if d < left => (
                d,
                human(d),
                "the build's disk limit, --disk".to_string(),
                "write less in the build's steps, or give a larger --disk".to_string(),
            ),
            _ => {
                let (limit, what, fix) = store_budget_words(used, limits.store_bytes);
                (left, limit, what, fix)
            }
        };
        Ok(WriteBudget {
            bytes,
            limit,
            what,
            fix,
            kept: more,
            store: self.clone(),
            store_bytes: limits.store_bytes,
        })
    }

    /// What the builds and imports running now have written in their staging dirs (and
    /// the layer blobs they will keep), as each last published it, but `own`: the bytes a
    /// new root will add to the store that [`Store::usage`] does not count yet. A dir
    /// whose count cannot be read counts nothing (it has written nothing yet); a dead one
    /// counts until the next sweep (at the start of every build and import) removes it.
    pub(crate) fn staged_spent(&self, own: Option<&Path>) -> u64 {
        let Ok(dir) = fs::read_dir(self.staging_dir()) else {
            return 0;
        };
        dir.flatten()
            .filter(|e| own != Some(e.path().as_path()))
            .filter_map(|e| fs::read(e.path().join(SPENT_FILE)).ok())
            .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(u64::from_le_bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Flattens the checked layers of `parsed` into a root (or reuses the root of the same
    /// digest) and records the template `name`.
    pub(crate) fn commit(
        &self,
        stage: &Stage,
        name: &str,
        parsed: Parsed,
        built_from: BuiltFrom,
        limits: &ImportLimits,
        budget: WriteBudget,
    ) -> Result<ImportReport> {
        if parsed.layers.len() > limits.layers {
            return Err(TemplateError::Limit {
                what: "layers",
                flag: "layers",
                limit: limits.layers as u64,
            });
        }
        if parsed.layers.len() != parsed.diff_ids.len() {
            return Err(TemplateError::Malformed(format!(
                "the manifest lists {} layers and the config {} diff ids",
                parsed.layers.len(),
                parsed.diff_ids.len()
            )));
        }
        let mut h = Sha256::new();
        h.update(FLATTEN_VERSION.as_bytes());
        for d in &parsed.diff_ids {
            h.update(b"\n");
            h.update(d.as_bytes());
        }
        let hex_digest = hex::encode(h.finalize());
        let existing = self.root_dir(&hex_digest).is_dir();
        let mut flat = Flatten::new(stage, limits, budget, !existing)?;
        let mut layers = Vec::new();
        for (i, ((blob, blob_hex), diff_id)) in
            parsed.layers.iter().zip(&parsed.diff_ids).enumerate()
        {
            let (compression, got) = if existing {
                // Only hashed, and bounded as a flatten is: a bomb stops at the limit.
                let (c, mut r) = open_layer(blob)?;
                let budget = limits.unpacked_bytes.saturating_sub(flat.unpacked);
                let mut hr = HashingReader::new(&mut r, budget);
                io::copy(&mut hr, &mut io::sink()).map_err(layer_io(i))?;
                flat.unpacked = flat.unpacked.saturating_add(hr.count);
                (c, hr.finish())
            } else {
                flat.apply(i, blob)?
            };
            if &format!("sha256:{got}") != diff_id {
                return Err(TemplateError::DigestMismatch {
                    what: format!("layer {i} (uncompressed)"),
                    expected: diff_id.clone(),
                });
            }
            let size_bytes = fs::metadata(blob)
                .map_err(TemplateError::io("reading a layer"))?
                .len();
            layers.push(Layer {
                digest: format!("sha256:{blob_hex}"),
                diff_id: diff_id.clone(),
                size_bytes,
                compression,
            });
        }
        let kept = parsed.layers;
        self.install(
            flat,
            &hex_digest,
            Installed {
                name,
                layers,
                kept: &kept,
                built_from,
                defaults: parsed.defaults,
            },
        )
    }

    /// Moves a flattened root into the store under its digest (or keeps the one already
    /// there), moves the `kept` layer blobs, and records the manifest. Everything that can
    /// fail on the root (measuring it, its paths' lengths) is done before it is moved, and
    /// a failure after the move takes it out again: no root is ever left without a name.
    pub(crate) fn install(
        &self,
        flat: Flatten,
        hex_digest: &str,
        t: Installed<'_>,
    ) -> Result<ImportReport> {
        if flat.made {
            flat.seal()?;
        }
        // Measured where it is: a failure here leaves nothing but the stage.
        let staged = if flat.made {
            Some(count_tree(&flat.root)?)
        } else {
            None
        };
        let _guard = self.lock(true)?;
        let dest = self.root_dir(hex_digest);
        let reused_root = dest.is_dir();
        // The store's budget once more, under the lock every install takes: builds and
        // imports that ran side by side each began from the store as it stood then.
        let adding = t
            .kept
            .iter()
            .filter(|(_, hex)| !self.layer_path(hex).exists())
            .filter_map(|(blob, _)| fs::metadata(blob).ok())
            .map(|m| m.blocks() * 512)
            .fold(
                staged
                    .as_ref()
                    .filter(|_| !reused_root)
                    .map_or(0, |c| c.stored),
                u64::saturating_add,
            );
        if adding > 0 {
            let used = self.usage()?;
            if used.saturating_add(adding) > flat.limits.store_bytes {
                return Err(store_budget_spent(used, flat.limits.store_bytes));
            }
        }
        let (counts, moved) = match staged {
            Some(c) if !reused_root => {
                fs::rename(&flat.root, &dest)
                    .map_err(TemplateError::io("storing a template root"))?;
                (c, true)
            }
            _ => (count_tree(&dest)?, false),
        };
        let recorded = (|| {
            for ((blob, blob_hex), _) in t.kept.iter().zip(&t.layers) {
                let to = self.layer_path(blob_hex);
                if !to.exists() {
                    fs::rename(blob, &to).map_err(TemplateError::io("storing a layer"))?;
                    let _ = fs::set_permissions(&to, fs::Permissions::from_mode(0o600));
                }
            }
            let manifest = Manifest {
                name: t.name.to_string(),
                digest: format!("sha256:{hex_digest}"),
                layers: t.layers,
                size_bytes: counts.bytes,
                files: counts.files,
                stored_bytes: counts.stored,
                tiers: vec![Tier::Container, Tier::Gvisor, Tier::Microvm],
                built_from: t.built_from,
                created_unix: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                image: t.defaults,
            };
            self.write_manifest(&manifest)?;
            Ok(manifest)
        })();
        let manifest = match recorded {
            Ok(m) => m,
            Err(e) => {
                if moved {
                    let _ = remove_tree(&dest);
                }
                return Err(e);
            }
        };
        Ok(ImportReport {
            manifest,
            dropped: flat.dropped,
            setid_cleared: flat.setid_cleared,
            reused_root,
        })
    }
}

/// What [`Store::install`] records besides the root.
pub(crate) struct Installed<'a> {
    pub(crate) name: &'a str,
    pub(crate) layers: Vec<Layer>,
    /// Layer blobs (in the stage) to keep in the store, with their digests (hex).
    pub(crate) kept: &'a [(PathBuf, String)],
    pub(crate) built_from: BuiltFrom,
    pub(crate) defaults: ImageDefaults,
}
