//! TLS for the API (rustls): the server's configuration. Connections are accepted and their
//! handshakes run (each its own task, with a deadline, within the listener's caps) by
//! [`crate::listen`].

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ServerError;

/// Loads a PEM certificate chain and private key into a server config (HTTP/1.1 only).
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServerError> {
    server_config_of(cert, key, "tls.cert_file", "tls.key_file")
}

/// As [`server_config`], its errors naming the settings the files came from.
pub fn server_config_of(
    cert: &Path,
    key: &Path,
    cert_setting: &str,
    key_setting: &str,
) -> Result<rustls::ServerConfig, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            ServerError::Config(format!(
                "{cert_setting} {}: {e}; give a PEM certificate chain",
                cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(ServerError::Config(format!(
            "{cert_setting} {} holds no certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ServerError::Config(format!(
            "{key_setting} {}: {e}; give the PEM private key of the certificate",
            key.display()
        ))
    })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServerError::Config(format!("TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| {
        ServerError::Config(format!(
            "{key_setting}: the key does not fit the certificate of {cert_setting}: {e}"
        ))
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
