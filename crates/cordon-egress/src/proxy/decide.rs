//! The proxy's decisions on a request before anything goes upstream: the request-rate and
//! request-count limits, and the method and path rules of a host.

use std::sync::atomic::Ordering;

use http::{Method, Response, StatusCode};

use super::answer::{ReqInfo, text};
use crate::audit::Decision;
use crate::body::ProxyBody;
use crate::conn::Conn;
use crate::policy::{Host, Refusal, path_has_prefix, path_is_canonical};
use crate::shared::Shared;

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

/// Checks method/path rules for a host with HTTP rules.
pub(super) fn check_http_rules(
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
