//! E2B's template build API (`Template.build`, `build_in_background`, `get_build_status`,
//! tags) over `cordon template build --plan`: a build is asked (`POST /v3/templates`), its
//! copies' files uploaded (`GET`/`PUT /templates/{id}/files/{hash}`), started (`POST
//! /v2/templates/{id}/builds/{build}`) and followed (`GET …/status`). The steps run in a
//! container-tier sandbox the tenant's gate admitted, with its memory reserved under the
//! tenant's budget, as the native builder runs them (docs/templates.md); the template
//! that comes out is the tenant's alone (the gate refuses its name to anyone else).
//!
//! What E2B does that Cordon does not: no image is pulled from a registry (an image a
//! build starts from is one the operator maps in `[e2b.images]`), and a step asked to run
//! as `root` runs as the build's one unprivileged user, who owns the whole root being
//! built (no program in a sandbox runs as uid 0).

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use cordon_template::{BuildPlan, BuildResult, PlanStep, StartCommand};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::registry::{
    BuildRec, Built, Link, LogLine, MAX_LOG_BYTES, MAX_TAGS, Reason, Registry, Status, TemplateRec,
    lock, now_ms, split_tag, valid_name,
};
use super::{E2b, api_error, body_json, e2b_error};
use crate::keys::Tenant;
use crate::model::CreateRequest;

/// The most log lines a build keeps (later ones are counted, not kept), and one line's
/// most bytes.
const MAX_LOG_LINES: usize = 10_000;
const MAX_LINE_BYTES: usize = 4096;
/// The most log entries one status call answers (as E2B's).
const STATUS_PAGE: usize = 100;
/// How long an upload link stays good.
const UPLOAD_LINK_LIFE: Duration = Duration::from_secs(3600);
/// The longest a whole build may run before it is stopped.
const BUILD_WALL: Duration = Duration::from_secs(3600);
/// The build sandbox's memory when the request gives none (E2B's default).
const DEFAULT_MEMORY_MB: u64 = 1024;
/// The most upload links one tenant holds at once (the oldest go first).
const MAX_LINKS: usize = 256;
/// The most builds one tenant may have asked for and not started.
const MAX_UNSTARTED: usize = 16;
/// Where a build's steps start, and who they run as, until a step says otherwise (E2B's).
const DEFAULT_WORKDIR: &str = "/home/user";

/// Removes Cordon templates no tag names any more (a root a live sandbox uses stays until
/// the sandbox ends).
async fn remove_from_store(e: &E2b, names: Vec<String>) -> Result<(), String> {
    if names.is_empty() {
        return Ok(());
    }
    let data = e.svc.config().data_dir.clone();
    let removed = tokio::task::spawn_blocking(move || {
        let store = cordon_template::Store::open(&data)?;
        for n in names {
            match store.remove(&n) {
                Ok(_) | Err(cordon_template::TemplateError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    match removed {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(err) => Err(err.to_string()),
    }
}

fn random_hex(n: usize) -> Result<String, Response> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).map_err(|_| {
        e2b_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no randomness for an id; try again",
        )
    })?;
    Ok(hex::encode(bytes))
}

/// A random UUID (version 4), as E2B's build ids are.
fn uuid4() -> Result<String, Response> {
    let h = random_hex(16)?;
    let mut b = hex::decode(&h).unwrap_or_default();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    super::rfc3339(d.as_millis() as i64)
}

fn log_line(level: &'static str, message: String) -> LogLine {
    LogLine {
        timestamp: rfc3339(SystemTime::now()),
        level,
        message,
    }
}

fn builds_off() -> Response {
    e2b_error(
        StatusCode::NOT_IMPLEMENTED,
        "template builds are turned off on this server (e2b.builds = 0): build one with \
         `cordon template build`, then map it in [e2b.templates]",
    )
}

fn not_found(what: &str) -> Response {
    e2b_error(StatusCode::NOT_FOUND, format!("{what} was not found"))
}

/// `POST /v3/templates`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BuildRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default, rename = "cpuCount")]
    cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    memory_mb: Option<u64>,
}

#[derive(Debug, Serialize)]
struct BuildRequested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

/// `POST /v3/templates`: a new build of a (new or existing) template of the tenant's.
pub(super) async fn request(
    State(e): State<E2b>,
    from: super::From,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let t = match e.tenant(&headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if e.builds.slots.is_none() {
        return builds_off();
    }
    let req: BuildRequest = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(name) = req.name.or(req.alias) else {
        return e2b_error(StatusCode::BAD_REQUEST, "a build needs the template's name");
    };
    let (alias, tag) = split_tag(&name);
    let mut tags: Vec<String> = req.tags.unwrap_or_default();
    if let Some(tag) = tag {
        tags.insert(0, tag.to_string());
    }
    if tags.is_empty() {
        tags.push("default".into());
    }
    if !valid_name(alias) {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            format!(
                "template name {alias:?} is not valid: lowercase letters, digits, '.', '_' and \
                 '-', starting with a letter or digit, at most 63 characters"
            ),
        );
    }
    if let Some(bad) = tags.iter().find(|t| !valid_name(t)) {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            format!("tag {bad:?} is not valid: lowercase letters, digits, '.', '_' and '-'"),
        );
    }
    if tags.len() > MAX_TAGS {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            format!("a template has at most {MAX_TAGS} tags"),
        );
    }
    let memory_mb = req.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).max(128);
    let _ = req.cpu_count; // the tier's CPU share is the operator's (docs/e2b.md)
    let (template_id, build_id) = match (random_hex(10), uuid4()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let mut st = lock(&e.builds.state);
    // Builds asked and never started are bounded too: past the bound, the oldest go.
    let mut unstarted: Vec<(u64, String)> = (st.builds.iter())
        .filter(|(_, b)| b.tenant == t && b.status == Status::Waiting && !b.started)
        .map(|(k, b)| (b.seq, k.clone()))
        .collect();
    if unstarted.len() >= MAX_UNSTARTED {
        unstarted.sort();
        for (_, k) in &unstarted[..=unstarted.len() - MAX_UNSTARTED] {
            st.builds.remove(k);
        }
    }
    let template_id = match st.find(&t, alias) {
        Some((id, _)) => id.to_string(),
        None => {
            let owned = st.templates.values().filter(|r| r.of(&t)).count();
            if owned >= e.cfg.max_templates {
                return e2b_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "this tenant has built {owned} templates, the most it may \
                         (e2b.max_templates): delete one (`Template.delete` or DELETE \
                         /templates/{{id}}) first"
                    ),
                );
            }
            st.templates.insert(
                template_id.clone(),
                TemplateRec {
                    tenant: t.0.clone(),
                    alias: alias.to_string(),
                    tags: BTreeMap::new(),
                    latest: None,
                    kept: Default::default(),
                },
            );
            template_id
        }
    };
    let cordon_name = cordon_engine::tenant_template_name(&t.0, &build_id);
    st.asked += 1;
    let seq = st.asked;
    st.builds.insert(
        build_id.clone(),
        BuildRec {
            tenant: t.clone(),
            template_id: template_id.clone(),
            seq,
            log_bytes: 0,
            started: false,
            name: cordon_name,
            tags: tags.clone(),
            memory_mb,
            status: Status::Waiting,
            logs: vec![log_line("info", format!("build {build_id} asked"))],
            dropped: 0,
            reason: None,
        },
    );
    e.builds.save(&st);
    drop(st);
    let out = BuildRequested {
        template_id,
        build_id,
        public: false,
        names: vec![alias.to_string()],
        tags,
        aliases: vec![alias.to_string()],
    };
    (StatusCode::ACCEPTED, Json(out)).into_response()
}

