//! Credentials on the way through: a grant's refusal, the watch for placeholders headed to
//! a host their grant does not cover, and the masking of every secret that went upstream in
//! the responses coming back.

use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::answer::{ReqInfo, text};
use crate::audit::Decision;
use crate::body::{ProxyBody, RedactBody, ScanBody, box_err};
use crate::conn::Conn;
use crate::policy::{Host, Refusal};
use crate::scan::{StreamDetector, StreamRedactor, redact_bytes};
use crate::secrets::GrantDecision;
use crate::shared::Shared;

/// A detector for every placeholder whose grant does not cover `host`.
pub(super) fn foreign_placeholders(shared: &Shared, host: &Host) -> StreamDetector {
    StreamDetector::new(
        shared
            .grants
            .placeholders()
            .filter(|(i, _)| !shared.grants.list[*i].covers(host))
            .map(|(i, p)| (i, p.to_vec()))
            .collect(),
    )
}

pub(super) fn scanned_body(
    conn: &Arc<Conn>,
    body: Incoming,
    host: &Host,
    info: &ReqInfo,
) -> ProxyBody {
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
        ev.grant = Some(cordon_core::GrantNames::one(name.clone()));
        c.shared.audit.record(ev);
        c.end(
            &format!("grant:{name}"),
            "credential placeholder in a request body to a host its grant does not cover".into(),
        );
    });
    ScanBody::new(body, det, on_hit).boxed()
}

pub(super) fn grant_refusal(
    conn: &Conn,
    info: &ReqInfo,
    d: GrantDecision,
) -> Option<Response<ProxyBody>> {
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
            ev.grant = Some(cordon_core::GrantNames::one(grant));
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

/// A response on its way back to a sandbox that holds grants: every form of every secret
/// that has gone upstream is masked in its headers and body, for the sandbox's whole life
/// (an upstream may store a header and return it on a later request). A body this proxy
/// cannot read (compressed although the request asked for identity) is refused.
pub(super) fn masked_response(
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
