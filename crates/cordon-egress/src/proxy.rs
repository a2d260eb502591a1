//! The proxy itself: accept loops, the HTTP forward path, CONNECT tunnels, and the requests
//! inside TLS connections it terminates for granted hosts.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_http1;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::LazyConfigAcceptor;

use crate::audit::{AuditEvent, Decision, Kind};
use crate::body::{ProxyBody, RedactBody, ScanBody, box_err, empty, full};
use crate::conn::{Conn, MeteredIo};
use crate::policy::{Host, Refusal, path_has_prefix, path_is_canonical};
use crate::scan::{StreamDetector, StreamRedactor, redact_bytes};
use crate::secrets::GrantDecision;
use crate::shared::Shared;
use crate::target::{BadTarget, authority_names, connect_target, host_header, http_target};
use crate::tls::server_name;

/// A client stream: unix or TCP.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ClientStream for T {}

/// Takes a freshly accepted client stream through admission and serves it.
pub(crate) fn spawn_client(shared: &Arc<Shared>, stream: Box<dyn ClientStream>) {
    let id = shared.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let permit = match shared.conn_sem.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let mut ev = AuditEvent::new(id, Kind::Connection, Decision::Limit);
            ev.rule = Some("limit:connections".into());
            ev.reason = Some(format!(
                "more than {} connections open at once",
                shared.limits.max_connections
            ));
            shared.audit.record(ev);
            shared
                .tracker
                .spawn(refuse_raw(stream, shared.limits.max_connections));
            return;
        }
    };
    let conn = Conn::new(id, shared.clone(), permit);
    shared.tracker.spawn(serve_client(conn, stream));
}

