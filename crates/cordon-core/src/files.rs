//! Typed file operations on a sandbox's workspace beyond one file in and out: list, stat,
//! remove, rename, make a directory, and the report of a directory moved as a tar stream.
//! Every path is a sandbox path under [`crate::WORKDIR`]; the code that carries them out
//! opens everything beneath the workspace and never follows a symlink.

use serde::{Deserialize, Serialize};

/// Most entries one listing returns; the reply says when there were more.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// What a directory entry is. Only files and directories are ever opened or read; the
/// other kinds are reported, never followed or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// One directory entry, or what `stat` found (never through a symlink: a symlink is
/// reported as one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// The entry's name in its directory (`/work` for the workspace itself).
    pub name: String,
    pub kind: FileKind,
    /// Bytes (of the link text for a symlink).
    pub size: u64,
    /// Permission bits (`0o7777` at most; no file type bits).
    pub mode: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Where a symlink points, its text as written (never followed); none for other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// One operation on the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileOp {
    /// The entries of a directory (`/work` itself included), sorted by name.
    List { path: String },
    /// One entry, not followed if it is a symlink.
    Stat { path: String },
    /// A file, symlink (the link itself) or empty directory; with `recursive`, a directory
    /// and everything beneath it.
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Moves `from` to `to` (replacing a file at `to`, as `rename(2)` does).
    Rename { from: String, to: String },
    /// A directory; with `parents`, missing parents too, and no error if it exists.
    Mkdir {
        path: String,
        #[serde(default)]
        parents: bool,
    },
}

impl FileOp {
    /// The path the operation is about (the source of a rename), for messages and audit.
    pub fn path(&self) -> &str {
        match self {
            FileOp::List { path }
            | FileOp::Stat { path }
            | FileOp::Remove { path, .. }
            | FileOp::Mkdir { path, .. } => path,
            FileOp::Rename { from, .. } => from,
        }
    }

    /// The operation's name, for audit rows and messages.
    pub fn name(&self) -> &'static str {
        match self {
            FileOp::List { .. } => "list",
            FileOp::Stat { .. } => "stat",
            FileOp::Remove { .. } => "remove",
            FileOp::Rename { .. } => "rename",
            FileOp::Mkdir { .. } => "mkdir",
        }
    }
}

/// The answer to a [`FileOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileReply {
    /// A listing: at most [`MAX_LIST_ENTRIES`], `truncated` when there were more.
    Entries {
        entries: Vec<FileEntry>,
        truncated: bool,
    },
    /// What `stat` found.
    Entry { entry: FileEntry },
    /// Remove, rename and mkdir: done.
    Done,
}

/// An archive entry left out, and why (a symlink, a device node, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// What moving a directory as a tar stream did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ArchiveReport {
    pub files: u64,
    pub dirs: u64,
    /// Symlinks written into an archive (as links, never followed); none are extracted.
    #[serde(default)]
    pub symlinks: u64,
    /// Bytes of file contents.
    pub bytes: u64,
    /// Entries left out: on upload, links, device nodes and FIFOs; on download, FIFOs,
    /// sockets and device nodes.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_tagged_and_strict() {
        let op: FileOp =
            serde_json::from_str(r#"{"op":"remove","path":"/work/a","recursive":true}"#).unwrap();
        assert_eq!(
            op,
            FileOp::Remove {
                path: "/work/a".into(),
                recursive: true
            }
        );
        assert_eq!(op.name(), "remove");
        assert!(serde_json::from_str::<FileOp>(r#"{"op":"chmod","path":"a"}"#).is_err());
        assert!(serde_json::from_str::<FileOp>(r#"{"op":"stat","path":"a","x":1}"#).is_err());
    }
}
