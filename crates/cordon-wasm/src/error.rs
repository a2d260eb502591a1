use std::path::PathBuf;

/// Errors of the wasm tier's own machinery. Each says what went wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    /// A guest artifact that setup builds is not there.
    #[error(
        "the {guest} guest is not installed (looked for {path}); run `cordon setup wasm` to build it"
    )]
    MissingGuest { guest: &'static str, path: PathBuf },
    /// The manifest of built guests could not be read.
    #[error(
        "guest manifest {path} is unreadable ({reason}); run `cordon setup wasm` to rebuild it"
    )]
    Manifest { path: PathBuf, reason: String },
    /// A guest artifact does not match the hash it is named by: changed after setup built it.
    #[error(
        "guest artifact {path} does not match its content hash (tampered with or corrupt); \
         run `cordon setup wasm` to rebuild it"
    )]
    Tampered { path: PathBuf },
    /// The wasm engine could not be configured.
    #[error("could not set up the wasm engine: {0}")]
    Engine(String),
    /// A guest could not be compiled or linked.
    #[error("could not load the {guest} guest: {reason}; run `cordon setup wasm` to rebuild it")]
    Load { guest: &'static str, reason: String },
    /// A host file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<WasmError> for cordon_core::Error {
    fn from(e: WasmError) -> Self {
        match e {
            WasmError::MissingGuest { .. }
            | WasmError::Manifest { .. }
            | WasmError::Tampered { .. } => cordon_core::Error::Unavailable {
                tier: cordon_core::Tier::Wasm,
                reason: e.to_string(),
                fix: format!("run `{}`", cordon_core::Tier::Wasm.setup_command()),
            },
            other => cordon_core::Error::failed("the wasm tier", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WasmError;

    #[test]
    fn the_tiers_error_is_the_source_of_the_core_error() {
        let e: cordon_core::Error = WasmError::Engine("no pooling allocator".into()).into();
        assert_eq!(
            e.to_string(),
            "sandbox failure: the wasm tier: could not set up the wasm engine: no pooling allocator"
        );
        let source = std::error::Error::source(&e).expect("the wasm error is kept");
        assert!(matches!(
            source.downcast_ref::<WasmError>(),
            Some(WasmError::Engine(_))
        ));
    }
}
