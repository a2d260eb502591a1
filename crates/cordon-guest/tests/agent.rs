//! The agent as a process of its own, driven over its socket as a tier drives it.
//!
//! The test binary runs itself again as the agent (`agent_process`, which does nothing
//! unless `CORDON_AGENT_TEST_SOCKET` is set), so the agent's forks happen in a process of
//! their own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests panic on failure by design

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_guest::proto::{ProcLimits, Reply, Request, StdioMode, Stream, read_frame, write_frame};
use cordon_guest::{Agent, AgentConfig};

const SOCKET_VAR: &str = "CORDON_AGENT_TEST_SOCKET";
const WORK_VAR: &str = "CORDON_AGENT_TEST_WORK";

/// The agent's side: runs only when the test below starts this binary for it.
#[test]
fn agent_process() {
    let (Some(socket), Some(work)) = (std::env::var_os(SOCKET_VAR), std::env::var_os(WORK_VAR))
    else {
        return;
    };
    let cfg = AgentConfig {
        name: "agent-test".into(),
        uid: 65534,
        gid: 65534,
        workdir: PathBuf::from(work),
        scratch: Vec::new(),
        mount_proc: false,
        // The tier's confinement fails, as a Landlock or seccomp layer the kernel refused.
        confine: Some(Box::new(|| {
            Err(std::io::Error::other("refused on purpose"))
        })),
        winch_on_resize: false,
    };
    let sock = UnixStream::connect(socket).unwrap();
    let _ = Agent::new(cfg, sock).unwrap().serve();
    std::process::exit(0);
}

/// A program whose reaper could not take on the tier's confinement never runs, not even
/// the process forked ahead that the agent hands the job to itself: the exec fails with
/// the reason, and what the program would have done did not happen.
#[test]
fn a_program_never_runs_when_the_confinement_fails() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CORDON_REQUIRE_ALL").as_deref() != Ok("1"),
            "the agent test needs root (namespaces, setuid) under CORDON_REQUIRE_ALL=1"
        );
        eprintln!("SKIPPING: the agent test needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = dir.path().join("ran");
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "agent_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SOCKET_VAR, &socket)
        .env(WORK_VAR, &work)
        .spawn()
        .unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let hello = read_frame::<Reply>(&mut conn).unwrap();
    assert!(
        matches!(hello.header, Reply::Hello { .. }),
        "{:?}",
        hello.header
    );
    let mut stderr = Vec::new();
    for id in 1..=2u64 {
        write_frame(
            &mut conn,
            &Request::Exec {
                id,
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("touch {}", marker.display()),
                ],
                env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
                cwd: "/".into(),
                stdio: StdioMode::Framed,
                limits: ProcLimits {
                    open_files: 64,
                    file_size: 1 << 20,
                    address_space: 0,
                    processes: 0,
                },
                last: false,
            },
            b"",
        )
        .unwrap();
        write_frame(&mut conn, &Request::Stdin { id }, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let exited = loop {
            assert!(Instant::now() < deadline, "no exit for exec {id}");
            let f = read_frame::<Reply>(&mut conn).unwrap();
            match f.header {
                Reply::Output {
                    stream: Stream::Stderr,
                    ..
                } => stderr.extend(f.body),
                Reply::Exited { id: done, code, .. } if done == id => break code,
                Reply::Error { .. } => panic!("exec {id}: {:?}", f.header),
                _ => {}
            }
        };
        // The second exec takes a standby made after the first: both fail the same way.
        assert_eq!(exited, Some(125), "exec {id}");
    }
    let text = String::from_utf8_lossy(&stderr);
    assert!(text.contains("filters could not be applied"), "{text}");
    drop(conn);
    let _ = child.wait();
    // Give a program that escaped the failure every chance to have run.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !marker.exists(),
        "the program ran although the confinement failed"
    );
}
