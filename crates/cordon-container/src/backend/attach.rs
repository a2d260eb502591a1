//! Programs started with the caller's own descriptors, and the sandbox's terminals.

use cordon_core::{Error, ExecRequest, Result};
use cordon_guest::proto::{Request, StdioMode};

use super::life::sandbox_init_of;
use super::{BgOom, ContainerSandbox, Terminal};

/// The major and minor numbers of a pseudo-terminal multiplexer (`ptmx`).
const PTMX: (u32, u32) = (5, 2);

impl ContainerSandbox {
    /// Starts `req` in the background with `stdio` (stdin, stdout, stderr) as the
    /// program's own descriptors: nothing of its I/O passes through the agent or the host,
    /// and no byte is kept or capped; [`Sandbox::read_background`](cordon_core::Sandbox::read_background) reports only its end.
    /// With `terminal`, the three are one [`Terminal`]'s slave, which becomes the program's
    /// controlling terminal. With `user`, the program runs as that user of the sandbox's
    /// user namespace (never id 0: refused) instead of the sandbox's own. The sandbox's
    /// limits, walls and reaper hold as for any exec.
    pub fn start_attached(
        &mut self,
        req: &ExecRequest,
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
        terminal: bool,
        user: Option<cordon_guest::proto::ProcUser>,
    ) -> Result<u64> {
        use std::os::fd::AsRawFd;
        self.ctrl()?;
        let mut parts = self.exec_parts(req)?;
        // The agent takes the passed terminal as it is; the size is the host's to set.
        parts.pty = terminal.then_some(cordon_core::PtySize { rows: 24, cols: 80 });
        let id = self.next_exec;
        self.next_exec += 1;
        let mut request = parts.background_with(id, StdioMode::Passed);
        if let Request::BgExec { user: u, .. } = &mut request {
            *u = user;
        }
        if let Some(c) = self.cgroup.as_ref().map(|c| c.counters()) {
            self.bg_counters.insert(
                id,
                BgOom::Started {
                    oom_kills: c.oom_kills,
                },
            );
        }
        let fds = stdio.map(|f| f.as_raw_fd());
        self.file_call(|io| cordon_host::procs::start_passed(io, &request, fds))?;
        Ok(id)
    }

    /// Delivers signal number `signal` (1 to 64) to background exec `id`'s program itself,
    /// as `kill(2)` would to that process (`all`: to every process of the exec): a trap in
    /// the program sees it as sent.
    pub fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> Result<()> {
        self.file_call(|io| cordon_host::procs::raise(io, id, signal, all))
    }

    /// A new pseudo-terminal of `size` in the sandbox's own devpts instance, opened from
    /// the host: its multiplexer beneath the sandbox's root (never through a symbolic or
    /// magic link, and checked to be a `ptmx`), the slave by `TIOCGPTPEER` (no path), owned
    /// by the sandbox's user. Neither end becomes a controlling terminal here.
    pub fn open_terminal(&mut self, size: cordon_core::PtySize) -> Result<Terminal> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        size.validate()?;
        self.ctrl()?;
        let fail = |what: &str, e: rustix::io::Errno| {
            Error::failed(
                format!(
                    "cannot open a terminal in the sandbox ({what}; run the process without a \
                     terminal)"
                ),
                e,
            )
        };
        let agent = self
            .outer
            .as_ref()
            .and_then(|o| sandbox_init_of(o.id()))
            .ok_or_else(|| self.gone_error())?;
        let root = rustix::fs::open(
            format!("/proc/{agent}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("its root", e))?;
        let master = rustix::fs::openat2(
            &root,
            "dev/pts/ptmx",
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| fail("its /dev/pts/ptmx", e))?;
        let st = rustix::fs::fstat(&master).map_err(|e| fail("its ptmx", e))?;
        let is_ptmx = rustix::fs::FileType::from_raw_mode(st.st_mode)
            == rustix::fs::FileType::CharacterDevice
            && (
                rustix::fs::major(st.st_rdev as _),
                rustix::fs::minor(st.st_rdev as _),
            ) == PTMX;
        if !is_ptmx {
            return Err(Error::Sandbox(
                "the sandbox's /dev/pts/ptmx is not a terminal multiplexer; destroy the \
                 sandbox"
                    .into(),
            ));
        }
        rustix::pty::unlockpt(&master).map_err(|e| fail("unlocking it", e))?;
        let slave = rustix::pty::ioctl_tiocgptpeer(
            &master,
            rustix::pty::OpenptFlags::RDWR
                | rustix::pty::OpenptFlags::NOCTTY
                | rustix::pty::OpenptFlags::CLOEXEC,
        )
        .map_err(|e| fail("its slave", e))?;
        let name = rustix::pty::ptsname(&master, Vec::new())
            .map_err(|e| fail("its name", e))?
            .to_string_lossy()
            .into_owned();
        rustix::termios::tcsetwinsize(
            &master,
            rustix::termios::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .map_err(|e| fail("its size", e))?;
        // Its program's own user owns it, as a login's terminal is owned (host ids: the
        // sandbox's range).
        if let Some(base) = self.ids.as_ref().map(|r| r.base()) {
            let id = base + self.sandbox_uid;
            rustix::fs::fchown(
                &slave,
                Some(rustix::fs::Uid::from_raw(id)),
                Some(rustix::fs::Gid::from_raw(id)),
            )
            .map_err(|e| fail("giving it to the sandbox's user", e))?;
        }
        Ok(Terminal {
            master,
            slave,
            name,
        })
    }

    /// Whether the OOM killer ended background exec `id`, which ended by `signal`: the
    /// agent cannot tell on this tier (the sandbox's cgroup is the host's), so the host
    /// compares the cgroup's OOM count with the one at its start. A SIGKILL while that
    /// count rose is taken for the OOM killer's (another process's OOM kill at the same
    /// moment would be taken for it too); the first answer is kept.
    pub(super) fn bg_oom(&mut self, id: u64, signal: Option<i32>) -> bool {
        let now = self.cgroup.as_ref().map(|c| c.counters());
        let Some(entry) = self.bg_counters.get_mut(&id) else {
            return false;
        };
        if let BgOom::Started { oom_kills } = *entry {
            let oom = now.is_some_and(|c| signal == Some(9) && c.oom_kills > oom_kills);
            *entry = BgOom::Ended { oom_killed: oom };
        }
        matches!(*entry, BgOom::Ended { oom_killed: true })
    }
}
