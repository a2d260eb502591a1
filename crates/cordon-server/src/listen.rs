//! The listeners' connections (the API, with or without TLS, and the E2B listener): each
//! accepted connection is served by hyper's HTTP/1 server with a header timeout, within a
//! cap per listener and per source address.
//!
//! - **Idle and slow connections close.** hyper's `header_read_timeout` runs whenever a
//!   connection waits for a request's head: after the accept, between keep-alive requests,
//!   and while a head trickles in. A connection with no request under way is closed after
//!   `edge.idle_timeout`; one whose head is sent slowly too. (axum's `serve` sets no
//!   timer, so no timeout of hyper's applied: 20,000 idle connections took every
//!   descriptor.) A TLS handshake has its own deadline, within the same caps.
//! - **Caps, and who pays at a cap.** At most `edge.max_connections` per listener and
//!   `edge.max_connections_per_source` from one address. A new connection past a cap
//!   closes an idle one in its place (no request under way): first one that never sent a
//!   request, then the one idle longest; from its own address at the source cap, from
//!   the address holding the most connections at the listener's. Only when every
//!   connection has a request under way is the new one refused. So a client that floods
//!   idle or slow connections (from any address, one behind the TLS proxy or on loopback
//!   included) closes its own, never a connection serving a request, and a client with a
//!   request to send always gets in.
//!
//! Requests under way are bounded by the routes' own caps (sandboxes, attach streams,
//! audit reads, event streams), so they cannot hold every connection either.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The address a connection came from (plain TCP or TLS), given to the routes as
/// `ConnectInfo` (the API re-exports it as `api::PeerAddr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The longest a client may take to finish its TLS handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// A listener's caps and timeout.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
    /// How long a connection may wait for a request's head (idle, or a slow head).
    pub header_timeout: Duration,
}

impl ConnLimits {
    /// The edge's limits, the listener's cap kept under half the process's descriptor
    /// limit (sandboxes, the audit store and the tiers need the rest).
    pub fn of(edge: &crate::config::EdgeConfig) -> Self {
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| usize::try_from(soft).unwrap_or(usize::MAX))
            .unwrap_or(1024);
        let max_connections = edge.max_connections.min(nofile / 2).max(1);
        ConnLimits {
            max_connections,
            max_per_source: edge.max_connections_per_source.clamp(1, max_connections),
            header_timeout: edge.idle_timeout.0,
        }
    }
}

/// One connection as the caps see it.
struct Conn {
    ip: IpAddr,
    /// Requests being answered (their response bodies not yet done).
    in_flight: AtomicUsize,
    /// Requests it has sent.
    requests: AtomicU64,
    /// When it last had no request under way (ms since the registry's epoch).
    idle_since: AtomicU64,
    /// Closes it (another connection took its place at a cap).
    close: CancellationToken,
}

#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Arc<Conn>>,
    per_source: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Arc<Conn>> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&c.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_source.remove(&c.ip);
            }
        }
        Some(c)
    }

    /// The idle connection to close for a new one: of `source` (none: of the address
    /// holding the most connections, then of any), one that never sent a request first,
    /// then the one idle longest. None when every candidate has a request under way.
    fn victim(&self, source: Option<IpAddr>) -> Option<u64> {
        let pick = |ip: Option<IpAddr>| {
            self.conns
                .iter()
                .filter(|(_, c)| ip.is_none_or(|ip| c.ip == ip))
                .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| {
                    (
                        c.requests.load(Ordering::Acquire) > 0,
                        c.idle_since.load(Ordering::Acquire),
                    )
                })
                .map(|(id, _)| *id)
        };
        match source {
            Some(ip) => pick(Some(ip)),
            None => {
                let top = self
                    .per_source
                    .iter()
                    .max_by_key(|(_, n)| **n)
                    .map(|(ip, _)| *ip);
                top.and_then(|ip| pick(Some(ip))).or_else(|| pick(None))
            }
        }
    }
}

/// A listener's connections.
pub(crate) struct Registry {
    limits: ConnLimits,
    epoch: Instant,
    table: Mutex<Table>,
}

/// A connection's place in its registry, given back when the connection ends.
struct Place {
    reg: Arc<Registry>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.reg.lock().remove(self.id);
    }
}

