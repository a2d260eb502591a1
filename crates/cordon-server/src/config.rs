//! The service's configuration file (TOML). Unknown keys are refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cordon_core::units::{Dur, Size};
use cordon_core::{Limits, Tier};
use serde::Deserialize;

use crate::ServerError;

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
    /// Whether the operator set `max_sandboxes` (the file names it): one above what the
    /// descriptor limit holds is then refused at start; the default is lowered instead.
    #[serde(skip)]
    pub max_sandboxes_set: bool,
    /// Live sandboxes per tenant.
    pub max_sandboxes_per_tenant: usize,
    pub default_ttl: Dur,
    pub max_ttl: Dur,
    pub default_idle_timeout: Dur,
    /// Seconds a client is told to wait (`Retry-After`) when a limit is full.
    pub retry_after_secs: u64,
    /// How often the reaper looks for expired sandboxes.
    pub reap_interval: Dur,
    /// Background execs one sandbox may have running at once.
    pub max_background_execs: usize,
    /// How long a background exec asked to stop (DELETE) has after SIGTERM before SIGKILL.
    pub kill_grace: Dur,
    /// How long a sandbox may stay paused (its TTL clock stands still meanwhile); past it
    /// the reaper destroys it.
    pub paused_ttl: Dur,
    /// Code contexts (long-lived interpreters) one sandbox may hold at once.
    pub max_contexts: usize,
    /// How long a cell past its timeout has to stop after its interrupt before its
    /// interpreter is killed (and started again, its state lost).
    pub context_grace: Dur,
    /// How long a new context's interpreter has to start.
    pub context_start_timeout: Dur,
    /// Attach streams (native attaches, E2B's envd `Start` and `Connect` streams) one
    /// tenant may have open at once; past it `429 resource_busy`.
    pub max_attach_streams_per_tenant: usize,
    /// Attach streams open at once on one sandbox; past it `429 resource_busy`.
    pub max_attach_streams_per_sandbox: usize,
}

/// The keys of a configuration whose presence matters beyond their value (every other key
/// ignored here; `Config` checks them).
#[derive(Deserialize)]
struct SetKeys {
    sessions: Option<SetSessions>,
}

#[derive(Deserialize)]
struct SetSessions {
    max_sandboxes: Option<usize>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sandboxes: 64,
            max_sandboxes_set: false,
            max_sandboxes_per_tenant: 16,
            default_ttl: Dur(Duration::from_secs(600)),
            max_ttl: Dur(Duration::from_secs(3600)),
            default_idle_timeout: Dur(Duration::from_secs(300)),
            retry_after_secs: 1,
            reap_interval: Dur(Duration::from_secs(1)),
            max_background_execs: 8,
            kill_grace: Dur(Duration::from_secs(5)),
            paused_ttl: Dur(Duration::from_secs(3600)),
            max_contexts: 4,
            context_grace: Dur(Duration::from_secs(2)),
            context_start_timeout: Dur(Duration::from_secs(60)),
            max_attach_streams_per_tenant: 32,
            max_attach_streams_per_sandbox: 16,
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
    /// Largest directory upload or download as a tar stream, in bytes (streamed, never
    /// buffered whole; a download counts its files' contents).
    pub max_archive_bytes: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 8 << 20,
            max_file_bytes: 32 << 20,
            max_archive_bytes: 256 << 20,
        }
    }
}

