//! Host patterns, the per-sandbox allow/deny policy and its decisions.
//!
//! Syntax of an entry (allow, deny, grant host, HTTP rule host), case-insensitive:
//! - `api.example.com` exact name, `*.example.com` any name strictly under it, `*` any name;
//! - optional `:port` (`:443`) or `:*` (any port). Without a port an allow entry permits
//!   ports 80 and 443 only;
//! - an IP literal or CIDR (`10.0.0.0/8`, `10.1.2.3:8080`, `[fd00::/8]:443`, `::1`). A CIDR
//!   allow entry is the only way to let the proxy connect into a non-public range.

use std::net::IpAddr;

pub use cordon_core::egress::{Host, HostMatch, Pattern, PatternError, Ports};

use crate::guard;

/// Ports an allow entry without a port permits.
pub const DEFAULT_ALLOW_PORTS: [u16; 2] = [80, 443];

/// A refusal: the rule that refused and a sentence for the 403 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The refusing rule, e.g. `deny *.evil.test`, `default-deny`, `address-guard:loopback`.
    pub rule: String,
    /// What happened, for humans.
    pub reason: String,
}

impl Refusal {
    pub(crate) fn new(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Refusal {
            rule: rule.into(),
            reason: reason.into(),
        }
    }
}

/// The compiled allow/deny policy of one sandbox.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
    /// Hosts granted by a grant or an HTTP rule: implicitly allowed on 443.
    implicit: Vec<(Pattern, String)>,
}

impl Policy {
    /// The policy of allow and deny entries (parsed where they entered, so every one is
    /// valid: a typo never reaches here to widen or silently narrow the policy).
    pub fn new(allow: &[Pattern], deny: &[Pattern]) -> Policy {
        Policy {
            allow: allow.to_vec(),
            deny: deny.to_vec(),
            implicit: Vec::new(),
        }
    }

    /// Adds a host that a grant or HTTP rule names; it is allowed on port 443 (or the port
    /// the pattern names) unless denied.
    pub(crate) fn add_implicit(&mut self, pattern: Pattern, why: String) {
        self.implicit.push((pattern, why));
    }

    /// Decides whether `host:port` may be requested. Deny entries win over everything.
    /// Returns the allowing rule's text.
    pub fn check_host(&self, host: &Host, port: u16) -> std::result::Result<String, Refusal> {
        for d in &self.deny {
            if d.matches_host(host) && d.matches_port(port, &[]) {
                return Err(Refusal::new(
                    format!("deny {}", d.text),
                    format!("{host}:{port} matches the deny entry {:?}", d.text),
                ));
            }
        }
        for a in &self.allow {
            if a.matches_host(host) && a.matches_port(port, &DEFAULT_ALLOW_PORTS) {
                return Ok(format!("allow {}", a.text));
            }
        }
        for (p, why) in &self.implicit {
            if p.matches_host(host) && p.matches_port(port, &[443]) {
                return Ok(why.clone());
            }
        }
        let near = self
            .allow
            .iter()
            .chain(self.implicit.iter().map(|(p, _)| p))
            .any(|a| a.matches_host(host));
        let reason = if near {
            format!("{host} is allowed, but not on port {port}")
        } else {
            format!("{host}:{port} is not in this sandbox's egress allow list")
        };
        Err(Refusal::new("default-deny", reason))
    }

