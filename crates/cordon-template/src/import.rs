//! Importing an image file (a tar of an OCI image layout, or a docker archive) into the
//! store. The image is untrusted input: every blob is checked against its digest, the
//! layers are flattened entry by entry without ever following a link the image made, device
//! nodes, FIFOs and set-id bits are dropped, paths that leave the root are refused, and the
//! sizes and counts are bounded.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use cordon_core::{Tier, validate_template_name};
use nix::fcntl::{Flock, FlockArg};
use oci_spec::image::{
    Arch, Descriptor, DigestAlgorithm, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Result, TemplateError};
use crate::manifest::{BuiltFrom, Compression, ImageDefaults, ImageFormat, Layer, Manifest};
use crate::store::{Store, remove_tree};

/// Bumped whenever flattening changes what a root holds: part of every template digest.
/// v3: whiteouts of `./` and `/` paths applied; files of zeros stored as holes.
pub(crate) const FLATTEN_VERSION: &str = "cordon-template-flatten-v3";

/// The mount points Cordon's tiers put their own files and filesystems on, made in every
/// root at import where the image lacks them (empty; never through a link the image made),
/// so that no tier ever has to create one in a template (runsc makes a missing bind
/// destination in the root it is given). `true`: a directory.
pub const MOUNT_POINTS: [(&str, bool); 17] = [
    ("proc", true),
    ("dev", true),
    ("tmp", true),
    ("work", true),
    // The workspace's second mount point (cordon_core::HOME_MOUNT).
    ("home/user", true),
    ("run/cordon", true),
    (".cordon/usr", true),
    (".cordon/agent", false),
    ("etc/passwd", false),
    ("etc/group", false),
    ("etc/hosts", false),
    ("etc/hostname", false),
    ("etc/nsswitch.conf", false),
    // The egress proxy's CA and bundle (cordon_egress's default paths), and where OpenSSL,
    // Python and curl look for a bundle.
    ("etc/cordon/egress-ca.pem", false),
    ("etc/cordon/ca-bundle.pem", false),
    ("etc/ssl/certs/ca-certificates.crt", false),
    ("etc/ssl/certs", true),
];

/// Bounds on one import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportLimits {
    /// Bytes of the image file's contents (all blobs).
    pub archive_bytes: u64,
    /// Bytes of the uncompressed layers together.
    pub unpacked_bytes: u64,
    /// Entries of the image file and of all layers together.
    pub files: u64,
    /// Layers.
    pub layers: usize,
    /// The template store's budget: what every template's root, the kept layers and the
    /// microvm disks may take of the host's disk together. An import or a build whose
    /// root would take the store past it ends as [`TemplateError::DiskLimit`] and leaves
    /// nothing.
    pub store_bytes: u64,
}

/// The default of [`ImportLimits::store_bytes`]: 64 GiB.
pub const DEFAULT_STORE_BYTES: u64 = 64 << 30;

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits {
            archive_bytes: 16 << 30,
            unpacked_bytes: 16 << 30,
            files: 1_000_000,
            layers: 256,
            store_bytes: DEFAULT_STORE_BYTES,
        }
    }
}

/// Why an entry of a layer was left out of the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// A character or block device node.
    DeviceNode,
    /// A named pipe.
    Fifo,
    /// Its path leaves the root (`..`) or is empty.
    EscapesRoot,
    /// Its path goes through a symbolic link (which could point anywhere).
    ThroughSymlink,
    /// Its parent is not a directory.
    ParentNotDirectory,
    /// A hard link to something that is not a regular file inside the root.
    HardlinkOutside,
    /// An entry type Cordon does not import.
    Unsupported(String),
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::DeviceNode => f.write_str("device node"),
            DropReason::Fifo => f.write_str("named pipe"),
            DropReason::EscapesRoot => f.write_str("path leaves the root"),
            DropReason::ThroughSymlink => f.write_str("path goes through a symbolic link"),
            DropReason::ParentNotDirectory => f.write_str("parent is not a directory"),
            DropReason::HardlinkOutside => {
                f.write_str("hard link to something not a regular file in the root")
            }
            DropReason::Unsupported(t) => write!(f, "unsupported entry type {t}"),
        }
    }
}

/// One entry left out of the root, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Index of the layer, bottom first.
    pub layer: usize,
    /// The entry's path in the layer.
    pub path: String,
    pub reason: DropReason,
}

