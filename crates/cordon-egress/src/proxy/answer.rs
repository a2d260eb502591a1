//! What the proxy answers a sandbox itself (a refusal naming its rule, a failed upstream)
//! and the audit row each of its decisions records.

use std::convert::Infallible;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::audit::{AuditEvent, Decision, Kind};
use crate::body::{ProxyBody, full};
use crate::conn::Conn;
use crate::policy::Refusal;
use crate::target::BadTarget;

pub(super) type RespFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>,
>;

pub(super) fn text(
    status: StatusCode,
    rule: &str,
    reason: &str,
    close: bool,
) -> Response<ProxyBody> {
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

pub(super) fn bad_gateway(reason: &str) -> Response<ProxyBody> {
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
pub(super) struct ReqInfo {
    pub(super) kind: Kind,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) method: String,
    pub(super) path: String,
}

impl ReqInfo {
    pub(super) fn event(&self, conn: &Conn, decision: Decision) -> AuditEvent {
        let mut ev = AuditEvent::new(conn.id, self.kind, decision);
        ev.host = Some(self.host.clone()).filter(|h| !h.is_empty());
        ev.port = Some(self.port).filter(|p| *p != 0);
        ev.method = Some(self.method.clone());
        ev.path = Some(self.path.clone()).filter(|p| !p.is_empty());
        ev
    }
}

pub(super) fn refuse(
    conn: &Conn,
    info: &ReqInfo,
    decision: Decision,
    r: &Refusal,
) -> Response<ProxyBody> {
    let mut ev = info.event(conn, decision);
    ev.rule = Some(r.rule.clone());
    ev.reason = Some(r.reason.clone());
    conn.shared.audit.record(ev);
    text(StatusCode::FORBIDDEN, &r.rule, &r.reason, false)
}

/// Answers a request whose target the proxy will not carry (audited where it says so).
pub(super) fn bad_target(conn: &Conn, info: &mut ReqInfo, b: BadTarget) -> Response<ProxyBody> {
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
