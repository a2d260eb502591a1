//! Relays one HTTP request to a port a program serves on a sandbox's own loopback, over a
//! [`PortConn`] (E2B's `{port}-{sandbox}.{domain}` hosts and the native
//! `/v1/sandboxes/{id}/ports/{port}/...` route). HTTP/1.1 to the program, the bodies
//! streamed both ways; the credentials meant for Cordon (the API key, the sandbox's tokens)
//! never reach the program. The connection (and its place among the sandbox's
//! [`crate::service::MAX_PORT_CONNS`]) ends with the response, or when the sandbox does.

use axum::body::Body;
use axum::http::{HeaderName, Request, Response, Uri, header};
use hyper_util::rt::TokioIo;

use crate::service::PortConn;

/// Headers a hop uses for itself, or that carry a credential for Cordon: none goes on.
/// `authorization` is Cordon's own on the native route (the tenant's key) and is dropped
/// there ([`Credentials::Bearer`]); through the E2B listener, whose keys and tokens are
/// headers of their own, it is the client's, for the program.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "x-api-key",
    "x-access-token",
    "e2b-traffic-access-token",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
];

/// Where the request's own credential for Cordon travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// In `Authorization` (the native API's bearer key): dropped with the others.
    Bearer,
    /// In headers of their own (the E2B listener's): `Authorization` goes on to the program.
    Own,
}

/// Why a relayed request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the connection to the sandbox failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the program in the sandbox did not answer as HTTP/1.1: {0}")]
    Http(#[from] hyper::Error),
    #[error("the request's path is not valid: {0}")]
    Path(#[from] axum::http::uri::InvalidUri),
}

/// Sends `req` to the program on `conn`, its target `path_and_query` (origin form).
pub async fn forward(
    conn: PortConn,
    mut req: Request<Body>,
    path_and_query: &str,
    credentials: Credentials,
) -> Result<Response<Body>, RelayError> {
    let PortConn { stream, slot } = conn;
    stream.set_nonblocking(true)?;
    let io = TokioIo::new(tokio::net::UnixStream::from_std(stream)?);
    // Header names go out in title case (`Host:`), as most HTTP/1 clients send them and as
    // programs that read them by their spelling expect; hyper's own are lower case.
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(io)
        .await?;
    tokio::spawn(async move {
        // The sandbox's place is held until the exchange is over (or the sandbox ended).
        let _slot = slot;
        let _ = connection.await;
    });
    *req.uri_mut() = path_and_query.parse::<Uri>()?;
    let headers = req.headers_mut();
    for name in DROPPED {
        headers.remove(HeaderName::from_static(name));
    }
    if credentials == Credentials::Bearer {
        headers.remove(header::AUTHORIZATION);
    }
    // hyper frames the body itself (a kept Content-Length, else chunked).
    headers.remove(header::TRANSFER_ENCODING);
    let resp = sender.send_request(req).await?;
    let (mut parts, body) = resp.into_parts();
    // The client's answer is this server's HTTP/1.1, whatever the program spoke.
    parts.version = axum::http::Version::HTTP_11;
    for name in [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
    ] {
        parts.headers.remove(HeaderName::from_static(name));
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The origin-form target of a request to `path` (no leading `/` needed) with the
/// request's own query.
pub fn target(path: &str, uri: &Uri) -> String {
    let mut t = String::with_capacity(path.len() + 1);
    if !path.starts_with('/') {
        t.push('/');
    }
    t.push_str(path);
    if let Some(q) = uri.query() {
        t.push('?');
        t.push_str(q);
    }
    t
}