/// What an import did.
#[derive(Debug, Clone)]
pub struct ImportReport {
    pub manifest: Manifest,
    pub dropped: Vec<Dropped>,
    /// Files whose setuid or setgid bit was cleared.
    pub setid_cleared: u64,
    /// True when a template with the same digest existed: its root was reused.
    pub reused_root: bool,
}

/// An image read from its file, its blobs checked.
pub(crate) struct Parsed {
    pub(crate) format: ImageFormat,
    /// Layer blobs in the staging dir, bottom first, with their blob digests (hex).
    pub(crate) layers: Vec<(PathBuf, String)>,
    /// The config's diff ids (`sha256:<hex>` of each uncompressed layer).
    pub(crate) diff_ids: Vec<String>,
    pub(crate) defaults: ImageDefaults,
}

/// A staging dir removed when the import ends, however it ends. It holds an exclusive
/// `flock` on itself while it lives: a staging dir whose lock can be taken is a dead
/// build's or import's, which [`Store::gc`] removes (with whatever it left mounted).
pub struct Stage(
    pub(crate) PathBuf,
    #[allow(dead_code)] Option<Flock<fs::File>>,
);

impl Stage {
    /// The staging dir (for the operator's own work, e.g. reading a root out of an image
    /// before [`Store::build_root`] copies it; never shown to a tenant).
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A fresh staging dir of the store (mode 0700), removed when dropped.
    pub fn new(store: &Store) -> Result<Stage> {
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| TemplateError::Io {
            what: "naming a staging dir".into(),
            source: io::Error::other(e.to_string()),
        })?;
        // Made and locked under the store's lock: a sweep never sees it unlocked.
        let _guard = store.lock(false)?;
        let mut stage = Stage(store.staging_dir().join(hex::encode(rnd)), None);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&stage.0)
            .map_err(TemplateError::io("creating a staging dir"))?;
        let dir = fs::File::open(&stage.0).map_err(TemplateError::io("opening a staging dir"))?;
        let lock = Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            TemplateError::Io {
                what: "locking a staging dir".into(),
                source: e.into(),
            }
        })?;
        stage.1 = Some(lock);
        Ok(stage)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = remove_tree(&self.0);
    }
}

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

/// What a flatten may write on the host (file data, holes not counted, each hard-linked
/// file once), and how to say so when it is reached; and the store's whole budget, which
/// builds and imports running side by side share: each looks again as it writes
/// ([`Flatten::spend`]) and once more when its root goes in ([`Store::install`]).
pub(crate) struct WriteBudget {
    pub(crate) bytes: u64,
    pub(crate) limit: String,
    pub(crate) what: String,
    pub(crate) fix: String,
    /// Layer blobs the same import keeps (in its stage until it is installed).
    pub(crate) kept: u64,
    pub(crate) store: Store,
    pub(crate) store_bytes: u64,
}

/// The file in a staging dir where its flatten publishes what it has written (8 bytes,
/// little-endian), for the builds and imports beside it.
const SPENT_FILE: &str = ".spent";

/// How often (bytes written) a flatten publishes its count and looks at the store's
/// budget again: what side-by-side builds can overshoot it by, at most, each.
const LOOK_EVERY: u64 = 8 << 20;

/// The store's budget for people: its bound, what is used of it, and the fix.
fn store_budget_words(used: u64, budget: u64) -> (String, String, String) {
    (
        human(budget),
        format!(
            "the template store's budget, {} already used",
            human(used.min(budget))
        ),
        "remove templates you no longer need (`cordon template rm NAME`, then \
         `cordon template gc`), or raise the budget (--max-store-bytes, or \
         CORDON_TEMPLATE_STORE_BYTES)"
            .into(),
    )
}

/// The store's budget is spent: `used` of `budget`.
fn store_budget_spent(used: u64, budget: u64) -> TemplateError {
    let (limit, what, fix) = store_budget_words(used, budget);
    TemplateError::DiskLimit { limit, what, fix }
}

/// Bytes for people: `400.0M`.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}K", b as f64 / 1024.0),
        b => format!("{b}B"),
    }
}

