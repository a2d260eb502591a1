//! The microvm tier's escape battery and failure reporting, run against real QEMU VMs
//! (under TCG on hosts without hardware KVM). Needs root, QEMU and a built image
//! (`cordon image build`); without them each test prints a loud SKIPPING line, or fails under
//! `CORDON_REQUIRE_ALL=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use cordon_core::{
    Error, ExecOutcome, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, Termination,
    Tier,
};
use cordon_microvm::{MicrovmBackend, MicrovmConfig, MicrovmSandbox};

struct Env {
    backend: MicrovmBackend,
    _tmp: tempfile::TempDir,
}

fn env() -> Option<Env> {
    let data = cordon_microvm::image::default_data_dir();
    let missing = if !nix::unistd::geteuid().is_root() {
        Some("not root".to_string())
    } else if !Path::new("/usr/bin/qemu-system-x86_64").exists() {
        Some("no qemu-system-x86_64".to_string())
    } else {
        cordon_microvm::image::load(&data)
            .err()
            .map(|e| e.to_string())
    };
    if let Some(why) = missing {
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("microvm tier unavailable under CORDON_REQUIRE_ALL=1: {why}");
        }
        eprintln!("SKIPPING microvm test: {why} (run scripts/setup.sh)");
        return None;
    }
    // Run directories and snapshots of these tests live in a temporary directory of their
    // own, so nothing of theirs can be left in the data directory.
    let tmp = tempfile::Builder::new()
        .prefix("cordon-mvt")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut cfg = MicrovmConfig::with_data_dir(data);
    cfg.run_dir = tmp.path().join("run");
    cfg.snapshot_dir = tmp.path().join("snapshots");
    Some(Env {
        backend: MicrovmBackend::new(cfg),
        _tmp: tmp,
    })
}

fn spec() -> SandboxSpec {
    let mut s = SandboxSpec::new(Tier::Microvm);
    s.limits.memory_bytes = 128 << 20;
    s.limits.disk_bytes = 64 << 20;
    s.limits.tmp_bytes = 16 << 20;
    s.limits.pids = 32;
    s.limits.timeout_ms = 60_000;
    s.limits.stdout_bytes = 64 << 10;
    s
}

fn run(sb: &mut MicrovmSandbox, lang: Language, src: &str) -> ExecOutcome {
    let mut sink = |_: OutputStream, _: &[u8]| {};
    sb.exec(&ExecRequest::code(lang, src), &mut sink).unwrap()
}

