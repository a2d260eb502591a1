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

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use cordon_core::{
    Error, Feature, Result, Sandbox, SandboxSpec, SnapshotDir, SnapshotImage, SnapshotMode, Tier,
};

use crate::{ContainerBackend, ContainerSandbox};

/// The layout this build writes: `manifest` and `work.tar`.
const FORMAT: u32 = 1;
const MANIFEST: &str = "manifest";
const WORK_TAR: &str = "work.tar";

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

/// `Sandbox::snapshot` of a container sandbox.
pub(crate) fn take(
    sb: &mut ContainerSandbox,
    mode: SnapshotMode,
    dir: &SnapshotDir,
) -> Result<SnapshotImage> {
    if mode == SnapshotMode::Full {
        return Err(no_full());
    }
    if sb.is_paused() {
        return Err(Error::Unsupported {
            what: "a snapshot of a paused container sandbox (its agent is frozen with it)".into(),
            fix: "resume it, then take the snapshot".into(),
        });
    }
    let max = sb.disk_limit();
    let tar = create_new(&dir.path().join(WORK_TAR))?;
    let mut out = BufWriter::new(&tar);
    let report = sb.file_call(|io| cordon_host::files::get_archive(io, "/work", max, &mut out))?;
    out.flush()
        .map_err(|e| Error::failed("writing the snapshot", e))?;
    drop(out);
    tar.sync_all()
        .map_err(|e| Error::failed("writing the snapshot", e))?;
    let mut manifest = create_new(&dir.path().join(MANIFEST))?;
    writeln!(manifest, "cordon container snapshot {FORMAT}")
        .and_then(|()| manifest.sync_all())
        .map_err(|e| Error::failed("writing the snapshot", e))?;
    tracing::debug!(
        files = report.files,
        bytes = report.bytes,
        skipped = report.skipped.len(),
        "container snapshot written"
    );
    Ok(SnapshotImage {
        tier: Tier::Container,
        mode,
        bytes: used_bytes(dir.path())?,
        format: FORMAT,
    })
}

/// `Backend::start_from_snapshot` of the container tier: a create, then the workspace.
pub(crate) fn start(
    backend: &ContainerBackend,
    image: &SnapshotImage,
    dir: &SnapshotDir,
    spec: &SandboxSpec,
) -> Result<ContainerSandbox> {
    if image.tier != Tier::Container || image.mode != SnapshotMode::Filesystem {
        return Err(Error::Invalid(format!(
            "a {} snapshot of the {} tier cannot start a container sandbox; start it on its \
             own tier",
            image.mode, image.tier
        )));
    }
    if image.format != FORMAT {
        return Err(Error::Invalid(format!(
            "this snapshot was written in container snapshot format {}, which this build does \
             not read (it reads {FORMAT}); take the snapshot again",
            image.format
        )));
    }
    // Opened before the create: an image that is gone costs no sandbox.
    let mut tar = File::open(dir.path().join(WORK_TAR)).map_err(|e| {
        Error::failed(
            "opening the snapshot's image (it may have been deleted; take it again)",
            e,
        )
    })?;
    let mut sb = backend.create_sandbox(spec)?;
    match sb.put_archive("/work", &mut tar) {
        Ok(report) => {
            if !report.skipped.is_empty() {
                tracing::debug!(
                    sandbox = %sb.id(),
                    skipped = report.skipped.len(),
                    "entries of the snapshot not restored (links, special files)"
                );
            }
            Ok(sb)
        }
        Err(e) => {
            let _ = sb.destroy();
            Err(e)
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