async fn refuse_raw(mut stream: Box<dyn ClientStream>, max: u32) {
    let body = format!(
        "cordon egress: refused by rule limit:connections: this sandbox already has {max} connections open\n"
    );
    let msg = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\nx-cordon-rule: limit:connections\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        stream.write_all(msg.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

type RespFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>,
>;

struct ClientCtx {
    conn: Arc<Conn>,
    upstream: Mutex<Option<Upstream>>,
}

/// A kept-alive upstream HTTP/1 connection.
struct Upstream {
    key: (Host, u16),
    addr: SocketAddr,
    sender: client_http1::SendRequest<ProxyBody>,
}

type BoxFut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Builds the HTTP/1 server future for a client connection. A plain function (not async) so
/// that its `Send`-ness is proven with concrete lifetimes.
fn serve_http(conn: &Arc<Conn>, stream: Box<dyn ClientStream>) -> BoxFut {
    let io = TokioIo::new(MeteredIo::new(stream, conn.clone()));
    let ctx = Arc::new(ClientCtx {
        conn: conn.clone(),
        upstream: Mutex::new(None),
    });
    let svc = service_fn(move |req| -> RespFuture {
        let ctx = ctx.clone();
        Box::pin(async move { Ok::<_, Infallible>(handle(ctx, req).await) })
    });
    let mut builder = server_http1::Builder::new();
    builder
        .max_buf_size(conn.shared.limits.max_header_bytes.max(64 << 10))
        .max_header_size(conn.shared.limits.max_header_bytes)
        .keep_alive(true);
    let served = builder.serve_connection(io, svc).with_upgrades();
    Box::pin(async move {
        let _ = served.await;
    })
}

async fn serve_client(conn: Arc<Conn>, stream: Box<dyn ClientStream>) {
    let served = serve_http(&conn, stream);
    let _ = conn.guarded(served).await;
}

/// Why a target could not be reached.
enum TargetError {
    Refused(Refusal, Option<IpAddr>),
    Unreachable(String),
}

fn text(status: StatusCode, rule: &str, reason: &str, close: bool) -> Response<ProxyBody> {
    let body = format!("cordon egress: refused by rule {rule}: {reason}\n");
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(rule) {
        h.insert("x-cordon-rule", v);
    }
    if close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

fn bad_gateway(reason: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("cordon egress: upstream failed: {reason}\n")));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Common fields of a request event.
#[derive(Clone)]
struct ReqInfo {
    kind: Kind,
    host: String,
    port: u16,
    method: String,
    path: String,
}

impl ReqInfo {
    fn event(&self, conn: &Conn, decision: Decision) -> AuditEvent {
        let mut ev = AuditEvent::new(conn.id, self.kind, decision);
        ev.host = Some(self.host.clone()).filter(|h| !h.is_empty());
        ev.port = Some(self.port).filter(|p| *p != 0);
        ev.method = Some(self.method.clone());
        ev.path = Some(self.path.clone()).filter(|p| !p.is_empty());
        ev
    }
}

fn refuse(conn: &Conn, info: &ReqInfo, decision: Decision, r: &Refusal) -> Response<ProxyBody> {
    let mut ev = info.event(conn, decision);
    ev.rule = Some(r.rule.clone());
    ev.reason = Some(r.reason.clone());
    conn.shared.audit.record(ev);
    text(StatusCode::FORBIDDEN, &r.rule, &r.reason, false)
}

/// Answers a request whose target the proxy will not carry (audited where it says so).
fn bad_target(conn: &Conn, info: &mut ReqInfo, b: BadTarget) -> Response<ProxyBody> {
    if b.port != 0 {
        info.port = b.port;
    }
    if b.audited {
        let mut ev = info.event(conn, Decision::Deny);
        ev.rule = Some(b.refusal.rule.clone());
        ev.reason = Some(b.refusal.reason.clone());
        conn.shared.audit.record(ev);
    }
    text(b.status, &b.refusal.rule, &b.refusal.reason, false)
}

/// Request-rate and request-count admission. A refusal ends the connection.
fn admit(conn: &Conn, info: &ReqInfo) -> Option<Response<ProxyBody>> {
    let shared = &conn.shared;
    let n = shared.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let refusal = if shared.limits.max_requests.is_some_and(|max| n > max) {
        Some((
            "limit:requests",
            format!(
                "the sandbox made more than {} requests",
                shared.limits.max_requests.unwrap_or(0)
            ),
        ))
    } else if !shared.rate.try_take() {
        Some((
            "limit:request_rate",
            format!(
                "more than {} requests per second (burst {})",
                shared.limits.requests_per_second, shared.limits.request_burst
            ),
        ))
    } else {
        None
    };
    let (rule, reason) = refusal?;
    let mut ev = info.event(conn, Decision::Limit);
    ev.rule = Some(rule.into());
    ev.reason = Some(reason.clone());
    shared.audit.record(ev);
    // End the connection once this response is out.
    let resp = text(StatusCode::TOO_MANY_REQUESTS, rule, &reason, true);
    Some(resp)
}

async fn handle(ctx: Arc<ClientCtx>, req: Request<Incoming>) -> Response<ProxyBody> {
    let conn = &ctx.conn;
    let is_connect = req.method() == Method::CONNECT;
    let info = ReqInfo {
        kind: if is_connect {
            Kind::Connect
        } else {
            Kind::Http
        },
        host: req.uri().host().unwrap_or("").to_string(),
        port: req.uri().port_u16().unwrap_or(0),
        method: req.method().to_string(),
        path: if is_connect {
            String::new()
        } else {
            req.uri().path().to_string()
        },
    };
    if let Some(resp) = admit(conn, &info) {
        return resp;
    }
    if is_connect {
        connect(ctx, req, info).await
    } else {
        forward(ctx, req, info).await
    }
}

/// Checks `host:port` against the policy, resolves it (once) and connects to a checked
/// address. Never resolves twice.
async fn open_target(
    shared: &Shared,
    host: &Host,
    port: u16,
) -> Result<(TcpStream, SocketAddr), TargetError> {
    let addrs: Vec<IpAddr> = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => {
            let fut = shared.resolver.resolve(name);
            match tokio::time::timeout(shared.limits.connect_timeout(), fut).await {
                Ok(Ok(a)) if !a.is_empty() => a,
                Ok(Ok(_)) => {
                    return Err(TargetError::Unreachable(format!("{name} has no address")));
                }
                Ok(Err(e)) => {
                    return Err(TargetError::Unreachable(format!(
                        "cannot resolve {name}: {e}"
                    )));
                }
                Err(_) => {
                    return Err(TargetError::Unreachable(format!(
                        "resolving {name} timed out"
                    )));
                }
            }
        }
    };
    // Every answer must pass: a mix of public and internal addresses is a rebinding attempt.
    for ip in &addrs {
        shared
            .policy
            .check_addr(*ip, port)
            .map_err(|r| TargetError::Refused(r, Some(*ip)))?;
    }
    let mut last_err = String::new();
    for ip in addrs.iter().take(4) {
        let addr = SocketAddr::new(*ip, port);
        match tokio::time::timeout(shared.limits.connect_timeout(), TcpStream::connect(addr)).await
        {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, addr));
            }
            Ok(Err(e)) => last_err = format!("connect to {addr}: {e}"),
            Err(_) => last_err = format!("connect to {addr} timed out"),
        }
    }
    Err(TargetError::Unreachable(last_err))
}

