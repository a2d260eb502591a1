//! Python instances made ahead of the exec that runs them, and spent ones torn down after it
//! has answered, both on the backend's worker threads (ADR 0019).
//!
//! Making a Python exec's instance (a new store in a pool slot with the guest's memory image)
//! and resetting the slot when the store drops do not depend on the next snippet. With the
//! componentize-py guest the making cost as much as the run; with the snapshotted static
//! guest (ADR 0020) it costs microseconds, and the reset of the pages the run wrote is what
//! is left. So as an exec that followed a pause ends, a sandbox hands the spent store to a
//! worker to reset and asks it for the next exec's instance, then answers. While the caller
//! reads the answer and decides what to run next (an agent's think time), the worker makes
//! the instance; the next exec pays for its run alone. Back-to-back execs would gain nothing
//! (the next one would wait for the instance being made) and lose the core the worker takes,
//! so only an exec that itself came after a pause ([`PAUSE`]) hands its store over and asks
//! for the next instance.
//!
//! Nothing of the wall changes. A standby instance is a new store of the sandbox's own
//! setup (limits, fuel, scratch quota) whose WASI context gives the guest nothing (no
//! arguments, environment, stdio or directory) until the exec's context replaces it; it
//! serves exactly one exec and is never shared. Making it runs no snippet code. The costs
//! are bounded: one standby per sandbox, [`crate::PoolSize::standby_instances`] per backend
//! and `per_owner` per tenant (each holds one more pool slot beside the running execs' slots,
//! with the pages its instantiation wrote); one unused for [`IDLE`] is dropped; a sandbox that
//! has run only one exec (a `cordon run`) never gets one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use wasmtime::Engine;

use crate::engine::MAX_PENDING_DISPOSALS;
use crate::run::{self, Program, Ready, Setup};

/// How long after the previous exec ended an exec must come for the sandbox to count as paced
/// by a caller that reads each answer before its next request: only then are its spent store's
/// reset and the next instance left to a worker. Back-to-back execs reset their own slot: a
/// worker sharing the two cores of this host costs the next exec more than the reset does
/// (ADR 0020's figures). The default of [`crate::WasmConfig::standby_pause`].
pub(crate) const PAUSE: Duration = Duration::from_millis(5);

/// How long a standby instance is kept for an exec that has not come.
pub(crate) const IDLE: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One sandbox's standby instance.
#[derive(Default)]
pub(crate) struct Standby {
    cell: Arc<Cell>,
}

