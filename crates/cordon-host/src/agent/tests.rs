//! Tests of [`super`]: kept beside it, not inside it, so the module stays readable.

use super::*;

#[test]
fn a_peer_that_stops_reading_cannot_hold_a_send_past_its_deadline() {
    let (a, _b) = UnixStream::pair().unwrap();
    let mut c = AgentConn::new(a).unwrap();
    let body = vec![7u8; 8 << 20];
    let deadline = Instant::now() + Duration::from_millis(200);
    let r = c.send(&Request::Stdin { id: 1 }, &body, deadline);
    assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
}

#[test]
fn a_peer_that_dribbles_cannot_hold_a_receive_past_its_deadline() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mut c = AgentConn::new(a).unwrap();
    let frame = proto::encode(&Reply::Ok, b"").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    // One byte every 50 ms: each read succeeds, the frame never completes in time.
    let t = std::thread::spawn(move || {
        for byte in frame.iter().take(frame.len() - 1) {
            if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let _ = b.write_all(&[*byte]);
            std::thread::sleep(Duration::from_millis(50));
        }
        b
    });
    let deadline = Instant::now() + Duration::from_millis(150);
    let r = c.recv(deadline, 1 << 20);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
    drop(t.join());
}

/// Issue 49: every read zeroed a 256 KiB chunk first, so a 169-byte reply cost 64 page
/// faults and a 256 KiB memset on every `cordon run`'s path. A small reply now takes a
/// small buffer, and a large frame still arrives whole.
#[test]
fn a_small_reply_takes_a_small_buffer_and_a_large_frame_still_arrives() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mut c = AgentConn::new(a).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);
    b.write_all(&proto::encode(&Reply::Started { id: 7 }, b"").unwrap())
        .unwrap();
    let f = c.recv(deadline(), 1 << 20).unwrap();
    assert!(
        matches!(f.header, Reply::Started { id: 7 }),
        "{:?}",
        f.header
    );
    assert!(
        c.buf.capacity() <= 2 * SMALL_READ,
        "a {}-byte buffer for one small reply",
        c.buf.capacity()
    );
    // A frame larger than any one read, written from another thread as the reads go.
    let body: Vec<u8> = (0..3 * READ_CHUNK + 1234)
        .map(|i| (i % 251) as u8)
        .collect();
    let frame = proto::encode(&Reply::Ok, &body).unwrap();
    let writer = std::thread::spawn(move || b.write_all(&frame).map(|()| b));
    let f = c.recv(deadline(), 4 * READ_CHUNK).unwrap();
    assert!(matches!(f.header, Reply::Ok), "{:?}", f.header);
    assert_eq!(f.body, body);
    drop(writer.join().unwrap());
}

#[test]
fn an_oversized_frame_is_refused_from_its_length() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mut c = AgentConn::new(a).unwrap();
    // Only the length of a 48 MiB frame is sent: refused before any body is buffered.
    b.write_all(&((48u32 << 20) + 4).to_le_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = c.recv(deadline, (1 << 20) + HEADER_ROOM);
    assert!(matches!(r, Err(CallError::Proto(_))), "{r:?}");
}

#[test]
fn one_byte_frames_cost_the_same_per_frame() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mut c = AgentConn::new(a).unwrap();
    let one = proto::encode(
        &Reply::Output {
            id: 1,
            stream: proto::Stream::Stdout,
        },
        b"x",
    )
    .unwrap();
    let n = 20_000;
    let all: Vec<u8> = one.iter().copied().cycle().take(one.len() * n).collect();
    let w = std::thread::spawn(move || b.write_all(&all).map(|_| b));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = 0;
    let mut moved_max = 0;
    while got < n {
        let f = c.recv(deadline, 1 << 20).unwrap();
        assert_eq!(f.body, b"x");
        got += 1;
        moved_max = moved_max.max(c.buffered().1);
    }
    // The buffer never grows beyond one read and what was left of the last one.
    assert!(moved_max <= 3 * READ_CHUNK, "buffer grew to {moved_max}");
    drop(w.join());
}
/// The agent's end of a socket pair, played by a test thread.
struct Peer {
    sock: UnixStream,
    buf: proto::FrameBuffer,
}

