//! TLS for the API (rustls): a listener that hands axum connections whose handshake is
//! done. Handshakes run as their own tasks with a deadline, so a client that stalls in one
//! never holds up the others.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::ServerError;

/// The longest a client may take to finish its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// Loads a PEM certificate chain and private key into a server config (HTTP/1.1 only).
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            ServerError::Config(format!(
                "tls.cert_file {}: {e}; give a PEM certificate chain",
                cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(ServerError::Config(format!(
            "tls.cert_file {} holds no certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ServerError::Config(format!(
            "tls.key_file {}: {e}; give the PEM private key of the certificate",
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
    .map_err(|e| ServerError::Config(format!("tls: the key does not fit the certificate: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Accepted, handshaken TLS connections.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsListener {
    pub fn new(tcp: TcpListener, cfg: rustls::ServerConfig) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(cfg));
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Each write leaves at once (see `no_delay`).
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%addr, "TCP_NODELAY: {e}");
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local, task })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
