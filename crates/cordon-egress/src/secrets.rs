//! Grants: real secrets held on the host, per-sandbox placeholders, and the rules for
//! swapping one for the other on the way out.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cordon_core::{Grant, GrantSecret, TokenMinter};
use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::policy::{Host, Pattern, Refusal, path_has_prefix, path_is_canonical};

/// Shortest secret a grant accepts: shorter values cannot be told apart from ordinary text
/// when scanning outputs, so they could not be redacted reliably.
pub const MIN_SECRET_LEN: usize = 8;

/// A real secret value. Zeroed on drop; `Debug` never shows it.
pub type Secret = cordon_core::SecretValue;

/// Checks that a secret value can be used: long enough to redact, fit for a header.
pub fn check_secret(grant: &str, value: &[u8]) -> Result<()> {
    let err = |reason: &str| Error::Secret {
        grant: grant.to_string(),
        reason: reason.to_string(),
    };
    if value.len() < MIN_SECRET_LEN {
        return Err(err(&format!(
            "the secret is shorter than {MIN_SECRET_LEN} bytes; a value that short cannot be protected"
        )));
    }
    if HeaderValue::from_bytes(value).is_err() || value.contains(&b'\n') {
        return Err(err(
            "the secret contains control characters and cannot go in an HTTP header",
        ));
    }
    Ok(())
}

/// Lead time before a minted token's expiry at which the proxy mints the next one.
const REMINT_BEFORE: Duration = Duration::from_secs(30);

/// The secret behind one grant in one sandbox: a fixed value or a series of minted tokens.
/// Remembers every value it handed out, and every encoding of one the proxy made itself
/// (`Basic` credentials), so responses and outputs are masked for all of them.
pub(crate) struct SecretCell {
    grant: String,
    sandbox: String,
    minter: Option<Arc<dyn TokenMinter>>,
    state: Mutex<CellState>,
}

struct CellState {
    current: Secret,
    expires: Option<SystemTime>,
    /// Every form that has travelled upstream: values issued and encodings produced.
    forms: Vec<Zeroizing<Vec<u8>>>,
}

impl fmt::Debug for SecretCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SecretCell({:?}, minted: {})",
            self.grant,
            self.minter.is_some()
        )
    }
}

