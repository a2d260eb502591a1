//! The live dashboard. `GET /dashboard` serves one read-only page whose HTML, script and
//! style are compiled into the binary (no build step, nothing fetched from elsewhere); the
//! page holds no data. It reads everything with the API key the user gives it, from
//! `GET /v1/health` and `GET /v1/events`: a server-sent event stream of a `stats` snapshot
//! (live sandboxes with their tier and tenant, pool fill) every second and each audit row as
//! it is written (creates with their start time, execs with their termination and timings,
//! egress denials and exfiltration refusals). A key sees its own tenant's; the tenants the
//! operator names in `edge.dashboard_operators` see every tenant's.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cordon_core::Tier;
use futures_util::Stream;
use serde::Serialize;

use crate::api::Auth;
use crate::audit::{Event, Query};
use crate::keys::Tenant;
use crate::service::Service;

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");
const STYLE: &str = include_str!("dashboard/dashboard.css");

/// How often the stream looks for new audit rows and sends a snapshot.
const TICK: Duration = Duration::from_millis(500);
/// Snapshots are sent every this many ticks.
const STATS_EVERY: u32 = 2;
/// Audit rows replayed when a stream starts: the last of the past 15 minutes.
const REPLAY_ROWS: usize = 200;
const REPLAY_WINDOW_MS: i64 = 15 * 60 * 1000;
/// Sandboxes a snapshot lists (their counts cover all).
const SNAPSHOT_SANDBOXES: usize = 200;

/// The page's files: the content, its type and a policy that lets it load only itself.
fn asset(body: &'static str, ctype: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

pub(crate) async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

pub(crate) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub(crate) async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// Live sandboxes of one tier and tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LiveCount {
    pub tier: Tier,
    pub tenant: String,
    pub count: usize,
}

/// One live sandbox as the dashboard lists it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LiveSandbox {
    pub id: String,
    pub tier: Tier,
    pub tenant: String,
    /// `live`, `paused` or `destroying`.
    pub state: String,
    pub created_ms: i64,
    /// `pool` or `cold`.
    pub source: String,
    /// Microseconds its create took (0 from a warm pool).
    pub start_us: u64,
    pub busy: bool,
}

/// A warm pool's fill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PoolFill {
    pub tier: Tier,
    /// Sandboxes the operator asked to keep warm.
    pub size: usize,
    /// Warm sandboxes ready now.
    pub ready: usize,
}

/// The `stats` event: what is live now.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Snapshot {
    pub time_ms: i64,
    /// The key's tenant.
    pub tenant: String,
    /// `tenant` (its own sandboxes and rows) or `all` (an operator's dashboard).
    pub scope: String,
    /// Live sandboxes per tier and tenant.
    pub live: Vec<LiveCount>,
    /// The oldest first, at most 200.
    pub sandboxes: Vec<LiveSandbox>,
    pub pools: Vec<PoolFill>,
}

/// What one key's dashboard may see: its tenant's, or every tenant's.
#[derive(Clone)]
struct Scope {
    tenant: Tenant,
    all: bool,
}

impl Scope {
    fn of(svc: &Service, tenant: Tenant) -> Self {
        let all = svc.config().edge.dashboard_operators.contains(&tenant.0);
        Scope { tenant, all }
    }

