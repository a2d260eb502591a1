//! The tier's own errors and how they become Cordon's.

/// Errors of the microvm tier, converted into [`cordon_core::Error`] at the API boundary.
#[derive(Debug, thiserror::Error)]
pub enum MicrovmError {
    #[error("guest image: {0}")]
    Image(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("qemu: {0}")]
    Qemu(String),
    /// A step of the tier failed with an error of its own, kept as the source.
    #[error("{what}: {source}")]
    Failed {
        what: String,
        #[source]
        source: cordon_core::BoxError,
    },
    /// A cold boot whose agent never said hello by the boot deadline (QEMU still running):
    /// the boot is tried once more before this reaches a caller.
    #[error(
        "the guest did not reach its agent in time ({0}); create the sandbox again, and if it \
         keeps happening send the operator's log (it holds the guest console)"
    )]
    BootStalled(String),
}

impl MicrovmError {
    /// A step that failed with `source`.
    pub fn failed(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        MicrovmError::Failed {
            what: what.into(),
            source: Box::new(source),
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        MicrovmError::Io {
            what: what.into(),
            source,
        }
    }
}

impl From<MicrovmError> for cordon_core::Error {
    fn from(e: MicrovmError) -> Self {
        match e {
            MicrovmError::Image(m) => cordon_core::Error::Unavailable {
                tier: cordon_core::Tier::Microvm,
                reason: m,
                fix: format!("run `{}`", cordon_core::Tier::Microvm.setup_command()),
            },
            MicrovmError::Io { what, source } => cordon_core::Error::Io { what, source },
            MicrovmError::Qemu(m) => cordon_core::Error::Sandbox(m),
            MicrovmError::Failed { what, source } => cordon_core::Error::Failed { what, source },
            e @ MicrovmError::BootStalled(_) => cordon_core::Error::Sandbox(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MicrovmError;

    #[test]
    fn a_failed_step_keeps_its_source_through_the_core_error() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the socket closed");
        let e: cordon_core::Error = MicrovmError::failed("QMP stop", io).into();
        assert_eq!(
            e.to_string(),
            "sandbox failure: QMP stop: the socket closed"
        );
        let source = std::error::Error::source(&e).expect("the io error is kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("as an io error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    }
}
