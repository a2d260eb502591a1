//! What the E2B adapter's routes share: its state (the sandboxes E2B's SDKs use), E2B's
//! errors and paths, the tenant and sandbox checks. The routes (`control`, `envd`,
//! `interp`, ...) and the router in `mod.rs` use this; it uses none of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::api::PeerAddr;
use crate::config::E2bConfig;
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::SandboxInfo;
use crate::service::Service;

use super::connect::ConnectError;
use super::wire::{self, SandboxDetail, SandboxOut};

/// The envd version Cordon answers: the SDK features it switches on are the ones served
/// here (octet-stream uploads, `close_stdin`, file metadata, entries in watch events and
/// `allow_network_mounts` on watches).
pub const ENVD_VERSION: &str = "0.6.4";
/// envd's port, as the `E2b-Sandbox-Port` header names it.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const INTERP_PORT: u16 = 49999;
/// E2B's default user's home: Cordon's workspace, `/work`.
pub const HOME: &str = "/home/user";
pub(super) const WORK: &str = "/work";

/// What the adapter keeps of a sandbox E2B's SDKs use.
pub(crate) struct E2bBox {
    pub tenant: Tenant,
    /// The envd access token the create (or connect) answered.
    pub token: String,
    /// The traffic access token the create (or connect) answered: the code interpreter's
    /// context routes need it (E2B's SDKs send it as `E2B-Traffic-Access-Token` there, and
    /// no envd token).
    pub traffic: String,
    pub template: String,
    /// The TTL last set, in ms (E2B's timeouts count from the call).
    pub ttl_ms: AtomicI64,
    /// Processes started through envd: pid (the number of Cordon's exec id) to how.
    pub procs: Mutex<HashMap<u32, ProcRecord>>,
    /// Languages whose default context the first context list could not start (no Node in
    /// the tier's root): not tried again by later lists.
    pub no_default: Mutex<Vec<&'static str>>,
    /// A paused sandbox is resumed by the next request to it (the create's `autoResume`).
    pub auto_resume: std::sync::atomic::AtomicBool,
    /// How requests for its own ports are let in and sent on (the create's `network`).
    pub ports: Mutex<PortAccess>,
    /// Polled watchers (`CreateWatcher`) whose events carry their entries
    /// (`include_entry`): watcher id to the sandbox path watched.
    pub watch_entries: Mutex<HashMap<u64, String>>,
    /// The sandbox's `restarts` these records are of: a sandbox started again from its
    /// files numbers its processes and watchers anew, so the records of before go.
    pub boot: std::sync::atomic::AtomicU32,
}

impl E2bBox {
    /// Forgets the processes and watchers of an earlier start of the sandbox once it has
    /// been started again from its files (`restarts` moved on).
    pub fn saw(&self, info: &SandboxInfo) {
        use std::sync::atomic::Ordering;
        if self.boot.swap(info.restarts, Ordering::AcqRel) != info.restarts {
            lock(&self.procs).clear();
            lock(&self.watch_entries).clear();
            lock(&self.no_default).clear();
        }
    }
}

/// How a sandbox's own ports are reached (E2B's `allowPublicTraffic` and
/// `maskRequestHost`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PortAccess {
    /// Requests need no token (the operator's `e2b.public_traffic`, and a create that did not
    /// set `allowPublicTraffic` to false).
    pub public: bool,
    /// The `Host` a request carries on to the program, `${PORT}` replaced by the port.
    pub mask_host: Option<String>,
}

impl PortAccess {
    /// The `Host` a request for `port` carries on, when masked.
    pub fn host_for(&self, port: u16) -> Option<String> {
        self.mask_host
            .as_ref()
            .map(|m| m.replace("${PORT}", &port.to_string()))
    }
}

