//! The microvm tier's escape battery and failure reporting, run against real QEMU VMs
//! (under TCG on hosts without hardware KVM). Needs root, QEMU and a built image
//! (`cordon image build`); without them each test prints a loud SKIPPING line, or fails under
//! `CORDON_REQUIRE_ALL=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec,
    Termination, Tier,
};
use cordon_microvm::{EgressTuning, MicrovmBackend, MicrovmConfig, MicrovmSandbox};

struct Env {
    backend: MicrovmBackend,
    /// Whether its snapshot store is its own (else the data directory's, shared).
    private_snapshots: bool,
    _tmp: tempfile::TempDir,
}

fn env() -> Option<Env> {
    env_in(EgressTuning::default(), false)
}

fn env_with(tuning: EgressTuning) -> Option<Env> {
    env_in(tuning, false)
}

/// An environment with a snapshot store of its own, for tests that look into the store.
fn env_private() -> Option<Env> {
    env_in(EgressTuning::default(), true)
}

/// Run directories live in a temporary directory of the test's own, so nothing of theirs
/// can be left in the data directory. Snapshots are the data directory's store (a cache
/// the server and the CLI share, keyed by shape and locked per key), so the suite boots
/// one template VM per shape rather than one per test; `private` gives the test a store of
/// its own.
fn env_in(tuning: EgressTuning, private: bool) -> Option<Env> {
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
    if private {
        cfg.snapshot_dir = tmp.path().join("snapshots");
    }
    cfg.paused_dir = tmp.path().join("paused");
    cfg.egress_tuning = tuning;
    Some(Env {
        backend: MicrovmBackend::new(cfg),
        private_snapshots: private,
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
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                // The backend's own: the private roots' mount point and QEMU's binary copy.
                .filter(|p| !p.ends_with(".jail") && !p.ends_with(".qemu-bin"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the run directory: {left:?}");
    if env.private_snapshots {
        env.backend.clear_snapshots().unwrap();
        assert!(!env.backend.config().snapshot_dir.exists());
    }
}

/// The escape battery every native tier runs (`cordon_testkit::escape::BATTERY`), held to
/// this tier's wall: the guest has a kernel of its own, so only what needs its root is
/// checked there, and counts it holds, families it opens and FIFOs it makes stay in the VM.
#[test]
fn escape_battery_table() {
    let Some(env) = env() else { return };
    cordon_testkit::escape::run_battery(&env.backend, &spec());
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
    // The guest agent measures the program's own time, within the exec's.
    let t = &o.timings;
    assert!(t.program_us > 0 && t.program_us <= t.run_us, "{t:?}");

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
    // Room for the emulated guest to unwind 64 tracebacks while other suites share the
    // host's cores (`make test` runs them side by side): 30 s ran out once with the limit
    // long hit. The bomb ends by itself; the time is only a bound.
    bomb.timeout_ms = Some(120_000);
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
    // Outside /work the sandbox's own files are reached (ADR 0031), its kernel's are not.
    assert!(matches!(
        sb.get_file("/proc/self/environ", 1024),
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

// ---------------------------------------------------------------- egress

/// A resolver for the egress tests: names the tests use point at loopback, the metadata
/// address and a private address; nothing else resolves.
fn tuning(names: &[(&str, &str)], upstream_ca: Option<String>) -> EgressTuning {
    let resolver = cordon_egress::StaticResolver::new();
    for (name, ip) in names {
        resolver.set(name, &[ip.parse().unwrap()]);
    }
    EgressTuning(Some(std::sync::Arc::new(move |cfg| {
        cfg.resolver = Some(std::sync::Arc::new(resolver.clone()));
        if let Some(pem) = &upstream_ca {
            cfg.upstream_roots = cordon_egress::UpstreamRoots {
                system: false,
                extra_pem: vec![pem.clone()],
            };
        }
    })))
}

/// Python in the guest: `get(url, token)` returns (status, refusing rule, body) and never
/// raises.
const PY_GET: &str = r#"
import json, os, socket, sys, time, urllib.request, urllib.error
def get(url, token=None):
    h = {'Authorization': 'Bearer ' + token} if token else {}
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers=h), timeout=30)
        return [r.status, r.headers.get('x-cordon-rule', ''), r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.headers.get('x-cordon-rule', ''), e.read().decode()]
    except Exception as e:
        return [0, '', repr(e)]
"#;

fn json_out(o: &ExecOutcome) -> serde_json::Value {
    let text = stdout(o);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON from the guest ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Issue 47 on this tier: a server a background exec starts on the guest's loopback is
/// reached by a later exec; the forwarder's port stays its own; nothing gets out directly.
#[test]
fn own_loopback_servers_are_reached_and_the_proxy_port_is_held() {
    let Some(env) = env() else { return };
    cordon_testkit::egress::own_loopback_servers(&env.backend, spec());
}

#[test]
fn egress_reaches_only_allowed_hosts_through_the_proxy() {
    let Some(env) = env_with(tuning(
        &[
            ("meta.example.test", "169.254.169.254"),
            ("intranet.example.test", "10.1.2.3"),
            ("sneaky.example.test", "127.0.0.1"),
        ],
        None,
    )) else {
        return;
    };
    let up = cordon_testkit::egress::Upstream::start();
    let p = up.port;

    // Without an allow-list the VM's egress port leads nowhere: no forwarder, no variables.
    let mut closed = env.backend.create_restored(&spec()).unwrap();
    let o = run(
        &mut closed,
        Language::Python,
        &format!(
            "{PY_GET}\nprint(json.dumps({{'proxy': os.environ.get('HTTP_PROXY'), 'fwd': socket.socket().connect_ex(('127.0.0.1', 3128))}}))"
        ),
    );
    let v = json_out(&o);
    assert_eq!(v["proxy"], serde_json::Value::Null, "{v}");
    assert_ne!(v["fwd"], 0, "something listens on 3128 without egress: {v}");
    destroy_and_check(closed);

    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(&[
        format!("127.0.0.1/32:{p}"),
        "*.example.test".into(),
    ])
    .unwrap();
    let mut sb = env.backend.create_restored(&s).unwrap();
    let script = format!(
        r#"{PY_GET}
P = {p}
out = {{}}
out['allowed'] = get(f'http://127.0.0.1:{{P}}/vm')
out['other_port'] = get(f'http://127.0.0.1:{{P + 1}}/')
out['unlisted'] = get('http://elsewhere.test/')
out['metadata_ip'] = get('http://169.254.169.254/latest/meta-data/')
out['metadata_name'] = get('http://meta.example.test/latest/meta-data/')
out['private_name'] = get('http://intranet.example.test/')
out['loopback_name'] = get('http://sneaky.example.test/')
d = {{}}
for host, port in [('127.0.0.1', P), ('10.0.2.2', 80), ('169.254.169.254', 80), ('1.1.1.1', 443)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port)); d[f'{{host}}:{{port}}'] = 'CONNECTED'
    except OSError as e:
        d[f'{{host}}:{{port}}'] = e.errno
out['direct'] = d
out['net'] = sorted(os.listdir('/sys/class/net'))
t = []
for i in range(15):
    t0 = time.perf_counter(); get(f'http://127.0.0.1:{{P}}/t{{i}}'); t.append(time.perf_counter() - t0)
out['proxied_ms'] = sorted(t)[7] * 1000
import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'ok')
    def log_message(self, *a): pass
srv = http.server.HTTPServer(('127.0.0.1', 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
local = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
t = []
for i in range(15):
    t0 = time.perf_counter(); local.open(f'http://127.0.0.1:{{srv.server_port}}/').read(); t.append(time.perf_counter() - t0)
out['local_ms'] = sorted(t)[7] * 1000
print(json.dumps(out))
"#
    );
    let o = run(&mut sb, Language::Python, &script);
    let v = json_out(&o);
    eprintln!(
        "microvm egress: median urllib GET through the proxy {:.1} ms, to a server on the guest's own loopback {:.1} ms",
        v["proxied_ms"].as_f64().unwrap(),
        v["local_ms"].as_f64().unwrap()
    );
    // The allowed upstream answers through the proxy.
    assert_eq!(v["allowed"][0], 200, "{v}");
    assert_eq!(
        v["allowed"][2],
        cordon_testkit::egress::Upstream::BODY,
        "{v}"
    );
    // Everything else gets a 403 naming the rule that refused it.
    for (k, rule) in [
        ("other_port", "default-deny"),
        ("unlisted", "default-deny"),
        ("metadata_ip", "default-deny"),
        ("metadata_name", "address-guard"),
        ("private_name", "address-guard"),
        ("loopback_name", "address-guard"),
    ] {
        assert_eq!(v[k][0], 403, "{k}: {v}");
        let got = v[k][1].as_str().unwrap();
        assert!(got.starts_with(rule), "{k}: rule {got}, want {rule}: {v}");
        assert!(
            v[k][2].as_str().unwrap().contains("cordon egress: refused"),
            "{k}: {v}"
        );
    }
    // No route but the proxy: the guest's own loopback has nothing on the upstream's port,
    // and there is no other interface.
    assert_eq!(v["net"], serde_json::json!(["lo"]), "{v}");
    for (k, errno) in v["direct"].as_object().unwrap() {
        assert_ne!(errno, "CONNECTED", "direct connect to {k}: {v}");
    }
    assert_eq!(
        v["direct"][format!("127.0.0.1:{p}")],
        libc::ECONNREFUSED,
        "{v}"
    );
    assert_eq!(v["direct"]["10.0.2.2:80"], libc::ENETUNREACH, "{v}");
    // The upstream saw the allowed request and the latency loop, nothing refused.
    let seen = up.requests();
    assert!(seen[0].starts_with("GET /vm "), "{seen:?}");
    assert_eq!(seen.len(), 16, "{seen:?}");
    // Decisions are audited in the outcome.
    let events: Vec<serde_json::Value> = o
        .extra
        .egress
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert!(
        events.iter().filter(|e| e["decision"] == "deny").count() >= 6,
        "{events:?}"
    );
    destroy_and_check(sb);
    finish(env);
}

/// A TLS upstream on loopback for `name`, under a CA of its own; answers every request
/// with the `Authorization` header it got and records it.
struct TlsUpstream {
    port: u16,
    ca_pem: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

fn tls_upstream(name: &str) -> TlsUpstream {
    use std::io::{BufRead, BufReader, Write};
    let ca = cordon_testkit::tls::TestCa::new();
    let ca_pem = ca.pem.clone();
    let cfg = ca.server_config(&[name]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut auth = String::new();
            {
                let mut r = BufReader::new(&mut tls);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("authorization:") {
                        let start = line.len() - v.len();
                        auth = line[start..].trim().to_string();
                    }
                }
            }
            log.lock().unwrap().push(auth.clone());
            let body = format!("you sent: {auth}");
            let _ = write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    TlsUpstream { port, ca_pem, seen }
}

/// Whether a (large, binary) file holds `needle`; grep is far faster than a debug build.
fn file_contains(path: &Path, needle: &str) -> bool {
    std::process::Command::new("grep")
        .args(["-q", "-F", "-a", "--", needle])
        .arg(path)
        .status()
        .unwrap()
        .success()
}

#[test]
fn grant_is_swapped_only_for_its_host_and_the_secret_never_enters_the_vm() {
    const HOST: &str = "api.grant.test";
    let tls = tls_upstream(HOST);
    let Some(env) = env_with(tuning(&[(HOST, "127.0.0.1")], Some(tls.ca_pem.clone()))) else {
        return;
    };
    let plain = cordon_testkit::egress::Upstream::start();
    let mut raw = [0u8; 18];
    getrandom::fill(&mut raw).unwrap();
    let secret = format!("ghp_{}", hex::encode(raw));
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, &secret).unwrap();
    let (p, q) = (tls.port, plain.port);
    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(&[
        format!("{HOST}:{p}"),
        format!("127.0.0.1/32:{p}"),
        format!("127.0.0.1/32:{q}"),
    ])
    .unwrap();
    s.grants.push(cordon_core::Grant {
        name: "github".into(),
        env_var: "GITHUB_TOKEN".into(),
        secret: cordon_core::GrantSecret::value(std::fs::read(&secret_file).unwrap()),
        hosts: vec![HOST.parse().unwrap()],
        header: "authorization".into(),
        methods: vec![],
        path_prefixes: vec![],
    });
    let mut sb = env.backend.create_restored(&s).unwrap();
    let script = format!(
        r#"{PY_GET}
tok = os.environ['GITHUB_TOKEN']
out = {{'token': tok}}
out['granted'] = get('https://{HOST}:{p}/user', tok)
out['exfil'] = get('http://127.0.0.1:{q}/steal', tok)
out['ca'] = open(os.environ['SSL_CERT_FILE']).read(64)
print(json.dumps(out))
"#
    );
    let o = run(&mut sb, Language::Python, &script);
    let v = json_out(&o);
    let ph = v["token"].as_str().unwrap().to_string();
    assert!(ph.starts_with("cordon-ph-") && ph != secret, "{v}");
    // The granted host got the real secret; the sandbox saw its echo masked.
    assert_eq!(v["granted"][0], 200, "{v}");
    assert_eq!(
        tls.seen.lock().unwrap().clone(),
        vec![format!("Bearer {secret}")]
    );
    assert!(
        v["granted"][2]
            .as_str()
            .unwrap()
            .starts_with("you sent: Bearer ****"),
        "{v}"
    );
    // The placeholder on its way to another (allowed) host is refused and audited.
    assert_eq!(v["exfil"][0], 403, "{v}");
    assert!(plain.requests().is_empty(), "{:?}", plain.requests());
    let events: Vec<serde_json::Value> = o
        .extra
        .egress
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e["decision"] == "exfiltration"),
        "{events:?}"
    );
    assert!(
        v["ca"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );

    // Everything a program in the VM can read: its environment, every process's, the files
    // Cordon wrote and the writable trees.
    let o = run(
        &mut sb,
        Language::Bash,
        "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; find /run /work /tmp /dev/shm -type f -exec cat {} + 2>/dev/null; true",
    );
    assert!(stdout(&o).contains(&ph), "the probe saw nothing");
    assert!(
        !stdout(&o).contains(&secret),
        "the real secret is visible in the VM"
    );
    // And the guest's whole RAM: the placeholder is there (the dump is real), the secret
    // never.
    let dump = sb.dump_guest_memory().unwrap();
    let size = std::fs::metadata(&dump).unwrap().len();
    assert!(size >= 256 << 20, "dump of {size} bytes");
    let (has_ph, has_secret) = (file_contains(&dump, &ph), file_contains(&dump, &secret));
    std::fs::remove_file(&dump).unwrap();
    assert!(has_ph, "placeholder not in the memory dump");
    assert!(!has_secret, "the real secret is in the guest's memory");
    destroy_and_check(sb);
    finish(env);
}

/// A service destroying a busy sandbox calls its interrupter: the running exec ends at
/// once instead of at its timeout, and destroy then leaves nothing behind.
#[test]
fn interrupter_ends_a_running_exec_at_once() {
    let Some(env) = env() else { return };
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    let interrupt = sb
        .interrupter()
        .expect("the microvm tier has an interrupter");
    let started = std::time::Instant::now();
    let o = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut req = ExecRequest::code(Language::Bash, "sleep 100");
            req.timeout_ms = Some(60_000);
            let mut sink = |_: OutputStream, _: &[u8]| {};
            sb.exec(&req, &mut sink)
        });
        std::thread::sleep(std::time::Duration::from_millis(1500));
        interrupt();
        h.join().unwrap()
    });
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(30),
        "the exec ran {took:?}: the interrupter did not end it"
    );
    match o {
        Ok(o) => assert_ne!(o.termination, Termination::Exited, "{o:?}"),
        Err(e) => assert!(matches!(e, Error::Gone { .. } | Error::Sandbox(_)), "{e:?}"),
    }
    destroy_and_check(sb);
    finish(env);
}

