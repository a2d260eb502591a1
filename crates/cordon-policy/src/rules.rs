//! Loading the rules, checking their examples, and deciding.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cordon_core::Tier;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::{Autonomy, Request, Shape, TierChoice, Trust};
use crate::rule_id::RuleId;

/// The rules Cordon ships with.
pub const DEFAULT_RULES: &str = include_str!("../rules/default.toml");

/// The schema version this build reads.
const SCHEMA_VERSION: u32 = 1;

/// Why a set of rules did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the policy file does not parse: {0} (see docs/policy.md for the format)")]
    Parse(String),
    #[error(
        "the policy file has schema version {0}; this build of cordon reads version {SCHEMA_VERSION}"
    )]
    Version(u32),
    #[error("the policy's `{what}` must list every tier exactly once ({detail})")]
    Order { what: String, detail: String },
    #[error("two rules are named {0:?}; rule names must be unique")]
    Duplicate(String),
    #[error("rule {rule:?}: {detail}")]
    Rule { rule: String, detail: String },
    #[error("rule {rule:?}, example {index}: {detail}; fix the rule or its example")]
    Example {
        rule: String,
        index: usize,
        detail: String,
    },
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Matcher {
    trust: Option<Vec<Trust>>,
    autonomy: Option<Vec<Autonomy>>,
    shape: Option<Vec<Shape>>,
}

impl Matcher {
    fn matches(&self, r: &Request) -> bool {
        fn one<T: PartialEq>(list: &Option<Vec<T>>, v: &T) -> bool {
            list.as_ref().is_none_or(|l| l.contains(v))
        }
        one(&self.trust, &r.trust) && one(&self.autonomy, &r.autonomy) && one(&self.shape, &r.shape)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Example {
    trust: Trust,
    autonomy: Autonomy,
    #[serde(default)]
    shape: Option<Shape>,
    #[serde(default)]
    allow_hosts: Vec<cordon_core::Pattern>,
    #[serde(default)]
    tier: Option<TierChoice>,
    /// Whether the rule applies to this request.
    applies: Option<bool>,
    allowed: Option<Vec<Tier>>,
    minimum: Option<Tier>,
    chosen: Option<Tier>,
    /// The request is refused, naming this rule.
    refused_by: Option<RuleId>,
}

// No field can grant anything beyond tiers: with `deny_unknown_fields`, a rule that tries to
// grant credentials (or anything else) fails to load.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    name: String,
    why: String,
    fix: String,
    #[serde(default)]
    when: Matcher,
    #[serde(default)]
    unless: Option<Matcher>,
    /// Only these tiers stay allowed.
    #[serde(default)]
    allow: Option<Vec<Tier>>,
    /// These tiers are not allowed.
    #[serde(default)]
    deny: Vec<Tier>,
    /// The request must carry an explicit egress allow-list.
    #[serde(default)]
    require_allow_list: bool,
    #[serde(default)]
    examples: Vec<Example>,
}

impl Rule {
    fn applies(&self, r: &Request) -> bool {
        self.when.matches(r) && !self.unless.as_ref().is_some_and(|u| u.matches(r))
    }

    fn removes(&self, t: Tier) -> bool {
        self.deny.contains(&t) || self.allow.as_ref().is_some_and(|a| !a.contains(&t))
    }

    fn effect(&self, r: &Request, strength: &[Tier]) -> String {
        let mut parts = Vec::new();
        let removed: Vec<&str> = strength
            .iter()
            .filter(|t| self.removes(**t))
            .map(|t| t.as_str())
            .collect();
        if !removed.is_empty() {
            parts.push(format!("rules out {}", removed.join(", ")));
        }
        if self.require_allow_list {
            parts.push(format!(
                "requires an explicit egress allow-list (given: {})",
                if r.allow_hosts.is_empty() {
                    "none".to_string()
                } else {
                    r.allow_list(", ")
                }
            ));
        }
        if parts.is_empty() {
            parts.push("no restriction".to_string());
        }
        parts.join("; ")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    version: u32,
    revision: String,
    strength: Vec<Tier>,
    auto: BTreeMap<Shape, Vec<Tier>>,
    #[serde(default)]
    rules: Vec<Rule>,
}

/// Which rules decided: audited with every decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyId {
    pub version: u32,
    pub revision: String,
    /// SHA-256 of the rules file's text.
    pub sha256: String,
}

/// A loaded, checked set of rules.
#[derive(Debug, Clone)]
pub struct Rules {
    id: PolicyId,
    strength: Vec<Tier>,
    auto: BTreeMap<Shape, Vec<Tier>>,
    rules: Vec<Rule>,
}

/// What the host offers: the tiers available here and the last bench's figures.
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub available: BTreeSet<Tier>,
    pub bench: Option<BenchFigures>,
}