fn layer_io(i: usize) -> impl FnOnce(io::Error) -> TemplateError {
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

/// A relative path made of normal components only; `None` if it has `..`, a root or
/// nothing at all.
fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            // A leading `/` in a layer means the image's root (tar's own convention).
            Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Opens a (possibly gzip-compressed) tar stream.
fn open_maybe_gzip(path: &Path) -> Result<(Compression, Box<dyn Read>)> {
    let f = fs::File::open(path).map_err(TemplateError::io("opening the image"))?;
    let mut r = BufReader::with_capacity(1 << 16, f);
    let head = r
        .fill_buf()
        .map_err(TemplateError::io("reading the image"))?;
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(TemplateError::Malformed(
            "a zstd-compressed layer; export the image with gzip or uncompressed layers".into(),
        ));
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok((Compression::Gzip, Box::new(flate2::read::GzDecoder::new(r))))
    } else {
        Ok((Compression::None, Box::new(r)))
    }
}

fn open_layer(path: &Path) -> Result<(Compression, Box<dyn Read>)> {
    open_maybe_gzip(path)
}

/// Unpacks the image file's regular files into `dest` (links and devices of the outer
/// archive are ignored: no OCI layout or docker archive needs them).
fn unpack_outer(archive: &Path, dest: &Path, limits: &ImportLimits) -> Result<()> {
    let (_, r) = open_maybe_gzip(archive)?;
    let mut ar = tar::Archive::new(r);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(TemplateError::io("creating a staging dir"))?;
    let bad = |e: io::Error| TemplateError::UnknownFormat(format!("the file is not a tar ({e})"));
    let (mut bytes, mut count) = (0u64, 0u64);
    for entry in ar.entries().map_err(bad)? {
        let mut e = entry.map_err(bad)?;
        count += 1;
        if count > limits.files {
            return Err(TemplateError::Limit {
                what: "entries",
                flag: "files",
                limit: limits.files,
            });
        }
        if !e.header().entry_type().is_file() {
            continue;
        }
        let path = e.path().map_err(bad)?.into_owned();
        let Some(rel) = clean(&path).filter(|_| !path.is_absolute()) else {
            return Err(TemplateError::Malformed(format!(
                "the file's entry {} leaves the archive",
                path.display()
            )));
        };
        bytes = bytes.saturating_add(e.size());
        if bytes > limits.archive_bytes {
            return Err(TemplateError::Limit {
                what: "image bytes",
                flag: "archive-bytes",
                limit: limits.archive_bytes,
            });
        }
        let to = dest.join(&rel);
        if let Some(parent) = to.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(TemplateError::io("unpacking the image"))?;
        }
        let mut out = create_new(&to).map_err(|e| {
            TemplateError::Malformed(format!("the file's entry {} ({e})", rel.display()))
        })?;
        io::copy(&mut e, &mut out).map_err(TemplateError::io("unpacking the image"))?;
    }
    Ok(())
}

/// Creates a file that must not exist yet, never through a link (mode 0600 until set).
fn create_new(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}

/// Hex sha256 and size of a file.
pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = fs::File::open(path).map_err(TemplateError::io("reading a blob"))?;
    let mut h = HashingReader::new(&mut f, u64::MAX);
    io::copy(&mut h, &mut io::sink()).map_err(TemplateError::io("reading a blob"))?;
    let n = h.count;
    Ok((h.finish(), n))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The blob a descriptor names, checked against its digest and size.
fn verified_blob(dir: &Path, d: &Descriptor, what: &str) -> Result<(PathBuf, String)> {
    if *d.digest().algorithm() != DigestAlgorithm::Sha256 || !is_hex64(d.digest().digest()) {
        return Err(TemplateError::Malformed(format!(
            "the {what} is named by a digest that is not sha256 ({})",
            d.digest()
        )));
    }
    let hex = d.digest().digest().to_string();
    let path = dir.join("blobs/sha256").join(&hex);
    if !path.is_file() {
        return Err(TemplateError::Malformed(format!(
            "the {what} blob {} is missing",
            d.digest()
        )));
    }
    let (got, size) = sha256_file(&path)?;
    if got != hex || size != d.size() {
        return Err(TemplateError::DigestMismatch {
            what: what.to_string(),
            expected: d.digest().to_string(),
        });
    }
    Ok((path, hex))
}

