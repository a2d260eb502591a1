//! E2B's control plane (`X-API-KEY`): create, connect (and resume), detail, list, kill,
//! timeout, pause, each through the native service call. What Cordon does not serve is
//! refused in E2B's error shape, saying what Cordon does instead.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cordon_core::units::Dur;

use super::wire::{ConnectBody, NewSandbox, TimeoutBody};
use super::{E2b, api_error, body_json, detail_of, e2b_error, sandbox_out};
use crate::api::parse_id;
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{CreateRequest, PatchRequest, SandboxInfo, validate_labels};
use crate::service::PauseMode;
use serde::Deserialize;

/// E2B's default sandbox timeout, seconds.
const DEFAULT_TIMEOUT_S: u64 = 300;

type Peer = super::From;

impl Default for TimeoutBody {
    fn default() -> Self {
        TimeoutBody {
            timeout: DEFAULT_TIMEOUT_S,
        }
    }
}

fn refuse(what: &str, instead: &str) -> Response {
    e2b_error(
        StatusCode::BAD_REQUEST,
        format!("{what} is not supported by Cordon's E2B listener: {instead}"),
    )
}

pub(super) async fn create(
    State(e): State<E2b>,
    from: Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let t = match e.tenant(&headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req: NewSandbox = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(err) => {
            return e2b_error(StatusCode::BAD_REQUEST, format!("the request body: {err}"));
        }
    };
    if let Some(r) = super::snapshots::create_from(&e, &t, &req).await {
        return r;
    }
    let plan = match plan_create(&e, &t, req) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let start = start_command(&e, plan.create.template.as_deref()).await;
    let info = match e.svc.sessions().create(&t, plan.create).await {
        Ok(i) => i,
        Err(err) => return api_error(err),
    };
    if let Some(exec) = start
        && let Err(err) = e.svc.procs().start_background(&t, &info.id, &exec).await
    {
        let _ = e.svc.sessions().destroy(&t, &info.id).await;
        return e2b_error(
            err.code.status(),
            format!(
                "the template's start command could not be started ({}): the sandbox was \
                 removed; try again",
                err.message
            ),
        );
    }
    e.sweep().await;
    let b = e.adopt(
        &t,
        &info.id,
        &plan.template_id,
        (plan.timeout_s * 1000) as i64,
    );
    b.auto_resume
        .store(plan.auto_resume, std::sync::atomic::Ordering::Relaxed);
    *super::lock(&b.ports) = plan.ports;
    (StatusCode::CREATED, Json(sandbox_out(&t, &info, &b))).into_response()
}

/// The start command of a template built through E2B's API with `set_start_cmd` (its
/// plan's last input is the start, and its image's command the start command), as a
/// background exec in the template's working directory: E2B starts it with every sandbox
/// of the template. `None` for every other template (an imported image's command is not
/// started).
async fn start_command(e: &E2b, template: Option<&str>) -> Option<crate::model::ExecBody> {
    let name = template?.to_string();
    let data = e.svc.config().data_dir.clone();
    let m = tokio::task::spawn_blocking(move || {
        cordon_template::Store::open(&data).ok()?.get(&name).ok()
    })
    .await
    .ok()??;
    let cordon_template::BuiltFrom::Build { steps, .. } = &m.built_from else {
        return None;
    };
    let planned_start = steps.last().is_some_and(|s| s.starts_with("START "));
    if !planned_start || m.image.cmd.is_empty() {
        return None;
    }
    Some(crate::model::ExecBody {
        argv: Some(m.image.cmd.clone()),
        cwd: m.image.working_dir.clone(),
        background: true,
        ..Default::default()
    })
}

/// An E2B create as Cordon's: the native create, and what the listener keeps of it.
struct PlannedCreate {
    create: CreateRequest,
    template_id: String,
    timeout_s: u64,
    auto_resume: bool,
    ports: super::PortAccess,
}