impl Registry {
    pub(crate) fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(Registry {
            limits,
            epoch: Instant::now(),
            table: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A place for a new connection from `ip`, closing an idle one at a cap; none when
    /// every connection that could make room has a request under way.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let mut t = self.lock();
        if t.per_source.get(&ip).copied().unwrap_or(0) >= self.limits.max_per_source {
            let id = t.victim(Some(ip))?;
            if let Some(c) = t.remove(id) {
                c.close.cancel();
            }
        }
        if t.conns.len() >= self.limits.max_connections {
            let id = t.victim(None)?;
            if let Some(c) = t.remove(id) {
                c.close.cancel();
            }
        }
        t.next += 1;
        let id = t.next;
        let conn = Arc::new(Conn {
            ip,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(self.now_ms()),
            close: CancellationToken::new(),
        });
        t.conns.insert(id, conn.clone());
        *t.per_source.entry(ip).or_insert(0) += 1;
        Some(Place {
            reg: self.clone(),
            id,
            conn,
        })
    }
}

/// A request under way on a connection; its end (the response body done or dropped)
/// makes the connection idle again.
struct Busy {
    reg: Arc<Registry>,
    conn: Arc<Conn>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conn
            .idle_since
            .store(self.reg.now_ms(), Ordering::Release);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as under way until it is done.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        // A streamed answer is still its request's: a panic while making a chunk ends this
        // connection, not the server.
        IN_REQUEST.sync_scope((), || Pin::new(&mut self.inner).poll_frame(cx))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

tokio::task_local! {
    /// Set while a request's handler (its future) runs.
    static IN_REQUEST: ();
}

/// Whether the calling code runs inside a request's handler, where a panic is answered
/// 500 and ends only that request, or makes a chunk of its streamed answer, where a panic
/// ends that connection ([`crate::abort_on_panics_outside_requests`]). A task the handler
/// spawns is not inside it.
pub fn in_request() -> bool {
    IN_REQUEST.try_with(|_| ()).is_ok()
}

async fn in_request_scope(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    IN_REQUEST.scope((), next.run(req)).await
}

/// The answer to a request whose handler panicked: 500, the panic's message in the
/// operator's log only (it may name host paths).
fn panicked(err: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let what = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!(
        panic = what,
        "a request's handler panicked; the request was answered 500"
    );
    axum::response::IntoResponse::into_response(crate::error::ApiError::internal(
        "the server failed on this request (its log says why); try again, and report it if it recurs",
    ))
}

/// Serves `app` on `listener` (through TLS when `tls` is given) until `stop`; then stops
/// accepting, lets every connection finish its request under way, and returns when all
/// have closed.
pub(crate) fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    reg: Arc<Registry>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Result<(), std::io::Error>> {
    // A handler that panics answers 500 and ends its own request; every other request and
    // the server go on (the release build unwinds for this: ADR 0046).
    let app = app
        .layer(axum::middleware::from_fn(in_request_scope))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked));
    tokio::spawn(async move {
        let tasks = TaskTracker::new();
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors (or a connection reset before its accept):
                        // wait, as a full table empties as connections close.
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Some(place) = reg.admit(peer.ip()) else {
                tracing::debug!(%peer, "connection refused: every connection of the cap has a request under way");
                drop(tcp);
                continue;
            };
            // Each write leaves at once: a streamed answer is many small writes, and with
            // Nagle's algorithm each waits for the client's delayed ACK (~40 ms).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, "TCP_NODELAY: {e}");
            }
            let (app, tls, stop, reg) = (app.clone(), tls.clone(), stop.clone(), reg.clone());
            tasks.spawn(async move {
                let close = place.conn.close.clone();
                match tls {
                    None => connection(tcp, peer, app, &reg, &place, stop).await,
                    Some(acceptor) => {
                        let shake = tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp));
                        let tls = tokio::select! {
                            _ = close.cancelled() => return,
                            r = shake => r,
                        };
                        match tls {
                            Ok(Ok(io)) => connection(io, peer, app, &reg, &place, stop).await,
                            Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
            });
        }
        drop(listener);
        tasks.close();
        tasks.wait().await;
        Ok(())
    })
}

