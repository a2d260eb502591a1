//! Test and bench helpers: upstream HTTP/HTTPS servers on 127.0.0.1, a test CA, and
//! clients that speak to the proxy. Shared by `tests/egress.rs` and `benches/proxy.rs`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
pub use cordon_testkit::tls::TestCa;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What an upstream saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    /// Every byte any upstream saw, for canary checks.
    pub fn everything(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for s in self.all() {
            out.extend_from_slice(format!("{} {} {:?}", s.method, s.target, s.headers).as_bytes());
            out.extend_from_slice(&s.body);
        }
        out
    }
}

/// A pre-built large body so big downloads measure the proxy, not the server.
static BIG: std::sync::LazyLock<Bytes> =
    std::sync::LazyLock::new(|| Bytes::from(vec![b'x'; 64 << 20]));

/// A request's or response's headers as (name, value) text, in their order.
fn header_pairs(h: &hyper::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

async fn upstream_svc(
    rec: Recorder,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let target = req.uri().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = header_pairs(req.headers());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let seen = Seen {
        method,
        target,
        headers,
        body,
    };
    let auth = seen.header("authorization").unwrap_or("").to_string();
    // What an earlier `/store` request sent (an upstream that keeps a header and shows it
    // again later, as a profile or a log viewer would).
    let stored = rec
        .all()
        .iter()
        .rev()
        .find(|s| s.target.ends_with("/store"))
        .and_then(|s| s.header("authorization").map(str::to_string))
        .unwrap_or_default();
    if path != "/big" {
        rec.0.lock().unwrap().push(seen);
    }
    let resp = match path.as_str() {
        "/store" => Response::new(Full::new(Bytes::from_static(b"stored"))),
        "/last" => Response::new(Full::new(Bytes::from(format!("last: {stored}")))),
        // Compresses whatever the client asked for (a misbehaving upstream).
        "/gzip" => {
            let mut r = Response::new(Full::new(Bytes::from(format!("zipped {auth}"))));
            r.headers_mut()
                .insert("content-encoding", http::HeaderValue::from_static("gzip"));
            r
        }
        // Reflects the Authorization header, as a debug endpoint would.
        "/echo-auth" => {
            let mut r = Response::new(Full::new(Bytes::from(format!("you sent: {auth}"))));
            r.headers_mut().insert(
                "x-echo",
                auth.parse().unwrap_or(http::HeaderValue::from_static("")),
            );
            r
        }
        "/big" => {
            let n: usize = query
                .strip_prefix("n=")
                .and_then(|n| n.parse().ok())
                .unwrap_or(1 << 20);
            Response::new(Full::new(BIG.slice(..n.min(BIG.len()))))
        }
        "/status403" => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"upstream says no")));
            *r.status_mut() = StatusCode::FORBIDDEN;
            r
        }
        _ => Response::new(Full::new(Bytes::from(format!(
            "hello from upstream {path}"
        )))),
    };
    Ok(resp)
}

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    pub rec: Recorder,
}

/// A plain HTTP upstream on 127.0.0.1.
pub async fn http_upstream() -> Upstream {
    upstream(None).await
}

/// An HTTPS upstream on 127.0.0.1 with a certificate for `names` from `ca`.
pub async fn https_upstream(ca: &TestCa, names: &[&str]) -> Upstream {
    upstream(Some(tokio_rustls::TlsAcceptor::from(
        ca.server_config(names),
    )))
    .await
}

/// An upstream on 127.0.0.1 recording what it is sent: TLS through `tls` when given, else
/// plain HTTP.
async fn upstream(tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let rec = Recorder::default();
    let r = rec.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let _ = s.set_nodelay(true);
            let r = r.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| upstream_svc(r.clone(), req));
                let http = hyper::server::conn::http1::Builder::new();
                let _ = match tls {
                    None => http.serve_connection(TokioIo::new(s), svc).await,
                    Some(acceptor) => {
                        let Ok(tls) = acceptor.accept(s).await else {
                            return;
                        };
                        http.serve_connection(TokioIo::new(tls), svc).await
                    }
                };
            });
        }
    });
    Upstream { addr, rec }
}

/// A response as a client saw it.
#[derive(Debug)]
pub struct Got {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Got {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1 client connection to the proxy (plain, absolute-form requests).
pub async fn proxy_client(proxy: SocketAddr) -> Sender {
    let s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

pub async fn send(
    sender: &mut Sender,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Got, hyper::Error> {
    sender.ready().await?;
    let mut req = Request::builder().method(method).uri(uri);
    let has_host = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host"));
    if !has_host {
        let host = uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.authority().map(|a| a.to_string()))
            .unwrap_or_default();
        if !host.is_empty() {
            req = req.header("host", host);
        }
    }
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let headers = header_pairs(resp.headers());
    let body = resp.into_body().collect().await?.to_bytes().to_vec();
    Ok(Got {
        status,
        headers,
        body,
    })
}

/// One-shot GET through the proxy.
pub async fn get(proxy: SocketAddr, uri: &str, headers: &[(&str, &str)]) -> Got {
    let mut s = proxy_client(proxy).await;
    send(&mut s, "GET", uri, headers, Vec::new()).await.unwrap()
}

/// Sends CONNECT and returns the stream after a 200, or the status and head otherwise.
pub async fn connect(
    proxy: SocketAddr,
    authority: &str,
    extra: &str,
) -> Result<TcpStream, (u16, String)> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.set_nodelay(true);
    s.write_all(
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
        if head.len() > 65536 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if status == 200 {
        Ok(s)
    } else {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(500), s.read_to_end(&mut rest)).await;
        Err((status, format!("{text}{}", String::from_utf8_lossy(&rest))))
    }
}

pub fn tls_client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

pub type TlsSender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// CONNECT + TLS (trusting `ca_pem`, SNI `sni`) + HTTP/1 over it.
pub async fn https_client(
    proxy: SocketAddr,
    authority: &str,
    sni: &str,
    ca_pem: &str,
) -> Result<TlsSender, String> {
    let s = connect(proxy, authority, "")
        .await
        .map_err(|(c, t)| format!("CONNECT {c}: {t}"))?;
    let connector = tokio_rustls::TlsConnector::from(tls_client_config(ca_pem));
    // A test client: its failures are messages for the test's assertion.
    let name = ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, s)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    // As above: a message for the test's assertion.
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Direct (no proxy) HTTP client connection, for the bench baseline.
pub async fn direct_client(addr: SocketAddr) -> Sender {
    proxy_client(addr).await
}

/// Direct HTTPS client connection, for the bench baseline.
pub async fn direct_tls_client(addr: SocketAddr, sni: &str, ca_pem: &str) -> TlsSender {
    let s = TcpStream::connect(addr).await.unwrap();
    let _ = s.set_nodelay(true);
    let connector = tokio_rustls::TlsConnector::from(tls_client_config(ca_pem));
    let tls = connector
        .connect(ServerName::try_from(sni.to_string()).unwrap(), s)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

pub fn empty_body() -> Empty<Bytes> {
    Empty::new()
}
