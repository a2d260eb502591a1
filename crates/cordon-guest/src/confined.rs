//! The host side of a tier's file calls (gvisor, wasm), each run on a thread of its own
//! confined to the workspace: a mount namespace whose only filesystem is the workspace
//! (bound alone, pivoted to as `/`, everything else detached), the sandbox's user and
//! group, no supplementary groups, no capabilities, no new privileges. The walk by
//! descriptors ([`Workspace`]) already refuses every symlink; this is the wall behind it:
//! a path the kernel resolves on this thread, a race the walk missed included, reaches
//! nothing but the workspace, and nothing it makes is root's.
//!
//! A process that cannot make a mount namespace (not root, or root without CAP_SYS_ADMIN)
//! confines the thread with Landlock instead (reads and writes beneath the workspace only);
//! without either, the call is refused.
//!
//! Credentials, capabilities, the root directory and the mount namespace are the thread's
//! own in Linux; the thread ends with the call, so nothing of it is left to another.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};

use cordon_core::{ArchiveReport, FileEntry, FileOp, FileReply};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::fstat;

use crate::files::{FileError, Workspace};
use crate::proto::ErrorCode;

/// How a confined call's thread is walled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wall {
    /// Its own mount namespace holding the workspace alone, as the sandbox's user, no
    /// capabilities (a process that may make mount namespaces: root).
    Namespace,
    /// Landlock: file access beneath the workspace only (an unprivileged process).
    Landlock,
}

/// A workspace on the host whose file calls each run on a confined thread.
pub struct ConfinedWorkspace {
    dir: PathBuf,
    uid: u32,
    gid: u32,
    /// The workspace's device and inode, checked once the thread is inside it.
    id: (u64, u64),
    wall: Wall,
}

/// Bytes passed between the caller's thread and the confined one, per message.
const CHUNK: usize = 64 << 10;

impl ConfinedWorkspace {
    /// The workspace at `dir` (a directory, not a symlink), its files made by and owned
    /// by `uid`/`gid`. Fails when this process can confine a thread neither way.
    pub fn new(dir: &Path, uid: u32, gid: u32) -> io::Result<Self> {
        let fd = nix::fcntl::open(
            dir,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_NOFOLLOW
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        let st = fstat(&fd)?;
        let wall = if nix::unistd::geteuid().is_root() && may_unshare_mounts() {
            Wall::Namespace
        } else if landlock_available() {
            Wall::Landlock
        } else {
            return Err(io::Error::other(
                "the host side of the file API cannot be confined: this process may make no \
                 mount namespace (not root) and the kernel has no Landlock; run the server \
                 as root or on a kernel with Landlock (5.13+)",
            ));
        };
        Ok(ConfinedWorkspace {
            dir: dir.to_path_buf(),
            uid,
            gid,
            id: (st.st_dev, st.st_ino),
            wall,
        })
    }

    /// How each call's thread is walled in.
    pub fn wall(&self) -> Wall {
        self.wall
    }

    /// Runs `f` on a new thread confined to the workspace, with the workspace opened there.
    pub fn run<T: Send>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<T, FileError> + Send,
    ) -> Result<T, FileError> {
        std::thread::scope(|s| joined(self.spawn(s, f)?))
    }

