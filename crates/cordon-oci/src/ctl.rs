//! The monitor's control socket (`<root>/<id>/ctl.sock`, a `SOCK_SEQPACKET` socket, so each
//! message is one packet): `start`, signals, `exec` (the new process's stdio passed as
//! descriptors with the request) and `ps`. Messages are typed JSON; unknown fields are
//! refused.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use serde::{Deserialize, Serialize};

use crate::bundle::ProcessSpec;

/// The socket's name in the container's state directory.
pub const SOCKET: &str = "ctl.sock";

/// Largest message (a process spec with its environment).
const MAX_MESSAGE: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Run the container's process.
    Start,
    /// Deliver signal number `signal` (1 to 64) to the container's process as itself
    /// (`all`: to every process of the container).
    Signal {
        signal: i32,
        #[serde(default)]
        all: bool,
    },
    /// Run another process in the container; its stdin, stdout and stderr come with the
    /// request and are the process's own. Answered by `ok` once it runs (`console`, with
    /// the master attached, when the process asks for a terminal), then `exited`.
    Exec { process: ProcessSpec },
    /// The host pids of every process of the container.
    Ps,
    /// Change the sandbox's memory limit and CPU quota (`update`, already admitted).
    Resize { memory_bytes: u64, cpus: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Ok,
    /// The process runs on a terminal of the sandbox's devpts whose master comes with this
    /// message; `name` is its slave's path inside.
    Console {
        name: String,
    },
    Error {
        message: String,
    },
    Pids {
        pids: Vec<i32>,
    },
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// One end of a control connection.
#[derive(Debug)]
pub struct Conn(OwnedFd);

/// The socket's address, reached through an open descriptor of the state directory, so a
/// long runtime root never exceeds the 108 bytes of a socket path.
fn addr_in(dir: &OwnedFd) -> io::Result<UnixAddr> {
    let path = format!("/proc/self/fd/{}/{SOCKET}", dir.as_raw_fd());
    UnixAddr::new(Path::new(&path)).map_err(io::Error::from)
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

fn seqpacket() -> io::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

impl Conn {
    pub(crate) fn from_owned(fd: OwnedFd) -> Conn {
        Conn(fd)
    }

    /// Connects to the monitor of the container whose state directory is `dir`.
    pub fn connect(dir: &Path) -> io::Result<Conn> {
        let d = open_dir(dir)?;
        let fd = seqpacket()?;
        socket::connect(fd.as_raw_fd(), &addr_in(&d)?)?;
        Ok(Conn(fd))
    }

    /// Sends one message with `fds` attached.
    pub fn send<T: Serialize>(&self, msg: &T, fds: &[RawFd]) -> io::Result<()> {
        let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
        let iov = [io::IoSlice::new(&body)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
        loop {
            match socket::sendmsg::<()>(
                self.0.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => return Ok(()),
            }
        }
    }

    /// Receives one message and the descriptors that came with it; `None` once the other
    /// end has closed.
    pub fn recv<T: for<'de> Deserialize<'de>>(&self) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut space = nix::cmsg_space!([RawFd; 8]);
        let (n, raw) = loop {
            let mut iov = [io::IoSliceMut::new(&mut buf)];
            match socket::recvmsg::<()>(
                self.0.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
                Ok(m) => {
                    let mut raw = Vec::new();
                    for c in m.cmsgs()? {
                        if let ControlMessageOwned::ScmRights(fds) = c {
                            raw.extend(fds);
                        }
                    }
                    break (m.bytes, raw);
                }
            }
        };
        let fds = crate::sys::received(raw);
        if n == 0 {
            return Ok(None);
        }
        let msg = serde_json::from_slice(&buf[..n])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Some((msg, fds)))
    }

    /// One request, one reply.
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> io::Result<Reply> {
        self.send(req, fds)?;
        match self.recv::<Reply>()? {
            Some((r, _)) => Ok(r),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the container's monitor closed the connection",
            )),
        }
    }

    pub fn set_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        let tv = nix::sys::time::TimeVal::from(libc::timeval {
            tv_sec: t.map_or(0, |t| t.as_secs() as libc::time_t),
            tv_usec: t.map_or(0, |t| t.subsec_micros() as libc::suseconds_t),
        });
        socket::setsockopt(&self.0, socket::sockopt::ReceiveTimeout, &tv)?;
        Ok(())
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// The monitor's listening socket.
#[derive(Debug)]
pub struct Listener(OwnedFd);

impl Listener {
    /// Binds `ctl.sock` in `dir`; only root may connect (mode 0600).
    pub fn bind(dir: &Path) -> io::Result<Listener> {
        let d = open_dir(dir)?;
        let fd = seqpacket()?;
        let _ = std::fs::remove_file(dir.join(SOCKET));
        socket::bind(fd.as_raw_fd(), &addr_in(&d)?)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(SOCKET), std::fs::Permissions::from_mode(0o600))?;
        socket::listen(&fd, socket::Backlog::new(16).map_err(io::Error::from)?)?;
        Ok(Listener(fd))
    }

    pub fn accept(&self) -> io::Result<Conn> {
        let fd = socket::accept4(self.0.as_raw_fd(), SockFlag::SOCK_CLOEXEC)?;
        Ok(Conn(crate::sys::accepted(fd)))
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Connects to an engine's console socket (`--console-socket`), where it waits for a
/// terminal's master; a path too long for a socket address is reached through an open
/// descriptor of its directory.
pub fn connect_console(path: &Path) -> io::Result<std::os::unix::net::UnixStream> {
    if path.as_os_str().len() < 100 {
        return std::os::unix::net::UnixStream::connect(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the console socket's path names no file",
        ));
    };
    let d = open_dir(dir)?;
    let short = Path::new(&format!("/proc/self/fd/{}", d.as_raw_fd())).join(name);
    std::os::unix::net::UnixStream::connect(short)
}

/// Sends a terminal's master over a console socket as runc does: one message whose bytes
/// are the terminal's name and whose `SCM_RIGHTS` carry the master.
pub fn send_console(
    sock: &impl AsFd,
    name: &str,
    master: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    let fds = [master.as_raw_fd()];
    let iov = [io::IoSlice::new(name.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    loop {
        match socket::sendmsg::<()>(
            sock.as_fd().as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}