/// Where a tenant's uploaded files are kept: root's alone, one directory per tenant.
fn uploads_dir(e: &E2b, t: &Tenant) -> PathBuf {
    e.svc
        .config()
        .data_dir
        .join("e2b-uploads")
        .join(cordon_engine::tenant_template_name(&t.0, "files"))
}

fn valid_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

#[derive(Debug, Serialize)]
struct UploadLink {
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

/// `GET /templates/{id}/files/{hash}`: whether the files of a copy step are here, and a
/// link (good for an hour, for this tenant, template and hash only) to upload them to.
async fn upload_link(
    e: &E2b,
    from: super::From,
    headers: &HeaderMap,
    template_id: &str,
    hash: &str,
) -> Response {
    let (template_id, hash) = (template_id.to_string(), hash.to_string());
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !valid_hash(&hash) {
        return e2b_error(StatusCode::BAD_REQUEST, "a files hash is 64 hex digits");
    }
    let token = match random_hex(24) {
        Ok(k) => k,
        Err(r) => return r,
    };
    {
        let mut st = lock(&e.builds.state);
        if st.templates.get(&template_id).is_none_or(|r| !r.of(&t)) {
            return not_found(&format!("template {template_id:?}"));
        }
        let now = SystemTime::now();
        st.links.retain(|_, l| l.until > now);
        // A tenant's links past the bound: its oldest go.
        let mut mine: Vec<(SystemTime, String)> = (st.links.iter())
            .filter(|(_, l)| l.tenant == t)
            .map(|(k, l)| (l.until, k.clone()))
            .collect();
        if mine.len() >= MAX_LINKS {
            mine.sort();
            for (_, k) in &mine[..=mine.len() - MAX_LINKS] {
                st.links.remove(k);
            }
        }
        st.links.insert(
            token.clone(),
            Link {
                tenant: t.clone(),
                template_id: template_id.clone(),
                hash: hash.clone(),
                until: now + UPLOAD_LINK_LIFE,
            },
        );
    }
    let present = uploads_dir(e, &t).join(&hash).is_file();
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let url = format!("http://{host}/templates/{template_id}/files/{hash}?token={token}");
    let link = UploadLink {
        present,
        url: Some(url),
    };
    (StatusCode::CREATED, Json(link)).into_response()
}

/// `PUT /templates/{id}/files/{hash}?token=…`: a copy step's files (a tar archive, gzip or
/// not), as the link said. Kept at most `e2b.max_upload_bytes`, with what the tenant's
/// uploads already take.
async fn upload(
    e: &E2b,
    template_id: &str,
    hash: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let token = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .unwrap_or("");
    let tenant = {
        let st = lock(&e.builds.state);
        let link = st.links.iter().find(|(k, _)| {
            k.len() == token.len() && constant_time_eq(k.as_bytes(), token.as_bytes())
        });
        match link {
            Some((_, l))
                if l.until > SystemTime::now()
                    && l.template_id == template_id
                    && l.hash == hash =>
            {
                l.tenant.clone()
            }
            _ => {
                return e2b_error(
                    StatusCode::FORBIDDEN,
                    "this upload link is not good (wrong, expired, or for other files): ask \
                     for a new one",
                );
            }
        }
    };
    let dir = uploads_dir(e, &tenant);
    let cap = e.cfg.max_upload_bytes.0;
    let coming = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    // The tenant's oldest uploads make room for the new one (a later build whose files
    // were let go uploads them again: its link says they are not present).
    let used = make_room(&dir, cap.saturating_sub(coming.min(cap)));
    let room = cap.saturating_sub(used);
    match save_upload(&dir, hash, body, room).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(Saved::TooLarge) => e2b_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "these files take more than this tenant's uploads may ({} with what is kept; \
                 e2b.max_upload_bytes): copy fewer files",
                cordon_core::units::format_size(cap)
            ),
        ),
        Err(Saved::Io(err)) => {
            tracing::warn!("saving an E2B upload: {err}");
            e2b_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the files could not be kept; try again",
            )
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Removes the oldest files of `dir` until what is left takes at most `keep` bytes;
/// answers what is left.
fn make_room(dir: &FsPath, keep: u64) -> u64 {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|d| {
                    let m = d.metadata().ok().filter(|m| m.is_file())?;
                    Some((m.modified().ok()?, m.len(), d.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut used: u64 = files.iter().map(|f| f.1).sum();
    for (_, len, path) in files {
        if used <= keep {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            used -= len;
        }
    }
    used
}

enum Saved {
    TooLarge,
    Io(std::io::Error),
}

/// Streams the body to `dir/hash` through a temporary file (renamed when whole), at most
/// `room` bytes.
async fn save_upload(dir: &FsPath, hash: &str, body: Body, room: u64) -> Result<(), Saved> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(Saved::Io)?;
    let tmp = dir.join(format!(".{hash}.{}", random_hex(6).unwrap_or_default()));
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .await
        .map_err(Saved::Io)?;
    let mut stream = body.into_data_stream();
    let mut written: u64 = 0;
    let result = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Saved::Io(std::io::Error::other(e)))?;
            written += chunk.len() as u64;
            if written > room {
                return Err(Saved::TooLarge);
            }
            f.write_all(&chunk).await.map_err(Saved::Io)?;
        }
        f.flush().await.map_err(Saved::Io)?;
        Ok(())
    }
    .await;
    drop(f);
    match result {
        Ok(()) => std::fs::rename(&tmp, dir.join(hash)).map_err(Saved::Io),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// `POST /v2/templates/{id}/builds/{build}`'s body (E2B's `TemplateBuildStartV2`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StartBody {
    #[serde(default)]
    from_image: Option<String>,
    #[serde(default)]
    from_template: Option<String>,
    #[serde(default)]
    from_image_registry: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(default)]
    steps: Vec<StepIn>,
    #[serde(default)]
    start_cmd: Option<String>,
    #[serde(default)]
    ready_cmd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StepIn {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    files_hash: Option<String>,
    #[serde(default)]
    force: Option<bool>,
}