fn target_error(conn: &Conn, info: &ReqInfo, e: TargetError) -> Response<ProxyBody> {
    match e {
        TargetError::Refused(r, ip) => {
            let mut ev = info.event(conn, Decision::Deny);
            ev.rule = Some(r.rule.clone());
            ev.reason = Some(r.reason.clone());
            ev.addr = ip.map(|i| i.to_string());
            conn.shared.audit.record(ev);
            text(StatusCode::FORBIDDEN, &r.rule, &r.reason, false)
        }
        TargetError::Unreachable(why) => {
            let mut ev = info.event(conn, Decision::Error);
            ev.rule = Some("upstream".into());
            ev.reason = Some(why.clone());
            conn.shared.audit.record(ev);
            bad_gateway(&why)
        }
    }
}

/// Checks method/path rules for a host with HTTP rules.
fn check_http_rules(
    shared: &Shared,
    host: &Host,
    method: &Method,
    path: &str,
) -> Result<(), Refusal> {
    for r in shared
        .http_rules
        .iter()
        .filter(|r| r.host.matches_host(host))
    {
        let rule = format!("http-rule {}", r.host.text);
        if !r.methods.is_empty() && !r.methods.contains(method) {
            return Err(Refusal::new(
                rule,
                format!("method {method} is not allowed for {host}"),
            ));
        }
        if !r.paths.is_empty() {
            if !path_is_canonical(path) {
                return Err(Refusal::new(
                    rule,
                    "paths with dot segments or encoded separators are refused".to_string(),
                ));
            }
            if !r.paths.iter().any(|p| path_has_prefix(path, p)) {
                return Err(Refusal::new(
                    rule,
                    format!("path {path} is not allowed for {host}"),
                ));
            }
        }
    }
    Ok(())
}

/// Headers that belong to one hop and are never forwarded.
fn strip_hop_headers(h: &mut HeaderMap) {
    if h.contains_key(header::TRANSFER_ENCODING) {
        h.remove(header::CONTENT_LENGTH);
    }
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
    h.remove("proxy-connection");
    h.remove("keep-alive");
}

/// A detector for every placeholder whose grant does not cover `host`.
fn foreign_placeholders(shared: &Shared, host: &Host) -> StreamDetector {
    StreamDetector::new(
        shared
            .grants
            .placeholders()
            .filter(|(i, _)| !shared.grants.list[*i].covers(host))
            .map(|(i, p)| (i, p.to_vec()))
            .collect(),
    )
}

fn scanned_body(conn: &Arc<Conn>, body: Incoming, host: &Host, info: &ReqInfo) -> ProxyBody {
    let det = foreign_placeholders(&conn.shared, host);
    if det.is_empty() {
        return body.map_err(box_err).boxed();
    }
    let c = conn.clone();
    let info = info.clone();
    let on_hit = Box::new(move |grant: usize| {
        let name = c.shared.grants.list[grant].name.clone();
        let mut ev = info.event(&c, Decision::Exfiltration);
        ev.rule = Some(format!("grant:{name}"));
        ev.reason = Some(format!(
            "the request body carried the placeholder of grant {name:?} towards {}, which that grant does not cover",
            info.host
        ));
        ev.grant = Some(name.clone());
        c.shared.audit.record(ev);
        c.end(
            &format!("grant:{name}"),
            "credential placeholder in a request body to a host its grant does not cover".into(),
        );
    });
    ScanBody::new(body, det, on_hit).boxed()
}

fn grant_refusal(conn: &Conn, info: &ReqInfo, d: GrantDecision) -> Option<Response<ProxyBody>> {
    match d {
        GrantDecision::Refuse {
            exfiltration,
            grant,
            refusal,
        } => {
            let decision = if exfiltration {
                Decision::Exfiltration
            } else {
                Decision::Deny
            };
            let mut ev = info.event(conn, decision);
            ev.rule = Some(refusal.rule.clone());
            ev.reason = Some(refusal.reason.clone());
            ev.grant = Some(grant);
            conn.shared.audit.record(ev);
            Some(text(
                StatusCode::FORBIDDEN,
                &refusal.rule,
                &refusal.reason,
                false,
            ))
        }
        _ => None,
    }
}