/// The audit store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Rows older than this many days are deleted (0 keeps everything).
    pub retention_days: u64,
    /// The store's rows are kept under this size (checked every minute; 0 for no size
    /// bound). Past it each tenant keeps a fair share of the rows that fit (the server's
    /// own rows count as one more tenant): only a tenant past its share loses rows, its
    /// oldest first, so one tenant's flood never evicts another's rows.
    pub max_size: Size,
    /// New sandboxes are refused (503 storage_low) while the data dir's file system has less
    /// free space than this, so the audit store can always write what running ones do.
    pub min_free_disk: Size,
    /// Most egress rows one tenant's sandboxes write a minute; past it ordinary rows are
    /// counted in one `truncated` row per exec (exfiltration and grant rows always go in).
    pub max_egress_rows_per_minute: u32,
    /// Most distinct egress rows one exec reports; past it the tier's fold counts the rest.
    pub max_egress_rows_per_exec: usize,
    /// Audit queries (`GET /v1/audit`) one tenant may have under way at once; past it
    /// `429 resource_busy`.
    pub max_reads_per_tenant: usize,
    /// Event streams (`GET /v1/events`, the dashboard) one tenant may have open at once;
    /// past it `429 resource_busy`.
    pub max_event_streams_per_tenant: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            retention_days: 30,
            max_size: Size(1 << 30),
            min_free_disk: Size(256 << 20),
            max_egress_rows_per_minute: 6000,
            max_egress_rows_per_exec: cordon_core::report::DEFAULT_FOLD_ROWS,
            max_reads_per_tenant: 2,
            max_event_streams_per_tenant: 4,
        }
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
    /// The tier policy: its rules and this host's bench figures.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// The operator's ceiling for every tenant without its own table (`[tenant_defaults]`).
    #[serde(default)]
    pub tenant_defaults: cordon_engine::TenantRules,
    /// Per-tenant ceilings (`[tenants.alice]`).
    #[serde(default)]
    pub tenants: BTreeMap<String, cordon_engine::TenantRules>,
    /// The server's aggregate budgets.
    #[serde(default)]
    pub budgets: cordon_engine::ceiling::Budgets,
    /// The in-process tier's heap cap.
    #[serde(default)]
    pub runtime: cordon_engine::ceiling::RuntimeCeiling,
    /// The grant catalogue (`[[grant]]` tables): the only credentials requests may name.
    #[serde(default, rename = "grant")]
    pub grants: Vec<cordon_engine::GrantEntry>,
    /// The token issuer for minted grants and its OIDC documents.
    #[serde(default)]
    pub oidc: OidcConfig,
    /// TLS for the API (rustls).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// The API edge: key rules, failed-key slow-down, what needs a key.
    #[serde(default)]
    pub edge: EdgeConfig,
    /// The E2B-compatible listener (`[e2b]`, off unless the table is present): E2B's SDKs
    /// speak to it unchanged, every call going through the same gate (docs/e2b.md).
    #[serde(default)]
    pub e2b: Option<E2bConfig>,
}

/// The E2B-compatible listener: its address, which Cordon template each E2B template name
/// means and which tier its sandboxes get (the operator's choice, never the client's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bConfig {
    /// Where it listens (plain HTTP/1.1 as the SDKs speak it; loopback by default).
    #[serde(default = "default_e2b_listen")]
    pub listen: SocketAddr,
    /// E2B template name to Cordon template name (`cordon template ls`); `""` is the
    /// tier's own root. `base` and `code-interpreter-v1` mean the tier's root unless
    /// mapped here; any other name must be mapped.
    #[serde(default)]
    pub templates: BTreeMap<String, String>,
    /// The tier of E2B sandboxes (`auto` lets the policy choose); left out, the server's
    /// default tier where the policy allows it, as for a native create without a tier.
    #[serde(default)]
    pub tier: Option<cordon_policy::TierChoice>,
    /// Limits of E2B sandboxes beyond the server's `default_limits` (E2B's SDKs cannot
    /// ask for any).
    #[serde(default)]
    pub limits: cordon_engine::LimitsPatch,
    /// HTTPS for a sandbox's own ports as E2B's SDKs name them (`https://<port>-<id>.<domain>`,
    /// on port 443): where it listens. Off unless given.
    #[serde(default)]
    pub https_listen: Option<SocketAddr>,
    /// The HTTPS listener's certificate chain (PEM; one for `*.<domain>`, say) and its key.
    /// Left out, a CA of the data dir's own (`e2b-https/ca.pem`, limited by name constraints
    /// to `domain`) signs a certificate for each sandbox host a client asks for.
    #[serde(default)]
    pub https_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub https_key_file: Option<PathBuf>,
    /// The domain of sandbox hosts (the clients' `E2B_DOMAIN`): the data dir's CA signs
    /// names under it only.
    #[serde(default = "default_e2b_domain")]
    pub domain: String,
    /// Whether a sandbox's ports may be reached without its traffic token, as E2B's
    /// `allowPublicTraffic` (true when a create leaves it out) asks. Off by default: every
    /// request for a port must carry the sandbox's token, and a create asking for public
    /// traffic is refused.
    #[serde(default)]
    pub public_traffic: bool,
    /// Image references an E2B template build may start from (`fromImage`; E2B's
    /// `e2bdev/base` for `from_base_image`), each to the Cordon template that stands for
    /// it (or `debian`, the microvm tier's Debian root): this server pulls no image from a
    /// registry; `cordon template import` brings one in.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// E2B template builds (`Template.build`): how many run at once, server-wide (more
    /// wait); 0 turns the build API off.
    #[serde(default = "default_e2b_builds")]
    pub builds: usize,
    /// The most templates one tenant may have built through E2B's API.
    #[serde(default = "default_e2b_max_templates")]
    pub max_templates: usize,
    /// The most bytes of one build's uploaded files (a `copy` step's archive), and of all
    /// one tenant's uploads kept together.
    #[serde(default = "default_e2b_max_upload")]
    pub max_upload_bytes: cordon_core::units::Size,
}

