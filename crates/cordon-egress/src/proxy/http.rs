//! The plain-HTTP front: an absolute-form request checked, its body watched, and forwarded
//! over a kept-alive upstream connection.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::answer::{ReqInfo, bad_target, refuse};
use super::grants::{grant_refusal, masked_response, scanned_body};
use super::upstream::{
    ClientCtx, TargetError, Upstream, handshake, open_target, send_kept, strip_hop_headers,
    target_error,
};
use crate::audit::Decision;
use crate::body::{ProxyBody, box_err};
use crate::target::{host_header, http_target};

/// Absolute-form plain HTTP.
pub(super) async fn forward(
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
    let up = match reuse {
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
    let (resp, addr) = match send_kept(conn, &info, slot, up, out).await {
        Ok(sent) => sent,
        Err(r) => return r,
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
