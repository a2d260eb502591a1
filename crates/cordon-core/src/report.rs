//! What an outcome reports beside the program's own results, typed: scan findings, egress
//! decisions (grant uses among them), and how a failed sandbox failed.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What a decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressDecision {
    /// The request or tunnel was let through.
    Allow,
    /// Refused by policy (deny entry, default deny, address guard, grant scope, ...).
    Deny,
    /// A credential placeholder was on its way to a host its grant does not cover.
    Exfiltration,
    /// A per-sandbox limit ended the request or connection.
    Limit,
    /// The upstream could not be reached or answered badly.
    Error,
    /// A connection ended (carries byte counts and the reason).
    Closed,
    /// Events past a cap, counted (in `count`) instead of itemised.
    Truncated,
}

/// What kind of traffic the event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressKind {
    /// An absolute-form plain-HTTP request.
    Http,
    /// A CONNECT request (opaque tunnel or TLS terminated).
    Connect,
    /// A request inside a TLS connection the proxy terminated.
    Https,
    /// A client connection as a whole.
    Connection,
}

/// One audit event. `path` never includes the query string; no header value is ever logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressEvent {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The sandbox this proxy serves.
    pub sandbox: String,
    /// Client connection number within this proxy, from 1.
    pub conn: u64,
    /// What kind of traffic.
    pub kind: EgressKind,
    /// The decision.
    pub decision: EgressDecision,
    /// The rule that decided (e.g. `allow api.example.test`, `deny *.evil.test`,
    /// `default-deny`, `address-guard:loopback`, `grant:github`, `limit:bytes_up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A human sentence: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Target host as requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The address the proxy connected to (or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// HTTP method where seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// URL path where seen, without the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Upstream status code, when a response came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The grants whose secrets were added to the request (names only; on the wire the
    /// names joined by commas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub grant: Option<GrantNames>,
    /// Whether the proxy terminated TLS for this CONNECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<bool>,
    /// Bytes from the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    /// Bytes to the sandbox (on the client connection), for `closed` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// How many identical events this row stands for (1 unless folded; see [`EgressFold`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
    /// When the last of the folded events happened (ms since the epoch), when `count > 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ms: Option<u64>,
    /// Whose request it was, as the front door that made the sandbox knows it: a kubelet
    /// pod's `namespace/name` (cordon-oci).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

impl EgressEvent {
    pub fn new(conn: u64, kind: EgressKind, decision: EgressDecision) -> Self {
        EgressEvent {
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            sandbox: String::new(),
            conn,
            kind,
            decision,
            rule: None,
            reason: None,
            host: None,
            port: None,
            addr: None,
            method: None,
            path: None,
            status: None,
            grant: None,
            terminated: None,
            bytes_up: None,
            bytes_down: None,
            count: 1,
            last_ms: None,
            pod: None,
        }
    }

    /// Events an audit never drops: a placeholder on its way to the wrong host, and every
    /// request that carried a grant's secret. Under a flood they are folded (counted), never
    /// truncated away.
    pub fn is_protected(&self) -> bool {
        self.decision == EgressDecision::Exfiltration || self.grant.is_some()
    }

    /// The fields two events must share to be folded into one row: everything but when,
    /// on which connection, and the byte counts (which add up).
    fn fold_key(&self, coarse: Coarseness) -> FoldKey {
        let keep_request = coarse == Coarseness::Exact;
        let keep_target = coarse != Coarseness::Grant;
        FoldKey {
            kind: self.kind,
            decision: self.decision,
            rule: self.rule.clone(),
            grant: self.grant.clone(),
            host: self.host.clone().filter(|_| keep_target),
            port: self.port.filter(|_| keep_target),
            addr: self.addr.clone().filter(|_| keep_request),
            reason: self.reason.clone().filter(|_| keep_request),
            method: self.method.clone().filter(|_| keep_request),
            path: self.path.clone().filter(|_| keep_request),
            status: self.status.filter(|_| keep_request),
            terminated: self.terminated,
        }
    }

    /// Drops what a coarser fold does not keep, so a folded row never claims a path or a
    /// host that only some of its events had.
    fn coarsen(&mut self, coarse: Coarseness) {
        if coarse != Coarseness::Exact {
            self.addr = None;
            self.reason = None;
            self.method = None;
            self.path = None;
            self.status = None;
        }
        if coarse == Coarseness::Grant {
            self.host = None;
            self.port = None;
        }
    }
}

