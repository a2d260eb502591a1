//! Errors: the library's own (`ServerError`) and the API's JSON error body (`ApiError`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::sync::Arc;

/// Errors of the service's setup (config, data dir, audit store).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Audit(#[from] cordon_engine::audit::StoreError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another cordon server is using the data dir {0}; stop it or give another data_dir")]
    Locked(String),
    /// A part of the service could not start; `source` says why.
    #[error("{what}: {source}")]
    Start {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl ServerError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io {
            what: what.into(),
            source,
        }
    }

    /// A part of the service (`what`) that could not start, with the error that stopped it.
    pub fn start(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        ServerError::Start {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Stable error codes of the API. Clients match on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Unauthorized,
    NotFound,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    PathRefused,
    FileError,
    PolicyDenied,
    TierUnavailable,
    GrantUnavailable,
    LayerUnavailable,
    TooManySandboxes,
    TooManyExecs,
    TooManyContexts,
    TooManyFailures,
    ResourceBusy,
    SandboxBusy,
    ContextBusy,
    SandboxPaused,
    SandboxGone,
    SandboxFailure,
    Unsupported,
    ShuttingDown,
    StorageLow,
    VolumeExists,
    VolumeInUse,
    VolumeQuota,
    PausedQuota,
    SnapshotExists,
    SnapshotQuota,
    NoSuchRoute,
    MethodNotAllowed,
    Internal,
}

impl Code {
    pub fn status(self) -> StatusCode {
        match self {
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::NotFound | Code::NoSuchRoute => StatusCode::NOT_FOUND,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::InvalidRequest | Code::PathRefused => StatusCode::BAD_REQUEST,
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::FileError | Code::Unsupported => StatusCode::UNPROCESSABLE_ENTITY,
            Code::PolicyDenied => StatusCode::FORBIDDEN,
            Code::TierUnavailable | Code::LayerUnavailable => StatusCode::UNPROCESSABLE_ENTITY,
            Code::GrantUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::TooManySandboxes
            | Code::TooManyExecs
            | Code::TooManyContexts
            | Code::TooManyFailures
            | Code::ResourceBusy => StatusCode::TOO_MANY_REQUESTS,
            Code::SandboxBusy
            | Code::SandboxPaused
            | Code::ContextBusy
            | Code::VolumeExists
            | Code::VolumeInUse
            | Code::SnapshotExists => StatusCode::CONFLICT,
            Code::VolumeQuota | Code::PausedQuota | Code::SnapshotQuota => StatusCode::FORBIDDEN,
            Code::SandboxGone => StatusCode::GONE,
            Code::SandboxFailure | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::ShuttingDown | Code::StorageLow => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::Unauthorized => "unauthorized",
            Code::NotFound => "not_found",
            Code::InvalidRequest => "invalid_request",
            Code::PayloadTooLarge => "payload_too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::PathRefused => "path_refused",
            Code::FileError => "file_error",
            Code::PolicyDenied => "policy_denied",
            Code::TierUnavailable => "tier_unavailable",
            Code::GrantUnavailable => "grant_unavailable",
            Code::LayerUnavailable => "layer_unavailable",
            Code::TooManySandboxes => "too_many_sandboxes",
            Code::TooManyExecs => "too_many_execs",
            Code::TooManyContexts => "too_many_contexts",
            Code::ContextBusy => "context_busy",
            Code::SandboxPaused => "sandbox_paused",
            Code::TooManyFailures => "too_many_failures",
            Code::ResourceBusy => "resource_busy",
            Code::SandboxBusy => "sandbox_busy",
            Code::SandboxGone => "sandbox_gone",
            Code::SandboxFailure => "sandbox_failure",
            Code::Unsupported => "unsupported",
            Code::ShuttingDown => "shutting_down",
            Code::StorageLow => "storage_low",
            Code::VolumeExists => "volume_exists",
            Code::VolumeInUse => "volume_in_use",
            Code::VolumeQuota => "volume_quota",
            Code::PausedQuota => "paused_quota",
            Code::SnapshotExists => "snapshot_exists",
            Code::SnapshotQuota => "snapshot_quota",
            Code::NoSuchRoute => "no_such_route",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::Internal => "internal",
        }
    }
}

/// An API error: `{ "code", "message", "fix" }` (and `rule` for a refusal by a named rule)
/// with an HTTP status from the code.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub fix: String,
    /// The rule of the operator's ceiling or the tier policy that refused the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip)]
    pub retry_after: Option<u64>,
    /// What caused it, for the server's log and for callers that walk
    /// [`std::error::Error::source`]: never sent to the client (a store's or a host call's
    /// error may name host paths).
    #[serde(skip)]
    #[schemars(skip)]
    pub source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>, fix: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            fix: fix.into(),
            rule: None,
            retry_after: None,
            source: None,
        }
    }

    /// An internal error with the error that caused it kept as its source: the client sees
    /// `message` only, the log the whole chain.
    pub fn internal_from(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ApiError::internal(message).with_source(source)
    }

    /// Keeps `source` as the cause of this error (not shown to the client).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(
            Code::NotFound,
            format!("no {what} with that id"),
            "list yours with GET /v1/sandboxes; ids of other tenants are not visible",
        )
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(
            Code::InvalidRequest,
            message,
            "fix the request body; docs/openapi.json describes every field",
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            Code::Internal,
            message,
            "retry; if it persists, look at the server log and the audit store",
        )
    }

    /// The error as an audit row records it.
    pub fn failure(&self) -> cordon_engine::audit::Failure {
        cordon_engine::audit::Failure {
            code: self.code.as_str().to_string(),
            message: self.message.clone(),
            fix: self.fix.clone(),
            rule: self.rule.clone(),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (fix: {})",
            self.code.as_str(),
            self.message,
            self.fix
        )
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<cordon_engine::Denial> for ApiError {
    fn from(d: cordon_engine::Denial) -> Self {
        use cordon_engine::DenyCode;
        let code = match d.code {
            DenyCode::InvalidRequest => Code::InvalidRequest,
            DenyCode::PolicyDenied => Code::PolicyDenied,
            DenyCode::TierUnavailable => Code::TierUnavailable,
            DenyCode::GrantUnavailable => Code::GrantUnavailable,
        };
        let mut e = ApiError::new(code, d.message, d.fix);
        e.rule = Some(d.rule.to_string());
        e
    }
}

/// `message` with every word that is an absolute path (or holds one, as `at=/x`) replaced by
/// `<host path>`: a host step's error says what failed without where on the host.
pub(crate) fn without_host_paths(message: &str) -> String {
    message
        .split(' ')
        .map(|w| {
            let bare = w.trim_start_matches(['(', '"', '\'', '`', '[']);
            if bare.starts_with('/') || w.contains("=/") {
                let tail: String = w
                    .chars()
                    .rev()
                    .take_while(|c| ":),\"'`]".contains(*c))
                    .collect();
                format!("<host path>{}", tail.chars().rev().collect::<String>())
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl From<cordon_core::Error> for ApiError {
    fn from(e: cordon_core::Error) -> Self {
        use cordon_core::Error as E;
        let message = e.to_string();
        match e {
            E::Unavailable { fix, .. } => ApiError::new(Code::TierUnavailable, message, fix),
            E::LayerUnavailable { layer, .. } => ApiError::new(
                Code::LayerUnavailable,
                message,
                format!("fix the host (cordon doctor) or add \"{layer}\" to allow_weaker"),
            ),
            E::Invalid(_)
            | E::Rejected(_)
            | E::Malformed { .. }
            | E::Snapshot(_)
            | E::NotPrepared(_)
            | E::OtherTier { .. } => ApiError::invalid(message),
            E::PathRefused { .. } => ApiError::new(
                Code::PathRefused,
                message,
                "give a path without '..' or symlinks, under /work or elsewhere in the sandbox \
                 but /proc, /sys and /dev (read those with an exec)",
            ),
            E::File { .. } => ApiError::new(
                Code::FileError,
                message,
                "check that the file exists, is a regular file and is within the size limit",
            ),
            E::Gone { .. } => ApiError::new(Code::SandboxGone, message, "create a new sandbox"),
            E::Unsupported { fix, .. } => ApiError::new(Code::Unsupported, message, fix),
            E::Busy {
                retry_after_secs, ..
            } => {
                let mut e = ApiError::new(
                    Code::ResourceBusy,
                    message,
                    "retry after the seconds Retry-After gives; this tenant's share of the \
                     server's resource is in use by its own other requests",
                );
                e.retry_after = Some(retry_after_secs.max(1));
                e
            }
            E::Sandbox(_) => ApiError::new(
                Code::SandboxFailure,
                message,
                "retry with a new sandbox; run `cordon doctor` if it persists",
            ),
            // The host's side failed: what it was doing may name host paths, which stay in
            // the operator's log.
            E::Failed { .. } | E::Io { .. } => {
                let shown = without_host_paths(&message);
                if shown != message {
                    tracing::warn!("a host step failed: {message}");
                }
                ApiError::new(
                    Code::SandboxFailure,
                    shown,
                    "retry with a new sandbox; run `cordon doctor` if it persists",
                )
            }
        }
    }
}

impl From<cordon_host::volume::VolumeError> for ApiError {
    fn from(e: cordon_host::volume::VolumeError) -> Self {
        use cordon_host::volume::VolumeError as V;
        let message = e.to_string();
        match e {
            V::NotFound(_) => ApiError::new(
                Code::NotFound,
                message,
                "list yours with GET /v1/volumes; other tenants' volumes are not visible",
            ),
            V::Exists(_) => ApiError::new(Code::VolumeExists, message, "pick another name"),
            V::InUse { fix, .. } => ApiError::new(Code::VolumeInUse, message, fix),
            V::Invalid(_) => ApiError::invalid(message),
            V::Host { .. } => ApiError::new(
                Code::Internal,
                message,
                "retry; if it persists, the operator finds the cause in the server log",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(cause) = &self.source {
            // The client gets the message; the operator the cause, which may name host
            // paths no tenant sees.
            tracing::error!(code = self.code.as_str(), message = %self.message, cause = %Chain(cause.as_ref()), "request failed");
        }
        let mut resp = (self.code.status(), axum::Json(self.to_json())).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// An error and its sources, one after another, for the log.
pub(crate) struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_steps_error_names_no_host_path() {
        let e = cordon_core::Error::io(
            "creating /run/cordon/egress/sb-0123",
            std::io::Error::from_raw_os_error(17),
        );
        let api = ApiError::from(e);
        assert!(!api.message.contains("/run"), "{}", api.message);
        assert!(
            api.message.starts_with("creating <host path>: File exists"),
            "{}",
            api.message
        );
        assert_eq!(without_host_paths("no randomness"), "no randomness");
    }
}
