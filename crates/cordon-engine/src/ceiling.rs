//! The operator's ceiling: what each tenant may ask for. Written in `cordon.toml`; every
//! field has a secure default, so a server with no ceiling section still refuses private
//! ranges, the in-process tier and trust a tenant gives itself.

use std::collections::BTreeMap;

use cordon_core::Tier;
use cordon_core::units::{Dur, Size};
use cordon_egress::Pattern;
use cordon_egress::policy::{HostMatch, Ports};
use cordon_policy::Trust;
use serde::{Deserialize, Serialize};

/// What one tenant may do. Every field left out falls back to `[tenant_defaults]`, then to
/// the built-in default named on the field.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantRules {
    /// How far the operator trusts this tenant's code. Default `untrusted`: the policy's
    /// untrusted rows (a kernel boundary) apply to every request that says nothing. A
    /// request may lower it, never raise it.
    pub trust: Option<Trust>,
    /// Tiers this tenant may use. Default: every tier but those whose sandboxes live in the
    /// serving process (`Features::memory_in_server`: the `runtime` tier's in-process QuickJS
    /// is for operators' own trusted snippets).
    pub tiers: Option<Vec<Tier>>,
    /// Egress ceiling: the names and CIDRs this tenant's requests may allow. Default `["*"]`
    /// (any public name or address, any port). Non-public ranges (loopback, RFC 1918,
    /// link-local and metadata, CGNAT, ULA, this server's own addresses) are allowed only
    /// where an entry here names a CIDR containing them.
    pub egress: Option<Vec<Pattern>>,
    /// Live sandboxes at once. Default: `sessions.max_sandboxes_per_tenant`.
    pub max_sandboxes: Option<usize>,
    /// Memory of this tenant's live sandboxes added up (their memory limits). Default: a
    /// quarter of the server's memory budget, or its `max_sandboxes_per_tenant /
    /// max_sandboxes` when that is more, so one tenant leaves room for the others.
    pub max_memory: Option<Size>,
    /// MCP sessions open at once. Default 8.
    pub max_mcp_sessions: Option<usize>,
    /// Volumes' sizes (their quotas) added up, of all this tenant's volumes. Default 1 GiB.
    pub max_volume_bytes: Option<Size>,
    /// Volumes this tenant may have. Default 16.
    pub max_volumes: Option<usize>,
    /// Bytes this tenant's sandboxes paused to disk may hold in the server's data dir, all
    /// together (each counted at its memory and disk limits while it is saved, then at what
    /// it took). Default 4 GiB.
    pub max_paused_bytes: Option<Size>,
    /// Bytes this tenant's snapshots may hold in the server's data dir, all together (each
    /// counted at its sandbox's limits while it is taken, then at what it took). Default
    /// 4 GiB.
    pub max_snapshot_bytes: Option<Size>,
    /// Walls this tenant's requests may agree to run without where the host cannot apply
    /// them (`allow_weaker`: landlock, seccomp, cgroups). Default none.
    pub allow_weaker: Option<Vec<cordon_core::Weakening>>,
}

/// What a tenant's sandboxes paused to disk may hold, where the operator says nothing.
pub const DEFAULT_MAX_PAUSED_BYTES: u64 = 4 << 30;

/// What a tenant's snapshots may hold, where the operator says nothing.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// A tenant's volumes' sizes added up, where the operator says nothing.
pub const DEFAULT_MAX_VOLUME_BYTES: u64 = 1 << 30;
/// A tenant's number of volumes, where the operator says nothing.
pub const DEFAULT_MAX_VOLUMES: usize = 16;

/// The server's own aggregate budgets: what all tenants' sandboxes add up to at most.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budgets {
    /// Memory limits of every live and pooled sandbox added up. Default: this host's
    /// physical memory less 1 GiB for the host itself, so the configured maxima cannot
    /// overcommit it.
    pub max_memory: Option<Size>,
}

/// The in-process tier's own cap.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeCeiling {
    /// The most heap a `runtime` sandbox may have (its memory limit). Default 64 MiB: the
    /// heap lives inside the server process.
    pub max_heap: Size,
}