/// `POST /v2/templates/{id}/builds/{build}`: starts the build asked for.
async fn start(
    e: &E2b,
    from: super::From,
    headers: &HeaderMap,
    template_id: &str,
    build_id: &str,
    body: Bytes,
) -> Response {
    let build_id = build_id.to_string();
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Some(slots) = e.builds.slots.clone() else {
        return builds_off();
    };
    let req: StartBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    // Taken as started under the lock: a second start of the same build is refused.
    let memory_mb = {
        let mut st = lock(&e.builds.state);
        match st.builds.get_mut(&build_id) {
            Some(b) if b.tenant == t && b.template_id == template_id => {
                if b.started {
                    return e2b_error(StatusCode::CONFLICT, "this build was started already");
                }
                b.started = true;
                b.memory_mb
            }
            _ => return not_found(&format!("build {build_id:?}")),
        }
    };
    // A start refused from here on ends the build with the refusal as its reason.
    let refused = |r: Response, why: String| {
        let mut st = lock(&e.builds.state);
        if let Some(b) = st.builds.get_mut(&build_id) {
            b.status = Status::Error;
            b.reason = Some(Reason {
                message: why,
                step: None,
            });
        }
        r
    };
    let planned = plan_of(e, &t, &req);
    let (base, plan) = match planned {
        Ok(p) => p,
        Err(message) => {
            return refused(e2b_error(StatusCode::BAD_REQUEST, &message), message);
        }
    };
    // The gate admits the steps' sandbox as the tenant's create of it would be, and its
    // memory is held under the tenant's budget while the build runs. Its root (the base's
    // copy and what the steps write) may take the most disk any sandbox of the server may.
    let disk = e.svc.config().max_limits.disk_bytes;
    let ask = CreateRequest {
        tier: Some(cordon_policy::TierChoice::Tier(
            cordon_core::Tier::Container,
        )),
        limits: cordon_engine::LimitsPatch {
            memory_bytes: Some(memory_mb << 20),
            disk_bytes: Some(disk),
            ..Default::default()
        },
        // The Debian base is made a template of the store by the build itself.
        template: match &base {
            Base::Template(n) => Some(n.clone()),
            Base::Debian => None,
        },
        workload: cordon_engine::Workload::Program,
        ..Default::default()
    };
    let held = match e.svc.admit_build(&t, &ask, "e2b template build").await {
        Ok(r) => r,
        Err(err) => {
            let why = err.message.clone();
            return refused(api_error(err), why);
        }
    };
    let runner = Runner {
        e: e.clone(),
        build_id: build_id.clone(),
        base,
        plan,
        memory_mb,
        disk,
    };
    // Building as soon as it is started (E2B's status says so at once); a full server
    // holds it at the slot, and says so in its log.
    let _ = runner.set_status(Status::Building, None);
    if slots.available_permits() == 0 {
        runner.log("info", "waiting for a build slot (e2b.builds)".into());
    }
    tokio::spawn(async move {
        let Ok(_slot) = slots.acquire_owned().await else {
            return;
        };
        runner.run().await;
        drop(held);
    });
    StatusCode::ACCEPTED.into_response()
}