/// Serves one connection until it closes, the server stops, or a new connection takes its
/// place at a cap.
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    app: Router,
    reg: &Arc<Registry>,
    place: &Place,
    stop: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = place.conn.clone();
    let (reg2, conn2) = (reg.clone(), conn.clone());
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        conn2.requests.fetch_add(1, Ordering::AcqRel);
        conn2.in_flight.fetch_add(1, Ordering::AcqRel);
        let busy = Busy {
            reg: reg2.clone(),
            conn: conn2.clone(),
        };
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
        let mut app = app.clone();
        async move {
            let resp = match tower::Service::call(&mut app, req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(resp.map(|inner| Tracked { inner, _busy: busy }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(reg.limits.header_timeout)
        .keep_alive(true);
    let served = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(served);
    let mut closing = false;
    loop {
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, "connection: {e}");
                }
                return;
            }
            _ = stop.cancelled(), if !closing => {
                if conn.requests.load(Ordering::Acquire) == 0 {
                    return;
                }
                served.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = conn.close.cancelled(), if !closing => {
                // A connection that never sent a request has nothing to finish (hyper's
                // graceful close would wait for its head); one that did closes once the
                // request under way, if any, is answered.
                if conn.requests.load(Ordering::Acquire) == 0 {
                    return;
                }
                served.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request's panicking handler is answered 500 with nothing of the panic's message
    /// (it may name host paths), and the listener goes on serving: the next request, on a
    /// new connection, is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_handler_ends_its_request_and_not_the_listener() {
        let app = Router::new()
            .route(
                "/boom",
                axum::routing::get(|| async {
                    if std::hint::black_box(in_request()) {
                        panic!("a bug at /secret/host/path");
                    }
                    "not inside a request's scope"
                }),
            )
            .route(
                "/ok",
                axum::routing::get(|| async {
                    // A task the handler spawns is not the request's: a panic there is not
                    // contained (the server's hook aborts on it).
                    let spawned = tokio::spawn(async { in_request() }).await.unwrap();
                    assert!(!spawned);
                    "fine"
                }),
            );
        let app = app.route(
            "/stream",
            axum::routing::get(|| async {
                // A streamed answer's chunks are made inside the request too.
                Body::from_stream(futures_util::stream::once(async {
                    let said: &'static str = if in_request() { "inside" } else { "outside" };
                    Ok::<_, Infallible>(Bytes::from_static(said.as_bytes()))
                }))
            }),
        );
        assert!(!in_request());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let limits = ConnLimits {
            max_connections: 8,
            max_per_source: 8,
            header_timeout: Duration::from_secs(5),
        };
        let task = serve(listener, app, None, Registry::new(limits), stop.clone());
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(at).await.unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        for _ in 0..3 {
            let answer = get("/boom").await;
            assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
            assert!(answer.contains("\"internal\""), "{answer}");
            assert!(!answer.contains("/secret/host/path"), "{answer}");
            let answer = get("/stream").await;
            assert!(answer.contains("\r\ninside\r\n"), "{answer}");
            let answer = get("/ok").await;
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("fine"),
                "{answer}"
            );
        }
        assert!(!task.is_finished());
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    /// The server's release build unwinds a panic (the layer above can answer it); only the
    /// static front, init and guest agent, one process per run or sandbox, abort.
    #[test]
    fn the_release_build_unwinds_and_the_static_set_aborts() {
        let workspace: toml::Table = toml::from_str(include_str!("../../../Cargo.toml"))
            .expect("the workspace's Cargo.toml");
        let release = &workspace["profile"]["release"];
        assert_eq!(
            release.get("panic").and_then(|p| p.as_str()),
            Some("unwind"),
            "a release server must unwind a request's panic"
        );
        let lib = include_str!("../../../scripts/lib.sh");
        let musl = &lib[lib.find("build_musl_set() {").expect("build_musl_set")..];
        let musl = &musl[..musl.find("\n}\n").expect("its end")];
        assert_eq!(
            musl.matches(r#"--config 'profile.release.panic="abort"'"#)
                .count(),
            2,
            "{musl}"
        );
    }
}
