//! Directory watchers over a [`Workspace`] (inotify), for the agent inside a sandbox and
//! for tiers whose workspace is the host's own directory (gvisor).
//!
//! One inotify instance serves every watcher of a sandbox (instances are few per user on a
//! host). Each directory is opened beneath the workspace by the same walk as every file
//! call (never through a symlink, never onto another filesystem) and watched through its
//! descriptor (`/proc/self/fd/N`), so no path is resolved again. Everything is bounded by
//! the limits in [`cordon_core`]: watchers, watched directories, and each watcher's queue
//! of events (by count and by bytes of names); what does not fit is counted as dropped,
//! and the count reported with the next read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use cordon_core::{
    FileKind, MAX_QUEUED_BYTES, MAX_QUEUED_EVENTS, MAX_WATCHED_DIRS, MAX_WATCHERS, WatchEvent,
    WatchKind, WatchOp, WatchReply,
};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use nix::sys::stat::fstatat;

use crate::files::{FileError, Workspace, check_dir, dir_errno, kind_of, read_names};
use crate::proto::ErrorCode;

/// Most reads of the inotify descriptor one [`Watches::pump`] makes (each up to 4 KiB of
/// events): the agent's other work is not held up by a flood, the kernel queues the rest.
const PUMP_READS: usize = 64;

/// How many of a watcher's latest queued events a new one is compared with.
const DEDUP_WINDOW: usize = 8;

/// Most entries of one new directory reported as created when a recursive watcher takes
/// it on (what appeared in it before its watch did).
const SCAN_ENTRIES: usize = 1024;

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_ONLYDIR
}

/// One watcher: its root (relative to the workspace), its queue.
struct Watcher {
    root: String,
    recursive: bool,
    root_wd: WatchDescriptor,
    queue: VecDeque<WatchEvent>,
    bytes: usize,
    dropped: u64,
    ended: bool,
    /// Directories it watches.
    dirs: usize,
}

impl Watcher {
    fn push(&mut self, name: String, kind: WatchKind) {
        // The same event of the same entry among the last few says nothing new (a file
        // written through the file API is created, handed over, truncated, given its
        // mode and written: envd reports create, chmod, write).
        if self
            .queue
            .iter()
            .rev()
            .take(DEDUP_WINDOW)
            .any(|e| e.kind == kind && e.name == name)
        {
            return;
        }
        if self.queue.len() >= MAX_QUEUED_EVENTS || self.bytes + name.len() > MAX_QUEUED_BYTES {
            self.dropped += 1;
            return;
        }
        self.bytes += name.len();
        self.queue.push_back(WatchEvent { name, kind });
    }
}

/// A sandbox's watchers.
#[derive(Default)]
pub struct Watches {
    ino: Option<Inotify>,
    next_id: u64,
    watchers: BTreeMap<u64, Watcher>,
    /// Who watches each directory: watcher ids and the directory's path relative to that
    /// watcher's root (empty for the root itself).
    dirs: HashMap<WatchDescriptor, Vec<(u64, String)>>,
    /// (watcher, directory) pairs, bounded by [`MAX_WATCHED_DIRS`].
    watched: usize,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn kinds(mask: AddWatchFlags) -> impl Iterator<Item = WatchKind> {
    [
        (
            AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            WatchKind::Create,
        ),
        (AddWatchFlags::IN_MODIFY, WatchKind::Write),
        (AddWatchFlags::IN_DELETE, WatchKind::Remove),
        (AddWatchFlags::IN_MOVED_FROM, WatchKind::Rename),
        (AddWatchFlags::IN_ATTRIB, WatchKind::Chmod),
    ]
    .into_iter()
    .filter(move |(m, _)| mask.intersects(*m))
    .map(|(_, k)| k)
}

fn busy(what: String) -> FileError {
    (ErrorCode::Busy, what)
}

impl Watches {
    pub fn new() -> Self {
        Self::default()
    }