/// How the sandbox's own ports are reached, from the create's `network`: public as E2B's
/// `allowPublicTraffic` (true when left out) where the operator's `e2b.public_traffic`
/// allows it, else only with the sandbox's token; a create asking for public ports the
/// operator does not allow is refused. `maskRequestHost` is kept for the relay.
pub(crate) fn ports_of(e: &E2b, req: &wire::NewSandbox) -> Result<PortAccess, Response> {
    let net = req.network.as_ref();
    let asked = net.and_then(|n| n.allow_public_traffic);
    if asked == Some(true) && !e.cfg.public_traffic {
        return Err(e2b_error(
            StatusCode::BAD_REQUEST,
            "network.allowPublicTraffic: this server lets a sandbox's ports be reached only \
             with its traffic access token (E2B-Traffic-Access-Token); leave \
             allowPublicTraffic out or set it to false, or ask the operator for \
             e2b.public_traffic",
        ));
    }
    let public = e.cfg.public_traffic && asked != Some(false);
    let mask_host = match net.and_then(|n| n.mask_request_host.as_deref()) {
        None => None,
        Some(m) => {
            if !host_mask_ok(m) {
                return Err(e2b_error(
                    StatusCode::BAD_REQUEST,
                    "network.maskRequestHost must be a host name, with an optional :port \
                     (${PORT} is the port asked for)",
                ));
            }
            Some(m.to_string())
        }
    };
    Ok(PortAccess { public, mask_host })
}

/// Whether `m` is a `Host` value with `${PORT}` standing for a port: a DNS name (letters,
/// digits, `-` and `.`), then optionally `:` and digits or `${PORT}`.
pub(crate) fn host_mask_ok(m: &str) -> bool {
    let (name, port) = match m.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (m, None),
    };
    let name = name.replace("${PORT}", "0");
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let port_ok = port.is_none_or(|p| {
        p == "${PORT}" || (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
    });
    name_ok && port_ok
}

#[derive(Clone)]
pub(crate) struct ProcRecord {
    pub exec_id: String,
    pub config: wire::ProcessConfig,
    pub tag: Option<String>,
    pub pty: bool,
    /// Set when Cordon killed the process at its deadline (the call's Connect-Timeout-Ms):
    /// its stream then ends `deadline_exceeded`, as envd's does.
    pub timed_out: Arc<AtomicBool>,
}

/// The adapter's state.
#[derive(Clone)]
pub(crate) struct E2b {
    pub svc: Service,
    pub cfg: Arc<E2bConfig>,
    pub(super) boxes: Arc<Mutex<HashMap<String, Arc<E2bBox>>>>,
    /// Template builds asked through E2B's API, and the templates they made.
    pub(super) builds: Arc<super::registry::Builds>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// E2B's error body with its status.
pub(crate) fn e2b_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = wire::ErrorBody {
        code: status.as_u16(),
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

/// A Cordon refusal in E2B's error shape: the same status, the message and the fix.
/// A request's JSON body; an empty (or blank) one is `T`'s default, as E2B's SDKs send
/// none where every field is left out.
pub(crate) fn body_json<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, Response> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| e2b_error(StatusCode::BAD_REQUEST, format!("the request body: {e}")))
}

