//! What a killed Cordon leaves behind, and how the next one removes it.
//!
//! Each bundle directory holds an `owner` file: the pid of the Cordon process that created
//! it and that process's start time (so a reused pid does not look alive). A sandbox whose
//! owner is gone is an orphan: its runsc containers (state under the state root), its
//! cgroups and its bundle are removed by the next backend that creates a sandbox (or by
//! [`crate::GvisorBackend::reap_orphans`]). Containers and cgroups named after a sandbox
//! whose bundle no longer exists are orphans too.
//!
//! Bundles live under a data dir, but runsc's state root and the cgroup parent are the
//! host's: two Cordon processes with different data dirs (`$CORDON_HOME`) see each other's
//! containers and cgroups and never each other's bundles. So each sandbox's owner is also
//! recorded host-wide, under `<state root>/owners/<sandbox id>`, before anything of it
//! exists on the host and removed after everything else; a sweep asks that record first and
//! reaps a container or cgroup only when its owner is gone. Before, a sweep from another
//! data dir took every live sandbox of this one for an orphan and killed it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use cordon_host::cgroup::{dirs_of, parents, remove_dirs};

pub const OWNER_FILE: &str = "owner";
/// Holds the host path of the sandbox's egress socket, when it has one.
pub const EGRESS_FILE: &str = "egress-socket";

/// A bundle with no owner file yet is taken as being set up for this long.
const SETUP_GRACE: Duration = Duration::from_secs(60);

/// Start time of a process, in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after it are
    // counted from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The content of this process's owner file.
pub fn owner_record() -> String {
    let pid = std::process::id();
    format!("{pid} {}\n", start_time(pid).unwrap_or(0))
}

/// The pid and start time an owner record names, when it is whole.
fn parse_owner(record: &str) -> Option<(u32, u64)> {
    let mut it = record.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// True when the process an owner record names is still the one running.
pub fn owner_alive(record: &str) -> bool {
    parse_owner(record).is_some_and(|(pid, start)| start_time(pid) == Some(start))
}

/// Writes this process's owner file into `bundle`, whole at once (a new file renamed in):
/// a sweep reading it mid-write would find it empty.
pub fn write_owner(bundle: &Path) -> std::io::Result<()> {
    let tmp = bundle.join(format!(".{OWNER_FILE}.tmp"));
    fs::write(&tmp, owner_record())?;
    fs::rename(&tmp, bundle.join(OWNER_FILE))
}

/// True when `path` was last changed less than [`SETUP_GRACE`] ago.
fn young(path: &Path) -> bool {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age < SETUP_GRACE)
}

/// True when the sandbox whose bundle is `bundle` belongs to a live process, or is too young
/// to have a whole owner file yet. Judged afresh for every name: a snapshot taken at the
/// start of a sweep would call a sandbox created during the sweep an orphan. An owner file
/// that names no process (empty or cut short: written by a Cordon from before
/// [`write_owner`], or by one killed while writing it) counts as one being written while
/// it is young: a sweep once took a bundle whose owner file it read between its creation
/// and its write for an orphan and removed it under a create in another thread.
fn is_live(bundle: &Path) -> bool {
    let owner = bundle.join(OWNER_FILE);
    match fs::read_to_string(&owner).map(|rec| parse_owner(&rec)) {
        Ok(Some((pid, start))) => start_time(pid) == Some(start),
        Ok(None) => young(&owner),
        Err(_) => young(bundle),
    }
}

/// Bundles under `scratch` whose owner is gone.
fn dead_bundles(scratch: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(scratch) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("sb-") && !is_live(&scratch.join(name)))
        .collect()
}

/// Directory of the host-wide owner records, under runsc's state root.
const OWNERS_DIR: &str = "owners";

fn owner_path(state_root: &Path, sid: &str) -> std::path::PathBuf {
    state_root.join(OWNERS_DIR).join(sid)
}

/// Records this process as the owner of sandbox `sid`, host-wide (see the module doc).
pub fn register(state_root: &Path, sid: &str) -> std::io::Result<()> {
    let dir = state_root.join(OWNERS_DIR);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)?;
    let tmp = dir.join(format!(".{sid}.tmp"));
    fs::write(&tmp, owner_record())?;
    fs::rename(&tmp, dir.join(sid))
}