/// Absolute-form plain HTTP.
async fn forward(
    ctx: Arc<ClientCtx>,
    req: Request<Incoming>,
    mut info: ReqInfo,
) -> Response<ProxyBody> {
    let conn = &ctx.conn;
    let shared = &conn.shared;
    let uri = req.uri().clone();
    let (host, port) = match http_target(&uri) {
        Ok(t) => t,
        Err(b) => return bad_target(conn, &mut info, b),
    };
    info.port = port;
    info.host = host.to_string();
    let allow_rule = match shared.policy.check_host(&host, port) {
        Ok(rule) => rule,
        Err(r) => return refuse(conn, &info, Decision::Deny, &r),
    };
    let method = req.method().clone();
    let path = uri.path().to_string();
    if let Err(r) = check_http_rules(shared, &host, &method, &path) {
        return refuse(conn, &info, Decision::Deny, &r);
    }
    let hits = shared.grants.find(&uri.to_string(), req.headers());
    if let Some(resp) = grant_refusal(
        conn,
        &info,
        shared.grants.decide(&host, false, &method, &path, &hits),
    ) {
        return resp;
    }
    let (parts, body) = req.into_parts();
    let mut out = Request::new(scanned_body(conn, body, &host, &info));
    *out.method_mut() = parts.method;
    *out.uri_mut() = match uri.path_and_query() {
        Some(pq) => pq
            .as_str()
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/")),
        None => Uri::from_static("/"),
    };
    let mut headers = parts.headers;
    strip_hop_headers(&mut headers);
    // The body is re-framed from what hyper parsed; a client-sent Content-Length must not
    // disagree with it upstream (request smuggling).
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::HOST);
    if let Some(v) = host_header(&host, port, 80) {
        headers.insert(header::HOST, v);
    }
    if !shared.grants.list.is_empty() {
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    *out.headers_mut() = headers;

    let key = (host.clone(), port);
    let mut slot = ctx.upstream.lock().await;
    let reuse = match slot.take() {
        Some(mut u) if u.key == key && !u.sender.is_closed() => {
            if u.sender.ready().await.is_ok() {
                Some(u)
            } else {
                None
            }
        }
        _ => None,
    };
    let mut up = match reuse {
        Some(u) => u,
        None => {
            let (tcp, addr) = match open_target(shared, &host, port).await {
                Ok(t) => t,
                Err(e) => return target_error(conn, &info, e),
            };
            match handshake(shared, TokioIo::new(tcp)).await {
                Ok(sender) => Upstream { key, addr, sender },
                Err(e) => return target_error(conn, &info, TargetError::Unreachable(e)),
            }
        }
    };
    let addr = up.addr;
    let result = up.sender.send_request(out).await;
    *slot = Some(up);
    drop(slot);
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            let mut ev = info.event(conn, Decision::Error);
            ev.rule = Some("upstream".into());
            ev.reason = Some(format!("request to {addr} failed: {e}"));
            ev.addr = Some(addr.ip().to_string());
            shared.audit.record(ev);
            return bad_gateway(&format!("request to {} failed", info.host));
        }
    };
    let mut ev = info.event(conn, Decision::Allow);
    ev.rule = Some(allow_rule);
    ev.addr = Some(addr.ip().to_string());
    ev.status = Some(resp.status().as_u16());
    shared.audit.record(ev);
    let (mut parts, body) = resp.into_parts();
    strip_hop_headers(&mut parts.headers);
    masked_response(shared, conn, &info, parts, body.map_err(box_err).boxed())
}

async fn handshake<T>(
    shared: &Shared,
    io: T,
) -> Result<client_http1::SendRequest<ProxyBody>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = client_http1::Builder::new()
        .handshake::<_, ProxyBody>(io)
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    let cancel = shared.cancel.clone();
    shared.tracker.spawn(async move {
        tokio::select! {
            _ = connection => {}
            _ = cancel.cancelled() => {}
        }
    });
    Ok(sender)
}

