//! HTTPS for a sandbox's own ports as E2B's SDKs name them: `https://<port>-<id>.<domain>`
//! on port 443 (`e2b.https_listen`), served by the same routes as the plain listener.
//!
//! The certificate is the operator's (`e2b.https_cert_file`, one for `*.<domain>` say), or,
//! without one, signed for each sandbox host a client asks for (its SNI name) by a CA of
//! the data dir's own: `e2b-https/ca.pem`, which clients trust by name (`SSL_CERT_FILE`,
//! `NODE_EXTRA_CA_CERTS`). That CA's name constraints limit it to `e2b.domain` (and exclude
//! every IP address), so even a client that trusts it everywhere takes nothing else from it,
//! and it signs only names of live sandboxes the listener knows under that domain. Its key
//! stays in the data dir (mode 0600, in a 0700 directory); a changed domain makes a new CA.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    CertificateParams, CidrSubnet, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::{Duration, OffsetDateTime};

use crate::ServerError;
use crate::config::E2bConfig;

/// The directory of the data dir's CA.
pub const CA_DIR: &str = "e2b-https";
/// How long the CA is valid; it is made again when it is within [`RENEW_CA`] of its end.
const CA_VALIDITY: Duration = Duration::days(3650);
const RENEW_CA: Duration = Duration::days(30);
/// How long a host's certificate is valid, and how old one may be before it is made again.
const LEAF_VALIDITY: Duration = Duration::days(90);
const LEAF_REUSE: Duration = Duration::days(30);
/// The most hosts' certificates kept; past it the cache starts again.
const LEAVES_KEPT: usize = 4096;

/// Which sandbox ids the listener knows (its records): the data dir's CA signs hosts of
/// those only.
pub type Known = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The HTTPS listener's TLS configuration from the operator's certificate, when the
/// config gives one (read once, before the service starts: a start that will fail says so
/// first).
pub fn operator_config(cfg: &E2bConfig) -> Result<Option<Arc<rustls::ServerConfig>>, ServerError> {
    let (Some(_), Some(cert), Some(key)) =
        (cfg.https_listen, &cfg.https_cert_file, &cfg.https_key_file)
    else {
        return Ok(None);
    };
    crate::tls::server_config_of(cert, key, "e2b.https_cert_file", "e2b.https_key_file")
        .map(|c| Some(Arc::new(c)))
}

/// The HTTPS listener's TLS configuration with the data dir's CA, signing the hosts of the
/// sandboxes `known` says the listener has.
pub fn ca_config(
    cfg: &E2bConfig,
    data_dir: &Path,
    known: Known,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let mut ca = HostsCa::load_or_make(&data_dir.join(CA_DIR), &cfg.domain)?;
    ca.known = Some(known);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Config(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ca));
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The data dir's CA for sandbox hosts, and the host certificates it signed.
pub struct HostsCa {
    domain: String,
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, (OffsetDateTime, Arc<CertifiedKey>)>>,
    /// Which ids to sign hosts of at once (all of the right shape when `None`: a CA on its
    /// own); others, at most [`UNKNOWN_PER_SECOND`] a second.
    known: Option<Known>,
    unknown: Mutex<(std::time::Instant, u32)>,
}

/// Hosts of ids the listener has no record of that are signed each second: an ended
/// sandbox's host still gets E2B's 502 "was not found" over TLS, and a client naming
/// made-up ids cannot make the server sign without end.
const UNKNOWN_PER_SECOND: u32 = 32;

impl std::fmt::Debug for HostsCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostsCa")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

fn ca_error(what: &str, e: impl std::fmt::Display) -> ServerError {
    ServerError::Config(format!(
        "the E2B HTTPS listener's CA ({what}): {e}; remove the data dir's {CA_DIR} directory to make a new one, or give e2b.https_cert_file and e2b.https_key_file"
    ))
}