    fn only(&self) -> Option<&Tenant> {
        (!self.all).then_some(&self.tenant)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn snapshot(svc: &Service, scope: &Scope) -> Snapshot {
    let live = svc.sessions().live_sandboxes(scope.only());
    let mut counts: Vec<LiveCount> = Vec::new();
    for (t, s) in &live {
        match counts
            .iter_mut()
            .find(|c| c.tier == s.tier && c.tenant == t.0)
        {
            Some(c) => c.count += 1,
            None => counts.push(LiveCount {
                tier: s.tier,
                tenant: t.0.clone(),
                count: 1,
            }),
        }
    }
    counts.sort_by(|a, b| (a.tier, &a.tenant).cmp(&(b.tier, &b.tenant)));
    let cfg = svc.config();
    let pools = Tier::ALL
        .iter()
        .filter_map(|tier| {
            let size = cfg.pools.get(tier).copied().unwrap_or(0)
                + cfg
                    .spec_pools
                    .iter()
                    .filter(|p| p.tier() == Some(*tier))
                    .map(|p| p.size)
                    .sum::<usize>();
            (size > 0).then(|| PoolFill {
                tier: *tier,
                size,
                ready: svc.pools().ready(*tier),
            })
        })
        .collect();
    Snapshot {
        time_ms: now_ms(),
        tenant: scope.tenant.0.clone(),
        scope: if scope.all { "all" } else { "tenant" }.into(),
        live: counts,
        sandboxes: live
            .into_iter()
            .take(SNAPSHOT_SANDBOXES)
            .map(|(t, s)| LiveSandbox {
                id: s.id,
                tier: s.tier,
                tenant: t.0,
                state: s.state,
                created_ms: s.created_ms,
                source: s.source,
                start_us: s.start_us,
                busy: s.busy,
            })
            .collect(),
        pools,
    }
}

/// Audit rows of the scope after `after` (at most `limit`), or none when the store fails
/// (the stream goes on; the next tick asks again).
async fn rows(svc: &Service, scope: &Scope, after: i64, since_ms: i64, limit: u32) -> Vec<Event> {
    let audit = svc.audit().clone();
    let tenant = scope.only().map(|t| t.0.clone());
    let q = Query {
        after_id: Some(after),
        since_ms: Some(since_ms),
        limit: Some(limit),
        ..Query::default()
    };
    tokio::task::spawn_blocking(move || audit.query(tenant.as_deref(), &q))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// The last [`REPLAY_ROWS`] rows of the past [`REPLAY_WINDOW_MS`], and the id to go on from.
async fn replay(svc: &Service, scope: &Scope) -> (VecDeque<Event>, i64) {
    let since = now_ms() - REPLAY_WINDOW_MS;
    let mut kept: VecDeque<Event> = VecDeque::new();
    let mut after = 0;
    // Bounded: at most 20 pages of 1000 rows.
    for _ in 0..20 {
        let page = rows(svc, scope, after, since, 1000).await;
        let full = page.len() == 1000;
        for e in page {
            after = after.max(e.id);
            kept.push_back(e);
            if kept.len() > REPLAY_ROWS {
                kept.pop_front();
            }
        }
        if !full {
            break;
        }
    }
    (kept, after)
}

struct Follow {
    /// The tenant's place for one event stream, given back when the stream ends.
    _slot: crate::service::Slot,
    svc: Service,
    scope: Scope,
    pending: VecDeque<SseEvent>,
    after: Option<i64>,
    ticks: u32,
}

fn sse<T: Serialize>(name: &str, v: &T) -> SseEvent {
    SseEvent::default()
        .event(name)
        .json_data(v)
        .unwrap_or_else(|_| SseEvent::default().event("error").data("encoding"))
}

/// `GET /v1/events`: the dashboard's stream (`stats` and `audit` events) of the key's
/// tenant, or of every tenant for an operator's. It ends when the server shuts down.
pub(crate) async fn events(
    State(svc): State<Service>,
    Auth(t): Auth,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, crate::ApiError> {
    let slot = svc.event_stream_slot(&t)?;
    let scope = Scope::of(&svc, t);
    let start = Follow {
        _slot: slot,
        svc,
        scope,
        pending: VecDeque::new(),
        after: None,
        ticks: 0,
    };
    let stream = futures_util::stream::unfold(start, |mut f| async move {
        loop {
            if let Some(e) = f.pending.pop_front() {
                return Some((Ok(e), f));
            }
            let after = match f.after {
                None => {
                    let (rows, after) = replay(&f.svc, &f.scope).await;
                    f.pending
                        .push_back(sse("stats", &snapshot(&f.svc, &f.scope)));
                    f.pending.extend(rows.iter().map(|r| sse("audit", r)));
                    f.after = Some(after);
                    continue;
                }
                Some(a) => a,
            };
            let stop = f.svc.cancelled();
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(TICK) => {}
            }
            for r in rows(&f.svc, &f.scope, after, 0, 500).await {
                f.after = Some(f.after.unwrap_or(0).max(r.id));
                f.pending.push_back(sse("audit", &r));
            }
            f.ticks += 1;
            if f.ticks.is_multiple_of(STATS_EVERY) {
                f.pending
                    .push_back(sse("stats", &snapshot(&f.svc, &f.scope)));
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
