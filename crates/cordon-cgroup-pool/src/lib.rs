//! Memory cgroups kept for the next sandbox (cgroup v1): a sandbox's memory cgroup that ends
//! clean is renamed to a free slot under `cordon/` instead of removed, and the next sandbox
//! renames it to its own name instead of making one.
//!
//! Making a v1 memory cgroup is the costliest step of a cgroup's set-up (per-CPU statistics,
//! a shrinker map as long as the most superblocks the host has had, ADR 0026), and removing
//! one leaves the kernel work to do after the caller has gone on (offlining, freeing after a
//! grace period) that the next mkdir waits behind: here a mkdir right after an rmdir takes
//! 0.5 to 6.5 ms, a rename 0.04 to 0.4 ms (ADR 0042). The other controllers' directories
//! cost little to make and are made fresh.
//!
//! A cgroup is taken back only as the kernel would make a new one, as far as Cordon reads it:
//! no process in it, never an OOM kill (that count cannot be reset), at most 1 MiB still
//! charged to it (kernel memory on its way out, not a sandbox's files in the page cache),
//! its peak and its limit's hit count set back. Whoever takes it lifts the limits it had and writes its
//! own, as for a new one.
//! Anything else, or a full pool, and it is removed as before. Slots are claimed and filled
//! by rename, which the kernel does atomically: two processes never get one cgroup.
//!
//! Only v1 (v2's cgroupfs cannot rename) and only `cordon/` (the sandboxes Cordon alone
//! configures; never a pod's parent an OCI engine set up).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

pub mod files;

use files::{keyed, number, read_pids};

/// How many cgroups the pool holds at most: enough for the sandboxes that end while others
/// start, few enough that what it holds (each as large as any memory cgroup) is small.
pub const SLOTS: usize = 8;

/// The name of slot `i` under the parent. It starts with a dot: no sandbox id does, and
/// sweeps that look for sandboxes by their names' prefix never see it.
fn slot(i: usize) -> String {
    format!(".pool-{i}")
}

/// The most a kept cgroup may still be charged: what a sandbox leaves is kernel memory the
/// kernel frees a little later (its network namespace's, about 250 kB after `sh -c true`),
/// which `memory.force_empty` cannot take back and spent 1.4 ms trying to, on the path of
/// a run's end. A sandbox that left more (page cache it read) has its cgroup removed, as
/// before, rather than hand that charge to the next.
const LEFT_AT_MOST: u64 = 1 << 20;

/// Every slot's path under `parent`, from one that depends on the process: processes that
/// claim or keep at the same moment start on different slots.
fn slots(parent: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    let start = std::process::id() as usize;
    (0..SLOTS).map(move |k| parent.join(slot((start + k) % SLOTS)))
}

/// Takes a kept memory cgroup under `parent` as `parent/<name>`; false when none is kept
/// (or `name` is taken), and the caller makes one.
pub fn claim(parent: &Path, name: &str) -> bool {
    let to = parent.join(name);
    let taken = slots(parent).any(|from| {
        fs::rename(from, &to).is_ok()
            && (unlimited(&to) || {
                let _ = fs::remove_dir(&to);
                false
            })
    });
    if taken {
        refill_soon();
    }
    taken
}

/// Lifts a taken cgroup's limits, as a new one has none: its taker writes its own, and v1
/// refuses a memory limit above the memory+swap one, so the last sandbox's pair would
/// refuse a larger limit. The memory+swap limit goes first (it is never below the other).
fn unlimited(dir: &Path) -> bool {
    ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
        .iter()
        .all(|file| {
            let at = dir.join(file);
            fs::write(&at, "-1").is_ok() || !at.exists()
        })
}

