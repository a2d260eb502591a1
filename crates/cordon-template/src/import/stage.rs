//! What an import is held to and where it works: its limits, the store's write budget,
//! the staging directory, and what it reports (entries dropped and why).

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Result, TemplateError};
use crate::manifest::Manifest;
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

impl ImportLimits {
    /// Counts one more entry against [`ImportLimits::files`] (the image file's and all
    /// layers' together, in `count`).
    pub(crate) fn count_entry(&self, count: &mut u64) -> Result<(), TemplateError> {
        within(count, 1, (self.files, "entries", "files"))
    }

    /// Counts `len` more uncompressed layer bytes against [`ImportLimits::unpacked_bytes`].
    pub(crate) fn count_unpacked(&self, total: &mut u64, len: u64) -> Result<(), TemplateError> {
        let limit = (
            self.unpacked_bytes,
            "uncompressed layer bytes",
            "unpacked-bytes",
        );
        within(total, len, limit)
    }

    /// Counts `len` more bytes of the image file against [`ImportLimits::archive_bytes`].
    pub(crate) fn count_archive(&self, total: &mut u64, len: u64) -> Result<(), TemplateError> {
        within(
            total,
            len,
            (self.archive_bytes, "image bytes", "archive-bytes"),
        )
    }
}

/// Adds `n` to `total`; past `limit` (what it counts, the flag that raises it) the import
/// ends with [`TemplateError::Limit`].
fn within(
    total: &mut u64,
    n: u64,
    (limit, what, flag): (u64, &'static str, &'static str),
) -> Result<(), TemplateError> {
    *total = total.saturating_add(n);
    if *total > limit {
        return Err(TemplateError::Limit { what, flag, limit });
    }
    Ok(())
}

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
pub(super) const SPENT_FILE: &str = ".spent";

/// How often (bytes written) a flatten publishes its count and looks at the store's
/// budget again: what side-by-side builds can overshoot it by, at most, each.
pub(super) const LOOK_EVERY: u64 = 8 << 20;

/// The store's budget for people: its bound, what is used of it, and the fix.
pub(super) fn store_budget_words(used: u64, budget: u64) -> (String, String, String) {
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
pub(super) fn store_budget_spent(used: u64, budget: u64) -> TemplateError {
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
