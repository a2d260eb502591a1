//! The gate: one decision for every request, whoever sends it and through whichever front
//! door. Request → the principal's ceiling (tiers, trust, egress, grants) → the tier policy
//! → limits → grants resolved from the catalogue → a spec, or a refusal that names the rule
//! and the fix. Both carry a typed record of the whole decision for the audit row.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use cordon_core::{Command, EgressPolicy, Language, Limits, Pattern, SandboxSpec, Tier};
use cordon_policy::{Autonomy, BenchFigures, Rules, Shape, TierChoice, Trust};

use crate::catalogue::Catalogue;
use crate::ceiling::{CeilingConfig, Resolved};
use crate::request::{Principal, SandboxRequest, Workload};

mod record;
mod rule;

pub use record::{DenyCode, GateRecord, GrantRecord, NodeAllowance, PolicyOutcome, TemplateRecord};
pub use rule::GateRule;

/// An allowed request: the spec to create and its lifetime.
#[derive(Debug, Clone)]
pub struct Admission {
    pub spec: SandboxSpec,
    pub ttl: Duration,
    pub idle: Duration,
    pub record: GateRecord,
    /// The policy's decision where it ran (`cordon run` prints which tier it chose).
    pub decision: Option<cordon_policy::Decision>,
}

/// A refused request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    pub code: DenyCode,
    /// The rule that refused it (`ceiling.egress`, `untrusted-needs-kernel-boundary`, ...).
    pub rule: GateRule,
    pub message: String,
    pub fix: String,
    pub record: Box<GateRecord>,
}

/// What the gate knows of the server it guards.
#[derive(Debug, Clone)]
pub struct GateSettings {
    /// The tier a request that names none gets, where the policy allows it.
    pub default_tier: Tier,
    pub default_limits: Limits,
    pub max_limits: Limits,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub default_idle: Duration,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            default_tier: Tier::Container,
            default_limits: Limits::default(),
            max_limits: Limits {
                timeout_ms: 3_600_000,
                memory_bytes: 8 << 30,
                pids: 4096,
                disk_bytes: 16 << 30,
                tmp_bytes: 4 << 30,
                cpus: 64.0,
                stdout_bytes: 256 << 20,
                stderr_bytes: 256 << 20,
                open_files: 1 << 20,
                fuel: None,
            },
            default_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(24 * 3600),
            default_idle: Duration::from_secs(300),
        }
    }
}

/// Where the tier policy's rules come from (parsed when first needed: `cordon run` without
/// a policy step never pays for it).
#[derive(Debug, Clone)]
pub enum RulesSource {
    Shipped,
    Text(String),
}

/// One gate per server (or per `cordon run`).
pub struct Gate {
    settings: GateSettings,
    ceiling: CeilingConfig,
    catalogue: Arc<Catalogue>,
    rules_source: RulesSource,
    rules: OnceLock<Result<Rules, String>>,
    bench: Option<BenchFigures>,
    /// Tiers this server has and can run, and why each other one cannot.
    available: BTreeSet<Tier>,
    unavailable: Vec<(Tier, String)>,
    /// The template store requests may name templates of.
    templates: Option<cordon_template::Store>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("available", &self.available)
            .finish_non_exhaustive()
    }
}

impl Gate {
    pub fn new(
        settings: GateSettings,
        ceiling: CeilingConfig,
        catalogue: Arc<Catalogue>,
        rules: RulesSource,
        bench: Option<BenchFigures>,
    ) -> Self {
        Gate {
            settings,
            ceiling,
            catalogue,
            rules_source: rules,
            rules: OnceLock::new(),
            bench,
            available: BTreeSet::new(),
            unavailable: Vec::new(),
            templates: None,
        }
    }

    /// The template store requests may name templates of (none: a request naming one is
    /// refused).
    pub fn with_templates(mut self, store: cordon_template::Store) -> Self {
        self.templates = Some(store);
        self
    }

    /// Records which tiers can run here (`why` for each that cannot).
    pub fn with_tiers(
        mut self,
        available: BTreeSet<Tier>,
        unavailable: Vec<(Tier, String)>,
    ) -> Self {
        self.available = available;
        self.unavailable = unavailable;
        self
    }

