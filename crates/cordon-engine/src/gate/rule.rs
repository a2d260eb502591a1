//! Which rule refused a request: one of the gate's own (the operator's ceiling, the
//! request's shape, a template, a node's bundle check) or a rule of the tier policy.

use std::fmt;

use cordon_policy::RuleId;
use serde::{Deserialize, Serialize};

macro_rules! gate_rules {
    ($($(#[$m:meta])* $variant:ident = $name:literal),+ $(,)?) => {
        /// The rule that refused a request. Written (in answers, the CLI's JSON and audit
        /// rows) and read as its name, the same names as before the rules were typed.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum GateRule {
            $($(#[$m])* $variant,)+
            /// A rule of the tier policy (`untrusted-needs-kernel-boundary`,
            /// `tier-available`, ...).
            Policy(RuleId),
        }

        impl GateRule {
            /// The name as written on the wire and in audit rows.
            pub fn as_str(&self) -> &str {
                match self {
                    $(GateRule::$variant => $name,)+
                    GateRule::Policy(r) => r.as_str(),
                }
            }
        }

        impl From<String> for GateRule {
            fn from(s: String) -> Self {
                match s.as_str() {
                    $($name => GateRule::$variant,)+
                    _ => GateRule::Policy(RuleId::from(s)),
                }
            }
        }
    };
}

gate_rules! {
    /// The request is not well formed.
    Request = "request",
    /// A wall the operator does not let this principal run without.
    CeilingAllowWeaker = "ceiling.allow_weaker",
    /// An egress entry outside the principal's egress ceiling.
    CeilingEgress = "ceiling.egress",
    /// A grant asked for longer than the catalogue lets it live.
    CeilingGrantLifetime = "ceiling.grant_lifetime",
    /// A grant not open to the principal, or given inline by a tenant.
    CeilingGrants = "ceiling.grants",
    /// A grant of the catalogue whose secret cannot be had now.
    GrantUnavailable = "grant-unavailable",
    /// A limit over the server's maxima.
    CeilingMaxLimits = "ceiling.max_limits",
    /// The runtime tier's heap over what the operator allows.
    CeilingRuntimeHeap = "ceiling.runtime_heap",
    /// A tier not open to the principal.
    CeilingTiers = "ceiling.tiers",
    /// A request raising its own trust.
    CeilingTrust = "ceiling.trust",
    /// A lifetime over the server's maximum.
    CeilingTtl = "ceiling.ttl",
    /// A template that is not there or not usable.
    Template = "template",
    /// A template that does not serve the tier.
    TemplateTier = "template-tier",
    /// Network asked of a tier that has none.
    TierNetwork = "tier-network",
    /// Volumes asked of a tier that mounts none.
    VolumeTier = "volume-tier",
    /// A container bundle's own refusal (privileged mode, a host namespace, a device).
    OciBundle = "oci.bundle",
}

impl GateRule {
    /// The tier (allowed or named) is not available on this host.
    pub const TIER_AVAILABLE: GateRule = GateRule::Policy(RuleId::TierAvailable);
}

impl From<RuleId> for GateRule {
    fn from(r: RuleId) -> Self {
        GateRule::Policy(r)
    }
}

impl From<GateRule> for String {
    fn from(r: GateRule) -> Self {
        match r {
            GateRule::Policy(p) => p.into(),
            other => other.as_str().to_string(),
        }
    }
}

impl fmt::Display for GateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_reads_back_as_itself() {
        for r in [
            GateRule::Request,
            GateRule::CeilingEgress,
            GateRule::CeilingTiers,
            GateRule::OciBundle,
            GateRule::TemplateTier,
            GateRule::TIER_AVAILABLE,
            GateRule::Policy(RuleId::Policy),
            GateRule::Policy(RuleId::Named("network-needs-allow-list".into())),
        ] {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("{:?}", r.as_str()));
            assert_eq!(serde_json::from_str::<GateRule>(&json).unwrap(), r);
        }
        assert_eq!(GateRule::CeilingEgress.to_string(), "ceiling.egress");
        assert_eq!(GateRule::TIER_AVAILABLE.to_string(), "tier-available");
    }
}
