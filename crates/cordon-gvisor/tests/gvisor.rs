#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The gvisor tier end to end: functional behaviour, limits and their termination reasons,
//! egress through the proxy, the escape battery, and cleanup after a killed Cordon. Needs
//! runsc and root; without them every test prints a loud SKIPPING line (and fails under
//! CORDON_REQUIRE_ALL=1).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec,
    Termination, Tier,
};
use cordon_gvisor::{GvisorBackend, GvisorConfig};

fn config() -> GvisorConfig {
    let mut c = GvisorConfig::discover();
    c.agent = PathBuf::from(env!("CARGO_BIN_EXE_cordon-gvisor-agent"));
    c
}

fn backend() -> Option<&'static GvisorBackend> {
    static B: OnceLock<Option<GvisorBackend>> = OnceLock::new();
    B.get_or_init(|| {
        let b = GvisorBackend::new(config());
        let probe = b.probe();
        let missing: Vec<String> = probe
            .capabilities
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        if missing.is_empty() {
            return Some(b);
        }
        let msg = format!(
            "the gvisor tier cannot run fully here ({}); run scripts/setup.d/60-gvisor.sh as root",
            missing.join("; ")
        );
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{msg} (CORDON_REQUIRE_ALL=1)");
        }
        eprintln!("\n!!!!! SKIPPING gvisor tests: {msg} !!!!!\n");
        None
    })
    .as_ref()
}

macro_rules! need_backend {
    () => {
        match backend() {
            Some(b) => b,
            None => return,
        }
    };
}

fn spec() -> SandboxSpec {
    let mut s = SandboxSpec::new(Tier::Gvisor);
    s.limits.timeout_ms = 20_000;
    s
}

// What every native tier's suite runs alike (see `cordon_testkit::shared_tier_tests`). Here
// the escape battery's wall is gVisor's kernel: it answers the sandbox's calls, so what it
// serves inside (namespaces, io_uring, ptrace of its own processes) is its business; counts,
// families and FIFOs stay in it. A server on the sandbox's loopback lives in gVisor's
// netstack (runsc `--network=none`).
cordon_testkit::shared_tier_tests! {
    backend: need_backend!(),
    spec: spec,
    volume_rounds: 8,
}

fn exec(sb: &mut Box<dyn Sandbox>, req: &ExecRequest) -> ExecOutcome {
    sb.exec(req, &mut |_: OutputStream, _: &[u8]| {}).unwrap()
}

fn run(b: &GvisorBackend, spec: &SandboxSpec, req: ExecRequest) -> ExecOutcome {
    let mut sb = b.create(spec).unwrap();
    let o = exec(&mut sb, &req);
    sb.destroy().unwrap();
    o
}

fn sh(b: &GvisorBackend, script: &str) -> ExecOutcome {
    run(b, &spec(), ExecRequest::code(Language::Bash, script))
}

fn py(b: &GvisorBackend, code: &str) -> ExecOutcome {
    run(b, &spec(), ExecRequest::code(Language::Python, code))
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Every trace a sandbox can leave on the host: bundle, runsc state, cgroups.
fn traces_of(b: &GvisorBackend, id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let bundle = b.config().scratch_root.join(id);
    if bundle.exists() {
        found.push(bundle);
    }
    let owner = b.config().state_root.join("owners").join(id);
    if owner.exists() {
        found.push(owner);
    }
    for root in [b.config().state_root.clone()] {
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(id) {
                found.push(e.path());
            }
        }
    }
    for hier in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let parent = hier.path().join(cordon_gvisor::CGROUP_PARENT);
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(id) {
                found.push(e.path());
            }
        }
    }
    let direct = Path::new("/sys/fs/cgroup").join(cordon_gvisor::CGROUP_PARENT);
    for e in std::fs::read_dir(direct).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(id) {
            found.push(e.path());
        }
    }
    found
}

// ---------------------------------------------------------------- functional

#[test]
fn probe_names_the_tier() {
    let p = GvisorBackend::new(config()).probe();
    assert_eq!(p.tier, Tier::Gvisor);
    assert!(p.capabilities.iter().any(|c| c.name == "runsc"));
}

#[test]
fn true_exits_zero_and_status_propagates() {
    let b = need_backend!();
    let o = run(b, &spec(), ExecRequest::argv(["true"]));
    assert_eq!(
        (o.termination, o.exit_code),
        (Termination::Exited, Some(0)),
        "{o:?}"
    );
    let o = sh(b, "echo out; echo err >&2; exit 7");
    assert_eq!(o.exit_code, Some(7));
    assert_eq!(o.stdout, b"out\n");
    assert_eq!(o.stderr, b"err\n");
    let o = sh(b, "kill -TERM $$");
    assert_eq!(
        (o.termination, o.signal),
        (Termination::Signalled, Some(15)),
        "{o:?}"
    );
}

