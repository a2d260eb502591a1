//! The inputs of a decision.

use std::fmt;
use std::str::FromStr;

use cordon_core::Tier;
use cordon_core::egress::{HostMatch, Pattern, pattern_texts};
use serde::{Deserialize, Serialize};

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($(#[$vm:meta])* $variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $s),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| {
                        let names: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                        format!(concat!("unknown ", $what, " {:?}; choose one of {}"), s, names.join(", "))
                    })
            }
        }
    };
}

named_enum!(
    /// Where the code's inputs come from.
    Trust, "trust", {
        /// Inputs you control.
        Trusted = "trusted",
        /// Downstream of text an outsider could write: public repos, issues, scraped pages,
        /// user submissions.
        Untrusted = "untrusted",
    }
);

named_enum!(
    /// What the code needs to do; each level includes the ones before it.
    Autonomy, "autonomy", {
        Compute = "compute",
        ReadFiles = "read-files",
        WriteFiles = "write-files",
        InstallPackages = "install-packages",
        Internet = "internet",
    }
);

named_enum!(
    /// The shape of the workload.
    Shape, "shape", {
        /// Many short executions (an agent loop): start cost dominates.
        ManyShort = "many-short",
        /// One long run: start cost is amortized.
        OneLong = "one-long",
    }
);

/// A requested tier: `auto` (the policy picks) or one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierChoice {
    #[default]
    Auto,
    Tier(Tier),
}

impl fmt::Display for TierChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierChoice::Auto => f.write_str("auto"),
            TierChoice::Tier(t) => write!(f, "{t}"),
        }
    }
}

impl FromStr for TierChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(TierChoice::Auto);
        }
        s.parse::<Tier>()
            .map(TierChoice::Tier)
            .map_err(|e| format!("{e}, or auto"))
    }
}

impl Serialize for TierChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for TierChoice {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TierChoice".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut names = vec!["auto"];
        names.extend(Tier::ALL.iter().map(|t| t.as_str()));
        schemars::json_schema!({
            "description": "A tier, or auto (the policy picks from trust and autonomy).",
            "type": "string",
            "enum": names
        })
    }
}

impl<'de> Deserialize<'de> for TierChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn default_shape() -> Shape {
    Shape::ManyShort
}

/// One request to decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub trust: Trust,
    pub autonomy: Autonomy,
    #[serde(default = "default_shape")]
    pub shape: Shape,
    /// The egress allow-list the request carries (`--allow-host`).
    #[serde(default)]
    pub allow_hosts: Vec<Pattern>,
    #[serde(default)]
    pub tier: TierChoice,
}

impl Request {
    pub fn new(trust: Trust, autonomy: Autonomy) -> Self {
        Request {
            trust,
            autonomy,
            shape: Shape::ManyShort,
            allow_hosts: Vec::new(),
            tier: TierChoice::Auto,
        }
    }

    /// True when the allow-list names hosts: non-empty, and no entry is a bare wildcard
    /// (`*`, `*:443`, `*:*`). Suffix patterns like `*.example.com` name hosts.
    pub fn has_explicit_allow_list(&self) -> bool {
        !self.allow_hosts.is_empty()
            && (self.allow_hosts.iter()).all(|h| !matches!(h.host, HostMatch::AnyName))
    }

    /// The allow-list as written, `sep` between entries.
    pub fn allow_list(&self, sep: &str) -> String {
        pattern_texts(&self.allow_hosts).join(sep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::egress::parse_patterns;

    #[test]
    fn names_round_trip() {
        for a in Autonomy::ALL {
            assert_eq!(a.as_str().parse::<Autonomy>(), Ok(*a));
        }
        assert_eq!("one-long".parse::<Shape>(), Ok(Shape::OneLong));
        assert!("root".parse::<Trust>().is_err());
        assert_eq!("auto".parse::<TierChoice>(), Ok(TierChoice::Auto));
        assert_eq!(
            "gvisor".parse::<TierChoice>(),
            Ok(TierChoice::Tier(Tier::Gvisor))
        );
        assert!("vm".parse::<TierChoice>().is_err());
    }

    #[test]
    fn explicit_allow_lists() {
        let mut r = Request::new(Trust::Trusted, Autonomy::Internet);
        assert!(!r.has_explicit_allow_list());
        r.allow_hosts = parse_patterns(&["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(r.has_explicit_allow_list());
        for bad in ["*", "*:*", "*:443"] {
            r.allow_hosts = parse_patterns(&["pypi.org", bad]).unwrap_or_else(|e| panic!("{e}"));
            assert!(!r.has_explicit_allow_list(), "{bad}");
        }
    }
}
