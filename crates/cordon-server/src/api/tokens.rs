//! The token issuer's routes: OIDC discovery, its keys and introspection of minted tokens.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, header};
use serde::Deserialize;

use axum::extract::DefaultBodyLimit;

use super::extract::bytes_rejection;
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::get("/.well-known/openid-configuration", "oidcDiscovery", "tokens")
                .summary("OIDC discovery document of the issuer of minted grant tokens (issuer, jwks_uri, introspection_endpoint, ES256)")
                .public()
                .ok::<cordon_engine::Discovery>(200, "the discovery document"),
            discovery,
        )
        .op(
            Op::get("/.well-known/jwks.json", "jwks", "tokens")
                .summary("The public keys (P-256, ES256) that verify minted grant tokens: the current key and those whose tokens may still be alive")
                .public()
                .ok::<cordon_engine::Jwks>(200, "the keys"),
            jwks,
        )
        .op(
            Op::post("/v1/tokens/introspect", "introspectToken", "tokens")
                .summary("RFC 7662 introspection of a minted grant token: active while its sandbox lives and it has not expired (the token is the caller's credential: no key)")
                .public()
                .body("application/x-www-form-urlencoded", Some(crate::openapi::schema::<IntrospectForm>))
                .body("application/json", Some(crate::openapi::schema::<IntrospectForm>))
                .ok::<cordon_engine::Introspection>(200, "active, and the claims when active")
                .errors(&[Code::InvalidRequest]),
            introspect,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

/// The OIDC discovery document of the token issuer (minted grants).
async fn discovery(State(svc): State<Service>) -> Json<cordon_engine::Discovery> {
    Json(svc.issuer().discovery())
}

/// The issuer's public keys.
async fn jwks(State(svc): State<Service>) -> Json<cordon_engine::Jwks> {
    Json(svc.issuer().jwks())
}

#[derive(Deserialize, schemars::JsonSchema)]
struct IntrospectForm {
    /// The minted token (a JWT).
    token: String,
}

/// RFC 7662 token introspection: `token=<jwt>` (form or JSON). Answers only whether a
/// token this server minted is active, and its claims; the token itself is the caller's
/// credential, so no key is needed. A destroyed sandbox's tokens are inactive.
async fn introspect(
    State(svc): State<Service>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cordon_engine::Introspection>, ApiError> {
    let body = body.map_err(bytes_rejection)?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    let form: IntrospectForm = if json {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(e.to_string()))?
    } else {
        serde_urlencoded_token(&body)?
    };
    Ok(Json(svc.issuer().introspect(&form.token)))
}

/// `token=...` from an `application/x-www-form-urlencoded` body.
fn serde_urlencoded_token(body: &[u8]) -> Result<IntrospectForm, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
    for pair in text.split('&') {
        if let Some(v) = pair.strip_prefix("token=") {
            // A JWT has no characters a form encodes; refuse anything escaped.
            if v.contains('%') || v.contains('+') {
                return Err(ApiError::invalid("token must be a JWT"));
            }
            return Ok(IntrospectForm {
                token: v.to_string(),
            });
        }
    }
    Err(ApiError::invalid("give token=<the token> in the body"))
}