/// The native create an E2B create means (its template mapped, its timeout the sandbox's
/// ttl and idle timeout, its network options narrowing egress), or the refusal of what
/// Cordon does not serve.
fn plan_create(e: &E2b, t: &Tenant, mut req: NewSandbox) -> Result<PlannedCreate, Response> {
    refuse_unserved(&req)?;
    let auto_pause = req.auto_pause == Some(true);
    let auto_resume = req.auto_resume.as_ref().is_some_and(|a| a.enabled);
    if auto_resume && !auto_pause {
        return Err(e2b_error(
            StatusCode::BAD_REQUEST,
            "autoResume needs autoPause: only a sandbox its timeout pauses is resumed by a request",
        ));
    }
    let ports = super::ports_of(e, &req)?;
    let template = super::template_of(e, t, &req.template_id)?;
    let timeout_s = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S).max(1);
    let metadata = req.metadata.take().unwrap_or_default();
    validate_labels(&metadata).map_err(api_error)?;
    let (allow_hosts, deny_hosts) = egress_of(&req)?;
    let ttl = Dur(Duration::from_secs(timeout_s));
    // E2B's home is the sandbox's HOME, as under envd (unless the sandbox's envs say).
    let mut env = req.env_vars.unwrap_or_default();
    env.entry("HOME".to_string())
        .or_insert_with(|| super::HOME.to_string());
    let create = CreateRequest {
        tier: e.cfg.tier,
        limits: e.cfg.limits.clone(),
        env,
        allow_hosts,
        deny_hosts,
        template,
        ttl: Some(ttl),
        // E2B has no idle timeout: the sandbox lives until its timeout.
        idle_timeout: Some(ttl),
        labels: metadata,
        // `autoPauseMemory: false`: the timeout's pause keeps the files only.
        on_timeout: if auto_pause && req.auto_pause_memory == Some(false) {
            cordon_engine::OnTimeout::PauseFiles
        } else if auto_pause {
            cordon_engine::OnTimeout::Pause
        } else {
            cordon_engine::OnTimeout::Destroy
        },
        ..Default::default()
    };
    Ok(PlannedCreate {
        create,
        template_id: req.template_id,
        timeout_s,
        auto_resume,
        ports,
    })
}

/// What E2B's create has that Cordon serves its own way: refused, saying which.
fn refuse_unserved(req: &NewSandbox) -> Result<(), Response> {
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refuse(
            "volumeMounts",
            "Cordon's volumes are made and mounted through its own API (POST /v1/volumes, \"volumes\" in a native create)",
        ));
    }
    if req.mcp.is_some() {
        return Err(refuse(
            "mcp",
            "Cordon serves MCP itself (POST /mcp on its API, or `cordon mcp`); no MCP gateway runs inside a sandbox",
        ));
    }
    if req.secrets.is_some() {
        return Err(refuse(
            "secrets",
            "a sandbox gets credentials only as grants of the operator's catalogue, swapped in by the egress proxy (docs/service.md)",
        ));
    }
    Ok(())
}

/// The hosts a create allows and denies. Egress stays deny-by-default: E2B's network
/// options can only narrow it. Hosts asked for go to the gate like a native create's,
/// which refuses any beyond the ceiling.
fn egress_of(req: &NewSandbox) -> Result<(Vec<String>, Vec<String>), Response> {
    let mut allow_hosts = Vec::new();
    let mut deny_hosts = Vec::new();
    if let Some(n) = &req.network {
        if n.rules.is_some() {
            return Err(refuse(
                "network.rules",
                "credentials reach a host only as grants of the operator's catalogue, which Cordon's egress proxy swaps in and masks on the way back (docs/service.md)",
            ));
        }
        if n.egress_proxy.is_some() {
            return Err(refuse(
                "network.egressProxy",
                "a sandbox's egress always goes through Cordon's own allow-list proxy",
            ));
        }
        allow_hosts = n.allow_out.clone().unwrap_or_default();
        deny_hosts = n.deny_out.clone().unwrap_or_default();
    }
    if req.allow_internet_access == Some(false) {
        allow_hosts.clear();
    }
    Ok((allow_hosts, deny_hosts))
}

fn not_found(id: &str) -> Response {
    e2b_error(
        StatusCode::NOT_FOUND,
        format!(
            "sandbox {id} not found (list yours with Sandbox.list; other tenants' sandboxes are not visible)"
        ),
    )
}

/// A call about one of the caller's sandboxes, live or paused: its tenant, its checked id and
/// what it is. Any other id (malformed, another tenant's, ended) is E2B's 404.
pub(super) struct About {
    pub t: Tenant,
    pub id: String,
    pub info: SandboxInfo,
}