/// The most bytes of a JSON body these routes read.
const MAX_JSON_BYTES: usize = 1 << 20;

async fn json_body(body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, MAX_JSON_BYTES)
        .await
        .map_err(|_| {
            e2b_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        })
}

/// The template routes under `/templates/` this module serves (`rest` is the path after
/// it): tags, a copy's files, a build's status, a template's tags. `None`: not one of them.
pub(super) async fn templates_route(
    e: &E2b,
    from: super::From,
    method: &Method,
    headers: &HeaderMap,
    rest: &str,
    query: Option<&str>,
    body: Body,
) -> Option<Response> {
    let parts: Vec<&str> = rest.split('/').collect();
    Some(match (method, parts.as_slice()) {
        (&Method::POST, ["tags"]) => match json_body(body).await {
            Ok(b) => assign_tags(e, from, headers, b).await,
            Err(r) => r,
        },
        (&Method::DELETE, ["tags"]) => match json_body(body).await {
            Ok(b) => remove_tags(e, from, headers, b).await,
            Err(r) => r,
        },
        (&Method::GET, [id, "files", hash]) => upload_link(e, from, headers, id, hash).await,
        (&Method::PUT, [id, "files", hash]) => upload(e, id, hash, query, headers, body).await,
        (&Method::GET, [id, "builds", build, "status"]) => {
            let q: StatusQuery = match serde_urlencoded::from_str(query.unwrap_or("")) {
                Ok(q) => q,
                Err(err) => return Some(e2b_error(StatusCode::BAD_REQUEST, err.to_string())),
            };
            status(e, from, headers, id, build, q).await
        }
        (&Method::GET, [name, "tags"]) if !name.is_empty() => {
            let t = match e.tenant(headers, from.0) {
                Ok(t) => t,
                Err(r) => return Some(r),
            };
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            tags(e, &t, &name).await
        }
        _ => return None,
    })
}

/// `POST /v2/templates/{id}/builds/{build}`: starts a build; any other `/v2/templates/`
/// route is refused as before.
pub(super) async fn v2_templates(
    State(e): State<E2b>,
    from: super::From,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Body,
) -> Response {
    let rest = uri.path().trim_start_matches("/v2/templates/");
    let parts: Vec<&str> = rest.split('/').collect();
    if let (&Method::POST, [id, "builds", build]) = (&method, parts.as_slice()) {
        return match json_body(body).await {
            Ok(b) => start(&e, from, &headers, id, build, b).await,
            Err(r) => r,
        };
    }
    super::refused(State(e), from, headers, uri).await
}

/// What a build starts from.
enum Base {
    /// A template of the store (an operator's mapped one, or the tenant's own).
    Template(String),
    /// The microvm tier's Debian root.
    Debian,
}

impl Base {
    fn template_name(&self) -> &str {
        match self {
            Base::Template(n) => n,
            Base::Debian => "debian",
        }
    }
}

