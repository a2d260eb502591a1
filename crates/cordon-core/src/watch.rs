//! Watching a directory of a sandbox's workspace: the operations a host asks of the code
//! that watches (inotify in the sandbox's agent, or on the host where the workspace is the
//! host's own directory), and the events it reports. Every bound is here, so the agent,
//! the tiers and the server agree on them: a sandbox has at most [`MAX_WATCHERS`] watchers
//! and [`MAX_WATCHED_DIRS`] watched directories; each watcher queues at most
//! [`MAX_QUEUED_EVENTS`] events of at most [`MAX_QUEUED_BYTES`] bytes of names, and what
//! does not fit is dropped and counted, never kept.

use serde::{Deserialize, Serialize};

/// Most watchers one sandbox has at once.
pub const MAX_WATCHERS: usize = 16;
/// Most directories one sandbox's watchers watch at once (a recursive watch counts every
/// directory beneath its root).
pub const MAX_WATCHED_DIRS: usize = 4096;
/// Most events one watcher queues until they are read.
pub const MAX_QUEUED_EVENTS: usize = 4096;
/// Most bytes of event names one watcher queues until they are read.
pub const MAX_QUEUED_BYTES: usize = 256 << 10;

/// What happened to an entry, as E2B's envd names its event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// Created, or moved in.
    Create,
    /// Its contents changed.
    Write,
    /// Removed.
    Remove,
    /// Moved away (or renamed).
    Rename,
    /// Its mode, owner or times changed.
    Chmod,
}

/// One event: the entry's path relative to the watched directory, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WatchEvent {
    pub name: String,
    pub kind: WatchKind,
}

/// One operation on a sandbox's watchers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum WatchOp {
    /// Starts watching the directory `path` (a sandbox path); with `recursive`, every
    /// directory beneath it too, as they come.
    Start { path: String, recursive: bool },
    /// The events of watcher `id` queued since its last read.
    Read { id: u64 },
    /// Stops watcher `id` and drops what it queued.
    Stop { id: u64 },
}

/// The answer to a [`WatchOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum WatchReply {
    Started {
        id: u64,
    },
    /// Events in the order they happened; `dropped` counts those lost since the last read
    /// (a full queue, the kernel's queue overflowing, or directories beyond
    /// [`MAX_WATCHED_DIRS`] left unwatched); `ended` once the watched directory itself is
    /// gone (the watcher then reports nothing more).
    Events {
        events: Vec<WatchEvent>,
        dropped: u64,
        ended: bool,
    },
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_replies_are_tagged_and_strict() {
        let op: WatchOp =
            serde_json::from_str(r#"{"op":"start","path":"/work/a","recursive":true}"#).unwrap();
        assert_eq!(
            op,
            WatchOp::Start {
                path: "/work/a".into(),
                recursive: true
            }
        );
        assert!(serde_json::from_str::<WatchOp>(r#"{"op":"read","id":1,"x":2}"#).is_err());
        let r = WatchReply::Events {
            events: vec![WatchEvent {
                name: "d/f".into(),
                kind: WatchKind::Write,
            }],
            dropped: 3,
            ended: false,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<WatchReply>(&text).unwrap(), r);
    }
}