pub(crate) fn api_error(e: ApiError) -> Response {
    let mut resp = e2b_error(e.code.status(), message_of(&e));
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

pub(super) fn message_of(e: &ApiError) -> String {
    let mut m = shown_paths(&e.message);
    if !e.fix.is_empty() {
        m.push_str(" (Cordon: ");
        m.push_str(&e.fix);
        m.push(')');
    }
    if let Some(rule) = &e.rule {
        m.push_str(&format!(" [rule {rule}]"));
    }
    m
}

/// A Cordon error as a Connect error.
pub(crate) fn connect_error(e: ApiError) -> ConnectError {
    let code = match e.code {
        Code::NotFound => "not_found",
        // As when envd's sandbox goes away under a call: the SDKs then ask /health, which
        // answers 502 "was not found", and raise their sandbox-not-running error.
        Code::SandboxGone => "unavailable",
        Code::FileError if e.message.contains("does not exist") => "not_found",
        Code::Unauthorized => "unauthenticated",
        Code::InvalidRequest
        | Code::PathRefused
        | Code::PayloadTooLarge
        | Code::UnsupportedMediaType => "invalid_argument",
        Code::PolicyDenied | Code::VolumeQuota | Code::PausedQuota => "permission_denied",
        Code::TooManySandboxes
        | Code::TooManyExecs
        | Code::TooManyContexts
        | Code::TooManyFailures
        | Code::ResourceBusy => "resource_exhausted",
        Code::SandboxBusy | Code::ContextBusy | Code::SandboxPaused => "failed_precondition",
        Code::Unsupported | Code::TierUnavailable | Code::LayerUnavailable => "unimplemented",
        Code::ShuttingDown | Code::StorageLow => "unavailable",
        _ => "internal",
    };
    ConnectError::new(code, message_of(&e))
}

/// Cordon's workspace paths in a message, as E2B's SDKs name them.
pub(crate) fn shown_paths(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    let mut rest = m;
    while let Some(i) = rest.find(WORK) {
        let after = &rest[i + WORK.len()..];
        let boundary = after
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'));
        out.push_str(&rest[..i]);
        out.push_str(if boundary { HOME } else { WORK });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// An E2B path as Cordon's file API takes it: E2B's home `/home/user` is the workspace
/// `/work`, and relative paths are taken in it. Anything else is passed on as it is (the
/// file API refuses what is outside `/work`).
pub(crate) fn to_sandbox_path(p: &str) -> String {
    if p.is_empty() || p == "." {
        return WORK.to_string();
    }
    if let Some(rest) = p.strip_prefix(HOME)
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return format!("{WORK}{rest}");
    }
    if p == "~" {
        return WORK.to_string();
    }
    if let Some(rest) = p.strip_prefix("~/") {
        return format!("{WORK}/{rest}");
    }
    if p.starts_with('/') {
        return p.to_string();
    }
    format!("{WORK}/{}", p.trim_start_matches("./"))
}

/// A workspace path as E2B's SDKs expect to see it.
pub(crate) fn to_e2b_path(p: &str) -> String {
    match p.strip_prefix(WORK) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{HOME}{rest}"),
        _ => p.to_string(),
    }
}

/// Where the symlink at `link` (an absolute path) pointing at `target` leads, as an
/// absolute path with `.` and `..` taken lexically (never followed further).
pub(crate) fn link_target(link: &str, target: &str) -> String {
    let base = if target.starts_with('/') {
        String::new()
    } else {
        link.rsplit_once('/').map_or("", |(dir, _)| dir).to_string()
    };
    let mut parts: Vec<&str> = Vec::new();
    for p in base.split('/').chain(target.split('/')) {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Whether a path is one Cordon's file API reaches: the workspace, or the rest of the
/// sandbox's own root but its kernel views, devices and the agent's own directories (ADR
/// 0031); its refusal says what to do instead.
pub(crate) fn check_reachable(p: &str) -> Result<(), ApiError> {
    cordon_core::classify_sandbox_path(p, true)
        .map(drop)
        .map_err(ApiError::from)
}

/// Whether a path is in the workspace, the only tree `watch_dir` watches; its refusal says
/// what to do instead.
pub(crate) fn check_watched(p: &str) -> Result<(), ApiError> {
    if p == WORK || p.starts_with("/work/") {
        return Ok(());
    }
    Err(ApiError::new(
        Code::PathRefused,
        format!("{p} is outside /home/user, the only tree Cordon watches"),
        "watch a directory under /home/user (the sandbox's workspace, /work); watch elsewhere \
         with a command (commands.run with inotifywait)",
    ))
}

/// RFC 3339 for milliseconds since the epoch.
pub(crate) fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub(crate) fn now_ms() -> i64 {
    crate::audit::now_ms()
}

/// Retries a call the sandbox refused as busy with another call (E2B's SDKs send calls
/// to one sandbox at once; Cordon serves one foreground call at a time), a bounded number
/// of times.
pub(crate) async fn retry_busy<T, F, Fut>(mut f: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Err(e) if e.code == Code::SandboxBusy && tries < 3000 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            r => return r,
        }
    }
}

/// The address a request came from, for the failed-key slow-down (none in-process).
#[derive(Clone, Copy)]
pub(crate) struct From(pub Option<IpAddr>);

impl axum::extract::FromRequestParts<E2b> for From {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &E2b,
    ) -> Result<Self, Self::Rejection> {
        Ok(From(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<PeerAddr>>()
                .map(|c| c.0.0.ip()),
        ))
    }
}