    /// Decides whether the proxy may connect to `ip:port` (a resolved or literal address).
    /// Deny CIDRs win; non-public addresses need an allow entry whose CIDR contains them.
    pub fn check_addr(&self, ip: IpAddr, port: u16) -> std::result::Result<(), Refusal> {
        for d in &self.deny {
            if d.net_contains(ip, port, &[]) {
                return Err(Refusal::new(
                    format!("deny {}", d.text),
                    format!("address {ip} matches the deny entry {:?}", d.text),
                ));
            }
        }
        if let Some(class) = guard::classify(ip) {
            let explicit = self
                .allow
                .iter()
                .any(|a| a.net_contains(ip, port, &DEFAULT_ALLOW_PORTS));
            if !explicit {
                return Err(Refusal::new(
                    format!("address-guard:{}", class.as_str()),
                    format!(
                        "address {ip} is {} and no allow entry names its range explicitly",
                        class.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// True if nothing at all is allowed.
    pub fn is_closed(&self) -> bool {
        self.allow.is_empty() && self.implicit.is_empty()
    }
}

/// Path check shared by grants and HTTP rules: refuses dot segments and encoded separators
/// that an upstream might normalize differently from a plain prefix comparison.
/// A path the proxy can compare as text without being fooled by how an upstream reads it:
/// absolute, no `.`/`..` segments, no backslash, no encoded dot, slash, backslash or NUL,
/// and no `;` path parameters (`/allowed/..;/other` is `..` to some servers).
pub(crate) fn path_is_canonical(path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\\') || path.contains(';') {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || lower.contains("%00")
    {
        return false;
    }
    !path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Segment-aware prefix match: `/repos/me` matches `/repos/me` and `/repos/me/x`, not
/// `/repos/meanie`. A prefix ending in `/` matches anything under it.
pub(crate) fn path_has_prefix(path: &str, prefix: &str) -> bool {
    if prefix.is_empty() || prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    fn pol(allow: &[&str], deny: &[&str]) -> Policy {
        let parse = cordon_core::egress::parse_patterns;
        Policy::new(&parse(allow).unwrap(), &parse(deny).unwrap())
    }

    #[test]
    fn patterns_parse() {
        let p = Pattern::parse("API.Example.com").unwrap();
        assert_eq!(p.host, HostMatch::Exact("api.example.com".into()));
        assert_eq!(p.ports, Ports::Default);
        let p = Pattern::parse("*.files.example.test:443").unwrap();
        assert_eq!(p.host, HostMatch::Suffix(".files.example.test".into()));
        assert_eq!(p.ports, Ports::One(443));
        assert_eq!(Pattern::parse("x.test:*").unwrap().ports, Ports::Any);
        assert!(matches!(
            Pattern::parse("10.0.0.0/8").unwrap().host,
            HostMatch::Net(_)
        ));
        assert_eq!(
            Pattern::parse("10.1.2.3:8080").unwrap().ports,
            Ports::One(8080)
        );
        assert_eq!(
            Pattern::parse("[fd00::/8]:443").unwrap().ports,
            Ports::One(443)
        );
        assert!(matches!(
            Pattern::parse("::1").unwrap().host,
            HostMatch::Net(_)
        ));
        for bad in [
            "",
            "a.*.com",
            "*foo.com",
            "x.test:0",
            "x.test:99999",
            "x.test:http",
            "bad host",
            "10.0.0.0/33",
            "[fd00::/8",
            "127.1",
            "2130706433",
            "0x7f.1",
            ":80",
            "ex ample.com",
            "-a.com",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn hosts_normalize_and_refuse_disguised_addresses() {
        assert_eq!(h("Example.COM."), Host::Name("example.com".into()));
        assert_eq!(h("[::1]"), Host::Ip("::1".parse().unwrap()));
        assert_eq!(h("127.0.0.1"), Host::Ip("127.0.0.1".parse().unwrap()));
        for bad in [
            "127.1",
            "2130706433",
            "0x7f000001",
            "0x7f.0.0.1",
            "017700000001",
            "a..b",
            "",
            "exa%6dple.com",
            "évil.com",
            "a b",
            "[127.0.0.1]",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn allow_exact_suffix_and_ports() {
        let p = pol(
            &["api.example.test", "*.files.example.test:443", "any.test:*"],
            &[],
        );
        assert!(p.check_host(&h("api.example.test"), 443).is_ok());
        assert!(p.check_host(&h("api.example.test"), 80).is_ok());
        let r = p.check_host(&h("api.example.test"), 8080).unwrap_err();
        assert_eq!(r.rule, "default-deny");
        assert!(r.reason.contains("not on port 8080"));
        assert!(p.check_host(&h("a.files.example.test"), 443).is_ok());
        assert!(p.check_host(&h("a.b.files.example.test"), 443).is_ok());
        assert!(p.check_host(&h("a.files.example.test"), 80).is_err());
        // the suffix pattern does not match the apex or look-alikes
        assert!(p.check_host(&h("files.example.test"), 443).is_err());
        assert!(p.check_host(&h("evilfiles.example.test"), 443).is_err());
        assert!(p.check_host(&h("api.example.test.evil.test"), 443).is_err());
        assert!(p.check_host(&h("any.test"), 5432).is_ok());
        assert_eq!(
            p.check_host(&h("other.test"), 443).unwrap_err().rule,
            "default-deny"
        );
    }

    #[test]
    fn deny_wins() {
        let p = pol(
            &["*.example.test:*"],
            &["secret.example.test", "*.x.example.test:22"],
        );
        let r = p.check_host(&h("secret.example.test"), 443).unwrap_err();
        assert_eq!(r.rule, "deny secret.example.test");
        assert!(p.check_host(&h("a.x.example.test"), 22).is_err());
        assert!(p.check_host(&h("a.x.example.test"), 443).is_ok());
    }

    #[test]
    fn empty_policy_refuses_everything() {
        let p = pol(&[], &[]);
        assert!(p.is_closed());
        assert!(p.check_host(&h("example.com"), 443).is_err());
        assert!(p.check_host(&h("8.8.8.8"), 443).is_err());
    }

    #[test]
    fn address_guard_needs_explicit_cidr() {
        let p = pol(&["api.test:*"], &[]);
        let r = p.check_addr("127.0.0.1".parse().unwrap(), 80).unwrap_err();
        assert_eq!(r.rule, "address-guard:loopback");
        let r = p
            .check_addr("169.254.169.254".parse().unwrap(), 80)
            .unwrap_err();
        assert_eq!(r.rule, "address-guard:link-local");
        assert!(
            p.check_addr("::ffff:127.0.0.1".parse().unwrap(), 80)
                .is_err()
        );
        assert!(p.check_addr("93.184.216.34".parse().unwrap(), 443).is_ok());

        let p = pol(&["api.test:*", "127.0.0.1/32:*"], &[]);
        assert!(p.check_addr("127.0.0.1".parse().unwrap(), 8080).is_ok());
        assert!(p.check_addr("127.0.0.2".parse().unwrap(), 8080).is_err());

        // CIDR allow with a port only opens that port
        let p = pol(&["10.0.0.0/8:5432"], &[]);
        assert!(p.check_addr("10.1.1.1".parse().unwrap(), 5432).is_ok());
        assert!(p.check_addr("10.1.1.1".parse().unwrap(), 22).is_err());
        // an IP literal host matches the CIDR entry as a host rule too
        assert!(p.check_host(&h("10.1.1.1"), 5432).is_ok());
        assert!(p.check_host(&h("10.1.1.1"), 80).is_err());

        // deny CIDR wins over an explicit allow
        let p = pol(&["10.0.0.0/8:*"], &["10.9.0.0/16"]);
        assert_eq!(
            p.check_addr("10.9.1.1".parse().unwrap(), 80)
                .unwrap_err()
                .rule,
            "deny 10.9.0.0/16"
        );
    }

    #[test]
    fn any_name_does_not_open_private_ranges() {
        let p = pol(&["*:*"], &[]);
        assert!(p.check_host(&h("whatever.test"), 1234).is_ok());
        assert!(p.check_addr("10.0.0.1".parse().unwrap(), 80).is_err());
        // `*` matches names, not IP literals
        assert!(p.check_host(&h("10.0.0.1"), 80).is_err());
    }

    #[test]
    fn paths() {
        assert!(path_is_canonical("/repos/me/x"));
        for bad in [
            "/repos/me/../admin",
            "/repos/./me",
            "/repos/%2e%2e/admin",
            "/repos%2fme",
            "repos",
            "/a\\b",
            "/a/..",
        ] {
            assert!(!path_is_canonical(bad), "{bad}");
        }
        assert!(path_has_prefix("/repos/me", "/repos/me"));
        assert!(path_has_prefix("/repos/me/x", "/repos/me"));
        assert!(!path_has_prefix("/repos/meanie", "/repos/me"));
        assert!(path_has_prefix("/repos/meanie", "/repos/"));
        assert!(path_has_prefix("/x", "/"));
    }
}

#[cfg(test)]
mod robustness {
    use super::*;

    /// A small deterministic generator; no external crate needed for bounded fuzzing.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn parsers_never_panic_and_stay_consistent() {
        let alphabet: &[u8] = b"abz09.-_*:/[]%@ \x00\xff\xc3\xa9xX";
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let len = (rng.next() % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize])
                .collect();
            let s = String::from_utf8_lossy(&bytes);
            if let Ok(h) = Host::parse(&s) {
                // a parsed name re-parses to itself and is matched by its own exact pattern
                let again = Host::parse(&h.to_string()).unwrap();
                assert_eq!(again, h, "{s:?}");
                if let Host::Name(n) = &h {
                    let p = Pattern::parse(n).unwrap();
                    assert!(p.matches_host(&h), "{s:?}");
                }
            }
            if let Ok(p) = Pattern::parse(&s) {
                assert!(!p.text.is_empty());
            }
        }
    }
}

/// Bounded fuzzing of allow-list entries and matching against a reference model, and of
/// the path checks grants and HTTP rules rely on (docs/fuzzing.md).
#[cfg(test)]
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::config;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    /// Names from a few labels, so that patterns and hosts often meet.
    fn name() -> impl Strategy<Value = String> {
        let label = prop::sample::select(vec!["a", "b", "api", "x-1", "c_d", "com", "A"]);
        prop::collection::vec(label, 1..4).prop_map(|l| l.join("."))
    }

    #[derive(Debug, Clone)]
    enum Spec {
        Any,
        Exact(String),
        Suffix(String),
        Cidr(u32, u8),
    }

    #[derive(Debug, Clone)]
    struct Entry {
        spec: Spec,
        port: Option<u16>, // None: no port; Some(0): `:*`
        text: String,
    }

    fn entry() -> impl Strategy<Value = Entry> {
        let spec = prop_oneof![
            Just(Spec::Any),
            name().prop_map(Spec::Exact),
            name().prop_map(Spec::Suffix),
            (
                prop_oneof![any::<u32>(), 0x0a00_0000u32..0x0a00_00ff],
                0u8..=32
            )
                .prop_map(|(a, p)| Spec::Cidr(a, p)),
        ];
        let port = proptest::option::of(prop::sample::select(vec![0u16, 80, 443, 8080]));
        (spec, port, any::<bool>()).prop_map(|(spec, port, dot)| {
            let host = match &spec {
                Spec::Any => "*".to_string(),
                Spec::Exact(n) if dot => format!("{n}."),
                Spec::Exact(n) => n.clone(),
                Spec::Suffix(n) => format!("*.{n}"),
                Spec::Cidr(a, p) => format!("{}/{p}", Ipv4Addr::from(*a)),
            };
            let text = match port {
                None => host,
                Some(0) => format!("{host}:*"),
                Some(p) => format!("{host}:{p}"),
            };
            Entry { spec, port, text }
        })
    }

    fn host() -> impl Strategy<Value = Host> {
        prop_oneof![
            name().prop_map(|n| Host::Name(n.to_ascii_lowercase())),
            prop_oneof![any::<u32>(), 0x0a00_0000u32..0x0a00_00ff]
                .prop_map(|a| Host::Ip(IpAddr::V4(Ipv4Addr::from(a)))),
        ]
    }

    /// The reference: does `e` name `host` on `port`, where `default` are the ports an
    /// entry without one means (empty: every port)?
    fn model(e: &Entry, host: &Host, port: u16, default: &[u16]) -> bool {
        let host_ok = match (&e.spec, host) {
            (Spec::Any, Host::Name(_)) => true,
            (Spec::Exact(n), Host::Name(h)) => n.to_ascii_lowercase() == *h,
            (Spec::Suffix(n), Host::Name(h)) => {
                let under = format!(".{}", n.to_ascii_lowercase());
                h.ends_with(&under) && h.len() > under.len()
            }
            (Spec::Cidr(a, p), Host::Ip(IpAddr::V4(ip))) => {
                let mask = if *p == 0 { 0 } else { u32::MAX << (32 - p) };
                u32::from(*ip) & mask == a & mask
            }
            _ => false,
        };
        let port_ok = match e.port {
            None => default.is_empty() || default.contains(&port),
            Some(0) => true,
            Some(p) => p == port,
        };
        host_ok && port_ok
    }

    /// How an upstream may read a path: `;` parameters dropped from each segment, `\` as
    /// `/`, percent-decoded once, then dot segments removed (RFC 3986 5.2.4).
    fn upstream_view(path: &str) -> String {
        let plain: Vec<&str> = path
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(""))
            .collect();
        let decoded = crate::secrets::percent_decode(plain.join("/").as_bytes());
        let text = String::from_utf8_lossy(&decoded).replace('\\', "/");
        let mut out: Vec<&str> = Vec::new();
        let segs: Vec<&str> = text.split('/').skip(1).collect();
        for (i, seg) in segs.iter().enumerate() {
            match *seg {
                "." => {}
                ".." => {
                    out.pop();
                }
                s => out.push(s),
            }
            if matches!(*seg, "." | "..") && i + 1 == segs.len() {
                out.push("");
            }
        }
        format!("/{}", out.join("/"))
    }

    fn path() -> impl Strategy<Value = String> {
        let seg = prop_oneof![
            Just("repos"),
            Just("me"),
            Just("meanie"),
            Just(""),
            Just("."),
            Just(".."),
            Just("%2e%2E"),
            Just("%2F"),
            Just("%5c"),
            Just(".%2e"),
            Just("..;"),
            Just("x;y"),
            Just("a\\.."),
            Just("%00"),
            Just("%252e%252e"),
            Just("%41"),
        ];
        prop::collection::vec(seg, 0..6).prop_map(|s| format!("/{}", s.join("/")))
    }

    proptest! {
        #![proptest_config(config(1024))]

        #[test]
        fn entries_match_as_the_model_says(e in entry(), hosts in prop::collection::vec((host(), prop::sample::select(vec![80u16, 443, 8080, 22])), 1..16)) {
            let p = match Pattern::parse(&e.text) {
                Ok(p) => p,
                Err(err) => {
                    prop_assert!(false, "{:?} did not parse: {err}", e.text);
                    return Ok(());
                }
            };
            for (h, port) in &hosts {
                prop_assert_eq!(
                    p.matches_host(h) && p.matches_port(*port, &DEFAULT_ALLOW_PORTS),
                    model(&e, h, *port, &DEFAULT_ALLOW_PORTS),
                    "{:?} against {}:{}", e.text, h, port
                );
            }
        }

        /// Deny entries win over allow entries; an allow entry without a port means 80 and
        /// 443; nothing else is allowed.
        #[test]
        fn policies_decide_as_the_model_says(
            allow in prop::collection::vec(entry(), 0..4),
            deny in prop::collection::vec(entry(), 0..3),
            hosts in prop::collection::vec((host(), prop::sample::select(vec![80u16, 443, 8080, 22])), 1..16),
        ) {
            let a: Vec<String> = allow.iter().map(|e| e.text.clone()).collect();
            let d: Vec<String> = deny.iter().map(|e| e.text.clone()).collect();
            let parse = cordon_core::egress::parse_patterns;
            let policy = Policy::new(&parse(&a)?, &parse(&d)?);
            for (h, port) in &hosts {
                let denied = deny.iter().any(|e| model(e, h, *port, &[]));
                let allowed = allow.iter().any(|e| model(e, h, *port, &DEFAULT_ALLOW_PORTS));
                prop_assert_eq!(
                    policy.check_host(h, *port).is_ok(),
                    allowed && !denied,
                    "allow {:?} deny {:?}: {}:{}", a, d, h, port
                );
            }
        }

        #[test]
        fn hosts_reparse_to_themselves(raw in prop_oneof![name(), any::<String>(), "[0-9a-fx.:\\[\\]]{1,20}"]) {
            if let Ok(h) = Host::parse(&raw) {
                prop_assert_eq!(Host::parse(&h.to_string()).ok(), Some(h.clone()));
                prop_assert_eq!(Host::parse(&h.server_name()).ok(), Some(h));
            }
        }

        /// A path the proxy passes as canonical keeps its prefix however an upstream
        /// normalises it, and the check is stable under a second look.
        #[test]
        fn canonical_paths_keep_their_prefix_upstream(p in path(), prefix in prop_oneof![Just("/repos/me"), Just("/repos/me/"), Just("/repos")]) {
            if path_is_canonical(&p) && path_has_prefix(&p, prefix) {
                let seen = upstream_view(&p);
                prop_assert!(path_has_prefix(&seen, prefix), "{p:?} is {seen:?} upstream");
            }
        }
    }
}