/// The grants whose secrets one request carried, by name: a list in Cordon, written on the
/// wire and in audit rows as the names joined by commas (`github,npm`) and read back from
/// that text here, once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GrantNames(Vec<String>);

impl GrantNames {
    /// One grant.
    pub fn one(name: impl Into<String>) -> Self {
        GrantNames(vec![name.into()])
    }

    /// The grants' names, in the order the request carried them.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl<S: Into<String>> FromIterator<S> for GrantNames {
    fn from_iter<I: IntoIterator<Item = S>>(names: I) -> Self {
        GrantNames(names.into_iter().map(Into::into).collect())
    }
}

impl std::fmt::Display for GrantNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl Serialize for GrantNames {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GrantNames {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(text.split(',').filter(|n| !n.is_empty()).collect())
    }
}

/// How much of an event a fold keeps once a flood has made too many distinct rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Coarseness {
    /// Everything but time, connection and byte counts.
    Exact,
    /// The decision, rule, grant and target (host and port).
    Target,
    /// The decision, rule and grant.
    Grant,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FoldKey {
    kind: EgressKind,
    decision: EgressDecision,
    rule: Option<String>,
    grant: Option<GrantNames>,
    host: Option<String>,
    port: Option<u16>,
    addr: Option<String>,
    reason: Option<String>,
    method: Option<String>,
    path: Option<String>,
    status: Option<u16>,
    terminated: Option<bool>,
}

/// Default most distinct rows one report itemises before the rest are counted in one
/// `truncated` row ([`EgressFold::new`]).
pub const DEFAULT_FOLD_ROWS: usize = 1000;

/// Folds a stream of egress events into a bounded report: identical events (everything but
/// time, connection and bytes) become one row with a `count`; past `max_rows` distinct rows,
/// ordinary events are only counted, in one `truncated` row; protected events
/// ([`EgressEvent::is_protected`]) are never dropped: past `max_rows` they fold by target,
/// past twice that by grant and rule alone, so every one of them stays counted in some row.
#[derive(Debug, Clone)]
pub struct EgressFold {
    max_rows: usize,
    rows: Vec<EgressEvent>,
    index: HashMap<(Coarseness, FoldKey), usize>,
    protected_rows: usize,
    truncated: Option<EgressEvent>,
}

impl Default for EgressFold {
    fn default() -> Self {
        EgressFold::new(DEFAULT_FOLD_ROWS)
    }
}

impl EgressFold {
    /// A fold that itemises at most `max_rows` distinct ordinary rows (at least 1).
    pub fn new(max_rows: usize) -> Self {
        EgressFold {
            max_rows: max_rows.max(1),
            rows: Vec::new(),
            index: HashMap::new(),
            protected_rows: 0,
            truncated: None,
        }
    }

    /// Adds one event (which may itself stand for `count` events).
    pub fn push(&mut self, ev: EgressEvent) {
        if ev.decision == EgressDecision::Truncated {
            // What an earlier fold counted joins this fold's count.
            self.count_truncated(&ev);
            return;
        }
        let protected = ev.is_protected();
        let coarse = if !protected || self.protected_rows < self.max_rows {
            Coarseness::Exact
        } else if self.protected_rows < 2 * self.max_rows {
            Coarseness::Target
        } else {
            Coarseness::Grant
        };
        let key = (coarse, ev.fold_key(coarse));
        if let Some(&i) = self.index.get(&key) {
            merge(&mut self.rows[i], &ev);
            return;
        }
        let ordinary = self.rows.len() - self.protected_rows;
        if !protected && ordinary >= self.max_rows {
            self.count_truncated(&ev);
            return;
        }
        let mut row = ev;
        row.coarsen(coarse);
        if protected {
            self.protected_rows += 1;
        }
        self.index.insert(key, self.rows.len());
        self.rows.push(row);
    }

    fn count_truncated(&mut self, ev: &EgressEvent) {
        count_into(&mut self.truncated, ev);
    }

    /// True when nothing was pushed since the last [`Self::take`].
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.truncated.is_none()
    }

    /// The events pushed since the last call, folded, oldest first; a `truncated` row
    /// last, saying how many events were counted without being itemised.
    pub fn take(&mut self) -> Vec<EgressEvent> {
        self.index.clear();
        self.protected_rows = 0;
        let mut rows = std::mem::take(&mut self.rows);
        if let Some(mut t) = self.truncated.take() {
            t.reason = Some(format!(
                "{} more events past {} distinct rows were counted, not itemised",
                t.count, self.max_rows
            ));
            rows.push(t);
        }
        rows
    }
}

