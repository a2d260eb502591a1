//! The container's I/O as the engines hand it over: stdout and stderr are the engine's own
//! descriptors inside the sandbox (every byte of a fast writer arrives, nothing is capped),
//! terminals (`-t`, `--console-socket`), every signal `kill` names delivered as itself, and
//! the image's user as the process runs.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{IMAGE, OCI, containerd_with_image, have, podman, text};

/// 64 MiB: sixty-four times the most a sandbox keeps of a background exec's stream.
pub(super) const BIG: usize = 64 << 20;
/// Each stream of the interleaved writer.
const HALF: usize = 16 << 20;
pub(super) const LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyz\n";

/// What `busybox yes <line> | head -c <n>` writes.
pub(super) fn pattern(line: &str, n: usize) -> Vec<u8> {
    let with_nl = format!("{line}\n");
    with_nl.bytes().cycle().take(n).collect()
}

/// A writer as fast as the machine goes, and two interleaved ones on stdout and stderr.
pub(super) fn fast_writer() -> String {
    format!("busybox yes {} | busybox head -c {BIG}", LINE.trim_end())
}

pub(super) fn interleaved_writers() -> String {
    format!(
        "busybox yes OUT | busybox head -c {HALF} & busybox yes ERR | busybox head -c {HALF} >&2; wait"
    )
}

/// `got` is exactly `want`; on a difference, says where (never prints megabytes).
pub(super) fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: {} bytes arrived, {} were written; they differ from byte {at} on",
        got.len(),
        want.len()
    );
}

/// The interleaved writers' streams each arrived whole (stderr may carry an engine's own
/// lines besides: each of the writer's lines is counted).
pub(super) fn assert_interleaved(what: &str, stdout: &[u8], stderr: &[u8]) {
    assert_same(&format!("{what} stdout"), stdout, &pattern("OUT", HALF));
    let errs = stderr
        .split(|b| *b == b'\n')
        .filter(|l| *l == b"ERR")
        .count();
    assert_eq!(
        errs,
        HALF / 4,
        "{what} stderr: {errs} of {} lines arrived ({} bytes)",
        HALF / 4,
        stderr.len()
    );
}

#[test]
fn podman_output_of_a_fast_writer_arrives_whole() {
    let Some(p) = podman() else { return };
    let out = p.oci(&["run", "--rm", IMAGE, "sh", "-c", &fast_writer()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), BIG, "bytes through podman");
    assert_same("podman stdout", &out.stdout, &pattern(LINE.trim_end(), BIG));
    let out = p.oci(&["run", "--rm", IMAGE, "sh", "-c", &interleaved_writers()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_interleaved("podman", &out.stdout, &out.stderr);
}

#[test]
fn ctr_output_of_a_fast_writer_arrives_whole() {
    let Some(c) = containerd_with_image() else {
        return;
    };
    let run = |id: &str, script: &str| c.run_on_cordon(&["--rm", IMAGE, id, "sh", "-c", script]);
    let out = run("c-big", &fast_writer());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), BIG, "bytes through ctr");
    assert_same("ctr stdout", &out.stdout, &pattern(LINE.trim_end(), BIG));
    let out = run("c-both", &interleaved_writers());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_interleaved("ctr", &out.stdout, &out.stderr);
}