/// CONNECT: an opaque tunnel, or TLS termination for granted hosts.
async fn connect(
    ctx: Arc<ClientCtx>,
    mut req: Request<Incoming>,
    mut info: ReqInfo,
) -> Response<ProxyBody> {
    let conn = ctx.conn.clone();
    let shared = conn.shared.clone();
    let (host, port) = match connect_target(req.uri()) {
        Ok(t) => t,
        Err(b) => return bad_target(&conn, &mut info, b),
    };
    info.port = port;
    info.host = host.to_string();
    let allow_rule = match shared.policy.check_host(&host, port) {
        Ok(rule) => rule,
        Err(r) => return refuse(&conn, &info, Decision::Deny, &r),
    };
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .unwrap_or_default();
    let hits = shared.grants.find(authority, req.headers());
    if let Some(resp) = grant_refusal(
        &conn,
        &info,
        shared
            .grants
            .decide(&host, false, &Method::CONNECT, "/", &hits),
    ) {
        return resp;
    }
    let terminate = shared.terminates(&host);
    let (tcp, addr) = match open_target(&shared, &host, port).await {
        Ok(t) => t,
        Err(e) => return target_error(&conn, &info, e),
    };
    // For terminated hosts, verify the upstream now so a bad certificate is a clear 502.
    let leg = if terminate {
        let name = match server_name(&host) {
            Ok(n) => n,
            Err(e) => return target_error(&conn, &info, TargetError::Unreachable(e)),
        };
        let tls = match shared.upstream_tls() {
            Ok(t) => t,
            Err(e) => return target_error(&conn, &info, TargetError::Unreachable(e)),
        };
        let hs = tls.connect(name, tcp);
        match tokio::time::timeout(shared.limits.connect_timeout(), hs).await {
            Ok(Ok(s)) => Leg::Tls(Box::new(s)),
            Ok(Err(e)) => {
                return target_error(
                    &conn,
                    &info,
                    TargetError::Unreachable(format!("TLS to {} ({addr}) failed: {e}", info.host)),
                );
            }
            Err(_) => {
                return target_error(
                    &conn,
                    &info,
                    TargetError::Unreachable(format!("TLS to {} timed out", info.host)),
                );
            }
        }
    } else {
        Leg::Tunnel(tcp)
    };
    let mut ev = info.event(&conn, Decision::Allow);
    ev.rule = Some(allow_rule);
    ev.addr = Some(addr.ip().to_string());
    ev.terminated = Some(terminate);
    shared.audit.record(ev);

    let on_upgrade = hyper::upgrade::on(&mut req);
    let task_conn = conn.clone();
    shared.tracker.spawn(async move {
        let conn = task_conn;
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let client = TokioIo::new(upgraded);
        match leg {
            Leg::Tls(tls) => {
                let Ok(sender) = handshake(&conn.shared, TokioIo::new(*tls)).await else {
                    return;
                };
                let up = Upstream {
                    key: (host.clone(), port),
                    addr,
                    sender,
                };
                let _ = conn
                    .guarded(terminated(conn.clone(), client, host, port, up))
                    .await;
            }
            Leg::Tunnel(tcp) => {
                let _ = conn.guarded(tunnel(&conn, client, tcp, &host, &info)).await;
            }
        }
    });
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::OK;
    r
}