impl Default for RuntimeCeiling {
    fn default() -> Self {
        RuntimeCeiling {
            max_heap: Size(64 << 20),
        }
    }
}

/// Where a catalogue grant's value comes from. Read by the server, never named by a request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum SecretSource {
    /// An environment variable of the server process.
    Env(String),
    /// A file on the server host (one trailing newline stripped).
    File(std::path::PathBuf),
    /// No stored secret: a token is minted per sandbox (a signed JWT, see `[oidc]`).
    Mint(MintSpec),
}

/// How a minted grant's tokens look.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MintSpec {
    /// The token's `aud`: who it is for (the upstream's client id, or a cloud's token
    /// exchange audience).
    pub audience: String,
    /// How long one token lives (default 5 minutes; never beyond the sandbox's end).
    #[serde(default = "default_token_life")]
    pub lifetime: Dur,
    /// A `scope` claim, if the upstream wants one.
    #[serde(default)]
    pub scope: Option<String>,
}

fn default_token_life() -> Dur {
    Dur(std::time::Duration::from_secs(300))
}

/// When a file or environment secret is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadAt {
    /// Once, when the server starts (a missing secret stops the start, naming the grant).
    #[default]
    Start,
    /// At every sandbox create that uses the grant (rotation without a restart).
    Use,
}

/// One `[[grant]]` of the operator's catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrantEntry {
    /// The name requests use (`"grants": ["github"]`).
    pub name: String,
    /// The variable the sandbox finds the placeholder in (default: the name upper-cased,
    /// `-` as `_`, with `_TOKEN` after it).
    #[serde(default)]
    pub env_var: Option<String>,
    pub secret: SecretSource,
    #[serde(default)]
    pub load: LoadAt,
    /// Hosts the secret (or token) may be sent to: exact names or `*.suffix`.
    pub hosts: Vec<Pattern>,
    /// The header it goes in (default `authorization`).
    #[serde(default = "cordon_core::default_grant_header")]
    pub header: String,
    /// Methods allowed with it; empty means any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path prefixes allowed with it; empty means any.
    #[serde(default)]
    pub path_prefixes: Vec<String>,
    /// The longest a sandbox holding this grant may live (its TTL is capped to it).
    #[serde(default)]
    pub max_lifetime: Option<Dur>,
    /// Tenants that may use it. Empty means none: a grant is for the tenants it names.
    #[serde(default)]
    pub tenants: Vec<String>,
}

impl GrantEntry {
    /// The variable the placeholder goes in.
    pub fn env_var(&self) -> String {
        self.env_var.clone().unwrap_or_else(|| {
            let base: String = self
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("{base}_TOKEN")
        })
    }

    /// Whether `tenant` may use it.
    pub fn allows(&self, tenant: &str) -> bool {
        self.tenants.iter().any(|t| t == tenant || t == "*")
    }
}

/// The whole ceiling, as the config file gives it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CeilingConfig {
    pub tenant_defaults: TenantRules,
    pub tenants: BTreeMap<String, TenantRules>,
    pub budgets: Budgets,
    pub runtime: RuntimeCeiling,
}

/// One tenant's rules with every default applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub trust: Trust,
    pub tiers: Vec<Tier>,
    pub egress: EgressCeiling,
    pub max_sandboxes: Option<usize>,
    pub max_memory: Option<u64>,
    pub max_mcp_sessions: usize,
    pub allow_weaker: Vec<cordon_core::Weakening>,
    pub max_volume_bytes: u64,
    pub max_volumes: usize,
    pub max_paused_bytes: u64,
    pub max_snapshot_bytes: u64,
}

