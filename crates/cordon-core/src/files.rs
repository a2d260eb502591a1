//! Typed file operations on a sandbox's workspace beyond one file in and out: list, stat,
//! remove, rename, make a directory, and the report of a directory moved as a tar stream.
//! Every path is a sandbox path under [`crate::WORKDIR`]; the code that carries them out
//! opens everything beneath the workspace and never follows a symlink.

use std::collections::BTreeMap;

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
    /// The user metadata on a file or directory: its extended attributes named
    /// [`METADATA_XATTR_PREFIX`]`key`, by key (the prefix left off); other attributes are
    /// not shown. Read from the entry itself, never through a symlink.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
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
    /// Makes a file's (or directory's) user metadata exactly `metadata`: every
    /// [`METADATA_XATTR_PREFIX`] attribute not in it is removed (an empty map clears them).
    /// Checked with [`check_metadata`]; never through a symlink.
    SetMetadata {
        path: String,
        #[serde(default)]
        metadata: BTreeMap<String, String>,
    },
}

impl FileOp {
    /// The path the operation is about (the source of a rename), for messages and audit.
    pub fn path(&self) -> &str {
        match self {
            FileOp::List { path }
            | FileOp::Stat { path }
            | FileOp::Remove { path, .. }
            | FileOp::Mkdir { path, .. }
            | FileOp::SetMetadata { path, .. } => path,
            FileOp::Rename { from, .. } => from,
        }
    }

    /// Every path the operation names (both ends of a rename).
    pub fn paths(&self) -> Vec<&str> {
        match self {
            FileOp::Rename { from, to } => vec![from, to],
            other => vec![other.path()],
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
            FileOp::SetMetadata { .. } => "set_metadata",
        }
    }
}

/// The extended attribute namespace a file's user metadata lives in (as E2B's envd keeps
/// it): key `k` is the attribute `user.e2b.k`.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// Most metadata keys on one file.
pub const MAX_METADATA_KEYS: usize = 64;
/// Longest metadata key, in bytes (with the prefix it stays under the kernel's 255).
pub const MAX_METADATA_KEY: usize = 128;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE: usize = 4096;
/// Most bytes of keys and values together on one file.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// Why a metadata map is refused; the message says what to send instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MetadataRefused(pub String);

/// Checks a metadata map as an upload gives it: keys are non-empty lowercase HTTP header
/// tokens (E2B's SDKs send them as `X-Metadata-<key>` headers, which the sandbox lowercases),
/// values printable US-ASCII, within [`MAX_METADATA_KEYS`], [`MAX_METADATA_KEY`],
/// [`MAX_METADATA_VALUE`] and [`MAX_METADATA_BYTES`].
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), MetadataRefused> {
    let refuse = |m: String| Err(MetadataRefused(m));
    if metadata.len() > MAX_METADATA_KEYS {
        return refuse(format!(
            "{} metadata keys on one file; at most {MAX_METADATA_KEYS} are kept: merge some",
            metadata.len()
        ));
    }
    let mut total = 0usize;
    for (k, v) in metadata {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if k.is_empty() || !k.chars().all(token) || k.chars().any(|c| c.is_ascii_uppercase()) {
            return refuse(format!(
                "metadata key {k:?} is not a lowercase header token; use letters, digits and \
                 !#$%&'*+-.^_`|~ only"
            ));
        }
        if k.len() > MAX_METADATA_KEY {
            return refuse(format!(
                "metadata key {:?}... is {} bytes; keys are at most {MAX_METADATA_KEY}",
                &k[..16],
                k.len()
            ));
        }
        if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return refuse(format!(
                "the metadata value of {k:?} is not printable US-ASCII; encode it (base64, \
                 percent-encoding) first"
            ));
        }
        if v.len() > MAX_METADATA_VALUE {
            return refuse(format!(
                "the metadata value of {k:?} is {} bytes; values are at most \
                 {MAX_METADATA_VALUE}: keep larger data in a file beside it",
                v.len()
            ));
        }
        total += k.len() + v.len();
    }
    if total > MAX_METADATA_BYTES {
        return refuse(format!(
            "{total} bytes of metadata on one file; at most {MAX_METADATA_BYTES}: keep larger \
             data in a file beside it"
        ));
    }
    Ok(())
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

    #[test]
    fn metadata_is_bounded_and_tokens_only() {
        let one = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(check_metadata(&one("author", "mish")).is_ok());
        assert!(check_metadata(&BTreeMap::new()).is_ok());
        for (k, v) in [
            ("", "x"),
            ("bad key", "x"),
            ("Upper", "x"),
            ("k", "a\nb"),
            ("k", "é"),
        ] {
            assert!(check_metadata(&one(k, v)).is_err(), "{k:?}={v:?} taken");
        }
        assert!(check_metadata(&one(&"k".repeat(MAX_METADATA_KEY + 1), "x")).is_err());
        assert!(check_metadata(&one("k", &"v".repeat(MAX_METADATA_VALUE + 1))).is_err());
        let many: BTreeMap<_, _> = (0..=MAX_METADATA_KEYS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        assert!(check_metadata(&many).is_err());
        let big: BTreeMap<_, _> = (0..5)
            .map(|i| (format!("k{i}"), "v".repeat(MAX_METADATA_VALUE)))
            .collect();
        assert!(
            check_metadata(&big)
                .unwrap_err()
                .0
                .contains("bytes of metadata")
        );
    }
}
