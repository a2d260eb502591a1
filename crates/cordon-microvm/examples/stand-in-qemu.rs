//! A stand-in for `qemu-system-x86_64`, started by the real launcher under the real
//! confinement in the microvm tier's tests: it plays an escaped or hostile QEMU (and the
//! guest agent behind it) without booting anything.
//!
//! It serves what Cordon expects of QEMU (the agent socket, QMP with `getfd`, `migrate`,
//! `query-migrate`) and of the agent (`Hello` on a cold boot, `Configure`, `Exec`,
//! `GetFile`). What it does beyond that is chosen by its file name (`qemu-<behaviour>`):
//! - `plant-symlink`: while saving a snapshot, puts a link to `../victim` (next to the
//!   stand-in's own directory) where a snapshot file would be, and `plant-file` a plain
//!   file saying `PLANTED`;
//! - `hang-template`: a template VM of more than 1 GiB of RAM never reaches its agent;
//! - `grow-ram`: while saving a snapshot, makes its RAM file (`/img/ram`) one page longer;
//! - `stall-even-uid`: a cold boot (template or not) run as an even uid never reaches its
//!   agent (the uid pool leases in order, so a boot and its retry get different parities);
//! - `slow-template`: a cold boot takes 1.5 s to reach its agent.
//!
//! Execs run probes named by their argv (see `exec`), reporting on stdout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use cordon_guest::proto::{self, ErrorCode, Reply, Request, Stream};

struct Args {
    agent: PathBuf,
    qmp: PathBuf,
    incoming: Option<String>,
    ram_mib: u64,
}

fn parse() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let mut a = Args {
        agent: PathBuf::new(),
        qmp: PathBuf::new(),
        incoming: None,
        ram_mib: 0,
    };
    let opt = |spec: &str, key: &str| -> Option<String> {
        spec.split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
    };
    let mut i = 1;
    while i + 1 < argv.len() {
        let (k, v) = (&argv[i], &argv[i + 1]);
        match k.as_str() {
            "-chardev" if v.contains("id=agent") => {
                a.agent = PathBuf::from(opt(v, "path").unwrap());
            }
            "-qmp" => {
                let path = v.trim_start_matches("unix:").split(',').next().unwrap();
                a.qmp = PathBuf::from(path);
            }
            "-incoming" => a.incoming = Some(v.clone()),
            "-m" => a.ram_mib = v.trim_end_matches('M').parse().unwrap_or(0),
            _ => {}
        }
        i += 1;
    }
    a
}

fn behaviour() -> String {
    let argv0 = std::env::args().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_prefix("qemu-").unwrap_or("").to_string()
}

fn victim() -> PathBuf {
    let argv0 = PathBuf::from(std::env::args().next().unwrap_or_default());
    argv0
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("victim"))
        .unwrap_or_default()
}

fn main() {
    if std::env::args().any(|a| a == "--version") {
        println!("QEMU emulator version 10.0.0 (Cordon test stand-in)");
        return;
    }
    let args = parse();
    let how = behaviour();
    let qmp = UnixListener::bind(&args.qmp).unwrap();
    {
        let how = how.clone();
        std::thread::spawn(move || {
            for conn in qmp.incoming().flatten() {
                let how = how.clone();
                std::thread::spawn(move || serve_qmp(conn, &how));
            }
        });
    }
    let agent = UnixListener::bind(&args.agent).unwrap();
    let (mut conn, _) = agent.accept().unwrap();
    if how == "hang-template" && args.incoming.is_none() && args.ram_mib > 1024 {
        loop {
            std::thread::park();
        }
    }
    if how == "stall-even-uid"
        && args.incoming.is_none()
        && nix::unistd::getuid().as_raw().is_multiple_of(2)
    {
        loop {
            std::thread::park();
        }
    }
    if how == "slow-template" && args.incoming.is_none() {
        std::thread::sleep(std::time::Duration::from_millis(1500));
    }
    if args.incoming.is_none() {
        send(
            &mut conn,
            &Reply::Hello {
                version: proto::PROTOCOL_VERSION,
                agent: "stand-in".into(),
            },
            b"",
        );
    }
    loop {
        let f = match proto::read_frame::<Request>(&mut conn) {
            Ok(f) => f,
            Err(_) => std::process::exit(0),
        };
        match f.header {
            Request::Configure { .. } => send(&mut conn, &Reply::Ok, b""),
            Request::Exec { id, argv, .. } => exec(&mut conn, id, &argv, &args),
            Request::GetFile { .. } => {
                // Far more than any maximum asked for.
                send(
                    &mut conn,
                    &Reply::File { truncated: false },
                    &vec![b'x'; 48 << 20],
                );
            }
            Request::Stdin { .. } | Request::Kill { .. } => {}
            _ => send(
                &mut conn,
                &Reply::Error {
                    code: ErrorCode::Io,
                    message: "not in the stand-in".into(),
                },
                b"",
            ),
        }
    }
}

