//! The microvm tier's egress path. The VM has no network device. A sandbox whose spec allows
//! hosts (or grants credentials) gets a per-sandbox proxy (the container tier's
//! [`EgressLink`]: `cordon-egress` on a host unix socket only Cordon can reach) and a second
//! virtio-serial port, `cordon.egress`, whose host end is a socket QEMU serves and Cordon
//! connects to. Inside, the guest agent's forwarder listens on `127.0.0.1:3128` and carries
//! each connection as a stream over that port ([`cordon_guest::tunnel`]); here each stream
//! becomes one connection to the proxy. Without egress the port's host end is QEMU's null
//! device and no forwarder runs: nothing inside the VM leads anywhere.

use std::fmt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use cordon_core::{Error, Result, SandboxSpec};
use cordon_egress::ProxyConfig;
use cordon_guest::proto::{EgressSetup, GUEST_CA_BUNDLE_PATH, GUEST_CA_CERT_PATH};
use cordon_guest::tunnel::{self, Tunnel};
use cordon_host::egress::{EgressLink, SANDBOX_PROXY_PORT};

/// A last say over each sandbox's proxy configuration: upstream roots (a corporate CA), a
/// resolver of one's own, limits. Tests point a name at a loopback upstream with it.
#[derive(Clone, Default)]
pub struct EgressTuning(pub Option<TuneProxy>);

/// See [`EgressTuning`].
pub type TuneProxy = Arc<dyn Fn(&mut ProxyConfig) + Send + Sync>;

impl fmt::Debug for EgressTuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "EgressTuning(set)"
        } else {
            "EgressTuning(none)"
        })
    }
}

/// One sandbox's proxy and, once the VM is up, the tunnel to its guest.
pub struct VmEgress {
    pub link: EgressLink,
    tunnel: Option<Tunnel>,
}

impl VmEgress {
    /// Starts the proxy. Its socket belongs to root (mode 0600 in a 0700 directory): only
    /// Cordon's tunnel connects to it, never QEMU.
    pub fn start(sandbox_id: &str, spec: &SandboxSpec, tuning: &EgressTuning) -> Result<Self> {
        let link = EgressLink::start_with(sandbox_id, spec, 0, |cfg| {
            cfg.ca_cert_path = GUEST_CA_CERT_PATH.into();
            cfg.ca_bundle_path = GUEST_CA_BUNDLE_PATH.into();
            if let Some(t) = &tuning.0 {
                t(cfg);
            }
        })?;
        Ok(VmEgress { link, tunnel: None })
    }

    /// Serves the guest's streams arriving on `port` (QEMU's egress socket).
    pub fn attach(&mut self, port: UnixStream) -> Result<()> {
        let dial = tunnel::dial_unix(self.link.socket().to_path_buf());
        let tunnel = Tunnel::over_socket(port, Some(dial))
            .map_err(|e| Error::io("serving the egress port", e))?;
        self.tunnel = Some(tunnel);
        Ok(())
    }

    /// What the guest is told in `Configure`: the port and the CA files (no secret).
    pub fn setup(&self) -> Result<EgressSetup> {
        let (ca_cert_pem, ca_bundle_pem) = self
            .link
            .ca_pems()
            .ok_or_else(|| Error::Sandbox("the egress proxy is gone".into()))?;
        Ok(EgressSetup {
            port: SANDBOX_PROXY_PORT,
            ca_cert_pem,
            ca_bundle_pem,
        })
    }
}

impl Drop for VmEgress {
    fn drop(&mut self) {
        if let Some(t) = self.tunnel.take() {
            t.shutdown();
        }
    }
}
