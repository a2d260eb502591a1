//! A session's code contexts as the server keeps them: the table of contexts, each one's
//! listed facts and the host's end of its interpreter. The contexts' operations (`mod.rs`)
//! and their carrying across a snapshot (`carry.rs`) both work on these.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::super::common::lock;
use super::frames::FrameReader;
use crate::model::{ContextInfo, ContextLang};

/// A session's contexts by their API id (`ctx-<n>`).
#[derive(Default)]
pub(super) struct Table {
    pub(super) next: u64,
    pub(super) by_id: BTreeMap<String, Arc<Context>>,
}

/// One context: its interpreter (the worker) and what is listed of it.
pub(in super::super) struct Context {
    pub(super) id: String,
    pub(super) lang: ContextLang,
    pub(super) default: bool,
    /// The directory its interpreter starts in (None: the workspace).
    pub(super) cwd: Option<String>,
    pub(super) created_ms: i64,
    /// A cell or a restart is under way: one at a time.
    pub(super) busy: AtomicBool,
    /// Deleted: a cell running meanwhile ends without a new interpreter.
    pub(super) closed: AtomicBool,
    /// The background exec id of the current interpreter, for a kill that must not wait
    /// for a running cell.
    pub(super) agent: AtomicU64,
    pub(super) meta: Mutex<Meta>,
    pub(super) worker: Mutex<Option<Worker>>,
}

#[derive(Default, Clone)]
pub(super) struct Meta {
    pub(super) started_ms: i64,
    pub(super) version: String,
    pub(super) count: u64,
    pub(super) restarts: u64,
    pub(super) alive: bool,
}

/// The host's end of one interpreter.
pub(super) struct Worker {
    pub(super) agent: u64,
    /// Offsets of the exec's stdout and stderr read so far.
    pub(super) from: [u64; 2],
    pub(super) reader: FrameReader,
    pub(super) next_cell: u64,
}

impl Context {
    pub(super) fn info(&self) -> ContextInfo {
        let m = lock(&self.meta).clone();
        ContextInfo {
            id: self.id.clone(),
            lang: self.lang,
            default: self.default,
            cwd: self
                .cwd
                .clone()
                .unwrap_or_else(|| cordon_core::WORKDIR.to_string()),
            state: if self.busy.load(Ordering::Acquire) {
                "running".into()
            } else if m.alive {
                "ready".into()
            } else {
                "dead".into()
            },
            created_ms: self.created_ms,
            started_ms: m.started_ms,
            execution_count: m.count,
            version: m.version,
            restarts: m.restarts,
        }
    }
}
