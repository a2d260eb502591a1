//! Connections from outside to a port a program serves on a sandbox's own loopback (E2B's
//! `get_host(port)`, the native port route): the tier relays a stream socket to the port
//! inside ([`cordon_core::Sandbox::open_port`]). Each connection is the tenant's own (the
//! sandbox is looked up under the caller's tenant), audited (`port_open`, with its refusal),
//! bounded per sandbox ([`MAX_PORT_CONNS`] at once), and closes when the sandbox ends (the
//! relay is a process of the sandbox).

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::LazyLock;
use std::time::Duration;

use super::common::{Slot, Slots, audit_err, blocking, gone, lock};
use super::sessions::Sessions;
use crate::audit::AuditEvent;
use crate::error::ApiError;
use crate::keys::Tenant;

/// Connections to one sandbox's ports open at once.
pub const MAX_PORT_CONNS: usize = 64;
/// How long the relay may take to say whether the port answered.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

static SLOTS: LazyLock<Slots> = LazyLock::new(|| {
    Slots::new(
        "connections to this sandbox's ports",
        "close connections you no longer use, or wait for some to end",
    )
});

/// What opening a port found.
pub enum Opened {
    /// A connection to the program, the sandbox's place held until it is dropped.
    Conn(PortConn),
    /// Nothing listens on the port in the sandbox.
    Closed,
}

/// A connection to a port in a sandbox.
pub struct PortConn {
    pub stream: UnixStream,
    pub slot: Slot,
}

impl Sessions {
    /// Connects to `port` on sandbox `id`'s loopback for `tenant` (`via`: the listener's
    /// name, for the audit row).
    pub async fn open_port(
        &self,
        tenant: &Tenant,
        id: &str,
        port: u16,
        via: &'static str,
    ) -> Result<Opened, ApiError> {
        let slot = SLOTS.take(id, MAX_PORT_CONNS)?;
        let guard = self.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.audit.store.clone();
        let stream = blocking(move || -> Result<Option<UnixStream>, ApiError> {
            // The sandbox is busy only while the agent takes the connection, not while the
            // relay connects.
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.open_port(port)
            };
            drop(guard);
            let r = r.and_then(|c| connected(c, port));
            let error = match &r {
                Ok(Some(_)) => None,
                Ok(None) => Some(format!("nothing listens on port {port}")),
                Err(e) => Some(e.to_string()),
            };
            audit
                .record(&s.row(AuditEvent::PortOpen {
                    port,
                    via: via.to_string(),
                    error,
                }))
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await??;
        Ok(match stream {
            Some(stream) => Opened::Conn(PortConn { stream, slot }),
            None => Opened::Closed,
        })
    }
}

/// Reads the relay's first byte: the stream when the port answered, `None` when not.
fn connected(mut c: UnixStream, port: u16) -> cordon_core::Result<Option<UnixStream>> {
    let failed = |e| cordon_core::Error::failed(format!("relaying to port {port}"), e);
    c.set_read_timeout(Some(CONNECT_WAIT)).map_err(failed)?;
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Ok(1) if b[0] == cordon_core::PORT_CONNECTED => {
            c.set_read_timeout(None).map_err(failed)?;
            Ok(Some(c))
        }
        Ok(_) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}
