//! The service's configuration file (TOML). Unknown keys are refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_core::units::parse_duration;
use cordon_core::{Limits, Tier};
use serde::{Deserialize, Deserializer};

use crate::ServerError;

/// A duration written as `"10m"`, `"30s"`, `"250ms"` or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Dur(Duration::from_secs(s))),
            Raw::Text(t) => parse_duration(&t)
                .map(Dur)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// One API key: the tenant it belongs to and the key itself or its SHA-256 (hex).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub tenant: String,
    /// The key in clear (hashed when loaded; prefer `sha256` in files others can read).
    #[serde(default)]
    pub key: Option<String>,
    /// SHA-256 of the key, lowercase hex.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// Limits on how many sandboxes live at once and how long.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionLimits {
    /// Live sandboxes in all (warm pools not counted).
    pub max_sandboxes: usize,
    /// Live sandboxes per tenant.
    pub max_sandboxes_per_tenant: usize,
    pub default_ttl: Dur,
    pub max_ttl: Dur,
    pub default_idle_timeout: Dur,
    /// Seconds a client is told to wait (`Retry-After`) when a limit is full.
    pub retry_after_secs: u64,
    /// How often the reaper looks for expired sandboxes.
    pub reap_interval: Dur,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sandboxes: 64,
            max_sandboxes_per_tenant: 16,
            default_ttl: Dur(Duration::from_secs(600)),
            max_ttl: Dur(Duration::from_secs(3600)),
            default_idle_timeout: Dur(Duration::from_secs(300)),
            retry_after_secs: 1,
            reap_interval: Dur(Duration::from_secs(1)),
        }
    }
}

/// Request size limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    /// Largest JSON request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest file upload or download, in bytes.
    pub max_file_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 8 << 20,
            max_file_bytes: 32 << 20,
        }
    }
}

/// The audit store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Rows older than this many days are deleted (0 keeps everything).
    pub retention_days: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig { retention_days: 30 }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the audit database, the lock file and scratch dirs live.
    pub data_dir: PathBuf,
    /// Address to listen on; loopback by default.
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// Tier used when a request names none.
    #[serde(default = "default_tier")]
    pub default_tier: Tier,
    #[serde(default)]
    pub keys: Vec<KeyEntry>,
    /// A file of keys, one `tenant:key` or `tenant:sha256:HEX` a line (`#` comments).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub sessions: SessionLimits,
    #[serde(default)]
    pub http: HttpLimits,
    #[serde(default)]
    pub audit: AuditConfig,
    /// Warm pool size per tier, e.g. `container = 4`: sandboxes of the default spec.
    #[serde(default)]
    pub pools: BTreeMap<Tier, usize>,
    /// Warm pools of other specs (`[[pool]]` tables): a create or run that asks for exactly
    /// that tier, limits and allow and deny lists takes one of these.
    #[serde(default, rename = "pool")]
    pub spec_pools: Vec<SpecPool>,
    /// Limits a sandbox gets when its spec gives none.
    #[serde(default)]
    pub default_limits: Limits,
    /// The most a spec may ask for; larger requests are refused by policy.
    #[serde(default = "max_limits")]
    pub max_limits: Limits,
    /// The tier policy for requests that give `trust` and `autonomy`.
    #[serde(default)]
    pub policy: PolicyConfig,
}

/// A warm pool of a spec other than its tier's default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecPool {
    pub tier: Tier,
    pub size: usize,
    /// As a request gives them: any left out are the server's `default_limits`.
    #[serde(default)]
    pub limits: crate::model::LimitsPatch,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    #[serde(default)]
    pub deny_hosts: Vec<String>,
}

/// Where the tier policy's rules and this host's bench figures come from.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A rules file replacing the shipped default (`cordon policy show` prints that one).
    pub rules_file: Option<PathBuf>,
    /// `cordon bench`'s last figures, so `tier: "auto"` picks the fastest allowed tier
    /// measured here; without them the policy's static order is used.
    pub bench_file: Option<PathBuf>,
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7070))
}

fn default_tier() -> Tier {
    Tier::Container
}

fn max_limits() -> Limits {
    Limits {
        timeout_ms: 10 * 60 * 1000,
        memory_bytes: 4 << 30,
        pids: 1024,
        disk_bytes: 4 << 30,
        tmp_bytes: 1 << 30,
        cpus: 4.0,
        stdout_bytes: 16 << 20,
        stderr_bytes: 16 << 20,
        open_files: 4096,
        fuel: None,
    }
}