/// Polls `podman logs` until `want` is in them (bounded).
pub(super) fn logs_until(p: &super::Podman, name: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = p.oci(&["logs", name]);
        let said = text(&out.stdout);
        if said.contains(want) || Instant::now() > deadline {
            return said;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn podman_kill_delivers_every_signal_as_itself() {
    let Some(p) = podman() else { return };
    // A trap per signal: each one the shell sees, it names. The shell is the container's
    // process (not its PID 1 here: the sandbox's reaper is), so it sees what is sent.
    let script = "for s in INT HUP QUIT USR1 USR2 WINCH 40; do trap \"echo got $s\" $s; done; \
                  echo ready; while :; do sleep 0.1; done";
    let name = "oci-signals";
    let out = p.oci(&["run", "-d", "--name", name, IMAGE, "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = logs_until(p, name, "ready");
    assert!(said.contains("ready"), "{said}");
    // By name, with and without SIG, and by number (USR2 is 12, 40 a real-time signal).
    for (signal, trap) in [
        ("INT", "INT"),
        ("SIGHUP", "HUP"),
        ("QUIT", "QUIT"),
        ("USR1", "USR1"),
        ("12", "USR2"),
        ("WINCH", "WINCH"),
        ("40", "40"),
    ] {
        let out = p.oci(&["kill", "--signal", signal, name]);
        assert!(out.status.success(), "{signal}: {}", text(&out.stderr));
        let said = logs_until(p, name, &format!("got {trap}\n"));
        assert!(
            said.contains(&format!("got {trap}\n")),
            "{signal} did not reach the workload: {said}"
        );
    }
    // A signal the workload does not trap ends it as that signal: TERM, 143.
    let out = p.oci(&["kill", "--signal", "TERM", name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["wait", name]);
    assert_eq!(text(&out.stdout).trim(), "143", "{}", text(&out.stderr));
    assert!(p.oci(&["rm", name]).status.success());
}

#[test]
fn podman_runs_a_container_and_an_exec_on_a_terminal() {
    let Some(p) = podman() else { return };
    let out = p.oci(&[
        "run",
        "--rm",
        "-t",
        IMAGE,
        "sh",
        "-c",
        "busybox tty; busybox stty size; [ -t 0 ] && [ -t 1 ] && echo both-terminals",
    ]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said} {}", text(&out.stderr));
    assert!(said.contains("/dev/pts/"), "{said}");
    assert!(said.contains("both-terminals"), "{said}");
    let name = "oci-tty-exec";
    let out = p.oci(&["run", "-d", "--name", name, IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["exec", "-t", name, "sh", "-c", "busybox tty; exit 4"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("/dev/pts/"),
        "{}",
        text(&out.stdout)
    );
    let _ = p.oci(&["rm", "-f", name]);
}

/// A bundle of the busybox root whose process runs on a terminal of `size`.
fn terminal_bundle(dir: &Path, script: &str, tier: Option<&str>) -> std::path::PathBuf {
    super::busybox_tar(dir);
    let mut config = serde_json::json!({
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs", "readonly": true},
        "process": {
            "terminal": true,
            "consoleSize": {"height": 33, "width": 101},
            "args": ["sh", "-c", script],
            "cwd": "/",
            "env": ["PATH=/bin"],
            "user": {"uid": 0, "gid": 0}
        },
        "linux": {"namespaces": [
            {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
            {"type": "mount"}
        ]}
    });
    if let Some(t) = tier {
        config["annotations"] = serde_json::json!({"cordon.tier": t});
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.to_path_buf()
}

/// Receives one descriptor (and the name that comes with it) on `sock`, as an engine's
/// console socket does.
fn receive_master(sock: &std::os::unix::net::UnixStream) -> (String, OwnedFd) {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::FromRawFd;
    let mut buf = [0u8; 4096];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .unwrap();
    let mut fd = None;
    for c in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(fds) = c {
            fd = fds.first().copied();
        }
    }
    let n = msg.bytes;
    let fd = fd.expect("no descriptor came with the console message");
    // SAFETY: the kernel installed this descriptor in this process with the message.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    (String::from_utf8_lossy(&buf[..n]).into_owned(), fd)
}

#[test]
fn the_console_socket_gets_the_master_of_a_terminal_the_workload_answers_on() {
    console_socket_round_trip(None);
}

/// `cordon-oci create --console-socket` of a bundle on `tier` (default: the container
/// tier): the master arrives on the socket, a line written to it reaches the workload, its
/// answer and the bundle's `consoleSize` come back (and, on the container tier, the
/// terminal's name inside is the one sent).
pub(super) fn console_socket_round_trip(tier: Option<&str>) {
    if !have("root", nix::unistd::geteuid().is_root())
        || !have("busybox", Path::new("/bin/busybox").is_file())
        || !super::init_beside()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = terminal_bundle(
        &dir.path().join("bundle"),
        "read line; echo \"got $line\"; busybox stty size; busybox tty",
        tier,
    );
    // Inside another tier the terminal is the tier's own, of another name.
    let same_name = tier.is_none();
    let state = dir.path().join("state");
    let config = super::node_config(dir.path(), &super::allow_rootfs(&bundle));
    let console = dir.path().join("console.sock");
    let listener = std::os::unix::net::UnixListener::bind(&console).unwrap();
    let oci = |args: &[&str]| {
        let log = std::fs::File::create(dir.path().join("oci.log")).unwrap();
        // The monitor outlives `create` and holds its stdio: a file, not a pipe.
        Command::new(OCI)
            .arg("--root")
            .arg(&state)
            .arg("--cordon-config")
            .arg(&config)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .unwrap()
    };
    let log = || std::fs::read_to_string(dir.path().join("oci.log")).unwrap_or_default();
    let created = oci(&[
        "create",
        "--bundle",
        bundle.to_str().unwrap(),
        "--console-socket",
        console.to_str().unwrap(),
        "tty1",
    ]);
    assert!(created.success(), "create: {}", log());
    let (sock, _) = listener.accept().unwrap();
    let (name, master) = receive_master(&sock);
    assert!(name.starts_with("/dev/pts/"), "{name:?}");
    let mut master = std::fs::File::from(master);
    master.write_all(b"hello\n").unwrap();
    assert!(oci(&["start", "tty1"]).success(), "start: {}", log());
    // Read the terminal until the workload has answered (bounded).
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let fd = master.try_clone().unwrap();
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    while Instant::now() < deadline {
        let said = text(&seen);
        if said.contains("got hello")
            && said.contains("33 101")
            && said.contains(if same_name {
                name.as_str()
            } else {
                "/dev/pts/"
            })
        {
            break;
        }
        let mut buf = [0u8; 4096];
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            // EIO: every slave end is closed (the workload ended).
            Err(_) => break,
        }
    }
    let said = text(&seen);
    assert!(said.contains("got hello"), "{said:?}");
    // The size the bundle asked for, and the terminal's name inside.
    assert!(said.contains("33 101"), "{said:?}");
    assert!(!same_name || said.contains(&name), "{said:?}");
    assert!(said.contains("/dev/pts/"), "{said:?}");
    // Ended: its state says so, and delete removes it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let st = Command::new(OCI)
            .arg("--root")
            .arg(&state)
            .args(["state", "tty1"])
            .output()
            .unwrap();
        if text(&st.stdout).contains("\"stopped\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(oci(&["delete", "--force", "tty1"]).success(), "{}", log());
}

#[test]
fn podman_runs_the_images_user_inside_the_sandbox() {
    let Some(p) = podman() else { return };
    let ids = "busybox id -u; busybox id -g; busybox id -G";
    let out = p.oci(&[
        "run",
        "--rm",
        "--user",
        "1234:2345",
        "--group-add",
        "3456",
        IMAGE,
        "sh",
        "-c",
        ids,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "1234\n2345\n2345 3456\n");
    // Root in the image is the sandbox's unprivileged user (id 0 is its agent's), and so is
    // group 0 beside another user.
    let out = p.oci(&["run", "--rm", IMAGE, "sh", "-c", ids]);
    assert_eq!(
        text(&out.stdout),
        "1000\n1000\n1000\n",
        "{}",
        text(&out.stderr)
    );
    let out = p.oci(&["run", "--rm", "--user", "1001:0", IMAGE, "sh", "-c", ids]);
    assert_eq!(
        text(&out.stdout),
        "1001\n1000\n1000\n",
        "{}",
        text(&out.stderr)
    );
    // An id the sandbox's user namespace does not map is refused with the reason.
    let out = p.oci(&["run", "--rm", "--user", "70000", IMAGE, "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("outside the sandbox's ids"),
        "{}",
        text(&out.stderr)
    );
    // An exec's own user.
    let name = "oci-user-exec";
    let out = p.oci(&["run", "-d", "--name", name, IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["exec", "--user", "4321:4322", name, "sh", "-c", ids]);
    assert_eq!(
        text(&out.stdout),
        "4321\n4322\n4322\n",
        "{}",
        text(&out.stderr)
    );
    let _ = p.oci(&["rm", "-f", name]);
}
