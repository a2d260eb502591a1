//! What a full snapshot carries of a session's code contexts (docs/snapshots.md): each one's
//! listing and its interpreter's place in the agent's output. A sandbox started from a full
//! snapshot has the same interpreters (their exec ids kept by the tier), so the same table
//! serves them there; a snapshot is taken only while no cell runs (the session is claimed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::super::common::lock;
use super::super::sessions::Session;
use super::frames::FrameReader;
use super::state::{Context, Meta, Table, Worker};
use crate::model::ContextLang;

/// One context as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedContext {
    id: String,
    lang: ContextLang,
    default: bool,
    cwd: Option<String>,
    created_ms: i64,
    agent: u64,
    started_ms: i64,
    version: String,
    count: u64,
    restarts: u64,
    alive: bool,
    /// The interpreter's exec id, the stdout and stderr offsets read, the next cell's number.
    worker: Option<(u64, [u64; 2], u64)>,
}

/// A session's contexts as a snapshot keeps them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CarriedContexts {
    next: u64,
    contexts: Vec<CarriedContext>,
}

/// The contexts of `s`, for a full snapshot of it.
pub(in super::super) fn carry(s: &Session) -> CarriedContexts {
    let table = s.state::<Table>();
    let t = lock(&table);
    CarriedContexts {
        next: t.next,
        contexts: t
            .by_id
            .values()
            .map(|c| {
                let m = lock(&c.meta).clone();
                CarriedContext {
                    id: c.id.clone(),
                    lang: c.lang,
                    default: c.default,
                    cwd: c.cwd.clone(),
                    created_ms: c.created_ms,
                    agent: c.agent.load(Ordering::Acquire),
                    started_ms: m.started_ms,
                    version: m.version,
                    count: m.count,
                    restarts: m.restarts,
                    alive: m.alive,
                    worker: lock(&c.worker)
                        .as_ref()
                        .map(|w| (w.agent, w.from, w.next_cell)),
                }
            })
            .collect(),
    }
}

/// Gives `s` (a sandbox just started from a full snapshot) the contexts its source had.
pub(in super::super) fn restore(s: &Session, carried: CarriedContexts) {
    let table = s.state::<Table>();
    let mut t = lock(&table);
    t.next = carried.next;
    for c in carried.contexts {
        let ctx = Context {
            id: c.id.clone(),
            lang: c.lang,
            default: c.default,
            cwd: c.cwd,
            created_ms: c.created_ms,
            busy: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            agent: AtomicU64::new(c.agent),
            meta: Mutex::new(Meta {
                started_ms: c.started_ms,
                version: c.version,
                count: c.count,
                restarts: c.restarts,
                alive: c.alive,
            }),
            worker: Mutex::new(c.worker.map(|(agent, from, next_cell)| Worker {
                agent,
                from,
                reader: FrameReader::default(),
                next_cell,
            })),
        };
        t.by_id.insert(c.id, Arc::new(ctx));
    }
}
