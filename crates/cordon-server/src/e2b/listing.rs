//! `GET /v2/sandboxes` (and `/sandboxes`): `Sandbox.list` as E2B answers it. Running and
//! paused sandboxes of the caller's tenant, newest first (`order=asc` for oldest first),
//! filtered by `metadata` (`k=v&k2=v2`, URL-encoded once more), `state` (`running,paused`),
//! `template` (the E2B template name the sandbox was made from) and `startedAfter` (RFC
//! 3339); `limit` a page, `nextToken` (from the `X-Next-Token` answer header) the next one.
//! The token is the last entry's place in the order (its start time and id), not an offset:
//! sandboxes made or ended between two pages neither repeat nor skip the others.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::detail_of;
use super::{E2b, From as Peer, e2b_error};
use crate::model::SandboxInfo;

/// What a list asks for.
#[derive(Debug, Default, PartialEq)]
struct ListQuery {
    labels: Vec<(String, String)>,
    states: Option<Vec<String>>,
    template: Option<String>,
    started_after_ms: Option<i64>,
    ascending: bool,
    limit: Option<usize>,
    after: Option<Cursor>,
}

/// A place in the order: an entry's start time (ms) and id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Cursor(i64, String);

impl Cursor {
    fn of(i: &SandboxInfo) -> Cursor {
        Cursor(i.created_ms, i.id.clone())
    }

    fn token(&self) -> String {
        format!("{}.{}", self.0, self.1)
    }

    fn parse(s: &str) -> Option<Cursor> {
        let (ms, id) = s.split_once('.')?;
        Some(Cursor(ms.parse().ok()?, id.to_string()))
    }
}

fn parse(raw: &str) -> Result<ListQuery, String> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw).map_err(|e| format!("the query: {e}"))?;
    let mut q = ListQuery::default();
    for (k, v) in pairs {
        match k.as_str() {
            "metadata" | "query" => {
                let inner: Vec<(String, String)> =
                    serde_urlencoded::from_str(&v).map_err(|e| format!("metadata: {e}"))?;
                q.labels.extend(inner);
            }
            "state" => q.states = Some(v.split(',').map(|s| s.trim().to_string()).collect()),
            "template" => q.template = Some(v),
            "startedAfter" => {
                let t =
                    time::OffsetDateTime::parse(&v, &time::format_description::well_known::Rfc3339)
                        .map_err(|_| format!("startedAfter {v:?} is not an RFC 3339 time"))?;
                q.started_after_ms = Some((t.unix_timestamp_nanos() / 1_000_000) as i64);
            }
            "order" => {
                q.ascending = match v.as_str() {
                    "asc" => true,
                    "desc" => false,
                    _ => return Err(format!("order {v:?}: use asc or desc")),
                }
            }
            "limit" => {
                q.limit = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("limit {v:?} is not a number"))?
                        .max(1),
                )
            }
            "nextToken" => {
                q.after = Some(Cursor::parse(&v).ok_or_else(|| {
                    format!(
                        "nextToken {v:?} is not one this server answered: list again from the start"
                    )
                })?)
            }
            _ => {}
        }
    }
    Ok(q)
}

/// One page of `all` (the tenant's live and paused sandboxes, labels already matched):
/// the entries and the cursor of the next page, if any.
fn page(
    q: &ListQuery,
    all: Vec<SandboxInfo>,
    template_of: impl Fn(&str) -> String,
) -> (Vec<SandboxInfo>, Option<Cursor>) {
    let mut all: Vec<SandboxInfo> = all
        .into_iter()
        .filter(|i| i.state == "live" || i.state == "paused")
        .filter(|i| {
            let s = if i.paused { "paused" } else { "running" };
            q.states.as_ref().is_none_or(|v| v.iter().any(|x| x == s))
        })
        .filter(|i| q.template.as_ref().is_none_or(|t| *t == template_of(&i.id)))
        .filter(|i| q.started_after_ms.is_none_or(|ms| i.created_ms >= ms))
        .collect();
    all.sort_by_key(Cursor::of);
    if !q.ascending {
        all.reverse();
    }
    if let Some(after) = &q.after {
        all.retain(|i| {
            let c = Cursor::of(i);
            if q.ascending { c > *after } else { c < *after }
        });
    }
    let limit = q.limit.unwrap_or(usize::MAX);
    let more = all.len() > limit;
    all.truncate(limit);
    let next = if more {
        all.last().map(Cursor::of)
    } else {
        None
    };
    (all, next)
}

pub(super) async fn list(
    State(e): State<E2b>,
    from: Peer,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let t = match e.tenant(&headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let q = match parse(raw.as_deref().unwrap_or("")) {
        Ok(q) => q,
        Err(m) => return e2b_error(StatusCode::BAD_REQUEST, m),
    };
    let all = e.svc.sessions().list(&t, &q.labels);
    let template_of = |id: &str| {
        e.box_of(id)
            .map(|b| b.template.clone())
            .unwrap_or_else(|| "base".into())
    };
    let (entries, next) = page(&q, all, template_of);
    let body: Vec<_> = entries
        .iter()
        .map(|i| detail_of(&t, i, e.box_of(&i.id).as_deref()))
        .collect();
    let mut resp = Json(body).into_response();
    if let Some(v) = next.and_then(|c| HeaderValue::from_str(&c.token()).ok()) {
        resp.headers_mut().insert("x-next-token", v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse() {
        let q = parse(
            "metadata=a%3D1&state=running,paused&template=base&limit=2&order=asc\
             &startedAfter=2026-12-06T05%3A40%3A00.5%2B01%3A00&nextToken=5.sb-1",
        )
        .unwrap();
        assert_eq!(q.labels, vec![("a".into(), "1".into())]);
        assert_eq!(q.states.as_deref().unwrap(), ["running", "paused"]);
        assert_eq!(q.template.as_deref(), Some("base"));
        assert_eq!((q.limit, q.ascending), (Some(2), true));
        assert_eq!(q.started_after_ms, Some(1_796_532_000_500));
        assert_eq!(q.after, Some(Cursor(5, "sb-1".into())));
        assert!(parse("nextToken=12").is_err());
        assert!(parse("startedAfter=yesterday").is_err());
        assert!(parse("order=up").is_err());
    }
}