#[test]
fn timeout_and_output_limit_and_files() {
    let b = need_backend!();
    let mut spec = spec();
    spec.limits.timeout_ms = 500;
    spec.limits.stdout_bytes = 1000;
    // Both stop the container from the host; the sandbox lives on, and nothing of the
    // stopped containers is left once it is destroyed.
    let mut sb = b.create(&spec).unwrap();
    let id = sb.id().to_string();
    let o = exec(&mut sb, &ExecRequest::argv(["sleep", "10"]));
    assert_eq!(o.termination, Termination::Timeout);
    let o = exec(&mut sb, &ExecRequest::argv(["yes"]));
    assert_eq!(o.termination, Termination::OutputLimit);
    assert_eq!(o.stdout.len(), 1000);
    assert!(o.stdout_truncated);
    let o = exec(&mut sb, &ExecRequest::code(Language::Sh, "echo still"));
    assert_eq!(text(&o.stdout), "still\n");
    sb.destroy().unwrap();
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());

    spec.limits.timeout_ms = 20_000;
    let mut sb = b.create(&spec).unwrap();
    sb.put_file("/work/in.txt", b"41", 0o644).unwrap();
    let o = exec(
        &mut sb,
        &ExecRequest::code(
            Language::Sh,
            "echo $(( $(cat in.txt) + 1 )) > /work/out.txt; ln -s /etc/passwd /work/link",
        ),
    );
    assert!(o.success(), "{o:?}");
    assert_eq!(sb.get_file("/work/out.txt", 100).unwrap(), b"42\n");
    assert!(matches!(
        sb.get_file("/proc/self/environ", 100),
        Err(Error::PathRefused { .. })
    ));
    assert!(matches!(
        sb.get_file("/work/link", 100),
        Err(Error::PathRefused { .. })
    ));
    assert!(matches!(
        sb.put_file("/work/link", b"x", 0o644),
        Err(Error::PathRefused { .. })
    ));
    assert!(sb.put_file("/work/../etc/x", b"", 0o644).is_err());
    assert!(
        sb.get_file("/work/out.txt", 2).is_err(),
        "the size cap on files out"
    );
    sb.destroy().unwrap();
}

#[test]
fn file_api_round_trip_links_fifos_and_hostile_archives() {
    let b = need_backend!();
    let mut spec = spec();
    spec.limits.disk_bytes = 8 << 20;
    // Each part in a fresh sandbox: the batteries look at what /work holds.
    let mut sb = b.create(&spec).unwrap();
    cordon_testkit::files::round_trip(sb.as_mut());
    sb.destroy().unwrap();
    let mut sb = b.create(&spec).unwrap();
    cordon_testkit::files::planted_links(sb.as_mut(), false);
    sb.destroy().unwrap();
    let mut sb = b.create(&spec).unwrap();
    cordon_testkit::files::hostile_archives(sb.as_mut(), spec.limits.disk_bytes);
    sb.destroy().unwrap();
}

#[test]
fn memory_bomb_is_out_of_memory_and_modest_use_is_not() {
    let b = need_backend!();
    let mut s = spec();
    s.limits.memory_bytes = 192 << 20;
    let o = run(
        b,
        &s,
        ExecRequest::code(
            Language::Python,
            "x = bytearray(32 << 20); print('fits', len(x))",
        ),
    );
    assert_eq!(o.termination, Termination::Exited, "{o:?}");
    assert_eq!(text(&o.stdout), format!("fits {}\n", 32 << 20));
    let o = run(
        b,
        &s,
        ExecRequest::code(
            Language::Python,
            "x = []\nwhile True: x.append(bytearray(8 << 20))",
        ),
    );
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:?}");
    assert!(o.usage.peak_memory_bytes > 100 << 20, "{:?}", o.usage);
}

#[test]
fn fork_and_thread_bombs_stop_at_the_process_limit() {
    let b = need_backend!();
    let mut s = spec();
    s.limits.pids = 32;
    // Below the cap: no process-limit reason.
    let o = run(
        b,
        &s,
        ExecRequest::code(
            Language::Bash,
            "for i in $(seq 20); do sleep 0.2 & done; wait; echo ok",
        ),
    );
    assert_eq!(
        (o.termination, text(&o.stdout)),
        (Termination::Exited, "ok\n".into()),
        "{o:?}"
    );
    // A fork bomb whose processes all keep forking.
    let t = Instant::now();
    let o = run(
        b,
        &s,
        ExecRequest::code(
            Language::Python,
            "import os, time\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    time.sleep(0.01)",
        ),
    );
    assert_eq!(o.termination, Termination::ProcessLimit, "{o:?}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the bomb ran to its timeout"
    );
    // One that gives up at the first refusal, and a thread bomb.
    let o = run(
        b,
        &s,
        ExecRequest::code(Language::Python, "import os\nwhile True: os.fork()"),
    );
    assert_eq!(o.termination, Termination::ProcessLimit, "{o:?}");
    let o = run(
        b,
        &s,
        ExecRequest::code(
            Language::Python,
            "import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(5,), daemon=True).start()",
        ),
    );
    assert_eq!(o.termination, Termination::ProcessLimit, "{o:?}");
    // The host still forks.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn a_background_exec_right_after_a_foreground_one_gets_its_job() {
    let b = need_backend!();
    cordon_testkit::a_background_exec_right_after_a_foreground_one_gets_its_job(b, spec());
}

#[test]
fn a_background_exec_that_fills_the_disk_is_the_disk_limit() {
    let b = need_backend!();
    cordon_testkit::a_background_exec_that_fills_the_disk_is_the_disk_limit(b, spec());
}

#[test]
fn filling_the_workspace_is_the_disk_limit() {
    let b = need_backend!();
    let mut s = spec();
    s.limits.disk_bytes = 16 << 20;
    let mut sb = b.create(&s).unwrap();
    let o = exec(
        &mut sb,
        &ExecRequest::code(Language::Bash, "head -c 64M /dev/zero > /work/big"),
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:?}");
    let o = exec(
        &mut sb,
        &ExecRequest::code(Language::Bash, "rm /work/big; df -k /work | tail -1"),
    );
    assert!(o.success(), "{o:?}");
    // Room again after the file is gone, and /tmp is separate.
    let o = exec(
        &mut sb,
        &ExecRequest::code(
            Language::Bash,
            "head -c 1M /dev/zero > /work/small && echo ok",
        ),
    );
    assert_eq!(text(&o.stdout), "ok\n");
    sb.destroy().unwrap();
}

