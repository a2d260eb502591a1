//! An opaque CONNECT tunnel: bytes copied both ways, the sandbox's side watched for
//! placeholders, and a TLS handshake's server name checked against the CONNECT host.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::answer::ReqInfo;
use super::grants::foreign_placeholders;
use crate::audit::Decision;
use crate::conn::Conn;
use crate::policy::Host;

const TUNNEL_BUF: usize = 64 << 10;

/// Reads the server name from a TLS ClientHello at the start of an opaque tunnel, without
/// terminating anything: a tunnel opened for one host must not carry a handshake for another.
#[derive(Default)]
struct HelloCheck {
    acceptor: rustls::server::Acceptor,
    seen: usize,
    first: Option<u8>,
    failed: bool,
}

enum HelloVerdict {
    NeedMore,
    /// Finished: the SNI if the stream starts with a ClientHello that carries one.
    Done(Option<String>),
    /// The stream starts as a TLS handshake whose ClientHello cannot be read (malformed, or
    /// larger than the check reads): its server name cannot be checked, so it is refused.
    Unreadable,
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

impl HelloCheck {
    const MAX: usize = 32 << 10;

    fn feed(&mut self, mut bytes: &[u8]) -> HelloVerdict {
        if self.first.is_none() {
            self.first = bytes.first().copied();
        }
        self.seen += bytes.len();
        while !bytes.is_empty() {
            match self.acceptor.read_tls(&mut bytes) {
                Ok(0) => break,
                Err(_) => {
                    self.failed = true;
                    break;
                }
                Ok(_) => {}
            }
        }
        match self.acceptor.accept() {
            Ok(Some(accepted)) => {
                HelloVerdict::Done(accepted.client_hello().server_name().map(str::to_string))
            }
            Ok(None) if self.seen < Self::MAX && !self.failed => HelloVerdict::NeedMore,
            _ if self.first == Some(TLS_HANDSHAKE) => HelloVerdict::Unreadable,
            // not TLS (a clear-text protocol): nothing to compare
            _ => HelloVerdict::Done(None),
        }
    }
}

/// An opaque tunnel. Bytes from the sandbox are still watched for placeholders, which
/// catches them in any protocol sent in clear through a tunnel.
pub(super) async fn tunnel<C>(
    conn: &Arc<Conn>,
    client: C,
    upstream: TcpStream,
    host: &Host,
    info: &ReqInfo,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let mut det = foreign_placeholders(&conn.shared, host);
    let mut hello = Some(HelloCheck::default());
    let mut held: Vec<u8> = Vec::new();
    let up = async {
        let mut buf = vec![0u8; TUNNEL_BUF];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                uw.shutdown().await?;
                return Ok::<_, io::Error>(());
            }
            if let Some(g) = det.feed(&buf[..n]) {
                let name = conn.shared.grants.list[g].name.clone();
                let mut ev = info.event(conn, Decision::Exfiltration);
                ev.rule = Some(format!("grant:{name}"));
                ev.reason = Some(format!(
                    "a tunnel to {host} carried the placeholder of grant {name:?}, which does not cover that host"
                ));
                ev.grant = Some(cordon_core::GrantNames::one(name.clone()));
                conn.shared.audit.record(ev);
                conn.end(
                    &format!("grant:{name}"),
                    "credential placeholder in a tunnel to a host its grant does not cover".into(),
                );
                return Err(io::Error::other("placeholder exfiltration"));
            }
            if let Some(check) = hello.as_mut() {
                match check.feed(&buf[..n]) {
                    // Nothing goes upstream before the server name is known.
                    HelloVerdict::NeedMore => {
                        held.extend_from_slice(&buf[..n]);
                        continue;
                    }
                    HelloVerdict::Unreadable => {
                        let mut ev = info.event(conn, Decision::Deny);
                        ev.rule = Some("tls-unreadable".into());
                        ev.reason = Some(format!(
                            "the tunnel to {host} starts a TLS handshake whose ClientHello cannot be read (malformed or over {} KiB), so its server name cannot be checked",
                            HelloCheck::MAX >> 10
                        ));
                        conn.shared.audit.record(ev);
                        conn.end(
                            "tls-unreadable",
                            "a TLS handshake without a readable ClientHello".into(),
                        );
                        return Err(io::Error::other("unreadable client hello"));
                    }
                    HelloVerdict::Done(None) => hello = None,
                    HelloVerdict::Done(Some(sni)) => {
                        hello = None;
                        if Host::parse(&sni).map(|h| h != *host).unwrap_or(true) {
                            let mut ev = info.event(conn, Decision::Deny);
                            ev.rule = Some("sni-mismatch".into());
                            ev.reason = Some(format!(
                                "the TLS server name {sni:?} differs from the CONNECT host {host}"
                            ));
                            conn.shared.audit.record(ev);
                            conn.end(
                                "sni-mismatch",
                                "TLS server name differs from the CONNECT host".into(),
                            );
                            return Err(io::Error::other("sni mismatch"));
                        }
                    }
                }
            }
            if !held.is_empty() {
                // The hello's earlier pieces, held until it could be checked.
                uw.write_all(&held).await?;
                held.clear();
            }
            uw.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0u8; TUNNEL_BUF];
        loop {
            let n = ur.read(&mut buf).await?;
            if n == 0 {
                cw.shutdown().await?;
                return Ok::<_, io::Error>(());
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    let _ = tokio::try_join!(up, down);
}