enum Leg {
    Tunnel(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

const TUNNEL_BUF: usize = 64 << 10;

/// Reads the server name from a TLS ClientHello at the start of an opaque tunnel, without
/// terminating anything: a tunnel opened for one host must not carry a handshake for another.
#[derive(Default)]
struct HelloCheck {
    acceptor: rustls::server::Acceptor,
    seen: usize,
    first: Option<u8>,
    failed: bool,
}

enum HelloVerdict {
    NeedMore,
    /// Finished: the SNI if the stream starts with a ClientHello that carries one.
    Done(Option<String>),
    /// The stream starts as a TLS handshake whose ClientHello cannot be read (malformed, or
    /// larger than the check reads): its server name cannot be checked, so it is refused.
    Unreadable,
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

impl HelloCheck {
    const MAX: usize = 32 << 10;

    fn feed(&mut self, mut bytes: &[u8]) -> HelloVerdict {
        if self.first.is_none() {
            self.first = bytes.first().copied();
        }
        self.seen += bytes.len();
        while !bytes.is_empty() {
            match self.acceptor.read_tls(&mut bytes) {
                Ok(0) => break,
                Err(_) => {
                    self.failed = true;
                    break;
                }
                Ok(_) => {}
            }
        }
        match self.acceptor.accept() {
            Ok(Some(accepted)) => {
                HelloVerdict::Done(accepted.client_hello().server_name().map(str::to_string))
            }
            Ok(None) if self.seen < Self::MAX && !self.failed => HelloVerdict::NeedMore,
            _ if self.first == Some(TLS_HANDSHAKE) => HelloVerdict::Unreadable,
            // not TLS (a clear-text protocol): nothing to compare
            _ => HelloVerdict::Done(None),
        }
    }
}

/// An opaque tunnel. Bytes from the sandbox are still watched for placeholders, which
/// catches them in any protocol sent in clear through a tunnel.
async fn tunnel<C>(conn: &Arc<Conn>, client: C, upstream: TcpStream, host: &Host, info: &ReqInfo)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let mut det = foreign_placeholders(&conn.shared, host);
    let mut hello = Some(HelloCheck::default());
    let mut held: Vec<u8> = Vec::new();
    let up = async {
        let mut buf = vec![0u8; TUNNEL_BUF];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                uw.shutdown().await?;
                return Ok::<_, io::Error>(());
            }
            if let Some(g) = det.feed(&buf[..n]) {
                let name = conn.shared.grants.list[g].name.clone();
                let mut ev = info.event(conn, Decision::Exfiltration);
                ev.rule = Some(format!("grant:{name}"));
                ev.reason = Some(format!(
                    "a tunnel to {host} carried the placeholder of grant {name:?}, which does not cover that host"
                ));
                ev.grant = Some(name.clone());
                conn.shared.audit.record(ev);
                conn.end(
                    &format!("grant:{name}"),
                    "credential placeholder in a tunnel to a host its grant does not cover".into(),
                );
                return Err(io::Error::other("placeholder exfiltration"));
            }
            if let Some(check) = hello.as_mut() {
                match check.feed(&buf[..n]) {
                    // Nothing goes upstream before the server name is known.
                    HelloVerdict::NeedMore => {
                        held.extend_from_slice(&buf[..n]);
                        continue;
                    }
                    HelloVerdict::Unreadable => {
                        let mut ev = info.event(conn, Decision::Deny);
                        ev.rule = Some("tls-unreadable".into());
                        ev.reason = Some(format!(
                            "the tunnel to {host} starts a TLS handshake whose ClientHello cannot be read (malformed or over {} KiB), so its server name cannot be checked",
                            HelloCheck::MAX >> 10
                        ));
                        conn.shared.audit.record(ev);
                        conn.end(
                            "tls-unreadable",
                            "a TLS handshake without a readable ClientHello".into(),
                        );
                        return Err(io::Error::other("unreadable client hello"));
                    }
                    HelloVerdict::Done(None) => hello = None,
                    HelloVerdict::Done(Some(sni)) => {
                        hello = None;
                        if Host::parse(&sni).map(|h| h != *host).unwrap_or(true) {
                            let mut ev = info.event(conn, Decision::Deny);
                            ev.rule = Some("sni-mismatch".into());
                            ev.reason = Some(format!(
                                "the TLS server name {sni:?} differs from the CONNECT host {host}"
                            ));
                            conn.shared.audit.record(ev);
                            conn.end(
                                "sni-mismatch",
                                "TLS server name differs from the CONNECT host".into(),
                            );
                            return Err(io::Error::other("sni mismatch"));
                        }
                    }
                }
            }
            if !held.is_empty() {
                // The hello's earlier pieces, held until it could be checked.
                uw.write_all(&held).await?;
                held.clear();
            }
            uw.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0u8; TUNNEL_BUF];
        loop {
            let n = ur.read(&mut buf).await?;
            if n == 0 {
                cw.shutdown().await?;
                return Ok::<_, io::Error>(());
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    let _ = tokio::try_join!(up, down);
}

/// Serves the HTTP requests inside a TLS connection the proxy terminates for `host`.
async fn terminated<C>(conn: Arc<Conn>, client: C, host: Host, port: u16, up: Upstream)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = conn.shared.clone();
    let cfg = match shared.ca.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            conn.end("tls", format!("cannot make a certificate for {host}: {e}"));
            return;
        }
    };
    let start = match LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client).await {
        Ok(s) => s,
        Err(_) => return,
    };
    // SNI, when sent, must name the host the CONNECT asked for.
    let sni_ok = match start.client_hello().server_name() {
        None => true,
        Some(sni) => Host::parse(sni).map(|h| h == host).unwrap_or(false),
    };
    if !sni_ok {
        let mut ev = AuditEvent::new(conn.id, Kind::Connect, Decision::Deny);
        ev.host = Some(host.to_string());
        ev.port = Some(port);
        ev.rule = Some("sni-mismatch".into());
        ev.reason = Some("the TLS server name differs from the CONNECT host".into());
        shared.audit.record(ev);
        conn.end(
            "sni-mismatch",
            "TLS server name differs from the CONNECT host".into(),
        );
        return;
    }
    let tls = match start.into_stream(cfg).await {
        Ok(t) => t,
        Err(e) => {
            let mut ev = AuditEvent::new(conn.id, Kind::Connect, Decision::Error);
            ev.host = Some(host.to_string());
            ev.port = Some(port);
            ev.rule = Some("tls".into());
            ev.reason = Some(format!(
                "TLS with the sandbox failed ({e}); does the client trust the sandbox CA (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, CURL_CA_BUNDLE)?"
            ));
            shared.audit.record(ev);
            return;
        }
    };
    let ctx = Arc::new(TerminatedCtx {
        conn: conn.clone(),
        host,
        port,
        addr: up.addr,
        upstream: Mutex::new(Some(up)),
    });
    let svc = service_fn(move |req| -> RespFuture {
        let ctx = ctx.clone();
        Box::pin(async move { Ok::<_, Infallible>(handle_terminated(ctx, req).await) })
    });
    let mut builder = server_http1::Builder::new();
    builder
        .max_buf_size(shared.limits.max_header_bytes.max(64 << 10))
        .max_header_size(shared.limits.max_header_bytes);
    let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
}

