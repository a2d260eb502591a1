//! E2B's snapshot and fork API (issue 46) over Cordon's snapshots: `create_snapshot(name,
//! mode)` (`POST /sandboxes/{id}/snapshots`), `list_snapshots` (`GET /snapshots`),
//! `delete_snapshot` (`DELETE /templates/{id}`: E2B keeps snapshots as templates),
//! `Sandbox.create(snapshot_id)` (a create whose `templateID` names a snapshot) and
//! `fork(count, timeout)` (`POST /sandboxes/{id}/fork`), each through the native service
//! call, so the tenant's ceiling, quotas and budget apply as to a native one.
//!
//! Where E2B's default is a memory snapshot, Cordon's is the most the sandbox's tier keeps:
//! a full snapshot where the tier has one, else its files (the container tier).

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use cordon_core::SnapshotMode;
use cordon_core::units::Dur;
use serde::{Deserialize, Serialize};

use super::wire::{ErrorBody, NewSandbox, SandboxOut};
use super::{E2b, api_error, body_json, e2b_error};
use crate::api::parse_id;
use crate::error::ApiError;
use crate::keys::Tenant;
use crate::model::{SandboxInfo, SnapshotInfo, validate_labels};
use crate::service::StartOptions;

/// E2B's default sandbox timeout (seconds), and its fork's.
const DEFAULT_TIMEOUT_S: u64 = 300;
const DEFAULT_FORK_TIMEOUT_S: u64 = 15;

/// `POST /sandboxes/{id}/snapshots`'s body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
    /// `true`: memory and files; `false`: files only; left out, the most the tier keeps.
    #[serde(default)]
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Debug, Serialize)]
struct SnapshotOut {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

/// `POST /sandboxes/{id}/fork`'s body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ForkBody {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

/// One fork's outcome, as E2B answers it.
#[derive(Debug, Serialize)]
struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<SandboxOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody>,
}

/// `GET /snapshots`'s query.
#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    #[serde(default, rename = "sandboxID")]
    sandbox_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

fn out(s: &SnapshotInfo) -> SnapshotOut {
    SnapshotOut {
        snapshot_id: s.id.clone(),
        names: s.name.iter().cloned().collect(),
    }
}

/// A call on the source sandbox `id` (a snapshot of it, a fork): the caller's tenant, the
/// call's body `req`, and the sandbox's id as given and checked (`sid`).
pub(super) struct Source<T> {
    t: Tenant,
    req: T,
    id: String,
    sid: String,
}

impl<T: serde::de::DeserializeOwned + Default + Send> axum::extract::FromRequest<E2b>
    for Source<T>
{
    type Rejection = Response;

    async fn from_request(r: axum::extract::Request, e: &E2b) -> Result<Self, Response> {
        use axum::extract::FromRequestParts;
        let (mut parts, body) = r.into_parts();
        let Ok(from) = super::From::from_request_parts(&mut parts, e).await;
        let t = e.tenant(&parts.headers, from.0)?;
        let Path(id) = Path::<String>::from_request_parts(&mut parts, e)
            .await
            .map_err(IntoResponse::into_response)?;
        let r = axum::extract::Request::from_parts(parts, body);
        let body = <Bytes as axum::extract::FromRequest<E2b>>::from_request(r, e)
            .await
            .map_err(IntoResponse::into_response)?;
        let req = body_json(&body)?;
        let sid = source_id(&id)?;
        Ok(Source { t, req, id, sid })
    }
}

/// A source sandbox E2B names: another tenant's, or no sandbox, is E2B's 404.
fn source_id(id: &str) -> Result<String, Response> {
    parse_id(id).map_err(|_| not_found(id))
}

fn not_found(id: &str) -> Response {
    e2b_error(
        StatusCode::NOT_FOUND,
        format!("sandbox \"{id}\" was not found"),
    )
}

/// A sandbox-level refusal: a sandbox that is not the tenant's is E2B's 404.
fn sandbox_error(id: &str, e: ApiError) -> Response {
    if e.code == crate::error::Code::NotFound {
        return not_found(id);
    }
    api_error(e)
}