/// One envd call on a sandbox (`process.Process/…`, `filesystem.Filesystem/…`): the
/// listener, the sandbox's id and state, and the request's headers and body.
pub(crate) struct Call<'a> {
    pub e: &'a E2b,
    pub id: &'a str,
    pub b: &'a E2bBox,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

impl Call<'_> {
    /// The request of a unary call.
    pub fn unary<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConnectError> {
        super::connect::decode_unary(self.headers, self.body)
    }

    /// The request that starts a server stream.
    pub fn stream<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConnectError> {
        super::connect::decode_stream_request(self.headers, self.body)
    }

    /// How often a server stream sends a keepalive: the client's
    /// `keepalive-ping-interval` (seconds), else [`DEFAULT_KEEPALIVE`].
    pub fn keepalive(&self) -> Duration {
        header_u64(self.headers, "keepalive-ping-interval")
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_KEEPALIVE)
    }
}

impl E2b {
    /// The tenant of a control-plane call (`X-API-KEY`), with the same failed-key
    /// slow-down as the native API.
    pub fn tenant(&self, headers: &HeaderMap, from: Option<IpAddr>) -> Result<Tenant, Response> {
        let svc = &self.svc;
        let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) else {
            svc.metrics().deny("unauthorized");
            return Err(e2b_error(
                StatusCode::UNAUTHORIZED,
                "no API key given; set E2B_API_KEY to a key from the Cordon server's key file",
            ));
        };
        match svc.key_attempt(Some(key.trim()), from) {
            Ok(t) => Ok(t),
            Err(crate::service::KeyRefused::Backoff(wait)) => {
                let mut r = e2b_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many failed API keys from your address; wait and send a valid key",
                );
                if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
                    r.headers_mut().insert(header::RETRY_AFTER, v);
                }
                Err(r)
            }
            Err(crate::service::KeyRefused::Invalid) => Err(e2b_error(
                StatusCode::UNAUTHORIZED,
                "the API key is not valid; set E2B_API_KEY to a key from the Cordon server's key file",
            )),
        }
    }

    pub fn box_of(&self, id: &str) -> Option<Arc<E2bBox>> {
        lock(&self.boxes).get(id).cloned()
    }

    /// The adapter's record of a sandbox, made (with a fresh access token) if the sandbox
    /// was made another way.
    pub fn adopt(&self, tenant: &Tenant, id: &str, template: &str, ttl_ms: i64) -> Arc<E2bBox> {
        let mut all = lock(&self.boxes);
        if let Some(b) = all.get(id)
            && b.tenant == *tenant
        {
            return b.clone();
        }
        let b = Arc::new(E2bBox {
            tenant: tenant.clone(),
            token: new_token(),
            traffic: new_token(),
            template: template.to_string(),
            ttl_ms: AtomicI64::new(ttl_ms),
            procs: Mutex::default(),
            no_default: Mutex::default(),
            auto_resume: Default::default(),
            ports: Mutex::default(),
            watch_entries: Mutex::default(),
            boot: Default::default(),
        });
        all.insert(id.to_string(), b.clone());
        b
    }

    pub fn forget(&self, id: &str) {
        lock(&self.boxes).remove(id);
    }

    /// Drops the records of sandboxes the service no longer has.
    pub async fn sweep(&self) {
        let all: Vec<(String, Tenant)> = lock(&self.boxes)
            .iter()
            .map(|(k, b)| (k.clone(), b.tenant.clone()))
            .collect();
        for (id, t) in all {
            if self.svc.sessions().info(&t, &id).await.is_err() {
                self.forget(&id);
            }
        }
    }

    /// The sandbox an envd or code-interpreter call names by its headers, checked: the
    /// port is the one of the route's daemon, the sandbox runs, and the call carries the
    /// token `auth` names. The refusal is E2B's proxy's (502 for a sandbox it cannot
    /// reach) or 401.
    pub async fn sandbox(
        &self,
        headers: &HeaderMap,
        port: u16,
        auth: Auth,
    ) -> Result<(String, Arc<E2bBox>), Response> {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let Some(id) = h("e2b-sandbox-id") else {
            return Err(e2b_error(
                StatusCode::BAD_REQUEST,
                "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this listener's address so the SDK names the sandbox",
            ));
        };
        let want = h("e2b-sandbox-port").and_then(|p| p.parse::<u16>().ok());
        if want != Some(port) {
            return Err(e2b_error(
                StatusCode::BAD_GATEWAY,
                format!(
                    "The sandbox is running but port is not open: Cordon serves envd on {ENVD_PORT} and the code interpreter on {INTERP_PORT} only; other ports are not reachable"
                ),
            ));
        }
        let not_found = || sandbox_not_found(id);
        let Some(b) = self.box_of(id) else {
            return Err(not_found());
        };
        let is = |name: &str, want: &str| {
            h(name).is_some_and(|given| constant_eq(given.as_bytes(), want.as_bytes()))
        };
        match auth {
            Auth::Liveness => {}
            Auth::Envd if is("x-access-token", &b.token) => {}
            Auth::Envd => {
                return Err(e2b_error(
                    StatusCode::UNAUTHORIZED,
                    "the access token (X-Access-Token) is not this sandbox's; use the envdAccessToken its create or connect answered",
                ));
            }
            Auth::Traffic
                if is("e2b-traffic-access-token", &b.traffic) || is("x-access-token", &b.token) => {
            }
            Auth::Traffic => {
                return Err(e2b_error(
                    StatusCode::UNAUTHORIZED,
                    "the traffic access token (E2B-Traffic-Access-Token) is not this sandbox's; use the trafficAccessToken its create or connect answered",
                ));
            }
        }
        self.live(id, b).await
    }

    /// The sandbox a signed file URL (`download_url`, `upload_url` of E2B's SDKs) was made
    /// for: the signature is v1, `sha256("path:operation:user:envdAccessToken[:expiry]")`,
    /// so it names its sandbox by the token it was made with, and the URL needs no header.
    /// A signature past its expiry, made for the other operation or another path, or with
    /// no sandbox's token is 401.
    pub async fn signed(
        &self,
        q: &wire::FilesQuery,
        operation: &str,
    ) -> Result<(String, Arc<E2bBox>), Response> {
        let refused = |why: &str| e2b_error(StatusCode::UNAUTHORIZED, why);
        let given = q.signature.as_deref().unwrap_or("");
        if let Some(exp) = q.signature_expiration
            && exp < now_ms() / 1000
        {
            // envd's own words (E2B's SDK tests read them): make a new URL.
            return Err(refused("signature is already expired"));
        }
        let boxes: Vec<(String, Arc<E2bBox>)> = lock(&self.boxes)
            .iter()
            .map(|(id, b)| (id.clone(), b.clone()))
            .collect();
        let found = boxes.into_iter().find(|(_, b)| {
            let want = file_signature(
                q.path.as_deref().unwrap_or(""),
                operation,
                q.username.as_deref().unwrap_or(""),
                &b.token,
                q.signature_expiration,
            );
            constant_eq(given.as_bytes(), want.as_bytes())
        });
        let Some((id, b)) = found else {
            return Err(refused(
                "the signature is not valid for this path and operation of any sandbox: make the URL with the SDK's download_url/upload_url",
            ));
        };
        self.live(&id, b).await
    }

    /// The sandbox, when the service still runs it (502, as E2B's proxy, when not); a
    /// paused one whose create asked `autoResume` is resumed first.
    pub(super) async fn live(
        &self,
        id: &str,
        b: Arc<E2bBox>,
    ) -> Result<(String, Arc<E2bBox>), Response> {
        let not_found = || sandbox_not_found(id);
        match self.svc.sessions().info(&b.tenant, id).await {
            Ok(i) if i.state == "live" => {
                b.saw(&i);
                Ok((id.to_string(), b))
            }
            Ok(i) if i.paused && b.auto_resume.load(std::sync::atomic::Ordering::Relaxed) => {
                match self.svc.sessions().resume(&b.tenant, id).await {
                    Ok(i) => {
                        b.saw(&i);
                        Ok((id.to_string(), b))
                    }
                    // Resumed by another request in between.
                    Err(_)
                        if self
                            .svc
                            .sessions()
                            .info(&b.tenant, id)
                            .await
                            .is_ok_and(|i| i.state == "live") =>
                    {
                        Ok((id.to_string(), b))
                    }
                    Err(e) => Err(api_error(e)),
                }
            }
            Ok(_) => Err(not_found()),
            // Forgotten only when the service has no such sandbox: a passing failure must
            // not drop its tokens and port settings (a later connect would make new ones).
            Err(e) if e.code == crate::error::Code::NotFound => {
                self.forget(id);
                Err(not_found())
            }
            Err(e) => Err(api_error(e)),
        }
    }
}