fn send(conn: &mut UnixStream, r: &Reply, body: &[u8]) {
    if proto::write_frame(conn, r, body).is_err() {
        std::process::exit(0);
    }
}

fn exited(conn: &mut UnixStream, id: u64, code: i32) {
    send(
        conn,
        &Reply::Exited {
            id,
            code: Some(code),
            signal: None,
            cpu_us: 0,
            max_rss_bytes: 0,
            disk_full: false,
            oom_killed: false,
            pids_limited: false,
            program_us: 0,
        },
        b"",
    );
}

fn say(conn: &mut UnixStream, id: u64, text: &str) {
    send(
        conn,
        &Reply::Output {
            id,
            stream: Stream::Stdout,
        },
        text.as_bytes(),
    );
}

/// The probes an exec's argv names:
/// - `incoming`: the first line of the snapshot this VM was restored from;
/// - `stop-reading`: never reads the agent channel again;
/// - `stop-reading-after`: ends the exec, then never reads the agent channel again;
/// - `console-symlink-exit`: links the console log path to `../victim` and exits;
/// - `one-byte-frames N`: N output frames of one byte each;
/// - `connect PATH`: whether a unix socket can be connected to;
/// - `read PATH`: whether a file can be read (and its first bytes);
/// - `write PATH`: whether a file can be opened for writing (without creating it);
/// - `unlink PATH`: whether a file can be removed;
/// - `ls PATH`: a directory's entries;
/// - `whoami`: uid, pid and whether the process is dumpable;
/// - `syscall NAME`: makes a system call QEMU has no use for and reports its result;
/// - `eat-memory`: touches memory until the kernel kills the stand-in for its cgroup's
///   limit (a QEMU the host's memory limit ends mid-exec).
fn exec(conn: &mut UnixStream, id: u64, argv: &[String], args: &Args) {
    let arg = |i: usize| argv.get(i).cloned().unwrap_or_default();
    match arg(0).as_str() {
        "incoming" => {
            let text = match args.incoming.as_deref() {
                // `-incoming defer`: the launcher hands the snapshot as descriptor 3 and
                // names it in `migrate-incoming`.
                Some("defer") => {
                    // SAFETY: the launcher passed this descriptor to be read.
                    let f = unsafe { std::fs::File::from_raw_fd(3) };
                    first_line(f)
                }
                Some(s) if s.starts_with("fd:") => {
                    let fd: RawFd = s[3..].parse().unwrap();
                    // SAFETY: the launcher passed this descriptor to be read.
                    let f = unsafe { std::fs::File::from_raw_fd(fd) };
                    first_line(f)
                }
                Some(s) if s.starts_with("file:") => std::fs::File::open(&s[5..])
                    .map(first_line)
                    .unwrap_or_default(),
                _ => String::new(),
            };
            say(conn, id, &text);
            exited(conn, id, 0);
        }
        "stop-reading" => loop {
            std::thread::park();
        },
        "eat-memory" => {
            let mut kept: Vec<Vec<u8>> = Vec::new();
            loop {
                // Each page written, so the memory is charged to the cgroup.
                kept.push(vec![1u8; 16 << 20]);
                std::hint::black_box(&kept);
            }
        }
        "stop-reading-after" => {
            exited(conn, id, 0);
            loop {
                std::thread::park();
            }
        }
        "console-symlink-exit" => {
            let _ = std::fs::remove_file("console.log");
            let _ = std::os::unix::fs::symlink(victim(), "console.log");
            eprintln!("stand-in: exiting");
            std::process::exit(3);
        }
        "one-byte-frames" => {
            let n: usize = arg(1).parse().unwrap_or(0);
            for _ in 0..n {
                say(conn, id, "x");
            }
            exited(conn, id, 0);
        }
        "connect" => {
            let r = UnixStream::connect(arg(1));
            say(conn, id, &format!("{:?}", r.map(|_| "connected")));
            exited(conn, id, 0);
        }
        "read" => {
            let r = std::fs::read(arg(1))
                .map(|b| String::from_utf8_lossy(&b[..b.len().min(32)]).into_owned());
            say(conn, id, &format!("{r:?}"));
            exited(conn, id, 0);
        }
        "write" => {
            let r = std::fs::OpenOptions::new()
                .write(true)
                .open(arg(1))
                .map(|_| "opened for writing");
            say(conn, id, &format!("{r:?}"));
            exited(conn, id, 0);
        }
        "unlink" => {
            let r = std::fs::remove_file(arg(1)).map(|()| "removed");
            say(conn, id, &format!("{r:?}"));
            exited(conn, id, 0);
        }
        "ls" => {
            let r: Result<Vec<String>, _> = std::fs::read_dir(arg(1)).map(|rd| {
                let mut v: Vec<String> = rd
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            });
            say(conn, id, &format!("{r:?}"));
            exited(conn, id, 0);
        }
        "whoami" => {
            let dumpable = nix::sys::prctl::get_dumpable().unwrap_or(true);
            say(
                conn,
                id,
                &format!(
                    "uid={} pid={} dumpable={dumpable}",
                    nix::unistd::getuid(),
                    std::process::id()
                ),
            );
            exited(conn, id, 0);
        }
        "syscall" => {
            // SAFETY: a probe; `syslog(SYSLOG_ACTION_SIZE_BUFFER)` reads nothing into
            // memory, and `personality(0xffffffff)` only queries.
            let r = unsafe {
                match arg(1).as_str() {
                    "syslog" => libc::syscall(libc::SYS_syslog, 10, 0, 0),
                    _ => libc::syscall(libc::SYS_personality, 0xffff_ffffu64),
                }
            };
            let err = std::io::Error::last_os_error();
            say(
                conn,
                id,
                &format!("result={r} errno={}", err.raw_os_error().unwrap_or(0)),
            );
            exited(conn, id, 0);
        }
        _ => exited(conn, id, 127),
    }
}