/// The proxy's per-sandbox limits hold for traffic that comes out of a VM: a request cap
/// answers 429 with its rule, and a download over the byte budget is cut and audited.
#[test]
fn egress_limits_hold_through_the_vm_tunnel() {
    let base = tuning(&[], None);
    let limited = EgressTuning(Some(std::sync::Arc::new(move |cfg| {
        if let Some(f) = &base.0 {
            f(cfg);
        }
        cfg.limits.max_requests = Some(3);
        cfg.limits.max_bytes_down = 50_000;
    })));
    let Some(env) = env_with(limited) else { return };
    let up = cordon_testkit::egress::Upstream::start();
    let p = up.port;
    let mut s = spec();
    s.egress.allow = vec![format!("127.0.0.1/32:{p}").parse().unwrap()];

    // Requests: three answered, the fourth refused by the cap.
    let mut sb = env.backend.create_restored(&s).unwrap();
    let o = run(
        &mut sb,
        Language::Python,
        &format!(
            "{PY_GET}\nprint(json.dumps([get(f'http://127.0.0.1:{p}/r{{i}}') for i in range(4)]))"
        ),
    );
    let v = json_out(&o);
    for i in 0..3 {
        assert_eq!(v[i][0], 200, "request {i}: {v}");
    }
    assert_eq!(v[3][0], 429, "{v}");
    assert_eq!(v[3][1], "limit:requests", "{v}");
    destroy_and_check(sb);

    // Bytes down: a 200 kB download against a 50 kB budget is cut at the budget. The
    // upstream is a real HTTP server on the host's loopback sending the whole body.
    let big = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bp = big.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        for conn in big.incoming().take(4) {
            let Ok(mut conn) = conn else { continue };
            let mut r = std::io::BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let body = vec![b'x'; 200_000];
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body);
        }
    });
    s.egress.allow = vec![format!("127.0.0.1/32:{bp}").parse().unwrap()];
    let mut sb = env.backend.create_restored(&s).unwrap();
    let o = run(
        &mut sb,
        Language::Python,
        &format!(
            r#"{PY_GET}
try:
    r = urllib.request.urlopen('http://127.0.0.1:{bp}/big', timeout=30)
    out = [r.status, len(r.read())]
except Exception as e:
    out = [0, repr(e)]
print(json.dumps(out))"#
        ),
    );
    let v = json_out(&o);
    assert_ne!(
        v[1], 200_000,
        "a 200 kB download passed a 50 kB budget: {v}"
    );
    let events: Vec<serde_json::Value> = o
        .extra
        .egress
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["rule"].as_str() == Some("limit:bytes_down")),
        "no limit:bytes_down event: {events:?}"
    );
    destroy_and_check(sb);
    finish(env);
}

