//! Accepting clients: the unix and TCP accept loops, connection admission, the HTTP/1
//! server each client is served by, and the dispatch of each request to the CONNECT or the
//! plain-HTTP front.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use super::answer::{ReqInfo, RespFuture};
use super::connect::connect;
use super::decide::admit;
use super::http::forward;
use super::upstream::ClientCtx;
use crate::audit::{AuditEvent, Decision, Kind};
use crate::body::ProxyBody;
use crate::conn::{Conn, MeteredIo};
use crate::shared::Shared;

/// A client stream: unix or TCP.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ClientStream for T {}

/// Takes a freshly accepted client stream through admission and serves it.
pub(crate) fn spawn_client(shared: &Arc<Shared>, stream: Box<dyn ClientStream>) {
    let id = shared.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let permit = match shared.conn_sem.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let mut ev = AuditEvent::new(id, Kind::Connection, Decision::Limit);
            ev.rule = Some("limit:connections".into());
            ev.reason = Some(format!(
                "more than {} connections open at once",
                shared.limits.max_connections
            ));
            shared.audit.record(ev);
            shared
                .tracker
                .spawn(refuse_raw(stream, shared.limits.max_connections));
            return;
        }
    };
    let conn = Conn::new(id, shared.clone(), permit);
    shared.tracker.spawn(serve_client(conn, stream));
}

async fn refuse_raw(mut stream: Box<dyn ClientStream>, max: u32) {
    let body = format!(
        "cordon egress: refused by rule limit:connections: this sandbox already has {max} connections open\n"
    );
    let msg = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\nx-cordon-rule: limit:connections\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        stream.write_all(msg.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

type BoxFut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Builds the HTTP/1 server future for a client connection. A plain function (not async) so
/// that its `Send`-ness is proven with concrete lifetimes.
fn serve_http(conn: &Arc<Conn>, stream: Box<dyn ClientStream>) -> BoxFut {
    let io = TokioIo::new(MeteredIo::new(stream, conn.clone()));
    let ctx = Arc::new(ClientCtx {
        conn: conn.clone(),
        upstream: Mutex::new(None),
    });
    let svc = service_fn(move |req| -> RespFuture {
        let ctx = ctx.clone();
        Box::pin(async move { Ok::<_, Infallible>(handle(ctx, req).await) })
    });
    let mut builder = server_http1::Builder::new();
    builder
        .max_buf_size(conn.shared.limits.max_header_bytes.max(64 << 10))
        .max_header_size(conn.shared.limits.max_header_bytes)
        .keep_alive(true);
    let served = builder.serve_connection(io, svc).with_upgrades();
    Box::pin(async move {
        let _ = served.await;
    })
}

async fn serve_client(conn: Arc<Conn>, stream: Box<dyn ClientStream>) {
    let served = serve_http(&conn, stream);
    let _ = conn.guarded(served).await;
}

async fn handle(ctx: Arc<ClientCtx>, req: Request<Incoming>) -> Response<ProxyBody> {
    let conn = &ctx.conn;
    let is_connect = req.method() == Method::CONNECT;
    let info = ReqInfo {
        kind: if is_connect {
            Kind::Connect
        } else {
            Kind::Http
        },
        host: req.uri().host().unwrap_or("").to_string(),
        port: req.uri().port_u16().unwrap_or(0),
        method: req.method().to_string(),
        path: if is_connect {
            String::new()
        } else {
            req.uri().path().to_string()
        },
    };
    if let Some(resp) = admit(conn, &info) {
        return resp;
    }
    if is_connect {
        connect(ctx, req, info).await
    } else {
        forward(ctx, req, info).await
    }
}

/// Accepts on a unix socket until cancelled.
pub(crate) async fn accept_unix(shared: Arc<Shared>, listener: tokio::net::UnixListener) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => spawn_client(&shared, Box::new(s)),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }
}

/// Accepts on a TCP listener until cancelled.
pub(crate) async fn accept_tcp(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    spawn_client(&shared, Box::new(s))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }
}
