//! The CONNECT front: the target checked and connected, then either an opaque tunnel or,
//! for a host whose TLS the proxy terminates, a verified TLS leg upstream.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::answer::{ReqInfo, bad_target, refuse};
use super::grants::grant_refusal;
use super::terminate::terminated;
use super::tunnel::tunnel;
use super::upstream::{ClientCtx, TargetError, Upstream, handshake, open_target, target_error};
use crate::audit::Decision;
use crate::body::{ProxyBody, empty};
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
