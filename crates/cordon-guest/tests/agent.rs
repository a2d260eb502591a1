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
const MODE_VAR: &str = "CORDON_AGENT_TEST_MODE";

/// The agent's side: runs only when a test below starts this binary for it. Its
/// confinement hook, by `CORDON_AGENT_TEST_MODE`: `refuse` fails, as a Landlock or seccomp
/// layer the kernel refused; `order` fails only if the reaper calling it already has a
/// child, i.e. if a program process was forked before the confinement was applied.
#[test]
fn agent_process() {
    let (Some(socket), Some(work), Ok(mode)) = (
        std::env::var_os(SOCKET_VAR),
        std::env::var_os(WORK_VAR),
        std::env::var(MODE_VAR),
    ) else {
        return;
    };
    let confine: cordon_guest::agent::Confine = match mode.as_str() {
        "refuse" => Box::new(|| Err(std::io::Error::other("refused on purpose"))),
        "order" => Box::new(|| {
            let children = std::fs::read_to_string("/proc/thread-self/children")?;
            if children.trim().is_empty() {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "the reaper already has children ({}) when its confinement is applied",
                    children.trim()
                )))
            }
        }),
        other => panic!("unknown {MODE_VAR} {other}"),
    };
    let cfg = AgentConfig {
        name: "agent-test".into(),
        uid: 65534,
        gid: 65534,
        workdir: PathBuf::from(work),
        scratch: Vec::new(),
        mount_proc: false,
        boot_id: None,
        confine: Some(confine),
        winch_on_resize: false,
        standby_idle: None,
    };
    let sock = UnixStream::connect(socket).unwrap();
    let _ = Agent::new(cfg, sock).unwrap().serve();
    std::process::exit(0);
}

/// An agent process in `mode`, connected; `None` (skipped) without root.
struct Driven {
    dir: tempfile::TempDir,
    child: std::process::Child,
    conn: UnixStream,
}

/// True as root; otherwise a loud SKIPPING line for `what` (a failure under
/// CORDON_REQUIRE_ALL=1).
fn root_or_skip(what: &str, needs: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CORDON_REQUIRE_ALL").as_deref() != Ok("1"),
        "{what} needs root ({needs}) under CORDON_REQUIRE_ALL=1"
    );
    eprintln!("SKIPPING: {what} needs root");
    false
}

fn start_agent(mode: &str) -> Option<Driven> {
    if !root_or_skip("the agent test", "namespaces, setuid") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "agent_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SOCKET_VAR, &socket)
        .env(WORK_VAR, &work)
        .env(MODE_VAR, mode)
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
    Some(Driven { dir, child, conn })
}

impl Driven {
    /// Runs `script` under `/bin/sh -c` as exec `id`: its exit code, stdout and stderr.
    fn exec(&mut self, id: u64, script: &str) -> (Option<i32>, String, String) {
        let conn = &mut self.conn;
        write_frame(
            conn,
            &Request::Exec {
                id,
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
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
        write_frame(conn, &Request::Stdin { id }, b"").unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        let code = loop {
            assert!(Instant::now() < deadline, "no exit for exec {id}");
            let f = read_frame::<Reply>(conn).unwrap();
            match f.header {
                Reply::Output {
                    stream: Stream::Stdout,
                    ..
                } => out.extend(f.body),
                Reply::Output {
                    stream: Stream::Stderr,
                    ..
                } => err.extend(f.body),
                Reply::Exited { id: done, code, .. } if done == id => break code,
                Reply::Error { .. } => panic!("exec {id}: {:?}", f.header),
                _ => {}
            }
        };
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    fn finish(mut self) {
        drop(self.conn);
        let _ = self.child.wait();
    }
}

/// A program whose reaper could not take on the tier's confinement never runs, not even
/// the process forked ahead that the agent hands the job to itself: the exec fails with
/// the reason, and what the program would have done did not happen.
#[test]
fn a_program_never_runs_when_the_confinement_fails() {
    let Some(mut agent) = start_agent("refuse") else {
        return;
    };
    let marker = agent.dir.path().join("ran");
    let mut stderr = String::new();
    for id in 1..=2u64 {
        let (code, _, err) = agent.exec(id, &format!("touch {}", marker.display()));
        stderr.push_str(&err);
        // The second exec takes a standby made after the first: both fail the same way.
        assert_eq!(code, Some(125), "exec {id}: {err}");
    }
    assert!(stderr.contains("filters could not be applied"), "{stderr}");
    agent.finish();
    // Give a program that escaped the failure every chance to have run.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !marker.exists(),
        "the program ran although the confinement failed"
    );
}

/// The program's process (forked ahead, or at the job) exists only once the reaper's
/// confinement is on: the hook finds the reaper without children for every exec, so each
/// exec runs. A reaper that forked the program first fails these execs with the hook's
/// reason, which a fast kill of the early program would not hide.
#[test]
fn the_program_is_forked_only_after_the_confinement() {
    let Some(mut agent) = start_agent("order") else {
        return;
    };
    for id in 1..=3u64 {
        let (code, out, err) = agent.exec(id, "echo ran");
        assert_eq!((code, out.as_str()), (Some(0), "ran\n"), "exec {id}: {err}");
    }
    agent.finish();
}

const FLIP_VAR: &str = "CORDON_AGENT_TEST_FLIP";

/// The flipping process of `nested_file_calls_beside_a_flipped_symlink_stay_in_the_workspace`:
/// runs only when that test starts this binary for it. In the directory `CORDON_AGENT_TEST_FLIP`
/// it swaps `p` (a directory) and `q` (a symlink to a host directory) atomically, over and
/// over, as a sandbox process does in `/work`; it says `ready` after the first swap, and
/// stops after a bounded number of swaps or when its parent ends.
#[test]
fn flipper_process() {
    let Some(dir) = std::env::var_os(FLIP_VAR) else {
        return;
    };
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let dir = PathBuf::from(dir);
    let (p, q) = (dir.join("p"), dir.join("q"));
    for i in 0..200_000_000u64 {
        renameat2(AT_FDCWD, &p, AT_FDCWD, &q, RenameFlags::RENAME_EXCHANGE).unwrap();
        if i == 0 {
            println!("ready");
        }
    }
    std::process::exit(0);
}

/// A process flipping `work/p` and `work/q` (made by the caller) until killed; returns
/// once it has made its first swap.
fn start_flipper(work: &std::path::Path) -> std::process::Child {
    use std::io::BufRead;
    let mut flipper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "flipper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FLIP_VAR, work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(flipper.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the flipping process ended before its first swap"
        );
    }
    flipper
}