/// The base and the native plan of an E2B build, or why it cannot run here.
fn plan_of(e: &E2b, t: &Tenant, req: &StartBody) -> Result<(Base, BuildPlan), String> {
    if req.from_image_registry.is_some() {
        return Err(
            "fromImageRegistry: this server pulls no image from a registry; the operator \
             imports one (`cordon template import`) and maps it in [e2b.images]"
                .into(),
        );
    }
    let base = match (&req.from_template, &req.from_image) {
        (Some(name), _) => match e.builds.template_for(t, name) {
            Some(n) => Base::Template(n),
            None => match super::mapped_template(e, name) {
                Some(Some(n)) => Base::Template(n),
                Some(None) => {
                    return Err(format!(
                        "template {name:?} is the tier's own root, which a build cannot copy: \
                         the operator maps it to a template in [e2b.templates] to build from it"
                    ));
                }
                None => return Err(format!("template {name:?} was not found")),
            },
        },
        (None, Some(image)) => {
            let bare = image.strip_suffix(":latest").unwrap_or(image);
            match e.cfg.images.get(image).or_else(|| e.cfg.images.get(bare)) {
                Some(n) if n == "debian" || n == "debian-base" => Base::Debian,
                Some(n) => Base::Template(n.clone()),
                None => {
                    return Err(format!(
                        "image {image:?} cannot be pulled: this server reaches no registry; the \
                         operator imports the image (`cordon template import`) and maps it in \
                         [e2b.images]"
                    ));
                }
            }
        }
        (None, None) => return Err("a build needs fromImage or fromTemplate".into()),
    };
    let uploads = uploads_dir(e, t);
    let mut steps = Vec::new();
    let mut force = req.force.unwrap_or(false);
    for (i, s) in req.steps.iter().enumerate() {
        force |= s.force.unwrap_or(false);
        let arg = |k: usize| s.args.get(k).cloned().unwrap_or_default();
        let opt = |k: usize| s.args.get(k).filter(|a| !a.is_empty()).cloned();
        let step = match s.kind.to_ascii_uppercase().as_str() {
            "RUN" => PlanStep::Run {
                cmd: arg(0),
                user: opt(1),
            },
            "COPY" => {
                let Some(hash) = s.files_hash.as_deref().filter(|h| valid_hash(h)) else {
                    return Err(format!("step {}: a copy needs its files' hash", i + 1));
                };
                let archive = uploads.join(hash);
                let mut magic = [0u8; 2];
                let gzip = std::fs::File::open(&archive)
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                    .map(|()| magic == [0x1f, 0x8b]);
                let Ok(gzip) = gzip else {
                    return Err(format!(
                        "step {}: the files of `copy {}` were not uploaded",
                        i + 1,
                        arg(0)
                    ));
                };
                PlanStep::Copy {
                    archive,
                    digest: hash.to_string(),
                    src: arg(0),
                    dest: arg(1),
                    gzip,
                    mode: opt(3),
                    user: opt(2),
                }
            }
            "ENV" => PlanStep::Env {
                vars: s
                    .args
                    .chunks(2)
                    .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
                    .collect(),
            },
            "WORKDIR" => PlanStep::Workdir { dir: arg(0) },
            "USER" => PlanStep::User { name: arg(0) },
            other => {
                return Err(format!(
                    "step {}: {other:?} is not a step this server builds (RUN, COPY, ENV, \
                     WORKDIR, USER)",
                    i + 1
                ));
            }
        };
        steps.push(step);
    }
    let start = req.start_cmd.clone().map(|start| StartCommand {
        start,
        ready: req.ready_cmd.clone(),
    });
    Ok((
        base,
        BuildPlan {
            steps,
            workdir: Some(DEFAULT_WORKDIR.into()),
            force,
            start,
        },
    ))
}

/// One started build: runs `cordon template build --plan` and keeps its log and result.
struct Runner {
    e: E2b,
    build_id: String,
    base: Base,
    plan: BuildPlan,
    memory_mb: u64,
    /// The build root's disk limit (bytes).
    disk: u64,
}

impl Runner {
    /// Sets the build's status; a ready build takes its tags and becomes its template's
    /// newest. Answers the Cordon templates no tag names any more, for the store to let go
    /// (a ready build is said to be so once they are gone: [`Self::ready`]).
    fn set_status(&self, status: Status, reason: Option<Reason>) -> Vec<String> {
        let builds = &self.e.builds;
        let mut st = lock(&builds.state);
        let Registry {
            builds: recs,
            templates,
            ..
        } = &mut *st;
        let Some(b) = recs.get_mut(&self.build_id) else {
            return Vec::new();
        };
        if status != Status::Ready {
            b.status = status;
        }
        if let Some(r) = &reason {
            b.logs.push(log_line("error", r.message.clone()));
        }
        b.reason = reason;
        let mut gone = Vec::new();
        match templates.get_mut(&b.template_id) {
            Some(tpl) if status == Status::Ready => {
                let built = Built {
                    build: self.build_id.clone(),
                    name: b.name.clone(),
                    at_ms: now_ms(),
                };
                for tag in &b.tags {
                    tpl.tags.insert(tag.clone(), built.clone());
                }
                tpl.kept.insert(built.name.clone());
                tpl.latest = Some(built);
                gone = tpl.unreferenced();
            }
            // A template deleted while its build ran: what the build made goes too.
            None if status == Status::Ready => gone.push(b.name.clone()),
            _ => {}
        }
        if matches!(status, Status::Ready | Status::Error) {
            let t = b.tenant.clone();
            st.prune_finished(&t);
            builds.save(&st);
        }
        gone
    }

