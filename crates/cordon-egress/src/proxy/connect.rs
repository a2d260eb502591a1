//! The CONNECT front: the target checked and connected, then either an opaque tunnel or,
//! for a host whose TLS the proxy terminates, a verified TLS leg upstream.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::answer::{ReqInfo, bad_target, refuse};
use super::grants::grant_refusal;
use super::terminate::terminated;
use super::tunnel::tunnel;
use super::upstream::{ClientCtx, TargetError, Upstream, handshake, open_target, target_error};
use crate::audit::Decision;
use crate::body::{ProxyBody, empty};
use crate::conn::Conn;
use crate::policy::Host;
use crate::shared::Shared;
use crate::target::connect_target;
use crate::tls::server_name;

/// CONNECT: an opaque tunnel, or TLS termination for granted hosts.
pub(super) async fn connect(
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
    let allow_rule = match check_connect(&conn, &req, &host, port, &info) {
        Ok(rule) => rule,
        Err(refused) => return *refused,
    };
    let terminate = shared.terminates(&host);
    let (tcp, addr) = match open_target(&shared, &host, port).await {
        Ok(t) => t,
        Err(e) => return target_error(&conn, &info, e),
    };
    // For terminated hosts, verify the upstream now so a bad certificate is a clear 502.
    let leg = if terminate {
        match tls_leg(&shared, &host, tcp, addr).await {
            Ok(leg) => leg,
            Err(e) => return target_error(&conn, &info, e),
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
    let target = Target { host, port, addr };
    shared
        .tracker
        .spawn(serve_upgraded(conn.clone(), on_upgrade, leg, target, info));
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::OK;
    r
}

/// The CONNECT's target: the policy lets the host in (answering the rule that does) and no
/// grant refuses the tunnel.
fn check_connect(
    conn: &Arc<Conn>,
    req: &Request<Incoming>,
    host: &Host,
    port: u16,
    info: &ReqInfo,
) -> Result<String, Box<Response<ProxyBody>>> {
    let shared = &conn.shared;
    let allow_rule = match shared.policy.check_host(host, port) {
        Ok(rule) => rule,
        Err(r) => return Err(Box::new(refuse(conn, info, Decision::Deny, &r))),
    };
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .unwrap_or_default();
    let hits = shared.grants.find(authority, req.headers());
    let decision = shared
        .grants
        .decide(host, false, &Method::CONNECT, "/", &hits);
    match grant_refusal(conn, info, decision) {
        Some(resp) => Err(Box::new(resp)),
        None => Ok(allow_rule),
    }
}

/// A verified TLS leg to `host` over `tcp` (connected to `addr`), within the connect
/// timeout.
async fn tls_leg(
    shared: &Shared,
    host: &Host,
    tcp: TcpStream,
    addr: SocketAddr,
) -> Result<Leg, TargetError> {
    let name = server_name(host).map_err(TargetError::Unreachable)?;
    let tls = shared.upstream_tls().map_err(TargetError::Unreachable)?;
    let hs = tls.connect(name, tcp);
    match tokio::time::timeout(shared.limits.connect_timeout(), hs).await {
        Ok(Ok(s)) => Ok(Leg::Tls(Box::new(s))),
        Ok(Err(e)) => Err(TargetError::Unreachable(format!(
            "TLS to {host} ({addr}) failed: {e}"
        ))),
        Err(_) => Err(TargetError::Unreachable(format!("TLS to {host} timed out"))),
    }
}

/// Where a CONNECT goes: its host and port, and the address checked and connected.
struct Target {
    host: Host,
    port: u16,
    addr: SocketAddr,
}

/// Once the client's connection is upgraded: the terminated host's requests served over the
/// TLS leg, or the opaque tunnel.
async fn serve_upgraded(
    conn: Arc<Conn>,
    on_upgrade: OnUpgrade,
    leg: Leg,
    target: Target,
    info: ReqInfo,
) {
    let Ok(upgraded) = on_upgrade.await else {
        return;
    };
    let client = TokioIo::new(upgraded);
    let Target { host, port, addr } = target;
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
}

enum Leg {
    Tunnel(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}