/// Removes sandbox `sid`'s host-wide owner record: the last thing its destroy does.
pub fn unregister(state_root: &Path, sid: &str) {
    let _ = fs::remove_file(owner_path(state_root, sid));
}

/// What the host-wide record says of sandbox `sid`: `Some(alive)`, or `None` when there is
/// no record (a sandbox of a Cordon from before the record, or one already gone).
fn registered_live(state_root: &Path, sid: &str) -> Option<bool> {
    fs::read_to_string(owner_path(state_root, sid))
        .ok()
        .map(|rec| owner_alive(&rec))
}

/// The sandbox id a container or cgroup name (`sb-<hex>-<n>`) belongs to.
pub fn sandbox_of(name: &str) -> Option<&str> {
    let (sid, n) = name.rsplit_once('-')?;
    (sid.starts_with("sb-") && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then_some(sid)
}

/// Container ids with files under runsc's root (`<id>_sandbox:<id>.state` and `.lock`),
/// each with whether it still has state.
fn containers_in(state_root: &Path) -> BTreeMap<String, bool> {
    let mut found = BTreeMap::new();
    for e in fs::read_dir(state_root).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some((id, _)) = n.split_once("_sandbox:") {
            let state = found.entry(id.to_string()).or_insert(false);
            *state |= n.ends_with(".state");
        }
    }
    found
}

/// Removes the lock file runsc leaves beside a deleted container's state.
pub fn remove_lock(state_root: &Path, cid: &str) {
    let _ = fs::remove_file(state_root.join(format!("{cid}_sandbox:{cid}.lock")));
}

/// Everything the sweep needs to touch.
pub struct Sweep<'a> {
    pub scratch: &'a Path,
    pub state_root: &'a Path,
    /// Whether this host has cgroups to sweep.
    pub cgroups: bool,
    /// Force-deletes one runsc container (kill, then `delete --force`).
    pub delete: &'a dyn Fn(&str),
}

