//! A snapshot image that is a sandbox's workspace as one tar stream: what the tiers whose
//! whole lasting state is their files write (the container tier's filesystem snapshots, and
//! every snapshot of the wasm tier, whose execs each run in a fresh instance).
//!
//! The image directory holds `work.tar` (the workspace as the tier's own archive call
//! streams it: files, directories and modes, links as links, special files skipped) and
//! `manifest` (one line naming the tier and the layout's version). A sandbox started from
//! it is a fresh create of its tier whose workspace is filled from the tar with the checks
//! of an upload ([`crate::Sandbox::put_archive`]).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::{
    Error, Result, Sandbox, SnapshotDir, SnapshotImage, SnapshotMode, SnapshotRefusal, Tier,
};

const MANIFEST: &str = "manifest";
const WORK_TAR: &str = "work.tar";

/// One tier's workspace image layout.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceImage {
    pub tier: Tier,
    /// The layout's version this build writes and reads.
    pub format: u32,
}

impl WorkspaceImage {
    /// Writes the image into `dir`: `archive` streams the workspace as tar into the writer
    /// it is given. The tier has checked `mode` before.
    pub fn take(
        &self,
        mode: SnapshotMode,
        dir: &SnapshotDir,
        archive: impl FnOnce(&mut dyn Write) -> Result<crate::ArchiveReport>,
    ) -> Result<SnapshotImage> {
        let tar = create_new(&dir.path().join(WORK_TAR))?;
        let mut out = BufWriter::new(&tar);
        archive(&mut out)?;
        out.flush()
            .map_err(|e| Error::failed("writing the snapshot", e))?;
        drop(out);
        tar.sync_all()
            .map_err(|e| Error::failed("writing the snapshot", e))?;
        let mut manifest = create_new(&dir.path().join(MANIFEST))?;
        writeln!(manifest, "cordon {} snapshot {}", self.tier, self.format)
            .and_then(|()| manifest.sync_all())
            .map_err(|e| Error::failed("writing the snapshot", e))?;
        Ok(SnapshotImage {
            tier: self.tier,
            mode,
            bytes: used_bytes(dir.path())?,
            format: self.format,
        })
    }

    /// Checks that `image` is one of this layout in one of `modes`, and opens its tar:
    /// before the new sandbox is made, so an image that is gone costs no sandbox.
    pub fn open(
        &self,
        image: &SnapshotImage,
        dir: &SnapshotDir,
        modes: &[SnapshotMode],
    ) -> Result<File> {
        if image.tier != self.tier || !modes.contains(&image.mode) {
            return Err(Error::Snapshot(SnapshotRefusal::OtherTier {
                mode: image.mode.to_string(),
                from: image.tier,
                to: self.tier,
            }));
        }
        if image.format != self.format {
            return Err(Error::Snapshot(SnapshotRefusal::Format {
                tier: self.tier,
                found: image.format,
                reads: self.format,
            }));
        }
        File::open(dir.path().join(WORK_TAR)).map_err(|e| {
            Error::failed(
                "opening the snapshot's image (it may have been deleted; take it again)",
                e,
            )
        })
    }

    /// Fills the new sandbox `sb`'s workspace from the image's tar (opened by
    /// [`WorkspaceImage::open`]), and says what was skipped (links, special files); on an
    /// error the sandbox is destroyed.
    pub fn fill(sb: &mut dyn Sandbox, mut tar: File) -> Result<crate::ArchiveReport> {
        match sb.put_archive("/work", &mut tar) {
            Ok(report) => Ok(report),
            Err(e) => {
                let _ = sb.destroy();
                Err(e)
            }
        }
    }
}

fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::failed("writing the snapshot", e))
}

/// The bytes the files directly in `dir` use on disk (blocks, not lengths).
fn used_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0u64;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::failed("measuring the snapshot", e))?;
    for entry in entries {
        let m = entry
            .and_then(|e| e.metadata())
            .map_err(|e| Error::failed("measuring the snapshot", e))?;
        total = total.saturating_add(m.blocks().saturating_mul(512).max(m.len()));
    }
    Ok(total)
}