    /// The inotify descriptor, to poll while any watcher exists.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        if self.watchers.is_empty() {
            return None;
        }
        self.ino.as_ref().map(|i| i.as_fd())
    }

    /// Runs one operation.
    pub fn handle(&mut self, ws: &Workspace, op: &WatchOp) -> Result<WatchReply, FileError> {
        match op {
            WatchOp::Start { path, recursive } => self.start(ws, path, *recursive),
            WatchOp::Read { id } => {
                self.pump(ws);
                let w = self.watchers.get_mut(id).ok_or_else(|| no_watcher(*id))?;
                w.bytes = 0;
                Ok(WatchReply::Events {
                    events: std::mem::take(&mut w.queue).into(),
                    dropped: std::mem::take(&mut w.dropped),
                    ended: w.ended,
                })
            }
            WatchOp::Stop { id } => {
                self.stop(*id)?;
                Ok(WatchReply::Stopped)
            }
        }
    }

    fn start(
        &mut self,
        ws: &Workspace,
        path: &str,
        recursive: bool,
    ) -> Result<WatchReply, FileError> {
        let root = check_dir(path)?;
        if self.watchers.len() >= MAX_WATCHERS {
            return Err(busy(format!(
                "this sandbox has {MAX_WATCHERS} watchers already; stop one first"
            )));
        }
        if self.watched >= MAX_WATCHED_DIRS {
            return Err(busy(format!(
                "this sandbox's watchers watch {MAX_WATCHED_DIRS} directories already; stop one first"
            )));
        }
        let fd = ws.open_dir(&root).map_err(|e| dir_errno(path, e))?;
        if self.ino.is_none() {
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .map_err(|e| (ErrorCode::Io, format!("no inotify instance: {e}")))?;
            self.ino = Some(ino);
        }
        let root_wd = self
            .add_fd(&fd)
            .map_err(|e| (ErrorCode::Io, format!("watching {path}: {e}")))?;
        self.next_id += 1;
        let id = self.next_id;
        self.watchers.insert(
            id,
            Watcher {
                root,
                recursive,
                root_wd,
                queue: VecDeque::new(),
                bytes: 0,
                dropped: 0,
                ended: false,
                dirs: 0,
            },
        );
        self.note(root_wd, id, String::new());
        if recursive {
            self.take_tree(ws, id, &fd, String::new(), false);
        }
        Ok(WatchReply::Started { id })
    }

    fn add_fd(&self, fd: &OwnedFd) -> Result<WatchDescriptor, Errno> {
        let ino = self.ino.as_ref().ok_or(Errno::EBADF)?;
        ino.add_watch(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(), mask())
    }

    fn note(&mut self, wd: WatchDescriptor, id: u64, rel: String) {
        let users = self.dirs.entry(wd).or_default();
        if users.iter().any(|(w, _)| *w == id) {
            return;
        }
        users.push((id, rel));
        self.watched += 1;
        if let Some(w) = self.watchers.get_mut(&id) {
            w.dirs += 1;
        }
    }

    /// Watches the directories beneath `top` (`rel` relative to watcher `id`'s root; `top`
    /// itself too unless it is the root) for a recursive watcher, depth first, within the
    /// bound; with `report`, their entries are reported as created (they appeared before
    /// the watch did).
    fn take_tree(&mut self, ws: &Workspace, id: u64, top: &OwnedFd, rel: String, report: bool) {
        let Some(root) = self.watchers.get(&id).map(|w| w.root.clone()) else {
            return;
        };
        if !rel.is_empty() {
            self.watch_dir(id, top, rel.clone());
        }
        let mut stack = Vec::new();
        self.scan(id, top, &rel, report, &mut stack);
        while let Some(sub) = stack.pop() {
            if self.watched >= MAX_WATCHED_DIRS {
                if let Some(w) = self.watchers.get_mut(&id) {
                    w.dropped += stack.len() as u64 + 1;
                }
                return;
            }
            let Ok(fd) = ws.open_dir(&join(&root, &sub)) else {
                continue;
            };
            self.watch_dir(id, &fd, sub.clone());
            self.scan(id, &fd, &sub, report, &mut stack);
        }
    }

    /// The entries of one directory: reported as created (with `report`), directories
    /// pushed on `stack` (at most [`MAX_WATCHED_DIRS`] waiting).
    fn scan(&mut self, id: u64, fd: &OwnedFd, rel: &str, report: bool, stack: &mut Vec<String>) {
        let names = read_names(fd).unwrap_or_default();
        for name in names.into_iter().take(SCAN_ENTRIES) {
            let Ok(st) = fstatat(fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            let child = join(rel, &name);
            if report && let Some(w) = self.watchers.get_mut(&id) {
                w.push(child.clone(), WatchKind::Create);
                // Written before its watch began: what the watch would have seen.
                if kind_of(&st) == FileKind::File && st.st_size > 0 {
                    w.push(child.clone(), WatchKind::Write);
                }
            }
            if kind_of(&st) == FileKind::Dir && stack.len() < MAX_WATCHED_DIRS {
                stack.push(child);
            }
        }
    }

    /// Watches one more directory of watcher `id`, within the bound.
    fn watch_dir(&mut self, id: u64, fd: &OwnedFd, rel: String) {
        if self.watched >= MAX_WATCHED_DIRS {
            if let Some(w) = self.watchers.get_mut(&id) {
                w.dropped += 1;
            }
            return;
        }
        match self.add_fd(fd) {
            Ok(wd) => self.note(wd, id, rel),
            Err(_) => {
                if let Some(w) = self.watchers.get_mut(&id) {
                    w.dropped += 1;
                }
            }
        }
    }

    /// Moves what the kernel queued into the watchers' queues (a bounded number of reads).
    pub fn pump(&mut self, ws: &Workspace) {
        for _ in 0..PUMP_READS {
            let Some(ino) = self.ino.as_ref() else { return };
            let events = match ino.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                _ => return,
            };
            for ev in events {
                self.dispatch(ws, ev);
            }
        }
    }

    fn dispatch(&mut self, ws: &Workspace, ev: InotifyEvent) {
        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            for w in self.watchers.values_mut() {
                w.dropped += 1;
            }
            return;
        }
        if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
            self.forget(ev.wd);
            return;
        }
        let Some(name) = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned()) else {
            return;
        };
        let users = self.dirs.get(&ev.wd).cloned().unwrap_or_default();
        let new_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR)
            && ev
                .mask
                .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
        for (id, rel) in users {
            let child = join(&rel, &name);
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            for kind in kinds(ev.mask) {
                w.push(child.clone(), kind);
            }
            if new_dir && w.recursive {
                let at = join(&w.root, &child);
                if let Ok(fd) = ws.open_dir(&at) {
                    self.take_tree(ws, id, &fd, child, true);
                }
            }
        }
    }

    /// A directory whose watch the kernel removed (it is gone): its watchers no longer
    /// count it; a watcher whose root it was has ended.
    fn forget(&mut self, wd: WatchDescriptor) {
        for (id, _) in self.dirs.remove(&wd).unwrap_or_default() {
            self.watched = self.watched.saturating_sub(1);
            if let Some(w) = self.watchers.get_mut(&id) {
                w.dirs = w.dirs.saturating_sub(1);
                if w.root_wd == wd {
                    w.ended = true;
                }
            }
        }
    }

    fn stop(&mut self, id: u64) -> Result<(), FileError> {
        self.watchers.remove(&id).ok_or_else(|| no_watcher(id))?;
        let mut unused = Vec::new();
        for (wd, users) in self.dirs.iter_mut() {
            let before = users.len();
            users.retain(|(w, _)| *w != id);
            self.watched = self.watched.saturating_sub(before - users.len());
            if users.is_empty() {
                unused.push(*wd);
            }
        }
        for wd in unused {
            self.dirs.remove(&wd);
            if let Some(ino) = self.ino.as_ref() {
                let _ = ino.rm_watch(wd);
            }
        }
        if self.watchers.is_empty() {
            // Nothing watches: the instance goes too (a late event has no one to reach).
            self.ino = None;
            self.dirs.clear();
            self.watched = 0;
        }
        Ok(())
    }

    /// Watchers and watched directories now (for tests and the agent's bounds).
    pub fn counts(&self) -> (usize, usize) {
        (self.watchers.len(), self.watched)
    }

    /// Events queued now, over every watcher.
    pub fn queued(&self) -> usize {
        self.watchers.values().map(|w| w.queue.len()).sum()
    }
}