/// Counts `ev` (and what it stands for) in `row`, the `truncated` row that stands for every
/// event counted without being itemised, made on the first.
pub fn count_into(row: &mut Option<EgressEvent>, ev: &EgressEvent) {
    let t = row.get_or_insert_with(|| {
        let mut t = EgressEvent::new(0, EgressKind::Connection, EgressDecision::Truncated);
        t.sandbox.clone_from(&ev.sandbox);
        t.time_ms = ev.time_ms;
        t.count = 0;
        t.rule = Some("audit:truncated".into());
        t
    });
    t.count = t.count.saturating_add(ev.count);
    t.last_ms = Some(ev.last_ms.unwrap_or(ev.time_ms));
}

/// Adds `ev` into the row that stands for it.
fn merge(row: &mut EgressEvent, ev: &EgressEvent) {
    row.count = row.count.saturating_add(ev.count);
    row.last_ms = Some(ev.last_ms.unwrap_or(ev.time_ms));
    for (sum, add) in [
        (&mut row.bytes_up, ev.bytes_up),
        (&mut row.bytes_down, ev.bytes_down),
    ] {
        if let Some(a) = add {
            *sum = Some(sum.unwrap_or(0).saturating_add(a));
        }
    }
}

impl EgressDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            EgressDecision::Allow => "allow",
            EgressDecision::Deny => "deny",
            EgressDecision::Exfiltration => "exfiltration",
            EgressDecision::Limit => "limit",
            EgressDecision::Error => "error",
            EgressDecision::Closed => "closed",
            EgressDecision::Truncated => "truncated",
        }
    }
}

/// What kind of thing a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A real secret value the host knows (raw, base64 or hex): always redacted.
    KnownSecret,
    /// A PEM private key block.
    PrivateKey,
    /// An AWS access key id (`AKIA...`, `ASIA...`).
    AwsAccessKeyId,
    /// A GitHub token (`ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_`, `github_pat_`).
    GithubToken,
    /// A GitLab personal access token (`glpat-`).
    GitlabToken,
    /// A Slack token (`xoxb-`, `xoxp-`, ...) or incoming webhook URL.
    SlackToken,
    /// A Stripe secret or restricted key (`sk_live_`, `rk_test_`, ...).
    StripeKey,
    /// A Google API key (`AIza...`).
    GoogleApiKey,
    /// An OpenAI or Anthropic API key (`sk-...`, `sk-ant-...`).
    AiApiKey,
    /// A JSON Web Token.
    Jwt,
}

/// One finding. Offsets refer to the scanned input; the matched value is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Finding {
    /// What was found.
    pub kind: FindingKind,
    /// For known secrets, the secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Byte offset in the input.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Whether it was replaced in the output.
    pub redacted: bool,
    /// Where it was found: the output stream (`stdout`, `stderr`) or the file taken out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// The details of one outcome (serialized as its `extra` object).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Details {
    /// Credential formats and known secrets found in what left the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// Every egress decision since the last outcome (a grant's use is an `allow` with
    /// `grant` set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressEvent>,
    /// How the sandbox failed, where the tier knows (`agent-protocol`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The accelerator a microVM ran on (`kvm`, `tcg`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
}

impl Details {
    pub fn is_empty(&self) -> bool {
        *self == Details::default()
    }

