//! Snapshots of a container sandbox (issue 46): its files, never its processes.
//!
//! A **filesystem** snapshot is the workspace (`/work`) as the agent inside the sandbox
//! streams it out (the same tar stream as a directory download: files, directories and
//! their modes, symlinks as links, never followed; FIFOs, sockets and devices skipped). The
//! root is the host's read-only `/usr` (or a read-only template), so the workspace is all
//! a sandbox can write that outlives an exec but `/tmp`, a scratch tmpfs that is not kept.
//! The copy is taken without freezing the sandbox (the agent that streams it lives in the
//! sandbox's cgroup, so a frozen sandbox could not be read): its processes run on, and a
//! file being written during the copy is kept as it was when the agent read it.
//!
//! A sandbox started from it is a fresh create (its own id, walls, proxy, placeholders)
//! whose workspace is filled from the image by its own agent with the checks of an upload:
//! no entry leaves `/work`, setuid/setgid bits are dropped, the disk limit holds; links are
//! not extracted (uploads never make them), and what was skipped is logged.
//!
//! A **full** snapshot is refused: it would need CRIU to checkpoint and restore the
//! sandbox's processes, and CRIU cannot restore a process confined by a Landlock ruleset
//! (the kernel has no call that reads a ruleset back, so a checkpoint cannot hold one),
//! while Cordon never runs a container sandbox's code without one.

use std::io::Write;

use cordon_core::{
    ArchiveReport, Error, Feature, Result, Sandbox, SnapshotDir, SnapshotImage, SnapshotMode, Tier,
    WorkspaceImage,
};

/// The layout this build writes: the workspace as one tar (see [`WorkspaceImage`]).
const IMAGE: WorkspaceImage = WorkspaceImage {
    tier: Tier::Container,
    format: 1,
};

/// Why the container tier refuses a full snapshot, and what to do instead.
fn no_full() -> Error {
    Error::Unsupported {
        what: "a full snapshot (memory and processes) on the container tier: it would need \
               CRIU, and CRIU cannot checkpoint a process confined by a Landlock ruleset, \
               which every container sandbox runs under"
            .into(),
        fix: format!(
            "take a filesystem snapshot (mode \"filesystem\": the workspace, processes start \
             fresh), or {}",
            Feature::SnapshotFull.fix()
        ),
    }
}

/// `Sandbox::snapshot` of a container sandbox: `paused` whether it is paused; `archive`
/// writes its workspace as a tar.
pub(crate) fn take(
    paused: bool,
    mode: SnapshotMode,
    dir: &SnapshotDir,
    archive: impl FnOnce(&mut dyn Write) -> Result<ArchiveReport>,
) -> Result<SnapshotImage> {
    if mode == SnapshotMode::Full {
        return Err(no_full());
    }
    if paused {
        return Err(Error::Unsupported {
            what: "a snapshot of a paused container sandbox (its agent is frozen with it)".into(),
            fix: "resume it, then take the snapshot".into(),
        });
    }
    IMAGE.take(mode, dir, archive)
}

/// `Backend::start_from_snapshot` of the container tier: a create (`create`), then the
/// workspace.
pub(crate) fn start(
    image: &SnapshotImage,
    dir: &SnapshotDir,
    create: impl FnOnce() -> Result<Box<dyn Sandbox>>,
) -> Result<Box<dyn Sandbox>> {
    let tar = IMAGE.open(image, dir, &[SnapshotMode::Filesystem])?;
    let mut sb = create()?;
    let report = WorkspaceImage::fill(sb.as_mut(), tar)?;
    if !report.skipped.is_empty() {
        tracing::debug!(
            sandbox = %sb.id(),
            skipped = report.skipped.len(),
            "entries of the snapshot not restored (links, special files)"
        );
    }
    Ok(sb)
}