#[derive(Default)]
struct Cell {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
enum State {
    #[default]
    Empty,
    /// Asked for; no worker has started it (an exec that comes first makes its own, and the
    /// budget is given back at once).
    Queued(u64, Hold),
    /// A worker is making it (an exec that comes waits for it).
    Making(u64, Hold),
    Ready {
        ready: Ready,
        hold: Hold,
        since: Instant,
    },
}

impl Standby {
    /// The instance made for this exec, if one was asked for: waits, until `deadline` at most,
    /// for one a worker is making; cancels one no worker has started.
    pub fn take(&self, deadline: Instant) -> Option<Ready> {
        let mut state = lock(&self.cell.state);
        loop {
            match std::mem::take(&mut *state) {
                State::Ready { ready, .. } => return Some(ready),
                State::Empty | State::Queued(..) => return None,
                State::Making(ticket, hold) => {
                    *state = State::Making(ticket, hold);
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // Abandoned: the worker drops what it makes.
                        *state = State::Empty;
                        return None;
                    }
                    state = self
                        .cell
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// Asks `workers` to make the next exec's instance, if this sandbox has none and the
    /// backend's and `owner`'s standby budgets allow one more.
    pub fn request(&self, workers: &Workers, owner: &str, job: Job) {
        let mut state = lock(&self.cell.state);
        if !matches!(*state, State::Empty) {
            return;
        }
        let Some(hold) = workers.hold(owner) else {
            return;
        };
        let ticket = workers.ticket();
        *state = State::Queued(ticket, hold);
        drop(state);
        workers.push(Make {
            cell: Arc::downgrade(&self.cell),
            ticket,
            job,
        });
    }

    /// Gives up this sandbox's standby instance (the sandbox is being destroyed).
    pub fn clear(&self, workers: &Workers) {
        let old = std::mem::take(&mut *lock(&self.cell.state));
        if let State::Ready { ready, hold, .. } = old {
            workers.dispose(Box::new((ready, hold)));
        }
    }
}

/// What a worker needs to make one instance.
pub(crate) struct Job {
    pub engine: Engine,
    pub program: Program,
    pub setup: Arc<Setup>,
}

struct Make {
    cell: Weak<Cell>,
    ticket: u64,
    job: Job,
}

/// One standby instance's place in the backend's and its owner's budgets.
pub(crate) struct Hold {
    shared: Arc<Shared>,
    owner: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut b = lock(&self.shared.budget);
        b.total = b.total.saturating_sub(1);
        if let Some(n) = b.per_owner.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                b.per_owner.remove(&self.owner);
            }
        }
    }
}

#[derive(Default)]
struct Budget {
    total: u32,
    per_owner: HashMap<String, u32>,
}

#[derive(Default)]
struct Queue {
    makes: VecDeque<Make>,
    disposals: Vec<Box<dyn Send>>,
    /// Spent stores handed over and not yet dropped (queued or being dropped): each holds
    /// one of the engine's spare pool slots.
    pending: u32,
    /// Cells that may hold a ready instance, checked for [`IDLE`] ones.
    idle: Vec<Weak<Cell>>,
    threads: usize,
    closed: bool,
    next_ticket: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    budget: Mutex<Budget>,
    max_total: u32,
    max_per_owner: u32,
    max_threads: usize,
}

/// The backend's standby workers: started on first use, stopped when the backend is dropped.
pub(crate) struct Workers {
    shared: Arc<Shared>,
}

impl Workers {
    pub fn new(max_total: u32, max_per_owner: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Workers {
            shared: Arc::new(Shared {
                queue: Mutex::default(),
                work: Condvar::new(),
                budget: Mutex::default(),
                max_total,
                max_per_owner: max_per_owner.min(max_total),
                max_threads: (cores / 4).clamp(1, 4),
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.shared.max_total > 0
    }

    /// Standby instances held now (being made or ready).
    pub fn held(&self) -> u32 {
        lock(&self.shared.budget).total
    }

    fn hold(&self, owner: &str) -> Option<Hold> {
        let mut b = lock(&self.shared.budget);
        let mine = b.per_owner.get(owner).copied().unwrap_or(0);
        if b.total >= self.shared.max_total || mine >= self.shared.max_per_owner {
            return None;
        }
        b.total += 1;
        *b.per_owner.entry(owner.to_string()).or_insert(0) += 1;
        Some(Hold {
            shared: self.shared.clone(),
            owner: owner.to_string(),
        })
    }

    fn ticket(&self) -> u64 {
        let mut q = lock(&self.shared.queue);
        q.next_ticket += 1;
        q.next_ticket
    }

    fn push(&self, make: Make) {
        let mut q = lock(&self.shared.queue);
        q.makes.push_back(make);
        self.wake(q);
    }

    /// Hands a spent store to a worker to drop (resetting its pool slot, which the engine
    /// sizes for [`MAX_PENDING_DISPOSALS`] of them); drops it here when the workers are that
    /// far behind.
    pub fn dispose(&self, what: Box<dyn Send>) {
        let mut q = lock(&self.shared.queue);
        if q.closed || q.pending >= MAX_PENDING_DISPOSALS {
            drop(q);
            drop(what);
            return;
        }
        q.disposals.push(what);
        q.pending += 1;
        self.wake(q);
    }

    /// Wakes a worker, starting one if fewer run than there may be.
    fn wake(&self, mut q: MutexGuard<'_, Queue>) {
        if q.threads < self.shared.max_threads {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("cordon-wasm-standby".into())
                .spawn(move || work(&shared));
            if spawned.is_ok() {
                q.threads += 1;
            }
        }
        drop(q);
        self.shared.work.notify_one();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let mut q = lock(&self.shared.queue);
        q.closed = true;
        let makes = std::mem::take(&mut q.makes);
        // With no worker left to drop them, what is queued is dropped here.
        let orphans = if q.threads == 0 {
            q.pending = 0;
            (
                std::mem::take(&mut q.disposals),
                std::mem::take(&mut q.idle),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        drop(q);
        drop(makes);
        drop(orphans.0);
        for c in orphans.1 {
            expire(&c, Duration::ZERO);
        }
        self.shared.work.notify_all();
    }
}

/// A worker thread's place in the count, given back however the thread ends.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.0.queue);
        q.threads = q.threads.saturating_sub(1);
    }
}

/// Runs `f`, a drop of guest state, keeping the worker alive if it panics.
fn quietly(f: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

/// A worker: drops spent stores first (they hold pool slots), then makes standby instances,
/// and drops those unused for [`IDLE`].
fn work(shared: &Shared) {
    let _alive = Alive(shared);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    let mut last_scan = Instant::now();
    let mut q = lock(&shared.queue);
    loop {
        // Idle instances are looked for every quarter of IDLE, busy or not.
        if !q.idle.is_empty() && last_scan.elapsed() >= IDLE / 4 {
            last_scan = Instant::now();
            let idle = std::mem::take(&mut q.idle);
            drop(q);
            let mut kept = Vec::new();
            quietly(|| kept = idle.into_iter().filter(|c| !expire(c, IDLE)).collect());
            q = lock(&shared.queue);
            q.idle.extend(kept);
            continue;
        }
        if let Some(d) = q.disposals.pop() {
            drop(q);
            quietly(|| drop(d));
            q = lock(&shared.queue);
            q.pending = q.pending.saturating_sub(1);
            continue;
        }
        if let Some(m) = q.makes.pop_front() {
            drop(q);
            let made = make(&rt, m);
            q = lock(&shared.queue);
            if let Some(cell) = made
                && !q.idle.iter().any(|c| c.ptr_eq(&cell))
            {
                q.idle.push(cell);
            }
            continue;
        }
        if q.closed {
            let idle = std::mem::take(&mut q.idle);
            drop(q);
            quietly(|| {
                for c in idle {
                    expire(&c, Duration::ZERO);
                }
            });
            return;
        }
        q = if q.idle.is_empty() {
            shared.work.wait(q).unwrap_or_else(PoisonError::into_inner)
        } else {
            let left = (IDLE / 4).saturating_sub(last_scan.elapsed());
            shared
                .work
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        };
    }
}

/// Makes one standby instance; the cell to watch for idleness when one was put there.
fn make(rt: &tokio::runtime::Runtime, m: Make) -> Option<Weak<Cell>> {
    let Make { cell, ticket, job } = m;
    let c = cell.upgrade()?;
    {
        let mut state = lock(&c.state);
        match std::mem::take(&mut *state) {
            State::Queued(t, hold) if t == ticket => *state = State::Making(ticket, hold),
            other => {
                *state = other;
                return None;
            }
        }
    }
    // Making an instance takes milliseconds; the sandbox's own timeout bounds it (an hour at
    // most, whatever the limit says).
    let bound = Duration::from_millis(job.setup.limits.timeout_ms).min(Duration::from_secs(3600));
    let deadline = Instant::now() + bound;
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run::instantiate_ahead(rt, &job.engine, &job.program, &job.setup, deadline)
    }));
    let mut state = lock(&c.state);
    let kept = match std::mem::take(&mut *state) {
        State::Making(t, hold) if t == ticket => match made {
            Ok(Ok(Some(ready))) => {
                *state = State::Ready {
                    ready,
                    hold,
                    since: Instant::now(),
                };
                true
            }
            // A failed instantiation is left to the exec, which makes its own and reports
            // why; the budget is given back.
            _ => false,
        },
        // Abandoned, cleared or asked for again meanwhile: what was made is dropped.
        other => {
            *state = other;
            false
        }
    };
    drop(state);
    c.changed.notify_all();
    kept.then_some(cell)
}

/// Drops the cell's instance if it has waited `idle` or longer; true when the cell needs no
/// more watching.
fn expire(cell: &Weak<Cell>, idle: Duration) -> bool {
    let Some(c) = cell.upgrade() else {
        return true;
    };
    let mut state = lock(&c.state);
    match &*state {
        State::Ready { since, .. } if since.elapsed() >= idle => {
            let old = std::mem::take(&mut *state);
            drop(state);
            drop(old);
            true
        }
        State::Ready { .. } => false,
        _ => true,
    }
}