impl Config {
    /// A configuration with every default and the given data dir (tests, `cordon mcp`).
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            bind: default_bind(),
            default_tier: default_tier(),
            keys: Vec::new(),
            key_file: None,
            sessions: SessionLimits::default(),
            http: HttpLimits::default(),
            audit: AuditConfig::default(),
            pools: BTreeMap::new(),
            spec_pools: Vec::new(),
            default_limits: Limits::default(),
            max_limits: max_limits(),
            policy: PolicyConfig::default(),
        }
    }

    /// Parses a configuration; relative paths are taken from `base` (the file's directory).
    pub fn parse(text: &str, base: &Path) -> Result<Self, ServerError> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| ServerError::Config(e.to_string()))?;
        if cfg.data_dir.is_relative() {
            cfg.data_dir = base.join(&cfg.data_dir);
        }
        if let Some(f) = &cfg.key_file
            && f.is_relative()
        {
            cfg.key_file = Some(base.join(f));
        }
        for f in [&mut cfg.policy.rules_file, &mut cfg.policy.bench_file]
            .into_iter()
            .flatten()
        {
            if f.is_relative() {
                *f = base.join(&*f);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self, ServerError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ServerError::Config(format!(
                "cannot read {}: {e}; give the path of a cordon.toml (see docs/service.md)",
                path.display()
            ))
        })?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let base = abs.parent().unwrap_or(Path::new("/"));
        Self::parse(&text, base)
    }

    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: String| Err(ServerError::Config(m));
        self.default_limits
            .validate()
            .or_else(|e| bad(format!("default_limits: {e}")))?;
        if self.sessions.max_sandboxes == 0 || self.sessions.max_sandboxes_per_tenant == 0 {
            return bad(
                "sessions.max_sandboxes and max_sandboxes_per_tenant must be at least 1".into(),
            );
        }
        if self.sessions.reap_interval.0.is_zero() {
            return bad("sessions.reap_interval must be more than zero".into());
        }
        for (tier, n) in &self.pools {
            if *n > 64 {
                return bad(format!(
                    "pools.{tier} = {n} is more than 64; give a smaller warm pool"
                ));
            }
        }
        for (i, p) in self.spec_pools.iter().enumerate() {
            if p.size > 64 {
                return bad(format!(
                    "pool {} (the [[pool]] table number {}) has size {}, more than 64; give a smaller warm pool",
                    p.tier,
                    i + 1,
                    p.size
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_unknown_keys() {
        let cfg = Config::parse(
            r#"
data_dir = "data"
bind = "127.0.0.1:9000"
[[keys]]
tenant = "alice"
key = "k"
[sessions]
default_ttl = "10m"
max_ttl = 7200
[pools]
wasm = 2
[[pool]]
tier = "container"
size = 3
allow_hosts = ["pypi.org", "*.pythonhosted.org"]
limits = { memory_bytes = 1073741824 }
"#,
            Path::new("/etc/cordon"),
        )
        .unwrap();
        assert_eq!(cfg.spec_pools.len(), 1);
        let p = &cfg.spec_pools[0];
        assert_eq!((p.tier, p.size), (Tier::Container, 3));
        assert_eq!(p.allow_hosts, ["pypi.org", "*.pythonhosted.org"]);
        assert_eq!(p.limits.memory_bytes, Some(1 << 30));
        let big = "data_dir = \"x\"\n[[pool]]\ntier = \"wasm\"\nsize = 65\n";
        let e = Config::parse(big, Path::new("/"))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("more than 64")));
        assert!(
            Config::parse(
                "data_dir = \"x\"\n[[pool]]\ntier = \"wasm\"\nsize = 1\nenv = 1\n",
                Path::new("/")
            )
            .is_err()
        );
        assert_eq!(cfg.data_dir, Path::new("/etc/cordon/data"));
        assert_eq!(cfg.sessions.default_ttl.0, Duration::from_secs(600));
        assert_eq!(cfg.sessions.max_ttl.0, Duration::from_secs(7200));
        assert_eq!(cfg.pools.get(&Tier::Wasm), Some(&2));
        assert!(Config::parse("data_dir = \"x\"\nbogus = 1\n", Path::new("/")).is_err());
        assert!(
            Config::parse("data_dir = \"x\"\n[pools]\nnotatier = 1\n", Path::new("/")).is_err()
        );
    }
}