/// What is in `dir` (at most 10 names shown), asserting it is empty.
fn assert_empty(dir: &std::path::Path, what: &str) {
    let found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        found.is_empty(),
        "{what} made {} entries in the host directory the symlink points to: {:?}",
        found.len(),
        &found[..found.len().min(10)]
    );
}

/// An archive of two nested directories and a file in a third.
fn nested_archive() -> Vec<u8> {
    let mut archive = tar::Builder::new(Vec::new());
    for name in ["t/u/v/", "t/u/w/"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_cksum();
        archive.append_data(&mut h, name, std::io::empty()).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(2);
    h.set_cksum();
    archive.append_data(&mut h, "t/x/y/f", &b"hi"[..]).unwrap();
    archive.into_inner().unwrap()
}

/// The three calls with missing parents under `/work/p`, `n` times each (`i` from
/// `first`): whether each call of the last round succeeded.
fn nested_calls(ws: &cordon_guest::files::Workspace, first: u32, n: u32) -> [bool; 3] {
    let archive = nested_archive();
    let mut ok = [false; 3];
    for i in first..first + n {
        // Each call either succeeds (p was a directory at each step) or is refused (a
        // symlink was met); which one does not matter, where its directories went does.
        ok = [
            ws.mkdir(&format!("/work/p/m{i}/a/b"), true).is_ok(),
            ws.put(&format!("/work/p/f{i}/a/f"), 0o644, b"x").is_ok(),
            ws.unpack(&format!("/work/p/u{i}/a"), &mut &archive[..], 1 << 20)
                .is_ok(),
        ];
    }
    ok
}

/// Ends the flipping process and leaves `work/p` the directory.
fn stop_flipper(mut flipper: std::process::Child, work: &std::path::Path) {
    let _ = flipper.kill();
    let _ = flipper.wait();
    let p = work.join("p");
    if std::fs::symlink_metadata(&p)
        .unwrap()
        .file_type()
        .is_symlink()
    {
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        renameat2(
            AT_FDCWD,
            &p,
            AT_FDCWD,
            &work.join("q"),
            RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
    }
}

/// A sandbox process flipping `/work/p` between a directory and a symlink to a host
/// directory while the host makes nested directories, writes files and unpacks archives
/// beneath `/work/p` (10,000 calls of each kind): nothing is ever made in the host
/// directory. Before the walk by descriptors, `mkdirat` on `p/...` followed the symlink
/// swapped in after the check of `p`, and the host directory filled within seconds.
#[test]
fn nested_file_calls_beside_a_flipped_symlink_stay_in_the_workspace() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("p")).unwrap();
    std::os::unix::fs::symlink(outside.path(), work.path().join("q")).unwrap();
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let ws = cordon_guest::files::Workspace::open(work.path(), uid, gid).unwrap();
    let flipper = start_flipper(work.path());
    nested_calls(&ws, 0, 10_000);
    stop_flipper(flipper, work.path());
    assert_empty(outside.path(), "the file calls");
    // The same calls succeed once the flipping stops.
    assert_eq!(nested_calls(&ws, 10_000, 1), [true; 3]);
}