    /// Says the build is ready (after [`Self::set_status`] moved its tags).
    fn ready(&self) {
        let mut st = lock(&self.e.builds.state);
        if let Some(b) = st.builds.get_mut(&self.build_id) {
            b.status = Status::Ready;
        }
    }

    /// How many log lines were not kept, if any.
    fn dropped(&self) -> Option<usize> {
        let st = lock(&self.e.builds.state);
        st.builds
            .get(&self.build_id)
            .map(|b| b.dropped)
            .filter(|n| *n > 0)
    }

    fn log(&self, level: &'static str, message: String) {
        let mut st = lock(&self.e.builds.state);
        if let Some(b) = st.builds.get_mut(&self.build_id) {
            if b.logs.len() < MAX_LOG_LINES && b.log_bytes + message.len() <= MAX_LOG_BYTES {
                b.log_bytes += message.len();
                b.logs.push(log_line(level, message));
            } else {
                b.dropped += 1;
            }
        }
    }

    fn fail(&self, message: String, step: Option<usize>) {
        let _ = self.set_status(
            Status::Error,
            Some(Reason {
                message,
                step: step.map(|s| s.to_string()),
            }),
        );
    }

    async fn run(self) {
        let data = self.e.svc.config().data_dir.clone();
        let dir = data.join("e2b-builds").join(&self.build_id);
        if let Err(err) = make_private_dir(&dir) {
            tracing::warn!("making an E2B build's directory: {err}");
            return self.fail("the build could not start; try again".into(), None);
        }
        let (plan_file, result_file) = (dir.join("plan.json"), dir.join("result.json"));
        let written = serde_json::to_vec(&self.plan)
            .map_err(std::io::Error::other)
            .and_then(|p| std::fs::write(&plan_file, p));
        if let Err(err) = written {
            tracing::warn!("writing an E2B build's plan: {err}");
            return self.fail("the build could not start; try again".into(), None);
        }
        // The running program itself (`/proc/self/exe`): the builder is always the server's
        // own version, and a program file replaced on disk since the server started (an
        // upgrade) is no matter. Named as the program calls itself.
        let arg0 = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .map(|n| n.trim_end_matches(" (deleted)").to_string())
            .unwrap_or_else(|| "cordon".into());
        let name = lock(&self.e.builds.state)
            .builds
            .get(&self.build_id)
            .map(|b| b.name.clone())
            .unwrap_or_default();
        let child = tokio::process::Command::new("/proc/self/exe")
            .arg0(arg0)
            .args([
                "template",
                "build",
                &name,
                "--from",
                self.base.template_name(),
            ])
            .arg("--plan")
            .arg(&plan_file)
            .arg("--result")
            .arg(&result_file)
            .arg("--data-dir")
            .arg(&data)
            .args(["--memory", &format!("{}M", self.memory_mb)])
            .args(["--disk", &self.disk.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!("starting an E2B build: {err}");
                return self.fail("the build could not start; try again".into(), None);
            }
        };
        let stderr = child.stderr.take();
        let lines = async {
            let Some(stderr) = stderr else { return };
            let mut r = tokio::io::BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => self.log_output(&buf),
                }
            }
        };
        let ended = tokio::time::timeout(BUILD_WALL, async {
            lines.await;
            child.wait().await
        })
        .await;
        let _ = child.start_kill();
        let result: Option<BuildResult> = std::fs::read(&result_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let _ = std::fs::remove_dir_all(&dir);
        match (ended, result) {
            (Err(_), _) => self.fail(
                format!(
                    "the build ran past {} minutes and was stopped",
                    BUILD_WALL.as_secs() / 60
                ),
                None,
            ),
            (Ok(_), Some(r)) if r.ok => {
                if r.cached {
                    self.log(
                        "info",
                        "no step ran: a build of the same inputs is kept".into(),
                    );
                }
                if let Some(n) = self.dropped() {
                    self.log("warn", format!("{n} more log lines were not kept"));
                }
                let gone = self.set_status(Status::Ready, None);
                if let Err(err) = remove_from_store(&self.e, gone).await {
                    tracing::warn!("removing E2B builds no tag names: {err}");
                }
                self.ready();
            }
            (Ok(_), Some(r)) => {
                let message = match (&r.unknown_user, r.step) {
                    (Some(user), Some(step)) => {
                        let cmd = match self.plan.steps.get(step - 1) {
                            Some(PlanStep::Run { cmd, .. }) => cmd.clone(),
                            Some(s) => s.input(),
                            None => String::new(),
                        };
                        format!(
                            "failed to run command '{cmd}': command failed: unauthenticated: \
                             invalid username: '{user}'"
                        )
                    }
                    _ => crate::error::without_host_paths(&r.message),
                };
                self.fail(message, r.step)
            }
            (Ok(_), None) => self.fail("the build ended without a result; try again".into(), None),
        }
    }

    /// One line of the build's output: the steps' own (the tenant's) as they are, Cordon's
    /// own with host paths taken out.
    fn log_output(&self, raw: &[u8]) {
        let mut line = String::from_utf8_lossy(&raw[..raw.len().min(MAX_LINE_BYTES)])
            .trim_end()
            .to_string();
        if line.is_empty() {
            return;
        }
        let step_line = ["cordon: [step ", "cordon: [start] ", "cordon: [ready] "]
            .iter()
            .any(|p| line.starts_with(p));
        if line.starts_with("cordon: ") && !step_line {
            line = crate::error::without_host_paths(&line);
        }
        self.log("info", line);
    }
}

