//! Credentials minted per task: short-lived ES256 JWTs whose issuer is this server, whose
//! subject is the sandbox, with one audience per grant. The egress proxy puts them into
//! requests to the grant's hosts, so the sandbox never holds even the minted token. The
//! server publishes an OIDC discovery document and its JWKS, so an upstream (or a cloud's
//! web-identity token exchange) verifies a token without any shared secret; the
//! introspection route refuses the tokens of a sandbox that has been destroyed.
//!
//! Keys are P-256 pairs made in memory at start and rotated on a schedule; the JWKS lists
//! the current key and the ones whose tokens may still be alive.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cordon_core::{MintedToken, SecretValue, TokenMinter};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde::{Deserialize, Serialize};

use crate::GateError;

/// The claims of a minted token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Claims {
    pub iss: String,
    /// The sandbox the token was minted for.
    pub sub: String,
    pub aud: String,
    pub iat: u64,
    pub nbf: u64,
    pub exp: u64,
    pub jti: String,
    /// The tenant whose sandbox it is.
    pub tenant: String,
    /// The catalogue grant it was minted under.
    pub grant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// One public key in JWK form (P-256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Jwk {
    pub kty: String,
    pub crv: String,
    pub x: String,
    pub y: String,
    pub kid: String,
    #[serde(rename = "use")]
    pub use_: String,
    pub alg: String,
}

/// The JWKS document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// The OIDC discovery document (the fields a verifier reads).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Discovery {
    pub issuer: String,
    pub jwks_uri: String,
    pub introspection_endpoint: String,
    pub id_token_signing_alg_values_supported: Vec<String>,
    pub response_types_supported: Vec<String>,
    pub subject_types_supported: Vec<String>,
    pub claims_supported: Vec<String>,
}

/// An RFC 7662 introspection answer: `active` and, when active, the claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Introspection {
    pub active: bool,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Claims>,
}

struct SigningKey {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    jwk: Jwk,
    made: SystemTime,
}

struct State {
    /// Newest first.
    keys: Vec<SigningKey>,
    /// Sandboxes whose tokens are refused from now on, and when each ended (oldest first,
    /// for the pruning: an entry goes once every token it could have had is expired).
    ended: HashSet<String>,
    ended_order: std::collections::VecDeque<(u64, String)>,
    /// jti -> sandbox, for tokens still alive.
    issued: BTreeMap<String, (String, u64)>,
}

/// The token issuer of one server.
pub struct Issuer {
    issuer: String,
    rotate_every: Duration,
    /// The longest a token may live; keys are kept this long after they stop signing.
    max_token_life: Duration,
    state: Mutex<State>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// The least time an ended sandbox is remembered, whatever the tokens' life.
const ENDED_KEPT_SECS: u64 = 60;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn new_key() -> Result<SigningKey, GateError> {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
        .map_err(|_| GateError::Config("cannot make a signing key (no randomness?)".into()))?;
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|_| GateError::Config("a fresh signing key did not parse".into()))?;
    let public = pair.public_key().as_ref();
    // Uncompressed point: 0x04 || X (32) || Y (32).
    if public.len() != 65 || public[0] != 4 {
        return Err(GateError::Config(
            "unexpected P-256 public key shape".into(),
        ));
    }
    let x = URL_SAFE_NO_PAD.encode(&public[1..33]);
    let y = URL_SAFE_NO_PAD.encode(&public[33..65]);
    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw).map_err(|e| GateError::Config(format!("no randomness: {e}")))?;
    let kid = hex::encode(raw);
    let decoding = DecodingKey::from_ec_components(&x, &y)
        .map_err(|e| GateError::Config(format!("verifying key: {e}")))?;
    Ok(SigningKey {
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        decoding,
        jwk: Jwk {
            kty: "EC".into(),
            crv: "P-256".into(),
            x,
            y,
            kid: kid.clone(),
            use_: "sig".into(),
            alg: "ES256".into(),
        },
        kid,
        made: SystemTime::now(),
    })
}