/// Whether a create takes E2B template name `name` as a mapped template (never a
/// snapshot's name).
pub(crate) fn maps_template(e: &E2b, name: &str) -> bool {
    mapped_template(e, name).is_some()
}

/// The Cordon template an E2B template name is mapped to (`Some(None)`: the tier's own
/// root), or `None` where no mapping names it.
pub(crate) fn mapped_template(e: &E2b, name: &str) -> Option<Option<String>> {
    // `name:tag` and `team/name` aliases name the same template.
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = base.split(':').next().unwrap_or(base);
    let mapped = e
        .cfg
        .templates
        .get(name)
        .or_else(|| e.cfg.templates.get(base));
    match mapped {
        Some(t) if t.is_empty() => Some(None),
        Some(t) => Some(Some(t.clone())),
        None if base == "base" || base == "code-interpreter-v1" => Some(None),
        None => None,
    }
}

/// The Cordon template an E2B template name means (one `t` built, or one the operator
/// maps), or E2B's 404 for a name neither names.
pub(crate) fn template_of(e: &E2b, t: &Tenant, name: &str) -> Result<Option<String>, Response> {
    if let Some(built) = e.builds.template_for(t, name) {
        return Ok(Some(built));
    }
    match mapped_template(e, name) {
        Some(t) => Ok(t),
        None => Err(e2b_error(
            StatusCode::NOT_FOUND,
            format!(
                "template {name:?} was not found: a create takes a template you built (`Template.build`, once its build is ready) or one the operator maps in [e2b.templates]"
            ),
        )),
    }
}