    /// Starts `f` on a new thread of `scope`, confined (see [`ConfinedWorkspace::run`]).
    fn spawn<'scope, 'env, T: Send + 'scope>(
        &'env self,
        scope: &'scope Scope<'scope, 'env>,
        f: impl FnOnce(&Workspace) -> Result<T, FileError> + Send + 'scope,
    ) -> Result<ScopedJoinHandle<'scope, Result<T, FileError>>, FileError> {
        std::thread::Builder::new()
            .name("cordon-files".into())
            .spawn_scoped(scope, move || {
                let ws = self.enter().map_err(|e| {
                    (
                        ErrorCode::Io,
                        format!(
                            "the file call could not be confined to the sandbox's /work \
                             ({e}); retry, and if it fails again report it with the \
                             server's log"
                        ),
                    )
                })?;
                f(&ws)
            })
            .map_err(|e| {
                (
                    ErrorCode::Io,
                    format!("no thread for the file call ({e}); retry later"),
                )
            })
    }

    /// Confines the calling thread (see the module's notes) and opens the workspace in it.
    fn enter(&self) -> io::Result<Workspace> {
        let root = match self.wall {
            Wall::Namespace => {
                enter_namespace(&self.dir)?;
                crate::sys::thread_drop_bounding_set()?;
                crate::sys::thread_set_ids(self.uid, self.gid)?;
                crate::sys::thread_clear_capabilities()?;
                nix::sys::prctl::set_no_new_privs()?;
                Path::new("/")
            }
            Wall::Landlock => {
                landlock_beneath(&self.dir)?;
                crate::sys::thread_clear_capabilities()?;
                self.dir.as_path()
            }
        };
        let ws = Workspace::open(root, self.uid, self.gid)?;
        let st = fstat(ws.root_fd())?;
        if (st.st_dev, st.st_ino) != self.id {
            return Err(io::Error::other("the workspace was replaced"));
        }
        Ok(ws)
    }

    /// [`Workspace::put`], confined.
    pub fn put(&self, path: &str, mode: u32, data: &[u8]) -> Result<(), FileError> {
        self.run(|ws| ws.put(path, mode, data))
    }

    /// [`Workspace::get`], confined.
    pub fn get(&self, path: &str, max: u64) -> Result<(Vec<u8>, bool), FileError> {
        self.run(|ws| ws.get(path, max))
    }

    /// [`Workspace::stat`], confined.
    pub fn stat(&self, path: &str) -> Result<FileEntry, FileError> {
        self.run(|ws| ws.stat(path))
    }

    /// [`Workspace::op`], confined.
    pub fn op(&self, op: &FileOp) -> Result<FileReply, FileError> {
        self.run(|ws| ws.op(op))
    }

    /// [`Workspace::unpack`], confined; `src` is read on the caller's thread and its bytes
    /// handed to the confined one.
    pub fn unpack(
        &self,
        dir: &str,
        src: &mut dyn Read,
        budget: u64,
    ) -> Result<ArchiveReport, FileError> {
        let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(4);
        std::thread::scope(|s| {
            // The receiving end goes with the confined thread, so a call that stops early
            // (a refusal) ends the feeding too.
            let unpacking = self.spawn(s, move |ws| {
                let mut reader = ChannelReader {
                    rx,
                    buf: Vec::new(),
                    at: 0,
                };
                ws.unpack(dir, &mut reader, budget)
            })?;
            feed(src, &tx);
            drop(tx);
            joined(unpacking)
        })
    }

    /// [`Workspace::pack`], confined; the archive is written to `out` on the caller's
    /// thread as the confined one makes it.
    pub fn pack(
        &self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn Write,
    ) -> Result<ArchiveReport, FileError> {
        let (tx, rx) = sync_channel::<Vec<u8>>(4);
        std::thread::scope(|s| {
            let making = self.spawn(s, move |ws| {
                let mut writer = ChannelWriter {
                    tx,
                    buf: Vec::new(),
                };
                let r = ws.pack(dir, max_bytes, &mut writer)?;
                writer
                    .flush()
                    .map_err(|e| (ErrorCode::Io, format!("writing the archive of {dir}: {e}")))?;
                Ok(r)
            })?;
            let mut failed = None;
            for chunk in rx.iter() {
                if let Err(e) = out.write_all(&chunk) {
                    failed = Some(e);
                    break;
                }
            }
            // Dropping the receiver ends a maker still writing (its writes fail).
            drop(rx);
            let made = joined(making);
            match failed {
                Some(e) => Err((ErrorCode::Io, format!("writing the archive of {dir}: {e}"))),
                None => made,
            }
        })
    }
}

/// A confined call's result; a panic on its thread is an error.
fn joined<T>(handle: ScopedJoinHandle<'_, Result<T, FileError>>) -> Result<T, FileError> {
    handle.join().unwrap_or_else(|_| {
        Err((
            ErrorCode::Io,
            "the file call failed unexpectedly; retry, and report it if it repeats".to_string(),
        ))
    })
}

/// Reads `src` to its end (or its first error) into `tx`, until the receiver goes.
fn feed(src: &mut dyn Read, tx: &SyncSender<io::Result<Vec<u8>>>) {
    loop {
        let mut buf = vec![0u8; CHUNK];
        match src.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                buf.truncate(n);
                if tx.send(Ok(buf)).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

struct ChannelReader {
    rx: Receiver<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.buf = chunk;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                // The sender is gone: the end of the stream.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

struct ChannelWriter {
    tx: SyncSender<Vec<u8>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.buf);
        self.tx
            .send(chunk)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

/// Moves the calling thread into a mount namespace of its own whose only mount is `dir`
/// (bound, not recursively: no mount beneath it comes along), made its root and working
/// directory; every other mount is detached. Nothing propagates back to the host.
fn enter_namespace(dir: &Path) -> io::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS)?;
    crate::sys::make_mounts_private()?;
    nix::mount::mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    nix::unistd::chdir(dir)?;
    nix::unistd::pivot_root(".", ".")?;
    nix::mount::umount2(".", MntFlags::MNT_DETACH)?;
    nix::unistd::chdir("/")?;
    Ok(())
}

/// Whether this process may make mount namespaces (root may not, in a container without
/// CAP_SYS_ADMIN): tried once, on a thread that ends with the namespace.
fn may_unshare_mounts() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).is_ok()
        })
        .join()
        .unwrap_or(false)
    })
}

fn landlock_available() -> bool {
    use landlock::{ABI, Access, AccessFs, Ruleset, RulesetAttr};
    Ruleset::default()
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(|r| r.create())
        .is_ok()
}

/// Restricts the calling thread's file access to beneath `dir` (Landlock; this thread
/// only, and no new privileges for it).
fn landlock_beneath(dir: &Path) -> io::Result<()> {
    use landlock::{
        ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
        RulesetStatus,
    };
    let abi = ABI::V3;
    let err = |e: &dyn std::fmt::Display| io::Error::other(format!("Landlock: {e}"));
    let beneath = PathBeneath::new(
        PathFd::new(dir).map_err(|e| err(&e))?,
        AccessFs::from_all(abi),
    );
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(beneath))
        .and_then(|r| r.restrict_self())
        .map_err(|e| err(&e))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(io::Error::other("Landlock is not enforced by this kernel"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_between_the_threads_whole() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (tx, rx) = sync_channel(2);
        std::thread::scope(|s| {
            let r = s.spawn(move || {
                let mut got = Vec::new();
                ChannelReader {
                    rx,
                    buf: Vec::new(),
                    at: 0,
                }
                .read_to_end(&mut got)
                .unwrap();
                got
            });
            feed(&mut &data[..], &tx);
            drop(tx);
            assert_eq!(r.join().unwrap(), data);
        });
    }
}