impl SecretCell {
    pub(crate) fn new(grant: &str, sandbox: &str, secret: &GrantSecret) -> Result<Self> {
        let (minter, current, expires) = match secret {
            GrantSecret::Value(v) => (None, v.clone(), None),
            GrantSecret::Minted(m) => {
                let t = mint(grant, sandbox, m.as_ref())?;
                (Some(m.clone()), t.value, Some(t.expires_at))
            }
        };
        check_secret(grant, current.expose())?;
        let forms = vec![Zeroizing::new(current.expose().to_vec())];
        Ok(SecretCell {
            grant: grant.to_string(),
            sandbox: sandbox.to_string(),
            minter,
            state: Mutex::new(CellState {
                current,
                expires,
                forms,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CellState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value to put in a request now; a minted token close to its expiry is replaced.
    pub(crate) fn current(&self) -> Result<Secret> {
        let mut st = self.lock();
        if let (Some(m), Some(exp)) = (&self.minter, st.expires)
            && SystemTime::now() + REMINT_BEFORE >= exp
        {
            let t = mint(&self.grant, &self.sandbox, m.as_ref())?;
            check_secret(&self.grant, t.value.expose())?;
            st.forms.push(Zeroizing::new(t.value.expose().to_vec()));
            st.current = t.value;
            st.expires = Some(t.expires_at);
        }
        Ok(st.current.clone())
    }

    /// Records a form of the secret the proxy itself produced (e.g. `Basic` credentials).
    pub(crate) fn produced(&self, form: &[u8]) {
        let mut st = self.lock();
        if !st.forms.iter().any(|f| f.as_slice() == form) {
            st.forms.push(Zeroizing::new(form.to_vec()));
        }
    }

    /// Every form that has left through the proxy, for masking.
    pub(crate) fn forms(&self) -> Vec<Zeroizing<Vec<u8>>> {
        self.lock().forms.clone()
    }
}

fn mint(grant: &str, sandbox: &str, m: &dyn TokenMinter) -> Result<cordon_core::MintedToken> {
    m.mint(sandbox).map_err(|reason| Error::Secret {
        grant: grant.to_string(),
        reason: format!("no token could be minted ({reason}); retry, or ask the operator"),
    })
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
    pub secret: SecretCell,
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
    pub(crate) fn compile(grants: &[Grant], sandbox: &str) -> Result<Grants> {
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
            let hosts = g.hosts.clone();
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
            let secret = SecretCell::new(&g.name, sandbox, &g.secret)?;
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
        self.decide_with(host, tls, method, path, None, hits)
    }

    /// [`Self::decide`] for a request that may carry a method-override header (its name).
    pub(crate) fn decide_with(
        &self,
        host: &Host,
        tls: bool,
        method: &Method,
        path: &str,
        override_header: Option<&str>,
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
                    "grant {:?} is not used on a path with dot segments, ';' parameters or encoded separators",
                    g.name
                ));
            }
            if let Some(h) = override_header {
                return refuse(format!(
                    "grant {:?} is not used with {h}: the method the upstream acts on must be the one checked",
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
    /// only. Swapped headers are marked sensitive. Fails (forwarding nothing) when a minted
    /// grant cannot mint its next token.
    pub(crate) fn swap(&self, grants: &[usize], headers: &mut HeaderMap) -> Result<()> {
        for &i in grants {
            let g = &self.list[i];
            let ph = g.placeholder.as_bytes();
            let current = g.secret.current()?;
            let secret = current.expose();
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
                    let encoded = Zeroizing::new(B64.encode(&*inner).into_bytes());
                    // The proxy made this encoding: mask it wherever it comes back.
                    g.secret.produced(&encoded);
                    g.secret
                        .produced(B64.encode(&*inner).trim_end_matches('=').as_bytes());
                    let mut s = b"Basic ".to_vec();
                    s.extend_from_slice(&encoded);
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
        Ok(())
    }

    /// Every form of every grant's secret that has gone upstream, for masking responses.
    pub(crate) fn mask_forms(&self) -> Vec<Zeroizing<Vec<u8>>> {
        self.list.iter().flat_map(|g| g.secret.forms()).collect()
    }
}

/// Headers some frameworks read as the request's real method.
const METHOD_OVERRIDES: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The first method-override header a request carries, if any.
pub(crate) fn method_override(headers: &HeaderMap) -> Option<&'static str> {
    METHOD_OVERRIDES
        .iter()
        .copied()
        .find(|h| headers.contains_key(*h))
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

    fn grants(_dir: &tempfile::TempDir) -> Grants {
        let g = Grant {
            name: "gh".into(),
            env_var: "GH_TOKEN".into(),
            secret: GrantSecret::value("real-secret-value-123"),
            hosts: cordon_core::egress::parse_patterns(&["api.gh.test", "*.gh.test"]).unwrap(),
            header: "authorization".into(),
            methods: vec!["get".into(), "POST".into()],
            path_prefixes: vec!["/repos/me".into()],
        };
        Grants::compile(&[g], "sb-test").unwrap()
    }

    /// Headers whose `authorization` is the grant's placeholder as a bearer token.
    fn bearer(g: &Grants) -> HeaderMap {
        let ph = &g.list[0].placeholder;
        let mut hm = HeaderMap::new();
        hm.insert("authorization", format!("Bearer {ph}").parse().unwrap());
        hm
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
        assert_eq!(
            a.list[0].secret.current().unwrap().expose(),
            b"real-secret-value-123"
        );
        assert!(!format!("{:?}", a.list[0]).contains("real-secret"));
    }

    #[test]
    fn short_or_unprintable_secret_is_refused() {
        let mut g = Grant {
            name: "x".into(),
            env_var: "X".into(),
            secret: GrantSecret::value("abc"),
            hosts: cordon_core::egress::parse_patterns(&["a.test"]).unwrap(),
            header: "authorization".into(),
            methods: vec![],
            path_prefixes: vec![],
        };
        let e = Grants::compile(std::slice::from_ref(&g), "sb")
            .unwrap_err()
            .to_string();
        assert!(e.contains("shorter"), "{e}");
        g.secret = GrantSecret::value("long-enough\nsecond-line");
        let e = Grants::compile(&[g], "sb").unwrap_err().to_string();
        assert!(e.contains("control characters"), "{e}");
    }

    struct Counter(std::sync::atomic::AtomicU32, Duration);

    impl TokenMinter for Counter {
        fn mint(&self, sandbox: &str) -> std::result::Result<cordon_core::MintedToken, String> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(cordon_core::MintedToken {
                value: Secret::new(format!("minted-{sandbox}-{n}")),
                expires_at: SystemTime::now() + self.1,
            })
        }
    }

    #[test]
    fn minted_tokens_are_renewed_before_expiry_and_all_are_masked() {
        let minter = Arc::new(Counter(0.into(), Duration::from_secs(5)));
        let g = Grant {
            name: "m".into(),
            env_var: "M".into(),
            secret: GrantSecret::Minted(minter),
            hosts: cordon_core::egress::parse_patterns(&["a.test"]).unwrap(),
            header: "authorization".into(),
            methods: vec![],
            path_prefixes: vec![],
        };
        let gs = Grants::compile(&[g], "sb-1").unwrap();
        // Within 30 s of its 5 s life, every use mints a fresh one.
        let a = gs.list[0].secret.current().unwrap();
        let b = gs.list[0].secret.current().unwrap();
        assert_ne!(a.expose(), b.expose());
        assert!(a.expose().starts_with(b"minted-sb-1-"));
        let forms = gs.mask_forms();
        assert!(forms.iter().any(|f| f.as_slice() == a.expose()));
        assert!(forms.iter().any(|f| f.as_slice() == b.expose()));
    }

    #[test]
    fn swap_only_for_matching_host_method_path_and_header() {
        let d = tempfile::tempdir().unwrap();
        let g = grants(&d);
        let mut hm = bearer(&g);
        let hits = g.find("/repos/me/x", &hm);
        assert_eq!(hits.len(), 1);
        let ok = g.decide(&h("api.gh.test"), true, &Method::GET, "/repos/me/x", &hits);
        assert_eq!(ok, GrantDecision::Swap(vec![0]));
        g.swap(&[0], &mut hm).unwrap();
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
        g.swap(&[0], &mut hm).unwrap();
        let encoded = B64.encode("x-access-token:real-secret-value-123");
        let want = format!("Basic {encoded}");
        assert_eq!(hm["authorization"], want.as_str());
        // The encoding the proxy made is masked too, not only the raw secret.
        assert!(
            g.mask_forms()
                .iter()
                .any(|f| f.as_slice() == encoded.as_bytes())
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"a%41b%zz%4"), b"aAb%zz%4");
        assert_eq!(percent_decode(b"%"), b"%");
    }

    #[test]
    fn path_parameters_and_method_overrides_never_carry_a_secret() {
        let d = tempfile::tempdir().unwrap();
        let g = grants(&d);
        let mut hm = bearer(&g);
        let hits = g.find("/repos/me/x", &hm);
        for path in [
            "/repos/me/..;/admin",
            "/repos/me;x=1/y",
            "/repos/me/%2e%2e/admin",
        ] {
            assert!(
                matches!(
                    g.decide(&h("api.gh.test"), true, &Method::GET, path, &hits),
                    GrantDecision::Refuse { .. }
                ),
                "{path}"
            );
        }
        hm.insert("x-http-method-override", "DELETE".parse().unwrap());
        let over = method_override(&hm);
        assert_eq!(over, Some("x-http-method-override"));
        assert!(matches!(
            g.decide_with(
                &h("api.gh.test"),
                true,
                &Method::GET,
                "/repos/me/x",
                over,
                &hits
            ),
            GrantDecision::Refuse { .. }
        ));
    }
}
