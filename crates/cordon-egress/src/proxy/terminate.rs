//! A TLS connection the proxy terminates for a granted host: its own certificate for the
//! host, each request inside checked (host, policy, rules, grants), the grant's secret
//! swapped in and the response masked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;
use tokio_rustls::LazyConfigAcceptor;

use super::answer::{ReqInfo, RespFuture, refuse, text};
use super::decide::admit;
use super::grants::{grant_refusal, masked_response, scanned_body};
use super::upstream::{
    TargetError, Upstream, reconnect_tls, send_kept, strip_hop_headers, target_error,
};
use crate::audit::{AuditEvent, Decision, Kind};
use crate::body::{ProxyBody, box_err};
use crate::conn::Conn;
use crate::policy::{Host, Refusal};
use crate::secrets::GrantDecision;
use crate::target::{authority_names, host_header};

/// Serves the HTTP requests inside a TLS connection the proxy terminates for `host`.
pub(super) async fn terminated<C>(conn: Arc<Conn>, client: C, host: Host, port: u16, up: Upstream)
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

/// A refused or failed request's answer, already audited (boxed: it is the rare path).
type Answer = Box<Response<ProxyBody>>;

async fn handle_terminated(ctx: Arc<TerminatedCtx>, req: Request<Incoming>) -> Response<ProxyBody> {
    let conn = &ctx.conn;
    let info = ReqInfo {
        kind: Kind::Https,
        host: ctx.host.to_string(),
        port: ctx.port,
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    };
    if let Err(refused) = check_request(&ctx, &req, &info) {
        return *refused;
    }
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let swapped = match grant_swaps(&ctx, &req, &target, &info) {
        Ok(swapped) => swapped,
        Err(refused) => return *refused,
    };
    let out = match outbound(&ctx, req, &target, &swapped, &info) {
        Ok(out) => out,
        Err(refused) => return *refused,
    };
    let mut slot = ctx.upstream.lock().await;
    let reuse = match slot.take() {
        Some(mut u) if !u.sender.is_closed() => u.sender.ready().await.is_ok().then_some(u),
        _ => None,
    };
    let up = match reuse {
        Some(u) => u,
        // Reconnect to the address checked at CONNECT time: never a second lookup.
        None => match reconnect_tls(&conn.shared, &ctx.host, ctx.port, ctx.addr).await {
            Ok(u) => u,
            Err(e) => return target_error(conn, &info, TargetError::Unreachable(e)),
        },
    };
    let (resp, addr) = match send_kept(conn, &info, slot, up, out).await {
        Ok(sent) => sent,
        Err(r) => return r,
    };
    record_allowed(conn, &info, &swapped, addr, resp.status());
    let (mut parts, body) = resp.into_parts();
    strip_hop_headers(&mut parts.headers);
    masked_response(
        &conn.shared,
        conn,
        &info,
        parts,
        body.map_err(box_err).boxed(),
    )
}

/// What a request inside the tunnel must be before its grants are looked at: admitted on
/// the connection, not a CONNECT, naming the tunnel's host only, and that host not denied
/// since the CONNECT.
fn check_request(
    ctx: &TerminatedCtx,
    req: &Request<Incoming>,
    info: &ReqInfo,
) -> Result<(), Answer> {
    let conn = &ctx.conn;
    let host = &ctx.host;
    if let Some(resp) = admit(conn, info) {
        return Err(Box::new(resp));
    }
    if req.method() == Method::CONNECT {
        return Err(Box::new(refuse(
            conn,
            info,
            Decision::Deny,
            &Refusal::new("protocol", "CONNECT inside a tunnel"),
        )));
    }
    if !inner_host_matches(req, host, ctx.port) {
        let r = Refusal::new(
            "host-mismatch",
            format!(
                "the request's Host names another host than the tunnel's {host}; domain fronting is refused"
            ),
        );
        return Err(Box::new(refuse(conn, info, Decision::Deny, &r)));
    }
    // A deny entry added for the host wins here too (the CONNECT already passed the policy).
    if let Err(r) = conn.shared.policy.check_host(host, ctx.port) {
        return Err(Box::new(refuse(conn, info, Decision::Deny, &r)));
    }
    Ok(())
}

/// The grants whose secrets this request gets (indexes into the grant list; none when it
/// passes without), or the grants' refusal.
fn grant_swaps(
    ctx: &TerminatedCtx,
    req: &Request<Incoming>,
    target: &str,
    info: &ReqInfo,
) -> Result<Vec<usize>, Answer> {
    let grants = &ctx.conn.shared.grants;
    let hits = grants.find(target, req.headers());
    let over = crate::secrets::method_override(req.headers());
    let path = req.uri().path();
    match grants.decide_with(&ctx.host, true, req.method(), path, over, &hits) {
        GrantDecision::Swap(list) => Ok(list),
        GrantDecision::Pass => Ok(Vec::new()),
        refusal => Err(Box::new(
            grant_refusal(&ctx.conn, info, refusal)
                .unwrap_or_else(|| text(StatusCode::FORBIDDEN, "grant", "refused", false)),
        )),
    }
}

/// The request sent upstream: hop headers stripped, the `swapped` grants' secrets in, an
/// identity encoding where grants exist (so a reflected secret stays visible to the
/// response's mask), one canonical `Host`, and the body scanned for other grants'
/// placeholders.
fn outbound(
    ctx: &TerminatedCtx,
    req: Request<Incoming>,
    target: &str,
    swapped: &[usize],
    info: &ReqInfo,
) -> Result<Request<ProxyBody>, Answer> {
    let conn = &ctx.conn;
    let grants = &conn.shared.grants;
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_hop_headers(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    if let Err(e) = grants.swap(swapped, &mut headers) {
        let r = Refusal::new("grant", e.to_string());
        return Err(Box::new(refuse(conn, info, Decision::Error, &r)));
    }
    if !grants.list.is_empty() {
        // Keep any reflection of a secret visible to the response redactor.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    // Checked above to name the tunnel's host; always written in one canonical form.
    headers.remove(header::HOST);
    if let Some(v) = host_header(&ctx.host, ctx.port, 443) {
        headers.insert(header::HOST, v);
    }
    let mut out = Request::new(scanned_body(conn, body, &ctx.host, info));
    *out.method_mut() = parts.method;
    *out.uri_mut() = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    *out.headers_mut() = headers;
    Ok(out)
}

/// The audit row of a request the proxy sent: the grants swapped in, where it went and
/// the status it got.
fn record_allowed(
    conn: &Conn,
    info: &ReqInfo,
    swapped: &[usize],
    addr: SocketAddr,
    status: StatusCode,
) {
    let shared = &conn.shared;
    let mut ev = info.event(conn, Decision::Allow);
    ev.rule = Some(if swapped.is_empty() {
        "tls-terminated".into()
    } else {
        "grant".into()
    });
    ev.addr = Some(addr.ip().to_string());
    ev.status = Some(status.as_u16());
    if !swapped.is_empty() {
        ev.grant = Some(
            swapped
                .iter()
                .map(|i| shared.grants.list[*i].name.as_str())
                .collect(),
        );
    }
    shared.audit.record(ev);
}