impl Host {
    /// Every tier available, no bench figures (how rule examples are evaluated).
    pub fn all_available() -> Self {
        Host {
            available: Tier::ALL.into_iter().collect(),
            bench: None,
        }
    }

    pub fn with_available(tiers: impl IntoIterator<Item = Tier>) -> Self {
        Host {
            available: tiers.into_iter().collect(),
            bench: None,
        }
    }
}

/// Where `cordon bench` keeps its figures: `<data dir>/bench/last.json` (the caller reads
/// it and hands the text to [`BenchFigures::from_bench_json`]).
pub fn bench_file(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("bench").join("last.json")
}

/// Per-tier figures from `cordon bench` (median microseconds of a start + trivial exec), each
/// with when it was measured: a bench of some tiers keeps the stored figures of the others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchFigures {
    pub median_us: BTreeMap<Tier, u64>,
    /// When each figure was measured (Unix seconds), where the bench JSON says.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured_unix: BTreeMap<Tier, u64>,
}

impl BenchFigures {
    /// Reads the JSON `cordon bench` writes: `figures: [{subject, median_us, measured_unix},
    /// ...]`, where a subject named like a tier is that tier's figure. Other subjects (peers)
    /// are ignored. A row without `measured_unix` (written before rows had their own dates)
    /// is dated by the document's `created_unix`.
    ///
    /// A tier's own figure (the in-process row whose subject is the tier's name) is its
    /// figure; other rows of the tier (a whole CLI process, a template) count only when it
    /// has none, the fastest of them. Before, the fastest row of any kind won, so on a
    /// loaded host a CLI row could stand for the tier.
    pub fn from_bench_json(text: &str) -> Result<Self, String> {
        let doc = crate::bench_doc::BenchDoc::parse(text)?;
        let mut out = BenchFigures::default();
        let own = |f: &crate::bench_doc::Figure, tier: Tier| {
            f.kind == crate::bench_doc::FigureKind::Tier && f.subject == tier.as_str()
        };
        let mut owned: BTreeSet<Tier> = BTreeSet::new();
        for f in &doc.figures {
            let Some(tier) = f.tier.or_else(|| f.subject.parse::<Tier>().ok()) else {
                continue;
            };
            let is_own = own(f, tier);
            if owned.contains(&tier) && !is_own {
                continue;
            }
            if (is_own == owned.contains(&tier))
                && out
                    .median_us
                    .get(&tier)
                    .is_some_and(|old| *old <= f.median_us)
            {
                continue;
            }
            if is_own {
                owned.insert(tier);
            }
            out.median_us.insert(tier, f.median_us);
            let when = f
                .measured_unix
                .or((doc.created_unix > 0).then_some(doc.created_unix));
            match when {
                Some(w) => out.measured_unix.insert(tier, w),
                None => out.measured_unix.remove(&tier),
            };
        }
        Ok(out)
    }
}

/// One rule that applied and what it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub rule: RuleId,
    pub effect: String,
    pub why: String,
}

/// How the chosen tier was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankedBy {
    /// A tier was named.
    Requested,
    /// This host's bench figures.
    Bench,
    /// The policy's order for the shape.
    Static,
}

/// The order of the allowed, available tiers and what it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ranking {
    pub by: RankedBy,
    /// Allowed, available tiers, fastest first.
    pub order: Vec<Tier>,
    /// The bench figures used, where any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub median_us: BTreeMap<Tier, u64>,
    /// When each figure used was measured (Unix seconds), where known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured_unix: BTreeMap<Tier, u64>,
}

