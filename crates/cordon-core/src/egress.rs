//! Egress host patterns and request hosts: the typed form of an allow, deny or grant host
//! entry, parsed once where it enters (a request's check at the gate, a config or spec
//! deserialized) and handed inward typed, so no inner layer reads entry text again.
//!
//! Syntax of an entry (allow, deny, grant host, HTTP rule host), case-insensitive:
//! - `api.example.com` exact name, `*.example.com` any name strictly under it, `*` any name;
//! - optional `:port` (`:443`) or `:*` (any port). Without a port an allow entry permits
//!   ports 80 and 443 only;
//! - an IP literal or CIDR (`10.0.0.0/8`, `10.1.2.3:8080`, `[fd00::/8]:443`, `::1`). A CIDR
//!   allow entry is the only way to let the proxy connect into a non-public range.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// An allow or deny entry, or a grant host, that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "egress rule {entry:?} is not valid: {reason}; write `host`, `*.suffix`, `host:port`, `host:*`, a CIDR like `10.0.0.0/8` or `[fd00::/8]:443`"
)]
pub struct PatternError {
    /// The entry as given.
    pub entry: String,
    /// Why it was refused.
    pub reason: String,
}

/// Ports an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// `:*`
    Any,
    /// No port given: 80 and 443 for allow entries, every port for deny entries and grants.
    Default,
    /// `:N`
    One(u16),
}

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// `*`
    AnyName,
    /// `api.example.com`
    Exact(String),
    /// `*.example.com`, stored as `.example.com`
    Suffix(String),
    /// An IP literal or CIDR.
    Net(IpNet),
}

/// A normalized request host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lowercase, no trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

impl Host {
    /// Parses and normalizes a host as it appears in a request (URI authority or CONNECT
    /// target, brackets allowed around IPv6). Refuses anything that is neither a strict IP
    /// literal nor a plausible DNS name, including numeric forms like `127.1` or
    /// `2130706433` that some resolvers would read as addresses.
    pub fn parse(raw: &str) -> Result<Host, String> {
        let raw = raw.trim();
        if let Some(inner) = raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return inner
                .parse::<std::net::Ipv6Addr>()
                .map(|v6| Host::Ip(IpAddr::V6(v6)))
                .map_err(|_| format!("{raw:?} is not an IPv6 literal"));
        }
        if let Ok(ip) = raw.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
        validate_dns_name(&name)?;
        Ok(Host::Name(name))
    }

    /// The name to send as TLS SNI / to verify against.
    pub fn server_name(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

fn validate_dns_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty host".into());
    }
    if name.len() > 253 {
        return Err("host longer than 253 bytes".into());
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("host {name:?} has an empty or over-long label"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "host {name:?} has characters outside a-z 0-9 - _ (send IDNs as punycode)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "host {name:?} has a label starting or ending with '-'"
            ));
        }
        last = label;
    }
    // A name whose last label is numeric (or hex) is an address in disguise: `127.1`,
    // `0x7f.1`, `2130706433`. Real top-level domains are never numeric.
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.len() > 2
            && last[..2].eq_ignore_ascii_case("0x")
            && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(format!(
            "host {name:?} looks like a numeric address but is not a plain IP literal"
        ));
    }
    Ok(())
}

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The entry as written (normalized to lowercase), used to name the rule in refusals.
    pub text: String,
    /// What hosts it matches.
    pub host: HostMatch,
    /// What ports it matches.
    pub ports: Ports,
}