fn malformed(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> TemplateError {
    move |e| TemplateError::Malformed(format!("{what}: {e}"))
}

/// The manifest for this machine among an index's, else the first.
fn pick(manifests: &[Descriptor]) -> Result<Descriptor> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => Arch::Other(other.to_string()),
    };
    manifests
        .iter()
        .find(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == arch)
        })
        .or_else(|| manifests.first())
        .cloned()
        .ok_or_else(|| TemplateError::Malformed("the index lists no image".into()))
}

fn read_oci(dir: &Path) -> Result<Parsed> {
    let index = ImageIndex::from_file(dir.join("index.json")).map_err(malformed("index.json"))?;
    let mut desc = pick(index.manifests())?;
    if *desc.media_type() == MediaType::ImageIndex {
        let (p, _) = verified_blob(dir, &desc, "nested index")?;
        let nested = ImageIndex::from_file(p).map_err(malformed("the nested index"))?;
        desc = pick(nested.manifests())?;
    }
    let (mpath, _) = verified_blob(dir, &desc, "manifest")?;
    let manifest = ImageManifest::from_file(mpath).map_err(malformed("the manifest"))?;
    let (cpath, _) = verified_blob(dir, manifest.config(), "config")?;
    let config = ImageConfiguration::from_file(cpath).map_err(malformed("the config"))?;
    let mut layers = Vec::new();
    for (i, l) in manifest.layers().iter().enumerate() {
        if matches!(
            l.media_type(),
            MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd
        ) {
            return Err(TemplateError::Malformed(format!(
                "layer {i} is zstd-compressed; export the image with gzip or uncompressed layers"
            )));
        }
        layers.push(verified_blob(dir, l, &format!("layer {i}"))?);
    }
    Ok(Parsed {
        format: ImageFormat::OciLayout,
        layers,
        diff_ids: config.rootfs().diff_ids().clone(),
        defaults: defaults(&config),
    })
}

/// One image of a docker archive's `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerImage {
    config: String,
    layers: Vec<String>,
}

fn read_docker(dir: &Path) -> Result<Parsed> {
    let body =
        fs::read(dir.join("manifest.json")).map_err(TemplateError::io("reading manifest.json"))?;
    let images: Vec<DockerImage> = serde_json::from_slice(&body)
        .map_err(|e| TemplateError::Malformed(format!("manifest.json: {e}")))?;
    let image = match images.as_slice() {
        [one] => one,
        [] => {
            return Err(TemplateError::Malformed(
                "manifest.json lists no image".into(),
            ));
        }
        _ => {
            return Err(TemplateError::Malformed(
                "manifest.json lists several images; save one image per file".into(),
            ));
        }
    };
    let inside = |p: &str| -> Result<PathBuf> {
        let rel = clean(Path::new(p))
            .filter(|_| !p.starts_with('/'))
            .ok_or_else(|| TemplateError::Malformed(format!("manifest.json names {p:?}")))?;
        let path = dir.join(rel);
        if !path.is_file() {
            return Err(TemplateError::Malformed(format!("{p:?} is missing")));
        }
        Ok(path)
    };
    let cpath = inside(&image.config)?;
    // A config named by its digest (every docker save names it so) is checked against it.
    let (chex, _) = sha256_file(&cpath)?;
    let named = Path::new(&image.config)
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_end_matches(".json"))
        .filter(|n| is_hex64(n));
    if let Some(n) = named
        && n != chex
    {
        return Err(TemplateError::DigestMismatch {
            what: "config".into(),
            expected: format!("sha256:{n}"),
        });
    }
    let config = ImageConfiguration::from_file(&cpath).map_err(malformed("the config"))?;
    let mut layers = Vec::new();
    for l in &image.layers {
        let p = inside(l)?;
        let (hex, _) = sha256_file(&p)?;
        layers.push((p, hex));
    }
    Ok(Parsed {
        format: ImageFormat::DockerArchive,
        layers,
        diff_ids: config.rootfs().diff_ids().clone(),
        defaults: defaults(&config),
    })
}

fn defaults(config: &ImageConfiguration) -> ImageDefaults {
    let Some(c) = config.config() else {
        return ImageDefaults::default();
    };
    let env: BTreeMap<String, String> = c
        .env()
        .iter()
        .flatten()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| {
            !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ImageDefaults {
        env,
        working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
    }
}

/// A reader that hashes what passes and refuses more than `limit` bytes.
struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    count: u64,
    limit: u64,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R, limit: u64) -> Self {
        HashingReader {
            inner,
            hash: Sha256::new(),
            count: 0,
            limit,
        }
    }

    fn finish(self) -> String {
        hex::encode(self.hash.finalize())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                self.limit.to_string(),
            ));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Layers applied one after the other onto one directory.
