//! TLS: the per-sandbox certificate authority that signs leaf certificates for the hosts
//! whose TLS the proxy terminates, and the upstream client configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use time::{Duration, OffsetDateTime};

use crate::error::{Error, Result};
use crate::policy::{Host, HostMatch, Pattern};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How long the CA and its leaves are valid; a sandbox outliving this needs a new proxy.
const CA_VALIDITY: Duration = Duration::days(7);

/// The per-sandbox CA. Its key never leaves the proxy; only the certificate goes into the
/// sandbox. Name constraints limit it to the hosts the proxy terminates, so even a leaked
/// key could not vouch for anything else.
pub(crate) struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl SandboxCa {
    pub(crate) fn new(sandbox: &str, terminated: &[Pattern]) -> Result<SandboxCa> {
        let ca_err = |e: rcgen::Error| Error::Ca(e.to_string());
        let key = KeyPair::generate().map_err(ca_err)?;
        let short: String = sandbox
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(40)
            .collect();
        let mut params = ca_params(&format!("Cordon egress CA {short}"), "Cordon sandbox");
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(random_serial()?.into());
        let mut permitted = Vec::new();
        for p in terminated {
            match &p.host {
                HostMatch::Exact(n) => permitted.push(GeneralSubtree::DnsName(n.clone())),
                HostMatch::Suffix(s) => permitted.push(GeneralSubtree::DnsName(
                    s.trim_start_matches('.').to_string(),
                )),
                HostMatch::Net(net) => permitted.push(GeneralSubtree::IpAddress(
                    CidrSubnet::from_addr_prefix(net.addr(), net.prefix_len()),
                )),
                // `*`: terminating every name means no useful constraint is possible
                HostMatch::AnyName => {
                    permitted.clear();
                    break;
                }
            }
        }
        let any = terminated.iter().any(|p| p.host == HostMatch::AnyName);
        if !any {
            if permitted.is_empty() {
                // Nothing terminated: make the CA useless for any real name.
                permitted.push(GeneralSubtree::DnsName("invalid".into()));
            }
            params.name_constraints = Some(NameConstraints {
                permitted_subtrees: permitted,
                excluded_subtrees: Vec::new(),
            });
        }
        let cert = params.self_signed(&key).map_err(ca_err)?;
        let cert_pem = cert.pem();
        let cert_der = cert.der().clone();
        Ok(SandboxCa {
            issuer: Issuer::new(params, key),
            cert_der,
            cert_pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A TLS server configuration presenting a leaf for `host`, signed by this CA (cached).
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>> {
        let name = host.server_name();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(&name) {
            return Ok(c.clone());
        }
        let ca_err = |e: rcgen::Error| Error::Ca(e.to_string());
        let key = KeyPair::generate().map_err(ca_err)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name.clone());
        params.distinguished_name = dn;
        params.subject_alt_names = vec![match host {
            Host::Ip(ip) => SanType::IpAddress(*ip),
            Host::Name(n) => SanType::DnsName(
                n.clone()
                    .try_into()
                    .map_err(|e: rcgen::Error| Error::Ca(e.to_string()))?,
            ),
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(random_serial()?.into());
        let leaf = params.signed_by(&key, &self.issuer).map_err(ca_err)?;
        let chain = vec![leaf.der().clone(), self.cert_der.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Ca(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| Error::Ca(e.to_string()))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        leaves.insert(name, cfg.clone());
        Ok(cfg)
    }
}

/// The fields of a CA certificate that signs leaf certificates only (path length 0): its
/// names, and what its key may be used for. Validity, serial and name constraints are the
/// caller's.
pub fn ca_params(common_name: &str, organization: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, organization);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn random_serial() -> Result<Vec<u8>> {
    let mut s = [0u8; 16];
    getrandom::fill(&mut s).map_err(|e| Error::Ca(format!("no randomness: {e}")))?;
    s[0] &= 0x7f; // positive
    s[0] |= 0x01; // non-zero leading byte
    Ok(s.to_vec())
}

/// Where the proxy's upstream TLS trust comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRoots {
    /// Trust the host's system roots (falls back to the bundled Mozilla roots when the
    /// system store is empty or unreadable).
    pub system: bool,
    /// Extra PEM certificates to trust (e.g. a corporate or test CA).
    pub extra_pem: Vec<String>,
}

impl Default for UpstreamRoots {
    fn default() -> Self {
        UpstreamRoots {
            system: true,
            extra_pem: Vec::new(),
        }
    }
}

/// How long the host's roots, once read, serve every proxy of this process.
const SYSTEM_ROOTS_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// The host's trust roots (the bundled Mozilla roots when the system store is empty or
/// unreadable). Reading them means parsing a few hundred certificate files, milliseconds
/// each proxy would otherwise pay at its start; so a process reads them at most once per
/// [`SYSTEM_ROOTS_FOR`], and a changed store reaches new proxies after that.
fn system_roots() -> Arc<RootCertStore> {
    static CACHE: Mutex<Option<(std::time::Instant, Arc<RootCertStore>)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, store)) = cache.as_ref()
        && at.elapsed() < SYSTEM_ROOTS_FOR
    {
        return store.clone();
    }
    let mut store = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = store.add_parsable_certificates(native.certs);
    if added == 0 {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let store = Arc::new(store);
    *cache = Some((std::time::Instant::now(), store.clone()));
    store
}

/// Builds the upstream TLS client configuration.
pub(crate) fn client_config(roots: &UpstreamRoots) -> Result<Arc<ClientConfig>> {
    let mut store = RootCertStore::empty();
    if roots.system {
        let system = system_roots();
        if roots.extra_pem.is_empty() {
            return finish_client_config(system);
        }
        store = (*system).clone();
    }
    for pem in &roots.extra_pem {
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert =
                cert.map_err(|e| Error::Roots(format!("an extra root is not valid PEM: {e}")))?;
            store
                .add(cert)
                .map_err(|e| Error::Roots(format!("an extra root was refused: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(Error::Roots(
                "an extra root holds no CERTIFICATE block; give PEM text".into(),
            ));
        }
    }
    finish_client_config(Arc::new(store))
}

fn finish_client_config(store: Arc<RootCertStore>) -> Result<Arc<ClientConfig>> {
    if store.is_empty() {
        return Err(Error::Roots(
            "no trust roots at all: enable system roots or give extra roots".into(),
        ));
    }
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Roots(e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The name the upstream's certificate is verified against.
pub(crate) fn server_name(host: &Host) -> Result<rustls::pki_types::ServerName<'static>, String> {
    match host {
        Host::Ip(ip) => Ok(rustls::pki_types::ServerName::IpAddress((*ip).into())),
        Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone())
            .map_err(|e| format!("{n:?} is not a valid TLS server name: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's roots are read once and shared by every proxy after that, and a config
    /// built on them trusts what they hold.
    #[test]
    fn system_roots_are_read_once_per_process() {
        let a = system_roots();
        let b = system_roots();
        assert!(Arc::ptr_eq(&a, &b), "the roots were read twice");
        assert!(!a.is_empty());
        assert!(client_config(&UpstreamRoots::default()).is_ok());
        let none = UpstreamRoots {
            system: false,
            extra_pem: Vec::new(),
        };
        let e = client_config(&none).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("no trust roots")));
    }
}