impl Issuer {
    /// An issuer named `issuer` (an `https://` URL where its discovery document is served),
    /// rotating keys every `rotate_every`; tokens live at most `max_token_life`.
    pub fn new(
        issuer: impl Into<String>,
        rotate_every: Duration,
        max_token_life: Duration,
    ) -> Result<Self, GateError> {
        Ok(Issuer {
            issuer: issuer.into().trim_end_matches('/').to_string(),
            rotate_every,
            max_token_life,
            state: Mutex::new(State {
                keys: vec![new_key()?],
                ended: HashSet::new(),
                ended_order: std::collections::VecDeque::new(),
                issued: BTreeMap::new(),
            }),
        })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a new key when the current one is due and drops keys no live token can need.
    fn maintain(&self, st: &mut State) -> Result<(), GateError> {
        let due = st
            .keys
            .first()
            .map(|k| k.made.elapsed().unwrap_or_default() >= self.rotate_every)
            .unwrap_or(true);
        if due {
            st.keys.insert(0, new_key()?);
        }
        // A key stops signing when the next one is made; its tokens live at most
        // max_token_life after that.
        let keep = self.rotate_every + self.max_token_life;
        let mut i = 1;
        while i < st.keys.len() {
            if st.keys[i - 1].made.elapsed().unwrap_or_default() > keep {
                st.keys.truncate(i);
                break;
            }
            i += 1;
        }
        let now = now_secs();
        st.issued.retain(|_, (_, exp)| *exp > now);
        self.prune_ended(st, now);
        Ok(())
    }

    /// Forgets ended sandboxes whose every token has expired (they ended more than
    /// `max_token_life` ago, and a minimum of [`ENDED_KEPT_SECS`]): nothing of theirs can
    /// be presented any more, and the set stays as large as the last hour's ends.
    fn prune_ended(&self, st: &mut State, now: u64) {
        let keep = self.max_token_life.as_secs().max(ENDED_KEPT_SECS);
        while let Some((at, _)) = st.ended_order.front() {
            if at.saturating_add(keep) > now {
                break;
            }
            if let Some((_, sb)) = st.ended_order.pop_front() {
                st.ended.remove(&sb);
            }
        }
    }

    /// How many ended sandboxes the issuer remembers (tests).
    pub fn ended_count(&self) -> usize {
        self.lock().ended.len()
    }

    /// Prunes as at `now` (seconds since the epoch; tests).
    pub fn prune_ended_at(&self, now: u64) {
        let mut st = self.lock();
        self.prune_ended(&mut st, now);
    }

    /// Rotates now (tests, and an operator's manual rotation).
    pub fn rotate(&self) -> Result<(), GateError> {
        let mut st = self.lock();
        st.keys.insert(0, new_key()?);
        Ok(())
    }

    /// Mints a token.
    pub fn mint(&self, mut claims: Claims) -> Result<String, GateError> {
        let mut st = self.lock();
        self.maintain(&mut st)?;
        if st.ended.contains(&claims.sub) {
            return Err(GateError::Config("the sandbox has ended".into()));
        }
        let key = st
            .keys
            .first()
            .ok_or_else(|| GateError::Config("no signing key".into()))?;
        claims.iss = self.issuer.clone();
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &key.encoding)
            .map_err(|e| GateError::Config(format!("signing a token: {e}")))?;
        st.issued
            .insert(claims.jti.clone(), (claims.sub.clone(), claims.exp));
        Ok(token)
    }

    /// The public keys a verifier needs now.
    pub fn jwks(&self) -> Jwks {
        let mut st = self.lock();
        let _ = self.maintain(&mut st);
        Jwks {
            keys: st.keys.iter().map(|k| k.jwk.clone()).collect(),
        }
    }