impl CeilingConfig {
    /// The rules for `tenant`, defaults applied.
    pub fn resolve(&self, tenant: &str) -> Resolved {
        let mine = self.tenants.get(tenant);
        let d = &self.tenant_defaults;
        macro_rules! pick {
            ($f:ident) => {
                mine.and_then(|m| m.$f.clone()).or_else(|| d.$f.clone())
            };
        }
        let egress = pick!(egress).unwrap_or_else(|| vec![Pattern::any_name()]);
        Resolved {
            trust: pick!(trust).unwrap_or(Trust::Untrusted),
            tiers: pick!(tiers).unwrap_or_else(|| {
                Tier::ALL
                    .into_iter()
                    .filter(|t| !t.features().memory_in_server)
                    .collect()
            }),
            egress: EgressCeiling::new(egress),
            max_sandboxes: pick!(max_sandboxes),
            max_memory: pick!(max_memory).map(|s| s.0),
            max_mcp_sessions: pick!(max_mcp_sessions).unwrap_or(8),
            allow_weaker: pick!(allow_weaker).unwrap_or_default(),
            max_volume_bytes: pick!(max_volume_bytes).map_or(DEFAULT_MAX_VOLUME_BYTES, |s| s.0),
            max_volumes: pick!(max_volumes).unwrap_or(DEFAULT_MAX_VOLUMES),
            max_paused_bytes: pick!(max_paused_bytes).map_or(DEFAULT_MAX_PAUSED_BYTES, |s| s.0),
            max_snapshot_bytes: pick!(max_snapshot_bytes)
                .map_or(DEFAULT_MAX_SNAPSHOT_BYTES, |s| s.0),
        }
    }

    /// The ceiling of the local operator (`cordon run`, `cordon mcp` on stdio): every tier,
    /// trust as the request says, any egress entry (the operator owns the host).
    pub fn operator() -> Resolved {
        Resolved {
            trust: Trust::Trusted,
            tiers: Tier::ALL.to_vec(),
            egress: EgressCeiling::unlimited(),
            max_sandboxes: None,
            max_memory: None,
            max_mcp_sessions: usize::MAX,
            max_volume_bytes: u64::MAX,
            max_volumes: usize::MAX,
            max_paused_bytes: u64::MAX,
            max_snapshot_bytes: u64::MAX,
            allow_weaker: vec![
                cordon_core::Weakening::Landlock,
                cordon_core::Weakening::Seccomp,
                cordon_core::Weakening::Cgroups,
            ],
        }
    }
}

/// Which allow entries a request may carry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EgressCeiling {
    entries: Vec<Pattern>,
    unlimited: bool,
}

impl EgressCeiling {
    /// A ceiling of these entries (parsed as the config was read).
    pub fn new(entries: Vec<Pattern>) -> Self {
        EgressCeiling {
            entries,
            unlimited: false,
        }
    }

    fn unlimited() -> Self {
        EgressCeiling {
            entries: Vec::new(),
            unlimited: true,
        }
    }

    /// Entries as written (for audit rows and messages).
    pub fn describe(&self) -> Vec<String> {
        if self.unlimited {
            return vec!["(operator: any)".into()];
        }
        cordon_core::egress::pattern_texts(&self.entries)
    }

    /// Checks one allow entry of a request against the ceiling. `Err` says why not.
    pub fn check(&self, entry: &Pattern) -> Result<(), String> {
        if self.unlimited {
            return Ok(());
        }
        if let HostMatch::Net(net) = &entry.host {
            // A CIDR or IP literal reaching into a non-public range needs a ceiling CIDR
            // that contains it whole; a public one is covered by `*`.
            let covered_by_net = self.entries.iter().any(|c| {
                matches!(&c.host, HostMatch::Net(cn) if cn.contains(net))
                    && ports_cover(&c.ports, &entry.ports)
            });
            if covered_by_net {
                return Ok(());
            }
            if let Some(class) = cordon_egress::guard::non_public_overlap(net) {
                return Err(format!(
                    "{} reaches into a non-public range ({}) that your egress ceiling does not name",
                    entry.text,
                    class.as_str()
                ));
            }
            let any = self.entries.iter().any(|c| {
                matches!(c.host, HostMatch::AnyName) && ports_cover(&c.ports, &entry.ports)
            });
            return if any {
                Ok(())
            } else {
                Err(format!("{} is outside your egress ceiling", entry.text))
            };
        }
        let covered = self
            .entries
            .iter()
            .any(|c| host_covers(&c.host, &entry.host) && ports_cover(&c.ports, &entry.ports));
        if covered {
            Ok(())
        } else {
            Err(format!("{} is outside your egress ceiling", entry.text))
        }
    }
}