fn default_e2b_builds() -> usize {
    2
}

fn default_e2b_max_templates() -> usize {
    50
}

fn default_e2b_max_upload() -> cordon_core::units::Size {
    cordon_core::units::Size(1 << 30)
}

fn default_e2b_domain() -> String {
    "localhost".to_string()
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            listen: default_e2b_listen(),
            templates: BTreeMap::new(),
            tier: None,
            limits: Default::default(),
            https_listen: None,
            https_cert_file: None,
            https_key_file: None,
            domain: default_e2b_domain(),
            public_traffic: false,
            images: BTreeMap::new(),
            builds: default_e2b_builds(),
            max_templates: default_e2b_max_templates(),
            max_upload_bytes: default_e2b_max_upload(),
        }
    }
}

fn default_e2b_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 49982))
}

/// The issuer of minted grant tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OidcConfig {
    /// The issuer URL (`iss`), where verifiers fetch `/.well-known/openid-configuration`.
    /// Default: `http://<bind>` (set a public https URL when an upstream verifies tokens).
    pub issuer: Option<String>,
    /// How often signing keys rotate.
    pub rotate_every: Dur,
    /// The longest a minted token may live.
    pub max_token_life: Dur,
}

impl Default for OidcConfig {
    fn default() -> Self {
        OidcConfig {
            issuer: None,
            rotate_every: Dur(Duration::from_secs(24 * 3600)),
            max_token_life: Dur(Duration::from_secs(3600)),
        }
    }
}

/// TLS for the API: a PEM certificate chain and its private key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// The API's edge.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdgeConfig {
    /// Shortest API key accepted in the config (a key in clear) and in the key file.
    pub min_key_len: usize,
    /// Failed key attempts from one source address before it is slowed down.
    pub failures_before_slowdown: u32,
    /// Whether `/metrics` and the detailed health need a key (default true).
    pub metrics_need_key: bool,
    /// Serve plain HTTP on a non-loopback address (default false: such a bind without
    /// `[tls]` stops the start).
    pub allow_plaintext_remote: bool,
    /// Tenants whose keys see every tenant's sandboxes and audit rows on the dashboard
    /// (`/dashboard`, `GET /v1/events`), `/metrics` and the server-wide health: the
    /// operator's own. Every other key sees its own.
    pub dashboard_operators: Vec<String>,
    /// Connections one listener (the API, the E2B listener) holds at once; kept under half
    /// the process's descriptor limit. Past it a new connection closes an idle one (the
    /// address holding the most connections first); refused only when every connection
    /// has a request under way.
    pub max_connections: usize,
    /// Connections from one source address at once; past it a new one from that address
    /// closes that address's idle one.
    pub max_connections_per_source: usize,
    /// How long a connection may wait for a request's head: idle between requests, or a
    /// head sent slowly. Past it the connection is closed.
    pub idle_timeout: Dur,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            min_key_len: 32,
            failures_before_slowdown: 5,
            metrics_need_key: true,
            allow_plaintext_remote: false,
            dashboard_operators: Vec::new(),
            max_connections: 4096,
            max_connections_per_source: 512,
            idle_timeout: Dur(Duration::from_secs(30)),
        }
    }
}