// ------------------------------------------------- a hostile QEMU (the stand-in)

/// A backend whose "QEMU" is the stand-in (`examples/stand-in-qemu.rs`, built by `cargo
/// test`) under the name `qemu-<behaviour>`, started by the real launcher under the real
/// confinement, with a fake image. Next to its `bin/` directory lies `victim`: a root-only
/// file the stand-in points links at.
struct StandIn {
    backend: MicrovmBackend,
    tmp: tempfile::TempDir,
}

const VICTIM: &str = "victim secret: Kernel panic - the host's root-only data";

fn stand_in_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join("stand-in-qemu");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test -p cordon-microvm` (which builds the \
         examples) or build it with `cargo build -p cordon-microvm --example stand-in-qemu`",
        bin.display()
    );
    bin
}

fn stand_in(behaviour: &str, tune: impl FnOnce(&mut MicrovmConfig)) -> Option<StandIn> {
    if !nix::unistd::geteuid().is_root() {
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("the stand-in QEMU tests need root under CORDON_REQUIRE_ALL=1");
        }
        eprintln!("SKIPPING stand-in QEMU test: not root");
        return None;
    }
    let tmp = tempfile::Builder::new()
        .prefix("cordon-mvs")
        .tempdir_in("/tmp")
        .unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A fake image: the stand-in never reads it.
    let img = root.join("data/microvm");
    std::fs::create_dir_all(&img).unwrap();
    for f in ["vmlinuz-0", "initrd-0.cpio", "rootfs-0.ext4"] {
        std::fs::write(img.join(f), b"not a real image").unwrap();
    }
    std::fs::write(
        img.join("manifest.json"),
        serde_json::json!({"kernel": "vmlinuz-0", "initrd": "initrd-0.cpio",
            "rootfs": "rootfs-0.ext4", "kernel_version": "stand-in",
            "kernel_package": "stand-in", "inputs": {}})
        .to_string(),
    )
    .unwrap();
    std::fs::create_dir(root.join("bin")).unwrap();
    let qemu = root.join("bin").join(format!("qemu-{behaviour}"));
    // Copied by a child process, so no descriptor open for writing on it is ever in this
    // one: a fork by a test running beside this one would inherit it until its exec, and
    // the stand-in's own exec then fails with "Text file busy".
    let copied = std::process::Command::new("cp")
        .arg(stand_in_binary())
        .arg(&qemu)
        .status()
        .unwrap();
    assert!(copied.success(), "cp of the stand-in QEMU failed");
    let victim = root.join("victim");
    std::fs::write(&victim, VICTIM).unwrap();
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut cfg = MicrovmConfig::with_data_dir(root.join("data"));
    cfg.run_dir = root.join("run");
    cfg.snapshot_dir = root.join("snapshots");
    cfg.qemu = qemu;
    cfg.accel = Some(cordon_microvm::Accel::Tcg);
    cfg.boot_timeout = Duration::from_secs(60);
    tune(&mut cfg);
    Some(StandIn {
        backend: MicrovmBackend::new(cfg),
        tmp,
    })
}

impl StandIn {
    fn victim_untouched(&self) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(self.tmp.path().join("victim")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600, "root changed the victim's mode");
        assert_eq!(
            std::fs::read_to_string(self.tmp.path().join("victim")).unwrap(),
            VICTIM
        );
    }
}

fn exec_argv(sb: &mut MicrovmSandbox, argv: &[&str]) -> cordon_core::Result<ExecOutcome> {
    let mut sink = |_: OutputStream, _: &[u8]| {};
    sb.exec(&ExecRequest::argv(argv.iter().copied()), &mut sink)
}

#[test]
fn a_link_planted_over_a_template_snapshot_makes_root_touch_nothing_outside() {
    let Some(si) = stand_in("plant-symlink", |_| {}) else {
        return;
    };
    let mut sb = si.backend.create_restored(&spec()).unwrap();
    si.victim_untouched();
    // The restored VM read what the template wrote through the channel Cordon gave it.
    let o = exec_argv(&mut sb, &["incoming"]).unwrap();
    assert_eq!(stdout(&o), "FROM-THE-CHANNEL", "{o:?}");
    destroy_and_check(sb);
    si.victim_untouched();
}

/// The file battery in a microVM, when the image's agent serves file operations; an image
/// built before them is skipped loudly (`cordon image build` picks up the new agent).
#[test]
fn file_api_round_trip_links_fifos_and_hostile_archives() {
    let Some(env) = env() else {
        return;
    };
    let s = spec();
    let mut sb = env.backend.create(&s).unwrap();
    if let Err(e @ Error::Unsupported { .. }) = sb.file_op(&cordon_core::FileOp::List {
        path: "/work".into(),
    }) {
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("the microVM image predates file operations under CORDON_REQUIRE_ALL=1: {e}");
        }
        eprintln!("SKIPPING microvm file battery: {e}");
        return;
    }
    cordon_testkit::files::round_trip(&mut *sb);
    sb.destroy().unwrap();
    let mut sb = env.backend.create(&s).unwrap();
    cordon_testkit::files::planted_links(&mut *sb, true);
    sb.destroy().unwrap();
    let mut sb = env.backend.create(&s).unwrap();
    cordon_testkit::files::hostile_archives(&mut *sb, s.limits.disk_bytes);
    sb.destroy().unwrap();
}

#[test]
fn an_agent_older_than_file_operations_is_refused_with_the_fix() {
    // The stand-in answers `configure` as agents built before file operations did.
    let Some(si) = stand_in("old-agent", |_| {}) else {
        return;
    };
    let mut sb = si.backend.create_restored(&spec()).unwrap();
    let list = sb.file_op(&cordon_core::FileOp::List {
        path: "/work".into(),
    });
    let tar = sb.get_archive("/work", 1 << 20, &mut Vec::new());
    let up = sb.put_archive("/work", &mut &[0u8; 1024][..]);
    for r in [list.map(|_| ()), tar.map(|_| ()), up.map(|_| ())] {
        match r {
            Err(e @ Error::Unsupported { .. }) => {
                assert!(e.to_string().contains("cordon image build"), "{e}")
            }
            other => panic!("expected the old agent to be refused: {other:?}"),
        }
    }
    // Nothing was sent that the agent would stop at: the sandbox still runs.
    let o = exec_argv(&mut sb, &["incoming"]).unwrap();
    assert_eq!(stdout(&o), "FROM-THE-CHANNEL", "{o:?}");
    destroy_and_check(sb);
}

#[test]
fn a_plain_file_planted_in_a_template_directory_is_never_restored_from() {
    let Some(si) = stand_in("plant-file", |_| {}) else {
        return;
    };
    let mut a = si.backend.create_restored(&spec()).unwrap();
    let mut b = si.backend.create_restored(&spec()).unwrap();
    for sb in [&mut a, &mut b] {
        let o = exec_argv(sb, &["incoming"]).unwrap();
        assert_eq!(stdout(&o), "FROM-THE-CHANNEL", "{o:?}");
    }
    // The store holds one snapshot (its RAM file and stream) and its digest, root's alone.
    use std::os::unix::fs::MetadataExt;
    let dir = si.backend.config().snapshot_dir.clone();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].ends_with(".ram") && names[1].ends_with(".sha256") && names[2].ends_with(".snap"),
        "{names:?}"
    );
    // A snapshot whose bytes change under it is not restored from: it is remade.
    let snap = dir.join(&names[2]);
    std::fs::write(&snap, b"SWAPPED\n").unwrap();
    let fresh = MicrovmBackend::new(si.backend.config().clone());
    let mut c = fresh.create_restored(&spec()).unwrap();
    let o = exec_argv(&mut c, &["incoming"]).unwrap();
    assert_eq!(stdout(&o), "FROM-THE-CHANNEL", "{o:?}");
    // So is one whose RAM file changes: a new one is made (a new inode; the VMs mapping the
    // old one keep it).
    let ram = dir.join(&names[0]);
    let old_ino = std::fs::metadata(&ram).unwrap().ino();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ram)
        .and_then(|f| std::os::unix::fs::FileExt::write_at(&f, b"CHANGED", 4096))
        .unwrap();
    let fresh = MicrovmBackend::new(si.backend.config().clone());
    let d = fresh.create_restored(&spec()).unwrap();
    let (_, remade) = frozen_ram_file(&dir);
    assert_ne!(
        remade.ino(),
        old_ino,
        "a changed RAM file was restored from"
    );
    for sb in [a, b, c, d] {
        destroy_and_check(sb);
    }
}

#[test]
fn a_console_log_linked_to_a_root_only_file_leaks_nothing() {
    let Some(si) = stand_in("plain", |_| {}) else {
        return;
    };
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    // QEMU exits mid-exec: reported as a failed outcome, or as the exec's error when the
    // host sees QEMU gone before the call is answered (which comes first is a race); both
    // carry what the host read of QEMU's own stderr and nothing of the victim.
    let text = match exec_argv(&mut sb, &["console-symlink-exit"]) {
        Ok(o) => {
            assert_eq!(o.termination, Termination::SandboxFailure, "{o:?}");
            format!("{o:?}")
        }
        Err(e) => e.to_string(),
    };
    assert!(!text.contains("victim secret"), "the victim leaked: {text}");
    // QEMU's own stderr is still reported.
    assert!(text.contains("stand-in: exiting"), "{text}");
    destroy_and_check(sb);
    si.victim_untouched();
}

/// Runs `f` on a thread and fails if it has not returned within `guard` (a guard against
/// hanging forever, not a measurement).
fn returns_within<T: Send + 'static>(guard: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(guard)
        .expect("the call was still blocked on a guest that stopped reading")
}

#[test]
fn a_guest_that_stops_reading_cannot_hold_a_call_past_its_deadline() {
    let Some(si) = stand_in("plain", |c| c.file_timeout = Duration::from_secs(2)) else {
        return;
    };
    // An exec whose stdin the guest never takes: the exec's own timeout ends it.
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    let pid = sb.qemu_pid().unwrap();
    let o = returns_within(Duration::from_secs(120), move || {
        let mut req = ExecRequest::argv(["stop-reading"]);
        req.stdin = Some(vec![b'x'; 32 << 20]);
        req.timeout_ms = Some(2_000);
        let mut sink = |_: OutputStream, _: &[u8]| {};
        let o = sb.exec(&req, &mut sink).unwrap();
        destroy_and_check(sb);
        o
    });
    assert_eq!(o.termination, Termination::Timeout, "{o:?}");
    assert!(!alive(pid), "QEMU survived the timeout");

    // A file call to a guest that stops reading ends at the file deadline.
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    let r = returns_within(Duration::from_secs(120), move || {
        exec_argv(&mut sb, &["stop-reading-after"]).unwrap();
        let r = sb.put_file("/work/big", &vec![0u8; 32 << 20], 0o644);
        destroy_and_check(sb);
        r
    });
    let e = r.unwrap_err().to_string();
    assert!(e.contains("in time"), "{e}");
}

/// The host's memory limit ending QEMU mid-exec loses the agent with it: the exec ended for
/// memory (as on the other tiers, `cordon_core::classify`), not a sandbox failure.
#[test]
fn a_qemu_its_memory_limit_ends_is_out_of_memory_not_a_failure() {
    let Some(si) = stand_in("plain", |_| {}) else {
        return;
    };
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    let pid = sb.qemu_pid().unwrap();
    let o = returns_within(Duration::from_secs(120), move || {
        let o = exec_argv(&mut sb, &["eat-memory"]).unwrap();
        destroy_and_check(sb);
        o
    });
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:?}");
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("memory limit ended it")),
        "{:?}",
        o.warnings
    );
    assert!(!alive(pid), "QEMU survived its memory limit");
}

#[test]
fn a_file_larger_than_the_maximum_asked_for_is_refused_on_the_host() {
    let Some(si) = stand_in("plain", |_| {}) else {
        return;
    };
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    // The stand-in answers with 48 MiB whatever the maximum.
    let r = sb.get_file("/work/out.bin", 1 << 20);
    let e = r.expect_err("a 48 MiB file came through a 1 MiB maximum");
    assert!(
        !e.to_string().contains("/tmp"),
        "a host path in a tenant's error: {e}"
    );
    // The channel is stopped with the VM: nothing more is read from it.
    assert!(matches!(
        exec_argv(&mut sb, &["whoami"]),
        Err(Error::Gone { .. })
    ));
    destroy_and_check(sb);

    // Many one-byte frames are carried, each for the same small cost.
    let mut sb = si.backend.create_cold(&spec()).unwrap();
    let o = exec_argv(&mut sb, &["one-byte-frames", "50000"]).unwrap();
    assert_eq!(o.stdout.len(), 50_000, "{:?}", o.termination);
    destroy_and_check(sb);
}

fn snapshot_names(si: &StandIn) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&si.backend.config().snapshot_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".snap"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn snapshots_are_collected_and_a_template_boot_holds_only_its_own_key() {
    let Some(si) = stand_in("hang-template", |c| c.snapshot_max_count = 1) else {
        return;
    };
    let small = spec();
    let mut other = spec();
    other.limits.memory_bytes = 256 << 20;
    // Two shapes, one kept: the older is collected; a VM restored from it runs on.
    let mut a = si.backend.create_restored(&small).unwrap();
    let first = snapshot_names(&si);
    assert_eq!(first.len(), 1);
    let b = si.backend.create_restored(&other).unwrap();
    let second = snapshot_names(&si);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(first, second, "the older snapshot was kept");
    // Each snapshot's RAM file goes with it.
    let rams: Vec<String> = ram_files(&si.backend.config().snapshot_dir)
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".ram", ".snap")
        })
        .collect();
    assert_eq!(rams, second, "RAM files beside the snapshots");
    assert_eq!(
        stdout(&exec_argv(&mut a, &["incoming"]).unwrap()),
        "FROM-THE-CHANNEL"
    );

    // A shape whose template never reaches its agent (over 1 GiB of RAM here) does not hold
    // up sandboxes of another shape.
    let mut big = spec();
    big.limits.memory_bytes = 2 << 30;
    let backend = std::sync::Arc::new(si.backend);
    let b2 = backend.clone();
    let hung = std::thread::spawn(move || b2.create_restored(&big).map(|_| ()));
    let run_dir = backend.config().run_dir.clone();
    let template = loop {
        let found = std::fs::read_dir(&run_dir).ok().and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("snap-")
                    && p.join("qmp.sock").exists()
            })
        });
        if let Some(t) = found {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let c = backend.create_restored(&other).unwrap();
    assert!(
        !hung.is_finished(),
        "the template boot ended before the other create"
    );
    // End the hung template (QMP quit) and see its create fail.
    // The socket's file is made before QEMU listens on it: a connect may be refused for a
    // moment (CI under load saw it), so it is tried again for up to 10 s.
    let qmp = template.join("qmp.sock");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let mut q = loop {
        match std::os::unix::net::UnixStream::connect(&qmp) {
            Ok(q) => break q,
            Err(e) if std::time::Instant::now() < until => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the hung template boot's QMP socket: {e}"),
        }
    };
    use std::io::Write;
    q.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n")
        .unwrap();
    assert!(hung.join().unwrap().is_err());
    for sb in [a, b, c] {
        destroy_and_check(sb);
    }
}

#[test]
fn a_stalled_cold_boot_is_booted_once_more() {
    // The stand-in's guest never answers when its QEMU runs as an even uid. With two uids
    // (kept apart from every other test's), the pool's leases alternate between them.
    let stalling = |count: u32| {
        stand_in("stall-even-uid", move |c| {
            c.boot_timeout = Duration::from_secs(2);
            c.uid_range = (0x7ffc_0000, count);
        })
    };
    let Some(si) = stalling(2) else {
        return;
    };
    // Each create comes up on the odd uid, so the lease after one is the even uid: the
    // second create's first boot stalls, whichever uid the first started on.
    for _ in 0..2 {
        let sb = si.backend.create_cold(&spec()).unwrap();
        assert_eq!(sb.qemu_uid().unwrap() % 2, 1);
        destroy_and_check(sb);
    }
    // A snapshot's template VM stalls the same way; the restore then runs from its snapshot.
    let mut sb = si.backend.create_restored(&spec()).unwrap();
    assert_eq!(
        stdout(&exec_argv(&mut sb, &["incoming"]).unwrap()),
        "FROM-THE-CHANNEL"
    );
    destroy_and_check(sb);
    drop(si);

    // With one (even) uid the second boot stalls too: the create fails, saying what to do.
    let Some(si) = stalling(1) else {
        return;
    };
    let e = si.backend.create_cold(&spec()).err().unwrap().to_string();
    assert!(e.contains("did not reach its agent in time"), "{e}");
    assert!(e.contains("create the sandbox again"), "{e}");
    assert!(!e.contains(&si.tmp.path().display().to_string()), "{e}");
}

#[test]
fn backends_sharing_a_snapshot_store_boot_one_template_per_shape() {
    // Two backends (as a server and a `cordon run` beside it would be) over one store, each
    // with its own run directory; their templates take 1.5 s to boot. With the key locked
    // across them, at most one template VM runs at any moment, and the second create
    // restores from the first one's snapshot.
    let (Some(a), Some(mut b)) = (
        stand_in("slow-template", |_| {}),
        stand_in("slow-template", |_| {}),
    ) else {
        return;
    };
    let shared = a.backend.config().snapshot_dir.clone();
    let mut cfg = b.backend.config().clone();
    cfg.snapshot_dir = shared.clone();
    b.backend = MicrovmBackend::new(cfg);
    let run_dirs = [
        a.backend.config().run_dir.clone(),
        b.backend.config().run_dir.clone(),
    ];
    let templates_running = || {
        run_dirs
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with("snap-"))
            .count()
    };
    let (ba, bb) = (
        std::sync::Arc::new(a.backend),
        std::sync::Arc::new(b.backend),
    );
    let (ca, cb) = (ba.clone(), bb.clone());
    let ta = std::thread::spawn(move || ca.create_restored(&spec()).map(destroy_and_check));
    let tb = std::thread::spawn(move || cb.create_restored(&spec()).map(destroy_and_check));
    let mut most = 0;
    for _ in 0..250 {
        most = most.max(templates_running());
        if ta.is_finished() && tb.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ta.join().unwrap().unwrap();
    tb.join().unwrap().unwrap();
    assert_eq!(most, 1, "template VMs running at once");
    let snaps = std::fs::read_dir(&shared)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .count();
    assert_eq!(snaps, 1);
    drop(a.tmp);
    drop(b.tmp);
}

#[test]
fn concurrent_backends_never_run_two_qemus_as_one_uid() {
    // Two backends (as two Cordon processes would have) over the same uid range: each VM
    // gets a uid no live VM of the other has.
    let pair = || stand_in("plain", |c| c.uid_range = (0x7ffc_1000, 2));
    let (Some(a), Some(b)) = (pair(), pair()) else {
        return;
    };
    let x = a.backend.create_cold(&spec()).unwrap();
    let y = b.backend.create_cold(&spec()).unwrap();
    assert_ne!(x.qemu_uid(), y.qemu_uid());
    let e = a.backend.create_cold(&spec()).err().unwrap().to_string();
    assert!(e.contains("QEMU uids are in use"), "{e}");
    destroy_and_check(x);
    let z = a.backend.create_cold(&spec()).unwrap();
    assert_ne!(z.qemu_uid(), y.qemu_uid());
    destroy_and_check(y);
    destroy_and_check(z);
}

/// QEMU's pid: the child of the waiter that stays outside its PID namespace.
fn qemu_child(waiter: i32) -> i32 {
    let text = std::fs::read_to_string(format!("/proc/{waiter}/task/{waiter}/children")).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn one_escaped_qemu_reaches_only_its_own_vm() {
    let Some(si) = stand_in("plain", |_| {}) else {
        return;
    };
    let mut a = si.backend.create_cold(&spec()).unwrap();
    let b = si.backend.create_cold(&spec()).unwrap();
    let (ua, ub) = (a.qemu_uid().unwrap(), b.qemu_uid().unwrap());
    assert_ne!(ua, ub, "two VMs share a host uid");
    assert!(ua >= 0x7ffd_0000 && ub >= 0x7ffd_0000);
    let out = |sb: &mut MicrovmSandbox, argv: &[&str]| stdout(&exec_argv(sb, argv).unwrap());

    // Its own uid, PID 1 of its own namespace, not dumpable.
    assert_eq!(
        out(&mut a, &["whoami"]),
        format!("uid={ua} pid=1 dumpable=false")
    );
    // Its root holds its own directory, image, binary and the read-only libraries only.
    let root = out(&mut a, &["ls", "/"]);
    for absent in ["proc", "tmp", "root", "home", "var", "run", "sys"] {
        assert!(
            !root.contains(&format!("\"{absent}\"")),
            "/{absent} visible: {root}"
        );
    }
    for present in ["vm", "img", "usr", "qemu"] {
        assert!(
            root.contains(&format!("\"{present}\"")),
            "/{present} missing: {root}"
        );
    }
    assert_eq!(
        out(&mut a, &["ls", "/vm"]),
        r#"Ok(["agent.sock", "qmp.sock"])"#
    );
    assert!(out(&mut a, &["connect", "/vm/qmp.sock"]).contains("connected"));
    assert!(out(&mut a, &["read", "/img/kernel"]).starts_with("Ok("));
    // Nothing of the other VM: not its QMP socket, not its memory, not the snapshot store.
    let b_dir = b.run_dir().unwrap();
    let b_qemu = qemu_child(b.qemu_pid().unwrap());
    assert!(
        out(
            &mut a,
            &["connect", b_dir.join("qmp.sock").to_str().unwrap()]
        )
        .starts_with("Err")
    );
    assert!(out(&mut a, &["read", &format!("/proc/{b_qemu}/mem")]).starts_with("Err"));
    let snaps = si.backend.config().snapshot_dir.display().to_string();
    assert!(out(&mut a, &["ls", &snaps]).starts_with("Err"));
    // A call outside Cordon's allow-list is refused.
    assert_eq!(
        out(&mut a, &["syscall", "personality"]),
        "result=-1 errno=38"
    );
    assert_eq!(out(&mut a, &["syscall", "syslog"]), "result=-1 errno=38");

    // On the host, as A's uid: B's directory and memory are out of reach too.
    let probe = format!(
        "import socket\ntry:\n  s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('qmp')\n\
         except OSError as e: print('no qmp', e.errno)\n\
         try:\n  open('/proc/{b_qemu}/mem', 'rb').read(1); print('mem')\n\
         except OSError as e: print('no mem', e.errno)\n",
        b_dir.join("qmp.sock").display().to_string()
    );
    use std::os::unix::process::CommandExt;
    let o = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &probe])
        .uid(ua)
        .gid(ua)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("no qmp 13") && text.contains("no mem 13"),
        "{text} {o:?}"
    );
    destroy_and_check(a);
    destroy_and_check(b);
}

/// Reads background exec `id` until `done` holds for what it has written (and its end, if
/// any), polling a bounded number of times.
fn read_until(
    sb: &mut MicrovmSandbox,
    id: u64,
    done: impl Fn(&str, Option<&cordon_core::ProcExit>) -> bool,
) -> (String, Option<cordon_core::ProcExit>) {
    let mut out = String::new();
    let mut from = [0u64; 2];
    for _ in 0..600 {
        let r = sb.read_background(id, from, 1 << 20).unwrap();
        from = [
            r.stdout_from + r.stdout.len() as u64,
            r.stderr_from + r.stderr.len() as u64,
        ];
        out.push_str(&String::from_utf8_lossy(&r.stdout));
        if done(&out, r.exit.as_ref()) {
            return (out, r.exit);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("background exec {id} never got there; output so far: {out:?}");
}

/// Issue 20 on this tier: a background exec keeps running beside foreground execs, takes
/// stdin, survives a pause and resume of the VM, and ends on TERM.
#[test]
fn background_execs_run_beside_foreground_ones_and_survive_a_pause() {
    let Some(env) = env() else { return };
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    let ticker = sb
        .start_background(&ExecRequest::code(
            Language::Bash,
            // Renamed into place: a reader never sees the file truncated and not yet written.
            "echo up; i=0; while :; do i=$((i+1)); echo $i > /work/ticks.new; mv /work/ticks.new /work/ticks; sleep 0.2; done",
        ))
        .unwrap();
    let (out, exit) = read_until(&mut sb, ticker, |o, _| o.contains("up"));
    assert!(exit.is_none(), "{out:?}");
    // A foreground exec beside it.
    assert_eq!(
        stdout(&run(&mut sb, Language::Bash, "echo fg")).trim(),
        "fg"
    );
    // stdin of another background exec: written in two parts, then closed.
    let cat = sb.start_background(&ExecRequest::argv(["cat"])).unwrap();
    sb.write_background(cat, b"hello ").unwrap();
    sb.write_background(cat, b"world").unwrap();
    sb.write_background(cat, b"").unwrap();
    let (out, exit) = read_until(&mut sb, cat, |_, e| e.is_some());
    assert_eq!(out, "hello world");
    assert_eq!(exit.unwrap().code, Some(0));
    // Pause and resume: the ticker is the same process afterwards and goes on counting.
    sb.pause().unwrap();
    sb.resume().unwrap();
    let ticks = |sb: &mut MicrovmSandbox| -> u64 {
        stdout(&run(sb, Language::Bash, "cat /work/ticks"))
            .trim()
            .parse()
            .unwrap()
    };
    let before = ticks(&mut sb);
    let mut advanced = false;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        if ticks(&mut sb) > before {
            advanced = true;
            break;
        }
    }
    assert!(
        advanced,
        "the background exec stopped counting after resume"
    );
    // TERM ends it, and its end says so.
    sb.signal_background(ticker, cordon_core::ProcSignal::Term)
        .unwrap();
    let (_, exit) = read_until(&mut sb, ticker, |_, e| e.is_some());
    assert_eq!(exit.unwrap().signal, Some(15));
    destroy_and_check(sb);
    finish(env);
}

/// The snapshot store's RAM files.
fn ram_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ram"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The one RAM file of the store, checked frozen: root's, mode 0444, one link.
fn frozen_ram_file(dir: &Path) -> (std::path::PathBuf, std::fs::Metadata) {
    use std::os::unix::fs::MetadataExt;
    let files = ram_files(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let m = std::fs::symlink_metadata(&files[0]).unwrap();
    assert!(m.is_file());
    assert_eq!(m.uid(), 0);
    assert_eq!(m.mode() & 0o7777, 0o444);
    assert_eq!(m.nlink(), 1);
    (files[0].clone(), m)
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
    hex::encode(h.finalize())
}

/// One QEMU's mapping of the file with inode `ino`, from `/proc/PID/smaps` (KiB).
#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    /// Pages of the mapping copied on write: this VM's own.
    anonymous: u64,
    /// Pages of the file also mapped by another process.
    shared: u64,
}

fn file_mapping(pid: i32, ino: u64) -> Option<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut found: Option<Mapping> = None;
    let mut inside = false;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first()
            .is_some_and(|a| a.contains('-') && !a.ends_with(':'))
        {
            inside = f.get(4).and_then(|i| i.parse::<u64>().ok()) == Some(ino);
            if inside {
                found = Some(found.unwrap_or(Mapping {
                    size: 0,
                    anonymous: 0,
                    shared: 0,
                }));
            }
            continue;
        }
        let (Some(m), true) = (found.as_mut(), inside) else {
            continue;
        };
        let kib = f.get(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match f.first().copied() {
            Some("Size:") => m.size += kib,
            Some("Anonymous:") => m.anonymous += kib,
            Some("Shared_Clean:") | Some("Shared_Dirty:") => m.shared += kib,
            _ => {}
        }
    }
    found
}

/// Three VMs restored from one snapshot map its RAM file private and copy-on-write: each
/// maps the whole file, shares its pages with the others, and owns only the pages it wrote;
/// one writing 100 MB changes neither the others nor the file.
#[test]
fn restored_vms_share_the_snapshot_memory_file_copy_on_write() {
    let Some(env) = env_private() else {
        return;
    };
    let mut s = spec();
    s.limits.tmp_bytes = 128 << 20;
    let mut vms: Vec<MicrovmSandbox> = (0..3)
        .map(|_| env.backend.create_restored(&s).unwrap())
        .collect();
    let (ram, meta) = frozen_ram_file(&env.backend.config().snapshot_dir);
    use std::os::unix::fs::MetadataExt;
    let guest_kib = meta.len() / 1024;
    let before = sha256_of(&ram);
    let maps = |vms: &[MicrovmSandbox]| -> Vec<Mapping> {
        vms.iter()
            .map(|vm| {
                let qemu = qemu_child(vm.qemu_pid().unwrap());
                file_mapping(qemu, meta.ino()).expect("QEMU maps the snapshot's RAM file")
            })
            .collect()
    };
    let idle = maps(&vms);
    // A restore never boots its kernel, and QEMU keeps a private copy of the file it is
    // given as `-kernel` for the VM's life: each restored QEMU sees only the boot header.
    let image = cordon_microvm::image::load(&cordon_microvm::image::default_data_dir()).unwrap();
    let kernel = std::fs::read(&image.kernel).unwrap();
    assert!(
        kernel.len() > 1 << 20,
        "a real kernel: {} bytes",
        kernel.len()
    );
    for vm in &vms {
        let qemu = qemu_child(vm.qemu_pid().unwrap());
        let seen = std::fs::read(format!("/proc/{qemu}/root/img/kernel")).unwrap();
        assert!(
            seen.len() < 64 << 10,
            "a restored QEMU was given the whole kernel ({} bytes)",
            seen.len()
        );
        assert_eq!(
            &seen[..],
            &kernel[..seen.len()],
            "the kernel's own first bytes"
        );
    }
    for m in &idle {
        assert_eq!(m.size, guest_kib, "the whole guest RAM is the file: {m:?}");
        assert!(
            m.anonymous < guest_kib / 4,
            "an idle restored VM owns only the pages it wrote: {m:?} of {guest_kib} KiB"
        );
        assert!(m.shared > 0, "no page shared with the other VMs: {m:?}");
    }

    let o = exec_argv(
        &mut vms[0],
        &[
            "sh",
            "-c",
            "head -c 100000000 /dev/zero > /tmp/big && wc -c < /tmp/big",
        ],
    )
    .unwrap();
    assert_eq!(stdout(&o).trim(), "100000000", "{o:?}");
    let after = maps(&vms);
    assert!(
        after[0].anonymous >= idle[0].anonymous + 90 * 1024,
        "the writer's pages are its own: {:?} -> {:?}",
        idle[0],
        after[0]
    );
    for (i, vm) in vms.iter_mut().enumerate().skip(1) {
        let o = exec_argv(vm, &["sh", "-c", "test ! -e /tmp/big && echo clean"]).unwrap();
        assert_eq!(stdout(&o).trim(), "clean", "VM {i}");
        assert!(
            after[i].anonymous < idle[i].anonymous + 32 * 1024,
            "VM {i} grew with another's writes: {:?} -> {:?}",
            idle[i],
            after[i]
        );
    }
    assert_eq!(sha256_of(&ram), before, "the RAM file changed");
    let (_, again) = frozen_ram_file(&env.backend.config().snapshot_dir);
    assert_eq!(
        (again.ino(), again.mtime(), again.mtime_nsec()),
        (meta.ino(), meta.mtime(), meta.mtime_nsec())
    );
    for vm in vms {
        destroy_and_check(vm);
    }
    finish(env);
}

/// A restored QEMU sees the snapshot's RAM file read-only: it can read its memory, but
/// neither write nor remove the file, and its uid cannot reach the store from the host.
#[test]
fn an_escaped_qemu_cannot_write_or_replace_the_snapshot_memory_file() {
    let Some(si) = stand_in("plain", |_| {}) else {
        return;
    };
    let mut a = si.backend.create_restored(&spec()).unwrap();
    let dir = si.backend.config().snapshot_dir.clone();
    let (ram, meta) = frozen_ram_file(&dir);
    let before = sha256_of(&ram);
    let mut out = |argv: &[&str]| stdout(&exec_argv(&mut a, argv).unwrap());
    assert_eq!(out(&["incoming"]), "FROM-THE-CHANNEL");
    assert!(out(&["ls", "/img"]).contains("\"ram\""));
    assert!(out(&["read", "/img/ram"]).starts_with("Ok("));
    for probe in ["write", "unlink"] {
        let r = out(&[probe, "/img/ram"]);
        assert!(r.starts_with("Err"), "{probe}: {r}");
    }
    let uid = a.qemu_uid().unwrap();
    let probe = format!(
        "for mode in ('r+b', 'rb'):\n  try:\n    open({:?}, mode); print('opened', mode)\n  \
         except OSError as e: print('refused', mode, e.errno)\n",
        ram.display().to_string()
    );
    use std::os::unix::process::CommandExt;
    let o = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &probe])
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("refused r+b 13") && text.contains("refused rb 13"),
        "{text} {o:?}"
    );
    use std::os::unix::fs::MetadataExt;
    let (_, after) = frozen_ram_file(&dir);
    assert_eq!(after.ino(), meta.ino());
    assert_eq!(sha256_of(&ram), before);
    destroy_and_check(a);
}

/// A template VM that changes its RAM file's shape (here: one page longer) while it holds
/// it gets no snapshot installed, and nothing of it stays in the store.
#[test]
fn a_template_that_reshapes_its_memory_file_gets_no_snapshot() {
    let Some(si) = stand_in("grow-ram", |_| {}) else {
        return;
    };
    let e = si.backend.create_restored(&spec()).err().expect("refused");
    let msg = e.to_string();
    assert!(msg.contains("memory file"), "{msg}");
    assert!(
        !msg.contains(&si.backend.config().snapshot_dir.display().to_string()),
        "{msg}"
    );
    let left: Vec<_> = std::fs::read_dir(&si.backend.config().snapshot_dir)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the store: {left:?}");
}

/// PSS and RSS of a process in KiB (`/proc/PID/smaps_rollup`).
fn pss_rss_kib(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Pss:"), field("Rss:"))
}

/// Processes in the cgroup of sandbox `id`'s QEMU (`vm-<short id>`). (Not by uid: tests
/// running side by side have backends of their own, whose uid pools overlap.)
fn processes_of_sandbox(id: &str) -> Vec<i32> {
    let name = format!("vm-{}", &id[..19]);
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&name))
        })
        .collect()
}

fn ticks(sb: &mut MicrovmSandbox) -> u64 {
    stdout(&run(sb, Language::Bash, "cat /work/ticks"))
        .trim()
        .parse()
        .unwrap()
}

fn still_ticking(sb: &mut MicrovmSandbox) -> bool {
    let before = ticks(sb);
    (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        ticks(sb) > before
    })
}

/// Issue 20, pause to disk: the whole VM is saved into the paused store and its QEMU ends
/// (no process of its uid, no memory); a resume in this process and one by another backend
/// (a restarted server) find the background processes and an interpreter's variable alive;
/// a tampered state is refused with nothing run from it; a destroy leaves no file. Prints
/// the figures of ADR 0015.
#[test]
fn a_vm_paused_to_disk_holds_nothing_and_resumes_with_its_processes() {
    let Some(env) = env() else { return };
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    let id = sb.id().as_str().to_string();
    // (Written aside and renamed: a reader never sees the file truncated.)
    let ticker = sb
        .start_background(&ExecRequest::code(
            Language::Bash,
            "echo up; i=0; while :; do i=$((i+1)); echo $i > /work/t; mv /work/t /work/ticks; \
             sleep 0.2; done",
        ))
        .unwrap();
    read_until(&mut sb, ticker, |o, _| o.contains("up"));
    // An interpreter holding a variable, printing it on each line it reads.
    let py = sb
        .start_background(&ExecRequest::code(
            Language::Python,
            "import secrets, sys\nx = secrets.token_hex(8)\nprint('x=' + x, flush=True)\n\
             for line in sys.stdin:\n    print('again=' + x, flush=True)\n",
        ))
        .unwrap();
    let (out, _) = read_until(&mut sb, py, |o, _| o.contains('\n'));
    let x = out.trim().strip_prefix("x=").unwrap().to_string();
    // Dirty pages beyond the snapshot's: 32 MiB in /tmp.
    run(
        &mut sb,
        Language::Bash,
        "head -c 33554432 /dev/urandom > /tmp/fill",
    );
    let sum = stdout(&run(&mut sb, Language::Bash, "sha256sum /tmp/fill"));

    let qemu = qemu_child(sb.qemu_pid().unwrap());
    assert!(
        !processes_of_sandbox(&id).is_empty(),
        "QEMU is not found by its cgroup"
    );
    let (pss, rss) = pss_rss_kib(qemu);
    let t0 = std::time::Instant::now();
    let bytes = sb.pause_to_disk().unwrap();
    let pause_ms = t0.elapsed().as_millis();
    assert!(sb.qemu_pid().is_none() && !alive(qemu));
    assert!(
        processes_of_sandbox(&id).is_empty(),
        "a process of the sandbox's QEMU"
    );
    let dir = sb.paused_dir().unwrap();
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o700
    );
    assert!(
        bytes > 32 << 20,
        "{bytes} bytes on disk hold less than /tmp"
    );
    assert_eq!(sb.on_disk_bytes(), Some(bytes));
    // Calls on it are refused, not run.
    assert!(
        sb.exec(
            &ExecRequest::argv(["true"]),
            &mut |_: OutputStream, _: &[u8]| {}
        )
        .is_err()
    );

    let t0 = std::time::Instant::now();
    sb.resume().unwrap();
    let resume_ms = t0.elapsed().as_millis();
    assert!(!dir.exists(), "the state stays after the resume");
    assert!(still_ticking(&mut sb));
    sb.write_background(py, b"\n").unwrap();
    let (out, _) = read_until(&mut sb, py, |o, _| o.contains("again="));
    assert!(out.contains(&format!("again={x}")), "{out:?}");
    assert_eq!(
        stdout(&run(&mut sb, Language::Bash, "sha256sum /tmp/fill")),
        sum
    );
    let (pss_after, rss_after) = pss_rss_kib(qemu_child(sb.qemu_pid().unwrap()));
    println!(
        "ADR 0015 figures: pause to disk {pause_ms} ms, {} MiB on disk (guest RAM {} MiB), \
         resume from disk {resume_ms} ms (check exec included); QEMU before the pause: PSS {} \
         MiB, RSS {} MiB; while paused to disk: no QEMU (0); after the resume: PSS {} MiB, \
         RSS {} MiB",
        bytes >> 20,
        (128 + 64 + 16 + 160u64).div_ceil(128) * 128,
        pss >> 10,
        rss >> 10,
        pss_after >> 10,
        rss_after >> 10,
    );

    // A restarted server: another backend revives it from its files alone.
    sb.pause_to_disk().unwrap();
    let cfg = env.backend.config().clone();
    std::mem::forget(sb);
    let other = MicrovmBackend::new(cfg.clone());
    let mut sb = other.revive_sandbox(&id).unwrap().unwrap();
    assert!(sb.qemu_pid().is_none());
    // Long enough on disk for a stopped guest clock to show.
    std::thread::sleep(Duration::from_secs(5));
    sb.resume().unwrap();
    let guest: i64 = stdout(&run(&mut sb, Language::Bash, "date +%s"))
        .trim()
        .parse()
        .unwrap();
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // A clock stopped on disk would be 5 s behind or more. Under TCG on a busy host (CI's
    // other jobs beside it) the guest's `date` has read up to 3 s late: 2 s was too tight.
    assert!(
        (guest - host).abs() <= 3,
        "guest clock {guest}, host {host}"
    );
    assert!(still_ticking(&mut sb));
    sb.write_background(py, b"\n").unwrap();
    let (out, _) = read_until(&mut sb, py, |o, _| o.matches("again=").count() >= 2);
    assert!(out.contains(&format!("again={x}")), "{out:?}");
    // Exec ids go on where they were: a new background exec does not take an old one's.
    let third = sb.start_background(&ExecRequest::argv(["true"])).unwrap();
    assert!(third > py);

    // A tampered state: refused, the sandbox is lost, nothing is started from it.
    sb.pause_to_disk().unwrap();
    let state = sb.paused_dir().unwrap().join("state");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&state)
            .unwrap();
        f.write_at(b"\x00tampered\x00", 4096).unwrap();
    }
    let dir = sb.paused_dir().unwrap();
    let e = sb.resume().unwrap_err();
    assert!(e.to_string().contains("digest"), "{e}");
    assert!(sb.qemu_pid().is_none());
    assert!(!dir.exists(), "a refused state is removed");
    assert_eq!(sb.failure(), Some("paused-state-refused"));
    destroy_and_check(sb);

    // Destroying a sandbox paused to disk removes its files.
    let mut sb = env.backend.create_restored(&spec()).unwrap();
    sb.pause_to_disk().unwrap();
    let dir = sb.paused_dir().unwrap();
    assert!(dir.exists());
    sb.destroy().unwrap();
    assert!(!dir.exists());
    assert!(
        std::fs::read_dir(&cfg.paused_dir).unwrap().next().is_none(),
        "files left in the paused store"
    );
    finish(env);
}

/// A sandbox with egress is refused `to_disk` (its proxy lives in this process) and runs on.
#[test]
fn a_vm_with_egress_is_not_paused_to_disk() {
    let Some(env) = env() else { return };
    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(&["example.com"]).unwrap();
    let mut sb = env.backend.create_restored(&s).unwrap();
    match sb.pause_to_disk() {
        Err(Error::Unsupported { fix, .. }) => assert!(fix.contains("without to_disk"), "{fix}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        stdout(&run(&mut sb, Language::Bash, "echo ok")).trim(),
        "ok"
    );
    destroy_and_check(sb);
    finish(env);
}

/// A full snapshot (one migration stream of the live VM, which continues) and three
/// sandboxes started from it at once: the Python variable, the background counter and the
/// file are in each, a change in one is in no other nor in the source, and each has a
/// hostname (its id), a kernel random stream (`os.urandom` in the restored process,
/// `/proc/sys/kernel/random/uuid`) of its own.
#[test]
fn three_forks_of_a_full_snapshot_have_its_state_and_their_own() {
    let Some(env) = env() else { return };
    let identity = |sb: &mut dyn Sandbox| {
        cordon_testkit::snapshot::sh(sb, "hostname; cat /proc/sys/kernel/random/uuid")
    };
    cordon_testkit::snapshot::three_forks(&env.backend, &spec(), Some(&identity));
    finish(env);
}

/// A full snapshot of a microVM with egress is refused with the fix (its proxy's CA is in
/// the guest); nothing is written.
#[test]
fn a_full_snapshot_of_a_microvm_with_egress_is_refused_with_the_fix() {
    let Some(env) = env() else { return };
    let mut s = spec();
    s.egress.allow = cordon_core::egress::parse_patterns(&["127.0.0.1/32:9"]).unwrap();
    let mut sb = env.backend.create_sandbox(&s).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = sb
        .snapshot(
            cordon_core::SnapshotMode::Full,
            &cordon_core::SnapshotDir::new(dir.path()),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(
        e.to_string().contains("without allow_hosts or grants"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    destroy_and_check(sb);
    finish(env);
}

/// Figures for ADR 0027 (run by hand: `cargo test -p cordon-microvm --test microvm --
/// --ignored --nocapture snapshot_figures`).
#[test]
#[ignore = "prints figures; run by hand"]
fn snapshot_figures() {
    let Some(env) = env() else { return };
    let mut s = spec();
    s.limits.memory_bytes = 192 << 20;
    let memory_of = |id: &cordon_core::SandboxId| {
        let name = format!("vm-{}", id.short());
        cordon_host::cgroup::dirs_of(cordon_host::cgroup::PARENT, &name)
            .iter()
            .find_map(|d| {
                ["memory.current", "memory.usage_in_bytes"]
                    .iter()
                    .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            })
            .and_then(|v| v.trim().parse().ok())
    };
    cordon_testkit::snapshot::figures(&env.backend, &s, 64, &memory_of);
    finish(env);
}
