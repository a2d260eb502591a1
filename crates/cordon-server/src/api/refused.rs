//! A request refused before its body was read. The client may still be writing that body
//! when the answer goes; had the server closed at once, the client's next write would meet
//! a reset and it would report a broken pipe instead of the refusal. So the rest of the
//! body is read and dropped (at most [`DRAIN_BYTES`], for at most [`DRAIN_TIME`]) before
//! the answer leaves, and the answer says `Connection: close` so a pooled client does not
//! send its next call on this connection.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Body as _;
use tokio::sync::oneshot;

/// The most of a refused body read to let its client finish writing: past it, the
/// connection is closed with the rest unread (a client sending more learns of the refusal
/// from the reset, as it would from any server).
pub(crate) const DRAIN_BYTES: u64 = 1 << 20;
/// The longest a refused body is read for.
pub(crate) const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The request's body as the handler sees it; when the handler drops it, what was left
/// goes back to [`close_after_refused_body`].
struct Returned {
    inner: Option<Body>,
    back: Option<oneshot::Sender<Body>>,
}

impl http_body::Body for Returned {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        match self.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        if let (Some(body), Some(back)) = (self.inner.take(), self.back.take())
            && !body.is_end_stream()
        {
            let _ = back.send(body);
        }
    }
}

/// Reads and drops what is left of `body`, within [`DRAIN_BYTES`] and [`DRAIN_TIME`].
/// True when the body was read to its end.
async fn drain(mut body: Body) -> bool {
    let read = async {
        let mut seen = 0u64;
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if seen > DRAIN_BYTES {
                        return false;
                    }
                }
            }
        }
    };
    tokio::time::timeout(DRAIN_TIME, read)
        .await
        .unwrap_or(false)
}

/// Middleware of both listeners: a request with a body that is refused (4xx/5xx) is
/// answered after what is left of its body was read (bounded), with `Connection: close`.
pub(crate) async fn close_after_refused_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let (back, mut left) = oneshot::channel();
    let body = Body::new(Returned {
        inner: Some(body),
        back: Some(back),
    });
    let mut res = next.run(Request::from_parts(parts, body)).await;
    if res.status().is_client_error() || res.status().is_server_error() {
        // A handler that still holds the body (a stream handed to a task) is not waited for.
        if let Ok(rest) = left.try_recv() {
            drain(rest).await;
        }
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}