    /// Adds what a later report says (lists appended, the rest replaced where given).
    pub fn merge(&mut self, more: Details) {
        self.findings.extend(more.findings);
        self.egress.extend(more.egress);
        if more.failure.is_some() {
            self.failure = more.failure;
        }
        if more.accelerator.is_some() {
            self.accelerator = more.accelerator;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grants of a request are a list in Cordon and the same comma-joined text on the
    /// wire as before: two grants read back as two names, an absent field as none.
    #[test]
    fn grant_names_are_a_list_written_as_before() {
        let two: GrantNames = ["github", "npm"].into_iter().collect();
        assert_eq!(two.iter().collect::<Vec<_>>(), ["github", "npm"]);
        let mut e = EgressEvent::new(1, EgressKind::Https, EgressDecision::Allow);
        e.grant = Some(two.clone());
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["grant"], "github,npm");
        let back: EgressEvent = serde_json::from_value(v).unwrap();
        assert_eq!(back.grant, Some(two));
        let one: GrantNames = serde_json::from_str("\"github\"").unwrap();
        assert_eq!(one, GrantNames::one("github"));
    }

    fn deny(host: &str) -> EgressEvent {
        let mut e = EgressEvent::new(1, EgressKind::Connect, EgressDecision::Deny);
        e.rule = Some("default-deny".into());
        e.host = Some(host.into());
        e.port = Some(443);
        e
    }

    fn exfil(host: &str, path: &str) -> EgressEvent {
        let mut e = EgressEvent::new(2, EgressKind::Https, EgressDecision::Exfiltration);
        e.rule = Some("grant:github".into());
        e.grant = Some(GrantNames::one("github"));
        e.host = Some(host.into());
        e.path = Some(path.into());
        e
    }

    fn total(rows: &[EgressEvent], pred: impl Fn(&EgressEvent) -> bool) -> u64 {
        rows.iter().filter(|e| pred(e)).map(|e| e.count).sum()
    }

    #[test]
    fn repeated_denials_fold_into_one_row_per_rule_and_host() {
        let mut f = EgressFold::new(10);
        for i in 0..50_000u64 {
            let mut e = deny(if i % 2 == 0 { "a.test" } else { "b.test" });
            e.conn = i;
            e.time_ms += i;
            f.push(e);
        }
        let rows = f.take();
        assert_eq!(rows.len(), 2, "{rows:#?}");
        assert!(
            rows.iter()
                .all(|r| r.count == 25_000 && r.last_ms.is_some())
        );
        assert!(f.is_empty() && f.take().is_empty());
    }

    #[test]
    fn a_flood_of_distinct_events_is_capped_with_a_truncated_row() {
        let mut f = EgressFold::new(100);
        for i in 0..10_000 {
            f.push(deny(&format!("h{i}.test")));
        }
        let rows = f.take();
        assert_eq!(rows.len(), 101);
        let t = rows.last().unwrap();
        assert_eq!(t.decision, EgressDecision::Truncated);
        assert_eq!(t.count, 9_900);
        assert_eq!(total(&rows, |_| true), 10_000);
        // The row says what it is in its JSON form too.
        let json = serde_json::to_value(t).unwrap();
        assert_eq!(json["decision"], "truncated");
        assert_eq!(json["count"], 9_900);
    }

    #[test]
    fn protected_events_are_never_dropped_however_many() {
        let mut f = EgressFold::new(50);
        // A flood of ordinary events first fills the itemised rows...
        for i in 0..1_000 {
            f.push(deny(&format!("h{i}.test")));
        }
        // ...then exfiltration attempts to ever-new hosts and paths, and granted requests.
        for i in 0..5_000 {
            f.push(exfil(&format!("evil{i}.test"), &format!("/p{i}")));
            let mut g = EgressEvent::new(3, EgressKind::Https, EgressDecision::Allow);
            g.grant = Some(GrantNames::one("github"));
            g.host = Some("api.github.test".into());
            g.path = Some(format!("/repos/{i}"));
            f.push(g);
        }
        let rows = f.take();
        assert_eq!(
            total(&rows, |e| e.decision == EgressDecision::Exfiltration),
            5_000
        );
        assert_eq!(
            total(&rows, |e| e.decision == EgressDecision::Allow
                && e.grant.is_some()),
            5_000
        );
        // Bounded all the same: 50 ordinary rows, the truncated row, and at most a few
        // protected rows past the two coarsening steps.
        assert!(rows.len() <= 50 + 1 + 2 * 50 + 2, "{} rows", rows.len());
        // A coarsened row never claims a path only some of its events had.
        assert!(
            rows.iter()
                .filter(|e| e.count > 1 && e.decision == EgressDecision::Exfiltration)
                .all(|e| e.path.is_none())
        );
    }

    #[test]
    fn folded_rows_add_their_bytes_and_counts_from_upstream() {
        let mut f = EgressFold::new(10);
        for n in [3u64, 4] {
            let mut e = EgressEvent::new(1, EgressKind::Connection, EgressDecision::Closed);
            e.bytes_up = Some(10 * n);
            e.count = n;
            f.push(e);
        }
        let mut t = EgressEvent::new(0, EgressKind::Connection, EgressDecision::Truncated);
        t.count = 99;
        f.push(t);
        let rows = f.take();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].count, rows[0].bytes_up), (7, Some(70)));
        assert_eq!(
            (rows[1].decision, rows[1].count),
            (EgressDecision::Truncated, 99)
        );
    }
}
