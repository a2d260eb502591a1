//! The in-sandbox end of the egress path: listens on `127.0.0.1:<port>` inside the sandbox's
//! network namespace and relays each connection, byte for byte, to the proxy's unix socket.
//! It runs as its own process in the sandbox (outside every exec's PID namespace, so programs
//! cannot see or signal it) and dies with the sandbox.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::sys::{Forked, exit_now, fork_into};

/// Binds the listener and forks the forwarder process. Call once the sandbox's root and
/// loopback are set up, while the caller is still single-threaded.
pub fn spawn(port: u16, socket: &Path) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("egress forwarder cannot listen on 127.0.0.1:{port}: {e}"))?;
    match fork_into(0).map_err(|e| format!("starting the egress forwarder: {e}"))? {
        Forked::Child => {
            // Closes every inherited descriptor but the listener (the agent socket above all).
            let keep = std::os::fd::AsRawFd::as_raw_fd(&listener);
            for fd in 0..1024 {
                if fd != keep {
                    let _ = nix::unistd::close(fd);
                }
            }
            serve(listener, socket.to_path_buf());
            exit_now(0)
        }
        Forked::Parent(_) => Ok(()),
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
    let unix = UnixStream::connect(socket)?;
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