impl Peer {
    fn read_request(&mut self) -> Request {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(f) = self.buf.next_frame::<Request>().unwrap() {
                return f.header;
            }
            let n = self.sock.read(&mut chunk).unwrap();
            assert!(n > 0, "the host closed the channel");
            self.buf.push(&chunk[..n]);
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).unwrap();
    }
}

/// An agent played by a thread on the other end of a socket pair: it does what
/// `script` says with the channel.
fn scripted_agent(
    script: impl FnOnce(&mut Peer) + Send + 'static,
) -> (AgentConn, std::thread::JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        script(&mut Peer {
            sock: b,
            buf: proto::FrameBuffer::default(),
        })
    });
    (AgentConn::new(a).unwrap(), t)
}

fn exec_request() -> Request {
    Request::Exec {
        id: 1,
        argv: vec!["x".into()],
        env: Default::default(),
        cwd: "/work".into(),
        stdio: proto::StdioMode::Framed,
        limits: proto::ProcLimits {
            open_files: 64,
            file_size: 1 << 20,
            address_space: 0,
            processes: 0,
        },
        last: false,
    }
}

fn exited(code: i32) -> Vec<u8> {
    proto::encode(
        &Reply::Exited {
            id: 1,
            code: Some(code),
            signal: None,
            cpu_us: 1,
            max_rss_bytes: 2,
            disk_full: false,
            oom_killed: false,
            pids_limited: false,
            program_us: 3,
        },
        b"",
    )
    .unwrap()
}

fn plan<'a>(req: &'a Request, kill: bool, timeout: Duration, cap: u64) -> FramedExec<'a> {
    FramedExec {
        id: 1,
        request: req,
        stdin: b"",
        deadline: Instant::now() + timeout,
        stdout_cap: cap,
        stderr_cap: cap,
        kill_at_deadline: kill,
        kill_grace: Duration::from_millis(300),
        tick: Duration::from_millis(100),
    }
}

/// Drives `plan` with no sink and no watch of the tier's.
fn quiet_run(conn: &mut AgentConn, plan: &FramedExec<'_>) -> Result<FramedRun, ExecError> {
    run_framed(conn, plan, &mut |_: OutputStream, _: &[u8]| {}, &mut || {
        None
    })
}

#[test]
fn output_is_relayed_within_its_cap_and_the_exit_reported() {
    let (mut conn, agent) = scripted_agent(|s| {
        assert!(matches!(s.read_request(), Request::Exec { id: 1, .. }));
        assert!(matches!(s.read_request(), Request::Stdin { id: 1 }));
        let out = Reply::Output {
            id: 1,
            stream: Stream::Stdout,
        };
        s.send(&proto::encode(&out, b"hello ").unwrap());
        s.send(&proto::encode(&out, b"world").unwrap());
        // Over the cap: the output limit stops the program with a kill.
        assert!(matches!(s.read_request(), Request::Kill { id: 1 }));
        s.send(&exited(137));
    });
    let req = exec_request();
    let mut seen = Vec::new();
    let mut sink = |_: OutputStream, d: &[u8]| seen.extend_from_slice(d);
    let run = run_framed(
        &mut conn,
        &plan(&req, true, Duration::from_secs(20), 8),
        &mut sink,
        &mut || None,
    )
    .unwrap();
    agent.join().unwrap();
    assert_eq!(run.stdout, b"hello wo");
    assert_eq!(seen, b"hello wo");
    assert!(run.stdout_truncated);
    assert_eq!(run.stopped, Some(Termination::OutputLimit));
    assert!(
        matches!(
            run.ended,
            Ended::Exited(Exit {
                code: Some(137),
                ..
            })
        ),
        "{run:?}"
    );
}

