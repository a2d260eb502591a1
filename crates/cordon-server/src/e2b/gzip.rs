//! gzip on envd's `/files` (E2B's `content_encoding`: `files.write(..., gzip=True)` sends the
//! octet-stream body with `Content-Encoding: gzip`; `files.read(..., gzip=True)` asks with
//! `Accept-Encoding: gzip`). An upload is inflated within the same bound as a plain one
//! (`http.max_file_bytes` of content, whatever the compressed size), so a small bomb is
//! refused, not expanded.

use std::io::{Read, Write};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::e2b_error;

/// How an upload's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    Identity,
    Gzip,
}

/// The upload's `Content-Encoding`: none, `identity` or `gzip`; anything else is refused.
pub(super) fn of_upload(headers: &HeaderMap) -> Result<Encoding, Response> {
    let Some(v) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(Encoding::Identity);
    };
    let v = v.to_str().unwrap_or("").trim();
    if v.is_empty() || v.eq_ignore_ascii_case("identity") {
        Ok(Encoding::Identity)
    } else if v.eq_ignore_ascii_case("gzip") {
        Ok(Encoding::Gzip)
    } else {
        Err(e2b_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding {v:?} is not taken: send gzip or no encoding"),
        ))
    }
}

/// The inflated body, at most `max` bytes.
pub(super) fn inflate(body: &[u8], max: u64) -> Result<Vec<u8>, Response> {
    let mut out = Vec::new();
    let mut d = flate2::read::GzDecoder::new(body).take(max.saturating_add(1));
    if d.read_to_end(&mut out).is_err() {
        return Err(e2b_error(
            StatusCode::BAD_REQUEST,
            "the body is not valid gzip: send it compressed whole, or without Content-Encoding",
        ));
    }
    if out.len() as u64 > max {
        return Err(e2b_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the file inflates past {max} bytes, the server's limit (http.max_file_bytes)"),
        ));
    }
    Ok(out)
}

/// Whether the client takes a gzip answer (`Accept-Encoding` naming gzip, not at q=0).
pub(super) fn accepted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// `data` compressed.
pub(super) fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn round_trip_and_bounds() {
        let data = b"hello gzip".repeat(100);
        let z = deflate(&data);
        assert_eq!(inflate(&z, 1000).unwrap(), data);
        assert_eq!(
            inflate(&z, 999).unwrap_err().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            inflate(b"not gzip", 10).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn accept_encoding() {
        let h = |v: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
            m
        };
        assert!(accepted(&h("gzip")));
        assert!(accepted(&h("br, gzip;q=0.5")));
        assert!(!accepted(&h("gzip;q=0")));
        assert!(!accepted(&h("identity")));
        assert!(!accepted(&HeaderMap::new()));
    }
}
