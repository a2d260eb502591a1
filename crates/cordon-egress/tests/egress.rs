//! Integration tests of the egress proxy against real upstreams on 127.0.0.1, with Rust,
//! curl and Python urllib clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cordon_core::{EgressPolicy, Grant, GrantSecret};
use cordon_egress::resolve::ResolveFuture;
use cordon_egress::{
    AuditEvent, Decision, EgressLimits, EgressProxy, Kind, ProxyConfig, ProxyHandle, Resolver,
    StaticResolver, UpstreamRoots,
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GRANT_HOST: &str = "api.grant.test";
const TLS_HOST: &str = "api.tls.test";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Fixture {
    cfg: ProxyConfig,
    resolver: StaticResolver,
    dir: tempfile::TempDir,
    secret: String,
}

/// A config with a static resolver, a loopback TCP listener, a test CA as the only upstream
/// root, and a canary secret file.
fn fixture(allow: &[String], test_ca: Option<&TestCa>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut raw = [0u8; 12];
    getrandom::fill(&mut raw).unwrap();
    let secret = format!("REAL-canary-{}", hex::encode(raw));
    std::fs::write(dir.path().join("secret"), format!("{secret}\n")).unwrap();
    let resolver = StaticResolver::new();
    let mut cfg = ProxyConfig::new("sbx-test");
    cfg.policy = EgressPolicy {
        allow: cordon_core::egress::parse_patterns(allow).unwrap(),
        deny: Vec::new(),
    };
    cfg.tcp_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.resolver = Some(Arc::new(resolver.clone()));
    cfg.upstream_roots = UpstreamRoots {
        system: false,
        extra_pem: test_ca.map(|c| vec![c.pem.clone()]).unwrap_or_default(),
    };
    if test_ca.is_none() {
        // still needs some root to build a client config
        cfg.upstream_roots.extra_pem = vec![TestCa::new().pem];
    }
    cfg.ca_cert_path = dir
        .path()
        .join("egress-ca.pem")
        .to_string_lossy()
        .into_owned();
    cfg.ca_bundle_path = dir.path().join("bundle.pem").to_string_lossy().into_owned();
    cfg.audit_log = Some(dir.path().join("audit.jsonl"));
    Fixture {
        cfg,
        resolver,
        dir,
        secret,
    }
}

fn grant(f: &Fixture, methods: &[&str], paths: &[&str]) -> Grant {
    Grant {
        name: "gh".into(),
        env_var: "GH_TOKEN".into(),
        secret: GrantSecret::value(f.secret.clone()),
        hosts: vec![GRANT_HOST.parse().unwrap()],
        header: "authorization".into(),
        methods: methods.iter().map(|s| s.to_string()).collect(),
        path_prefixes: paths.iter().map(|s| s.to_string()).collect(),
    }
}

fn start(f: &Fixture) -> (ProxyHandle, SocketAddr) {
    let h = EgressProxy::start(f.cfg.clone(), &tokio::runtime::Handle::current()).unwrap();
    // the "sandbox" side files
    std::fs::write(&f.cfg.ca_cert_path, h.ca_cert_pem()).unwrap();
    std::fs::write(&f.cfg.ca_bundle_path, h.ca_bundle_pem()).unwrap();
    let addr = h.tcp_addr().unwrap();
    (h, addr)
}

fn placeholder(h: &ProxyHandle) -> String {
    h.placeholders()[0].1.clone()
}

/// Waits (bounded) for an audit event matching `pred`.
async fn wait_event(h: &ProxyHandle, pred: impl Fn(&AuditEvent) -> bool) -> AuditEvent {
    for _ in 0..200 {
        if let Some(e) = h.events().into_iter().find(|e| pred(e)) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no matching audit event; events: {:#?}", h.events());
}

fn tool(name: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if p.is_empty() {
        eprintln!("\n!!! SKIPPING the {name} part of this test: {name} is not installed !!!\n");
        return None;
    }
    Some(PathBuf::from(p))
}

/// The real python interpreter (not a pyenv shim, which needs more environment).
fn python() -> Option<PathBuf> {
    let p = tool("python3")?;
    let out = std::process::Command::new(p)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Runs a client program with exactly the sandbox's environment (plus PATH).
async fn run_client(prog: &PathBuf, args: &[&str], env: &[(String, String)]) -> (String, String) {
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("client timed out")
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const PY_GET: &str = r#"
import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1])
tok = os.environ.get("GH_TOKEN")
if tok and len(sys.argv) > 2:
    req.add_header("Authorization", "Bearer " + tok)
try:
    r = urllib.request.urlopen(req, timeout=15)
    print(r.status)
    print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code)
    print(e.read().decode())
"#;

// ---------------------------------------------------------------- allow / deny

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_host_answers_and_is_audited() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let got = get(
        proxy,
        &format!("http://api.example.test:{port}/hello?q=1"),
        &[],
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.text(), "hello from upstream /hello");
    let seen = &up.rec.all()[0];
    assert_eq!(seen.target, "/hello?q=1", "origin-form upstream");
    assert_eq!(
        seen.header("host"),
        Some(format!("api.example.test:{port}").as_str())
    );
    let ev = wait_event(&h, |e| {
        e.kind == Kind::Http && e.decision == Decision::Allow
    })
    .await;
    assert_eq!(
        ev.rule.as_deref(),
        Some(format!("allow api.example.test:{port}").as_str())
    );
    assert_eq!(ev.addr.as_deref(), Some("127.0.0.1"));
    assert_eq!(ev.path.as_deref(), Some("/hello"), "no query in the audit");
    assert_eq!(ev.status, Some(200));
    assert_eq!(ev.sandbox, "sbx-test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_requests_reuse_one_upstream_connection() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (_h, proxy) = start(&f);
    let mut c = proxy_client(proxy).await;
    for i in 0..5 {
        let got = send(
            &mut c,
            "GET",
            &format!("http://api.example.test:{port}/r{i}"),
            &[],
            vec![],
        )
        .await
        .unwrap();
        assert_eq!(got.text(), format!("hello from upstream /r{i}"));
    }
    let posted = send(
        &mut c,
        "POST",
        &format!("http://api.example.test:{port}/post"),
        &[],
        b"payload".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(posted.status, 200);
    assert_eq!(up.rec.all().last().unwrap().body, b"payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_hosts_get_403_naming_the_rule() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("*.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.policy.deny = vec!["secret.example.test".parse().unwrap()];
    f.resolver.set("ok.example.test", &[ip("127.0.0.1")]);
    f.resolver.set("secret.example.test", &[ip("127.0.0.1")]);
    f.resolver.set("other.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);

    let got = get(proxy, &format!("http://secret.example.test:{port}/"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("deny secret.example.test"),
        "{}",
        got.text()
    );
    assert_eq!(
        got.header("x-cordon-rule"),
        Some("deny secret.example.test")
    );

    let got = get(proxy, &format!("http://other.test:{port}/"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(got.text().contains("default-deny"), "{}", got.text());

    // right host, wrong port
    let got = get(proxy, "http://ok.example.test:1/", &[]).await;
    assert_eq!(got.status, 403);
    assert!(got.text().contains("not on port 1"), "{}", got.text());

    // CONNECT is refused the same way
    let (code, text) = connect(proxy, &format!("secret.example.test:{port}"), "")
        .await
        .unwrap_err();
    assert_eq!(code, 403);
    assert!(text.contains("deny secret.example.test"), "{text}");

    let ok = get(proxy, &format!("http://ok.example.test:{port}/"), &[]).await;
    assert_eq!(ok.status, 200);
    assert_eq!(
        up.rec.count(),
        1,
        "only the allowed request reached the upstream"
    );
    let denies = h
        .events()
        .iter()
        .filter(|e| e.decision == Decision::Deny)
        .count();
    assert_eq!(denies, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_policy_reaches_nothing() {
    let up = http_upstream().await;
    let f = fixture(&[], None);
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (_h, proxy) = start(&f);
    let got = get(
        proxy,
        &format!("http://api.example.test:{}/", up.addr.port()),
        &[],
    )
    .await;
    assert_eq!(got.status, 403);
    let got = get(proxy, &format!("http://{}/", up.addr), &[]).await;
    assert_eq!(got.status, 403);
    assert_eq!(up.rec.count(), 0);
}

// ---------------------------------------------------------------- real clients

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_python_urllib_work_through_the_proxy() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    f.resolver.set("denied.test", &[ip("127.0.0.1")]);
    let (_h, proxy) = start(&f);
    let env = _h.env_for_proxy_url(&format!("http://{proxy}"));
    let ok_url = format!("http://api.example.test:{port}/from-client");
    let bad_url = format!("http://denied.test:{port}/x");
    let mut ran = 0;
    if let Some(curl) = tool("curl") {
        let (out, err) = run_client(&curl, &["-sS", "--max-time", "15", &ok_url], &env).await;
        assert_eq!(
            out, "hello from upstream /from-client",
            "curl stderr: {err}"
        );
        let (out, _) = run_client(
            &curl,
            &[
                "-sS",
                "--max-time",
                "15",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &bad_url,
            ],
            &env,
        )
        .await;
        assert_eq!(out, "403");
        ran += 1;
    }
    if let Some(py) = python() {
        let (out, err) = run_client(&py, &["-c", PY_GET, &ok_url], &env).await;
        assert_eq!(
            out.trim(),
            "200\nhello from upstream /from-client",
            "python stderr: {err}"
        );
        let (out, _) = run_client(&py, &["-c", PY_GET, &bad_url], &env).await;
        assert!(out.starts_with("403\n"), "{out}");
        assert!(out.contains("default-deny"), "{out}");
        ran += 1;
    }
    eprintln!("real clients exercised: {ran} of 2");
    assert_eq!(up.rec.count(), ran);
}

/// A GET through a CONNECT tunnel to the TLS test upstream, verified against its own CA.
async fn tunnel_get(proxy: SocketAddr, port: u16, ca: &TestCa, path: &str) -> String {
    let mut c = https_client(proxy, &format!("{TLS_HOST}:{port}"), TLS_HOST, &ca.pem)
        .await
        .unwrap();
    send(&mut c, "GET", path, &[("host", TLS_HOST)], vec![])
        .await
        .unwrap()
        .text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_to_tls_upstream_is_opaque() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[TLS_HOST]).await;
    let port = up.addr.port();
    let f = fixture(
        &[format!("{TLS_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.resolver.set(TLS_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    // The client verifies the upstream's own certificate (test CA): nothing was terminated.
    assert_eq!(
        tunnel_get(proxy, port, &ca, "/opaque").await,
        "hello from upstream /opaque"
    );
    let ev = wait_event(&h, |e| {
        e.kind == Kind::Connect && e.decision == Decision::Allow
    })
    .await;
    assert_eq!(ev.terminated, Some(false));
    // and the proxy's CA is NOT what the client saw
    assert!(
        https_client(
            proxy,
            &format!("{TLS_HOST}:{port}"),
            TLS_HOST,
            h.ca_cert_pem()
        )
        .await
        .is_err()
    );
    // a handshake for another name through this tunnel (SNI fronting) is cut
    let r = https_client(proxy, &format!("{TLS_HOST}:{port}"), "evil.test", &ca.pem).await;
    assert!(r.is_err());
    let ev = wait_event(&h, |e| e.rule.as_deref() == Some("sni-mismatch")).await;
    assert_eq!(ev.kind, Kind::Connect);
    if let Some(curl) = tool("curl") {
        let ca_file = f.dir.path().join("testca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let env = h.env_for_proxy_url(&format!("http://{proxy}"));
        let url = format!("https://{TLS_HOST}:{port}/curl-opaque");
        let (out, err) = run_client(
            &curl,
            &[
                "-sS",
                "--max-time",
                "15",
                "--cacert",
                ca_file.to_str().unwrap(),
                &url,
            ],
            &env,
        )
        .await;
        assert_eq!(out, "hello from upstream /curl-opaque", "{err}");
    }
}

/// A proxy that only tunnels originates no TLS, so it needs (and reads) no trust roots: it
/// starts and tunnels with none. One that terminates a grant's host does need them and is
/// refused at its start without any, as is a bad extra root either way.
/// A tunnel that starts a TLS handshake whose ClientHello cannot be read (here one record
/// header claiming 16 KiB, then over 32 KiB of junk) is ended before any of it reaches the
/// upstream: its server name cannot be checked. Before, the check gave up past 32 KiB or on
/// a parse error and let the stream through unchecked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_with_an_unreadable_client_hello_is_ended() {
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    let received = Arc::new(AtomicUsize::new(0));
    let r2 = received.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            let r = r2.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 4096];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 {
                        break;
                    }
                    r.fetch_add(n, Ordering::SeqCst);
                }
            });
        }
    });
    let f = fixture(&[format!("{TLS_HOST}:{port}")], None);
    f.resolver.set(TLS_HOST, &[ip("127.0.0.1")]);
    let mut f = f;
    f.cfg.policy.allow.push("127.0.0.1/32:*".parse().unwrap());
    let (h, proxy) = start(&f);
    let mut s = connect(proxy, &format!("{TLS_HOST}:{port}"), "")
        .await
        .unwrap();
    let mut junk = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    junk.extend(std::iter::repeat_n(0x01u8, 40 << 10));
    for piece in junk.chunks(4096) {
        if s.write_all(piece).await.is_err() {
            break;
        }
    }
    let ev = wait_event(&h, |e| e.rule.as_deref() == Some("tls-unreadable")).await;
    assert_eq!(ev.decision, Decision::Deny);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        received.load(Ordering::SeqCst),
        0,
        "bytes of an unchecked handshake reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_terminating_proxy_needs_trust_roots() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[TLS_HOST]).await;
    let port = up.addr.port();
    // The test upstream is on loopback, which only an explicit allow reaches.
    let mut f = fixture(
        &[format!("{TLS_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.resolver.set(TLS_HOST, &[ip("127.0.0.1")]);
    f.cfg.upstream_roots = UpstreamRoots {
        system: false,
        extra_pem: Vec::new(),
    };
    let (h, proxy) = start(&f);
    assert_eq!(
        tunnel_get(proxy, port, &ca, "/no-roots").await,
        "hello from upstream /no-roots"
    );
    drop(h);
    let mut with_grant = f.cfg.clone();
    with_grant.grants = vec![grant(&f, &[], &[])];
    let e = EgressProxy::start(with_grant, &tokio::runtime::Handle::current())
        .expect_err("a terminating proxy without roots must not start")
        .to_string();
    assert!(e.contains("no trust roots"), "{e}");
    let mut bad_root = f.cfg.clone();
    bad_root.upstream_roots.extra_pem = vec!["not a certificate".into()];
    let e = EgressProxy::start(bad_root, &tokio::runtime::Handle::current())
        .expect_err("a bad extra root must be refused")
        .to_string();
    assert!(e.contains("CERTIFICATE"), "{e}");
}

// ---------------------------------------------------------------- grants

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_swap_reaches_upstream_and_no_secret_reaches_the_sandbox() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[GRANT_HOST]).await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("{GRANT_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let ph = placeholder(&h);
    assert!(ph.starts_with("cordon-ph-"));
    let env = h.env_for_proxy_url(&format!("http://{proxy}"));
    assert!(env.contains(&("GH_TOKEN".to_string(), ph.clone())));
    let mut sandbox_saw: Vec<u8> = Vec::new();

    // Rust client trusting only the proxy's per-sandbox CA
    let mut c = https_client(
        proxy,
        &format!("{GRANT_HOST}:{port}"),
        GRANT_HOST,
        h.ca_cert_pem(),
    )
    .await
    .unwrap();
    let bearer = format!("Bearer {ph}");
    let got = send(
        &mut c,
        "GET",
        "/echo-auth",
        &[
            ("host", &format!("{GRANT_HOST}:{port}")),
            ("authorization", &bearer),
        ],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    // the upstream reflected the header; the proxy masked it on the way back
    assert!(!got.text().contains(&f.secret), "{}", got.text());
    assert!(
        got.text().starts_with("you sent: Bearer ****"),
        "{}",
        got.text()
    );
    sandbox_saw.extend(format!("{:?}{}", got.headers, got.text()).as_bytes());
    let seen = up.rec.all();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {}", f.secret).as_str())
    );
    assert_eq!(seen[0].header("accept-encoding"), Some("identity"));
    let ev = wait_event(&h, |e| e.kind == Kind::Https && e.grant.is_some()).await;
    assert_eq!(ev.grant, Some(cordon_core::GrantNames::one("gh")));
    let ev = wait_event(&h, |e| e.kind == Kind::Connect).await;
    assert_eq!(ev.terminated, Some(true));

    let url = format!("https://{GRANT_HOST}:{port}/echo-auth");
    let mut clients = 0;
    if tool("curl").is_some() {
        let sh = tool("sh").unwrap();
        let script = format!("curl -sS --max-time 15 -H \"Authorization: Bearer $GH_TOKEN\" {url}");
        let (out, err) = run_client(&sh, &["-c", &script], &env).await;
        assert!(
            out.starts_with("you sent: Bearer ****"),
            "curl: {out} {err}"
        );
        sandbox_saw.extend(out.as_bytes());
        sandbox_saw.extend(err.as_bytes());
        clients += 1;
    }
    if let Some(py) = python() {
        let (out, err) = run_client(&py, &["-c", PY_GET, &url, "auth"], &env).await;
        assert!(
            out.starts_with("200\nyou sent: Bearer ****"),
            "python: {out} {err}"
        );
        sandbox_saw.extend(out.as_bytes());
        sandbox_saw.extend(err.as_bytes());
        clients += 1;
    }
    let seen = up.rec.all();
    assert_eq!(seen.len(), 1 + clients);
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {}", f.secret).as_str())
        );
    }

    // Canary over every byte the sandbox could see: its environment, the files it gets,
    // everything clients printed, and the audit trail.
    for (k, v) in &env {
        sandbox_saw.extend(format!("{k}={v}\n").as_bytes());
    }
    sandbox_saw.extend(h.ca_bundle_pem().as_bytes());
    sandbox_saw.extend(std::fs::read(&f.cfg.ca_bundle_path).unwrap());
    let audit_file = std::fs::read(f.cfg.audit_log.as_ref().unwrap()).unwrap();
    let events_json = serde_json::to_vec(&h.events()).unwrap();
    for (what, bytes) in [
        ("sandbox", &sandbox_saw),
        ("audit file", &audit_file),
        ("events", &events_json),
    ] {
        assert!(
            memchr::memmem::find(bytes, f.secret.as_bytes()).is_none(),
            "the real secret leaked into {what}"
        );
    }
    // the output scanner redacts it if the sandbox somehow printed it
    let scanned = h.scan_output(format!("leak: {}", f.secret).as_bytes());
    assert!(!String::from_utf8_lossy(&scanned.bytes).contains(&f.secret));
    assert_eq!(scanned.findings.len(), 1);
    // every audit line parses
    for line in String::from_utf8(audit_file).unwrap().lines() {
        serde_json::from_str::<AuditEvent>(line).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_scope_methods_paths_and_header_hold() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[GRANT_HOST]).await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("{GRANT_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &["GET"], &["/repos/me"])];
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let ph = placeholder(&h);
    let bearer = format!("Bearer {ph}");
    let host = format!("{GRANT_HOST}:{port}");
    let mut c = https_client(proxy, &host, GRANT_HOST, h.ca_cert_pem())
        .await
        .unwrap();
    let cases: [(&str, &str, (&str, &str), u16); 6] = [
        ("GET", "/repos/me/x", ("authorization", &bearer), 200),
        ("DELETE", "/repos/me/x", ("authorization", &bearer), 403),
        ("GET", "/repos/other", ("authorization", &bearer), 403),
        (
            "GET",
            "/repos/me/../../admin",
            ("authorization", &bearer),
            403,
        ),
        ("GET", "/repos/meanie", ("authorization", &bearer), 403),
        ("GET", "/repos/me/x", ("x-other", &bearer), 403),
    ];
    for (m, p, hdr, want) in cases {
        let got = send(&mut c, m, p, &[("host", &host), hdr], vec![])
            .await
            .unwrap();
        assert_eq!(got.status, want, "{m} {p} {hdr:?}: {}", got.text());
        if want == 403 {
            assert!(got.text().contains("grant:gh"), "{}", got.text());
        }
    }
    // without the placeholder, requests to the granted host pass unchanged
    let got = send(&mut c, "DELETE", "/anything", &[("host", &host)], vec![])
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    let seen = up.rec.all();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(seen[1].header("authorization"), None);
    assert!(
        h.events()
            .iter()
            .all(|e| e.decision != Decision::Exfiltration)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_to_non_granted_host_is_refused_as_exfiltration() {
    let ca = TestCa::new();
    let plain = http_upstream().await;
    let granted = https_upstream(&ca, &[GRANT_HOST]).await;
    let pp = plain.addr.port();
    let mut f = fixture(
        &[
            format!("other.test:{pp}"),
            format!("{GRANT_HOST}:{pp}"),
            format!("{GRANT_HOST}:{}", granted.addr.port()),
            "127.0.0.1/32:*".into(),
        ],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    f.resolver.set("other.test", &[ip("127.0.0.1")]);
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let ph = placeholder(&h);
    let url = format!("http://other.test:{pp}/x");

    // in a header
    let got = get(proxy, &url, &[("authorization", &format!("Bearer {ph}"))]).await;
    assert_eq!(got.status, 403, "{}", got.text());
    assert!(got.text().contains("exfiltration"), "{}", got.text());
    // in the query, percent-encoded
    let enc: String = ph.bytes().map(|b| format!("%{b:02X}")).collect();
    let got = get(proxy, &format!("{url}?t={enc}"), &[]).await;
    assert_eq!(got.status, 403);
    // inside Basic credentials
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("u:{ph}"));
    let got = get(proxy, &url, &[("authorization", &format!("Basic {basic}"))]).await;
    assert_eq!(got.status, 403);
    // to the granted host's name but over plain HTTP: refused, not swapped
    let got = get(
        proxy,
        &format!("http://{GRANT_HOST}:{pp}/x"),
        &[("authorization", &format!("Bearer {ph}"))],
    )
    .await;
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("only used over HTTPS"),
        "{}",
        got.text()
    );
    assert_eq!(plain.rec.count(), 0, "nothing reached the upstream");

    // in a request body, split across chunks: the upstream never receives it
    let mut body = vec![b'a'; 100_000];
    body.extend_from_slice(ph.as_bytes());
    body.extend_from_slice(&[b'z'; 1000]);
    let mut c = proxy_client(proxy).await;
    let r = send(&mut c, "POST", &url, &[], body).await;
    assert!(r.as_ref().map(|g| g.status != 200).unwrap_or(true), "{r:?}");
    // in raw bytes through an opaque tunnel
    let mut s = connect(proxy, &format!("other.test:{pp}"), "")
        .await
        .unwrap();
    let req = format!("GET /t HTTP/1.1\r\nhost: other.test\r\nx-a: {ph}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(
        buf.is_empty(),
        "tunnel answered: {}",
        String::from_utf8_lossy(&buf)
    );

    tokio::time::sleep(Duration::from_millis(100)).await;
    for s in plain.rec.all() {
        assert!(memchr::memmem::find(&s.body, ph.as_bytes()).is_none());
        assert!(!format!("{:?}", s.headers).contains(&ph));
    }
    let exfil = h
        .events()
        .iter()
        .filter(|e| e.decision == Decision::Exfiltration)
        .count();
    assert_eq!(exfil, 5, "{:#?}", h.events());
    assert!(
        h.events()
            .iter()
            .filter(|e| e.decision == Decision::Exfiltration)
            .all(|e| e.grant == Some(cordon_core::GrantNames::one("gh")))
    );
}

/// A proxy with grant `gh` for an HTTPS upstream on loopback under a test CA.
struct Granted {
    up: Upstream,
    f: Fixture,
    h: ProxyHandle,
    proxy: SocketAddr,
    port: u16,
}

async fn granted() -> Granted {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[GRANT_HOST]).await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("{GRANT_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    Granted {
        up,
        f,
        h,
        proxy,
        port,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_fronting_inside_terminated_tls_is_refused() {
    let Granted {
        up,
        f: _f,
        h,
        proxy,
        port,
    } = granted().await;
    let authority = format!("{GRANT_HOST}:{port}");
    let mut c = https_client(proxy, &authority, GRANT_HOST, h.ca_cert_pem())
        .await
        .unwrap();
    let got = send(&mut c, "GET", "/", &[("host", "evil.test")], vec![])
        .await
        .unwrap();
    assert_eq!(got.status, 403);
    assert!(got.text().contains("host-mismatch"), "{}", got.text());
    // SNI naming another host than the CONNECT target is refused
    let r = https_client(proxy, &authority, "evil.test", h.ca_cert_pem()).await;
    assert!(r.is_err());
    wait_event(&h, |e| e.rule.as_deref() == Some("sni-mismatch")).await;
    assert_eq!(up.rec.count(), 0);
}

/// Inside terminated TLS a request names one host, the CONNECT host, whatever its form:
/// an absolute-form target with another `Host`, two `Host` headers, or an absolute target
/// naming another authority are refused before anything (least of all the secret) goes
/// upstream. The old check looked only at the target's authority when there was one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fronting_through_absolute_form_or_duplicate_host_is_refused() {
    let Granted {
        up,
        f: _f,
        h,
        proxy,
        port,
    } = granted().await;
    let ph = placeholder(&h);
    let bearer = format!("Bearer {ph}");
    let authority = format!("{GRANT_HOST}:{port}");
    let absolute = format!("https://{authority}/echo-auth");
    let other_abs = format!("https://other.test:{port}/echo-auth");
    let cases: [(&str, Vec<(&str, &str)>); 3] = [
        (
            absolute.as_str(),
            vec![("host", "other.test"), ("authorization", &bearer)],
        ),
        (
            "/echo-auth",
            vec![
                ("host", authority.as_str()),
                ("host", "other.test"),
                ("authorization", &bearer),
            ],
        ),
        (
            other_abs.as_str(),
            vec![("host", authority.as_str()), ("authorization", &bearer)],
        ),
    ];
    for (target, headers) in cases {
        let mut c = https_client(proxy, &authority, GRANT_HOST, h.ca_cert_pem())
            .await
            .unwrap();
        let got = send(&mut c, "GET", target, &headers, vec![]).await.unwrap();
        assert_eq!(got.status, 403, "{target} {headers:?}: {}", got.text());
        assert!(got.text().contains("host-mismatch"), "{}", got.text());
    }
    assert_eq!(up.rec.count(), 0, "nothing may reach the upstream");
    // The honest absolute form still works, and the Host upstream is the canonical one.
    let mut c = https_client(proxy, &authority, GRANT_HOST, h.ca_cert_pem())
        .await
        .unwrap();
    let got = send(
        &mut c,
        "GET",
        &absolute,
        &[("host", &authority), ("authorization", &bearer)],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(up.rec.all()[0].header("host"), Some(authority.as_str()));
}

/// Every response from a host a grant covers is masked for the sandbox's whole life: an
/// upstream that stores the swapped header and shows it on a later request (which carried
/// no placeholder) hands back stars, not the secret; the `Basic` encoding the proxy made is
/// masked as well as the raw value; a compressed body it cannot check is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_reencoded_or_compressed_secrets_never_come_back() {
    let Granted {
        up,
        f,
        h,
        proxy,
        port,
    } = granted().await;
    let ph = placeholder(&h);
    let authority = format!("{GRANT_HOST}:{port}");
    let mut c = https_client(proxy, &authority, GRANT_HOST, h.ca_cert_pem())
        .await
        .unwrap();
    let bearer = format!("Bearer {ph}");
    let got = send(
        &mut c,
        "GET",
        "/store",
        &[("host", &authority), ("authorization", &bearer)],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    // A later request without any placeholder: the stored secret comes back masked.
    let got = send(&mut c, "GET", "/last", &[("host", &authority)], vec![])
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    assert!(!got.text().contains(&f.secret), "{}", got.text());
    assert!(
        got.text().starts_with("last: Bearer ****"),
        "{}",
        got.text()
    );
    // Basic credentials the proxy re-encoded come back masked at their offset too.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let basic = format!("Basic {}", b64.encode(format!("x-access-token:{ph}")));
    let got = send(
        &mut c,
        "GET",
        "/echo-auth",
        &[("host", &authority), ("authorization", &basic)],
        vec![],
    )
    .await
    .unwrap();
    let real = b64.encode(format!("x-access-token:{}", f.secret));
    assert!(!got.text().contains(&real), "{}", got.text());
    assert!(got.text().contains("****"), "{}", got.text());
    // The output scanner masks that encoding too (a sandbox that printed the echo).
    let scanned = h.scan_output(format!("echo: {real}").as_bytes());
    assert!(
        !String::from_utf8_lossy(&scanned.bytes).contains(&real[4..real.len() - 4]),
        "{}",
        String::from_utf8_lossy(&scanned.bytes)
    );
    // A compressed body from a granted host is refused, not passed unchecked.
    let got = send(
        &mut c,
        "GET",
        "/gzip",
        &[("host", &authority), ("authorization", &bearer)],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(got.status, 502, "{}", got.text());
    assert!(!got.text().contains(&f.secret));
    // Every request the proxy sent to the granted host asked for an uncompressed body.
    for s in up.rec.all() {
        assert_eq!(
            s.header("accept-encoding"),
            Some("identity"),
            "{}",
            s.target
        );
    }
}

// ---------------------------------------------------------------- address guard

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolver_answers_pointing_inside_are_refused() {
    let up = http_upstream().await;
    let port = up.addr.port();
    // allowed by name, but no allow entry names 127.0.0.0/8
    let f = fixture(
        &[
            format!("rebind.test:{port}"),
            format!("mixed.test:{port}"),
            format!("mapped.test:{port}"),
        ],
        None,
    );
    f.resolver.set("rebind.test", &[ip("127.0.0.1")]);
    // one public address and one internal: all are refused, nothing is tried
    f.resolver
        .set("mixed.test", &[ip("93.184.216.34"), ip("127.0.0.1")]);
    f.resolver.set("mapped.test", &[ip("::ffff:127.0.0.1")]);
    let (h, proxy) = start(&f);
    let got = get(proxy, &format!("http://rebind.test:{port}/"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("address-guard:loopback"),
        "{}",
        got.text()
    );
    let (code, text) = connect(proxy, &format!("rebind.test:{port}"), "")
        .await
        .unwrap_err();
    assert_eq!(code, 403);
    assert!(text.contains("address-guard:loopback"), "{text}");
    let got = get(proxy, &format!("http://mixed.test:{port}/"), &[]).await;
    assert_eq!(got.status, 403);
    let got = get(proxy, &format!("http://mapped.test:{port}/"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("address-guard:ipv4-mapped"),
        "{}",
        got.text()
    );
    assert_eq!(up.rec.count(), 0);
    let ev = wait_event(&h, |e| e.rule.as_deref() == Some("address-guard:loopback")).await;
    assert_eq!(ev.addr.as_deref(), Some("127.0.0.1"));
}

/// Counts lookups, to prove the proxy resolves once and connects to what it checked.
struct CountingResolver {
    inner: StaticResolver,
    calls: AtomicUsize,
}

impl Resolver for CountingResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.resolve(host)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lookup_per_connection_and_no_rebinding_mid_connection() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[GRANT_HOST]).await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("{GRANT_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    let counting = Arc::new(CountingResolver {
        inner: f.resolver.clone(),
        calls: AtomicUsize::new(0),
    });
    f.cfg.resolver = Some(counting.clone());
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let host = format!("{GRANT_HOST}:{port}");
    let mut c = https_client(proxy, &host, GRANT_HOST, h.ca_cert_pem())
        .await
        .unwrap();
    // the name now "rebinds" to the metadata address; the tunnel keeps the checked address
    f.resolver.set(GRANT_HOST, &[ip("169.254.169.254")]);
    for i in 0..3 {
        let got = send(&mut c, "GET", &format!("/n{i}"), &[("host", &host)], vec![])
            .await
            .unwrap();
        assert_eq!(got.status, 200);
    }
    assert_eq!(counting.calls.load(Ordering::SeqCst), 1);
    assert_eq!(up.rec.count(), 3);
    // a new connection does look up again, sees the metadata address, and is refused
    let (code, text) = connect(proxy, &host, "").await.unwrap_err();
    assert_eq!(code, 403);
    assert!(text.contains("address-guard:link-local"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_address_is_refused_by_ip_and_by_name() {
    // `*:*` allows every name on every port: the guard still holds.
    let f = fixture(&["*:*".into()], None);
    f.resolver
        .set("metadata.google.internal", &[ip("169.254.169.254")]);
    f.resolver.set("metadata.v6.test", &[ip("fd00:ec2::254")]);
    let (h, proxy) = start(&f);
    let got = get(proxy, "http://169.254.169.254/latest/meta-data/", &[]).await;
    assert_eq!(got.status, 403, "{}", got.text());
    assert!(got.text().contains("default-deny"), "{}", got.text());
    let got = get(
        proxy,
        "http://metadata.google.internal/computeMetadata/v1/",
        &[],
    )
    .await;
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("address-guard:link-local"),
        "{}",
        got.text()
    );
    let (code, _) = connect(proxy, "169.254.169.254:80", "").await.unwrap_err();
    assert_eq!(code, 403);
    let (code, text) = connect(proxy, "metadata.google.internal:443", "")
        .await
        .unwrap_err();
    assert_eq!(code, 403);
    assert!(text.contains("address-guard:link-local"), "{text}");
    let got = get(proxy, "http://metadata.v6.test/", &[]).await;
    assert!(
        got.text().contains("address-guard:unique-local"),
        "{}",
        got.text()
    );
    let got = get(proxy, "http://[fd00:ec2::254]/", &[]).await;
    assert_eq!(got.status, 403);
    // disguised numeric forms of 127.0.0.1 / the metadata address
    for host in ["2130706433", "0x7f.1", "127.1", "0xa9fea9fe"] {
        let got = get(proxy, &format!("http://{host}/"), &[]).await;
        assert_eq!(got.status, 403, "{host}: {}", got.text());
    }
    assert!(h.events().iter().all(|e| e.decision != Decision::Allow));
}

// ---------------------------------------------------------------- hostile protocol input

async fn raw(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (_h, proxy) = start(&f);
    let a = format!("api.example.test:{port}");
    let cases: Vec<(String, &str)> = vec![
        // origin-form: not a proxy request
        (format!("GET / HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"), "400"),
        // https in absolute form
        (format!("GET https://{a}/ HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"), "400"),
        // credentials in the authority
        (format!("GET http://user:pw@{a}/ HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"), "40"),
        // CONNECT without a port
        ("CONNECT api.example.test HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n".into(), "40"),
        // a huge header
        (format!("GET http://{a}/ HTTP/1.1\r\nHost: {a}\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000)), "431"),
        // garbage
        ("\x16\x03\x01\x00\x05hello\r\n\r\n".into(), "400"),
    ];
    for (req, want) in cases {
        let resp = raw(proxy, req.as_bytes()).await;
        let status = resp.split(' ').nth(1).unwrap_or("");
        assert!(
            status.starts_with(want) || (resp.is_empty() && want != "400"),
            "request {:?} got {:?}",
            &req[..req.len().min(80)],
            &resp[..resp.len().min(200)]
        );
    }
    // smuggling: Content-Length and Transfer-Encoding together, with a request hidden in a
    // body that a Content-Length reader would see. The upstream must get one request whose
    // framing matches its body, and never the hidden one.
    let hidden = format!("GET http://{a}/smuggled HTTP/1.1\r\nHost: {a}\r\n\r\n");
    let req = format!(
        "POST http://{a}/front HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}",
        5 + hidden.len()
    );
    let _ = raw(proxy, req.as_bytes()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seen = up.rec.all();
    assert!(
        seen.iter().all(|s| !s.target.contains("smuggled")),
        "{seen:#?}"
    );
    for s in seen.iter().filter(|s| s.target == "/front") {
        let cl = s
            .header("content-length")
            .map(|v| v.parse::<usize>().unwrap());
        assert!(cl.is_none() || cl == Some(s.body.len()), "{s:?}");
    }
    // the Host header cannot point the request elsewhere: the upstream sees the URL's host
    let got = get(proxy, &format!("http://{a}/h"), &[("host", "evil.test")]).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        up.rec.all().last().unwrap().header("host"),
        Some(a.as_str())
    );
    // hop-by-hop and proxy credentials are not forwarded
    let got = get(
        proxy,
        &format!("http://{a}/hop"),
        &[
            ("proxy-authorization", "Basic eDp5"),
            ("connection", "x-drop"),
            ("x-drop", "1"),
        ],
    )
    .await;
    assert_eq!(got.status, 200);
    let last = up.rec.all().last().cloned().unwrap();
    assert_eq!(last.header("proxy-authorization"), None);
    assert_eq!(last.header("x-drop"), None);
}

// ---------------------------------------------------------------- limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rate_and_count_limits_hold() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits = EgressLimits {
        requests_per_second: 0.01,
        request_burst: 3,
        ..Default::default()
    };
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let url = format!("http://api.example.test:{port}/");
    let mut c = proxy_client(proxy).await;
    for _ in 0..3 {
        assert_eq!(
            send(&mut c, "GET", &url, &[], vec![]).await.unwrap().status,
            200
        );
    }
    let got = send(&mut c, "GET", &url, &[], vec![]).await.unwrap();
    assert_eq!(got.status, 429);
    assert_eq!(got.header("x-cordon-rule"), Some("limit:request_rate"));
    // the connection is ended after the refusal
    assert!(send(&mut c, "GET", &url, &[], vec![]).await.is_err());
    assert_eq!(up.rec.count(), 3);
    wait_event(&h, |e| {
        e.decision == Decision::Limit && e.rule.as_deref() == Some("limit:request_rate")
    })
    .await;

    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.max_requests = Some(2);
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (_h2, proxy) = start(&f);
    assert_eq!(get(proxy, &url, &[]).await.status, 200);
    assert_eq!(get(proxy, &url, &[]).await.status, 200);
    let got = get(proxy, &url, &[]).await;
    assert_eq!(got.status, 429);
    assert_eq!(got.header("x-cordon-rule"), Some("limit:requests"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_limits_hold_each_way() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.max_bytes_down = 100_000;
    f.cfg.limits.max_bytes_up = 50_000;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    // download of 1 MB against a 100 kB budget
    let mut c = proxy_client(proxy).await;
    let r = send(
        &mut c,
        "GET",
        &format!("http://api.example.test:{port}/big?n=1000000"),
        &[],
        vec![],
    )
    .await;
    if let Ok(g) = r {
        assert!(g.body.len() < 100_000, "got {} bytes", g.body.len());
    }
    wait_event(&h, |e| e.rule.as_deref() == Some("limit:bytes_down")).await;
    assert!(h.stats().bytes_down <= 100_000, "{:?}", h.stats());
    // the budget is the sandbox's, not the connection's: a new connection gets nothing
    let mut c = proxy_client(proxy).await;
    assert!(
        send(
            &mut c,
            "GET",
            &format!("http://api.example.test:{port}/small"),
            &[],
            vec![]
        )
        .await
        .is_err()
    );

    // upload of 200 kB against a 50 kB budget
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.max_bytes_up = 50_000;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let before = up.rec.count();
    let mut c = proxy_client(proxy).await;
    let r = send(
        &mut c,
        "POST",
        &format!("http://api.example.test:{port}/up"),
        &[],
        vec![b'u'; 200_000],
    )
    .await;
    assert!(r.map(|g| g.status != 200).unwrap_or(true));
    wait_event(&h, |e| e.rule.as_deref() == Some("limit:bytes_up")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    for s in up.rec.all().iter().skip(before) {
        assert!(s.body.len() < 200_000, "the upstream got the whole upload");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_holds_and_frees() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.max_connections = 2;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let t1 = connect(proxy, &format!("api.example.test:{port}"), "")
        .await
        .unwrap();
    let t2 = connect(proxy, &format!("api.example.test:{port}"), "")
        .await
        .unwrap();
    let (code, text) = connect(proxy, &format!("api.example.test:{port}"), "")
        .await
        .unwrap_err();
    assert_eq!(code, 429);
    assert!(text.contains("limit:connections"), "{text}");
    wait_event(&h, |e| e.rule.as_deref() == Some("limit:connections")).await;
    drop(t1);
    // the slot frees once the proxy sees the close (bounded wait)
    let mut ok = false;
    for _ in 0..100 {
        if connect(proxy, &format!("api.example.test:{port}"), "")
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "a freed connection slot was not reused");
    drop(t2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_total_timeouts_end_connections() {
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.idle_timeout_ms = 300;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let mut t = connect(proxy, &format!("api.example.test:{port}"), "")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut buf)).await;
    assert!(r.is_ok(), "idle tunnel was not closed");
    let ev = wait_event(&h, |e| e.rule.as_deref() == Some("limit:idle_timeout")).await;
    assert_eq!(ev.decision, Decision::Limit);

    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        None,
    );
    f.cfg.limits.connection_timeout_ms = 500;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let mut c = proxy_client(proxy).await;
    let started = std::time::Instant::now();
    let mut ended = false;
    for _ in 0..50 {
        if send(
            &mut c,
            "GET",
            &format!("http://api.example.test:{port}/busy"),
            &[],
            vec![],
        )
        .await
        .is_err()
        {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ended, "a busy connection outlived its total timeout");
    assert!(started.elapsed() < Duration::from_secs(3));
    wait_event(&h, |e| {
        e.rule.as_deref() == Some("limit:connection_timeout")
    })
    .await;
}

// ---------------------------------------------------------------- unix socket and lifecycle

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_serves_and_shutdown_makes_placeholders_worthless() {
    let ca = TestCa::new();
    let up = http_upstream().await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("api.example.test:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    let sock = f.dir.path().join("egress.sock");
    // a stale socket file from a previous run is replaced
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    f.cfg.unix_socket = Some(sock.clone());
    f.cfg.tcp_listen = None;
    f.resolver.set("api.example.test", &[ip("127.0.0.1")]);
    let h = EgressProxy::start(f.cfg.clone(), &tokio::runtime::Handle::current()).unwrap();
    let env = h.sandbox_env();
    assert!(env.contains(&("HTTP_PROXY".into(), "http://127.0.0.1:3128".into())));
    assert!(env.contains(&("https_proxy".into(), "http://127.0.0.1:3128".into())));
    assert!(env.contains(&("NO_PROXY".into(), String::new())));
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ] {
        assert!(env.iter().any(|(n, _)| n == k), "{k} missing");
    }
    let ph = placeholder(&h);
    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(
        format!("GET http://api.example.test:{port}/unix HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    assert!(buf.starts_with("HTTP/1.1 200"), "{buf}");
    assert!(buf.ends_with("hello from upstream /unix"));

    let report = h.shutdown().await;
    assert!(!sock.exists(), "socket file left behind");
    assert!(tokio::net::UnixStream::connect(&sock).await.is_err());
    assert!(
        report
            .events
            .iter()
            .any(|e| e.kind == Kind::Http && e.decision == Decision::Allow)
    );
    assert!(report.events.iter().any(|e| e.decision == Decision::Closed));
    assert!(report.stats.bytes_down > 0);
    // a new proxy for the same grants issues new placeholders: the old one means nothing
    f.cfg.unix_socket = None;
    f.cfg.tcp_listen = Some("127.0.0.1:0".parse().unwrap());
    let (h2, _) = start(&f);
    assert_ne!(placeholder(&h2), ph);
}

#[test]
fn owned_runtime_starts_and_stops_from_sync_code() {
    let f = fixture(&["api.example.test".into()], None);
    let h = EgressProxy::start_owned(f.cfg.clone()).unwrap();
    let addr = h.tcp_addr().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    s.write_all(
        b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let report = h.shutdown_blocking();
    assert!(report.events.iter().any(|e| e.decision == Decision::Deny));
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn bad_configuration_is_refused_with_a_clear_error() {
    // A bad entry never reaches the proxy: it is refused where it is read.
    let e = serde_json::from_str::<EgressPolicy>(r#"{"allow": ["bad host name"]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad host name") && e.contains("*.suffix"), "{e}");
    let mut f = fixture(&[], None);
    f.cfg.tcp_listen = Some("0.0.0.0:0".parse().unwrap());
    let e = EgressProxy::start_owned(f.cfg.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("loopback"), "{e}");
    let mut f = fixture(&[], None);
    f.cfg.tcp_listen = None;
    assert!(EgressProxy::start_owned(f.cfg.clone()).is_err());
    let mut f = fixture(&[], None);
    let mut g = grant(&f, &[], &[]);
    g.secret = GrantSecret::value("short");
    f.cfg.grants = vec![g];
    let e = EgressProxy::start_owned(f.cfg.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("shorter"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_stream_tells_why_a_client_rejected_the_sandbox_ca() {
    let ca = TestCa::new();
    let up = https_upstream(&ca, &[GRANT_HOST]).await;
    let port = up.addr.port();
    let mut f = fixture(
        &[format!("{GRANT_HOST}:{port}"), "127.0.0.1/32:*".into()],
        Some(&ca),
    );
    f.cfg.grants = vec![grant(&f, &[], &[])];
    f.resolver.set(GRANT_HOST, &[ip("127.0.0.1")]);
    let (h, proxy) = start(&f);
    let mut rx = h.subscribe();
    // a client that trusts only the upstream's CA, not the sandbox CA
    let r = https_client(proxy, &format!("{GRANT_HOST}:{port}"), GRANT_HOST, &ca.pem).await;
    assert!(r.is_err());
    let mut kinds = Vec::new();
    let hint = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let ev = rx.recv().await.unwrap();
            kinds.push((ev.kind, ev.decision));
            if ev.rule.as_deref() == Some("tls") {
                return ev;
            }
        }
    })
    .await
    .expect("no tls event on the audit stream");
    assert_eq!(hint.decision, Decision::Error);
    assert!(hint.reason.unwrap().contains("SSL_CERT_FILE"));
    assert!(kinds.contains(&(Kind::Connect, Decision::Allow)));
    assert_eq!(up.rec.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_resolver_answers_are_guarded_too() {
    let up = http_upstream().await;
    let port = up.addr.port();
    // the host's own resolver says localhost is loopback: refused without an explicit range
    let mut f = fixture(&[format!("localhost:{port}")], None);
    f.cfg.resolver = None;
    let (_h, proxy) = start(&f);
    let got = get(proxy, &format!("http://localhost:{port}/sys"), &[]).await;
    assert_eq!(got.status, 403, "{}", got.text());
    assert!(
        got.text().contains("address-guard:loopback"),
        "{}",
        got.text()
    );
    // naming the ranges explicitly lets it through (trying each checked address in turn)
    let mut f = fixture(
        &[
            format!("localhost:{port}"),
            "127.0.0.0/8:*".into(),
            "[::1]:*".into(),
        ],
        None,
    );
    f.cfg.resolver = None;
    let (_h, proxy) = start(&f);
    let got = get(proxy, &format!("http://localhost:{port}/sys"), &[]).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(up.rec.count(), 1);
}

#[test]
fn config_from_a_sandbox_spec() {
    let mut spec = cordon_core::SandboxSpec::new(cordon_core::Tier::Container);
    spec.egress.allow = cordon_core::egress::parse_patterns(&["api.example.test"]).unwrap();
    let mut cfg = ProxyConfig::for_spec("sbx-9", &spec);
    assert_eq!(cfg.policy.allow, spec.egress.allow);
    assert!(cfg.validate().is_err(), "no listener yet");
    cfg.tcp_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.validate().unwrap();
}