#[test]
fn passed_pipes_carry_stdin_and_output_that_arrives_after_the_exit() {
    use std::os::fd::RawFd;
    let (mut conn, agent) = scripted_agent(|peer| {
        // The request arrives with three descriptors attached to its first byte.
        let mut head = vec![0u8; 64 << 10];
        let mut space = nix::cmsg_space!([RawFd; 3]);
        let (n, fds) = {
            let mut iov = [io::IoSliceMut::new(&mut head)];
            let msg = nix::sys::socket::recvmsg::<()>(
                peer.sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::empty(),
            )
            .unwrap();
            let fds: Vec<RawFd> = msg
                .cmsgs()
                .unwrap()
                .flat_map(|c| match c {
                    nix::sys::socket::ControlMessageOwned::ScmRights(v) => v,
                    _ => Vec::new(),
                })
                .collect();
            (msg.bytes, fds)
        };
        assert_eq!(fds.len(), 3, "three descriptors come with the request");
        peer.buf.push(&head[..n]);
        assert!(matches!(peer.read_request(), Request::Exec { .. }));
        // Opened again by their /proc names (no unsafe adoption of raw descriptors),
        // then the received ones closed.
        let open = |fd: RawFd, write: bool| {
            let f = File::options()
                .read(!write)
                .write(write)
                .open(format!("/proc/self/fd/{fd}"))
                .unwrap();
            nix::unistd::close(fd).unwrap();
            f
        };
        let mut stdin = open(fds[0], false);
        let mut stdout = open(fds[1], true);
        let mut stderr = open(fds[2], true);
        let mut input = String::new();
        stdin.read_to_string(&mut input).unwrap();
        stdout.write_all(format!("got {input}").as_bytes()).unwrap();
        stderr.write_all(b"warn").unwrap();
        drop(stderr);
        // The end is reported before the last output arrives.
        peer.send(&exited(0));
        std::thread::sleep(Duration::from_millis(100));
        stdout.write_all(b" and late").unwrap();
    });
    let mut req = exec_request();
    if let Request::Exec { stdio, .. } = &mut req {
        *stdio = proto::StdioMode::Passed;
    }
    let mut p = plan(&req, true, Duration::from_secs(20), 1 << 20);
    p.stdin = b"hello";
    let run = quiet_run(&mut conn, &p).unwrap();
    agent.join().unwrap();
    assert!(
        matches!(&run.ended, Ended::Exited(e) if e.code == Some(0)),
        "{run:?}"
    );
    assert_eq!(run.stdout, b"got hello and late");
    assert_eq!(run.stderr, b"warn");
    assert_eq!(run.stopped, None);
}

#[test]
fn the_deadline_kills_the_program_or_abandons_the_sandbox() {
    let (mut conn, agent) = scripted_agent(|s| {
        s.read_request();
        s.read_request();
        assert!(matches!(s.read_request(), Request::Kill { id: 1 }));
        s.send(&exited(0));
    });
    let req = exec_request();
    let run = quiet_run(&mut conn, &plan(&req, true, Duration::from_millis(200), 64)).unwrap();
    agent.join().unwrap();
    assert_eq!(run.stopped, Some(Termination::Timeout));
    assert!(matches!(run.ended, Ended::Exited(_)), "{run:?}");

    // A tier that ends the sandbox at the deadline sends no kill.
    let (mut conn, agent) = scripted_agent(|s| {
        s.read_request();
        s.read_request();
        std::thread::sleep(Duration::from_millis(400));
    });
    let run = quiet_run(
        &mut conn,
        &plan(&req, false, Duration::from_millis(100), 64),
    )
    .unwrap();
    agent.join().unwrap();
    assert_eq!(run.stopped, Some(Termination::Timeout));
    assert!(matches!(run.ended, Ended::Abandoned), "{run:?}");
}

