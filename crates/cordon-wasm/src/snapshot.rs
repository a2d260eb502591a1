//! Snapshots of a wasm sandbox (issue 46): its workspace, which is its whole lasting state.
//!
//! Every exec of a wasm sandbox runs in a fresh instance that ends with the exec (the
//! standby instance made ahead of the next one is made from the guest's image, never from
//! an earlier exec): no memory, interpreter state or process outlives an exec, only the
//! files of its scratch dir (`/work`). So a snapshot of either mode is that dir as one tar
//! ([`WorkspaceImage`]), and a sandbox started from it is in exactly the state its source
//! was: its next exec sees what the source's next exec would. A `full` snapshot is taken
//! as asked and recorded as such (a user who branches state need not know which tier keeps
//! what); the two modes hold the same image.
//!
//! Taking it needs no pause: the sandbox is borrowed exclusively for the call, so no exec
//! runs while its files are read. A sandbox started from it is a fresh create (its own id,
//! scratch dir, limits and disk quota) whose workspace is filled with the checks of an
//! upload: no entry leaves `/work`, the disk limit holds, links are not extracted.

use cordon_core::{Backend, Sandbox, WorkspaceImage};
use cordon_core::{Result, SandboxSpec, SnapshotDir, SnapshotImage, SnapshotMode, Tier};

/// The layout this build writes and reads.
const IMAGE: WorkspaceImage = WorkspaceImage {
    tier: Tier::Wasm,
    format: 1,
};

/// `Sandbox::snapshot` of a wasm sandbox: its scratch dir `root`, at most `max` bytes.
pub(crate) fn take(
    root: &std::path::Path,
    max: u64,
    mode: SnapshotMode,
    dir: &SnapshotDir,
) -> Result<SnapshotImage> {
    IMAGE.take(mode, dir, |out| crate::files::pack(root, "/work", max, out))
}

/// `Backend::start_from_snapshot` of the wasm tier: a create, then the workspace.
pub(crate) fn start(
    backend: &dyn Backend,
    image: &SnapshotImage,
    dir: &SnapshotDir,
    spec: &SandboxSpec,
) -> Result<Box<dyn Sandbox>> {
    let tar = IMAGE.open(image, dir, &[SnapshotMode::Full, SnapshotMode::Filesystem])?;
    let mut sb = backend.create(spec)?;
    // What was skipped (links, special files) cannot be in a scratch dir the confined
    // workspace wrote: it makes neither.
    WorkspaceImage::fill(sb.as_mut(), tar)?;
    Ok(sb)
}
