//! Where a request goes, read from its head (the request target of a plain request or a
//! CONNECT, the `Host` header inside a terminated connection), and how the proxy writes it
//! again upstream. Kept apart from the I/O so that it can be fuzzed as plain functions.

use http::header::HeaderValue;
use http::{StatusCode, Uri};

use crate::policy::{Host, Refusal};

/// A request target the proxy will not carry: the answer's status, whether the refusal is
/// audited, and the port the head named (0 when it named none).
#[derive(Debug)]
pub(crate) struct BadTarget {
    pub status: StatusCode,
    pub refusal: Refusal,
    pub audited: bool,
    pub port: u16,
}

fn bad(status: StatusCode, rule: &str, reason: String, audited: bool, port: u16) -> BadTarget {
    BadTarget {
        status,
        refusal: Refusal::new(rule, reason),
        audited,
        port,
    }
}

/// The host and port of an absolute-form plain HTTP request (`GET http://host:port/path`).
pub(crate) fn http_target(uri: &Uri) -> Result<(Host, u16), BadTarget> {
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            let why = format!(
                "{other}:// is not proxied as a plain request; clients must use CONNECT for https"
            );
            return Err(bad(StatusCode::BAD_REQUEST, "protocol", why, true, 0));
        }
        None => {
            let why = "the request is not in absolute form; this is a forward proxy: set HTTP_PROXY so clients send http://host/path";
            return Err(bad(
                StatusCode::BAD_REQUEST,
                "protocol",
                why.into(),
                true,
                0,
            ));
        }
    }
    let Some(authority) = uri.authority() else {
        let why = "the request has no host".to_string();
        return Err(bad(StatusCode::BAD_REQUEST, "protocol", why, false, 0));
    };
    if authority.as_str().contains('@') {
        let why = "credentials in the URL authority are refused".to_string();
        return Err(bad(StatusCode::FORBIDDEN, "protocol", why, true, 0));
    }
    let port = authority.port_u16().unwrap_or(80);
    match Host::parse(authority.host()) {
        Ok(host) => Ok((host, port)),
        Err(e) => Err(bad(StatusCode::FORBIDDEN, "host", e, true, port)),
    }
}

/// The host and port of a CONNECT (`CONNECT host:port`); the port must be given.
pub(crate) fn connect_target(uri: &Uri) -> Result<(Host, u16), BadTarget> {
    let Some(authority) = uri.authority() else {
        let why = "CONNECT needs host:port".to_string();
        return Err(bad(StatusCode::FORBIDDEN, "protocol", why, true, 0));
    };
    let Some(port) = authority.port_u16() else {
        let why = "CONNECT needs an explicit port".to_string();
        return Err(bad(StatusCode::FORBIDDEN, "protocol", why, true, 0));
    };
    match Host::parse(authority.host()) {
        Ok(host) => Ok((host, port)),
        Err(e) => Err(bad(StatusCode::FORBIDDEN, "host", e, true, port)),
    }
}

/// True if `authority` (a `Host` header or a target's authority inside a connection the
/// proxy terminates for `host:port`) names exactly that host and port (443 when left out).
pub(crate) fn authority_names(authority: &str, host: &Host, port: u16) -> bool {
    let Ok(a) = authority.parse::<http::uri::Authority>() else {
        return false;
    };
    let port_ok = match a.port_u16() {
        Some(p) => p == port,
        None => port == 443,
    };
    port_ok && Host::parse(a.host()).map(|h| h == *host).unwrap_or(false)
}

/// The `Host` a request to `host:port` carries upstream.
pub(crate) fn host_header(host: &Host, port: u16, default_port: u16) -> Option<HeaderValue> {
    let h = if port == default_port {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    HeaderValue::from_str(&h).ok()
}

/// Bounded fuzzing of request heads (docs/fuzzing.md): what the proxy reads from a head
/// and writes again upstream reads back as the same target.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Request targets: the shapes clients send, with the pieces that confuse parsers.
    fn target() -> impl Strategy<Value = String> {
        let scheme =
            prop::sample::select(vec!["http://", "https://", "HTTP://", "", "//", "ftp://"]);
        let host = prop_oneof![
            "[a-zA-Z0-9-]{1,8}(\\.[a-zA-Z0-9_-]{1,8}){0,3}\\.?",
            Just("[::1]".to_string()),
            Just("[fe80::1%25eth0]".to_string()),
            Just("[::ffff:10.0.0.1]".to_string()),
            Just("127.1".to_string()),
            Just("0x7f.0.0.1".to_string()),
            Just("10.0.0.1".to_string()),
            Just("user:pw@a.test".to_string()),
            Just("a.test@b.test".to_string()),
            Just("".to_string()),
        ];
        let port = prop::sample::select(vec![
            "", ":", ":0", ":80", ":443", ":8080", ":65535", ":65536", ":99999", ":x",
        ]);
        let path = prop::sample::select(vec!["", "/", "/a/b?c=d", "/%2e%2e/x", "?q", "#f", "/a;b"]);
        (scheme, host, port, path).prop_map(|(s, h, p, q)| format!("{s}{h}{p}{q}"))
    }

    proptest! {
        #![proptest_config(cordon_testkit::fuzz::config(1024))]

        /// A plain request's target, written again as the proxy writes it upstream (the
        /// `Host` header and the path), reads back as the same host, port and path; inside
        /// a terminated connection, the `Host` header the proxy would write names its host.
        #[test]
        fn plain_targets_reserialise_to_themselves(raw in prop_oneof![target(), any::<String>()]) {
            let Ok(uri) = raw.parse::<Uri>() else { return Ok(()) };
            let Ok((host, port)) = http_target(&uri) else { return Ok(()) };
            let header = host_header(&host, port, 80).ok_or_else(|| TestCaseError::fail(format!("no Host header for {host}:{port}")))?;
            let header = header.to_str()?;
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let again: Uri = format!("http://{header}{pq}").parse()?;
            let (h2, p2) = http_target(&again).map_err(|b| TestCaseError::fail(format!("{raw:?} -> {again}: {:?}", b.refusal)))?;
            prop_assert_eq!((&h2, p2), (&host, port), "{:?} -> {}", raw, again);
            prop_assert_eq!(again.path(), uri.path());
            let inner = host_header(&host, port, 443).ok_or_else(|| TestCaseError::fail("no inner Host"))?;
            prop_assert!(authority_names(inner.to_str()?, &host, port), "{raw:?}");
        }

        #[test]
        fn connect_targets_reserialise_to_themselves(raw in prop_oneof![target(), any::<String>()]) {
            let Ok(uri) = raw.parse::<Uri>() else { return Ok(()) };
            let Ok((host, port)) = connect_target(&uri) else { return Ok(()) };
            let again: Uri = format!("{host}:{port}").parse()?;
            let back = connect_target(&again).map_err(|b| TestCaseError::fail(format!("{raw:?} -> {again}: {:?}", b.refusal)))?;
            prop_assert_eq!(back, (host, port));
        }
    }
}
