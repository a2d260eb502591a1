//! The operator's grant catalogue: named credentials a request may ask for by name. The
//! secrets are read by the server from sources only the operator names; nothing in a
//! request can point the server at a file or a variable.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cordon_core::{Grant, GrantSecret, SecretValue};

use crate::GateError;
use crate::ceiling::{GrantEntry, LoadAt, SecretSource};
use crate::tokens::{Issuer, Minter};

/// What a tenant is told when a grant's secret cannot be had at create time. Details (the
/// path, the variable, the OS error) go to the server's log only.
const UNAVAILABLE: &str = "its secret cannot be read on the server right now";

struct Entry {
    spec: GrantEntry,
    /// The value read at start (`load = "start"`).
    loaded: Option<SecretValue>,
}

/// The catalogue, secrets loaded where the entry says so.
pub struct Catalogue {
    entries: BTreeMap<String, Entry>,
    issuer: Option<Arc<Issuer>>,
}

impl std::fmt::Debug for Catalogue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalogue")
            .field("grants", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Catalogue {
    /// Checks every entry and reads the secrets that load at start. `issuer` mints the
    /// tokens of `mint` entries; without one such entries are refused.
    pub fn load(entries: &[GrantEntry], issuer: Option<Arc<Issuer>>) -> Result<Self, GateError> {
        let mut map = BTreeMap::new();
        for e in entries {
            let bad = |m: String| GateError::Config(format!("grant {:?}: {m}", e.name));
            if e.name.is_empty()
                || !e
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(bad("give it a name of letters, digits, '-' and '_'".into()));
            }
            if e.hosts.is_empty() {
                return Err(bad(
                    "it names no host; give the hosts it may be sent to".into()
                ));
            }
            for h in &e.hosts {
                if matches!(
                    h.host,
                    cordon_core::HostMatch::AnyName | cordon_core::HostMatch::Net(_)
                ) {
                    return Err(bad(format!(
                        "host {:?} is not a name; a grant names the hosts it is for (exact or *.suffix)",
                        h.text
                    )));
                }
            }
            if matches!(e.secret, SecretSource::Mint(_)) && issuer.is_none() {
                return Err(bad("minted grants need the token issuer ([oidc])".into()));
            }
            let loaded = match (&e.secret, e.load) {
                (SecretSource::Mint(_), _) | (_, LoadAt::Use) => None,
                (src, LoadAt::Start) => Some(read_source(&e.name, src).map_err(bad)?),
            };
            if map.contains_key(&e.name) {
                return Err(bad("another grant has the same name".into()));
            }
            map.insert(
                e.name.clone(),
                Entry {
                    spec: e.clone(),
                    loaded,
                },
            );
        }
        Ok(Catalogue {
            entries: map,
            issuer,
        })
    }

    /// An empty catalogue (the local operator's `cordon run` has none).
    pub fn empty() -> Self {
        Catalogue {
            entries: BTreeMap::new(),
            issuer: None,
        }
    }

    /// The entry named `name`, if `tenant` may use it.
    pub fn entry(&self, name: &str, tenant: &str) -> Option<&GrantEntry> {
        self.entries
            .get(name)
            .map(|e| &e.spec)
            .filter(|e| e.allows(tenant))
    }

    /// Names of the grants `tenant` may use.
    pub fn names_for(&self, tenant: &str) -> Vec<String> {
        self.entries
            .values()
            .filter(|e| e.spec.allows(tenant))
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// The core grant for one sandbox: the value, or a minter bound to the tenant whose
    /// tokens never outlive `not_after`.
    pub(crate) fn resolve(
        &self,
        name: &str,
        tenant: &str,
        not_after: SystemTime,
    ) -> Result<Grant, String> {
        let e = self
            .entries
            .get(name)
            .filter(|e| e.spec.allows(tenant))
            .ok_or_else(|| "no such grant is open to you".to_string())?;
        let secret = match (&e.spec.secret, &e.loaded) {
            (SecretSource::Mint(m), _) => {
                let issuer = self.issuer.clone().ok_or_else(|| UNAVAILABLE.to_string())?;
                GrantSecret::Minted(Arc::new(Minter {
                    issuer,
                    tenant: tenant.to_string(),
                    grant: e.spec.name.clone(),
                    audience: m.audience.clone(),
                    scope: m.scope.clone(),
                    lifetime: m.lifetime.0,
                    not_after,
                }))
            }
            (_, Some(v)) => GrantSecret::Value(v.clone()),
            (src, None) => match read_source(name, src) {
                Ok(v) => GrantSecret::Value(v),
                Err(detail) => {
                    tracing::warn!(grant = name, "grant secret unavailable: {detail}");
                    return Err(UNAVAILABLE.to_string());
                }
            },
        };
        Ok(Grant {
            name: e.spec.name.clone(),
            env_var: e.spec.env_var(),
            secret,
            hosts: e.spec.hosts.clone(),
            header: e.spec.header.clone(),
            methods: e.spec.methods.clone(),
            path_prefixes: e.spec.path_prefixes.clone(),
        })
    }

    /// The shortest `max_lifetime` among `names`, if any sets one.
    pub fn max_lifetime(&self, names: &[String]) -> Option<Duration> {
        names
            .iter()
            .filter_map(|n| self.entries.get(n))
            .filter_map(|e| e.spec.max_lifetime.map(|d| d.0))
            .min()
    }
}

/// Reads a file or environment source. The error is for the operator (server log, start-up
/// error), never for a tenant.
fn read_source(grant: &str, src: &SecretSource) -> Result<SecretValue, String> {
    let mut value = match src {
        SecretSource::Env(var) => std::env::var_os(var)
            .ok_or_else(|| format!("the server's environment variable {var} is not set"))?
            .into_encoded_bytes(),
        SecretSource::File(path) => {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?
        }
        SecretSource::Mint(_) => return Err("a minted grant has no stored secret".into()),
    };
    while matches!(value.last(), Some(b'\n' | b'\r')) {
        value.pop();
    }
    let v = SecretValue::new(value);
    // This function's error is the operator's message (it may name the file or variable),
    // read as text by the catalogue's load: no caller looks past it.
    cordon_egress::check_secret(grant, v.expose()).map_err(|e| e.to_string())?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(toml_text: &str) -> Vec<GrantEntry> {
        #[derive(serde::Deserialize)]
        struct F {
            grant: Vec<GrantEntry>,
        }
        toml::from_str::<F>(toml_text).unwrap().grant
    }

    #[test]
    fn grants_resolve_only_for_their_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gh");
        std::fs::write(&path, "ghp_realsecretvalue\n").unwrap();
        let text = format!(
            "[[grant]]\nname = \"github\"\nsecret = {{ file = {:?} }}\nhosts = [\"api.github.test\"]\ntenants = [\"alice\"]\n",
            path.display().to_string()
        );
        let c = Catalogue::load(&entry(&text), None).unwrap();
        let far = SystemTime::now() + Duration::from_secs(60);
        let g = c.resolve("github", "alice", far).unwrap();
        assert_eq!(g.env_var, "GITHUB_TOKEN");
        assert_eq!(
            g.secret,
            GrantSecret::Value(SecretValue::new("ghp_realsecretvalue"))
        );
        let e = c.resolve("github", "mallory", far).unwrap_err();
        assert_eq!(e, "no such grant is open to you");
        assert!(c.resolve("nope", "alice", far).is_err());
        assert_eq!(c.names_for("alice"), vec!["github".to_string()]);
        assert!(c.names_for("mallory").is_empty());
    }

    #[test]
    fn a_bad_catalogue_stops_the_start_and_use_time_errors_hide_the_source() {
        let e = Catalogue::load(
            &entry("[[grant]]\nname = \"x\"\nsecret = { env = \"CORDON_SURELY_UNSET_VAR\" }\nhosts = [\"a.test\"]\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("CORDON_SURELY_UNSET_VAR"), "{e}");
        for hosts in ["[\"*\"]", "[\"10.0.0.0/8\"]", "[]"] {
            let text = format!(
                "[[grant]]\nname = \"x\"\nsecret = {{ env = \"PATH\" }}\nhosts = {hosts}\n"
            );
            assert!(Catalogue::load(&entry(&text), None).is_err(), "{hosts}");
        }
        let c = Catalogue::load(
            &entry("[[grant]]\nname = \"x\"\nload = \"use\"\nsecret = { file = \"/nonexistent/cordon/secret\" }\nhosts = [\"a.test\"]\ntenants = [\"t\"]\n"),
            None,
        )
        .unwrap();
        let e = c
            .resolve("x", "t", SystemTime::now() + Duration::from_secs(5))
            .unwrap_err();
        assert!(!e.contains("/nonexistent"), "{e}");
        assert!(!e.contains("No such file"), "{e}");
    }
}