impl HostsCa {
    /// The CA's certificate fields; the same for a CA read back, so what it signs names the
    /// certificate's own subject.
    fn params(domain: &str) -> CertificateParams {
        let mut params =
            cordon_egress::ca_params(&format!("Cordon sandbox hosts CA ({domain})"), "Cordon");
        // Names under the domain only, and no IP address at all (a constraint on DNS names
        // alone would leave addresses unconstrained).
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DnsName(domain.to_string())],
            excluded_subtrees: vec![
                GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
                GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
            ],
        });
        params
    }

    /// Reads the CA in `dir`, or makes one there (missing, for another domain, or near its
    /// end).
    pub fn load_or_make(dir: &Path, domain: &str) -> Result<Self, ServerError> {
        let (pem, key) = (dir.join("ca.pem"), dir.join("ca.key"));
        let meta = dir.join("ca.domain");
        // The note, written last: the domain and the end of validity (a CA for another
        // domain, or near its end, is made again; one whose key is not its certificate's too).
        let kept = std::fs::read_to_string(&meta).ok().and_then(|text| {
            let mut words = text.split_whitespace();
            let (d, until) = (words.next()?, words.next()?);
            let until = OffsetDateTime::from_unix_timestamp(until.parse().ok()?).ok()?;
            (d == domain && until - RENEW_CA > OffsetDateTime::now_utc()).then_some(())
        });
        if kept.is_some()
            && let (Ok(cert_pem), Ok(key_pem)) =
                (std::fs::read_to_string(&pem), std::fs::read_to_string(&key))
        {
            let pair = KeyPair::from_pem(&key_pem).map_err(|e| ca_error("its key", e))?;
            let ca_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
                .map_err(|e| ca_error("its certificate", e))?;
            if holds_key(&ca_der, &pair) {
                // Kept as private as they were made, whatever changed them since.
                use std::os::unix::fs::PermissionsExt;
                let tighten = |p: &Path, mode: u32| {
                    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                        .map_err(|e| ServerError::io(format!("restricting {}", p.display()), e))
                };
                tighten(dir, 0o700)?;
                tighten(&key, 0o600)?;
                return Ok(HostsCa {
                    domain: domain.to_string(),
                    issuer: Issuer::new(Self::params(domain), pair),
                    ca_der,
                    leaves: Mutex::default(),
                    known: None,
                    unknown: Mutex::new((std::time::Instant::now(), 0)),
                });
            }
            tracing::warn!(
                "the E2B HTTPS listener's CA in {} does not match its key; a new one is made (clients must trust the new ca.pem)",
                dir.display()
            );
        }
        let key = KeyPair::generate().map_err(|e| ca_error("a new key", e))?;
        let mut params = Self::params(domain);
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(serial()?.into());
        let cert = params
            .self_signed(&key)
            .map_err(|e| ca_error("signing it", e))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ServerError::io(format!("making {}", dir.display()), e))?;
        // The key first, then the certificate, then the note that both are whole: a start
        // cut off in between makes a new CA next time.
        let _ = std::fs::remove_file(&meta);
        write_new(&key_file_tmp(dir), key.serialize_pem().as_bytes(), 0o600)?;
        rename(&key_file_tmp(dir), &dir.join("ca.key"))?;
        write_new(&dir.join("ca.pem.tmp"), cert.pem().as_bytes(), 0o644)?;
        rename(&dir.join("ca.pem.tmp"), &pem)?;
        let note = format!("{domain} {}\n", params.not_after.unix_timestamp());
        write_new(&dir.join("ca.domain.tmp"), note.as_bytes(), 0o644)?;
        rename(&dir.join("ca.domain.tmp"), &meta)?;
        Ok(HostsCa {
            domain: domain.to_string(),
            ca_der: cert.der().clone(),
            issuer: Issuer::new(Self::params(domain), key),
            leaves: Mutex::default(),
            known: None,
            unknown: Mutex::new((std::time::Instant::now(), 0)),
        })
    }

    /// The sandbox id of `name` when it is a sandbox host under the domain
    /// (`<port>-<sandbox id>.<domain>`, lower case, the id as Cordon makes them).
    fn host_id<'a>(&self, name: &'a str) -> Option<&'a str> {
        let first = name.strip_suffix(self.domain.as_str())?.strip_suffix('.')?;
        let (port, id) = first.split_once('-')?;
        (port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok()
            && cordon_core::SandboxId::parse(id).is_some())
        .then_some(id)
    }

    /// Whether a new certificate may be signed for `id`'s host now: at once for a sandbox
    /// the listener knows, within the budget for any other.
    fn may_sign(&self, id: &str) -> bool {
        self.known.as_ref().is_none_or(|known| known(id)) || self.unknown_allowed()
    }

    /// Whether one more host of an unknown id may be signed this second.
    fn unknown_allowed(&self) -> bool {
        let mut budget = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if now.duration_since(budget.0) >= std::time::Duration::from_secs(1) {
            *budget = (now, 0);
        }
        budget.1 += 1;
        budget.1 <= UNKNOWN_PER_SECOND
    }

    /// The certificate for `name`, signed earlier or now. Only a signing (a key made, a
    /// signature, outside the cache's lock) spends the budget for unknown ids.
    pub fn certificate(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        // `api.<domain>`: E2B's control plane, where E2B's SDKs go when only the domain
        // is set (E2B_DOMAIN): this listener serves the same routes there.
        let api = name
            .strip_prefix("api.")
            .is_some_and(|d| d == self.domain.as_str());
        let id = if api { None } else { Some(self.host_id(name)?) };
        let now = OffsetDateTime::now_utc();
        {
            let leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((made, c)) = leaves.get(name)
                && now - *made < LEAF_REUSE
            {
                return Some(c.clone());
            }
        }
        if let Some(id) = id
            && !self.may_sign(id)
        {
            return None;
        }
        let c = self.sign(name, now).ok()?;
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.len() >= LEAVES_KEPT {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (now, c.clone()));
        Some(c)
    }

    fn sign(&self, name: &str, now: OffsetDateTime) -> Result<Arc<CertifiedKey>, ServerError> {
        let err = |e: rcgen::Error| ca_error("signing a host's certificate", e);
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.subject_alt_names = vec![SanType::DnsName(name.try_into().map_err(err)?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - Duration::hours(1);
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(serial()?.into());
        let leaf = params.signed_by(&key, &self.issuer).map_err(err)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = provider()
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| ca_error("a host's key", e))?;
        Ok(Arc::new(CertifiedKey::new(
            vec![leaf.der().clone(), self.ca_der.clone()],
            signer,
        )))
    }
}

