//! Host id ranges for sandboxes, one per live sandbox (like `/etc/subuid`, but leased).
//!
//! The kernel keeps per-user counts keyed by host uid (pipe buffers, inotify instances and
//! watches, message queue bytes, pending signals) and charges a user namespace's use to the
//! host id that created it. Sandboxes that all mapped the same host ids shared every such
//! count, with each other and (their namespaces being root's) with host root. Each sandbox
//! therefore gets its own range of [`RANGE`] host ids, which its namespace is created from.
//!
//! A range is leased by holding an exclusive open-file-description lock (`F_OFD_SETLK`) on
//! its ids as a byte range of one lease file in a root-owned 0700 directory: free again when
//! the holder lets go (after the sandbox's last process is gone) or dies (the kernel drops
//! the locks of a killed process), so a crash needs no sweep. Every lease of one process in
//! one directory shares that file's one descriptor, and a table of this process's leases
//! keeps its own sandboxes apart (locks on one open file never conflict with each other):
//! a live sandbox holds no descriptor of its own for its ids (issue 49; ADR 0038). Ranges
//! overlapping an id of `/etc/passwd`, `/etc/group`, `/etc/subuid` or `/etc/subgid` are
//! never leased.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// The file of a pool directory whose byte ranges are the leases (a range's bytes are its
/// ids, so pools over overlapping ids in one directory exclude each other).
pub const LEASE_FILE: &str = "leases";

/// Ids in one sandbox's range.
pub const RANGE: u32 = 65536;
/// The first host id of the system pool.
pub const FIRST: u32 = 0x4000_0000;
/// Ranges in the system pool: from [`FIRST`] up to 0x7f00_0000, below the microvm tier's
/// QEMU id (0x7ffd_0000) and the single range sandboxes shared before (0x7ffe_0000).
pub const SLOTS: u32 = 16128;

/// Errors of the pool; messages name what to do.
#[derive(Debug, thiserror::Error)]
pub enum IdPoolError {
    #[error("{0}")]
    Dir(String),
    #[error(
        "no free host id range: all {0} are leased to live sandboxes; destroy some sandboxes and try again"
    )]
    Exhausted(u32),
    #[error(
        "leasing a host id range in {dir}: {err}; check that the directory is writable by root"
    )]
    Lock { dir: String, err: nix::errno::Errno },
    /// [`IdPool::lease_exact`]: the range is another sandbox's, or not one of the pool's.
    #[error("{0}")]
    Taken(String),
}

impl IdPoolError {
    /// The error a tenant may see: the host paths go to the operator's log only.
    pub fn into_core(self) -> cordon_core::Error {
        match self {
            IdPoolError::Exhausted(_) | IdPoolError::Taken(_) => {
                cordon_core::Error::failed("leasing the sandbox's host ids", self)
            }
            other => {
                tracing::error!("host id pool: {other}");
                cordon_core::Error::Sandbox(
                    "no host id range could be leased for the sandbox; the operator's log says why"
                        .into(),
                )
            }
        }
    }
}

/// Where leases are kept and which ranges they cover: slot `i` is the ids
/// `first + i * width .. first + (i + 1) * width`.
#[derive(Debug, Clone)]
pub struct IdPool {
    pub dir: PathBuf,
    pub first: u32,
    pub slots: u32,
    /// Ids in one slot: [`RANGE`] for a sandbox's user namespace, 1 for a single uid (the
    /// microvm tier's QEMUs).
    pub width: u32,
    /// Where this pool's next search starts (shared by its clones): each lease starts one
    /// slot further, from a per-process offset.
    next: Arc<AtomicU32>,
}

/// A leased range: `base..base + width` belongs to one sandbox while this is held (or to
/// the sandboxes sharing it: [`IdRange::share`]).
#[derive(Debug)]
pub struct IdRange {
    base: u32,
    lease: Arc<Lease>,
}

impl IdRange {
    /// The first host id of the range (the sandbox's root).
    pub fn base(&self) -> u32 {
        self.base
    }

    /// The same lease for another sandbox that must run as these ids (a fork restored from
    /// a checkpoint of this one, whose processes' ids are in its memory): the range is free
    /// again only once every holder has dropped it.
    pub fn share(&self) -> IdRange {
        IdRange {
            base: self.base,
            lease: self.lease.clone(),
        }
    }

    /// A descriptor of the open lease file this range's lock belongs to (`F_OFD_SETLK`
    /// locks are the open file's, not the process's). A process that holds it keeps the
    /// range locked once this one has let go by exiting, until it closes it: a sandbox's
    /// init that outlives a one-shot `cordon run` to finish the sandbox's teardown (ADR
    /// 0044). Every lease of this process in the pool is on that file: hand it only to a
    /// process that ends with this range's sandbox.
    pub fn lock_holder(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.lease.file.as_fd().try_clone_to_owned()
    }

