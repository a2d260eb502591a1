//! File calls outside the workspace (ADR 0031): `/tmp`, the image's files, whatever the
//! sandbox's user reaches there by an exec. The agent forks for each call; the child takes
//! the sandbox user's rights and the tier's confinement (as an exec's program does: its
//! ids, no supplementary groups, every capability gone, `no_new_privs`, the container
//! tier's Landlock and seccomp), then walks the sandbox's own root from `/`
//! ([`Workspace::open_outside`]): never through a symlink or a magic link, never into a
//! kernel filesystem, never into `/proc`, `/sys`, `/dev` or `/run/cordon`
//! ([`cordon_core::classify_sandbox_path`]). The child is in the sandbox's mount namespace
//! (the agent's), so nothing of the host is on its way; what it answers comes back on a
//! pipe, bounded as the agent's frames are.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::wait::waitpid;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::files::{FileError, Workspace};
use crate::proto::{ErrorCode, MAX_FRAME};
use crate::sys;

/// Who a call runs as and what confines it.
pub struct Outside<'a> {
    /// The sandbox's root (the agent's `/`).
    pub root: &'a Path,
    pub uid: u32,
    pub gid: u32,
    /// Run in the child before anything is opened: takes the sandbox user's rights and
    /// the tier's confinement; a failure refuses the call.
    pub prepare: &'a dyn Fn() -> io::Result<()>,
}

/// The child's answer: its result, then `data` raw.
type Answer<T> = Result<T, FileError>;

impl Outside<'_> {
    /// Runs `f` in a child forked for it (see the module's notes) and returns what it
    /// answered: a value and bytes (a file read; empty otherwise).
    ///
    /// Only call this while the process is single-threaded (the agent is).
    pub fn call<T: Serialize + DeserializeOwned>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<(T, Vec<u8>), FileError>,
    ) -> Result<(T, Vec<u8>), FileError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            (
                ErrorCode::Io,
                format!("the file call could not {what} ({e}); retry, and report it if it repeats"),
            )
        };
        let (rx, tx) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| failed("make its pipe", &e))?;
        match sys::fork_into(0).map_err(|e| failed("start", &e))? {
            sys::Forked::Child => {
                drop(rx);
                let answer = self.run_child(f);
                let code = i32::from(send(tx, answer).is_err());
                sys::exit_now(code)
            }
            sys::Forked::Parent(pid) => {
                drop(tx);
                let got = receive::<T>(rx);
                let _ = waitpid(pid, None);
                got.unwrap_or_else(|e| Err(failed("finish", &e)))
            }
        }
    }

    /// The child's part: the rights, the root, the call.
    fn run_child<T>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<(T, Vec<u8>), FileError>,
    ) -> Result<(T, Vec<u8>), FileError> {
        (self.prepare)().map_err(|e| {
            (
                ErrorCode::Io,
                format!(
                    "the file call could not take the sandbox user's rights ({e}); retry, and \
                     report it if it repeats"
                ),
            )
        })?;
        let ws = Workspace::open_outside(self.root, self.uid, self.gid)
            .map_err(|e| (ErrorCode::Io, format!("opening the sandbox's root: {e}")))?;
        f(&ws)
    }
}

/// Writes the answer: the length of its encoded result (4 bytes, little-endian), the
/// result, then the bytes.
fn send<T: Serialize>(tx: OwnedFd, answer: Result<(T, Vec<u8>), FileError>) -> io::Result<()> {
    let (result, data): (Answer<T>, Vec<u8>) = match answer {
        Ok((v, data)) => (Ok(v), data),
        Err(e) => (Err(e), Vec::new()),
    };
    let head = serde_json::to_vec(&result).map_err(io::Error::other)?;
    let mut out = std::fs::File::from(tx);
    out.write_all(&(head.len() as u32).to_le_bytes())?;
    out.write_all(&head)?;
    out.write_all(&data)
}

/// Reads the child's answer (at most a frame's worth) until it closes the pipe.
fn receive<T: DeserializeOwned>(rx: OwnedFd) -> io::Result<Result<(T, Vec<u8>), FileError>> {
    let mut bytes = Vec::new();
    std::fs::File::from(rx)
        .take(MAX_FRAME as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > MAX_FRAME {
        return Err(io::Error::other("the answer is larger than a frame"));
    }
    let bad = || io::Error::other("the answer was cut short");
    let len = bytes
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(bad)? as usize;
    let head = bytes.get(4..4 + len).ok_or_else(bad)?;
    let result: Answer<T> = serde_json::from_slice(head).map_err(io::Error::other)?;
    let data = bytes.split_off(4 + len);
    Ok(result.map(|v| (v, data)))
}

#[cfg(test)]
mod tests;
