//! Directory watchers of a gVisor sandbox: its `/work` is a tmpfs on the host that the
//! sentry writes through, so the host watches it itself (inotify), with the same bounded
//! [`Watches`] the agent keeps inside the other tiers. The directories are opened by the
//! workspace's walk beneath `/work` (never through a symlink, never onto another
//! filesystem) and watched through those descriptors, so nothing the sandbox makes is
//! resolved as a path on the host; only directory entries are read (names and their
//! types), never a file's contents.

use std::path::Path;

use cordon_core::{Error, Result, WatchOp, WatchReply};
use cordon_guest::files::Workspace;
use cordon_guest::watch::Watches;

/// The watchers and the workspace they walk.
pub(crate) struct HostWatches {
    ws: Workspace,
    watches: Watches,
}

impl HostWatches {
    pub(crate) fn open(work: &Path, uid: u32) -> Result<Self> {
        let ws = Workspace::open(work, uid, uid).map_err(|e| Error::io("opening /work", e))?;
        Ok(HostWatches {
            ws,
            watches: Watches::new(),
        })
    }

    /// Takes in what the kernel queued (a directory made since is watched before the
    /// next change to the workspace is made).
    pub(crate) fn pump(&mut self) {
        self.watches.pump(&self.ws);
    }

    pub(crate) fn handle(&mut self, op: &WatchOp) -> Result<WatchReply> {
        self.watches
            .handle(&self.ws, op)
            .map_err(|(code, message)| cordon_host::files::watch_error(op, code, message))
    }
}