    /// Lets this process end without unlocking the range: it stays leased (this process
    /// never takes it again) until every descriptor of its lease file is closed, this
    /// process's at its exit and any [`lock_holder`](Self::lock_holder)'s when that one is
    /// done. For a process about to exit; a range let go this way is never free again
    /// while this process lives.
    pub fn keep_past_exit(self) {
        // Neither the lease's unlock nor its table entry's removal may run (the entry keeps
        // this process from leasing the range again).
        std::mem::forget(self);
    }
}

/// One range's lock on its pool's lease file; unlocked when the last holder drops it.
#[derive(Debug)]
struct Lease {
    file: Arc<File>,
    key: LeaseKey,
    width: u32,
}

/// A lease's place: its pool's lease file and its first id.
type LeaseKey = (PathBuf, u32);

/// What this process holds: each pool's open lease file (open while a lease in it lives),
/// and every lease it took, kept until that lease is unlocked (a dead entry is still taken:
/// see [`Lease`]'s drop).
#[derive(Default)]
struct Held {
    files: HashMap<PathBuf, Weak<File>>,
    leases: HashMap<LeaseKey, Weak<Lease>>,
}

fn held() -> MutexGuard<'static, Held> {
    static HELD: OnceLock<Mutex<Held>> = OnceLock::new();
    HELD.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Unlocked and forgotten under the table's lock: until then the range is this
        // process's (its entry, dead, is still taken), so no lease of it taken meanwhile on
        // the same open file (where locks do not conflict) can lose its lock to this unlock.
        let mut held = held();
        let _ = lock_range(&self.file, self.key.1, self.width, false);
        held.leases.remove(&self.key);
    }
}

/// Locks (or unlocks) ids `base..base + width` as a byte range of `file`, for its open file
/// description: `Ok(false)` while another one holds any of it.
fn lock_range(file: &File, base: u32, width: u32, lock: bool) -> nix::Result<bool> {
    let kind = if lock { libc::F_WRLCK } else { libc::F_UNLCK };
    let flock = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(base),
        l_len: libc::off_t::from(width),
        // Zero, as F_OFD_SETLK requires.
        l_pid: 0,
    };
    match nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&flock)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e),
    }
}

impl IdPool {
    /// A pool of `slots` slots of `width` ids from `first`, leased in `dir`.
    pub fn new(dir: PathBuf, first: u32, slots: u32, width: u32) -> Self {
        IdPool {
            dir,
            first,
            slots: slots.max(1),
            width: width.max(1),
            next: Arc::new(AtomicU32::new(seed())),
        }
    }

    /// The system pool: leases under `/run/cordon/ids`.
    pub fn system() -> Self {
        IdPool::new(run_dir("ids"), FIRST, SLOTS, RANGE)
    }

    /// Single host uids `first..first + count`, leased under `/run/cordon/<name>`: one per
    /// process (a microVM's QEMU), unique across every Cordon process on the host.
    pub fn single_ids(name: &str, first: u32, count: u32) -> Self {
        IdPool::new(run_dir(name), first, count, 1)
    }

    /// Leases a free range, starting the search at a different slot each time so that a
    /// range freed a moment ago is the last to be taken again.
    pub fn allocate(&self) -> Result<IdRange, IdPoolError> {
        self.allocate_avoiding(reserved_ids())
    }

    fn allocate_avoiding(&self, reserved: &[(u32, u32)]) -> Result<IdRange, IdPoolError> {
        private_dir(&self.dir).map_err(IdPoolError::Dir)?;
        // Held across each lock, so two sandboxes of this process never take one range.
        let mut held = held();
        let file = self.lease_file(&mut held)?;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.slots {
            let slot = start.wrapping_add(i) % self.slots;
            let base = self.first + slot * self.width;
            if reserved
                .iter()
                .any(|&(lo, hi)| lo < base.saturating_add(self.width) && base < hi)
            {
                continue;
            }
            let key = (self.lease_path(), base);
            if held.leases.contains_key(&key) {
                continue;
            }
            if let Some(range) = self.try_lock(&mut held, &file, key)? {
                return Ok(range);
            }
        }
        Err(IdPoolError::Exhausted(self.slots))
    }

    fn lease_path(&self) -> PathBuf {
        self.dir.join(LEASE_FILE)
    }