fn first_line(f: std::fs::File) -> String {
    let mut line = String::new();
    let _ = BufReader::new(f.take(4096)).read_line(&mut line);
    line.trim().to_string()
}

fn serve_qmp(conn: UnixStream, how: &str) {
    let mut w = conn.try_clone().unwrap();
    let _ = w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n");
    let mut fd: Option<RawFd> = None;
    let mut buf = vec![0u8; 64 << 10];
    let mut pending = Vec::new();
    loop {
        // recvmsg, so that a descriptor sent with `getfd` arrives.
        let mut cmsg = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = match nix::sys::socket::recvmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(&conn),
            &mut iov,
            Some(&mut cmsg),
            nix::sys::socket::MsgFlags::empty(),
        ) {
            Ok(m) => m,
            Err(_) => return,
        };
        for c in msg.cmsgs().into_iter().flatten() {
            if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = c {
                fd = fds.first().copied();
            }
        }
        let n = msg.bytes;
        if n == 0 {
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
            let cmd = v["execute"].as_str().unwrap_or("");
            let reply = match cmd {
                "query-migrate" => serde_json::json!({"return": {"status": "completed"}}),
                "quit" => std::process::exit(0),
                "migrate" => {
                    let uri = v["arguments"]["uri"].as_str().unwrap_or("").to_string();
                    migrate(&uri, fd, how);
                    serde_json::json!({"return": {}})
                }
                _ => serde_json::json!({"return": {}}),
            };
            let _ = w.write_all(format!("{reply}\n").as_bytes());
        }
    }
}

/// Saves a "snapshot": the honest bytes through the channel Cordon gave, then (as another
/// escaped QEMU would) a planted link or file where a snapshot path would be.
fn migrate(uri: &str, fd: Option<RawFd>, how: &str) {
    let honest = b"FROM-THE-CHANNEL\n";
    let path = if let Some(p) = uri.strip_prefix("file:") {
        std::fs::write(p, honest).unwrap();
        PathBuf::from(p)
    } else {
        if let Some(fd) = fd {
            // SAFETY: the descriptor arrived with `getfd` and is ours.
            let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
            f.write_all(honest).unwrap();
        }
        PathBuf::from("snapshot")
    };
    // Best effort: under Cordon's confinement `symlink` and `rename` are not in the
    // allow-list at all.
    let tmp = path.with_extension("planted");
    let planted = match how {
        "plant-symlink" => {
            std::os::unix::fs::symlink(victim(), &tmp).and_then(|()| std::fs::rename(&tmp, &path))
        }
        "plant-file" => {
            std::fs::write(&tmp, b"PLANTED\n").and_then(|()| std::fs::rename(&tmp, &path))
        }
        "grow-ram" => std::fs::OpenOptions::new()
            .write(true)
            .open("/img/ram")
            .and_then(|f| {
                let len = f.metadata()?.len();
                f.set_len(len + 4096)
            }),
        _ => Ok(()),
    };
    if let Err(e) = planted {
        eprintln!("stand-in: could not plant: {e}");
    }
}