    /// The discovery document, with routes under `base` (normally the issuer).
    pub fn discovery(&self) -> Discovery {
        let base = &self.issuer;
        Discovery {
            issuer: base.clone(),
            jwks_uri: format!("{base}/.well-known/jwks.json"),
            introspection_endpoint: format!("{base}/v1/tokens/introspect"),
            id_token_signing_alg_values_supported: vec!["ES256".into()],
            response_types_supported: vec!["id_token".into()],
            subject_types_supported: vec!["public".into()],
            claims_supported: [
                "iss", "sub", "aud", "exp", "iat", "nbf", "jti", "tenant", "grant", "scope",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        }
    }

    /// Whether a token is one of ours, unexpired, and its sandbox still alive.
    pub fn introspect(&self, token: &str) -> Introspection {
        let inactive = Introspection {
            active: false,
            claims: None,
        };
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return inactive;
        };
        let st = self.lock();
        let Some(key) = st.keys.iter().find(|k| Some(&k.kid) == header.kid.as_ref()) else {
            return inactive;
        };
        let mut v = Validation::new(Algorithm::ES256);
        v.set_issuer(&[&self.issuer]);
        v.validate_aud = false;
        v.leeway = 0;
        let Ok(data) = jsonwebtoken::decode::<Claims>(token, &key.decoding, &v) else {
            return inactive;
        };
        let c = data.claims;
        if st.ended.contains(&c.sub) || !st.issued.contains_key(&c.jti) {
            return inactive;
        }
        Introspection {
            active: true,
            claims: Some(c),
        }
    }

    /// Refuses every token of `sandbox` from now on (called when it is destroyed).
    pub fn end_sandbox(&self, sandbox: &str) {
        let mut st = self.lock();
        let now = now_secs();
        st.issued.retain(|_, (sb, _)| sb != sandbox);
        if st.ended.insert(sandbox.to_string()) {
            st.ended_order.push_back((now, sandbox.to_string()));
        }
        self.prune_ended(&mut st, now);
    }
}

/// Mints one catalogue grant's tokens for one sandbox (handed to the egress proxy).
pub(crate) struct Minter {
    pub issuer: Arc<Issuer>,
    pub tenant: String,
    pub grant: String,
    pub audience: String,
    pub scope: Option<String>,
    pub lifetime: Duration,
    /// The sandbox's end: no token outlives it.
    pub not_after: SystemTime,
}