fn no_watcher(id: u64) -> FileError {
    (
        ErrorCode::NotFound,
        format!("watcher {id} does not exist in this sandbox (stopped, or never started)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::workspace;

    fn events(w: &mut Watches, ws: &Workspace, id: u64) -> (Vec<WatchEvent>, u64) {
        match w.handle(ws, &WatchOp::Read { id }).unwrap() {
            WatchReply::Events {
                events, dropped, ..
            } => (events, dropped),
            other => panic!("{other:?}"),
        }
    }

    fn start(w: &mut Watches, ws: &Workspace, path: &str, recursive: bool) -> u64 {
        match w
            .handle(
                ws,
                &WatchOp::Start {
                    path: path.into(),
                    recursive,
                },
            )
            .unwrap()
        {
            WatchReply::Started { id } => id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sees_create_write_remove_and_recursion_only_when_asked() {
        let (dir, ws) = workspace();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut w = Watches::new();
        let flat = start(&mut w, &ws, "/work", false);
        let deep = start(&mut w, &ws, "/work", true);
        std::fs::write(dir.path().join("a.txt"), b"1").unwrap();
        std::fs::write(dir.path().join("sub/b.txt"), b"2").unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        w.pump(&ws);
        std::fs::write(dir.path().join("new/c.txt"), b"3").unwrap();
        std::fs::remove_file(dir.path().join("a.txt")).unwrap();
        let (flat_ev, _) = events(&mut w, &ws, flat);
        let names: Vec<(&str, WatchKind)> =
            flat_ev.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert!(names.contains(&("a.txt", WatchKind::Create)), "{names:?}");
        assert!(names.contains(&("a.txt", WatchKind::Write)), "{names:?}");
        assert!(names.contains(&("a.txt", WatchKind::Remove)), "{names:?}");
        assert!(!names.iter().any(|(n, _)| n.contains('/')), "{names:?}");
        let (deep_ev, _) = events(&mut w, &ws, deep);
        let names: Vec<&str> = deep_ev.iter().map(|e| e.name.as_str()).collect();
        assert!(names.contains(&"sub/b.txt"), "{names:?}");
        assert!(names.contains(&"new/c.txt"), "{names:?}");
        w.handle(&ws, &WatchOp::Stop { id: flat }).unwrap();
        assert!(w.handle(&ws, &WatchOp::Read { id: flat }).is_err());
        w.handle(&ws, &WatchOp::Stop { id: deep }).unwrap();
        assert_eq!(w.counts(), (0, 0));
    }

    #[test]
    fn floods_are_dropped_and_counted_not_kept() {
        let (dir, ws) = workspace();
        let mut w = Watches::new();
        let id = start(&mut w, &ws, "/work", true);
        for i in 0..(MAX_QUEUED_EVENTS + 500) {
            std::fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
            if i % 256 == 0 {
                w.pump(&ws);
            }
        }
        for _ in 0..100 {
            w.pump(&ws);
        }
        assert!(w.queued() <= MAX_QUEUED_EVENTS);
        let (ev, dropped) = events(&mut w, &ws, id);
        assert!(ev.len() <= MAX_QUEUED_EVENTS);
        assert!(dropped > 0, "{} events, none dropped", ev.len());
        for i in 0..(MAX_WATCHED_DIRS + 10) {
            std::fs::create_dir(dir.path().join(format!("d{i}"))).unwrap();
            if i % 256 == 0 {
                w.pump(&ws);
            }
        }
        for _ in 0..200 {
            w.pump(&ws);
        }
        assert!(w.counts().1 <= MAX_WATCHED_DIRS);
    }

    #[test]
    fn paths_are_confined_and_watchers_bounded() {
        let (dir, ws) = workspace();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        let mut w = Watches::new();
        let r = w.handle(
            &ws,
            &WatchOp::Start {
                path: "/work/out".into(),
                recursive: false,
            },
        );
        assert!(r.is_err(), "{r:?}");
        let r = w.handle(
            &ws,
            &WatchOp::Start {
                path: "/work/../etc".into(),
                recursive: false,
            },
        );
        assert!(r.is_err(), "{r:?}");
        for _ in 0..MAX_WATCHERS {
            start(&mut w, &ws, "/work", false);
        }
        let r = w.handle(
            &ws,
            &WatchOp::Start {
                path: "/work".into(),
                recursive: false,
            },
        );
        assert_eq!(r.unwrap_err().0, ErrorCode::Busy);
    }
}