// ---------------------------------------------------------------- escape battery

// The probes list directories with shell globs: they ran on a runsc whose statx refused
// coreutils' flags (bookworm's 2022 build; setup now installs the 2024 one, below).

#[test]
fn coreutils_ls_and_stat_work() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    sb.put_file("/work/a.txt", b"12345", 0o644).unwrap();
    let o = exec(
        &mut sb,
        &ExecRequest::code(
            Language::Sh,
            "ls /work; stat -c '%s %a' /work/a.txt; ls -ld /usr | cut -c1",
        ),
    );
    assert_eq!(text(&o.stdout), "a.txt\n5 644\nd\n", "{o:?}");
    sb.destroy().unwrap();
}

#[test]
fn host_files_outside_the_root_are_not_visible() {
    let b = need_backend!();
    let canary = std::env::temp_dir().join(format!("cordon-gvisor-canary-{}", std::process::id()));
    std::fs::write(&canary, "host-canary-content").unwrap();
    let o = sh(
        b,
        &format!(
            "echo /etc/*; echo /*; echo /root/* /home/* /boot/* /var/*; cat {c};
             cat /etc/shadow; cat /proc/1/root/etc/shadow; cat /usr/../etc/shadow; cat /work/../../etc/shadow;
             echo /work/../*; cut -d' ' -f5 /proc/self/mountinfo | sort -u | tr '\\n' ' '; true",
            c = canary.display()
        ),
    );
    std::fs::remove_file(&canary).unwrap();
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    let mut lines = out.lines();
    // Cordon's files, and the host /etc entries /usr points into (when the host has them).
    let mut etc: Vec<String> = ["group", "hostname", "hosts", "nsswitch.conf", "passwd"]
        .into_iter()
        .chain(
            cordon_core::HOST_ETC
                .into_iter()
                .filter(|n| std::path::Path::new("/etc").join(n).exists()),
        )
        .map(|n| format!("/etc/{n}"))
        .collect();
    etc.sort();
    assert_eq!(lines.next(), Some(etc.join(" ").as_str()), "{out}");
    let top = "/bin /dev /etc /home /lib /lib64 /proc /run /sbin /sys /tmp /usr /work";
    assert_eq!(lines.next(), Some(top), "{out}");
    // Unexpanded globs: none of these directories exist (/home holds only E2B's home,
    // the workspace's second mount point).
    assert_eq!(
        lines.next(),
        Some("/root/* /home/user /boot/* /var/*"),
        "{out}"
    );
    assert!(!out.contains("host-canary-content"), "{out}");
    assert!(
        err.contains(&format!("{}: No such file", canary.display())),
        "{err}"
    );
    assert_eq!(err.matches("shadow: No such file").count(), 3, "{err}");
    assert!(err.contains("/proc/1/root/etc/shadow"), "{err}");
    let root = "bin dev etc home lib lib64 proc run sbin sys tmp usr work";
    let up: Vec<String> = root.split(' ').map(|d| format!("/work/../{d}")).collect();
    assert_eq!(
        lines.next(),
        Some(up.join(" ").as_str()),
        "/work/.. is not the sandbox root: {out}"
    );
    // Mount points are the sandbox's: no host path appears in the mount table.
    assert!(
        !out.contains("/work/main") && !out.contains("cordon-gvisor/sb-"),
        "{out}"
    );
    if let Ok(shadow) = std::fs::read_to_string("/etc/shadow") {
        let first = shadow.lines().next().unwrap_or_default();
        assert!(first.is_empty() || !out.contains(first));
    }
}

/// Runs in a child test process whose environment holds a canary; see the test below.
#[test]
fn canary_child() {
    if std::env::var_os(cordon_testkit::escape::CANARY_VAR).is_some() {
        let b = need_backend!();
        cordon_testkit::escape::env_canary_child(b, &spec());
    }
}

#[test]
fn env_canary_never_appears() {
    if backend().is_some() {
        cordon_testkit::escape::env_canary_parent("canary_child");
    }
}

#[test]
fn host_network_and_metadata_are_unreachable() {
    let b = need_backend!();
    cordon_testkit::escape::host_loopback_unreachable(
        b,
        &spec(),
        cordon_testkit::escape::Wall::of(cordon_core::Tier::Gvisor),
    );
    // The sandbox's loopback is its own: a port the host listens on is free in here, and a
    // connection to it inside reaches nothing of the host's.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let o = py(
        b,
        &format!(
            "import socket\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\nc = socket.create_connection(('127.0.0.1', {port}), timeout=2); print('own-loopback')"
        ),
    );
    assert_eq!(text(&o.stdout), "own-loopback\n", "{o:?}");
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    let o = sh(b, "env | grep -i proxy; true");
    assert_eq!(text(&o.stdout), "", "a closed sandbox has proxy variables");
}

/// Host-kernel features a sandbox must not reach. gVisor implements most system calls
/// itself; the ones below either do not exist in its kernel or need privileges the sandbox
/// user lacks. (io_uring is left out: gVisor serves it in its own kernel.)
#[test]
fn ptrace_reaches_only_the_sandbox() {
    let b = need_backend!();
    let mut victim = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let vpid = victim.id();
    let o = py(
        b,
        &format!(
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfor pid in ({vpid}, {me}, 1):\n  r = libc.ptrace(16, pid, 0, 0); print('attach', pid, 'OK' if r == 0 else ctypes.get_errno())\nr = libc.syscall(310, {vpid}, 0, 0, 0, 0, 0); print('vm_readv', ctypes.get_errno())\n",
            me = std::process::id()
        ),
    );
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("attach {vpid} 3")),
        "{out} {}",
        text(&o.stderr)
    );
    assert!(
        !out.contains(&format!("attach {} OK", std::process::id())),
        "{out}"
    );
    assert!(
        out.contains("vm_readv 3") || out.contains("vm_readv 1") || out.contains("vm_readv 38"),
        "{out}"
    );
    assert!(victim.try_wait().unwrap().is_none());
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn proc_of_pid_one_leads_back_into_the_sandbox() {
    let b = need_backend!();
    // pid 1 is the exec's reaper (the agent's fork, the sandbox's root inside gVisor):
    // /proc/1 is gVisor's, not the host's init, and the program (another uid, no
    // capabilities) cannot enter its root or read its memory. (This gVisor lets it read the
    // reaper's environment, which is the agent's fixed `PATH` and `HOME` and nothing else.)
    let o = sh(
        b,
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo /proc/1/root/*; cat /proc/self/root/etc/hostname; cat /proc/1/root/etc/shadow; cat /proc/1/mem >/dev/null 2>&1 && echo READ mem; tr '\\0' '\\n' < /proc/1/environ 2>/dev/null | grep -v -x -e PATH=/usr/bin:/bin -e HOME=/; true",
    );
    let out = text(&o.stdout);
    let mut lines = out.lines();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("/.cordon/agent ")),
        "{out}"
    );
    assert_eq!(lines.next(), Some("/proc/1/root/*"), "{out}");
    assert_eq!(lines.next(), Some("cordon"), "{out}");
    assert!(lines.next().is_none(), "{out}");
    assert!(
        text(&o.stderr).contains("/proc/1/root/etc/shadow"),
        "{}",
        text(&o.stderr)
    );
    // The kernel the sandbox sees is gVisor's, not the host's.
    let o = sh(b, "uname -r; cat /proc/version");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(o.success() && !o.stdout.is_empty(), "{o:?}");
    assert!(
        !text(&o.stdout).contains(host.trim()),
        "{}",
        text(&o.stdout)
    );
}

// ---------------------------------------------------------------- egress

// The egress checks are the container tier's, shared through cordon-testkit: the
// same proxy, the same allow-list and grant behaviour, here through runsc's host-UDS path.

#[test]
fn egress_reaches_allowed_hosts_through_the_proxy_only() {
    let b = need_backend!();
    cordon_testkit::egress::allowed_hosts_only(b, spec());
}

#[test]
fn egress_socket_is_per_sandbox_and_goes_with_it() {
    let b = need_backend!();
    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(&["example.invalid"]).unwrap();
    let mut sb = b.create(&s).unwrap();
    let id = sb.id().to_string();
    let dir = Path::new("/run/cordon/egress").join(&id);
    assert!(
        dir.join("egress.sock").exists(),
        "no proxy socket at {}",
        dir.display()
    );
    let o = exec(
        &mut sb,
        &ExecRequest::code(
            Language::Python,
            "import os, socket\nprint(sorted(os.listdir('/run/cordon')))\ns = socket.socket(); s.connect(('127.0.0.1', 3128)); print('forwarder-up')\nprint(os.environ['HTTP_PROXY'])",
        ),
    );
    assert_eq!(
        text(&o.stdout),
        "['egress.sock']\nforwarder-up\nhttp://127.0.0.1:3128\n",
        "{o:?}"
    );
    sb.destroy().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

fn egress_spec(allow: &[String]) -> SandboxSpec {
    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(allow).unwrap();
    s
}

#[test]
fn a_missing_agent_is_refused_without_naming_host_paths() {
    if backend().is_none() {
        return;
    }
    let mut c = config();
    c.agent = PathBuf::from("/nonexistent/dir/cordon-gvisor-agent");
    let b = GvisorBackend::new(c);
    for s in [spec(), egress_spec(&["example.com".to_string()])] {
        match b.create(&s) {
            Err(e @ Error::Unavailable { .. }) => {
                let shown = e.to_string();
                assert!(shown.contains("agent"), "{shown}");
                assert!(!shown.contains("/nonexistent"), "a host path: {shown}");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a sandbox ran without its agent"),
        }
    }
}

// ---------------------------------------------------------------- the live sandbox

/// The runsc processes that run a sandbox (its `runsc run`, sandbox, gofer).
fn runsc_processes_of(id: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(id))
                .unwrap_or(false)
        })
        .count()
}

#[test]
fn execs_run_in_one_live_sandbox() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    let id = sb.id().to_string();
    let started = runsc_processes_of(&id);
    assert!(
        started > 0,
        "no runsc process runs the sandbox after create"
    );
    // /tmp is the live sandbox's own: what one exec leaves there the next one finds (a
    // new runsc per exec would start every exec with an empty /tmp).
    let o = exec(
        &mut sb,
        &ExecRequest::code(Language::Sh, "echo kept > /tmp/mark"),
    );
    assert!(o.success(), "{o:?}");
    for _ in 0..5 {
        let o = exec(&mut sb, &ExecRequest::argv(["cat", "/tmp/mark"]));
        assert_eq!(text(&o.stdout), "kept\n", "{o:?}");
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    }
    assert_eq!(
        runsc_processes_of(&id),
        started,
        "execs started runsc processes"
    );
    // Each exec has its own PID namespace: nothing of the agent (or its forwarder) is
    // visible to a program.
    let o = exec(
        &mut sb,
        &ExecRequest::code(
            Language::Python,
            "import os\nps = [p for p in os.listdir('/proc') if p.isdigit()]\nagent = b'gvisor-' + b'agent'\nprint(len(ps) > 0, any(agent in open(f'/proc/{p}/cmdline', 'rb').read() for p in ps))",
        ),
    );
    assert_eq!(text(&o.stdout), "True False\n", "{o:?}");
    sb.destroy().unwrap();
    assert_eq!(runsc_processes_of(&id), 0, "runsc outlived the sandbox");
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

#[test]
fn a_sandbox_its_memory_limit_ended_starts_again_with_its_files() {
    let b = need_backend!();
    let mut s = spec();
    s.limits.memory_bytes = 192 << 20;
    let mut sb = b.create(&s).unwrap();
    let id = sb.id().to_string();
    sb.put_file("/work/keep.txt", b"still here", 0o644).unwrap();
    for _ in 0..2 {
        let o = exec(
            &mut sb,
            &ExecRequest::code(
                Language::Python,
                "x = []\nwhile True: x.append(bytearray(8 << 20))",
            ),
        );
        assert_eq!(o.termination, Termination::OutOfMemory, "{o:?}");
        let o = exec(&mut sb, &ExecRequest::argv(["cat", "/work/keep.txt"]));
        assert_eq!(text(&o.stdout), "still here", "{o:?}");
        assert!(o.success(), "{o:?}");
    }
    sb.destroy().unwrap();
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

#[test]
fn a_runsc_killed_under_a_sandbox_is_a_failure_then_a_fresh_start() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    let id = sb.id().to_string();
    sb.put_file("/work/keep.txt", b"kept", 0o644).unwrap();
    // Something outside Cordon kills the sandbox's runsc processes mid-exec.
    let killer = {
        let id = id.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            let _ = std::process::Command::new("pkill")
                .args(["-KILL", "-f", &id])
                .status();
        })
    };
    let o = exec(&mut sb, &ExecRequest::argv(["sleep", "10"]));
    killer.join().unwrap();
    assert_eq!(o.termination, Termination::SandboxFailure, "{o:?}");
    let o = exec(&mut sb, &ExecRequest::argv(["cat", "/work/keep.txt"]));
    assert_eq!(text(&o.stdout), "kept", "{o:?}");
    assert!(
        o.warnings.iter().any(|w| w.contains("started again")),
        "{:?}",
        o.warnings
    );
    sb.destroy().unwrap();
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

// ---------------------------------------------------------------- cleanup

#[test]
fn nothing_is_left_behind_after_destroy() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    let id = sb.id().to_string();
    let o = exec(
        &mut sb,
        &ExecRequest::code(Language::Bash, "sleep 100 & sleep 100 & echo started"),
    );
    assert_eq!(text(&o.stdout), "started\n");
    let mut t = ExecRequest::argv(["sleep", "100"]);
    t.timeout_ms = Some(300);
    assert_eq!(exec(&mut sb, &t).termination, Termination::Timeout);
    drop(sb);
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

/// Started by `a_killed_cordon_is_cleaned_up_by_the_next_one`: creates a sandbox, runs a
/// long program in it and waits to be SIGKILLed.
#[test]
fn killed_child() {
    if std::env::var_os("CORDON_TEST_KILLED_CHILD").is_none() {
        return;
    }
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    println!("SANDBOX {}", sb.id());
    std::io::stdout().flush().unwrap();
    let _ = exec(&mut sb, &ExecRequest::argv(["sleep", "60"]));
    panic!("the child was not killed");
}

#[test]
fn a_killed_cordon_is_cleaned_up_by_the_next_one() {
    let b = need_backend!();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "killed_child", "--nocapture", "--test-threads=1"])
        .env("CORDON_TEST_KILLED_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let id = loop {
        let line = lines.next().expect("the child said nothing").unwrap();
        // libtest prints "test killed_child ... " on the same line.
        if let Some((_, id)) = line.split_once("SANDBOX ") {
            break id.trim().to_string();
        }
    };
    // Wait until the container runs (runsc has state and the sandbox is in its cgroup).
    let started = Instant::now();
    let state = b
        .config()
        .state_root
        .join(format!("{id}-1_sandbox:{id}-1.state"));
    while !state.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the child's sandbox never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(!traces_of(b, &id).is_empty());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // What the dead process left: the bundle, its cgroup and, until runsc notices, state.
    let left = traces_of(b, &id);
    assert!(
        left.iter().any(|p| p.starts_with(&b.config().scratch_root)),
        "{left:?}"
    );
    // The next backend operation reaps it.
    let fresh = GvisorBackend::new(config());
    let o = run(&fresh, &spec(), ExecRequest::argv(["true"]));
    assert!(o.success(), "{o:?}");
    assert_eq!(
        traces_of(b, &id),
        Vec::<PathBuf>::new(),
        "left behind after the reap"
    );
    // No process of the dead sandbox survives: nothing on the host runs with its bundle.
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        assert!(
            !text(&cmd).contains(&id),
            "process {:?} of the dead sandbox still runs: {}",
            e.file_name(),
            text(&cmd)
        );
    }
}

/// Two Cordon processes with different data dirs share runsc's state root and the cgroup
/// parent but not their bundles: one's sweep must not take the other's live sandbox for an
/// orphan. Before, a sweep from another `$CORDON_HOME` killed every live sandbox of this one
/// (found by running the test suites side by side: `cordon bench` in one lost its gvisor
/// sandbox to a create in another).
#[test]
fn a_sweep_from_another_data_dir_spares_live_sandboxes() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    let other_home = tempfile::tempdir().unwrap();
    let mut c = config();
    c.scratch_root = other_home.path().join("scratch").join("gvisor");
    let other = GvisorBackend::new(c);
    let reaped = other.reap_orphans();
    assert!(
        !reaped.iter().any(|r| r.contains(sb.id().as_str())),
        "the other data dir's sweep reaped a live sandbox: {reaped:?}"
    );
    let o = exec(&mut sb, &ExecRequest::argv(["echo", "alive"]));
    assert!(o.success(), "{o:?}");
    assert_eq!(text(&o.stdout), "alive\n");
    // Its create, which sweeps too, leaves this one running as well.
    let o = run(&other, &spec(), ExecRequest::argv(["true"]));
    assert!(o.success(), "{o:?}");
    let o = exec(&mut sb, &ExecRequest::argv(["echo", "still"]));
    assert_eq!(text(&o.stdout), "still\n", "{o:?}");
    let id = sb.id().to_string();
    sb.destroy().unwrap();
    assert_eq!(traces_of(b, &id), Vec::<PathBuf>::new());
}

// ---------------------------------------------------------------- shared kernel, scratch

/// Runs `script` on the host as uid and gid 1000 (a login user here) with no groups.
fn as_user_1000(script: &str) -> String {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "--",
            "sh",
            "-c",
        ])
        .arg(script)
        .output()
        .expect("setpriv (util-linux) runs");
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// Another host user reaches nothing of a sandbox: not its bundle or config.json (its
/// environment and placeholders), not its /work, not its egress socket. The bundles live
/// in a directory of root's alone under the data dir. Before: under /tmp, config.json
/// world-readable, /work writable by uid 1000 and the proxy socket open to it.
#[test]
fn other_host_users_reach_nothing_of_a_sandbox() {
    let b = need_backend!();
    let scratch = &b.config().scratch_root;
    let mut sb = b
        .create(&egress_spec(&["example.invalid".to_string()]))
        .unwrap();
    let id = sb.id().to_string();
    let o = exec(
        &mut sb,
        &ExecRequest::code(Language::Sh, "echo secret > /work/mine; echo ok"),
    );
    assert_eq!(text(&o.stdout), "ok\n", "{o:?}");
    let bundle = scratch.join(&id);
    let socket = Path::new("/run/cordon/egress")
        .join(&id)
        .join("egress.sock");
    let probe = format!(
        "ls {b} >/dev/null 2>&1 && echo LISTED-BUNDLE\n\
         cat {b}/config.json >/dev/null 2>&1 && echo READ-CONFIG\n\
         cat {b}/work/mine >/dev/null 2>&1 && echo READ-WORK\n\
         touch {b}/work/planted 2>/dev/null && echo WROTE-WORK\n\
         python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' {s} 2>/dev/null && echo CONNECTED\n\
         echo probe-done",
        b = bundle.display(),
        s = socket.display()
    );
    let seen = as_user_1000(&probe);
    assert!(seen.contains("probe-done"), "{seen}");
    for reached in [
        "LISTED-BUNDLE",
        "READ-CONFIG",
        "READ-WORK",
        "WROTE-WORK",
        "CONNECTED",
    ] {
        assert!(!seen.contains(reached), "uid 1000: {reached}\n{seen}");
    }
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(scratch).unwrap();
        assert!(m.is_dir() && m.uid() == 0, "{}", scratch.display());
        assert_eq!(m.mode() & 0o777, 0o700, "{}", scratch.display());
        assert!(!scratch.starts_with(std::env::temp_dir()));
        let bundle = std::fs::metadata(scratch.join(&id)).unwrap();
        assert_eq!(bundle.mode() & 0o777, 0o700);
        let config = std::fs::metadata(scratch.join(&id).join("config.json")).unwrap();
        assert_eq!(config.mode() & 0o777, 0o600);
    }
    // The probe above is not vacuous: the socket is there and root reaches it.
    assert!(socket.exists());
    sb.destroy().unwrap();
}

/// A scratch directory someone else made first (to swap a bundle before runsc, as root,
/// reads it) is refused, not adopted and tightened. Before, it was taken as it was.
#[test]
fn a_scratch_dir_another_user_made_is_refused() {
    if backend().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("gvisor");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(1000), Some(1000)).unwrap();
    let mut c = config();
    c.scratch_root = theirs.clone();
    let b = GvisorBackend::new(c);
    match b.create(&spec()) {
        Err(Error::Unavailable { reason, fix, .. }) => {
            assert!(reason.contains("not root's alone"), "{reason}");
            assert!(fix.contains("remove"), "{fix}");
            assert!(
                !reason.contains(&dir.path().display().to_string()),
                "{reason}"
            );
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a scratch dir of uid 1000 was adopted"),
    }
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
}

/// Every exec's program holds no capability, not even in its bounding set: the first exec (its reaper made with the sandbox) and later ones (reapers
/// made after the agent emptied its own bounding set once, so each program only checks it).
#[test]
fn every_exec_runs_without_capabilities_and_an_empty_bounding_set() {
    let b = need_backend!();
    let mut sb = b.create(&spec()).unwrap();
    for round in 0..3 {
        let o = exec(
            &mut sb,
            &ExecRequest::code(
                Language::Sh,
                "grep -E '^(CapInh|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status",
            ),
        );
        let out = text(&o.stdout);
        for cap in ["CapInh", "CapEff", "CapPrm", "CapBnd"] {
            assert!(
                out.contains(&format!("{cap}:\t0000000000000000")),
                "exec {round}: {cap} not empty: {out}"
            );
        }
        // gVisor's kernel has no ambient set (no line); if it shows one, it is empty.
        assert!(
            !out.contains("CapAmb:") || out.contains("CapAmb:\t0000000000000000"),
            "exec {round}: {out}"
        );
        // Nor a NoNewPrivs line (the agent sets it all the same).
        assert!(
            !out.contains("NoNewPrivs:") || out.contains("NoNewPrivs:\t1"),
            "exec {round}: {out}"
        );
    }
    sb.destroy().unwrap();
}

/// Programs run as an id that no host account has (not uid 1000, a login user here), and
/// two live sandboxes run as different ids.
#[test]
fn programs_run_as_an_id_of_their_own() {
    let b = need_backend!();
    let mut one = b.create(&spec()).unwrap();
    let mut two = b.create(&spec()).unwrap();
    let uid_of = |sb: &mut Box<dyn Sandbox>| -> u32 {
        let o = exec(sb, &ExecRequest::code(Language::Sh, "id -u; id -g"));
        let ids: Vec<u32> = text(&o.stdout)
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert_eq!(ids.len(), 2, "{o:?}");
        assert_eq!(ids[0], ids[1], "{o:?}");
        ids[0]
    };
    let (a, c) = (uid_of(&mut one), uid_of(&mut two));
    assert_ne!(a, c);
    let accounts = std::fs::read_to_string("/etc/passwd").unwrap();
    for uid in [a, c] {
        assert!(uid != 0 && uid != 1000, "{uid}");
        assert!(
            !accounts
                .lines()
                .any(|l| l.split(':').nth(2) == Some(&uid.to_string())),
            "uid {uid} is a host account's"
        );
    }
    one.destroy().unwrap();
    two.destroy().unwrap();
}

/// A gVisor sandbox on a template: the template's tree is the root, its environment the
/// default one, Cordon's /etc over its own; writes land in the sandbox's own overlay (in the
/// sentry's memory), never in the template or a concurrent sandbox of it.
#[test]
fn a_template_is_the_root_and_writes_stay_in_the_sandbox() {
    let b = need_backend!();
    let Some(bb) = cordon_testkit::image::busybox_layer() else {
        let msg = "no /bin/busybox (apt-get install busybox-static); the template test cannot run";
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{msg} (CORDON_REQUIRE_ALL=1)");
        }
        eprintln!("\n!!!!! SKIPPING: {msg} !!!!!\n");
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let store = cordon_template::Store::open(home.path()).unwrap();
    let file = cordon_testkit::image::write_hostile_image(home.path(), bb);
    let m = store
        .import(&file, "hostile", &cordon_template::ImportLimits::default())
        .unwrap()
        .manifest;
    assert!(m.tiers.contains(&Tier::Gvisor));
    let mut s = spec();
    s.template = Some("hostile".into());
    store.resolve_spec(&mut s).unwrap();
    let root = s.resolved_template.as_ref().unwrap().root.clone();
    let listing = |dir: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing(&root);
    let mut a = b.create(&s).unwrap();
    let mut c = b.create(&s).unwrap();
    let sh = |sb: &mut Box<dyn Sandbox>, script: &str| {
        exec(sb, &ExecRequest::argv(["sh", "-c", script]))
    };
    let o = sh(
        &mut a,
        "cat /greeting.txt; echo \"$GREETING $HOME\"; grep -c sandbox /etc/passwd; \
         cat /etc/os-release; echo mine > /greeting-a; echo changed > /greeting.txt; \
         ls /usr 2>/dev/null | head -1; echo end",
    );
    let out = text(&o.stdout);
    assert_eq!(o.exit_code, Some(0), "{o:?} {}", text(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello from layer 1", "{out}");
    assert_eq!(lines[1], "from-the-image /work", "{out}");
    assert_eq!(lines[2], "1", "{out}");
    assert_eq!(lines[3], "ID=cordon-test", "{out}");
    assert_eq!(lines.last(), Some(&"end"), "{out}");
    let o = sh(
        &mut c,
        "cat /greeting.txt; ls /greeting-a 2>&1 || echo absent",
    );
    let out = text(&o.stdout);
    assert!(out.starts_with("hello from layer 1\n"), "{out}");
    assert!(out.contains("absent"), "{out}");
    let err = a
        .exec(
            &ExecRequest::code(Language::Python, "print(1)"),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("no python interpreter"), "{err}");
    a.destroy().unwrap();
    c.destroy().unwrap();
    assert_eq!(listing(&root), before, "the template's root changed");
    assert_eq!(
        std::fs::read(root.join("greeting.txt")).unwrap(),
        b"hello from layer 1\n"
    );
}

/// The escape battery on a template root: the host's Python and bash and a static busybox
/// imported as a template, then every case of `cordon_testkit::escape::BATTERY` held to this
/// tier's wall, as on the container tier; the template's tree is unchanged afterwards.
#[test]
fn escape_battery_on_a_template_root() {
    let b = need_backend!();
    let home = tempfile::tempdir().unwrap();
    let Some(file) = cordon_testkit::image::write_python_image(home.path()) else {
        return;
    };
    let store = cordon_template::Store::open(home.path()).unwrap();
    store
        .import(&file, "python", &cordon_template::ImportLimits::default())
        .unwrap();
    let mut s = spec();
    s.template = Some("python".into());
    store.resolve_spec(&mut s).unwrap();
    let root = s.resolved_template.as_ref().unwrap().root.clone();
    let count = |dir: &std::path::Path| {
        let mut n = 0usize;
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                n += 1;
                if e.file_type().unwrap().is_dir() {
                    todo.push(e.path());
                }
            }
        }
        n
    };
    let before = count(&root);
    // Python runs from the template (which has no apt-get), not from the host.
    let mut sb = b.create(&s).unwrap();
    let probe = "import os; print(os.path.exists('/usr/bin/apt-get'))";
    let o = exec(&mut sb, &ExecRequest::code(Language::Python, probe));
    assert_eq!(text(&o.stdout), "False\n", "{o:?}");
    sb.destroy().unwrap();
    cordon_testkit::escape::run_battery(b, &s);
    assert_eq!(count(&root), before, "the template's root changed");
}

/// Issue 44, item 1, end to end: a program in the sandbox turns `/work/p` from a directory
/// into a symlink to a host directory and back, over and over, while the host makes nested
/// directories, writes files and unpacks archives beneath `/work/p` through the tier's
/// file API. Nothing is made in the host directory. Before the walk by descriptors the
/// server's `mkdirat` on `p/...` followed the swapped-in symlink and made root-owned
/// directories there.
#[test]
fn a_sandbox_swapping_a_directory_for_a_host_link_makes_nothing_on_the_host() {
    let b = need_backend!();
    let outside = tempfile::tempdir().unwrap();
    let mut spec = spec();
    spec.limits.timeout_ms = 600_000;
    let mut sb = b.create(&spec).unwrap();
    // gVisor has no RENAME_EXCHANGE: `p` goes from the directory to nothing to the link
    // to nothing, by renames, a bounded number of times; whatever the host made at `p`
    // meanwhile is removed.
    let flipper = format!(
        "import os, shutil\n\
         os.mkdir('/work/p')\n\
         os.symlink({:?}, '/work/l')\n\
         def into_p(src):\n    \
             for _ in range(1000):\n        \
                 try:\n            \
                     return os.rename(src, '/work/p')\n        \
                 except OSError:\n            \
                     shutil.rmtree('/work/p', ignore_errors=True)\n    \
             os.rename(src, '/work/p')\n\
         for i in range(2_000_000):\n    \
             os.rename('/work/p', '/work/d')\n    \
             into_p('/work/l')\n    \
             os.rename('/work/p', '/work/l')\n    \
             into_p('/work/d')\n    \
             if i == 0:\n        \
                 open('/work/ready', 'w').close()\n",
        outside.path().display().to_string()
    );
    sb.put_file("/work/flip.py", flipper.as_bytes(), 0o644)
        .unwrap();
    let mut req = ExecRequest::code(Language::Bash, "exec python3 /work/flip.py");
    req.timeout_ms = Some(600_000);
    let id = sb.start_background(&req).unwrap();
    let mut polls = 0;
    while sb
        .file_op(&cordon_core::FileOp::Stat {
            path: "/work/ready".into(),
        })
        .is_err()
    {
        polls += 1;
        if polls > 600 {
            let out = sb.read_background(id, [0, 0], 4096);
            panic!("the flipping program never started: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    use cordon_testkit::files::{TarEntry, tarball};
    let tar = tarball(&[TarEntry::dir("t/u/"), TarEntry::file("t/x/f", b"hi")]);
    for i in 0..3_000 {
        // Each call succeeds or is refused, as the swap falls; neither matters here.
        let _ = sb.file_op(&cordon_core::FileOp::Mkdir {
            path: format!("/work/p/m{i}/a/b"),
            parents: true,
        });
        let _ = sb.put_file(&format!("/work/p/f{i}/a/f"), b"x", 0o644);
        let _ = sb.put_archive(&format!("/work/p/u{i}/a"), &mut &tar[..]);
    }
    // The program was still swapping at the end.
    let out = sb.read_background(id, [0, 0], 4096).unwrap();
    assert!(
        out.exit.is_none(),
        "the flipping program ended early: {out:?}"
    );
    sb.destroy().unwrap();
    let made: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        made.is_empty(),
        "the file API made {} entries in the host directory: {:?}",
        made.len(),
        &made[..made.len().min(10)]
    );
}

/// A full snapshot (runsc checkpoint, /work copied while paused) and three sandboxes
/// restored from it at once: the Python variable, the background counter and the file are in
/// each, a change in one is in no other nor in the source, and each restored process draws
/// its own random bytes.
#[test]
fn three_forks_of_a_full_snapshot_have_its_state_and_their_own() {
    let b = need_backend!();
    cordon_testkit::snapshot::three_forks(b, &spec(), None);
}

/// Sandboxes restored from a full snapshot each reach egress through a proxy of their own,
/// the source's being gone; a restored background process's connections go there too.
#[test]
fn forks_of_a_full_snapshot_have_their_own_egress() {
    let b = need_backend!();
    cordon_testkit::snapshot::forks_have_their_own_egress(b, spec());
}

/// Figures for ADR 0027 (run by hand: `cargo test -p cordon-gvisor --test gvisor --
/// --ignored --nocapture snapshot_figures`).
#[test]
#[ignore = "prints figures; run by hand"]
fn snapshot_figures() {
    let b = need_backend!();
    let mut s = spec();
    s.limits.memory_bytes = 1 << 30;
    let memory_of = |id: &cordon_core::SandboxId| {
        let cg = Path::new("/sys/fs/cgroup")
            .join(cordon_gvisor::CGROUP_PARENT)
            .join(format!("{id}-1"));
        ["memory.current", "memory.usage_in_bytes"]
            .iter()
            .find_map(|f| std::fs::read_to_string(cg.join(f)).ok())
            .or_else(|| {
                std::fs::read_to_string(
                    Path::new("/sys/fs/cgroup/memory")
                        .join(cordon_gvisor::CGROUP_PARENT)
                        .join(format!("{id}-1/memory.usage_in_bytes")),
                )
                .ok()
            })
            .and_then(|v| v.trim().parse().ok())
    };
    cordon_testkit::snapshot::figures(b, &s, 256, &memory_of);
}

/// A filesystem snapshot: the files, none of the processes, nothing back to the source.
#[test]
fn a_filesystem_snapshot_keeps_the_files_and_restarts_processes() {
    let b = need_backend!();
    cordon_testkit::snapshot::filesystem_snapshot_restarts_processes(b, &spec());
}