impl TokenMinter for Minter {
    fn mint(&self, sandbox: &str) -> Result<MintedToken, String> {
        let now = SystemTime::now();
        let end = (now + self.lifetime).min(self.not_after);
        if end <= now {
            return Err("the sandbox's lifetime is over".into());
        }
        let secs = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        };
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness: {e}"))?;
        let claims = Claims {
            iss: String::new(),
            sub: sandbox.to_string(),
            aud: self.audience.clone(),
            iat: secs(now),
            nbf: secs(now),
            exp: secs(end),
            jti: hex::encode(raw),
            tenant: self.tenant.clone(),
            grant: self.grant.clone(),
            scope: self.scope.clone(),
        };
        // `TokenMinter` (cordon-egress) reports a failed mint as the reason of its
        // `Error::Secret`, a message: the typed error ends here.
        let token = self.issuer.mint(claims).map_err(|e| e.to_string())?;
        Ok(MintedToken {
            value: SecretValue::new(token),
            expires_at: end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test issuer: keys rotated hourly, tokens living at most `life`.
    fn issuer(life: Duration) -> Arc<Issuer> {
        Arc::new(Issuer::new("https://cordon.test", Duration::from_secs(3600), life).unwrap())
    }

    fn minter(issuer: &Arc<Issuer>, life: Duration) -> Minter {
        Minter {
            issuer: issuer.clone(),
            tenant: "alice".into(),
            grant: "cloud".into(),
            audience: "sts.test".into(),
            scope: None,
            lifetime: life,
            not_after: SystemTime::now() + Duration::from_secs(120),
        }
    }

    /// Issue 44: the set of ended sandboxes was never pruned (one entry per sandbox the
    /// server ever destroyed). An entry goes once every token of its sandbox has expired;
    /// until then the sandbox's mints are refused.
    #[test]
    fn ended_sandboxes_are_forgotten_once_their_tokens_expired() {
        let life = Duration::from_secs(600);
        let issuer = issuer(life);
        let m = minter(&issuer, Duration::from_secs(300));
        // Read before the first end: the loop may cross a second, and an entry ended a
        // second after a clock read later than this one would be pruned at that read + 599.
        let first = now_secs();
        for i in 0..10_000 {
            issuer.end_sandbox(&format!("sb-{i}"));
        }
        assert_eq!(issuer.ended_count(), 10_000);
        assert!(
            m.mint("sb-7").is_err(),
            "an ended sandbox's mint went through"
        );
        // Before its tokens' life is over, nothing is forgotten.
        issuer.prune_ended_at(first + 599);
        assert_eq!(issuer.ended_count(), 10_000);
        issuer.prune_ended_at(now_secs() + 601);
        assert_eq!(issuer.ended_count(), 0, "the ended set is never pruned");
    }

    #[test]
    fn minted_tokens_verify_with_the_published_key_only() {
        let issuer = issuer(Duration::from_secs(600));
        let m = minter(&issuer, Duration::from_secs(300));
        let t = m.mint("sb-1").unwrap();
        let token = String::from_utf8(t.value.expose().to_vec()).unwrap();
        // never beyond the sandbox's end (120 s), though the grant says 300 s
        let left = t.expires_at.duration_since(SystemTime::now()).unwrap();
        assert!(left <= Duration::from_secs(120), "{left:?}");
        // A verifier with only the JWKS accepts it.
        let jwks = issuer.jwks();
        let k = &jwks.keys[0];
        let key = DecodingKey::from_ec_components(&k.x, &k.y).unwrap();
        let mut v = Validation::new(Algorithm::ES256);
        v.set_audience(&["sts.test"]);
        v.set_issuer(&["https://cordon.test"]);
        let c = jsonwebtoken::decode::<Claims>(&token, &key, &v)
            .unwrap()
            .claims;
        assert_eq!((c.sub.as_str(), c.tenant.as_str()), ("sb-1", "alice"));
        // A tampered token does not verify.
        let mut bad = token.clone();
        bad.pop();
        bad.push(if token.ends_with('A') { 'B' } else { 'A' });
        assert!(jsonwebtoken::decode::<Claims>(&bad, &key, &v).is_err());
        assert!(!issuer.introspect(&bad).active);
        // Introspection: active until the sandbox ends, then refused.
        assert!(issuer.introspect(&token).active);
        issuer.end_sandbox("sb-1");
        assert!(!issuer.introspect(&token).active);
        assert!(m.mint("sb-1").is_err());
    }

    #[test]
    fn keys_rotate_and_old_tokens_stay_verifiable_while_they_live() {
        let issuer = issuer(Duration::from_secs(600));
        let m = minter(&issuer, Duration::from_secs(60));
        let old = String::from_utf8(m.mint("sb-2").unwrap().value.expose().to_vec()).unwrap();
        issuer.rotate().unwrap();
        let jwks = issuer.jwks();
        assert_eq!(jwks.keys.len(), 2);
        assert_ne!(jwks.keys[0].kid, jwks.keys[1].kid);
        let new = String::from_utf8(m.mint("sb-2").unwrap().value.expose().to_vec()).unwrap();
        let kid = |t: &str| jsonwebtoken::decode_header(t).unwrap().kid.unwrap();
        assert_eq!(kid(&new), jwks.keys[0].kid);
        assert_eq!(kid(&old), jwks.keys[1].kid);
        assert!(issuer.introspect(&old).active);
        assert!(issuer.introspect(&new).active);
        let d = issuer.discovery();
        assert_eq!(d.jwks_uri, "https://cordon.test/.well-known/jwks.json");
    }
}