impl ResolvesServerCert for HostsCa {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.certificate(hello.server_name()?)
    }
}

/// Whether the certificate `der` carries `key`'s public half (the key's bytes appear in it
/// whole: its subject public key).
fn holds_key(der: &CertificateDer<'_>, key: &KeyPair) -> bool {
    let public = key.public_key_raw();
    der.as_ref().windows(public.len()).any(|w| w == public)
}

fn key_file_tmp(dir: &Path) -> PathBuf {
    dir.join("ca.key.tmp")
}

/// Writes a new file with `mode` (one left by a start cut off is replaced).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ServerError> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|e| ServerError::io(format!("writing {}", path.display()), e))
}

fn rename(from: &Path, to: &Path) -> Result<(), ServerError> {
    std::fs::rename(from, to).map_err(|e| ServerError::io(format!("writing {}", to.display()), e))
}

fn serial() -> Result<Vec<u8>, ServerError> {
    let mut s = [0u8; 16];
    getrandom::fill(&mut s).map_err(|e| ca_error("a serial number", e))?;
    s[0] &= 0x7f;
    s[0] |= 0x01;
    Ok(s.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sb-0a1b0a1b0a1b0a1b0a1b0a1b0a1b0a1b";

    #[test]
    fn the_ca_signs_sandbox_hosts_under_its_domain_only_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join(CA_DIR);
        let ca = HostsCa::load_or_make(&at, "localhost").unwrap();
        assert!(ca.certificate(&format!("8000-{ID}.localhost")).is_some());
        for name in [
            "localhost".to_string(),
            "example.com".to_string(),
            format!("8000-{ID}.localhost.example.com"),
            format!("8000-{ID}.notlocalhost"),
            format!("x8000-{ID}.localhost"),
            format!("8000-{ID}.x.localhost"),
            format!("99999-{ID}.localhost"),
            format!("8000-{}.localhost", ID.to_uppercase()),
            "8000-sb-0a1b.localhost".to_string(),
            "8000-sbx-0a1b0a1b0a1b0a1b0a1b0a1b0a1b0a1b.localhost".to_string(),
        ] {
            assert!(ca.certificate(&name).is_none(), "{name} was signed");
        }
        // The key is the operator's alone.
        let mode = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&at.join("ca.key")), 0o600);
        assert_eq!(mode(&at), 0o700);
        // Read back on the next start: the same CA (clients keep trusting it), its files
        // made private again if they were loosened.
        let pem = std::fs::read(at.join("ca.pem")).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(at.join("ca.key"), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        let again = HostsCa::load_or_make(&at, "localhost").unwrap();
        assert_eq!(std::fs::read(at.join("ca.pem")).unwrap(), pem);
        assert_eq!(mode(&at.join("ca.key")), 0o600);
        let c = again.certificate(&format!("443-{ID}.localhost")).unwrap();
        assert_eq!(c.cert[1], ca.ca_der, "the chain ends at the kept CA");
        // A key that is not the certificate's: a new CA, not a broken chain.
        std::fs::write(
            at.join("ca.key"),
            KeyPair::generate().unwrap().serialize_pem(),
        )
        .unwrap();
        let fresh = HostsCa::load_or_make(&at, "localhost").unwrap();
        assert_ne!(std::fs::read(at.join("ca.pem")).unwrap(), pem);
        assert_ne!(fresh.ca_der, ca.ca_der);
        // Another domain: a new CA, for that domain.
        let other = HostsCa::load_or_make(&at, "sandbox.test").unwrap();
        assert!(
            other
                .certificate(&format!("8000-{ID}.sandbox.test"))
                .is_some()
        );
        assert!(other.certificate(&format!("8000-{ID}.localhost")).is_none());
        // E2B's control plane's host under the domain, and no other name.
        assert!(other.certificate("api.sandbox.test").is_some());
        assert!(other.certificate("api.localhost").is_none());
        assert!(other.certificate("www.sandbox.test").is_none());
    }

    /// With the listener's records, the hosts of sandboxes it knows get a certificate at
    /// once, and others (an ended sandbox's) a few a second: a client naming made-up ids
    /// cannot make the server sign without end.
    #[test]
    fn unknown_sandboxes_hosts_are_signed_a_few_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = HostsCa::load_or_make(&dir.path().join(CA_DIR), "localhost").unwrap();
        ca.known = Some(Arc::new(|id: &str| id == ID));
        let made_up = |i: u32| format!("8000-sb-{i:032x}.localhost");
        let signed = (0..UNKNOWN_PER_SECOND * 4)
            .filter(|i| ca.certificate(&made_up(*i)).is_some())
            .count();
        assert!(
            (1..=UNKNOWN_PER_SECOND as usize * 2).contains(&signed),
            "{signed} made-up hosts signed"
        );
        // With the budget spent, a host signed earlier is still answered from the cache.
        let first = (0..UNKNOWN_PER_SECOND * 4)
            .find(|i| ca.leaves.lock().unwrap().contains_key(&made_up(*i)))
            .expect("one was signed");
        assert!(ca.certificate(&made_up(first)).is_some());
        // The known sandbox's hosts are signed whatever the budget says.
        for port in 1..100 {
            assert!(ca.certificate(&format!("{port}-{ID}.localhost")).is_some());
        }
    }

    /// The operator's certificate: files that are no certificate and key say which setting
    /// to fix; a pair that fits is served as is.
    #[test]
    fn the_operators_certificate_is_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let signed = rcgen::generate_simple_self_signed(vec!["*.sandbox.test".into()]).unwrap();
        std::fs::write(&cert, signed.cert.pem()).unwrap();
        std::fs::write(&key, signed.signing_key.serialize_pem()).unwrap();
        let cfg = |cert: &Path, key: &Path| E2bConfig {
            https_listen: Some("127.0.0.1:0".parse().unwrap()),
            https_cert_file: Some(cert.to_path_buf()),
            https_key_file: Some(key.to_path_buf()),
            ..E2bConfig::default()
        };
        assert!(operator_config(&cfg(&cert, &key)).unwrap().is_some());
        assert!(
            !dir.path().join(CA_DIR).exists(),
            "no CA of its own is made"
        );
        let err = operator_config(&cfg(&key, &key)).unwrap_err().to_string();
        assert!(err.contains("e2b.https_cert_file"), "{err}");
        let other = KeyPair::generate().unwrap();
        std::fs::write(&key, other.serialize_pem()).unwrap();
        let err = operator_config(&cfg(&cert, &key)).unwrap_err().to_string();
        assert!(err.contains("e2b.https_key_file"), "{err}");
    }
}