fn host_covers(ceiling: &HostMatch, entry: &HostMatch) -> bool {
    match (ceiling, entry) {
        (HostMatch::AnyName, HostMatch::Net(_)) => false,
        (HostMatch::AnyName, _) => true,
        (HostMatch::Exact(c), HostMatch::Exact(e)) => c == e,
        (HostMatch::Suffix(c), HostMatch::Exact(e)) => e.len() > c.len() && e.ends_with(c.as_str()),
        (HostMatch::Suffix(c), HostMatch::Suffix(e)) => e == c || e.ends_with(c.as_str()),
        _ => false,
    }
}

fn ports_cover(ceiling: &Ports, entry: &Ports) -> bool {
    match (ceiling, entry) {
        (Ports::Any, _) => true,
        // No port on a ceiling entry means any port, as in a deny entry.
        (Ports::Default, _) => true,
        (Ports::One(c), Ports::One(e)) => c == e,
        (Ports::One(_), _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }

    #[test]
    fn default_ceiling_refuses_every_non_public_entry() {
        let c = CeilingConfig::default().resolve("alice");
        for bad in [
            "127.0.0.1/32:7070",
            "169.254.169.254/32:80",
            "10.0.0.0/8:*",
            "0.0.0.0/0:*",
            "[::1]:443",
            "[fd00::/8]:*",
            "100.64.0.1",
            "::/0",
        ] {
            let e = c.egress.check(&p(bad)).unwrap_err();
            assert!(e.contains("non-public"), "{bad}: {e}");
        }
        for good in [
            "pypi.org",
            "*.example.com:443",
            "8.8.8.8/32:53",
            "api.x.test:*",
        ] {
            c.egress.check(&p(good)).unwrap();
        }
    }

    #[test]
    fn a_ceiling_cidr_lets_exactly_its_range_in() {
        let cfg: CeilingConfig = toml::from_str(
            r#"
            [tenants.ci]
            egress = ["10.1.0.0/16:5432", "*.corp.test"]
            "#,
        )
        .unwrap();
        let c = cfg.resolve("ci");
        c.egress.check(&p("10.1.2.0/24:5432")).unwrap();
        c.egress.check(&p("db.corp.test:443")).unwrap();
        c.egress.check(&p("*.x.corp.test")).unwrap();
        assert!(c.egress.check(&p("10.1.2.0/24:22")).is_err());
        assert!(c.egress.check(&p("10.2.0.0/16:5432")).is_err());
        assert!(c.egress.check(&p("pypi.org")).is_err());
        assert!(c.egress.check(&p("*")).is_err());
        // another tenant keeps the defaults
        assert!(
            cfg.resolve("other")
                .egress
                .check(&p("10.1.2.3:5432"))
                .is_err()
        );
    }

    #[test]
    fn defaults_are_untrusted_and_without_the_runtime_tier() {
        let r = CeilingConfig::default().resolve("t");
        assert_eq!(r.trust, Trust::Untrusted);
        assert!(!r.tiers.contains(&Tier::Runtime));
        assert!(r.tiers.contains(&Tier::Wasm));
        let cfg: CeilingConfig = toml::from_str(
            r#"
            [tenant_defaults]
            tiers = ["wasm", "gvisor"]
            [tenants.ops]
            trust = "trusted"
            tiers = ["runtime", "container"]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.resolve("x").tiers, vec![Tier::Wasm, Tier::Gvisor]);
        assert_eq!(cfg.resolve("ops").trust, Trust::Trusted);
        assert_eq!(cfg.resolve("x").trust, Trust::Untrusted);
    }

    #[test]
    fn unknown_keys_and_bad_entries_are_refused() {
        assert!(toml::from_str::<CeilingConfig>("[tenants.a]\nroot = true\n").is_err());
        let e = toml::from_str::<CeilingConfig>("[tenants.a]\negress = [\"not a host\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("egress rule \"not a host\" is not valid"), "{e}");
    }
}
