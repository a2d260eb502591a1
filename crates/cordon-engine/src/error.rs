//! The engine's set-up errors, below every module that reports one (the catalogue, the
//! ceiling, the token issuer).

/// Errors of setting the engine up (the operator's config).
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("{0}")]
    Config(String),
}