impl Sweep<'_> {
    /// Removes every orphan; returns what was removed, one line each.
    pub fn run(&self) -> Vec<String> {
        let dead = dead_bundles(self.scratch);
        // The host-wide record decides; without one, this data dir's bundle does.
        let live = |sid: &str| {
            registered_live(self.state_root, sid)
                .unwrap_or_else(|| is_live(&self.scratch.join(sid)))
        };
        let orphan = |name: &str| sandbox_of(name).is_some_and(|sid| !live(sid));
        let mut removed = Vec::new();
        for (cid, has_state) in containers_in(self.state_root) {
            if orphan(&cid) {
                if has_state {
                    (self.delete)(&cid);
                }
                remove_lock(self.state_root, &cid);
                removed.push(format!("runsc container {cid}"));
            }
        }
        if self.cgroups {
            let mut names = BTreeSet::new();
            for parent in parents(crate::CGROUP_PARENT) {
                if let Ok(rd) = fs::read_dir(&parent) {
                    names.extend(
                        rd.flatten()
                            .filter(|e| e.path().is_dir())
                            .map(|e| e.file_name().to_string_lossy().into_owned()),
                    );
                }
            }
            for name in names.into_iter().filter(|n| orphan(n)) {
                if remove_dirs(
                    &dirs_of(crate::CGROUP_PARENT, &name),
                    Duration::from_secs(2),
                ) {
                    removed.push(format!("cgroup {}/{name}", crate::CGROUP_PARENT));
                }
            }
        }
        for sid in dead {
            let bundle = self.scratch.join(&sid);
            // The egress proxy died with its owner; its socket directory did not.
            if let Ok(sock) = fs::read_to_string(bundle.join(EGRESS_FILE))
                && let Some(dir) = Path::new(sock.trim()).parent()
                && dir.ends_with(&sid)
                && fs::remove_dir_all(dir).is_ok()
            {
                removed.push(format!("egress socket {}", dir.display()));
            }
            // Its /work and its volumes' binds: the removal must not reach into a volume.
            cordon_host::volume::unmount_all_under(&bundle);
            if fs::remove_dir_all(&bundle).is_ok() {
                removed.push(format!("bundle {}", bundle.display()));
            }
        }
        // Records of dead owners, once what they vouched for is gone (any data dir's).
        for e in fs::read_dir(self.state_root.join(OWNERS_DIR))
            .into_iter()
            .flatten()
            .flatten()
        {
            let sid = e.file_name().to_string_lossy().into_owned();
            if sid.starts_with("sb-") && registered_live(self.state_root, &sid) == Some(false) {
                unregister(self.state_root, &sid);
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_tell_live_from_dead() {
        assert!(owner_alive(&owner_record()));
        let me = std::process::id();
        assert!(!owner_alive(&format!("{me} 1")), "a reused pid looks alive");
        assert!(!owner_alive("4194305 12"));
        assert!(!owner_alive("garbage"));
    }

    /// A container and cgroup of a live sandbox whose bundle is under another data dir
    /// (another `$CORDON_HOME`) are not orphans; a dead owner's are. Before, any sandbox
    /// whose bundle this sweep's data dir did not hold was deleted.
    #[test]
    fn a_sweep_spares_live_sandboxes_of_other_data_dirs() {
        let state = tempfile::tempdir().unwrap();
        let ours = tempfile::tempdir().unwrap();
        let live = "sb-00000000000000000000000000000001";
        let dead = "sb-00000000000000000000000000000002";
        for sid in [live, dead] {
            for ext in ["state", "lock"] {
                fs::write(
                    state.path().join(format!("{sid}-1_sandbox:{sid}-1.{ext}")),
                    "",
                )
                .unwrap();
            }
            register(state.path(), sid).unwrap();
        }
        // The dead one's owner: this pid with a start time it never had.
        fs::write(
            owner_path(state.path(), dead),
            format!("{} 1\n", std::process::id()),
        )
        .unwrap();
        let deleted = std::cell::RefCell::new(Vec::new());
        let delete = |cid: &str| deleted.borrow_mut().push(cid.to_string());
        let removed = Sweep {
            scratch: ours.path(),
            state_root: state.path(),
            cgroups: false,
            delete: &delete,
        }
        .run();
        assert_eq!(*deleted.borrow(), vec![format!("{dead}-1")], "{removed:?}");
        assert!(owner_path(state.path(), live).exists());
        assert!(!owner_path(state.path(), dead).exists());
        unregister(state.path(), live);
        assert!(!owner_path(state.path(), live).exists());
    }

    /// A bundle whose owner file is there but not yet written (a create in another thread,
    /// between the file's creation and its write) is not an orphan while young; one written
    /// whole by a dead owner is, as is one left empty long ago.
    #[test]
    fn a_sweep_spares_a_bundle_whose_owner_file_is_being_written() {
        let scratch = tempfile::tempdir().unwrap();
        let (writing, dead, old) = (
            "sb-00000000000000000000000000000003",
            "sb-00000000000000000000000000000004",
            "sb-00000000000000000000000000000005",
        );
        for sid in [writing, dead, old] {
            fs::create_dir(scratch.path().join(sid)).unwrap();
        }
        fs::write(scratch.path().join(writing).join(OWNER_FILE), "").unwrap();
        fs::write(
            scratch.path().join(dead).join(OWNER_FILE),
            format!("{} 1\n", std::process::id()),
        )
        .unwrap();
        let stale = scratch.path().join(old).join(OWNER_FILE);
        fs::write(&stale, "").unwrap();
        let long_ago = SystemTime::now() - 2 * SETUP_GRACE;
        fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        let mut found = dead_bundles(scratch.path());
        found.sort();
        assert_eq!(found, vec![dead.to_string(), old.to_string()]);
        // What a create writes is whole and names this live process.
        let mine = scratch.path().join(writing);
        write_owner(&mine).unwrap();
        assert!(is_live(&mine));
        assert_eq!(
            fs::read_dir(&mine).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn names_map_to_their_sandbox() {
        let sid = "sb-0123456789abcdef0123456789abcdef";
        assert_eq!(sandbox_of(&format!("{sid}-1")), Some(sid));
        assert_eq!(sandbox_of(&format!("{sid}-12")), Some(sid));
        assert_eq!(sandbox_of("c6"), None);
        assert_eq!(sandbox_of(&format!("{sid}-x")), None);
        assert_eq!(sandbox_of("other-3"), None);
    }
}
