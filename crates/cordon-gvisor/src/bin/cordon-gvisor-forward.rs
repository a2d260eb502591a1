//! The first process of a gvisor sandbox that has egress: starts the egress forwarder
//! (`127.0.0.1:<port>` inside the sandbox, relayed to the proxy's unix socket, which runsc
//! lets the sandbox open with `--host-uds=open`), then becomes the program to run.
//!
//! `cordon-gvisor-forward <port> <socket> -- <program> [args...]`

use std::os::unix::process::CommandExt;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!(
            "cordon-gvisor-forward is started by Cordon's gvisor tier, not by hand; use `cordon run --tier gvisor`"
        );
        std::process::exit(125)
    };
    let (Some(port), Some(socket), Some("--")) = (
        args.first().and_then(|p| p.parse::<u16>().ok()),
        args.get(1),
        args.get(2).map(String::as_str),
    ) else {
        usage()
    };
    let Some((program, rest)) = args[3..].split_first() else {
        usage()
    };
    if let Err(e) = cordon_guest::forwarder::spawn(port, Path::new(socket)) {
        eprintln!("cordon: {e}");
        std::process::exit(125);
    }
    let err = std::process::Command::new(program).args(rest).exec();
    eprintln!("cordon: cannot run {program}: {err}");
    std::process::exit(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    });
}