fn make_private_dir(dir: &FsPath) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

/// `GET /templates/{id}/builds/{build}/status`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatusQuery {
    #[serde(default)]
    logs_offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct StatusOut {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: Status,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogLine>,
    logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=N`: the build's state and its log
/// from entry N (at most 100 entries a call).
async fn status(
    e: &E2b,
    from: super::From,
    headers: &HeaderMap,
    template_id: &str,
    build_id: &str,
    q: StatusQuery,
) -> Response {
    let (template_id, build_id) = (template_id.to_string(), build_id.to_string());
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = lock(&e.builds.state);
    let Some(b) = st
        .builds
        .get(&build_id)
        .filter(|b| b.tenant == t && b.template_id == template_id)
    else {
        return not_found(&format!("build {build_id:?}"));
    };
    let from = q.logs_offset.unwrap_or(0).min(b.logs.len());
    let n = q.limit.unwrap_or(STATUS_PAGE).clamp(1, STATUS_PAGE);
    let entries: Vec<LogLine> = b.logs[from..].iter().take(n).cloned().collect();
    let out = StatusOut {
        template_id,
        build_id,
        status: b.status,
        logs: entries
            .iter()
            .map(|l| format!("[{}] {}\n", l.timestamp, l.message))
            .collect(),
        log_entries: entries,
        reason: b.reason.clone(),
    };
    Json(out).into_response()
}

/// `POST /templates/tags`'s body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct AssignBody {
    #[serde(default)]
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

/// `DELETE /templates/tags`'s body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RemoveBody {
    #[serde(default)]
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Assigned {
    #[serde(rename = "buildID")]
    build_id: String,
    tags: Vec<String>,
}

#[derive(Debug, Serialize)]
struct TagOut {
    tag: String,
    #[serde(rename = "buildID")]
    build_id: String,
    #[serde(rename = "createdAt")]
    created_at: String,
}

/// `POST /templates/tags` (`Template.assign_tags`): gives the build `target`
/// (`alias:tag`) more tags.
async fn assign_tags(e: &E2b, from: super::From, headers: &HeaderMap, body: Bytes) -> Response {
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req: AssignBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.tags.is_empty() {
        return e2b_error(StatusCode::BAD_REQUEST, "give at least one tag");
    }
    if let Some(bad) = req.tags.iter().find(|t| !valid_name(t)) {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            format!(
                "tag {bad:?} is not valid: lowercase letters, digits, '.', '_' and '-' (no ':')"
            ),
        );
    }
    let (alias, tag) = split_tag(&req.target);
    let gone = {
        let mut st = lock(&e.builds.state);
        let Some(id) = st.find(&t, alias).map(|(id, _)| id.to_string()) else {
            return not_found(&format!("template {alias:?}"));
        };
        let Some(rec) = st.templates.get_mut(&id) else {
            return not_found(&format!("template {alias:?}"));
        };
        let source = match tag {
            Some(tag) => rec.tags.get(tag),
            None => rec.tags.get("default").or(rec.latest.as_ref()),
        };
        let Some(mut built) = source.cloned() else {
            return not_found(&format!(
                "build {:?} of template {alias:?}",
                tag.unwrap_or("default")
            ));
        };
        let more = req
            .tags
            .iter()
            .filter(|t| !rec.tags.contains_key(*t))
            .count();
        if rec.tags.len() + more > MAX_TAGS {
            return e2b_error(
                StatusCode::BAD_REQUEST,
                format!("a template has at most {MAX_TAGS} tags: remove some first"),
            );
        }
        built.at_ms = now_ms();
        for tag in &req.tags {
            rec.tags.insert(tag.clone(), built.clone());
        }
        let gone = rec.unreferenced();
        e.builds.save(&st);
        (gone, built.build)
    };
    let (gone, build_id) = gone;
    if let Err(err) = remove_from_store(e, gone).await {
        tracing::warn!("removing E2B builds no tag names: {err}");
    }
    let out = Assigned {
        build_id,
        tags: req.tags,
    };
    (StatusCode::CREATED, Json(out)).into_response()
}

/// `DELETE /templates/tags` (`Template.remove_tags`).
async fn remove_tags(e: &E2b, from: super::From, headers: &HeaderMap, body: Bytes) -> Response {
    let t = match e.tenant(headers, from.0) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req: RemoveBody = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let gone = {
        let mut st = lock(&e.builds.state);
        let Some(id) = st
            .find(&t, split_tag(&req.name).0)
            .map(|(id, _)| id.to_string())
        else {
            return not_found(&format!("template {:?}", req.name));
        };
        let mut gone = Vec::new();
        if let Some(rec) = st.templates.get_mut(&id) {
            for tag in &req.tags {
                rec.tags.remove(tag);
            }
            gone = rec.unreferenced();
        }
        e.builds.save(&st);
        gone
    };
    if let Err(err) = remove_from_store(e, gone).await {
        tracing::warn!("removing E2B builds no tag names: {err}");
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `GET /templates/{id}/tags` (`Template.get_tags`).
async fn tags(e: &E2b, t: &Tenant, name: &str) -> Response {
    let st = lock(&e.builds.state);
    let Some((_, rec)) = st.find(t, split_tag(name).0) else {
        return not_found(&format!("template {name:?}"));
    };
    let out: Vec<TagOut> = rec
        .tags
        .iter()
        .map(|(tag, b)| TagOut {
            tag: tag.clone(),
            build_id: b.build.clone(),
            created_at: super::rfc3339(b.at_ms),
        })
        .collect();
    Json(out).into_response()
}

/// `DELETE /templates/{id}` of a built template: forgets it and removes its builds from
/// the store (a root a live sandbox still uses stays until it ends). `None`: `t` has no
/// built template of that name.
pub(super) async fn delete(e: &E2b, t: &Tenant, name: &str) -> Option<Response> {
    let names: Vec<String> = {
        let mut st = lock(&e.builds.state);
        let id = st.find(t, split_tag(name).0)?.0.to_string();
        let rec = st.templates.remove(&id)?;
        // Finished builds' records go; a running one finds its template gone when it ends,
        // and lets go of what it made.
        st.builds.retain(|_, b| {
            b.template_id != id || matches!(b.status, Status::Waiting | Status::Building)
        });
        e.builds.save(&st);
        rec.kept.into_iter().collect()
    };
    Some(match remove_from_store(e, names).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => {
            tracing::warn!("removing an E2B template's builds: {err}");
            e2b_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the template's files could not all be removed; try again",
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2b::registry::Builds;

    #[test]
    fn names_tags_and_ids_are_read_as_e2b_gives_them() {
        assert_eq!(split_tag("my-tpl:v1"), ("my-tpl", Some("v1")));
        assert_eq!(split_tag("team/my-tpl"), ("my-tpl", None));
        assert!(valid_name("e2b-tags-test"));
        assert!(!valid_name(""));
        assert!(!valid_name("Upper"));
        assert!(!valid_name("a:b"));
        assert!(!valid_name("-x"));
        let id = uuid4().unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }

    fn built(n: &str) -> Built {
        Built {
            build: format!("b-{n}"),
            name: n.into(),
            at_ms: 0,
        }
    }

    /// A build no tag (nor the newest) names leaves the store: a tenant rebuilding one tag
    /// over and over keeps one root, not every build's.
    #[test]
    fn builds_no_tag_names_are_let_go() {
        let mut rec = TemplateRec {
            tenant: "alice".into(),
            alias: "a".into(),
            tags: BTreeMap::new(),
            latest: Some(built("t2")),
            kept: ["t1", "t2", "t3"].map(String::from).into_iter().collect(),
        };
        rec.tags.insert("v1".into(), built("t3"));
        assert_eq!(rec.unreferenced(), vec!["t1".to_string()]);
        assert_eq!(rec.kept.len(), 2);
        rec.tags.clear();
        assert_eq!(rec.unreferenced(), vec!["t3".to_string()]);
        assert!(rec.unreferenced().is_empty());
    }

    /// The templates a server built are there after its restart.
    #[test]
    fn built_templates_outlive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let b = Builds::new(1, dir.path());
        {
            let mut st = lock(&b.state);
            let mut rec = TemplateRec {
                tenant: "alice".into(),
                alias: "kept".into(),
                tags: BTreeMap::new(),
                latest: Some(built("t-1")),
                kept: ["t-1".to_string()].into_iter().collect(),
            };
            rec.tags.insert("v1".into(), built("t-1"));
            st.templates.insert("id1".into(), rec);
            b.save(&st);
        }
        let again = Builds::new(1, dir.path());
        let alice = Tenant("alice".into());
        assert_eq!(
            again.template_for(&alice, "kept:v1").as_deref(),
            Some("t-1")
        );
        assert_eq!(again.template_for(&alice, "kept").as_deref(), Some("t-1"));
        assert_eq!(again.template_for(&Tenant("bob".into()), "kept"), None);
        let mode = std::fs::metadata(dir.path().join("e2b-templates.json"))
            .unwrap()
            .permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077, 0);
    }

    /// A tenant's uploads make room for a new one by letting go of the oldest.
    #[test]
    fn the_oldest_uploads_make_room() {
        let dir = tempfile::tempdir().unwrap();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let p = dir.path().join(name);
            std::fs::write(&p, vec![0u8; 100]).unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        assert_eq!(make_room(dir.path(), 250), 200);
        assert!(!dir.path().join("a").exists());
        assert!(dir.path().join("c").exists());
        assert_eq!(make_room(dir.path(), 0), 0);
    }
}