fn stdout(o: &ExecOutcome) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Destroys the sandbox and checks that nothing of it is left on the host.
fn destroy_and_check(mut sb: MicrovmSandbox) {
    let pid = sb.qemu_pid();
    let dir = sb.run_dir();
    sb.destroy().unwrap();
    if let Some(pid) = pid {
        assert!(!alive(pid), "QEMU {pid} still running after destroy");
    }
    if let Some(dir) = dir {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

fn finish(env: Env) {
    let run = env.backend.config().run_dir.clone();
    let left: Vec<_> = std::fs::read_dir(&run)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the run directory: {left:?}");
    env.backend.clear_snapshots().unwrap();
    assert!(!env.backend.config().snapshot_dir.exists());
}

#[test]
fn escape_battery() {
    let Some(env) = env() else { return };
    let mut sb = env.backend.create_restored(&spec()).unwrap();

    // Python runs, under the guest kernel, as the unprivileged sandbox user.
    let o = run(
        &mut sb,
        Language::Python,
        "import os, platform; print(platform.release(), os.getuid())",
    );
    assert!(o.success(), "{o:?}");
    assert!(stdout(&o).contains("cloud-amd64 1000"), "{}", stdout(&o));
    assert_eq!(o.tier, Tier::Microvm);

    // No host file is visible: a canary on the host is absent in the guest.
    let canary = format!("/tmp/cordon-host-canary-{}", std::process::id());
    std::fs::write(&canary, "host secret").unwrap();
    let o = run(
        &mut sb,
        Language::Bash,
        &format!(
            "test -e {canary} && echo VISIBLE; cat /proc/mounts | cut -d' ' -f2 | tr '\\n' ' '"
        ),
    );
    std::fs::remove_file(&canary).unwrap();
    assert!(!stdout(&o).contains("VISIBLE"));
    assert!(!stdout(&o).contains("/work/main"), "{}", stdout(&o));

    // The host environment never enters: only what the spec gives.
    let o = run(&mut sb, Language::Bash, "env");
    let manifest_dir = env!("CARGO_MANIFEST_DIR");
    assert!(!stdout(&o).contains(manifest_dir), "{}", stdout(&o));
    assert!(!stdout(&o).contains("CARGO"), "{}", stdout(&o));
    assert!(stdout(&o).contains("HOME=/work"));

    // No network: only loopback exists, and nothing outside answers.
    let o = run(
        &mut sb,
        Language::Python,
        "import os, socket\nprint(sorted(os.listdir('/sys/class/net')))\ntry:\n    socket.create_connection(('10.0.2.2', 80), timeout=2); print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)",
    );
    assert!(stdout(&o).contains("['lo']"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("CONNECTED"));

    // A fork bomb stops at the process limit inside the VM; the sandbox lives on.
    let mut bomb = ExecRequest::code(Language::Python, "import os\nwhile True: os.fork()");
    bomb.timeout_ms = Some(30_000);
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let o = sb.exec(&bomb, &mut sink).unwrap();
    assert_eq!(o.termination, Termination::ProcessLimit, "{o:?}");

    // A memory bomb is OOM-killed inside the VM; the sandbox lives on.
    let o = run(
        &mut sb,
        Language::Python,
        "x = []\nwhile True: x.append(bytearray(8 << 20))",
    );
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:?}");

    // The workspace's size limit holds.
    let o = run(
        &mut sb,
        Language::Bash,
        "head -c 100M /dev/zero > /work/big",
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:?}");
    run(&mut sb, Language::Bash, "rm -f /work/big");

    // Output beyond the cap stops the program.
    let o = run(&mut sb, Language::Bash, "yes cordon");
    assert_eq!(o.termination, Termination::OutputLimit, "{o:?}");
    assert!(o.stdout_truncated);

    // Files in and out; paths outside /work and symlinks are refused.
    sb.put_file("/work/in.txt", b"hello vm", 0o644).unwrap();
    let o = run(
        &mut sb,
        Language::Bash,
        "tr a-z A-Z < in.txt > out.txt; ln -s /etc/passwd link",
    );
    assert!(o.success(), "{o:?}");
    assert_eq!(sb.get_file("/work/out.txt", 1024).unwrap(), b"HELLO VM");
    assert!(matches!(
        sb.get_file("/etc/passwd", 1024),
        Err(Error::PathRefused { .. })
    ));
    assert!(matches!(
        sb.get_file("/work/link", 1024),
        Err(Error::PathRefused { .. })
    ));
    assert!(matches!(
        sb.put_file("/work/link", b"x", 0o644),
        Err(Error::PathRefused { .. })
    ));

    // A malformed frame (a length of 4 GiB) is rejected: the agent stops serving and the
    // sandbox is over, reported as a failure rather than obeyed.
    sb.send_raw(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let after = sb.exec(&ExecRequest::code(Language::Bash, "echo still"), &mut sink);
    if let Ok(o) = after {
        assert_eq!(o.termination, Termination::SandboxFailure, "{o:?}");
        assert!(!stdout(&o).contains("still"));
    }
    destroy_and_check(sb);
    finish(env);
}

#[test]
fn restored_sandboxes_are_distinct_and_timeout_kills_the_vm() {
    let Some(env) = env() else { return };
    let mut a = env.backend.create_restored(&spec()).unwrap();
    // `b` is made on a thread that then exits, as a server's worker threads do: QEMU's
    // parent-death signal must follow the process, not that thread.
    let mut b = std::thread::scope(|s| {
        s.spawn(|| env.backend.create_restored(&spec()).unwrap())
            .join()
            .unwrap()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let probe = "import os, socket; print(socket.gethostname(), os.urandom(16).hex())";
    let (oa, ob) = (
        run(&mut a, Language::Python, probe),
        run(&mut b, Language::Python, probe),
    );
    assert!(oa.success() && ob.success(), "{oa:?} {ob:?}");
    let (sa, sb_) = (stdout(&oa), stdout(&ob));
    let (ha, ra) = sa.trim().split_once(' ').unwrap();
    let (hb, rb) = sb_.trim().split_once(' ').unwrap();
    assert_ne!(ha, hb, "two sandboxes share a hostname");
    assert_ne!(ra, rb, "two sandboxes share their random stream");
    // One never sees the other's files.
    a.put_file("/work/secret", b"a's data", 0o600).unwrap();
    assert!(b.get_file("/work/secret", 64).is_err());
    destroy_and_check(b);

    // The wall clock kills the whole VM.
    let pid = a.qemu_pid().unwrap();
    let mut req = ExecRequest::code(Language::Bash, "sleep 100");
    req.timeout_ms = Some(2_000);
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let o = a.exec(&req, &mut sink).unwrap();
    assert_eq!(o.termination, Termination::Timeout);
    assert!(!alive(pid), "QEMU survived the timeout");
    assert!(matches!(
        a.exec(&ExecRequest::argv(["true"]), &mut sink),
        Err(Error::Gone { .. })
    ));
    destroy_and_check(a);
    finish(env);
}

#[test]
fn kernel_panic_and_qemu_crash_are_reported() {
    let Some(env) = env() else { return };
    // A guest kernel panic during an exec (an NMI the guest kernel panics on).
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    let qmp = sb.run_dir().unwrap().join("qmp.sock");
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let mut s = std::os::unix::net::UnixStream::connect(qmp).unwrap();
        use std::io::Write;
        s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"inject-nmi\"}\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let o = run(&mut sb, Language::Bash, "sleep 30");
    t.join().unwrap();
    assert_eq!(o.termination, Termination::SandboxFailure, "{o:?}");
    assert_eq!(sb.failure(), Some("guest-kernel-panic"), "{o:?}");
    destroy_and_check(sb);

    // QEMU itself dying.
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    let pid = sb.qemu_pid().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSEGV,
        );
    });
    let o = run(&mut sb, Language::Bash, "sleep 30");
    t.join().unwrap();
    assert_eq!(o.termination, Termination::SandboxFailure, "{o:?}");
    assert_eq!(sb.failure(), Some("vmm-crash"), "{o:?}");
    destroy_and_check(sb);

    // A cold boot (no snapshot) reaches the agent as well.
    let mut sb = env.backend.create_cold(&spec()).unwrap();
    let o = run(&mut sb, Language::Sh, "echo cold");
    assert_eq!(stdout(&o), "cold\n");
    destroy_and_check(sb);
    finish(env);
}
