//! Which rule decided: a rule of the policy file by its name, or one of the decider's own.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The rule that refused a request (or applied to it). On the wire and in audit rows it is
/// the rule's name as before: a policy file rule's own name, `tier-available`, `policy`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RuleId {
    /// A rule of the policy file, by its `name`.
    Named(String),
    /// The tiers the rules allow are not available on this host (`tier-available`).
    TierAvailable,
    /// The rules allow no tier at all and no one rule took every tier away (`policy`).
    Policy,
}

impl RuleId {
    /// The names of the decider's own rules, which a policy file's rule may not take.
    pub const RESERVED: [&'static str; 2] = ["tier-available", "policy"];

    /// The name as written on the wire and in audit rows.
    pub fn as_str(&self) -> &str {
        match self {
            RuleId::Named(n) => n,
            RuleId::TierAvailable => "tier-available",
            RuleId::Policy => "policy",
        }
    }
}

impl From<String> for RuleId {
    fn from(s: String) -> Self {
        match s.as_str() {
            "tier-available" => RuleId::TierAvailable,
            "policy" => RuleId::Policy,
            _ => RuleId::Named(s),
        }
    }
}

impl From<RuleId> for String {
    fn from(r: RuleId) -> Self {
        match r {
            RuleId::Named(n) => n,
            other => other.as_str().to_string(),
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_on_the_wire_are_unchanged() {
        for (r, s) in [
            (RuleId::TierAvailable, "\"tier-available\""),
            (RuleId::Policy, "\"policy\""),
            (
                RuleId::Named("network-needs-allow-list".into()),
                "\"network-needs-allow-list\"",
            ),
        ] {
            assert_eq!(serde_json::to_string(&r).unwrap(), s);
            assert_eq!(serde_json::from_str::<RuleId>(s).unwrap(), r);
        }
        for name in RuleId::RESERVED {
            assert!(!matches!(RuleId::from(name.to_string()), RuleId::Named(_)));
        }
    }
}
