//! The upstream side: resolving a name once, checking every address, connecting to a
//! checked one, HTTP/1 handshakes and kept-alive upstream connections, and the headers that
//! never cross a hop.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName};
use http::{Response, StatusCode};
use hyper::client::conn::http1 as client_http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::answer::{ReqInfo, bad_gateway, text};
use crate::audit::Decision;
use crate::body::ProxyBody;
use crate::conn::Conn;
use crate::policy::{Host, Refusal};
use crate::shared::Shared;
use crate::tls::server_name;

pub(super) struct ClientCtx {
    pub(super) conn: Arc<Conn>,
    pub(super) upstream: Mutex<Option<Upstream>>,
}

/// Sends `out` over `up`, then keeps the connection in `slot` (the caller's lock on its
/// kept connection, released here) for the next request. A failed send is audited (an error
/// row naming the address) and answered 502; a sent one gives the response and the address
/// it came from.
pub(super) async fn send_kept(
    conn: &Conn,
    info: &ReqInfo,
    mut slot: tokio::sync::MutexGuard<'_, Option<Upstream>>,
    mut up: Upstream,
    out: http::Request<ProxyBody>,
) -> Result<(Response<hyper::body::Incoming>, SocketAddr), Response<ProxyBody>> {
    let addr = up.addr;
    let result = up.sender.send_request(out).await;
    *slot = Some(up);
    drop(slot);
    result.map(|r| (r, addr)).map_err(|e| {
        let mut ev = info.event(conn, Decision::Error);
        ev.rule = Some("upstream".into());
        ev.reason = Some(format!("request to {addr} failed: {e}"));
        ev.addr = Some(addr.ip().to_string());
        conn.shared.audit.record(ev);
        bad_gateway(&format!("request to {} failed", info.host))
    })
}

/// A kept-alive upstream HTTP/1 connection.
pub(super) struct Upstream {
    pub(super) key: (Host, u16),
    pub(super) addr: SocketAddr,
    pub(super) sender: client_http1::SendRequest<ProxyBody>,
}

/// Why a target could not be reached.
pub(super) enum TargetError {
    Refused(Refusal, Option<IpAddr>),
    Unreachable(String),
}

/// Checks `host:port` against the policy, resolves it (once) and connects to a checked
/// address. Never resolves twice.
pub(super) async fn open_target(
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

pub(super) fn target_error(conn: &Conn, info: &ReqInfo, e: TargetError) -> Response<ProxyBody> {
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

/// Headers that belong to one hop and are never forwarded.
pub(super) fn strip_hop_headers(h: &mut HeaderMap) {
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

pub(super) async fn handshake<T>(
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

pub(super) async fn reconnect_tls(
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
