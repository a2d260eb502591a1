//! Connections from outside to a port a program serves on the sandbox's own loopback (E2B's
//! `get_host(port)`, the native port route). The host hands the agent one end of a stream
//! socket with [`crate::proto::Request::PortOpen`]; the agent passes it on to its port relay,
//! a process of its own forked while the agent is single-threaded (the agent forks reapers
//! and stays single-threaded, so it relays no bytes itself). The relay connects the port on
//! the sandbox's loopback, says on the socket whether that worked (one byte), and copies
//! bytes both ways. It runs in the sandbox's namespaces and cgroup and dies with the
//! sandbox, so every connection it carries closes when the sandbox ends.

use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use crate::sys::{Forked, exit_now, fork_into};

/// The byte the relay writes when nothing listens on the port.
pub const PORT_CLOSED: u8 = 1;
/// How long a connect to the sandbox's own loopback may take (it answers at once unless
/// the program's backlog is full).
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// The agent's handle on its port relay process.
pub struct Relay {
    chan: UnixStream,
}

impl Relay {
    /// Forks the relay. Only while the caller is single-threaded (the agent always is).
    pub fn spawn() -> io::Result<Relay> {
        let (ours, theirs) = UnixStream::pair()?;
        match fork_into(0)? {
            Forked::Child => {
                // Every inherited descriptor but its channel goes (the agent's socket above all).
                let keep = theirs.as_raw_fd();
                for fd in 0..1024 {
                    if fd != keep {
                        let _ = nix::unistd::close(fd);
                    }
                }
                serve(&theirs);
                exit_now(0)
            }
            Forked::Parent(_) => Ok(Relay { chan: ours }),
        }
    }

    /// Hands `conn` to the relay, to be connected to `port`.
    pub fn hand(&self, port: u16, conn: &OwnedFd) -> io::Result<()> {
        let bytes = port.to_le_bytes();
        let iov = [io::IoSlice::new(&bytes)];
        let fds = [conn.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        loop {
            match sendmsg::<()>(self.chan.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
                Ok(2) => return Ok(()),
                Ok(_) => return Err(io::Error::other("the port relay took part of a request")),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Connects the host's socket `name` in [`crate::proto::PORTS_DIR`] (a plain name: no
/// other directory is reached), for [`crate::proto::Request::PortDial`].
pub fn dial(name: &str) -> Result<OwnedFd, String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        || name.starts_with('.')
    {
        return Err(format!("{name:?} is not a port socket's name"));
    }
    let path = std::path::Path::new(crate::proto::PORTS_DIR).join(name);
    UnixStream::connect(&path)
        .map(OwnedFd::from)
        .map_err(|e| format!("connecting the host's port socket: {e}"))
}

fn serve(chan: &UnixStream) {
    loop {
        let mut buf = [0u8; 2];
        let (n, fds) = match crate::fdpass::recv_with_fds(
            chan.as_raw_fd(),
            &mut buf,
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(r) => r,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        let port = u16::from_le_bytes(buf);
        for fd in fds {
            let conn = UnixStream::from(fd);
            let _ = std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || connect(port, conn));
        }
    }
}

/// Connects `port` on the loopback (IPv4 first: `python3 -m http.server` and most servers
/// listen there or on both), reports it on `conn`, and relays.
fn connect(port: u16, mut conn: UnixStream) {
    let tcp = [
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
    ]
    .iter()
    .find_map(|a| TcpStream::connect_timeout(a, CONNECT_WAIT).ok());
    let Some(tcp) = tcp else {
        let _ = conn.write_all(&[PORT_CLOSED]);
        return;
    };
    let _ = tcp.set_nodelay(true);
    if conn.write_all(&[cordon_core::PORT_CONNECTED]).is_ok() {
        let _ = crate::forwarder::pipe(tcp, conn);
    }
}