/// E2B's proxy's answer for a sandbox it cannot reach.
pub(crate) fn sandbox_not_found(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(wire::NotFoundBody {
            sandbox_id: id.to_string(),
            message: "The sandbox was not found",
            code: 502,
        }),
    )
        .into_response()
}

/// E2B's v1 file-URL signature: `v1_` and the unpadded base64 of
/// `sha256("path:operation:user:token")`, `:expiry` (Unix seconds) appended when it has one.
pub(crate) fn file_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiry: Option<i64>,
) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let raw = match expiry {
        Some(x) => format!("{path}:{operation}:{user}:{token}:{x}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Which of a sandbox's tokens a call must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// None: the call only learns whether the sandbox runs (`GET /health`).
    Liveness,
    /// The envd access token (`X-Access-Token`): envd's calls and `/execute`.
    Envd,
    /// The traffic access token (`E2B-Traffic-Access-Token`), or the envd token: the code
    /// interpreter's context routes, where E2B's SDKs send only the former.
    Traffic,
}

/// The user an envd call runs as: `Authorization: Basic base64("<user>:")`, absent for
/// the default user. `user` and `root` exist; both are the sandbox's one unprivileged user.
pub(crate) fn check_user(
    headers: &HeaderMap,
    query_user: Option<&str>,
) -> Result<(), ConnectError> {
    use base64::Engine as _;
    let name = match (query_user, headers.get(header::AUTHORIZATION)) {
        (Some(u), _) => Some(u.to_string()),
        (None, Some(v)) => {
            let v = v.to_str().unwrap_or("");
            let b = v.strip_prefix("Basic ").unwrap_or("");
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .map_err(|_| {
                    ConnectError::new(
                        "unauthenticated",
                        "the Authorization header is not Basic base64(\"<user>:\")",
                    )
                })?;
            let s = String::from_utf8_lossy(&raw).into_owned();
            Some(s.split(':').next().unwrap_or("").to_string())
        }
        (None, None) => None,
    };
    match name.as_deref() {
        None | Some("") | Some("user") | Some("root") => Ok(()),
        Some(other) => Err(ConnectError::new(
            "unauthenticated",
            format!(
                "invalid username {other:?}: a Cordon sandbox has the users user and root (both its one unprivileged user)"
            ),
        )),
    }
}

pub(crate) fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(super) fn new_token() -> String {
    let mut b = [0u8; 24];
    if getrandom::fill(&mut b).is_err() {
        // No randomness: a token nobody can present.
        return format!("unusable-{}", now_ms());
    }
    hex::encode(b)
}

/// A sandbox as E2B's create, connect and resume answer it.
pub(crate) fn sandbox_out(t: &Tenant, info: &SandboxInfo, b: &E2bBox) -> SandboxOut {
    SandboxOut {
        template_id: b.template.clone(),
        sandbox_id: info.id.clone(),
        client_id: t.0.clone(),
        envd_version: ENVD_VERSION,
        envd_access_token: b.token.clone(),
        traffic_access_token: Some(b.traffic.clone()),
        domain: None,
        alias: None,
    }
}

/// A sandbox as E2B's detail and list answer it.
pub(crate) fn detail_of(t: &Tenant, info: &SandboxInfo, b: Option<&E2bBox>) -> SandboxDetail {
    SandboxDetail {
        template_id: b
            .map(|b| b.template.clone())
            .unwrap_or_else(|| "base".into()),
        sandbox_id: info.id.clone(),
        client_id: t.0.clone(),
        alias: None,
        started_at: rfc3339(info.created_ms),
        end_at: rfc3339(info.expires_ms),
        cpu_count: info.limits.cpus.ceil().max(1.0) as u32,
        memory_mb: info.limits.memory_bytes >> 20,
        disk_size_mb: info.limits.disk_bytes >> 20,
        state: if info.paused { "paused" } else { "running" },
        envd_version: ENVD_VERSION,
        metadata: info.labels.clone(),
        envd_access_token: b.map(|b| b.token.clone()),
        domain: None,
        lifecycle: super::wire::Lifecycle {
            auto_resume: b
                .is_some_and(|b| b.auto_resume.load(std::sync::atomic::Ordering::Relaxed)),
            on_timeout: if info.on_timeout.is_destroy() {
                "kill"
            } else {
                "pause"
            },
        },
    }
}

/// Routes of E2B's API that Cordon does not serve, each with what Cordon does instead.
pub(crate) async fn refused(
    State(e): State<E2b>,
    from: From,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(r) = e.tenant(&headers, from.0) {
        return r;
    }
    let path = uri.path();
    let instead = if path.contains("/templates") {
        "Cordon does not build E2B templates; build one with `cordon template build` (or import an OCI image with `cordon template import`) and map its name in [e2b.templates]"
    } else if path.starts_with("/volumes") {
        "Cordon's volumes are made through its own API (POST /v1/volumes) and mounted by a native create"
    } else if path.starts_with("/secrets") {
        "a sandbox gets credentials only as grants of the operator's catalogue, swapped in by the egress proxy"
    } else if path.contains("/snapshots") || path.contains("/fork") {
        "create_snapshot, list_snapshots, delete_snapshot, fork and Sandbox.create(snapshot_id) are served; this route of E2B's snapshot API is not"
    } else if path.ends_with("/network") {
        "a sandbox's egress allow-list is fixed at its create, within the operator's ceiling; create a new sandbox with the hosts it needs"
    } else if path.ends_with("/refreshes") {
        "use set_timeout to extend a sandbox"
    } else if path.contains("/logs") {
        "Cordon keeps an audit row of every call (GET /v1/audit); a command's output is its stream"
    } else {
        "docs/e2b.md lists what Cordon's E2B listener serves"
    };
    e2b_error(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "{} {path} is not served by Cordon's E2B listener: {instead}",
            "this route"
        ),
    )
}