/// A decision: serializable so the service can audit it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub policy: PolicyId,
    pub request: Request,
    /// The weakest tier allowed.
    pub minimum: Tier,
    /// Every tier allowed, weakest first.
    pub allowed: Vec<Tier>,
    /// Allowed tiers available on this host, weakest first.
    pub available: Vec<Tier>,
    pub chosen: Tier,
    pub ranking: Ranking,
    /// Every rule that applied, in file order.
    pub reasons: Vec<Reason>,
    /// The egress allow-list the sandbox gets.
    pub egress_allow: Vec<cordon_core::Pattern>,
    /// Always false: no rule grants ambient credentials.
    pub ambient_credentials: bool,
}

/// A refused request: which rule refused it and how to fix the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("refused by policy rule {rule}: {message}; fix: {fix}")]
pub struct Refusal {
    pub policy: PolicyId,
    pub request: Request,
    pub rule: RuleId,
    pub message: String,
    pub fix: String,
    pub minimum: Option<Tier>,
    pub allowed: Vec<Tier>,
    pub reasons: Vec<Reason>,
}

fn tiers(ts: &[Tier]) -> String {
    if ts.is_empty() {
        return "none".to_string();
    }
    ts.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
}

fn check_order(what: &str, order: &[Tier]) -> Result<(), LoadError> {
    let set: BTreeSet<Tier> = order.iter().copied().collect();
    let missing: Vec<Tier> = Tier::ALL.into_iter().filter(|t| !set.contains(t)).collect();
    if !missing.is_empty() || set.len() != order.len() {
        return Err(LoadError::Order {
            what: what.to_string(),
            detail: if missing.is_empty() {
                "a tier is listed twice".to_string()
            } else {
                format!("missing: {}", tiers(&missing))
            },
        });
    }
    Ok(())
}

impl Rules {
    /// The rules Cordon ships with.
    pub fn default_rules() -> Result<Self, LoadError> {
        Rules::from_toml(DEFAULT_RULES)
    }

    /// Parses a rules file and checks every rule's examples.
    pub fn from_toml(text: &str) -> Result<Self, LoadError> {
        let file: RulesFile = toml::from_str(text).map_err(|e| LoadError::Parse(e.to_string()))?;
        if file.version != SCHEMA_VERSION {
            return Err(LoadError::Version(file.version));
        }
        check_order("strength", &file.strength)?;
        for shape in Shape::ALL {
            let order = file.auto.get(shape).ok_or_else(|| LoadError::Order {
                what: format!("auto.{shape}"),
                detail: "missing".to_string(),
            })?;
            check_order(&format!("auto.{shape}"), order)?;
        }
        let mut names = BTreeSet::new();
        for r in &file.rules {
            if !names.insert(r.name.as_str()) {
                return Err(LoadError::Duplicate(r.name.clone()));
            }
            if RuleId::RESERVED.contains(&r.name.as_str()) {
                return Err(LoadError::Rule {
                    rule: r.name.clone(),
                    detail: format!(
                        "the names {} are the decider's own; give the rule another name",
                        RuleId::RESERVED.join(", ")
                    ),
                });
            }
            if r.name.trim().is_empty() || r.why.trim().is_empty() || r.fix.trim().is_empty() {
                return Err(LoadError::Rule {
                    rule: r.name.clone(),
                    detail: "every rule needs a name, a `why` and a `fix`".to_string(),
                });
            }
            if r.examples.is_empty() {
                return Err(LoadError::Rule {
                    rule: r.name.clone(),
                    detail: "a rule needs at least one example".to_string(),
                });
            }
        }
        let rules = Rules {
            id: PolicyId {
                version: file.version,
                revision: file.revision,
                sha256: hex::encode(Sha256::digest(text.as_bytes())),
            },
            strength: file.strength,
            auto: file.auto,
            rules: file.rules,
        };
        rules.check_examples()?;
        Ok(rules)
    }

