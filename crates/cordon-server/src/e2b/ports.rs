//! A sandbox's own servers through the E2B listener, as E2B's proxy routes them: a request
//! whose `Host` is `{port}-{sandboxID}.{domain}` (what `sandbox.get_host(port)` answers),
//! or whose `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers name a port other than envd's
//! and the code interpreter's, goes to that port on the sandbox's own loopback. It must
//! carry the sandbox's traffic access token (`E2B-Traffic-Access-Token`, as E2B's proxy asks
//! of a sandbox without public traffic) or its envd access token (`X-Access-Token`): a
//! token of another sandbox, another tenant's above all, is refused (403, as E2B's proxy).
//! A sandbox whose create asked for public traffic, where the operator allows it
//! (`e2b.public_traffic`), needs none; one whose create gave `maskRequestHost` has its
//! requests' `Host` replaced; a paused one whose create asked `autoResume` is woken. A
//! `Host` naming envd's or the interpreter's port is served here as those daemons (the
//! headers set from it).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{E2b, ENVD_PORT, INTERP_PORT, constant_eq, e2b_error, retry_busy, sandbox_not_found};
use crate::service::Opened;

/// Where a request is headed, from its headers or its host.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    id: String,
    port: u16,
    /// Named by the host name, not the routing headers.
    by_host: bool,
}

/// Routes requests for a sandbox's own ports; everything else goes on to the listener's
/// routes.
pub(super) async fn route(State(e): State<E2b>, mut req: Request, next: Next) -> Response {
    let Some(t) = target(req.headers()) else {
        return next.run(req).await;
    };
    if t.port == ENVD_PORT || t.port == INTERP_PORT {
        if t.by_host {
            // E2B's host routing for its own daemons: the headers the routes read.
            let h = req.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&t.id) {
                h.insert("e2b-sandbox-id", v);
            }
            h.insert("e2b-sandbox-port", HeaderValue::from(t.port));
        }
        return next.run(req).await;
    }
    relay(&e, t, req).await
}

async fn relay(e: &E2b, t: Target, mut req: Request) -> Response {
    let Some(b) = e.box_of(&t.id) else {
        return sandbox_not_found(&t.id);
    };
    let (public, masked_host) = {
        let access = super::lock(&b.ports);
        (access.public, access.host_for(t.port))
    };
    let ok = public || {
        let given = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
        given("e2b-traffic-access-token").is_some_and(|g| constant_eq(g, b.traffic.as_bytes()))
            || given("x-access-token").is_some_and(|g| constant_eq(g, b.token.as_bytes()))
    };
    if !ok {
        // E2B's proxy's status for a sandbox without public traffic.
        return e2b_error(
            StatusCode::FORBIDDEN,
            "a sandbox's ports need its traffic access token (E2B-Traffic-Access-Token: the \
             trafficAccessToken its create or connect answered) or its envd access token",
        );
    }
    // A paused sandbox whose create asked autoResume is woken by the request, as under E2B.
    let b = match e.live(&t.id, b).await {
        Ok((_, b)) => b,
        Err(r) => return r,
    };
    if let Some(host) = masked_host
        && let Ok(v) = HeaderValue::from_str(&host)
    {
        req.headers_mut().insert(header::HOST, v);
    }
    let sessions = e.svc.sessions();
    let opened = retry_busy(|| sessions.open_port(&b.tenant, &t.id, t.port, "e2b")).await;
    match opened {
        Ok(Opened::Conn(conn)) => {
            let path = crate::portproxy::target(req.uri().path(), req.uri());
            match crate::portproxy::forward(conn, req, &path, crate::portproxy::Credentials::Own)
                .await
            {
                Ok(r) => r,
                Err(err) => e2b_error(StatusCode::BAD_GATEWAY, err.to_string()),
            }
        }
        Ok(Opened::Closed) => port_closed(&t.id, t.port),
        Err(err) if err.code == crate::error::Code::NotFound => {
            e.forget(&t.id);
            sandbox_not_found(&t.id)
        }
        Err(err) => super::api_error(err),
    }
}

/// E2B's proxy's answer for a port nothing listens on.
fn port_closed(id: &str, port: u16) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "message": "The sandbox is running but port is not open",
        "port": port,
        "code": 502,
    });
    let mut r = (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The sandbox and port a request names: both routing headers (E2B's SDKs), else a host
/// `{port}-{id}.{domain}` (E2B's ids have no `-`; Cordon's `sb-<hex>` do, so the port is
/// what comes before the first one).
fn target(h: &HeaderMap) -> Option<Target> {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    if let (Some(id), Some(port)) = (get("e2b-sandbox-id"), get("e2b-sandbox-port")) {
        return Some(Target {
            id: id.to_string(),
            port: port.parse().ok()?,
            by_host: false,
        });
    }
    let host = get(header::HOST.as_str())?;
    let name = host.rsplit_once(':').map_or(host, |(n, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            n
        } else {
            host
        }
    });
    let (first, domain) = name.split_once('.')?;
    let (port, id) = first.split_once('-')?;
    if domain.is_empty() || !id.starts_with("sb-") || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Target {
        id: id.to_string(),
        port: port.parse().ok()?,
        by_host: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(h: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::HOST, HeaderValue::from_str(h).unwrap());
        m
    }

    #[test]
    fn hosts_name_a_port_of_a_sandbox() {
        let t = target(&host("8000-sb-0123abcd.localhost:49982")).unwrap();
        assert_eq!(
            (t.id.as_str(), t.port, t.by_host),
            ("sb-0123abcd", 8000, true)
        );
        let t = target(&host("3000-sb-ff.e2b.example")).unwrap();
        assert_eq!((t.id.as_str(), t.port), ("sb-ff", 3000));
        assert_eq!(target(&host("127.0.0.1:49982")), None);
        assert_eq!(target(&host("localhost")), None);
        assert_eq!(target(&host("api.example:80")), None);
        assert_eq!(target(&host("x8000-sb-ff.localhost")), None);
        assert_eq!(target(&host("99999-sb-ff.localhost")), None);
        let mut h = host("127.0.0.1:1");
        h.insert("e2b-sandbox-id", HeaderValue::from_static("sb-1"));
        h.insert("e2b-sandbox-port", HeaderValue::from_static("8080"));
        let t = target(&h).unwrap();
        assert_eq!((t.id.as_str(), t.port, t.by_host), ("sb-1", 8080, false));
    }
}