/// envd's default keepalive interval when the client asks for none.
pub(crate) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// A header's value as a number, if it is one.
pub(crate) fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values E2B's Python SDK (`e2b.sandbox.signature.get_signature`) computes.
    #[test]
    fn file_signatures_are_e2bs() {
        assert_eq!(
            file_signature("/home/user/a.txt", "read", "", "tok", None),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"
        );
        assert_eq!(
            file_signature(
                "/home/user/a.txt",
                "write",
                "user",
                "tok",
                Some(1_700_000_000)
            ),
            "v1_x09R0+VxB2mRzkxWcRyFCpiJmFv0okUrtgQ6q12G0jM"
        );
    }

    #[test]
    fn home_is_the_workspace() {
        assert_eq!(to_sandbox_path("/home/user"), "/work");
        assert_eq!(to_sandbox_path("/home/user/a/b.txt"), "/work/a/b.txt");
        assert_eq!(to_sandbox_path("a.txt"), "/work/a.txt");
        assert_eq!(to_sandbox_path("./a.txt"), "/work/a.txt");
        assert_eq!(to_sandbox_path("/home/username"), "/home/username");
        assert_eq!(to_sandbox_path("/etc/passwd"), "/etc/passwd");
        assert_eq!(to_e2b_path("/work/x"), "/home/user/x");
        assert_eq!(to_e2b_path("/work"), "/home/user");
        assert_eq!(to_e2b_path("/workx"), "/workx");
        // The sandbox's own root is reached (ADR 0031), but not its kernel's views.
        assert!(check_reachable("/etc/passwd").is_ok());
        assert!(check_reachable("/tmp/x").is_ok());
        assert!(check_reachable("/work/a").is_ok());
        for p in [
            "/proc/self/environ",
            "/sys",
            "/dev/mem",
            "/tmp/../proc",
            "/run/cordon/s",
        ] {
            assert!(check_reachable(p).is_err(), "{p}");
        }
        assert!(check_watched("/etc").is_err());
        assert!(check_watched("/workx").is_err());
        assert!(check_watched("/work/a").is_ok());
    }

    #[test]
    fn link_targets_are_absolute() {
        assert_eq!(link_target("/work/d/l", "t.txt"), "/work/d/t.txt");
        assert_eq!(link_target("/work/d/l", "../x/./y"), "/work/x/y");
        assert_eq!(link_target("/work/d/l", "/etc/passwd"), "/etc/passwd");
        assert_eq!(link_target("/work/l", "../../.."), "/");
    }

    #[test]
    fn messages_name_e2b_paths() {
        assert_eq!(
            shown_paths("/work/a does not exist under /work"),
            "/home/user/a does not exist under /home/user"
        );
        assert_eq!(shown_paths("/workspace"), "/workspace");
    }

    #[test]
    fn users() {
        let mut h = HeaderMap::new();
        assert!(check_user(&h, None).is_ok());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic cm9vdDo="),
        );
        assert!(check_user(&h, None).is_ok());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic bWFsbG9yeTo="),
        );
        assert_eq!(check_user(&h, None).unwrap_err().code, "unauthenticated");
        assert!(check_user(&HeaderMap::new(), Some("mallory")).is_err());
    }
}

#[cfg(test)]
mod host_mask_tests {
    use super::host_mask_ok;

    #[test]
    fn a_host_mask_is_a_name_and_a_port_only() {
        for ok in [
            "custom-host.example.com:${PORT}",
            "custom-host.example.com",
            "api.local:8080",
            "${PORT}-x.example.com",
        ] {
            assert!(host_mask_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "evil.com\r\nX-Injected: 1",
            "user@evil.com",
            "evil.com/path",
            "evil.com?x",
            "evil.com#x",
            "a,b",
            "évil.com",
            "evil.com:80:90",
            "evil.com:port",
            "..",
        ] {
            assert!(!host_mask_ok(bad), "{bad:?}");
        }
    }
}