impl axum::extract::FromRequestParts<E2b> for About {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        e: &E2b,
    ) -> Result<Self, Response> {
        let Ok(from) = Peer::from_request_parts(parts, e).await;
        let t = e.tenant(&parts.headers, from.0)?;
        let Path(id) = Path::<String>::from_request_parts(parts, e)
            .await
            .map_err(IntoResponse::into_response)?;
        let id = parse_id(&id).map_err(|_| not_found(&id))?;
        match e.svc.sessions().info(&t, &id).await {
            Ok(info) if info.state == "live" || info.state == "paused" => Ok(About { t, id, info }),
            _ => Err(not_found(&id)),
        }
    }
}

pub(super) async fn detail(State(e): State<E2b>, a: About) -> Response {
    Json(detail_of(&a.t, &a.info, e.box_of(&a.id).as_deref())).into_response()
}

pub(super) async fn kill(State(e): State<E2b>, About { t, id, .. }: About) -> Response {
    match e.svc.sessions().destroy(&t, &id).await {
        Ok(_) => {
            e.forget(&id);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) if err.code == Code::NotFound => not_found(&id),
        Err(err) => api_error(err),
    }
}

/// Sets the TTL so the sandbox ends `secs` from now (E2B's timeouts count from the call;
/// Cordon's TTL from the creation, paused time not counted).
async fn extend(
    e: &E2b,
    t: &Tenant,
    id: &str,
    info: &SandboxInfo,
    secs: u64,
    only_longer: bool,
) -> Result<SandboxInfo, ApiError> {
    let now = super::now_ms();
    let b = e.box_of(id);
    let ttl_now = b
        .as_ref()
        .map(|b| b.ttl_ms.load(Ordering::Relaxed))
        .unwrap_or(info.expires_ms - info.created_ms);
    let paused_total = (info.expires_ms - info.created_ms - ttl_now).max(0);
    let age = (now - info.created_ms - paused_total).max(0);
    let want = age + (secs as i64) * 1000;
    if only_longer && info.expires_ms >= now + (secs as i64) * 1000 {
        return Ok(info.clone());
    }
    let ttl = Dur(Duration::from_millis(want.max(1) as u64));
    let r = e
        .svc
        .sessions()
        .patch(
            t,
            id,
            PatchRequest {
                ttl: Some(ttl),
                idle_timeout: Some(ttl),
            },
        )
        .await?;
    if let Some(b) = b {
        b.ttl_ms.store(want, Ordering::Relaxed);
    }
    Ok(r)
}

pub(super) async fn set_timeout(
    State(e): State<E2b>,
    About { t, id, info }: About,
    body: Bytes,
) -> Response {
    let req: TimeoutBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match extend(&e, &t, &id, &info, req.timeout.max(1), false).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => api_error(err),
    }
}

/// `POST /sandboxes/{id}/pause`'s optional body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PauseBody {
    /// `false`: keep the files only (a resume boots it again); left out or `true`: all.
    #[serde(default)]
    memory: Option<bool>,
}

pub(super) async fn pause(
    State(e): State<E2b>,
    About { t, id, info }: About,
    body: Bytes,
) -> Response {
    let req: PauseBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if info.paused {
        return e2b_error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        );
    }
    let mode = if req.memory == Some(false) {
        PauseMode::Files
    } else {
        PauseMode::Memory
    };
    match super::retry_busy(|| e.svc.sessions().pause(&t, &id, mode)).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => api_error(err),
    }
}

/// Connect: answers the sandbox (with its access token), resuming it when paused (201)
/// and extending, never shortening, its timeout when one is given.
pub(super) async fn connect(
    State(e): State<E2b>,
    About { t, id, mut info }: About,
    body: Bytes,
) -> Response {
    let req: ConnectBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut status = StatusCode::OK;
    if info.paused {
        info = match e.svc.sessions().resume(&t, &id).await {
            Ok(i) => i,
            Err(err) => return api_error(err),
        };
        status = StatusCode::CREATED;
    }
    let b = e.adopt(&t, &id, "base", info.expires_ms - info.created_ms);
    if let Some(secs) = req.timeout {
        match extend(&e, &t, &id, &info, secs.max(1), true).await {
            Ok(i) => info = i,
            Err(err) => return api_error(err),
        }
    }
    (status, Json(sandbox_out(&t, &info, &b))).into_response()
}
