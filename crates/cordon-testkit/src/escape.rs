//! Escape-battery probes whose expectation is the same on every tier.

use std::net::TcpListener;

use cordon_core::{Backend, ExecRequest, Language, SandboxSpec};

use crate::{run_once, text};

/// Packet, raw IP, netlink-audit, vsock and AF_ALG sockets cannot be opened.
pub fn raw_and_exotic_sockets_refused(b: &dyn Backend, spec: &SandboxSpec) {
    let probe = r#"
import socket
cases = [('packet', 17, socket.SOCK_RAW, 0), ('raw-icmp', 2, socket.SOCK_RAW, 1),
         ('raw-inet6', 10, socket.SOCK_RAW, 58), ('netlink-audit', 16, socket.SOCK_RAW, 9),
         ('vsock', 40, socket.SOCK_STREAM, 0), ('alg', 38, socket.SOCK_SEQPACKET, 0),
         ('packet-dgram', 17, socket.SOCK_DGRAM, 0)]
for name, fam, typ, proto in cases:
    try:
        socket.socket(fam, typ, proto)
        print('OPENED', name)
    except OSError as e:
        print('denied', name, e.errno)
"#;
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    assert!(!out.contains("OPENED"), "{out}");
    assert_eq!(
        out.matches("denied").count(),
        7,
        "{out} {}",
        text(&o.stderr)
    );
}

/// A listener on the host's loopback cannot be reached by any name for the host (loopback,
/// `localhost`, QEMU's host alias, the cloud metadata address, a public address), nothing
/// reaches the listener, and the sandbox's only interface is `lo`.
pub fn host_loopback_unreachable(b: &dyn Backend, spec: &SandboxSpec) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let hosts = [
        "127.0.0.1",
        "localhost",
        "10.0.2.2",
        "169.254.169.254",
        "8.8.8.8",
    ];
    let probe = format!(
        "import socket\nfor host in {hosts:?}:\n  s = socket.socket(); s.settimeout(2)\n  try:\n    s.connect((host, {port})); print('CONNECTED', host)\n  except OSError as e:\n    print('refused', host, e.errno)\n"
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    assert!(!out.contains("CONNECTED"), "{out}");
    assert_eq!(
        out.matches("refused").count(),
        hosts.len(),
        "{out} {}",
        text(&o.stderr)
    );
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Sh,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        ),
    );
    assert_eq!(text(&o.stdout).trim(), "lo", "{o:?}");
}

/// A host process and the test process itself are invisible to the sandbox and cannot be
/// signalled from it (ESRCH); the sandbox sees at most `max_visible` processes.
pub fn host_processes_unsignalable(b: &dyn Backend, spec: &SandboxSpec, max_visible: usize) {
    let mut victim = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let vpid = victim.id();
    let me = std::process::id();
    let probe = format!(
        "import os, signal\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint('pids', pids)\nfor pid in ({vpid}, {me}):\n  try:\n    os.kill(pid, signal.SIGKILL); print('sent', pid)\n  except OSError as e:\n    print('failed', pid, e.errno)\n"
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    let still_running = victim.try_wait().unwrap().is_none();
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(still_running, "the host process was killed");
    assert!(out.contains(&format!("failed {vpid} 3")), "{out}");
    // The sandbox's own pid may equal the test's number; then it signals itself, not us.
    assert!(
        out.contains(&format!("failed {me} 3")) || !out.contains(&format!("sent {me}")),
        "{out}"
    );
    let pids_line = out.lines().next().unwrap_or_default();
    let visible = pids_line.matches(',').count() + 1;
    assert!(
        visible <= max_visible,
        "the sandbox sees too many processes: {pids_line}"
    );
}

/// Environment variable that carries the canary into the child test process.
pub const CANARY_VAR: &str = "CORDON_TEST_CANARY";

/// The child half of the environment-canary check: when started by [`env_canary_parent`],
/// looks everywhere a sandbox could see the environment of the process that created it and
/// checks the canary is nowhere. Returns false (doing nothing) when not started that way.
pub fn env_canary_child(b: &dyn Backend, spec: &SandboxSpec) -> bool {
    let Ok(canary) = std::env::var(CANARY_VAR) else {
        return false;
    };
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Bash,
            "env; cat /proc/1/environ /proc/self/environ; grep -rs CORDON /proc/*/environ /proc/*/cmdline; echo /work/* /tmp/*; true",
        ),
    );
    let mut all = text(&o.stdout);
    all.push_str(&text(&o.stderr));
    assert!(all.contains("HOME=/work"), "the probe did not run: {all}");
    assert!(!all.contains(&canary), "canary leaked into the sandbox");
    assert!(!all.contains("CARGO"), "host environment leaked: {all}");
    println!("CANARY-CHECK-RAN");
    true
}

/// Runs the test `child_test` of the current test binary in a child process whose
/// environment holds a canary (also as a cloud credential), and checks it ran its check.
pub fn env_canary_parent(child_test: &str) {
    let canary = format!(
        "canary-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(CANARY_VAR, &canary)
        .env("AWS_SECRET_ACCESS_KEY", &canary)
        .output()
        .unwrap();
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed: {all}");
    assert!(
        all.contains("CANARY-CHECK-RAN"),
        "child did not run the check: {all}"
    );
}
