//! The in-sandbox end of the egress path: listens on `127.0.0.1:<port>` inside the sandbox's
//! network namespace and relays each connection, byte for byte, to the proxy's unix socket.
//! It runs as its own process in the sandbox (outside every exec's PID namespace, so programs
//! cannot see or signal it) and dies with the sandbox.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::sys::{Forked, exclusive_listener, exit_now, fork_into};

/// Binds the listeners and forks the forwarder process. Call once the sandbox's root and
/// loopback are set up, before any program of the sandbox runs, while the caller is still
/// single-threaded. The caller keeps its copies of the listeners for the rest of its life
/// (it is the sandbox's agent): the port stays bound, and no program can take it, even if
/// the forwarder itself dies (connections then wait, they reach no one else).
pub fn spawn(port: u16, socket: &Path) -> Result<(), String> {
    let listeners = listen(port)?;
    match fork_into(0).map_err(|e| format!("starting the egress forwarder: {e}"))? {
        Forked::Child => {
            // Closes every inherited descriptor but the listeners (the agent socket above all).
            let keep: Vec<i32> = listeners
                .iter()
                .map(std::os::fd::AsRawFd::as_raw_fd)
                .collect();
            for fd in 0..1024 {
                if !keep.contains(&fd) {
                    let _ = nix::unistd::close(fd);
                }
            }
            let socket = socket.to_path_buf();
            let mut listeners = listeners.into_iter();
            if let Some(v4) = listeners.next() {
                for other in listeners {
                    let socket = socket.clone();
                    let _ = std::thread::Builder::new()
                        .stack_size(64 * 1024)
                        .spawn(move || serve(other, socket));
                }
                serve(v4, socket);
            }
            exit_now(0)
        }
        Forked::Parent(_) => {
            hold(listeners);
            Ok(())
        }
    }
}

/// The forwarder's listeners on the sandbox's loopback: `127.0.0.1:<port>` (the address the
/// proxy variables name) and, where the sandbox has IPv6, `[::1]:<port>` too, so that no
/// program can serve a client that names `localhost` there. Each is listening before any
/// program runs, without `SO_REUSEADDR` or `SO_REUSEPORT`, so a later bind of that port on that address or a
/// wildcard fails (`EADDRINUSE`), whatever socket options the program sets.
pub fn listen(port: u16) -> Result<Vec<TcpListener>, String> {
    let v4 = exclusive_listener((Ipv4Addr::LOCALHOST, port).into())
        .map_err(|e| format!("egress forwarder cannot listen on 127.0.0.1:{port}: {e}"))?;
    let mut all = vec![v4];
    match exclusive_listener((Ipv6Addr::LOCALHOST, port).into()) {
        Ok(v6) => all.push(v6),
        // No IPv6 in this sandbox: no program can bind there either.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT)
            ) => {}
        Err(e) => {
            return Err(format!(
                "egress forwarder cannot listen on [::1]:{port}: {e}"
            ));
        }
    }
    Ok(all)
}

/// Keeps the listeners open in the calling process until it exits (its descriptors are
/// close-on-exec: no program it starts inherits them).
pub fn hold(listeners: Vec<TcpListener>) {
    for l in listeners {
        std::mem::forget(l);
    }
}

fn serve(listener: TcpListener, socket: PathBuf) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let socket = socket.clone();
        // One thread per connection and direction; the sandbox's pids limit bounds them,
        // and the proxy bounds concurrent connections per sandbox.
        let _ = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ = relay(tcp, &socket);
            });
    }
}

fn relay(tcp: TcpStream, socket: &Path) -> io::Result<()> {
    // A listener with a full backlog answers `EAGAIN` for a moment: tried again, briefly.
    let mut tries = 0;
    let unix = loop {
        match UnixStream::connect(socket) {
            Ok(u) => break u,
            Err(e) if tries < 3 && e.raw_os_error() == Some(libc::EAGAIN) => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => {
                unreachable_proxy(tcp);
                return Err(e);
            }
        }
    };
    pipe(tcp, unix)
}

/// Answers a client whose proxy cannot be reached with a 502 that says so (every client of
/// the forwarder speaks HTTP to a proxy first, a `CONNECT` included), instead of a reset:
/// the request is read first (bounded), so that closing does not reset the answer away.
fn unreachable_proxy(mut tcp: TcpStream) {
    use std::io::{Read, Write};
    const BODY: &str = "cordon: the sandbox's egress proxy is gone (the sandbox is being \
                        stopped, or its host process died); start a new sandbox\n";
    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_millis(200)));
    let mut buf = [0u8; 8192];
    let _ = tcp.read(&mut buf);
    let _ = write!(
        tcp,
        "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tcp.shutdown(Shutdown::Write);
    for _ in 0..64 {
        if !matches!(tcp.read(&mut buf), Ok(n) if n > 0) {
            break;
        }
    }
}

/// Copies bytes both ways between a TCP connection and a unix stream until both
/// directions have ended (each end's write side shut when its source ends).
pub(crate) fn pipe(tcp: TcpStream, unix: UnixStream) -> io::Result<()> {
    let (mut t_read, mut u_write) = (tcp.try_clone()?, unix.try_clone()?);
    let up = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = io::copy(&mut t_read, &mut u_write);
            let _ = u_write.shutdown(Shutdown::Write);
        })?;
    let (mut u_read, mut t_write) = (unix, tcp);
    let _ = io::copy(&mut u_read, &mut t_write);
    let _ = t_write.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A client whose proxy is gone reads a 502 that says so, not a reset.
    #[test]
    fn a_client_of_a_gone_proxy_reads_a_502() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let gone = tempfile::tempdir().unwrap().path().join("egress.sock");
        let server = std::thread::spawn(move || {
            let (tcp, _) = l.accept().unwrap();
            relay(tcp, &gone).is_err()
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET http://example.test/ HTTP/1.1\r\nhost: example.test\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(server.join().unwrap());
        assert!(out.starts_with("HTTP/1.1 502 "), "{out}");
        assert!(out.contains("egress proxy is gone"), "{out}");
    }
}