/// A workspace owned by the sandbox user 65534 and a host directory beside it; `None`
/// (skipped) without root.
fn confined_setup() -> Option<(tempfile::TempDir, std::path::PathBuf, tempfile::TempDir)> {
    if !root_or_skip("the confinement test", "mount namespaces") {
        return None;
    }
    let top = tempfile::tempdir().unwrap();
    let work = top.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700)).unwrap();
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&work, nobody, Some(nix::unistd::Gid::from_raw(65534))).unwrap();
    let outside = tempfile::tempdir().unwrap();
    Some((top, work, outside))
}

/// A confined call runs as the sandbox user without capabilities, sees the workspace as
/// `/` and nothing else of the host, and the rest of the process keeps its own view and
/// rights. A kernel path walk on that thread through a symlink to a host directory (what
/// `mkdirat` did before the walk by descriptors) stays in the workspace.
#[test]
fn a_confined_call_sees_only_the_workspace_as_the_sandbox_user() {
    use cordon_guest::confined::{ConfinedWorkspace, Wall};
    use nix::sys::stat::Mode;
    let Some((_top, work, outside)) = confined_setup() else {
        return;
    };
    let depth = "../".repeat(16);
    let relative = format!(
        "{depth}{}",
        outside.path().display().to_string().trim_start_matches('/')
    );
    std::os::unix::fs::symlink(outside.path(), work.join("abs")).unwrap();
    std::os::unix::fs::symlink(&relative, work.join("rel")).unwrap();
    let cw = ConfinedWorkspace::new(&work, 65534, 65534).unwrap();
    assert_eq!(cw.wall(), Wall::Namespace);
    let outside_path = outside.path().to_path_buf();
    let seen = cw
        .run(|_ws| {
            let caps = cordon_guest::sys::thread_capabilities().unwrap();
            let ids = (
                nix::unistd::getuid().as_raw(),
                nix::unistd::geteuid().as_raw(),
            );
            let gid = nix::unistd::getegid().as_raw();
            let mut root: Vec<String> = std::fs::read_dir("/")
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            root.sort();
            let host_visible = outside_path.exists() || std::path::Path::new("/proc/self").exists();
            // The kernel resolves these paths itself, following the links.
            let through_abs = nix::unistd::mkdir("/abs/made-abs", Mode::from_bits_truncate(0o755));
            let through_rel = nix::unistd::mkdir("/rel/made-rel", Mode::from_bits_truncate(0o755));
            let mounted = nix::mount::mount(
                Some("tmpfs"),
                "/",
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            );
            let chowned = nix::unistd::chown("/", Some(nix::unistd::Uid::from_raw(0)), None);
            Ok((
                caps,
                ids,
                gid,
                root,
                host_visible,
                through_abs,
                through_rel,
                mounted,
                chowned,
            ))
        })
        .unwrap();
    let (caps, ids, gid, root, host_visible, through_abs, through_rel, mounted, chowned) = seen;
    assert_eq!(caps, (0, 0), "effective and permitted capabilities");
    assert_eq!((ids, gid), ((65534, 65534), 65534));
    assert_eq!(root, ["abs", "rel"], "the confined thread's /");
    assert!(
        !host_visible,
        "host paths are visible to the confined thread"
    );
    assert!(
        through_abs.is_err() && through_rel.is_err(),
        "{through_abs:?} {through_rel:?}"
    );
    assert_eq!(mounted, Err(nix::errno::Errno::EPERM));
    assert_eq!(chowned, Err(nix::errno::Errno::EPERM));
    assert_empty(outside.path(), "the confined kernel walks");
    // The calling thread is untouched.
    assert!(nix::unistd::geteuid().is_root());
    assert_ne!(cordon_guest::sys::thread_capabilities().unwrap().0, 0);
    assert!(std::path::Path::new("/proc/self").exists());
    // Files made by a confined call are the sandbox user's.
    cw.put("/work/d/e/f", 0o600, b"x").unwrap();
    use std::os::unix::fs::MetadataExt;
    for p in ["d", "d/e", "d/e/f"] {
        let m = std::fs::metadata(work.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{p}");
    }
    assert_eq!(cw.get("/work/d/e/f", 10).unwrap(), (b"x".to_vec(), false));
    // Archives stream through: a refusal part way ends the upload (it used to hang with
    // the rest unread), a download comes out whole, a failing writer ends it.
    let garbage = vec![0xffu8; 4 << 20];
    let e = cw.unpack("/work", &mut &garbage[..], 1 << 30).unwrap_err();
    assert_eq!(e.0, cordon_guest::proto::ErrorCode::BadRequest, "{e:?}");
    let big = vec![b'y'; 3 << 20];
    cw.put("/work/d/big", 0o644, &big).unwrap();
    let mut tar = Vec::new();
    let r = cw.pack("/work/d", 1 << 30, &mut tar).unwrap();
    assert_eq!((r.files, r.bytes), (2, 1 + (3 << 20)));
    let e = cw
        .unpack("/work/copy", &mut &tar[..], 1 << 30)
        .map(|r| r.files);
    assert_eq!(e, Ok(2));
    assert_eq!(std::fs::read(work.join("copy/big")).unwrap(), big);
    let e = cw.pack("/work/d", 1 << 30, &mut Refusing).unwrap_err();
    assert!(e.1.contains("refused on purpose"), "{e:?}");
}

/// A writer that takes nothing.
struct Refusing;

impl std::io::Write for Refusing {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("refused on purpose"))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The race of issue 44 replayed inside the confinement with the old, vulnerable shape
/// (check that `p` is a directory, then `mkdirat` on `p/...`, which the kernel resolves
/// again) while a host process flips `p` with a symlink to a host directory: with the walk
/// by descriptors taken away, the confinement alone keeps every directory in the
/// workspace. The same loop unconfined (what the server did) makes them in the host
/// directory (459 of 10,000 when this test was written). The confined walk itself passes
/// the same race, archives included.
#[test]
fn the_confinement_alone_keeps_the_old_race_in_the_workspace() {
    use cordon_guest::confined::ConfinedWorkspace;
    use nix::fcntl::{AT_FDCWD, OFlag};
    use nix::sys::stat::Mode;
    let Some((_top, work, outside)) = confined_setup() else {
        return;
    };
    std::fs::create_dir(work.join("p")).unwrap();
    nix::unistd::chown(
        &work.join("p"),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), work.join("q")).unwrap();
    // The host directory is the sandbox user's too: only the mount namespace stands in
    // the way.
    nix::unistd::chown(
        outside.path(),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    let cw = ConfinedWorkspace::new(&work, 65534, 65534).unwrap();
    let flipper = start_flipper(&work);
    // The old make_dirs, by path from the workspace's root ("/" when confined).
    let old_shape = |root: &std::path::Path, n: u32| {
        for i in 0..n {
            let dir = nix::fcntl::open(
                &root.join("p"),
                OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY,
                Mode::empty(),
            );
            if dir.is_ok() {
                let _ = nix::sys::stat::mkdirat(
                    AT_FDCWD,
                    &root.join(format!("p/m{i}")),
                    Mode::from_bits_truncate(0o755),
                );
            }
        }
    };
    cw.run(|_ws| {
        old_shape(std::path::Path::new("/"), 10_000);
        Ok(())
    })
    .unwrap();
    cw.run(|ws| Ok(nested_calls(ws, 0, 2_000))).unwrap();
    stop_flipper(flipper, &work);
    assert_empty(outside.path(), "the confined calls");
    assert_eq!(
        cw.run(|ws| Ok(nested_calls(ws, 2_000, 1))).unwrap(),
        [true; 3]
    );
}

/// A process that may not make a mount namespace (here a thread that is no longer root:
/// credentials are per thread) confines its calls with Landlock: a path the kernel
/// resolves through a symlink to a host directory the sandbox user may write is refused,
/// and the calls themselves still work.
#[test]
fn an_unprivileged_process_confines_its_calls_with_landlock() {
    use cordon_guest::confined::{ConfinedWorkspace, Wall};
    let Some((_top, work, outside)) = confined_setup() else {
        return;
    };
    nix::unistd::chown(
        outside.path(),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), work.join("abs")).unwrap();
    let outside_path = outside.path().to_path_buf();
    std::thread::scope(|s| {
        s.spawn(|| {
            cordon_guest::sys::thread_set_ids(65534, 65534).unwrap();
            let cw = ConfinedWorkspace::new(&work, 65534, 65534).unwrap();
            assert_eq!(cw.wall(), Wall::Landlock);
            let (through, direct) = cw
                .run(|_ws| {
                    let mode = nix::sys::stat::Mode::from_bits_truncate(0o755);
                    Ok((
                        nix::unistd::mkdir(&work.join("abs/through-link"), mode),
                        nix::unistd::mkdir(&outside_path.join("direct"), mode),
                    ))
                })
                .unwrap();
            assert_eq!(through, Err(nix::errno::Errno::EACCES));
            assert_eq!(direct, Err(nix::errno::Errno::EACCES));
            cw.put("/work/a/b", 0o644, b"x").unwrap();
            assert_eq!(cw.get("/work/a/b", 10).unwrap(), (b"x".to_vec(), false));
            // The Landlock domain was the call's thread's alone: this one still writes there.
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o755);
            nix::unistd::mkdir(&outside_path.join("before"), mode).unwrap();
        })
        .join()
        .unwrap();
    });
    let made: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(made, ["before"]);
}