#[test]
fn an_agent_that_ignores_a_kill_is_given_up_on() {
    let (mut conn, agent) = scripted_agent(|s| {
        s.read_request();
        s.read_request();
        assert!(matches!(s.read_request(), Request::Kill { id: 1 }));
        // Says nothing more, and keeps the channel open past the grace.
        std::thread::sleep(Duration::from_millis(800));
    });
    let req = exec_request();
    let t = Instant::now();
    let mut calls = 0;
    // The tier's own watch stops the program (a fork bomb, say).
    let mut check = || {
        calls += 1;
        (calls > 2).then_some(Termination::ProcessLimit)
    };
    let run = run_framed(
        &mut conn,
        &plan(&req, true, Duration::from_secs(20), 64),
        &mut |_: OutputStream, _: &[u8]| {},
        &mut check,
    )
    .unwrap();
    assert_eq!(run.stopped, Some(Termination::ProcessLimit));
    assert!(matches!(run.ended, Ended::KillUnanswered), "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "held past the grace");
    agent.join().unwrap();
}

#[test]
fn a_closed_channel_is_lost_and_a_stray_reply_is_a_protocol_error() {
    let (mut conn, agent) = scripted_agent(|s| {
        s.read_request();
        s.read_request();
    });
    let req = exec_request();
    let run = quiet_run(&mut conn, &plan(&req, true, Duration::from_secs(20), 64)).unwrap();
    agent.join().unwrap();
    assert!(matches!(run.ended, Ended::Lost(_)), "{run:?}");

    let (mut conn, agent) = scripted_agent(|s| {
        s.read_request();
        s.read_request();
        s.send(&proto::encode(&Reply::File { truncated: false }, b"").unwrap());
        std::thread::sleep(Duration::from_millis(200));
    });
    let r = quiet_run(&mut conn, &plan(&req, true, Duration::from_secs(20), 64));
    agent.join().unwrap();
    assert!(matches!(r, Err(ExecError::Protocol(_))), "{r:?}");
}

#[test]
fn evidence_carries_the_stop_the_report_and_what_the_agent_found() {
    let run = |ended, stopped| FramedRun {
        ended,
        stopped,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
    };
    let reported = Exit {
        code: None,
        signal: Some(9),
        oom_killed: true,
        pids_limited: true,
        disk_full: true,
        ..Exit::default()
    };
    let e = run(Ended::Exited(reported), None).evidence();
    assert_eq!(
        e,
        Evidence {
            stopped: None,
            reported: Some(ExitReport {
                code: None,
                signal: Some(9),
            }),
            oom_killed: true,
            forks_refused: true,
            disk_full: true,
        }
    );
    assert_eq!(cordon_core::classify(&e), Termination::OutOfMemory);
    // No report: the agent was lost, whatever stopped the program.
    for ended in [
        Ended::Lost(CallError::Closed),
        Ended::KillUnanswered,
        Ended::Abandoned,
    ] {
        let e = run(ended, Some(Termination::Timeout)).evidence();
        assert!(e.agent_lost(), "{e:?}");
        assert_eq!(e.stopped, Some(Termination::Timeout));
        assert_eq!(cordon_core::classify(&e), Termination::Timeout);
    }
    let e = run(Ended::Lost(CallError::Closed), None).evidence();
    assert_eq!(cordon_core::classify(&e), Termination::SandboxFailure);
}

#[test]
fn languages_map_to_interpreters_and_refusals_name_the_tier() {
    let mut req = ExecRequest::code(Language::Bash, "echo $1");
    if let Command::Code { args, .. } = &mut req.command {
        args.push("x".into());
    }
    assert_eq!(
        argv_for(&req, Tier::Container, true).unwrap(),
        ["bash", "-c", "echo $1", "bash", "x"]
    );
    let js = ExecRequest::code(Language::Javascript, "1");
    assert_eq!(argv_for(&js, Tier::Container, true).unwrap()[0], "node");
    let err = argv_for(&js, Tier::Microvm, false).unwrap_err().to_string();
    assert!(err.contains("microvm"), "{err}");
    assert!(
        argv_for(
            &ExecRequest::argv(Vec::<String>::new()),
            Tier::Container,
            true
        )
        .is_err()
    );
    let refused = file_error("/etc/x", ErrorCode::PathRefused, "no".into());
    assert!(matches!(refused, Error::PathRefused { .. }));
}