struct TerminatedCtx {
    conn: Arc<Conn>,
    host: Host,
    port: u16,
    addr: SocketAddr,
    upstream: Mutex<Option<Upstream>>,
}

/// Inside a terminated connection, a request names exactly one host and it is the CONNECT
/// host: exactly one `Host` header equal to it, and the target's authority (absolute form)
/// equal to it as well when there is one. No fronting another name through an allowed one,
/// whatever the request form.
fn inner_host_matches(req: &Request<Incoming>, host: &Host, port: u16) -> bool {
    let names = |authority: &str| authority_names(authority, host, port);
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let (Some(one), None) = (hosts.next(), hosts.next()) else {
        return false;
    };
    let Ok(one) = one.to_str() else {
        return false;
    };
    if !names(one) {
        return false;
    }
    match req.uri().authority() {
        Some(a) => names(a.as_str()),
        None => true,
    }
}

/// A response on its way back to a sandbox that holds grants: every form of every secret
/// that has gone upstream is masked in its headers and body, for the sandbox's whole life
/// (an upstream may store a header and return it on a later request). A body this proxy
/// cannot read (compressed although the request asked for identity) is refused.
fn masked_response(
    shared: &Shared,
    conn: &Conn,
    info: &ReqInfo,
    mut parts: http::response::Parts,
    body: ProxyBody,
) -> Response<ProxyBody> {
    let needles = shared.grants.mask_forms();
    if needles.is_empty() {
        return Response::from_parts(parts, body);
    }
    let encoded = parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        let r = Refusal::new(
            "grant-mask",
            "the upstream answered with a compressed body although the request asked for none; a response to a sandbox holding grants is only passed when it can be checked for the secrets",
        );
        let mut ev = info.event(conn, Decision::Deny);
        ev.rule = Some(r.rule.clone());
        ev.reason = Some(r.reason.clone());
        shared.audit.record(ev);
        return text(StatusCode::BAD_GATEWAY, &r.rule, &r.reason, false);
    }
    let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
    for name in names {
        let values: Vec<HeaderValue> = parts.headers.get_all(&name).iter().cloned().collect();
        if values
            .iter()
            .any(|v| redact_bytes(v.as_bytes(), &needles).is_some())
        {
            parts.headers.remove(&name);
            for v in values {
                let nv = redact_bytes(v.as_bytes(), &needles)
                    .and_then(|b| HeaderValue::from_bytes(&b).ok())
                    .unwrap_or(v);
                parts.headers.append(name.clone(), nv);
            }
        }
    }
    Response::from_parts(
        parts,
        RedactBody::new(body, StreamRedactor::new(needles)).boxed(),
    )
}

