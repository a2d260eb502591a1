//! The first process of a live gvisor sandbox: Cordon's agent, serving the framed protocol
//! on the container's stdin and stdout (which runsc connects to the host), so that an exec
//! is a message to a running sandbox rather than a new `runsc run`. With egress it first
//! starts the egress forwarder (`127.0.0.1:<port>` inside the sandbox, relayed to the
//! proxy's unix socket, which runsc lets the sandbox open with `--host-uds=open`).
//!
//! `cordon-gvisor-agent <uid> [--egress <port> <socket>]`
//!
//! It runs as the sandbox's root inside gVisor's kernel (namespaces for each exec's reaper,
//! `/proc` mounts); every program runs as `<uid>` with no capabilities and `no_new_privs`.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use cordon_guest::agent::{Agent, AgentConfig};

fn usage() -> ! {
    eprintln!(
        "cordon-gvisor-agent is started by Cordon's gvisor tier, not by hand; use `cordon run --tier gvisor`"
    );
    std::process::exit(125)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(uid) = args.first().and_then(|u| u.parse::<u32>().ok()) else {
        usage()
    };
    match args.get(1).map(String::as_str) {
        None => {}
        Some("--egress") => {
            let (Some(port), Some(socket), None) = (
                args.get(2).and_then(|p| p.parse::<u16>().ok()),
                args.get(3),
                args.get(4),
            ) else {
                usage()
            };
            if let Err(e) = cordon_guest::forwarder::spawn(port, Path::new(socket)) {
                eprintln!("cordon-gvisor-agent: fatal: {e}");
                std::process::exit(125);
            }
        }
        Some(_) => usage(),
    }
    // Pseudo-terminals (background execs with a pty) come from the sandbox's devpts:
    // /dev/ptmx is its multiplexer, if runsc made none.
    if std::fs::symlink_metadata("/dev/ptmx").is_err() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
    let cfg = AgentConfig {
        name: "cordon-gvisor-agent".into(),
        uid,
        gid: uid,
        workdir: PathBuf::from("/work"),
        scratch: vec![PathBuf::from("/work"), PathBuf::from("/tmp")],
        mount_proc: true,
        boot_id: None,
        // gVisor's kernel is the wall: no Landlock or seccomp layer inside it.
        confine: None,
        // gVisor's terminals send no SIGWINCH on a resize: the agent does.
        winch_on_resize: true,
        standby_idle: Some(cordon_guest::STANDBY_IDLE),
    };
    // The container's stdin and stdout, which runsc connects to the host: copies of them,
    // owned by the agent.
    let channel = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|rx| Ok((rx, std::io::stdout().as_fd().try_clone_to_owned()?)));
    let agent =
        match channel.and_then(|(rx, tx)| Agent::over_pipes(cfg, File::from(rx), File::from(tx))) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("cordon-gvisor-agent: fatal: {e}");
                std::process::exit(125);
            }
        };
    if let Err(e) = agent.serve() {
        eprintln!("cordon-gvisor-agent: fatal: {e}");
        std::process::exit(1);
    }
}
