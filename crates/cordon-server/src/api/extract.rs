//! What every resource's routes share: the tenant of a request (its key), the connection's
//! address, the answers to bodies and queries that do not parse, and the sandbox id.

use std::net::IpAddr;

use axum::extract::FromRequestParts;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use cordon_core::SandboxId;

use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::service::Service;

/// The authenticated tenant of a request (`Authorization: Bearer <key>`).
pub struct Auth(pub Tenant);

/// The address a connection came from: the listeners' (they accept the connections).
pub use crate::listen::PeerAddr;

pub(crate) fn unauthorized(msg: &str) -> ApiError {
    ApiError::new(
        Code::Unauthorized,
        msg,
        "send `Authorization: Bearer <api key>` with a key from the server's key file",
    )
}

/// Finds the tenant of a request's bearer key. `peer` is the connection's source, for the
/// failed-key back-off (none for in-process callers).
pub fn authenticate(
    svc: &Service,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Tenant, ApiError> {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        svc.metrics().deny("unauthorized");
        return Err(unauthorized("no API key given"));
    };
    let key = v
        .to_str()
        .ok()
        .and_then(|s| {
            s.strip_prefix("Bearer ")
                .or_else(|| s.strip_prefix("bearer "))
        })
        .map(str::trim);
    match svc.key_attempt(key, peer) {
        Ok(t) => Ok(t),
        Err(crate::service::KeyRefused::Backoff(wait)) => {
            let mut e = ApiError::new(
                Code::TooManyFailures,
                "too many failed API keys from your address",
                "wait for the Retry-After seconds and send a valid key",
            );
            e.retry_after = Some(wait);
            Err(e)
        }
        Err(crate::service::KeyRefused::Invalid) => Err(unauthorized("the API key is not valid")),
    }
}

pub(super) fn peer_of(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<PeerAddr>>()
        .map(|c| c.0.0.ip())
}

impl FromRequestParts<Service> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, svc: &Service) -> Result<Self, ApiError> {
        authenticate(svc, &parts.headers, peer_of(parts)).map(Auth)
    }
}

/// A tenant when the request carries a valid key, none when it carries none; a bad key is
/// refused as anywhere else.
pub struct MaybeAuth(pub Option<Tenant>);

impl FromRequestParts<Service> for MaybeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, svc: &Service) -> Result<Self, ApiError> {
        if !parts.headers.contains_key(header::AUTHORIZATION) {
            return Ok(MaybeAuth(None));
        }
        authenticate(svc, &parts.headers, peer_of(parts)).map(|t| MaybeAuth(Some(t)))
    }
}

pub(crate) fn json_rejection(r: JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            Code::UnsupportedMediaType,
            "the body must be JSON",
            "send Content-Type: application/json",
        ),
        _ => ApiError::invalid(r.body_text()),
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        Code::PayloadTooLarge,
        "the request body is larger than this server accepts",
        "send less: the limits are http.max_body_bytes (JSON) and http.max_file_bytes (files)",
    )
}

pub(crate) fn bytes_rejection(r: BytesRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        ApiError::invalid(r.body_text())
    }
}

pub(crate) fn query_rejection(r: QueryRejection) -> ApiError {
    ApiError::invalid(r.body_text())
}

pub(crate) fn parse_id(id: &str) -> Result<String, ApiError> {
    SandboxId::parse(id)
        .map(|i| i.to_string())
        .ok_or_else(|| ApiError::not_found("sandbox"))
}