    /// This process's open lease file of the pool (opened if no lease of it is live).
    fn lease_file(&self, held: &mut Held) -> Result<Arc<File>, IdPoolError> {
        let path = self.lease_path();
        if let Some(file) = held.files.get(&path).and_then(Weak::upgrade) {
            return Ok(file);
        }
        let fd = nix::fcntl::open(
            &path,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|err| self.lock_err(err))?;
        let file = Arc::new(File::from(fd));
        held.files.retain(|_, f| f.strong_count() > 0);
        held.files.insert(path, Arc::downgrade(&file));
        Ok(file)
    }

    fn lock_err(&self, err: nix::errno::Errno) -> IdPoolError {
        IdPoolError::Lock {
            dir: self.dir.display().to_string(),
            err,
        }
    }

    /// The range at `key`, locked for this process, or None while another process holds
    /// any of it.
    fn try_lock(
        &self,
        held: &mut Held,
        file: &Arc<File>,
        key: LeaseKey,
    ) -> Result<Option<IdRange>, IdPoolError> {
        let base = key.1;
        if !lock_range(file, base, self.width, true).map_err(|e| self.lock_err(e))? {
            return Ok(None);
        }
        let lease = Arc::new(Lease {
            file: file.clone(),
            key: key.clone(),
            width: self.width,
        });
        held.leases.insert(key, Arc::downgrade(&lease));
        Ok(Some(IdRange { base, lease }))
    }

    /// Leases exactly the range starting at `base` (a sandbox restored from a checkpoint
    /// runs as the ids its source ran as): shared with the live sandbox of this process
    /// that holds it (the source, or another sandbox restored from it), else taken when
    /// free. A range another process holds, or that is not one of the pool's, is refused.
    pub fn lease_exact(&self, base: u32) -> Result<IdRange, IdPoolError> {
        let slot = base
            .checked_sub(self.first)
            .map(|o| (o / self.width, o % self.width));
        if !matches!(slot, Some((s, 0)) if s < self.slots) {
            return Err(IdPoolError::Taken(
                "the snapshot's host ids are not one of this host's sandbox ranges; take the \
                 snapshot again on this host"
                    .into(),
            ));
        }
        private_dir(&self.dir).map_err(IdPoolError::Dir)?;
        // Held across the lock, so two restores of one image never both try the range.
        let mut held = held();
        let key = (self.lease_path(), base);
        let taken = || {
            IdPoolError::Taken(
                "the host ids the snapshot's processes run as are leased to another sandbox \
                 now; try again once it has ended, or take a filesystem snapshot"
                    .into(),
            )
        };
        match held.leases.get(&key).map(Weak::upgrade) {
            Some(Some(lease)) => return Ok(IdRange { base, lease }),
            // Its last holder is letting it go this moment.
            Some(None) => return Err(taken()),
            None => {}
        }
        let file = self.lease_file(&mut held)?;
        self.try_lock(&mut held, &file, key)?.ok_or_else(taken)
    }
}

/// `/run/cordon/<name>` (or under the temporary directory on a host without `/run`): where
/// host-wide leases and locks live (gone at reboot, as the processes holding them are).
pub fn run_dir(name: &str) -> PathBuf {
    let run = Path::new("/run");
    if run.is_dir() {
        run.join("cordon").join(name)
    } else {
        std::env::temp_dir().join(format!("cordon-{name}"))
    }
}

/// A per-process starting point for the slot search.
fn seed() -> u32 {
    static SEED: OnceLock<u32> = OnceLock::new();
    *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        nanos ^ std::process::id().wrapping_mul(0x9e37_79b9)
    })
}

/// Host id intervals `[lo, hi)` that belong to someone: users and groups, subordinate ids.
fn reserved_ids() -> &'static [(u32, u32)] {
    static IDS: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    IDS.get_or_init(|| {
        let mut v = Vec::new();
        for f in ["/etc/passwd", "/etc/group"] {
            for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
                if let Some(id) = line.split(':').nth(2).and_then(|s| s.parse::<u32>().ok()) {
                    v.push((id, id.saturating_add(1)));
                }
            }
        }
        for f in ["/etc/subuid", "/etc/subgid"] {
            for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
                let mut it = line.split(':').skip(1).map(|s| s.trim().parse::<u32>());
                if let (Some(Ok(start)), Some(Ok(count))) = (it.next(), it.next()) {
                    v.push((start, start.saturating_add(count)));
                }
            }
        }
        v
    })
}