impl Pattern {
    /// Parses one entry; see the module docs for the syntax. The one place an entry's text
    /// is read: every door deserializes (or parses) entries into patterns once.
    pub fn parse(entry: &str) -> Result<Pattern, PatternError> {
        let bad = |reason: &str| PatternError {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let text = entry.trim().to_ascii_lowercase();
        if text.is_empty() {
            return Err(bad("empty entry"));
        }
        // Bare IPv6 literal or CIDR without brackets: no port possible.
        if text.contains("::") || text.matches(':').count() > 1 {
            if text.starts_with('[') {
                let close = text.find(']').ok_or_else(|| bad("unclosed '['"))?;
                let inner = &text[1..close];
                let rest = &text[close + 1..];
                let net = parse_net(inner).ok_or_else(|| bad("not an IPv6 address or CIDR"))?;
                let ports = match rest {
                    "" => Ports::Default,
                    r => parse_port(r.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?)
                        .map_err(|e| bad(&e))?,
                };
                return Ok(Pattern {
                    text,
                    host: HostMatch::Net(net),
                    ports,
                });
            }
            let net = parse_net(&text).ok_or_else(|| {
                bad("not an IPv6 address or CIDR; put IPv6 in brackets to give a port")
            })?;
            return Ok(Pattern {
                text,
                host: HostMatch::Net(net),
                ports: Ports::Default,
            });
        }
        let (host, ports) = match text.rsplit_once(':') {
            Some((h, p)) => (h, parse_port(p).map_err(|e| bad(&e))?),
            None => (text.as_str(), Ports::Default),
        };
        if host.is_empty() {
            return Err(bad("no host before the port"));
        }
        if let Some(net) = parse_net(host) {
            return Ok(Pattern {
                text: text.clone(),
                host: HostMatch::Net(net),
                ports,
            });
        }
        if host.contains('/') {
            return Err(bad("not a valid CIDR"));
        }
        let hm = if host == "*" {
            HostMatch::AnyName
        } else if let Some(suffix) = host.strip_prefix("*.") {
            validate_dns_name(suffix).map_err(|e| bad(&e))?;
            HostMatch::Suffix(format!(".{suffix}"))
        } else {
            if host.contains('*') {
                return Err(bad("'*' is only allowed as `*` or a leading `*.`"));
            }
            let name = host.strip_suffix('.').unwrap_or(host);
            validate_dns_name(name).map_err(|e| bad(&e))?;
            HostMatch::Exact(name.to_string())
        };
        Ok(Pattern {
            text,
            host: hm,
            ports,
        })
    }

    /// True if the host part matches `host` (ports not considered).
    pub fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostMatch::AnyName, Host::Name(_)) => true,
            (HostMatch::Exact(e), Host::Name(n)) => e == n,
            (HostMatch::Suffix(s), Host::Name(n)) => n.len() > s.len() && n.ends_with(s.as_str()),
            (HostMatch::Net(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }

    /// True if `port` matches, where `default` are the ports an entry without a port means.
    pub fn matches_port(&self, port: u16, default: &[u16]) -> bool {
        match self.ports {
            Ports::Any => true,
            Ports::One(p) => p == port,
            Ports::Default => default.is_empty() || default.contains(&port),
        }
    }

    /// True if this is a CIDR entry containing `ip` with a matching port.
    pub fn net_contains(&self, ip: IpAddr, port: u16, default: &[u16]) -> bool {
        matches!(&self.host, HostMatch::Net(net) if net.contains(&ip))
            && self.matches_port(port, default)
    }
}

fn parse_port(p: &str) -> Result<Ports, String> {
    if p == "*" {
        return Ok(Ports::Any);
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("port {p:?} is not 1-65535 or *")),
        Ok(n) => Ok(Ports::One(n)),
    }
}

fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(net) = s.parse::<IpNet>() {
        return Some(net.trunc());
    }
    s.parse::<IpAddr>().ok().map(IpNet::from)
}

impl Pattern {
    /// `*`: any name (not an IP literal), ports 80 and 443 in an allow list, every port in
    /// a ceiling.
    pub fn any_name() -> Pattern {
        Pattern {
            text: "*".to_string(),
            host: HostMatch::AnyName,
            ports: Ports::Default,
        }
    }
}

impl fmt::Display for Pattern {
    /// The entry as written (lowercase): what it serializes to and how refusals name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Pattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::parse(s)
    }
}

impl TryFrom<String> for Pattern {
    type Error = PatternError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Pattern::parse(&s)
    }
}

impl From<Pattern> for String {
    fn from(p: Pattern) -> Self {
        p.text
    }
}

impl Serialize for Pattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Pattern::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Pattern {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "String".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(g)
    }
}

/// Parses entries, all or none: a typo must not widen or silently narrow a policy.
pub fn parse_patterns<S: AsRef<str>>(entries: &[S]) -> Result<Vec<Pattern>, PatternError> {
    entries.iter().map(|e| Pattern::parse(e.as_ref())).collect()
}

/// The entries as written.
pub fn pattern_texts(patterns: &[Pattern]) -> Vec<String> {
    patterns.iter().map(|p| p.text.clone()).collect()
}
