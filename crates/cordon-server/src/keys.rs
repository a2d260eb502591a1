//! API keys: stored as SHA-256 digests, each belonging to one tenant.
//!
//! Keys are random 256-bit strings, so a plain SHA-256 is enough to keep the stored form
//! useless to a reader of the config; lookups go by digest, so no key is compared in clear.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::ServerError;
use crate::config::KeyEntry;

/// Who a request acts for. Every sandbox and audit row belongs to one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(pub String);

impl Tenant {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// SHA-256 of a key, lowercase hex.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new random key: `ck_` and 256 random bits in hex.
pub fn generate_key() -> Result<String, ServerError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| ServerError::Config(format!("no randomness: {e}")))?;
    Ok(format!("ck_{}", hex::encode(b)))
}

/// A new random API key in E2B's form, `e2b_` and 40 hex digits (160 bits): some E2B SDK
/// versions refuse a key of another form before sending it. It is an ordinary key of its
/// tenant (the key file holds it like any other).
pub fn generate_e2b_key() -> Result<String, ServerError> {
    let mut b = [0u8; 20];
    getrandom::fill(&mut b).map_err(|e| ServerError::Config(format!("no randomness: {e}")))?;
    Ok(format!("e2b_{}", hex::encode(b)))
}

fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The key table.
#[derive(Debug, Default, Clone)]
pub struct Keys {
    by_digest: HashMap<String, Tenant>,
}

impl Keys {
    /// Builds the table from config entries and an optional key file. A key given in
    /// clear shorter than `min_len` is refused (a short key is guessable; `cordon serve
    /// --new-key` makes 67-character ones).
    pub fn load(
        entries: &[KeyEntry],
        file: Option<&Path>,
        min_len: usize,
    ) -> Result<Self, ServerError> {
        let short = |tenant: &str| {
            ServerError::Config(format!(
                "a key of tenant {tenant:?} is shorter than {min_len} characters; make one with `cordon serve --new-key {tenant}`"
            ))
        };
        let mut keys = Keys::default();
        for e in entries {
            let digest = match (&e.key, &e.sha256) {
                (Some(k), None) if k.len() < min_len => return Err(short(&e.tenant)),
                (Some(k), None) => hash_key(k),
                (None, Some(h)) => h.to_ascii_lowercase(),
                _ => {
                    return Err(ServerError::Config(format!(
                        "key of tenant {:?} must give exactly one of `key` or `sha256`",
                        e.tenant
                    )));
                }
            };
            keys.add_digest(&e.tenant, digest)?;
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ServerError::io(format!("reading key file {}", path.display()), e))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let bad = || {
                    ServerError::Config(format!(
                        "{} line {}: expected `tenant:key` or `tenant:sha256:HEX`",
                        path.display(),
                        n + 1
                    ))
                };
                let (tenant, rest) = line.split_once(':').ok_or_else(bad)?;
                let digest = match rest.strip_prefix("sha256:") {
                    Some(h) => h.to_ascii_lowercase(),
                    None if rest.len() < min_len => return Err(short(tenant)),
                    None if !rest.is_empty() => hash_key(rest),
                    None => return Err(bad()),
                };
                keys.add_digest(tenant, digest)?;
            }
        }
        Ok(keys)
    }

    /// Adds a key by its digest.
    pub fn add_digest(&mut self, tenant: &str, digest: String) -> Result<(), ServerError> {
        if !valid_tenant(tenant) {
            return Err(ServerError::Config(format!(
                "tenant name {tenant:?} is not valid; use up to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ServerError::Config(format!(
                "the sha256 of a key of tenant {tenant:?} is not 64 hex digits"
            )));
        }
        self.by_digest.insert(digest, Tenant(tenant.to_string()));
        Ok(())
    }

    /// Adds a key given in clear.
    pub fn add_key(&mut self, tenant: &str, key: &str) -> Result<(), ServerError> {
        self.add_digest(tenant, hash_key(key))
    }

    /// The tenant a presented key belongs to.
    pub fn tenant_for(&self, key: &str) -> Option<Tenant> {
        self.by_digest.get(&hash_key(key)).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Failed key attempts per source address: after `edge.failures_before_slowdown` within a
/// minute, that source's key attempts are answered 429 without being checked, for a
/// back-off that doubles with each further failure (up to a minute).
#[derive(Default)]
pub struct Throttle {
    failures: std::sync::Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// How long failures are remembered, and the longest back-off.
const THROTTLE_WINDOW: Duration = Duration::from_secs(60);

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (u32, Instant)>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seconds to wait when `ip` is in back-off now.
    pub(crate) fn check(&self, ip: IpAddr, allowed: u32) -> Option<u64> {
        let m = self.lock();
        let (n, last) = *m.get(&ip)?;
        if n < allowed || last.elapsed() >= THROTTLE_WINDOW {
            return None;
        }
        let backoff = Duration::from_secs(1u64 << (n - allowed).min(6)).min(THROTTLE_WINDOW);
        (last.elapsed() < backoff).then(|| (backoff - last.elapsed()).as_secs().max(1))
    }

    pub(crate) fn fail(&self, ip: IpAddr) {
        let mut m = self.lock();
        if m.len() > 65_536 {
            m.retain(|_, (_, t)| t.elapsed() < THROTTLE_WINDOW);
        }
        let e = m.entry(ip).or_insert((0, Instant::now()));
        if e.1.elapsed() >= THROTTLE_WINDOW {
            e.0 = 0;
        }
        e.0 = e.0.saturating_add(1);
        e.1 = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_by_digest_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(
            &f,
            format!(
                "# comment\nbob:secret-b\ncarol:sha256:{}\n",
                hash_key("secret-c")
            ),
        )
        .unwrap();
        let entries = vec![KeyEntry {
            tenant: "alice".into(),
            key: Some("secret-a".into()),
            sha256: None,
        }];
        let k = Keys::load(&entries, Some(&f), 8).unwrap();
        assert_eq!(k.tenant_for("secret-a").unwrap().0, "alice");
        assert_eq!(k.tenant_for("secret-b").unwrap().0, "bob");
        assert_eq!(k.tenant_for("secret-c").unwrap().0, "carol");
        assert!(k.tenant_for("secret-x").is_none());
        assert!(generate_key().unwrap().starts_with("ck_"));
        let mut k = Keys::default();
        assert!(k.add_key("bad tenant", "x").is_err());
        // Short keys in clear are refused, in the config and in the key file.
        let e = Keys::load(&entries, None, 32).unwrap_err().to_string();
        assert!(
            e.contains("shorter than 32") && e.contains("--new-key alice"),
            "{e}"
        );
        let e = Keys::load(&[], Some(&f), 32).unwrap_err().to_string();
        assert!(e.contains("\"bob\""), "{e}");
    }
}
