//! Body wrappers: placeholder detection on the way out, secret redaction on the way back.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use http_body_util::combinators::BoxBody;

use crate::scan::{StreamDetector, StreamRedactor};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = BoxBody<Bytes, BoxError>;

pub(crate) fn box_err(e: hyper::Error) -> BoxError {
    Box::new(e)
}

pub(crate) fn full(b: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(b.into())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}

type OnHit = Box<dyn FnOnce(usize) + Send + Sync>;

/// Forwards a request body, failing it the moment a watched placeholder completes.
pub(crate) struct ScanBody<B> {
    inner: B,
    det: StreamDetector,
    on_hit: Option<OnHit>,
    failed: bool,
}

impl<B> ScanBody<B> {
    pub(crate) fn new(inner: B, det: StreamDetector, on_hit: OnHit) -> Self {
        ScanBody {
            inner,
            det,
            on_hit: Some(on_hit),
            failed: false,
        }
    }
}

impl<B> Body for ScanBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Some(id) = this.det.feed(data)
                {
                    this.failed = true;
                    if let Some(f) = this.on_hit.take() {
                        f(id);
                    }
                    return Poll::Ready(Some(Err(
                        "request body carried a credential placeholder to a host its grant does not cover"
                            .into(),
                    )));
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Forwards a response body with secrets masked (same length, so Content-Length holds).
pub(crate) struct RedactBody<B> {
    inner: B,
    red: StreamRedactor,
    trailers: Option<Frame<Bytes>>,
    done: bool,
}

impl<B> RedactBody<B> {
    pub(crate) fn new(inner: B, red: StreamRedactor) -> Self {
        RedactBody {
            inner,
            red,
            trailers: None,
            done: false,
        }
    }
}

impl<B> Body for RedactBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(t) = this.trailers.take() {
                this.done = true;
                return Poll::Ready(Some(Ok(t)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.red.push(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(other) => {
                        this.trailers = Some(other);
                        let rest = this.red.finish();
                        if !rest.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                        }
                    }
                },
                Poll::Ready(None) => {
                    this.done = true;
                    let rest = this.red.finish();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
