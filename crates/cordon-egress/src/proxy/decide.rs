//! The proxy's decisions on a request before anything goes upstream: the request-rate and
//! request-count limits, and the method and path rules of a host.

use std::sync::atomic::Ordering;

use http::{Response, StatusCode};

use super::answer::{ReqInfo, text};
use crate::audit::Decision;
use crate::body::ProxyBody;
use crate::conn::Conn;

/// Request-rate and request-count admission. A refusal ends the connection.
pub(super) fn admit(conn: &Conn, info: &ReqInfo) -> Option<Response<ProxyBody>> {
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
