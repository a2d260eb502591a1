//! Grants: real secrets held on the host, per-sandbox placeholders, and the rules for
//! swapping one for the other on the way out.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cordon_core::{Grant, GrantSecret};
use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::policy::{Host, Pattern, Refusal, path_has_prefix, path_is_canonical};

/// Shortest secret a grant accepts: shorter values cannot be told apart from ordinary text
/// when scanning outputs, so they could not be redacted reliably.
pub const MIN_SECRET_LEN: usize = 8;

/// A real secret value. Zeroed on drop; `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(Zeroizing<Vec<u8>>);

impl Secret {
    /// Wraps a value.
    pub fn new(value: Vec<u8>) -> Self {
        Secret(Zeroizing::new(value))
    }

    /// The bytes. Handle with care: never log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret([{} bytes])", self.0.len())
    }
}

/// Loads a grant's secret from where the grant says it lives.
pub fn load_secret(grant: &Grant) -> Result<Secret> {
    let err = |reason: String| Error::Secret {
        grant: grant.name.clone(),
        reason,
    };
    let mut value = match &grant.secret {
        GrantSecret::Env(var) => match std::env::var_os(var) {
            Some(v) => Zeroizing::new(v.into_encoded_bytes()),
            None => {
                return Err(err(format!(
                    "the host environment variable {var} is not set; export it in the environment that starts cordon"
                )));
            }
        },
        GrantSecret::File(path) => Zeroizing::new(std::fs::read(path).map_err(|e| {
            err(format!(
                "cannot read the secret file {path}: {e}; check the path and its permissions"
            ))
        })?),
    };
    while matches!(value.last(), Some(b'\n' | b'\r')) {
        value.pop();
    }
    if value.len() < MIN_SECRET_LEN {
        return Err(err(format!(
            "the secret is shorter than {MIN_SECRET_LEN} bytes; a value that short cannot be protected"
        )));
    }
    if HeaderValue::from_bytes(&value).is_err() || value.contains(&b'\n') {
        return Err(err(
            "the secret contains control characters and cannot go in an HTTP header".into(),
        ));
    }
    Ok(Secret(value))
}

/// Makes a fresh random placeholder: `cordon-ph-` and 32 hex digits (128 random bits).
pub(crate) fn new_placeholder() -> Result<String> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw)
        .map_err(|e| Error::Ca(format!("no randomness for placeholders: {e}")))?;
    Ok(format!("cordon-ph-{}", hex::encode(raw)))
}

/// A grant ready for use in one sandbox.
#[derive(Debug)]
pub(crate) struct CompiledGrant {
    pub name: String,
    pub env_var: String,
    pub header: HeaderName,
    pub hosts: Vec<Pattern>,
    pub methods: Vec<Method>,
    pub paths: Vec<String>,
    pub placeholder: String,
    pub secret: Secret,
}

impl CompiledGrant {
    pub(crate) fn covers(&self, host: &Host) -> bool {
        self.hosts.iter().any(|p| p.matches_host(host))
    }
}

/// Where a placeholder was seen in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// In the value of this header (raw, or inside `Basic` credentials).
    Header(HeaderName),
    /// Anywhere else: the request target, a header name, the CONNECT authority.
    Elsewhere,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hit {
    pub grant: usize,
    pub location: Location,
}

/// What to do about the placeholders in one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GrantDecision {
    /// No placeholder: forward unchanged.
    Pass,
    /// Swap these grants' placeholders in their headers.
    Swap(Vec<usize>),
    /// Refuse; `exfiltration` when the target is not covered by the placeholder's grant.
    Refuse {
        exfiltration: bool,
        grant: String,
        refusal: Refusal,
    },
}

/// All grants of one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    pub list: Vec<CompiledGrant>,
}