    pub fn id(&self) -> &PolicyId {
        &self.id
    }

    /// Rule names in file order.
    pub fn rule_names(&self) -> Vec<&str> {
        self.rules.iter().map(|r| r.name.as_str()).collect()
    }

    fn check_examples(&self) -> Result<(), LoadError> {
        let host = Host::all_available();
        for rule in &self.rules {
            for (i, ex) in rule.examples.iter().enumerate() {
                let fail = |detail: String| LoadError::Example {
                    rule: rule.name.clone(),
                    index: i + 1,
                    detail,
                };
                let req = Request {
                    trust: ex.trust,
                    autonomy: ex.autonomy,
                    shape: ex.shape.unwrap_or(Shape::ManyShort),
                    allow_hosts: ex.allow_hosts.clone(),
                    tier: ex.tier.unwrap_or_default(),
                };
                let what = format!(
                    "{} {} {} (tier {})",
                    req.trust, req.autonomy, req.shape, req.tier
                );
                if let Some(want) = ex.applies
                    && rule.applies(&req) != want
                {
                    return Err(fail(format!(
                        "expects the rule {} to {what}, but it {}",
                        if want { "to apply" } else { "not to apply" },
                        if want { "does not" } else { "does" }
                    )));
                }
                match (self.decide(&req, &host), &ex.refused_by) {
                    (Ok(d), None) => {
                        if let Some(a) = &ex.allowed {
                            let mut a = a.clone();
                            a.sort_by_key(|t| self.rank(*t));
                            if a != d.allowed {
                                return Err(fail(format!(
                                    "expects {what} to allow {}, the rules allow {}",
                                    tiers(&a),
                                    tiers(&d.allowed)
                                )));
                            }
                        }
                        if let Some(m) = ex.minimum
                            && m != d.minimum
                        {
                            return Err(fail(format!(
                                "expects minimum {m} for {what}, the rules give {}",
                                d.minimum
                            )));
                        }
                        if let Some(c) = ex.chosen
                            && c != d.chosen
                        {
                            return Err(fail(format!(
                                "expects {c} chosen for {what}, the rules choose {}",
                                d.chosen
                            )));
                        }
                    }
                    (Ok(d), Some(by)) => {
                        return Err(fail(format!(
                            "expects {what} refused by {by}, the rules allow it (chosen {})",
                            d.chosen
                        )));
                    }
                    (Err(r), None) => {
                        return Err(fail(format!(
                            "expects {what} to be allowed, the rules refuse it: {}",
                            r.message
                        )));
                    }
                    (Err(r), Some(by)) => {
                        if r.rule != *by {
                            return Err(fail(format!(
                                "expects {what} refused by {by}, the rules refuse it by {}",
                                r.rule
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn rank(&self, t: Tier) -> usize {
        self.strength
            .iter()
            .position(|s| *s == t)
            .unwrap_or(usize::MAX)
    }

    /// Decides a request on a host: the decision, or a refusal naming the rule and the fix.
    pub fn decide(&self, req: &Request, host: &Host) -> Result<Decision, Box<Refusal>> {
        let d = Deciding::new(self, req);
        d.check_allow_list()?;
        let minimum = d.minimum()?;
        let available: Vec<Tier> = d
            .allowed
            .iter()
            .copied()
            .filter(|t| host.available.contains(t))
            .collect();
        let (chosen, ranking) = match req.tier {
            TierChoice::Tier(t) => (
                d.requested(t, minimum, host, &available)?,
                Ranking {
                    by: RankedBy::Requested,
                    order: vec![t],
                    median_us: BTreeMap::new(),
                    measured_unix: BTreeMap::new(),
                },
            ),
            TierChoice::Auto => d.auto(host, &available)?,
        };
        Ok(Decision {
            policy: self.id.clone(),
            request: req.clone(),
            minimum,
            allowed: d.allowed,
            available,
            chosen,
            ranking,
            reasons: d.reasons,
            egress_allow: req.allow_hosts.clone(),
            ambient_credentials: false,
        })
    }

    /// Fastest first: tiers with bench figures by their median, then the rest in the
    /// policy's static order for the shape.
    fn rank_available(&self, shape: Shape, candidates: &[Tier], host: &Host) -> Ranking {
        let static_order = self.auto.get(&shape).cloned().unwrap_or_default();
        let static_pos = |t: &Tier| {
            static_order
                .iter()
                .position(|s| s == t)
                .unwrap_or(usize::MAX)
        };
        let used = |m: Option<&BTreeMap<Tier, u64>>| -> BTreeMap<Tier, u64> {
            m.map(|m| {
                m.iter()
                    .filter(|(t, _)| candidates.contains(t))
                    .map(|(t, v)| (*t, *v))
                    .collect()
            })
            .unwrap_or_default()
        };
        let figures = used(host.bench.as_ref().map(|b| &b.median_us));
        let measured_unix = used(host.bench.as_ref().map(|b| &b.measured_unix));
        let mut order = candidates.to_vec();
        order.sort_by_key(|t| match figures.get(t) {
            Some(us) => (0, *us, static_pos(t)),
            None => (1, 0, static_pos(t)),
        });
        Ranking {
            by: if figures.is_empty() {
                RankedBy::Static
            } else {
                RankedBy::Bench
            },
            order,
            median_us: figures,
            measured_unix,
        }
    }
}

/// One decision under way: the rules that apply to the request and the tiers they leave.
struct Deciding<'a> {
    rules: &'a Rules,
    req: &'a Request,
    applied: Vec<&'a Rule>,
    reasons: Vec<Reason>,
    /// Every tier no applied rule removes, weakest first.
    allowed: Vec<Tier>,
    /// `trust autonomy work`, for messages.
    work: String,
}

impl<'a> Deciding<'a> {
    fn new(rules: &'a Rules, req: &'a Request) -> Self {
        let applied: Vec<&Rule> = rules.rules.iter().filter(|r| r.applies(req)).collect();
        let reasons = applied
            .iter()
            .map(|r| Reason {
                rule: RuleId::Named(r.name.clone()),
                effect: r.effect(req, &rules.strength),
                why: r.why.clone(),
            })
            .collect();
        let allowed = rules
            .strength
            .iter()
            .copied()
            .filter(|t| !applied.iter().any(|r| r.removes(*t)))
            .collect();
        Deciding {
            rules,
            req,
            applied,
            reasons,
            allowed,
            work: format!("{} {} work", req.trust, req.autonomy),
        }
    }

    fn refuse(&self, rule: RuleId, message: String, fix: String) -> Box<Refusal> {
        Box::new(Refusal {
            policy: self.rules.id.clone(),
            request: self.req.clone(),
            rule,
            message,
            fix,
            minimum: self.allowed.first().copied(),
            allowed: self.allowed.clone(),
            reasons: self.reasons.clone(),
        })
    }

    /// A rule that requires an explicit egress allow-list refuses a request without one.
    fn check_allow_list(&self) -> Result<(), Box<Refusal>> {
        let Some(r) = self
            .applied
            .iter()
            .find(|r| r.require_allow_list && !self.req.has_explicit_allow_list())
        else {
            return Ok(());
        };
        Err(self.refuse(
            RuleId::Named(r.name.clone()),
            format!(
                "{} needs an explicit egress allow-list ({})",
                self.work,
                if self.req.allow_hosts.is_empty() {
                    "none given".to_string()
                } else {
                    format!("a wildcard is not one: {}", self.req.allow_list(", "))
                }
            ),
            r.fix.clone(),
        ))
    }

    /// The weakest tier allowed, or a refusal naming the last rule that took tiers away.
    fn minimum(&self) -> Result<Tier, Box<Refusal>> {
        if let Some(m) = self.allowed.first() {
            return Ok(*m);
        }
        let last = self
            .applied
            .iter()
            .rev()
            .find(|r| !r.deny.is_empty() || r.allow.is_some())
            .map_or(RuleId::Policy, |r| RuleId::Named(r.name.clone()));
        Err(self.refuse(
            last,
            format!("the rules allow no tier at all for {}", self.work),
            "change the request or the policy file".to_string(),
        ))
    }

    /// The tier the request names, where the rules allow it and the host has it.
    fn requested(
        &self,
        t: Tier,
        minimum: Tier,
        host: &Host,
        available: &[Tier],
    ) -> Result<Tier, Box<Refusal>> {
        let work = &self.work;
        if let Some(r) = self.applied.iter().find(|r| r.removes(t)) {
            let message = if self.rules.rank(t) < self.rules.rank(minimum) {
                format!(
                    "the {t} tier is below the minimum {minimum} for {work} ({})",
                    r.why
                )
            } else {
                format!("the {t} tier is not allowed for {work} ({})", r.why)
            };
            return Err(self.refuse(
                RuleId::Named(r.name.clone()),
                message,
                format!("{}; allowed here: {}", r.fix, tiers(&self.allowed)),
            ));
        }
        if !host.available.contains(&t) {
            return Err(self.refuse(
                RuleId::TierAvailable,
                format!("the {t} tier is allowed for {work} but not available on this host"),
                format!(
                    "see `cordon doctor` for what the {t} tier needs, or use --tier auto (allowed and available here: {})",
                    tiers(available)
                ),
            ));
        }
        Ok(t)
    }

    /// The fastest allowed tier the host has.
    fn auto(&self, host: &Host, available: &[Tier]) -> Result<(Tier, Ranking), Box<Refusal>> {
        let ranking = self.rules.rank_available(self.req.shape, available, host);
        let Some(first) = ranking.order.first().copied() else {
            let allowed = tiers(&self.allowed);
            return Err(self.refuse(
                RuleId::TierAvailable,
                format!(
                    "none of the tiers allowed for {} ({allowed}) is available on this host",
                    self.work
                ),
                format!("make one of {allowed} available (`cordon doctor` names what each needs)"),
            ));
        };
        Ok((first, ranking))
    }
}

impl fmt::Display for Decision {
    /// The human explanation `cordon policy explain` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.request;
        writeln!(
            f,
            "request: trust={} autonomy={} shape={} tier={}{}",
            r.trust,
            r.autonomy,
            r.shape,
            r.tier,
            if r.allow_hosts.is_empty() {
                String::new()
            } else {
                format!(" allow-host={}", r.allow_list(","))
            }
        )?;
        writeln!(f, "minimum tier: {}", self.minimum)?;
        writeln!(f, "allowed tiers: {}", tiers(&self.allowed))?;
        writeln!(f, "available here: {}", tiers(&self.available))?;
        let how = match self.ranking.by {
            RankedBy::Requested => "as requested".to_string(),
            RankedBy::Bench => {
                let now = cordon_core::units::unix_now();
                format!(
                    "the fastest available allowed tier by this host's bench figures ({})",
                    self.ranking
                        .order
                        .iter()
                        .map(|t| match self.ranking.median_us.get(t) {
                            Some(us) => format!(
                                "{t} {:.1} ms{}",
                                *us as f64 / 1000.0,
                                match self.ranking.measured_unix.get(t) {
                                    Some(when) => format!(
                                        " measured {}",
                                        cordon_core::units::format_age(*when, now)
                                    ),
                                    None => " measured at an unknown time".to_string(),
                                }
                            ),
                            None => format!("{t} unmeasured"),
                        })
                        .collect::<Vec<_>>()
                        .join(" < ")
                )
            }
            RankedBy::Static => format!(
                "the fastest available allowed tier by the policy's static order for {} work ({})",
                r.shape,
                self.ranking
                    .order
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(" < ")
            ),
        };
        writeln!(f, "chosen: {} ({how})", self.chosen)?;
        writeln!(f, "reasons:")?;
        for reason in &self.reasons {
            writeln!(f, "  - {}: {}", reason.rule, reason.effect)?;
            writeln!(f, "      {}", reason.why)?;
        }
        write!(
            f,
            "policy: {} (schema {}, sha256 {})",
            self.policy.revision,
            self.policy.version,
            &self.policy.sha256[..12.min(self.policy.sha256.len())]
        )
    }
}

#[cfg(test)]
mod tests;