/// A warm pool of a spec other than its tier's default: `size` sandboxes of what a create
/// with these fields would make (the create's own type, flattened, so a new create field is
/// written once). It names a tier; the fields of a sandbox's life
/// ([`cordon_engine::SandboxRequest::LIFE_FIELDS`]) are the taking create's, not the pool's,
/// and it names no grants (a warm sandbox holds no secret before a tenant takes it).
/// Any limits left out are the server's `default_limits`. A create or run giving the same
/// spec (its tier, limits, lists, template...) takes one of its sandboxes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecPool {
    pub size: usize,
    #[serde(flatten)]
    pub spec: cordon_engine::SandboxRequest,
}

impl SpecPool {
    /// The pool's tier (`Config::validate` refuses a pool that names none).
    pub fn tier(&self) -> Option<Tier> {
        match self.spec.tier {
            Some(cordon_policy::TierChoice::Tier(t)) => Some(t),
            _ => None,
        }
    }
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
    /// The operator's ceiling as the engine reads it.
    pub fn ceiling(&self) -> cordon_engine::CeilingConfig {
        cordon_engine::CeilingConfig {
            tenant_defaults: self.tenant_defaults.clone(),
            tenants: self.tenants.clone(),
            budgets: self.budgets.clone(),
            runtime: self.runtime.clone(),
        }
    }

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
            tenant_defaults: Default::default(),
            tenants: BTreeMap::new(),
            budgets: Default::default(),
            runtime: Default::default(),
            grants: Vec::new(),
            oidc: OidcConfig::default(),
            tls: None,
            edge: EdgeConfig::default(),
            e2b: None,
        }
    }

    /// Parses a configuration; relative paths are taken from `base` (the file's directory).
    pub fn parse(text: &str, base: &Path) -> Result<Self, ServerError> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| ServerError::Config(e.to_string()))?;
        cfg.sessions.max_sandboxes_set = toml::from_str::<SetKeys>(text)
            .is_ok_and(|k| k.sessions.is_some_and(|s| s.max_sandboxes.is_some()));
        if cfg.data_dir.is_relative() {
            cfg.data_dir = base.join(&cfg.data_dir);
        }
        if let Some(f) = &cfg.key_file
            && f.is_relative()
        {
            cfg.key_file = Some(base.join(f));
        }
        let tls_files = cfg
            .tls
            .as_mut()
            .map(|t| vec![&mut t.cert_file, &mut t.key_file])
            .unwrap_or_default();
        for f in tls_files {
            if f.is_relative() {
                *f = base.join(&*f);
            }
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
        if self.edge.max_connections == 0
            || self.edge.max_connections_per_source == 0
            || self.edge.idle_timeout.0.is_zero()
        {
            return bad(
                "edge.max_connections, max_connections_per_source and idle_timeout must be more than zero"
                    .into(),
            );
        }
        if self.sessions.max_attach_streams_per_tenant == 0
            || self.sessions.max_attach_streams_per_sandbox == 0
            || self.audit.max_reads_per_tenant == 0
            || self.audit.max_event_streams_per_tenant == 0
        {
            return bad(
                "sessions.max_attach_streams_per_tenant and _per_sandbox, audit.max_reads_per_tenant and max_event_streams_per_tenant must be at least 1"
                    .into(),
            );
        }
        if self.sessions.reap_interval.0.is_zero() {
            return bad("sessions.reap_interval must be more than zero".into());
        }
        if !self.bind.ip().is_loopback() && self.tls.is_none() && !self.edge.allow_plaintext_remote
        {
            return bad(format!(
                "bind = {} is beyond loopback without [tls]: API keys would cross the network in clear; \
                 add [tls] cert_file and key_file, or set edge.allow_plaintext_remote = true behind a TLS proxy",
                self.bind
            ));
        }
        if let Some(e) = &self.e2b
            && !e.listen.ip().is_loopback()
            && !self.edge.allow_plaintext_remote
        {
            return bad(format!(
                "e2b.listen = {} is beyond loopback: E2B's SDKs send their API key in clear over \
                 plain HTTP; listen on loopback, or set edge.allow_plaintext_remote = true behind a TLS proxy",
                e.listen
            ));
        }
        if let Some(e) = &self.e2b {
            if e.https_cert_file.is_some() != e.https_key_file.is_some() {
                return bad(
                    "e2b.https_cert_file and e2b.https_key_file go together: give both, or neither \
                     for certificates from the data dir's own CA"
                        .into(),
                );
            }
            if e.https_cert_file.is_some() && e.https_listen.is_none() {
                return bad(
                    "e2b.https_cert_file is given without e2b.https_listen: give the HTTPS listener's address (\"127.0.0.1:443\", say), or drop the certificate"
                        .into(),
                );
            }
            let name_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            };
            // One label is a top-level domain: a CA limited to it would vouch for a whole
            // TLD's names. `localhost` names only this host.
            let labels = e.domain.split('.').count();
            if e.domain.len() > 200
                || !e.domain.split('.').all(name_ok)
                || (labels < 2 && e.domain != "localhost")
            {
                return bad(format!(
                    "e2b.domain = {:?} is no lower-case DNS name of two labels or more (or \"localhost\"); give the domain of sandbox hosts (the clients' E2B_DOMAIN), such as \"localhost\" or \"sandbox.example.com\"",
                    e.domain
                ));
            }
        }
        for (tier, n) in &self.pools {
            if *n > 64 {
                return bad(format!(
                    "pools.{tier} = {n} is more than 64; give a smaller warm pool"
                ));
            }
        }
        for (i, p) in self.spec_pools.iter().enumerate() {
            let n = i + 1;
            let Some(tier) = p.tier() else {
                return bad(format!(
                    "the [[pool]] table number {n} names no tier: give tier = \"container\" (or another tier by name; not auto)"
                ));
            };
            if let Some(f) = p.spec.life_fields_given().first() {
                return bad(format!(
                    "the [[pool]] table number {n} gives {f}: a pooled sandbox's life is set by the create that takes it; leave {f} out"
                ));
            }
            if !p.spec.grants.is_empty() {
                return bad(format!(
                    "the [[pool]] table number {n} names grants: a warm sandbox holds no grant's secret before a tenant takes it; leave grants out"
                ));
            }
            if p.size > 64 {
                return bad(format!(
                    "pool {tier} (the [[pool]] table number {n}) has size {}, more than 64; give a smaller warm pool",
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
    fn whether_max_sandboxes_was_set_is_known() {
        let base = Path::new("/");
        let parse = |sessions: &str| Config::parse(&format!("data_dir = \"/d\"\n{sessions}"), base);
        let unset = parse("[sessions]\nmax_sandboxes_per_tenant = 4\n").unwrap();
        assert!(!unset.sessions.max_sandboxes_set);
        assert_eq!(unset.sessions.max_sandboxes, 64);
        assert!(!parse("").unwrap().sessions.max_sandboxes_set);
        let set = parse("[sessions]\nmax_sandboxes = 64\n").unwrap();
        assert!(set.sessions.max_sandboxes_set);
        // Not a key a file may give.
        assert!(parse("[sessions]\nmax_sandboxes_set = true\n").is_err());
    }

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
        assert_eq!((p.tier(), p.size), (Some(Tier::Container), 3));
        assert_eq!(p.spec.allow_hosts, ["pypi.org", "*.pythonhosted.org"]);
        assert_eq!(p.spec.limits.memory_bytes, Some(1 << 30));
        let big = "data_dir = \"x\"\n[[pool]]\ntier = \"wasm\"\nsize = 65\n";
        let e = Config::parse(big, Path::new("/"))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("more than 64")));
        let pool = |rest: &str| {
            Config::parse(
                &format!("data_dir = \"x\"\n[[pool]]\nsize = 1\n{rest}"),
                Path::new("/"),
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        assert!(!pool("tier = \"wasm\"\nenv = 1\n").is_empty());
        assert!(pool("tier = \"wasm\"\nbogus = 1\n").contains("bogus"));
        // The create's fields, flattened: a new create field is a pool's too.
        assert_eq!(
            pool("tier = \"wasm\"\nenv = { A = \"1\" }\nshape = \"one-long\"\n"),
            ""
        );
        assert!(pool("tier = \"wasm\"\ngrants = [\"gh\"]\n").contains("names grants"));
        assert!(pool("tier = \"auto\"\n").contains("names no tier"));
        assert!(pool("").contains("names no tier"));
        for life in [
            "ttl = \"5m\"",
            "idle_timeout = 60",
            "on_timeout = \"pause\"",
            "labels = { a = \"b\" }",
        ] {
            let e = pool(&format!("tier = \"wasm\"\n{life}\n"));
            assert!(e.contains("life is set by the create"), "{life}: {e}");
        }
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
