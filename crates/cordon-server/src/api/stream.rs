//! How an exec's or a cell's result goes back: one JSON object, or its output streamed as
//! NDJSON or SSE events with the result (or the error) as the last event.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use cordon_core::{ExecOutcome, OutputStream};
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::service::Chunk;

/// How a client wants an exec's result.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Whole,
    Ndjson,
    Sse,
}

pub(crate) fn mode(headers: &HeaderMap, stream: bool) -> Mode {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/event-stream") {
        Mode::Sse
    } else if stream || accept.contains("application/x-ndjson") {
        Mode::Ndjson
    } else {
        Mode::Whole
    }
}

/// Decodes UTF-8 across chunk boundaries: an incomplete trailing sequence waits for the
/// next chunk; invalid bytes become U+FFFD.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..good + n);
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

fn frame(mode: Mode, event: &str, payload: serde_json::Value) -> Bytes {
    match mode {
        Mode::Sse => Bytes::from(format!("event: {event}\ndata: {payload}\n\n")),
        _ => {
            let mut v = payload;
            if let serde_json::Value::Object(m) = &mut v {
                m.insert("type".into(), json!(event));
            }
            Bytes::from(format!("{v}\n"))
        }
    }
}

/// Streams output chunks as they come, then the outcome (or the error) as the last event.
pub(crate) fn stream_response(
    mode: Mode,
    rx: mpsc::UnboundedReceiver<Chunk>,
    fut: impl std::future::Future<Output = Result<ExecOutcome, ApiError>> + Send + 'static,
) -> Response {
    stream_events(mode, rx, fut, "outcome")
}

/// Streams output chunks as they come, then the end (or the error) as the last event:
/// `last` names its event and the field that holds it.
pub(crate) fn stream_events<T: serde::Serialize + Send + 'static>(
    mode: Mode,
    mut rx: mpsc::UnboundedReceiver<Chunk>,
    fut: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    last: &'static str,
) -> Response {
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut done = std::pin::pin!(fut);
        let mut carry = [Utf8Carry::default(), Utf8Carry::default()];
        let idx = |s: OutputStream| match s {
            OutputStream::Stdout => 0usize,
            OutputStream::Stderr => 1usize,
        };
        let name = |i: usize| if i == 0 { "stdout" } else { "stderr" };
        let result = loop {
            tokio::select! {
                biased;
                // The client went away: the exec's future is dropped (its sink sees the
                // closed channel and the tier stops the program).
                _ = out_tx.closed() => return,
                Some(c) = rx.recv() => {
                    let i = idx(c.stream);
                    let text = carry[i].push(&c.data);
                    if !text.is_empty() {
                        let _ = out_tx.send(Ok(frame(mode, name(i), json!({"data": text})))).await;
                    }
                }
                r = &mut done => break r,
            }
        };
        // Output sent before the exec ended but not yet forwarded.
        while let Ok(c) = rx.try_recv() {
            let i = idx(c.stream);
            let text = carry[i].push(&c.data);
            if !text.is_empty() {
                let _ = out_tx
                    .send(Ok(frame(mode, name(i), json!({"data": text}))))
                    .await;
            }
        }
        for (i, c) in carry.iter_mut().enumerate() {
            let rest = c.finish();
            if !rest.is_empty() {
                let _ = out_tx
                    .send(Ok(frame(mode, name(i), json!({"data": rest}))))
                    .await;
            }
        }
        let last = match result {
            Ok(o) => frame(mode, last, json!({ last: o })),
            Err(e) => frame(mode, "error", json!({"error": e.to_json()})),
        };
        let _ = out_tx.send(Ok(last)).await;
    });
    let stream = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let ctype = match mode {
        Mode::Sse => "text/event-stream",
        _ => "application/x-ndjson",
    };
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_carry_across_chunks() {
        let mut c = Utf8Carry::default();
        let s = "héllo €".as_bytes();
        let mut out = String::new();
        for b in s {
            out.push_str(&c.push(&[*b]));
        }
        out.push_str(&c.finish());
        assert_eq!(out, "héllo €");
        assert_eq!(c.push(b"a\xffb"), "a\u{fffd}b");
    }
}
