//! Snapshots of a live sandbox and the sandboxes started from one (issue 46).
//!
//! The tier-independent contract, as [`crate::Sandbox::snapshot`] and
//! [`crate::Backend::start_from_snapshot`] implement it:
//!
//! - **The server owns the image's place and life.** It makes one empty, root-only (`0700`)
//!   directory per snapshot under its data dir ([`SnapshotDir`]) and hands it to the tier,
//!   which writes its whole image there and nothing anywhere else that outlives the call.
//!   The server records the [`SnapshotImage`] the tier returns, counts [`SnapshotImage::bytes`]
//!   in the tenant's and the store's budget, and deletes the directory (with everything in
//!   it) when the snapshot is deleted or a snapshot was cut short. A tier's forks may not
//!   depend on the image's files after [`crate::Backend::start_from_snapshot`] returns other
//!   than through descriptors they hold open (or copies): the image can be deleted while
//!   they live.
//! - **The image is self-contained for its tier.** After a server restart the server
//!   rebuilds the [`SnapshotImage`] from its record (tier, mode, bytes, format) and the
//!   directory, and starts sandboxes from it. A tier writes its own manifest (with a format
//!   version) inside the directory if it needs one, and refuses an image whose format it
//!   cannot read with [`crate::Error::Invalid`] saying to take the snapshot again.
//! - **Nothing of the host's secrets is in an image.** Grants' secrets, minted tokens and the
//!   egress proxy's state live on the host and are never written to the directory. A fork
//!   gets its own grants' placeholders and tokens (re-minted by the server for the fork's own
//!   id, never copied by the tier): the source's placeholders, wherever they were kept in the
//!   sandbox's files or memory, are worthless in a fork.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Feature, Tier};

/// What a snapshot keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Memory, processes and files: a sandbox started from it continues where the source was
    /// at the snapshot (a Python variable, a background process's counter, open files in the
    /// workspace), with its clock moved on. Tiers with [`Feature::SnapshotFull`].
    Full,
    /// The workspace (`/work`, its files, links and modes) and whatever the tier's root lets
    /// a sandbox write (a writable root, `/tmp` where it is on disk): a sandbox started from
    /// it has those files and no process of the source; its code contexts and background
    /// processes start fresh. Tiers with [`Feature::SnapshotFiles`].
    Filesystem,
}

impl SnapshotMode {
    /// The feature a tier needs to take a snapshot of this mode.
    pub fn feature(self) -> Feature {
        match self {
            SnapshotMode::Full => Feature::SnapshotFull,
            SnapshotMode::Filesystem => Feature::SnapshotFiles,
        }
    }

    /// For a tier that has full snapshots only: Ok for [`SnapshotMode::Full`], else the
    /// feature's refusal (naming the tiers that can) of `what` on `tier`.
    pub fn full_only(self, tier: Tier, what: &str) -> crate::Result<()> {
        match self {
            SnapshotMode::Full => Ok(()),
            mode => Err(mode.feature().unsupported(tier, what)),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMode::Full => "full",
            SnapshotMode::Filesystem => "filesystem",
        }
    }
}

impl std::fmt::Display for SnapshotMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SnapshotMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "full" | "memory" => Ok(SnapshotMode::Full),
            "filesystem" | "files" | "fs" => Ok(SnapshotMode::Filesystem),
            _ => Err(format!(
                "unknown snapshot mode {s:?}; use full (memory, processes and files) or \
                 filesystem (files only, processes start fresh)"
            )),
        }
    }
}

/// The directory one snapshot's image lives in: made by the server, empty and root-only
/// (`0700`) when given to [`crate::Sandbox::snapshot`]. Its path is the host's and never
/// shown to a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotDir(PathBuf);

impl SnapshotDir {
    /// Names a directory the caller made (or, after a restart, one it made before).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SnapshotDir(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// What a tier wrote into a [`SnapshotDir`]: the server persists these fields (with the
/// directory's place) and gives them back to [`crate::Backend::start_from_snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotImage {
    /// The tier that wrote it; only that tier starts sandboxes from it.
    pub tier: Tier,
    pub mode: SnapshotMode,
    /// The bytes the image holds on disk (what the budgets count): the tier's own measure
    /// of the directory after writing it, blocks actually used.
    pub bytes: u64,
    /// The tier's own version of its image layout; a tier refuses a format it does not know.
    pub format: u32,
}

/// The most sandboxes one fork call starts from one snapshot (E2B's `fork(count)` bound).
pub const MAX_FORKS: u32 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_name_their_feature() {
        for m in [SnapshotMode::Full, SnapshotMode::Filesystem] {
            assert_eq!(m.as_str().parse::<SnapshotMode>(), Ok(m));
            assert!(m.feature().describe().contains("snapshots"));
        }
        assert!("memory-and-more".parse::<SnapshotMode>().is_err());
        // The refusal names the tiers that can, from the features table.
        let e = SnapshotMode::Filesystem
            .feature()
            .unsupported(Tier::Runtime, "a filesystem snapshot")
            .to_string();
        assert!(e.contains("container"), "{e}");
        assert!(!e.contains("runtime tier for"), "{e}");
    }
}