impl Grants {
    pub(crate) fn compile(grants: &[Grant]) -> Result<Grants> {
        let mut list = Vec::new();
        for g in grants {
            let bad = |reason: String| Error::Grant {
                grant: g.name.clone(),
                reason,
            };
            if g.name.is_empty() {
                return Err(bad(
                    "the grant has no name; give it a short name like github".into(),
                ));
            }
            if g.hosts.is_empty() {
                return Err(bad(
                    "it names no host; give at least one host it may be sent to".into(),
                ));
            }
            let header = HeaderName::from_bytes(g.header.trim().as_bytes())
                .map_err(|_| bad(format!("{:?} is not a valid HTTP header name", g.header)))?;
            let hosts = g
                .hosts
                .iter()
                .map(|h| Pattern::parse(h))
                .collect::<Result<Vec<_>>>()?;
            let methods = g
                .methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
                        .map_err(|_| bad(format!("{m:?} is not an HTTP method")))
                })
                .collect::<Result<Vec<_>>>()?;
            for p in &g.path_prefixes {
                if !p.starts_with('/') || !path_is_canonical(p) {
                    return Err(bad(format!(
                        "path prefix {p:?} must start with '/' and hold no '.', '..' or encoded separators"
                    )));
                }
            }
            if list.iter().any(|c: &CompiledGrant| c.env_var == g.env_var) {
                return Err(bad(format!(
                    "another grant already uses the variable {}; give each grant its own",
                    g.env_var
                )));
            }
            let secret = load_secret(g)?;
            list.push(CompiledGrant {
                name: g.name.clone(),
                env_var: g.env_var.clone(),
                header,
                hosts,
                methods,
                paths: g.path_prefixes.clone(),
                placeholder: new_placeholder()?,
                secret,
            });
        }
        Ok(Grants { list })
    }

    /// True if some grant covers `host` (its TLS is then terminated).
    pub(crate) fn covers(&self, host: &Host) -> bool {
        self.list.iter().any(|g| g.covers(host))
    }

    /// Every placeholder, with its grant index.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.list
            .iter()
            .enumerate()
            .map(|(i, g)| (i, g.placeholder.as_bytes()))
    }

    /// Finds placeholders in a request target and headers, including inside `Basic`
    /// credentials and percent-encoded forms of the target.
    pub(crate) fn find(&self, target: &str, headers: &HeaderMap) -> Vec<Hit> {
        let mut hits = Vec::new();
        if self.list.is_empty() {
            return hits;
        }
        let decoded_target = percent_decode(target.as_bytes());
        for (i, g) in self.list.iter().enumerate() {
            let ph = g.placeholder.as_bytes();
            if contains(target.as_bytes(), ph) || contains(&decoded_target, ph) {
                hits.push(Hit {
                    grant: i,
                    location: Location::Elsewhere,
                });
            }
            for (name, value) in headers {
                if contains(name.as_str().as_bytes(), ph) {
                    hits.push(Hit {
                        grant: i,
                        location: Location::Elsewhere,
                    });
                }
                let v = value.as_bytes();
                let in_basic = basic_payload(v).is_some_and(|d| contains(&d, ph));
                if contains(v, ph) || in_basic || contains(&percent_decode(v), ph) {
                    hits.push(Hit {
                        grant: i,
                        location: Location::Header(name.clone()),
                    });
                }
            }
        }
        hits
    }

    /// Decides what to do with the placeholders found in one request to `host`.
    pub(crate) fn decide(
        &self,
        host: &Host,
        tls: bool,
        method: &Method,
        path: &str,
        hits: &[Hit],
    ) -> GrantDecision {
        if hits.is_empty() {
            return GrantDecision::Pass;
        }
        // Exfiltration first: a placeholder headed to a host its grant does not cover.
        for h in hits {
            let g = &self.list[h.grant];
            if !g.covers(host) {
                return GrantDecision::Refuse {
                    exfiltration: true,
                    grant: g.name.clone(),
                    refusal: Refusal::new(
                        format!("grant:{}", g.name),
                        format!(
                            "the credential placeholder of grant {:?} was sent towards {host}, which that grant does not cover; refused and recorded as an exfiltration attempt",
                            g.name
                        ),
                    ),
                };
            }
        }
        let mut swap = Vec::new();
        for h in hits {
            let g = &self.list[h.grant];
            let refuse = |reason: String| GrantDecision::Refuse {
                exfiltration: false,
                grant: g.name.clone(),
                refusal: Refusal::new(format!("grant:{}", g.name), reason),
            };
            if !tls {
                return refuse(format!(
                    "grant {:?} is only used over HTTPS; use https:// so its secret never travels in clear text",
                    g.name
                ));
            }
            match &h.location {
                Location::Header(n) if *n == g.header => {}
                _ => {
                    return refuse(format!(
                        "the placeholder of grant {:?} may only be sent in the {} header",
                        g.name, g.header
                    ));
                }
            }
            if !g.methods.is_empty() && !g.methods.contains(method) {
                return refuse(format!(
                    "grant {:?} does not allow method {method}; allowed: {}",
                    g.name,
                    g.methods
                        .iter()
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if !path_is_canonical(path) {
                return refuse(format!(
                    "grant {:?} is not used on a path with dot segments or encoded separators",
                    g.name
                ));
            }
            if !g.paths.is_empty() && !g.paths.iter().any(|p| path_has_prefix(path, p)) {
                return refuse(format!(
                    "grant {:?} does not allow path {path}; allowed prefixes: {}",
                    g.name,
                    g.paths.join(", ")
                ));
            }
            if !swap.contains(&h.grant) {
                swap.push(h.grant);
            }
        }
        GrantDecision::Swap(swap)
    }

    /// Puts the real secrets of `grants` in place of their placeholders, in their headers
    /// only. Swapped headers are marked sensitive.
    pub(crate) fn swap(&self, grants: &[usize], headers: &mut HeaderMap) {
        for &i in grants {
            let g = &self.list[i];
            let ph = g.placeholder.as_bytes();
            let secret = g.secret.expose();
            let values: Vec<HeaderValue> = headers.get_all(&g.header).iter().cloned().collect();
            if values.is_empty() {
                continue;
            }
            headers.remove(&g.header);
            for v in values {
                let raw = v.as_bytes();
                let mut out: Zeroizing<Vec<u8>> = if contains(raw, ph) {
                    Zeroizing::new(replace_all(raw, ph, secret))
                } else if let Some(decoded) = basic_payload(raw) {
                    let inner = Zeroizing::new(replace_all(&decoded, ph, secret));
                    let mut s = b"Basic ".to_vec();
                    s.extend_from_slice(B64.encode(&*inner).as_bytes());
                    Zeroizing::new(s)
                } else {
                    Zeroizing::new(raw.to_vec())
                };
                match HeaderValue::from_bytes(&out) {
                    Ok(mut hv) => {
                        hv.set_sensitive(true);
                        headers.append(g.header.clone(), hv);
                    }
                    Err(_) => {
                        // cannot happen (secret checked at load); drop the header rather than
                        // forward a placeholder.
                    }
                }
                out.clear();
            }
        }
    }
}

/// Decoded payload of `Basic <base64>`, if the value has that shape.
fn basic_payload(v: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    let rest = v
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case(b"basic "))
        .map(|_| &v[6..])?;
    let trimmed: Vec<u8> = rest
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    B64.decode(trimmed).ok().map(Zeroizing::new)
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

pub(crate) fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut last = 0;
    for pos in memchr::memmem::find_iter(hay, needle) {
        out.extend_from_slice(&hay[last..pos]);
        out.extend_from_slice(with);
        last = pos + needle.len();
    }
    out.extend_from_slice(&hay[last..]);
    out
}

/// Percent-decodes (invalid escapes are kept as they are).
pub(crate) fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            let hexv = |c: u8| (c as char).to_digit(16);
            if let (Some(a), Some(b)) = (hexv(s[i + 1]), hexv(s[i + 2])) {
                out.push((a * 16 + b) as u8);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(dir: &tempfile::TempDir) -> Grants {
        let path = dir.path().join("tok");
        std::fs::write(&path, "real-secret-value-123\n").unwrap();
        let g = Grant {
            name: "gh".into(),
            env_var: "GH_TOKEN".into(),
            secret: GrantSecret::File(path.to_string_lossy().into_owned()),
            hosts: vec!["api.gh.test".into(), "*.gh.test".into()],
            header: "authorization".into(),
            methods: vec!["get".into(), "POST".into()],
            path_prefixes: vec!["/repos/me".into()],
        };
        Grants::compile(&[g]).unwrap()
    }

    fn h(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn placeholder_is_random_and_secret_is_loaded() {
        let d = tempfile::tempdir().unwrap();
        let a = grants(&d);
        let b = grants(&d);
        assert_ne!(a.list[0].placeholder, b.list[0].placeholder);
        assert_eq!(a.list[0].secret.expose(), b"real-secret-value-123");
        assert!(!format!("{:?}", a.list[0]).contains("real-secret"));
    }

    #[test]
    fn short_or_missing_secret_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("short");
        std::fs::write(&path, "abc\n").unwrap();
        let mut g = Grant {
            name: "x".into(),
            env_var: "X".into(),
            secret: GrantSecret::File(path.to_string_lossy().into_owned()),
            hosts: vec!["a.test".into()],
            header: "authorization".into(),
            methods: vec![],
            path_prefixes: vec![],
        };
        let e = Grants::compile(std::slice::from_ref(&g))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shorter"), "{e}");
        g.secret = GrantSecret::Env("CORDON_TEST_SURELY_UNSET_VAR".into());
        let e = Grants::compile(std::slice::from_ref(&g))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not set"), "{e}");
        g.secret = GrantSecret::File("/nonexistent/cordon".into());
        assert!(Grants::compile(&[g]).is_err());
    }

    #[test]
    fn swap_only_for_matching_host_method_path_and_header() {
        let d = tempfile::tempdir().unwrap();
        let g = grants(&d);
        let ph = g.list[0].placeholder.clone();
        let mut hm = HeaderMap::new();
        hm.insert("authorization", format!("Bearer {ph}").parse().unwrap());
        let hits = g.find("/repos/me/x", &hm);
        assert_eq!(hits.len(), 1);
        let ok = g.decide(&h("api.gh.test"), true, &Method::GET, "/repos/me/x", &hits);
        assert_eq!(ok, GrantDecision::Swap(vec![0]));
        g.swap(&[0], &mut hm);
        assert_eq!(hm["authorization"], "Bearer real-secret-value-123");
        assert!(hm["authorization"].is_sensitive());

        let cases: [(&str, bool, Method, &str, bool); 6] = [
            ("evil.test", true, Method::GET, "/repos/me", true),
            ("api.gh.test", false, Method::GET, "/repos/me", false),
            ("api.gh.test", true, Method::DELETE, "/repos/me", false),
            ("api.gh.test", true, Method::GET, "/repos/other", false),
            (
                "api.gh.test",
                true,
                Method::GET,
                "/repos/me/../../admin",
                false,
            ),
            ("api.gh.test", true, Method::GET, "/repos/meanie", false),
        ];
        for (host, tls, m, path, exfil) in cases {
            match g.decide(&h(host), tls, &m, path, &hits) {
                GrantDecision::Refuse {
                    exfiltration,
                    refusal,
                    ..
                } => {
                    assert_eq!(exfiltration, exfil, "{host} {path}");
                    assert_eq!(refusal.rule, "grant:gh");
                }
                other => panic!("{host} {m} {path}: {other:?}"),
            }
        }
    }

    #[test]
    fn placeholder_elsewhere_is_found_and_not_swapped() {
        let d = tempfile::tempdir().unwrap();
        let g = grants(&d);
        let ph = g.list[0].placeholder.clone();
        // in the query, percent-encoded
        let enc: String = ph.bytes().map(|b| format!("%{b:02x}")).collect();
        let hits = g.find(&format!("/repos/me?x={enc}"), &HeaderMap::new());
        assert_eq!(hits[0].location, Location::Elsewhere);
        assert!(matches!(
            g.decide(&h("api.gh.test"), true, &Method::GET, "/repos/me", &hits),
            GrantDecision::Refuse {
                exfiltration: false,
                ..
            }
        ));
        assert!(matches!(
            g.decide(&h("other.test"), true, &Method::GET, "/", &hits),
            GrantDecision::Refuse {
                exfiltration: true,
                ..
            }
        ));
        // in another header
        let mut hm = HeaderMap::new();
        hm.insert("x-api-key", ph.parse().unwrap());
        let hits = g.find("/repos/me", &hm);
        assert!(matches!(
            g.decide(&h("api.gh.test"), true, &Method::GET, "/repos/me", &hits),
            GrantDecision::Refuse {
                exfiltration: false,
                ..
            }
        ));
    }

    #[test]
    fn basic_credentials_are_swapped() {
        let d = tempfile::tempdir().unwrap();
        let g = grants(&d);
        let ph = g.list[0].placeholder.clone();
        let mut hm = HeaderMap::new();
        let v = format!("Basic {}", B64.encode(format!("x-access-token:{ph}")));
        hm.insert("authorization", v.parse().unwrap());
        let hits = g.find("/repos/me", &hm);
        assert_eq!(
            g.decide(&h("api.gh.test"), true, &Method::POST, "/repos/me", &hits),
            GrantDecision::Swap(vec![0])
        );
        g.swap(&[0], &mut hm);
        let want = format!(
            "Basic {}",
            B64.encode("x-access-token:real-secret-value-123")
        );
        assert_eq!(hm["authorization"], want.as_str());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"a%41b%zz%4"), b"aAb%zz%4");
        assert_eq!(percent_decode(b"%"), b"%");
    }
}