/// Makes `dir` a directory only this process's user can enter: created 0700 if missing
/// (its parents as needed), and refused if it is a symlink, not a directory, or owned by
/// another user. An existing one of ours with a looser mode is tightened.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            format!(
                "creating {}: {e}; check the parent directory",
                parent.display()
            )
        })?;
    }
    match nix::unistd::mkdir(dir, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => {
            return Err(format!(
                "creating {}: {e}; check the parent directory",
                dir.display()
            ));
        }
    }
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE => format!(
            "opening {}: too many open files ({e}); the process is at its descriptor limit: \
             destroy sandboxes, or raise the limit (`ulimit -n`)",
            dir.display()
        ),
        _ => format!(
            "{} is not a plain directory ({e}); remove it (a symlink or file there is refused) and retry",
            dir.display()
        ),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("{}: {e}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me {
        return Err(format!(
            "{} belongs to uid {}, not to uid {me} running Cordon; another user may have made it first: remove it and retry",
            dir.display(),
            st.st_uid
        ));
    }
    if st.st_mode & 0o077 != 0 {
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700))
            .map_err(|e| format!("securing {}: {e}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn pool(slots: u32) -> (tempfile::TempDir, IdPool) {
        let dir = tempfile::tempdir().unwrap();
        let pool = IdPool::new(dir.path().join("ids"), FIRST, slots, RANGE);
        (dir, pool)
    }

    #[test]
    fn an_exhausted_pool_is_the_source_of_the_tenants_error() {
        let e = IdPoolError::Exhausted(2).into_core();
        let source = std::error::Error::source(&e).expect("the pool's error is kept");
        assert!(matches!(
            source.downcast_ref::<IdPoolError>(),
            Some(IdPoolError::Exhausted(2))
        ));
        assert!(e.to_string().contains("destroy some sandboxes"), "{e}");
        // The error naming a host directory is the operator's: none reaches the tenant.
        let e = IdPoolError::Lock {
            dir: "/run/cordon/ids".into(),
            err: nix::errno::Errno::EACCES,
        }
        .into_core();
        assert!(!e.to_string().contains("/run/cordon"), "{e}");
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn leases_are_disjoint_and_come_back_when_dropped() {
        let (_d, pool) = pool(2);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_ne!(a.base(), b.base());
        assert_eq!(a.base().abs_diff(b.base()), RANGE);
        assert!(matches!(pool.allocate(), Err(IdPoolError::Exhausted(2))));
        let freed = a.base();
        drop(a);
        assert_eq!(pool.allocate().unwrap().base(), freed);
        let mode = std::fs::metadata(&pool.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn an_exact_lease_shares_a_live_one_and_is_free_after_the_last_holder() {
        let (_d, pool) = pool(2);
        let a = pool.allocate().unwrap();
        let base = a.base();
        // The live lease is shared, not refused.
        let fork = pool.lease_exact(base).unwrap();
        let shared = a.share();
        assert_eq!((fork.base(), shared.base()), (base, base));
        drop(a);
        drop(shared);
        // One holder left: the range is still leased.
        let other = pool.allocate().unwrap();
        assert_ne!(other.base(), base);
        assert!(matches!(pool.allocate(), Err(IdPoolError::Exhausted(2))));
        drop(fork);
        assert_eq!(pool.allocate().unwrap().base(), base);
        // Free and exact: taken.
        assert_eq!(pool.lease_exact(base).unwrap().base(), base);
        // Not a range of the pool.
        for bad in [base + 1, FIRST - RANGE, FIRST + 2 * RANGE] {
            assert!(
                matches!(pool.lease_exact(bad), Err(IdPoolError::Taken(_))),
                "{bad}"
            );
        }
    }

    /// Another process leasing `pool`'s first slot (a POSIX lock, which conflicts with an
    /// open file description's as two processes' locks do), once it says it holds it. Its
    /// command ends at end of its input.
    fn other_holder(pool: &IdPool) -> std::process::Child {
        use std::io::BufRead;
        let mut holder = std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl, sys\n\
                 f = open(sys.argv[1], 'a')\n\
                 fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, int(sys.argv[3]), int(sys.argv[2]))\n\
                 print('held', flush=True)\n\
                 sys.stdin.read()",
            ])
            .arg(pool.dir.join(LEASE_FILE))
            .args([FIRST.to_string(), RANGE.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held");
        holder
    }

    /// This process's descriptors open on `path`.
    fn open_on(path: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
            .count()
    }

    /// Issue 49: a live sandbox held a descriptor of its own for its ids (a slot file
    /// locked with flock); every lease of a pool now shares its lease file's one.
    #[test]
    fn many_leases_hold_one_descriptor_and_none_once_dropped() {
        let (_d, pool) = pool(64);
        let leases: Vec<IdRange> = (0..50).map(|_| pool.allocate().unwrap()).collect();
        let bases: std::collections::BTreeSet<u32> = leases.iter().map(IdRange::base).collect();
        assert_eq!(bases.len(), 50, "every lease has its own range");
        let path = pool.dir.join(LEASE_FILE);
        assert_eq!(open_on(&path), 1);
        drop(leases);
        assert_eq!(open_on(&path), 0);
        // And they are free again, all of them.
        let again: Vec<IdRange> = (0..64).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(again.len(), 64);
    }

    #[test]
    fn a_range_another_process_holds_is_refused_exactly() {
        let (_d, pool) = pool(1);
        private_dir(&pool.dir).unwrap();
        std::fs::write(pool.dir.join(LEASE_FILE), b"").unwrap();
        let mut holder = other_holder(&pool);
        let e = pool.lease_exact(FIRST).unwrap_err();
        assert!(matches!(e, IdPoolError::Taken(_)), "{e}");
        holder.kill().unwrap();
        holder.wait().unwrap();
    }

    /// ADR 0044: a process that ends with its sandbox hands its lease's descriptor to the
    /// sandbox's init and exits without unlocking; the range stays leased until the init
    /// closes it. The process that exits is this test binary run again as a child (it
    /// leases from the pool directory it is given, starts a `sleep` holding the descriptor
    /// as its stdin, keeps the lease past its exit and exits).
    #[test]
    fn a_lock_holder_keeps_the_range_leased_after_its_process_exits() {
        const CHILD: &str = "CORDON_IDPOOL_HANDOFF_DIR";
        if let Some(dir) = std::env::var_os(CHILD) {
            let pool = IdPool::new(PathBuf::from(dir), FIRST, 1, RANGE);
            let range = pool.allocate().unwrap();
            let holder = std::process::Command::new("sleep")
                .arg("60")
                .stdin(std::process::Stdio::from(range.lock_holder().unwrap()))
                // Not this child's output: the test reads it to its end.
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            println!("holder {}", holder.id());
            range.keep_past_exit();
            std::process::exit(0);
        }
        let (_d, pool) = pool(1);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "idpool::tests::a_lock_holder_keeps_the_range_leased_after_its_process_exits",
                "--nocapture",
            ])
            .env(CHILD, &pool.dir)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        let holder: i32 = said
            .lines()
            .find_map(|l| l.strip_prefix("holder "))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the child said: {said}"));
        let holder = nix::unistd::Pid::from_raw(holder);
        // The child has exited: only the holder keeps the range.
        let taken = pool.allocate();
        let _ = nix::sys::signal::kill(holder, nix::sys::signal::Signal::SIGKILL);
        // Reaped by the host's init (its parent exited): wait until it is gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while nix::sys::signal::kill(holder, None).is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            matches!(taken, Err(IdPoolError::Exhausted(1))),
            "the range was free while the holder lived: {taken:?}"
        );
        assert_eq!(
            pool.allocate().unwrap().base(),
            FIRST,
            "the range is free once the holder is gone"
        );
    }

    #[test]
    fn a_killed_holder_frees_its_range() {
        let (_d, pool) = pool(1);
        drop(pool.allocate().unwrap());
        // Another process leases slot 0 and is then killed, as a crashed Cordon would be.
        let mut holder = other_holder(&pool);
        assert!(matches!(pool.allocate(), Err(IdPoolError::Exhausted(1))));
        holder.kill().unwrap();
        holder.wait().unwrap();
        // Its command ends at end of input.
        drop(holder.stdin.take());
        assert_eq!(pool.allocate().unwrap().base(), FIRST);
    }

    #[test]
    fn a_directory_of_another_owner_or_a_symlink_is_refused() {
        if !crate::testing::root_or_skip("handing a directory to another owner") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = private_dir(&theirs).unwrap_err();
        assert!(e.contains("belongs to uid 65534"), "{e}");
        let link = dir.path().join("link");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(private_dir(&link).is_err());
        let loose = dir.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&loose).unwrap();
        let mode = std::fs::metadata(&loose).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn ranges_holding_a_known_id_are_never_leased() {
        let (_d, pool) = pool(3);
        // Slot 0 holds a user's id, slot 2 overlaps a subordinate range.
        let reserved = [
            (FIRST + 1000, FIRST + 1001),
            (FIRST + 3 * RANGE - 5, u32::MAX),
        ];
        let a = pool.allocate_avoiding(&reserved).unwrap();
        assert_eq!(a.base(), FIRST + RANGE);
        assert!(matches!(
            pool.allocate_avoiding(&reserved),
            Err(IdPoolError::Exhausted(3))
        ));
    }
}