pub(super) async fn create_snapshot(
    State(e): State<E2b>,
    Source { t, req, id, sid }: Source<SnapshotBody>,
) -> Response {
    let mode = req.memory.map(|m| {
        if m {
            SnapshotMode::Full
        } else {
            SnapshotMode::Filesystem
        }
    });
    let snaps = e.svc.snapshots();
    // E2B gives a name already in use to the new snapshot: the old one goes.
    if let Some(name) = &req.name
        && let Ok(old) = snaps.get(&t, name).await
        && let Err(err) = snaps.delete(&t, &old.id).await
    {
        return api_error(err);
    }
    match snaps.take(&t, &sid, req.name, mode).await {
        Ok(s) => (StatusCode::CREATED, Json(out(&s))).into_response(),
        Err(err) => sandbox_error(&id, err),
    }
}

pub(super) async fn list_snapshots(
    State(e): State<E2b>,
    from: super::From,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let t = match e.tenant(&headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let q: ListQuery = match serde_urlencoded::from_str(q.as_deref().unwrap_or("")) {
        Ok(q) => q,
        Err(err) => {
            return e2b_error(StatusCode::BAD_REQUEST, format!("the query: {err}"));
        }
    };
    let all = match e.svc.snapshots().list(&t).await {
        Ok(a) => a,
        Err(err) => return api_error(err),
    };
    // `name` may be tag-qualified (`name:tag`) or team-qualified (`team/name`).
    let wanted = q.name.as_deref().map(|n| {
        let n = n.rsplit('/').next().unwrap_or(n);
        n.split(':').next().unwrap_or(n).to_string()
    });
    let picked: Vec<SnapshotOut> = all
        .iter()
        .filter(|s| q.sandbox_id.as_deref().is_none_or(|id| s.source == id))
        .filter(|s| {
            wanted
                .as_deref()
                .is_none_or(|n| s.id == n || s.name.as_deref() == Some(n))
        })
        .map(out)
        .collect();
    Json(picked).into_response()
}

/// `DELETE /templates/{id}` for a snapshot; any other templates route is refused as before.
pub(super) async fn templates(
    state: State<E2b>,
    from: super::From,
    method: Method,
    headers: HeaderMap,
    uri: Uri,
    body: axum::body::Body,
) -> Response {
    let rest = uri.path().trim_start_matches("/templates/");
    if let Some(r) =
        super::builds::templates_route(&state.0, from, &method, &headers, rest, uri.query(), body)
            .await
    {
        return r;
    }
    if method == Method::GET
        && let Some(alias) = rest.strip_prefix("aliases/")
        && !alias.is_empty()
        && !alias.contains('/')
    {
        return alias_of(&state.0, from, &headers, alias).await;
    }
    if method != Method::DELETE || rest.contains('/') || rest.is_empty() {
        return super::refused(state, from, headers, uri).await;
    }
    let e = state.0;
    let t = match e.tenant(&headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let name = percent_encoding::percent_decode_str(rest).decode_utf8_lossy();
    if let Some(r) = super::builds::delete(&e, &t, &name).await {
        return r;
    }
    let snaps = e.svc.snapshots();
    let key = rest.split(':').next().unwrap_or(rest);
    let id = match snaps.get(&t, key).await {
        Ok(s) => s.id,
        Err(_) => {
            return e2b_error(
                StatusCode::NOT_FOUND,
                format!("template or snapshot \"{rest}\" was not found"),
            );
        }
    };
    match snaps.delete(&t, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => api_error(err),
    }
}

/// E2B's `TemplateAliasResponse`.
#[derive(Debug, Serialize)]
struct AliasOut {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): 200 for a name a create takes, a
/// template the operator maps (every tenant's: `public`) or one of the tenant's own
/// snapshots; 404 otherwise. Another tenant's snapshot of that name is not seen (404, where
/// E2B answers 403 for another team's alias: a name says nothing of other tenants here).
async fn alias_of(e: &E2b, from: super::From, headers: &HeaderMap, alias: &str) -> Response {
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let alias = percent_encoding::percent_decode_str(alias).decode_utf8_lossy();
    let key = alias.split(':').next().unwrap_or(&alias);
    if let Some(id) = e.builds.template_id(&t, key) {
        let out = AliasOut {
            template_id: id,
            public: false,
        };
        return (StatusCode::OK, Json(out)).into_response();
    }
    if super::maps_template(e, key) {
        let out = AliasOut {
            template_id: key.to_string(),
            public: true,
        };
        return (StatusCode::OK, Json(out)).into_response();
    }
    match e.svc.snapshots().get(&t, key).await {
        Ok(s) => {
            let out = AliasOut {
                template_id: s.id,
                public: false,
            };
            (StatusCode::OK, Json(out)).into_response()
        }
        Err(_) => e2b_error(
            StatusCode::NOT_FOUND,
            format!(
                "template \"{key}\" was not found: a create takes the templates the operator \
                 maps in [e2b.templates] (and base, code-interpreter-v1) and your snapshots' names"
            ),
        ),
    }
}

/// Each started sandbox as E2B's create answers it (its envd tokens minted now), each
/// failure as E2B's error.
fn results(
    e: &E2b,
    t: &Tenant,
    template: &str,
    ttl_ms: i64,
    started: Vec<Result<SandboxInfo, ApiError>>,
) -> Vec<ForkResult> {
    started
        .into_iter()
        .map(|r| match r {
            Ok(info) => {
                let b = e.adopt(t, &info.id, template, ttl_ms);
                ForkResult {
                    sandbox: Some(super::sandbox_out(t, &info, &b)),
                    error: None,
                }
            }
            Err(err) => ForkResult {
                sandbox: None,
                error: Some(ErrorBody {
                    code: err.code.status().as_u16(),
                    message: super::message_of(&err),
                }),
            },
        })
        .collect()
}

pub(super) async fn fork(
    State(e): State<E2b>,
    Source { t, req, id, sid }: Source<ForkBody>,
) -> Response {
    let timeout = req.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_S).max(1);
    let ttl = Dur(Duration::from_secs(timeout));
    let opts = StartOptions {
        ttl: Some(ttl),
        idle_timeout: Some(ttl),
        labels: Default::default(),
    };
    let template = e
        .box_of(&sid)
        .map(|b| b.template.clone())
        .unwrap_or_else(|| "base".into());
    match e
        .svc
        .snapshots()
        .fork(&t, &sid, req.count.unwrap_or(1), opts)
        .await
    {
        Ok((_, started)) => {
            e.sweep().await;
            let r = results(&e, &t, &template, (timeout * 1000) as i64, started);
            (StatusCode::CREATED, Json(r)).into_response()
        }
        Err(err) => sandbox_error(&id, err),
    }
}

/// `Sandbox.create(snapshot_id)`: a create whose `templateID` names one of the tenant's
/// snapshots (by id, or by a name no `[e2b.templates]` entry maps) starts a sandbox from
/// it; `None` for any other create.
pub(super) async fn create_from(e: &E2b, t: &Tenant, req: &NewSandbox) -> Option<Response> {
    let key = req
        .template_id
        .split(':')
        .next()
        .unwrap_or(&req.template_id);
    if !key.starts_with("snap-") && super::maps_template(e, key) {
        return None;
    }
    let snap = e.svc.snapshots().get(t, key).await.ok()?;
    if req.env_vars.as_ref().is_some_and(|v| !v.is_empty()) {
        return Some(e2b_error(
            StatusCode::BAD_REQUEST,
            "envs is not supported for a sandbox from a snapshot on Cordon's E2B listener: it \
             has the snapshot's environment; pass a command's own envs instead",
        ));
    }
    let ports = match super::ports_of(e, req) {
        Ok(p) => p,
        Err(r) => return Some(r),
    };
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S).max(1);
    let labels = req.metadata.clone().unwrap_or_default();
    if let Err(err) = validate_labels(&labels) {
        return Some(api_error(err));
    }
    let ttl = Dur(Duration::from_secs(timeout));
    let opts = StartOptions {
        ttl: Some(ttl),
        idle_timeout: Some(ttl),
        labels,
    };
    let started = match e.svc.snapshots().start(t, &snap.id, 1, opts).await {
        Ok(s) => s,
        Err(err) => return Some(api_error(err)),
    };
    e.sweep().await;
    let Some(first) = started.into_iter().next() else {
        return Some(e2b_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no sandbox started from the snapshot",
        ));
    };
    Some(match first {
        Ok(info) => {
            let b = e.adopt(t, &info.id, &req.template_id, (timeout * 1000) as i64);
            *super::lock(&b.ports) = ports;
            (StatusCode::CREATED, Json(super::sandbox_out(t, &info, &b))).into_response()
        }
        Err(err) => api_error(err),
    })
}