async fn handle_terminated(ctx: Arc<TerminatedCtx>, req: Request<Incoming>) -> Response<ProxyBody> {
    let conn = &ctx.conn;
    let shared = &conn.shared;
    let host = &ctx.host;
    let info = ReqInfo {
        kind: Kind::Https,
        host: host.to_string(),
        port: ctx.port,
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    };
    if let Some(resp) = admit(conn, &info) {
        return resp;
    }
    if req.method() == Method::CONNECT {
        return refuse(
            conn,
            &info,
            Decision::Deny,
            &Refusal::new("protocol", "CONNECT inside a tunnel"),
        );
    }
    if !inner_host_matches(&req, host, ctx.port) {
        let r = Refusal::new(
            "host-mismatch",
            format!(
                "the request's Host names another host than the tunnel's {host}; domain fronting is refused"
            ),
        );
        return refuse(conn, &info, Decision::Deny, &r);
    }
    // A deny entry added for the host wins here too (the CONNECT already passed the policy).
    if let Err(r) = shared.policy.check_host(host, ctx.port) {
        return refuse(conn, &info, Decision::Deny, &r);
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if let Err(r) = check_http_rules(shared, host, &method, &path) {
        return refuse(conn, &info, Decision::Deny, &r);
    }
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let hits = shared.grants.find(&target, req.headers());
    let over = crate::secrets::method_override(req.headers());
    let decision = shared
        .grants
        .decide_with(host, true, &method, &path, over, &hits);
    let swapped: Vec<usize> = match decision {
        GrantDecision::Swap(list) => list,
        GrantDecision::Pass => Vec::new(),
        refusal => {
            return grant_refusal(conn, &info, refusal)
                .unwrap_or_else(|| text(StatusCode::FORBIDDEN, "grant", "refused", false));
        }
    };
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_hop_headers(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    if let Err(e) = shared.grants.swap(&swapped, &mut headers) {
        let r = Refusal::new("grant", e.to_string());
        return refuse(conn, &info, Decision::Error, &r);
    }
    if !shared.grants.list.is_empty() {
        // Keep any reflection of a secret visible to the response redactor.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    // Checked above to name the tunnel's host; always written in one canonical form.
    headers.remove(header::HOST);
    if let Some(v) = host_header(host, ctx.port, 443) {
        headers.insert(header::HOST, v);
    }
    let mut out = Request::new(scanned_body(conn, body, host, &info));
    *out.method_mut() = parts.method;
    *out.uri_mut() = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    *out.headers_mut() = headers;

    let mut slot = ctx.upstream.lock().await;
    let reuse = match slot.take() {
        Some(mut u) if !u.sender.is_closed() => u.sender.ready().await.is_ok().then_some(u),
        _ => None,
    };
    let mut up = match reuse {
        Some(u) => u,
        // Reconnect to the address checked at CONNECT time: never a second lookup.
        None => match reconnect_tls(shared, host, ctx.port, ctx.addr).await {
            Ok(u) => u,
            Err(e) => return target_error(conn, &info, TargetError::Unreachable(e)),
        },
    };
    let addr = up.addr;
    let result = up.sender.send_request(out).await;
    *slot = Some(up);
    drop(slot);
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            let mut ev = info.event(conn, Decision::Error);
            ev.rule = Some("upstream".into());
            ev.reason = Some(format!("request to {addr} failed: {e}"));
            shared.audit.record(ev);
            return bad_gateway(&format!("request to {host} failed"));
        }
    };
    let mut ev = info.event(conn, Decision::Allow);
    ev.rule = Some(if swapped.is_empty() {
        "tls-terminated".into()
    } else {
        "grant".into()
    });
    ev.addr = Some(addr.ip().to_string());
    ev.status = Some(resp.status().as_u16());
    if !swapped.is_empty() {
        ev.grant = Some(
            swapped
                .iter()
                .map(|i| shared.grants.list[*i].name.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    shared.audit.record(ev);
    let (mut parts, body) = resp.into_parts();
    strip_hop_headers(&mut parts.headers);
    masked_response(shared, conn, &info, parts, body.map_err(box_err).boxed())
}

async fn reconnect_tls(
    shared: &Shared,
    host: &Host,
    port: u16,
    addr: SocketAddr,
) -> Result<Upstream, String> {
    let name = server_name(host)?;
    let work = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let tls = shared
            .upstream_tls()?
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS to {host} ({addr}) failed: {e}"))?;
        handshake(shared, TokioIo::new(tls)).await
    };
    let sender = tokio::time::timeout(shared.limits.connect_timeout(), work)
        .await
        .map_err(|_| format!("reconnecting to {host} timed out"))??;
    Ok(Upstream {
        key: (host.clone(), port),
        addr,
        sender,
    })
}

/// Accepts on a unix socket until cancelled.
pub(crate) async fn accept_unix(shared: Arc<Shared>, listener: tokio::net::UnixListener) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => spawn_client(&shared, Box::new(s)),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }
}

/// Accepts on a TCP listener until cancelled.
pub(crate) async fn accept_tcp(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    spawn_client(&shared, Box::new(s))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }
}