/// Keeps the memory cgroup `dir` (under its parent) for the next sandbox, if it ended clean
/// and a slot is free; false when the caller should remove it instead.
pub fn keep(dir: &Path) -> bool {
    let Some(parent) = dir.parent() else {
        return false;
    };
    if !read_pids(&dir.join("cgroup.procs")).is_empty()
        || keyed(&dir.join("memory.oom_control"), "oom_kill") != 0
    {
        return false;
    }
    if number(&dir.join("memory.usage_in_bytes")) > LEFT_AT_MOST {
        return false;
    }
    // The counters Cordon reports, from zero as in a new cgroup (the peak resets to what is
    // still charged). Swap accounting's own pair exists only where it is on.
    for file in [
        "memory.max_usage_in_bytes",
        "memory.failcnt",
        "memory.memsw.max_usage_in_bytes",
        "memory.memsw.failcnt",
    ] {
        let at = dir.join(file);
        if fs::write(&at, "0").is_err() && at.exists() {
            return false;
        }
    }
    slots(parent).any(|to| fs::rename(dir, to).is_ok())
}

/// Whether `name` is one of the pool's slots (sweeps of orphans leave them to the pool).
pub fn is_slot(name: &str) -> bool {
    name.strip_prefix(".pool-")
        .and_then(|i| i.parse::<usize>().ok())
        .is_some_and(|i| i < SLOTS)
}

/// A slot was taken: wakes the stocker, if this process runs one.
static TAKEN: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn refill_soon() {
    let (flag, wake) = &TAKEN;
    *flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
    wake.notify_one();
}

/// Keeps every slot under `parent` filled, from a thread of its own for the rest of the
/// process (a server's): new memory cgroups are made there once creates pause for
/// [`SETTLE`] after taking some, so a create after a pause finds one ready however many
/// sandboxes were only made, never ended. Slots other processes take are filled within a
/// second or so. Started once per process; later calls do nothing. It stops when the
/// parent is gone (removed by the operator, or by a test).
pub fn keep_stocked(parent: PathBuf) {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.set(()).is_err() || fs::create_dir_all(&parent).is_err() {
        return;
    }
    let stocker = move || {
        while parent.is_dir() {
            fill(&parent);
            // Woken by a claim (or after a second, for other processes' claims), it waits
            // until creates pause: a memory cgroup's mkdir holds the kernel's cgroup lock
            // for its whole length, so one made beside a create would hold up that create's
            // own cgroup writes (measured: the scale bench's create at 1,000 live went from
            // 13.4-14.0 to 15.4-17.9 ms p50 with an eager stocker).
            if taken_within(Duration::from_secs(1)) {
                while taken_within(SETTLE) {}
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("cgroup-pool".into())
        .spawn(stocker)
    {
        tracing::warn!(
            "the memory cgroup pool is not kept stocked (no thread: {e}); creates make their own"
        );
    }
}

/// How long no slot must have been taken before the stocker makes new ones.
const SETTLE: Duration = Duration::from_millis(100);

/// Whether a slot is taken within `wait` (or was since the last look); clears the mark.
fn taken_within(wait: Duration) -> bool {
    let (flag, wake) = &TAKEN;
    let taken = flag.lock().unwrap_or_else(|p| p.into_inner());
    let (mut taken, _) = wake
        .wait_timeout_while(taken, wait, |t| !*t)
        .unwrap_or_else(|p| p.into_inner());
    std::mem::replace(&mut *taken, false)
}

/// Makes the memory cgroups missing from the slots under `parent`; how many it made.
pub fn fill(parent: &Path) -> usize {
    slots(parent)
        .filter(|at| !at.exists() && fs::create_dir(at).is_ok())
        .count()
}

/// Removes a sandbox's cgroup directories once its processes are gone, keeping `keepable`
/// (its memory cgroup, under a parent the pool serves) for the next sandbox if it ended
/// clean. Usually every process is gone already (the caller waited for them): the
/// directories then just go, without reading each one's process list first. Returns those
/// still there (a process in them, or the kernel not done with one that just exited): the
/// host's manager kills and waits for what is in them, the sandbox init only waits.
pub fn remove_ended(dirs: &[PathBuf], keepable: Option<&Path>) -> Vec<PathBuf> {
    dirs.iter()
        .filter(|d| {
            let kept = keepable == Some(d.as_path()) && keep(d);
            !kept && fs::remove_dir(d).is_err() && d.exists()
        })
        .cloned()
        .collect()
}
