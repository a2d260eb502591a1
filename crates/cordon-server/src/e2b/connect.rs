//! The Connect protocol as E2B's SDKs speak it to envd: the JSON codec only (no binary
//! protobuf, no compression). Unary calls are `application/json` both ways; streams are
//! `application/connect+json` messages in 5-byte envelopes (`flags`, big-endian length)
//! and always end with an end-of-stream envelope (flag `0x02`), which the JavaScript client
//! requires. The envelope is five bytes, so it is written here rather than taken from a
//! Connect crate, all of which are built around generated protobuf types.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An envelope's flag for the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// An envelope's flag for a compressed message (never sent by the SDKs; refused).
const COMPRESSED: u8 = 0x01;
/// The largest message Cordon reads from a stream.
pub const MAX_MESSAGE: usize = 8 << 20;

/// A Connect error: its code (snake_case, as Connect names them) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    code: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct EndStream<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorJson<'a>>,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }

    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new("unimplemented", message)
    }

    /// The HTTP status of a unary error, as the Connect protocol maps its codes.
    pub fn status(&self) -> StatusCode {
        match self.code {
            "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "permission_denied" => StatusCode::FORBIDDEN,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> ErrorJson<'_> {
        ErrorJson {
            code: self.code,
            message: &self.message,
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.json()).unwrap_or_default();
        (
            self.status(),
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// A unary call's answer.
pub fn unary<T: Serialize>(msg: &T) -> Response {
    match serde_json::to_vec(msg) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            ConnectError::new("internal", format!("encoding the answer: {e}")).into_response()
        }
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn codec_refusal(ct: &str) -> ConnectError {
    ConnectError::new(
        "unimplemented",
        format!(
            "content type {ct:?}: Cordon's E2B listener speaks the Connect protocol with the JSON codec only, as E2B's SDKs do"
        ),
    )
}

/// A unary request's message.
pub fn decode_unary<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    let ct = content_type(headers);
    if !ct.starts_with("application/json") {
        return Err(codec_refusal(ct));
    }
    let body = if body.is_empty() { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| ConnectError::invalid(format!("the request: {e}")))
}

/// Splits whole envelopes off the front of `buf`: each message's bytes, and whether the
/// end-of-stream envelope was seen. What is left in `buf` is an incomplete envelope.
pub fn split_envelopes(buf: &mut Vec<u8>) -> Result<(Vec<Vec<u8>>, bool), ConnectError> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut end = false;
    while buf.len() - at >= 5 {
        let flags = buf[at];
        let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(ConnectError::new(
                "resource_exhausted",
                format!("a message of {len} bytes; Cordon reads at most {MAX_MESSAGE}"),
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err(ConnectError::unimplemented(
                "a compressed message: Cordon's E2B listener takes uncompressed messages only",
            ));
        }
        if buf.len() - at - 5 < len {
            break;
        }
        let msg = buf[at + 5..at + 5 + len].to_vec();
        at += 5 + len;
        if flags & END_STREAM != 0 {
            end = true;
            break;
        }
        out.push(msg);
    }
    buf.drain(..at);
    Ok((out, end))
}

/// The one message of a server-streaming call's request.
pub fn decode_stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    let ct = content_type(headers);
    if !ct.starts_with("application/connect+json") {
        return Err(codec_refusal(ct));
    }
    let mut buf = body.to_vec();
    let (msgs, _) = split_envelopes(&mut buf)?;
    let first = msgs
        .into_iter()
        .next()
        .ok_or_else(|| ConnectError::invalid("the stream request holds no message"))?;
    serde_json::from_slice(&first).map_err(|e| ConnectError::invalid(format!("the request: {e}")))
}

/// One message as an envelope.
pub fn envelope<T: Serialize>(msg: &T) -> Bytes {
    frame(0, &serde_json::to_vec(msg).unwrap_or_default())
}

/// The end-of-stream envelope, with the error that ended the stream, if one did.
pub fn end_stream(err: Option<&ConnectError>) -> Bytes {
    let body = EndStream {
        error: err.map(ConnectError::json),
    };
    frame(END_STREAM, &serde_json::to_vec(&body).unwrap_or_default())
}

fn frame(flags: u8, data: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(5 + data.len());
    v.push(flags);
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    Bytes::from(v)
}

/// A streaming answer: `body` yields envelopes (its last the end-of-stream one).
pub fn stream_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// A stream that fails before its first message: only the end-of-stream envelope.
pub fn stream_error(err: &ConnectError) -> Response {
    stream_response(Body::from(end_stream(Some(err))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_end() {
        let mut buf = envelope(&serde_json::json!({"a": 1})).to_vec();
        buf.extend_from_slice(&end_stream(None));
        buf.extend_from_slice(&[0, 0, 0]);
        let (msgs, end) = split_envelopes(&mut buf).unwrap();
        assert_eq!(msgs, vec![br#"{"a":1}"#.to_vec()]);
        assert!(end);
        let e = end_stream(Some(&ConnectError::new("deadline_exceeded", "x")));
        assert_eq!(e[0], END_STREAM);
        assert_eq!(
            &e[5..],
            br#"{"error":{"code":"deadline_exceeded","message":"x"}}"#
        );
    }

    #[test]
    fn partial_envelopes_wait_and_huge_ones_are_refused() {
        let whole = envelope(&serde_json::json!({"b": 2}));
        let mut buf = whole[..7].to_vec();
        let (msgs, end) = split_envelopes(&mut buf).unwrap();
        assert!(msgs.is_empty() && !end);
        assert_eq!(buf.len(), 7);
        buf.extend_from_slice(&whole[7..]);
        let (msgs, _) = split_envelopes(&mut buf).unwrap();
        assert_eq!(msgs.len(), 1);
        let mut huge = vec![0u8, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            split_envelopes(&mut huge).unwrap_err().code,
            "resource_exhausted"
        );
        let mut zipped = vec![COMPRESSED, 0, 0, 0, 0];
        assert_eq!(
            split_envelopes(&mut zipped).unwrap_err().code,
            "unimplemented"
        );
    }
}