pub(crate) struct Flatten {
    root: PathBuf,
    /// Whether the root is made here (else only hashed: a root of that digest exists).
    made: bool,
    dropped: Vec<Dropped>,
    setid_cleared: u64,
    files: u64,
    unpacked: u64,
    /// Bytes written on the host: file data (holes skipped), and a block per directory.
    written: u64,
    /// Bytes of the last layer stream read by [`Flatten::entries`].
    pub(crate) stream_bytes: u64,
    budget: WriteBudget,
    limits: ImportLimits,
    /// The staging dir, where [`SPENT_FILE`] is published.
    stage: PathBuf,
    /// `written` at which the store's budget is looked at next.
    next_look: u64,
}

/// Where a checked path lands.
enum Place {
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
    fn apply(&mut self, i: usize, blob: &Path) -> Result<(Compression, String)> {
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
            let shown = path.display().to_string();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".wh."))
            {
                continue;
            }
            self.files += 1;
            if self.files > self.limits.files {
                return Err(TemplateError::Limit {
                    what: "entries",
                    flag: "files",
                    limit: self.limits.files,
                });
            }
            let ty = e.header().entry_type();
            let skip = |s: &mut Self, reason| {
                s.dropped.push(Dropped {
                    layer: i,
                    path: shown.clone(),
                    reason,
                })
            };
            let Some(rel) = clean(&path) else {
                // The layer's own root (`./`) is fine; anything else left it.
                if path.components().any(|c| c == Component::ParentDir) {
                    skip(self, DropReason::EscapesRoot);
                }
                continue;
            };
            let to = match self.place(&rel, false) {
                Place::At(p) => p,
                Place::Drop(reason) => {
                    skip(self, reason);
                    continue;
                }
            };
            let mode = e.header().mode().unwrap_or(0o644);
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
                    self.unpacked = self.unpacked.saturating_add(e.size());
                    if self.unpacked > self.limits.unpacked_bytes {
                        return Err(TemplateError::Limit {
                            what: "uncompressed layer bytes",
                            flag: "unpacked-bytes",
                            limit: self.limits.unpacked_bytes,
                        });
                    }
                    remove_any(&to)?;
                    let perm = sanitize(mode, false, &mut self.setid_cleared);
                    let mut out = create_new(&to).map_err(TemplateError::io("creating a file"))?;
                    self.write_sparse(i, &mut e, &mut out)?;
                    fs::set_permissions(&to, fs::Permissions::from_mode(perm))
                        .map_err(TemplateError::io("setting a file's mode"))?;
                }
                T::Symlink => {
                    let Some(target) = e.link_name().map_err(layer_io(i))? else {
                        skip(
                            self,
                            DropReason::Unsupported("symlink without target".into()),
                        );
                        continue;
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
                        skip(self, DropReason::HardlinkOutside);
                        continue;
                    };
                    if !fs::symlink_metadata(&source).is_ok_and(|m| m.is_file()) {
                        skip(self, DropReason::HardlinkOutside);
                        continue;
                    }
                    if source != to {
                        remove_any(&to)?;
                        fs::hard_link(&source, &to)
                            .map_err(TemplateError::io("creating a hard link"))?;
                    }
                }
                T::Char | T::Block => skip(self, DropReason::DeviceNode),
                T::Fifo => skip(self, DropReason::Fifo),
                other => skip(self, DropReason::Unsupported(format!("{other:?}"))),
            }
        }
        // The rest of the stream (end-of-archive blocks, padding) is part of the digest.
        io::copy(&mut hr, &mut io::sink()).map_err(layer_io(i))?;
        self.stream_bytes = hr.count;
        Ok(hr.finish())
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
    fn seal(&self) -> Result<()> {
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
fn sanitize(mode: u32, dir: bool, cleared: &mut u64) -> u32 {
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
fn remove_any(p: &Path) -> Result<()> {
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
const DIR_BYTES: u64 = 4096;

/// The unit a file is copied in: a block of zeros this long becomes a hole.
const SPARSE_BLOCK: usize = 64 << 10;