    /// Parses the policy rules now (a server does, so a bad file stops its start).
    pub fn load_rules(&self) -> Result<&Rules, String> {
        self.rules
            .get_or_init(|| match &self.rules_source {
                RulesSource::Shipped => {
                    Rules::default_rules().map_err(|e| format!("the shipped policy: {e}"))
                }
                // `load_rules` answers a message the server and the CLI put in their own
                // (naming the policy file); the error is cached and handed to every caller.
                RulesSource::Text(t) => Rules::from_toml(t).map_err(|e| e.to_string()),
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    pub fn settings(&self) -> &GateSettings {
        &self.settings
    }

    pub fn catalogue(&self) -> &Arc<Catalogue> {
        &self.catalogue
    }

    /// The principal's rules with every default applied.
    pub fn rules_for(&self, p: &Principal) -> Resolved {
        match p {
            Principal::Operator => CeilingConfig::operator(),
            Principal::Tenant(t) => self.ceiling.resolve(t),
        }
    }

    pub fn ceiling(&self) -> &CeilingConfig {
        &self.ceiling
    }

    /// Decides one request. `what` names the front door's operation (`create`, `run`).
    pub fn admit(
        &self,
        who: &Principal,
        req: &SandboxRequest,
        what: &str,
    ) -> Result<Admission, Denial> {
        let rules = self.rules_for(who);
        let mut record = Self::record(who, &rules, req, what);
        match self.decide(who, &rules, req, &mut record) {
            Ok(Decided {
                spec,
                life,
                decision,
            }) => Ok(Admission {
                spec,
                ttl: life.ttl,
                idle: life.idle,
                record,
                decision,
            }),
            Err((code, rule, message, fix)) => Err(Self::denial(record, code, rule, message, fix)),
        }
    }

    /// A refusal a front door made before the gate (cordon-oci's bundle check: privileged
    /// mode, a host namespace, a host device), with the record a refusal of the gate has, so
    /// it is an audit row like the gate's own decisions.
    #[allow(clippy::too_many_arguments)]
    pub fn refusal(
        &self,
        who: &Principal,
        req: &SandboxRequest,
        what: &str,
        code: DenyCode,
        rule: GateRule,
        message: &str,
        fix: &str,
    ) -> Denial {
        let record = Self::record(who, &self.rules_for(who), req, what);
        Self::denial(record, code, rule, message.into(), fix.into())
    }

    fn denial(
        mut record: GateRecord,
        code: DenyCode,
        rule: GateRule,
        message: String,
        fix: String,
    ) -> Denial {
        record.rule = Some(rule.clone());
        record.reason = Some(message.clone());
        Denial {
            code,
            rule,
            message,
            fix,
            record: Box::new(record),
        }
    }

    /// The record of a decision on `req`, before it is decided.
    fn record(who: &Principal, rules: &Resolved, req: &SandboxRequest, what: &str) -> GateRecord {
        GateRecord {
            request: what.to_string(),
            principal: who.name().to_string(),
            trust_ceiling: rules.trust,
            trust: req.trust,
            autonomy: req.autonomy,
            allowed_tiers: rules.tiers.clone(),
            egress_ceiling: rules.egress.describe(),
            tier: None,
            limits: None,
            allow_hosts: req.allow_hosts.clone(),
            deny_hosts: req.deny_hosts.clone(),
            grants: Vec::new(),
            template: None,
            allow_weaker: req.allow_weaker.clone(),
            ttl_ms: None,
            idle_timeout_ms: None,
            rule: None,
            reason: None,
            tier_policy: None,
            node_allowances: Vec::new(),
        }
    }

    fn decide(
        &self,
        who: &Principal,
        rules: &Resolved,
        req: &SandboxRequest,
        record: &mut GateRecord,
    ) -> Result<Decided, Refused> {
        let tenant = match who {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t.as_str()),
        };
        check_request_ceiling(tenant, rules, req)?;
        let egress = check_egress(rules, req)?;
        // Grant hosts are egress too: the policy sees them and the audit row names them.
        let reach: Vec<Pattern> = (egress.allow.iter().cloned())
            .chain(self.grant_hosts(tenant, req, record)?)
            .collect();
        let network = !reach.is_empty();
        let (tier, decision) = self.pick_tier(tenant, rules, req, network, reach, record)?;
        record.tier = Some(tier);
        if !rules.tiers.contains(&tier) {
            return Err(not_open(tier, rules));
        }
        if !self.available.contains(&tier) {
            return Err(self.unavailable(tier));
        }
        let mut spec = self.spec_for(tier, tenant, req, network, record)?;
        spec.egress = egress;
        let life = self.lifetime(tenant, req, record)?;
        // Grants resolved last: nothing is read for a refused request.
        self.resolve_grants(tenant, req, life.ttl, &mut spec)?;
        if let Some(name) = &req.template {
            if !crate::request::may_use_template(who, name) {
                // Said as a missing template: a name tells nothing of another tenant's.
                return Err(invalid(
                    cordon_template::TemplateError::NotFound(name.clone()).to_string(),
                ));
            }
            self.use_template(name, &mut spec, record)?;
        }
        mount_volumes(req, &mut spec)?;
        spec.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(Decided {
            spec,
            life,
            decision,
        })
    }

    /// Grants: names of the catalogue open to this tenant, and the inline ones; each is
    /// recorded. Answers every host the grants reach.
    fn grant_hosts(
        &self,
        tenant: Option<&str>,
        req: &SandboxRequest,
        record: &mut GateRecord,
    ) -> Result<Vec<Pattern>, Refused> {
        let mut grant_hosts = Vec::new();
        for g in &req.grants {
            let entry = tenant.and_then(|t| self.catalogue.entry(&g.0, t));
            let Some(entry) = entry else {
                return Err(deny(
                    GateRule::CeilingGrants,
                    format!("grant {:?} is not in the catalogue open to you", g.0),
                    "name one of the grants the operator opened to your tenant (see the server's [[grant]] entries)",
                ));
            };
            grant_hosts.extend(entry.hosts.iter().cloned());
            record.grants.push(GrantRecord {
                name: entry.name.clone(),
                hosts: entry.hosts.clone(),
                minted: matches!(entry.secret, crate::ceiling::SecretSource::Mint(_)),
            });
        }
        for g in &req.inline_grants {
            grant_hosts.extend(g.hosts.iter().cloned());
            record.grants.push(GrantRecord {
                name: g.name.clone(),
                hosts: g.hosts.clone(),
                minted: matches!(g.secret, cordon_core::GrantSecret::Minted(_)),
            });
        }
        Ok(grant_hosts)
    }

    /// The spec and its limits: the request's over the server's defaults, within the
    /// server's maxima (and the runtime heap's cap) for a tenant.
    fn spec_for(
        &self,
        tier: Tier,
        tenant: Option<&str>,
        req: &SandboxRequest,
        network: bool,
        record: &mut GateRecord,
    ) -> Result<SandboxSpec, Refused> {
        let mut spec = SandboxSpec::new(tier);
        spec.limits = req.limits.apply(&self.settings.default_limits);
        spec.env = req.env.clone();
        spec.allow_weaker = req.allow_weaker.clone();
        // Per-owner resources (the wasm tier's instance slots) are shared by tenant.
        spec.owner = tenant.map(str::to_string);
        record.limits = Some(spec.limits.clone());
        spec.validate().map_err(|e| invalid(e.to_string()))?;
        if network && !tier.features().network {
            return Err(deny(
                GateRule::TierNetwork,
                format!("the {tier} tier has no network, so allow_hosts and grants cannot apply"),
                cordon_core::Feature::Network.fix(),
            ));
        }
        if tenant.is_some() {
            self.cap_tenant_limits(req, &mut spec, record)?;
        }
        Ok(spec)
    }

    /// A tenant's limits: within the server's maxima, and a heap inside the server (the
    /// runtime tier's) within its cap.
    fn cap_tenant_limits(
        &self,
        req: &SandboxRequest,
        spec: &mut SandboxSpec,
        record: &mut GateRecord,
    ) -> Result<(), Refused> {
        let heap = self.ceiling.runtime.max_heap.0;
        // A heap inside the server (the runtime tier's) defaults to its cap, not the
        // server's default memory.
        let in_server = spec.tier.features().memory_in_server;
        if in_server && req.limits.memory_bytes.is_none() {
            spec.limits.memory_bytes = spec.limits.memory_bytes.min(heap);
            record.limits = Some(spec.limits.clone());
        }
        self.check_limits(&spec.limits)?;
        if in_server && spec.limits.memory_bytes > heap {
            return Err(deny(
                GateRule::CeilingRuntimeHeap,
                format!(
                    "the runtime tier's heap lives inside the server; it is capped at {} bytes",
                    heap
                ),
                "ask for less memory (limits.memory_bytes), or use the wasm tier",
            ));
        }
        Ok(())
    }

    /// Lifetime: within the server's maximum and every grant's; recorded.
    fn lifetime(
        &self,
        tenant: Option<&str>,
        req: &SandboxRequest,
        record: &mut GateRecord,
    ) -> Result<Lifetime, Refused> {
        let ttl = req.ttl.map(|d| d.0).unwrap_or(self.settings.default_ttl);
        let idle = req
            .idle_timeout
            .map(|d| d.0)
            .unwrap_or(self.settings.default_idle);
        if tenant.is_some() && (ttl > self.settings.max_ttl || ttl.is_zero() || idle.is_zero()) {
            return Err(deny(
                GateRule::CeilingTtl,
                format!(
                    "ttl must be between 1 ms and {} s, and idle_timeout more than zero",
                    self.settings.max_ttl.as_secs()
                ),
                "give a shorter ttl, e.g. \"10m\"",
            ));
        }
        let names: Vec<String> = req.grants.iter().map(|g| g.0.clone()).collect();
        let ttl = match self.catalogue.max_lifetime(&names) {
            Some(max) if ttl > max => {
                if req.ttl.is_some() {
                    return Err(deny(
                        GateRule::CeilingGrantLifetime,
                        format!(
                            "a sandbox holding these grants lives at most {} s",
                            max.as_secs()
                        ),
                        "ask for a shorter ttl",
                    ));
                }
                max
            }
            _ => ttl,
        };
        record.ttl_ms = Some(ttl.as_millis() as u64);
        record.idle_timeout_ms = Some(idle.as_millis() as u64);
        Ok(Lifetime { ttl, idle })
    }

    /// The catalogue's grants resolved (their secrets read or minted, valid for `ttl`), and
    /// the inline ones, onto the spec.
    fn resolve_grants(
        &self,
        tenant: Option<&str>,
        req: &SandboxRequest,
        ttl: Duration,
        spec: &mut SandboxSpec,
    ) -> Result<(), Refused> {
        // A lifetime past what the clock can name (the operator's ttl is not capped) is
        // refused, not a panic.
        let not_after = SystemTime::now().checked_add(ttl).ok_or_else(|| {
            invalid(format!(
                "ttl of {} s is past what this host's clock can name",
                ttl.as_secs()
            ))
        })?;
        for g in &req.grants {
            let t = tenant.unwrap_or_default();
            let grant = self.catalogue.resolve(&g.0, t, not_after).map_err(|why| {
                (
                    DenyCode::GrantUnavailable,
                    GateRule::GrantUnavailable,
                    format!("grant {:?}: {why}", g.0),
                    "retry later; if it persists, tell the operator".to_string(),
                )
            })?;
            spec.grants.push(grant);
        }
        spec.grants.extend(req.inline_grants.iter().cloned());
        Ok(())
    }

    /// Resolves the template a request names onto its spec (with the lease that keeps the
    /// template while the sandbox lives) and records its name and digest.
    fn use_template(
        &self,
        name: &str,
        spec: &mut SandboxSpec,
        record: &mut GateRecord,
    ) -> Result<(), Refused> {
        cordon_core::validate_template_name(name).map_err(|e| invalid(e.to_string()))?;
        let Some(store) = &self.templates else {
            return Err(deny(
                GateRule::Template,
                "this server has no template store",
                "leave the template out, or ask the operator to enable templates",
            ));
        };
        let as_template = |e: cordon_template::TemplateError| invalid(e.to_string());
        let m = store.get(name).map_err(as_template)?;
        record.template = Some(TemplateRecord {
            name: m.name.clone(),
            digest: m.digest.clone(),
        });
        if !m.tiers.contains(&spec.tier) {
            return Err(deny(
                GateRule::TemplateTier,
                format!(
                    "template {name:?} serves the {} tier, not {}",
                    names(&m.tiers),
                    spec.tier
                ),
                "ask for a tier the template serves (`cordon template ls` lists them)",
            ));
        }
        spec.template = Some(m.name.clone());
        spec.resolved_template = Some(store.resolve(name).map_err(as_template)?);
        Ok(())
    }

    fn unavailable(&self, tier: Tier) -> Refused {
        let why = self
            .unavailable
            .iter()
            .find(|(t, _)| *t == tier)
            .map(|(_, w)| w.clone())
            .unwrap_or_else(|| "this build has no such tier".into());
        (
            DenyCode::TierUnavailable,
            GateRule::TIER_AVAILABLE,
            format!("the {tier} tier is not available on this host ({why})"),
            "run `cordon doctor` on the server host, or choose another tier".into(),
        )
    }

    /// Checks limits against the server's maxima (a pool spec the operator wrote, or a
    /// tenant's request); the message names the limit.
    pub fn check_max_limits(&self, l: &Limits) -> Result<(), String> {
        self.check_limits(l).map_err(|(_, _, m, _)| m)
    }

    fn check_limits(&self, l: &Limits) -> Result<(), Refused> {
        let m = &self.settings.max_limits;
        let over = [
            ("timeout_ms", l.timeout_ms > m.timeout_ms),
            ("memory_bytes", l.memory_bytes > m.memory_bytes),
            ("pids", l.pids > m.pids),
            ("disk_bytes", l.disk_bytes > m.disk_bytes),
            ("tmp_bytes", l.tmp_bytes > m.tmp_bytes),
            ("cpus", l.cpus > m.cpus),
            ("stdout_bytes", l.stdout_bytes > m.stdout_bytes),
            ("stderr_bytes", l.stderr_bytes > m.stderr_bytes),
            ("open_files", l.open_files > m.open_files),
        ];
        if let Some((name, _)) = over.iter().find(|(_, o)| *o) {
            return Err(deny(
                GateRule::CeilingMaxLimits,
                format!("limits.{name} is above what this server allows"),
                "ask for less; the server's max_limits bound every sandbox",
            ));
        }
        Ok(())
    }

    /// The tier: for a tenant always through the policy (with the trust the operator gives
    /// it, lowered by the request if it asks); for the operator through the policy only
    /// when it gives trust and autonomy, as `cordon run` always did.
    fn pick_tier(
        &self,
        tenant: Option<&str>,
        rules: &Resolved,
        req: &SandboxRequest,
        network: bool,
        reach: Vec<Pattern>,
        record: &mut GateRecord,
    ) -> Result<(Tier, Option<cordon_policy::Decision>), Refused> {
        let (trust, autonomy) = match self.placement(tenant, rules, req, network)? {
            Placement::Named(t) => return Ok((t, None)),
            Placement::Policy { trust, autonomy } => (trust, autonomy),
        };
        record.trust = Some(trust);
        record.autonomy = Some(autonomy);
        let policy = self
            .load_rules()
            .map_err(|e| invalid(format!("the tier policy cannot be loaded: {e}")))?;
        let mut preq = cordon_policy::Request::new(trust, autonomy);
        preq.shape = req.shape.unwrap_or(Shape::ManyShort);
        preq.allow_hosts = reach;
        let open: BTreeSet<Tier> = self
            .available
            .iter()
            .copied()
            .filter(|t| rules.tiers.contains(t))
            .collect();
        self.check_named_tier(tenant, rules, req)?;
        let choices = self.choices(rules, req, &open)?;
        let host = cordon_policy::Host {
            available: open,
            bench: self.bench.clone(),
        };
        ask_policy(policy, preq, &host, choices, record)
    }

    /// How the tier is placed: the operator without trust and autonomy names it (or takes
    /// the default); everyone else goes through the policy with the trust and autonomy
    /// answered here (network work is network work, whatever autonomy the request claims).
    fn placement(
        &self,
        tenant: Option<&str>,
        rules: &Resolved,
        req: &SandboxRequest,
        network: bool,
    ) -> Result<Placement, Refused> {
        let (trust, autonomy) = match (tenant, req.trust, req.autonomy) {
            (None, None, None) => {
                return match req.tier {
                    Some(TierChoice::Tier(t)) => Ok(Placement::Named(t)),
                    None => Ok(Placement::Named(self.settings.default_tier)),
                    Some(TierChoice::Auto) => Err(invalid(
                        "tier \"auto\" lets the policy pick, which needs trust and autonomy \
                         (e.g. \"trust\": \"untrusted\", \"autonomy\": \"compute\")",
                    )),
                };
            }
            (None, Some(t), Some(a)) => (t, a),
            (None, _, _) => {
                return Err(invalid(
                    "trust and autonomy go together: give both (e.g. \"trust\": \"untrusted\", \
                     \"autonomy\": \"compute\") or neither",
                ));
            }
            (Some(_), t, a) => {
                let trust = match t {
                    Some(Trust::Untrusted) => Trust::Untrusted,
                    _ => rules.trust,
                };
                (trust, a.unwrap_or_else(|| derived_autonomy(req, network)))
            }
        };
        let autonomy = if network {
            autonomy.max(Autonomy::Internet)
        } else {
            autonomy
        };
        Ok(Placement::Policy { trust, autonomy })
    }

    /// A tier the request names: open to it, and runnable here.
    fn check_named_tier(
        &self,
        tenant: Option<&str>,
        rules: &Resolved,
        req: &SandboxRequest,
    ) -> Result<(), Refused> {
        let Some(TierChoice::Tier(t)) = req.tier else {
            return Ok(());
        };
        if rules.tiers.contains(&t) && !self.available.contains(&t) {
            return Err(self.unavailable(t));
        }
        if tenant.is_some() && !rules.tiers.contains(&t) {
            return Err(not_open(t, rules));
        }
        Ok(())
    }

    /// What the policy is asked, in order: the named choice, or the server's default tier
    /// where it is open and then any.
    fn choices(
        &self,
        rules: &Resolved,
        req: &SandboxRequest,
        open: &BTreeSet<Tier>,
    ) -> Result<Vec<TierChoice>, Refused> {
        let default = self.settings.default_tier;
        Ok(match req.tier {
            Some(c) => vec![c],
            // Nothing named: the server's default tier where the policy allows it.
            None if open.contains(&default) => vec![TierChoice::Tier(default), TierChoice::Auto],
            // Nothing named, nothing open, and the default tier would have been: why it
            // cannot run here says more than that no tier is available.
            None if open.is_empty() && rules.tiers.contains(&default) => {
                return Err(self.unavailable(default));
            }
            None => vec![TierChoice::Auto],
        })
    }
}

/// The policy asked each choice in turn: the first decision, or the last refusal; either is
/// recorded.
fn ask_policy(
    policy: &Rules,
    mut preq: cordon_policy::Request,
    host: &cordon_policy::Host,
    choices: Vec<TierChoice>,
    record: &mut GateRecord,
) -> Result<(Tier, Option<cordon_policy::Decision>), Refused> {
    let mut last = None;
    for choice in choices {
        preq.tier = choice;
        match policy.decide(&preq, host) {
            Ok(d) => {
                let chosen = d.chosen;
                record.tier_policy = Some(PolicyOutcome::Decided(Box::new(d.clone())));
                return Ok((chosen, Some(d)));
            }
            Err(r) => last = Some(r),
        }
    }
    let Some(refusal) = last else {
        return Err(invalid("no tier to decide"));
    };
    let (rule, message, fix) = (
        GateRule::Policy(refusal.rule.clone()),
        format!(
            "refused by policy rule {}: {}",
            refusal.rule, refusal.message
        ),
        refusal.fix.clone(),
    );
    record.tier_policy = Some(PolicyOutcome::Refused(refusal));
    Err((DenyCode::PolicyDenied, rule, message, fix))
}

/// What the gate decided of an allowed request, before it becomes an [`Admission`].
struct Decided {
    spec: SandboxSpec,
    life: Lifetime,
    decision: Option<cordon_policy::Decision>,
}

/// A sandbox's lifetime: its ttl and idle timeout.
struct Lifetime {
    ttl: Duration,
    idle: Duration,
}

/// How a request's tier is placed (see [`Gate::placement`]).
enum Placement {
    /// The operator's request, outside the policy.
    Named(Tier),
    Policy {
        trust: Trust,
        autonomy: Autonomy,
    },
}

/// The ceiling's rules a request meets before anything is looked up: inline grants are the
/// local operator's only, trust may be lowered and never raised, and only the weakened walls
/// the operator lets this principal agree to.
fn check_request_ceiling(
    tenant: Option<&str>,
    rules: &Resolved,
    req: &SandboxRequest,
) -> Result<(), Refused> {
    if tenant.is_some() && !req.inline_grants.is_empty() {
        return Err(deny(
            GateRule::CeilingGrants,
            "only the local operator gives grants inline",
            "name a grant of the server's catalogue instead",
        ));
    }
    if tenant.is_some() && rules.trust == Trust::Untrusted && req.trust == Some(Trust::Trusted) {
        return Err(deny(
            GateRule::CeilingTrust,
            "the operator runs your code as untrusted; a request cannot raise its own trust",
            "leave trust out (or say untrusted); ask the operator to set trust = \"trusted\" for your tenant",
        ));
    }
    if let Some(w) = req
        .allow_weaker
        .iter()
        .find(|w| !rules.allow_weaker.contains(w))
    {
        return Err(deny(
            GateRule::CeilingAllowWeaker,
            format!("running without {w} is not open to you"),
            "leave allow_weaker out (the run fails closed where a wall cannot be applied), or ask the operator",
        ));
    }
    Ok(())
}

/// Egress: every allow and deny entry parses, and every allow entry sits within the ceiling.
/// The one place a request's entries are read as text: the policy they make goes inward
/// typed (to the tier policy, the spec and the egress proxy).
fn check_egress(rules: &Resolved, req: &SandboxRequest) -> Result<EgressPolicy, Refused> {
    let parse = |entries: &[String]| {
        cordon_core::egress::parse_patterns(entries).map_err(|e| invalid(e.to_string()))
    };
    let egress = EgressPolicy {
        allow: parse(&req.allow_hosts)?,
        deny: parse(&req.deny_hosts)?,
    };
    for p in &egress.allow {
        if let Err(why) = rules.egress.check(p) {
            return Err(deny(
                GateRule::CeilingEgress,
                why,
                "allow only public names and addresses, or ask the operator to add the range to your egress ceiling",
            ));
        }
    }
    Ok(egress)
}

/// The request's volumes onto the spec, where its tier mounts any.
fn mount_volumes(req: &SandboxRequest, spec: &mut SandboxSpec) -> Result<(), Refused> {
    if !req.volumes.is_empty() && !spec.tier.features().volumes {
        return Err(deny(
            GateRule::VolumeTier,
            format!("the {} tier mounts no volumes", spec.tier),
            format!(
                "{}, or leave the volumes out",
                cordon_core::Feature::Volumes.fix()
            ),
        ));
    }
    for v in &req.volumes {
        spec.volumes.push(
            cordon_core::VolumeMount::new(&v.name, &v.path, v.read_only)
                .map_err(|e| invalid(e.to_string()))?,
        );
    }
    Ok(())
}

/// A tier the principal's ceiling does not open.
fn not_open(tier: Tier, rules: &Resolved) -> Refused {
    deny(
        GateRule::CeilingTiers,
        format!(
            "the {tier} tier is not open to you (yours: {})",
            names(&rules.tiers)
        ),
        "ask for one of your tiers, or leave the tier out and let the policy choose",
    )
}

/// The autonomy of a request that gives none: network work when it reaches anything; a
/// named tier is checked as compute work (the trust rules still decide which walls it may
/// have); a request that names no tier is placed as the work it runs: a one-shot snippet
/// of Python or JavaScript is computation, anything else (a shell, a program, a sandbox
/// for later execs and files) writes files, so it gets a general-purpose tier.
fn derived_autonomy(req: &SandboxRequest, network: bool) -> Autonomy {
    if network {
        return Autonomy::Internet;
    }
    if matches!(req.tier, Some(TierChoice::Tier(_))) {
        return Autonomy::Compute;
    }
    match req.workload {
        Workload::PureCode => Autonomy::Compute,
        Workload::Session | Workload::Program => Autonomy::WriteFiles,
    }
}

/// What a one-shot command is, for [`SandboxRequest::workload`].
pub fn workload_of(command: &Command, has_files: bool) -> Workload {
    match command {
        Command::Code { language, .. }
            if !has_files && matches!(language, Language::Python | Language::Javascript) =>
        {
            Workload::PureCode
        }
        Command::Wasm { .. } if !has_files => Workload::PureCode,
        _ => Workload::Program,
    }
}

type Refused = (DenyCode, GateRule, String, String);

fn deny(rule: GateRule, message: impl Into<String>, fix: impl Into<String>) -> Refused {
    (DenyCode::PolicyDenied, rule, message.into(), fix.into())
}

fn invalid(message: impl Into<String>) -> Refused {
    (
        DenyCode::InvalidRequest,
        GateRule::Request,
        message.into(),
        "fix the request; docs/openapi.json describes every field".to_string(),
    )
}

fn names(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|t| t.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
