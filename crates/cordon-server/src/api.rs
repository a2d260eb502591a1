//! The HTTP API (axum). Every route is added through [`crate::openapi::Api`], which records
//! its operation: `docs/openapi.json` is generated from those (checked by a test).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use cordon_core::{ExecOutcome, OutputStream, SandboxId};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::audit::Query as AuditQuery;
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{CreateRequest, ExecBody, RunRequest};
use crate::openapi::{Api, Op};
use crate::service::{Chunk, Service};

/// The authenticated tenant of a request (`Authorization: Bearer <key>`).
pub struct Auth(pub Tenant);

/// The address a connection came from (plain TCP or TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for PeerAddr
{
    fn connect_info(s: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        PeerAddr(*s.remote_addr())
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, crate::tls::TlsListener>>
    for PeerAddr
{
    fn connect_info(s: axum::serve::IncomingStream<'_, crate::tls::TlsListener>) -> Self {
        PeerAddr(*s.remote_addr())
    }
}

fn unauthorized(msg: &str) -> ApiError {
    ApiError::new(
        Code::Unauthorized,
        msg,
        "send `Authorization: Bearer <api key>` with a key from the server's key file",
    )
}

/// Finds the tenant of a request's bearer key. `peer` is the connection's source, for the
/// failed-key back-off (none for in-process callers).
pub fn authenticate(
    svc: &Service,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Tenant, ApiError> {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        svc.metrics().deny("unauthorized");
        return Err(unauthorized("no API key given"));
    };
    let allowed = svc.config().edge.failures_before_slowdown;
    if let Some(ip) = peer
        && let Some(wait) = svc.throttle().check(ip, allowed)
    {
        svc.metrics().deny("key_backoff");
        let mut e = ApiError::new(
            Code::TooManyFailures,
            "too many failed API keys from your address",
            "wait for the Retry-After seconds and send a valid key",
        );
        e.retry_after = Some(wait);
        return Err(e);
    }
    let key = v
        .to_str()
        .ok()
        .and_then(|s| {
            s.strip_prefix("Bearer ")
                .or_else(|| s.strip_prefix("bearer "))
        })
        .map(str::trim);
    match key.and_then(|k| svc.keys().tenant_for(k)) {
        Some(t) => Ok(t),
        None => {
            if let Some(ip) = peer {
                svc.throttle().fail(ip);
            }
            svc.metrics().deny("unauthorized");
            Err(unauthorized("the API key is not valid"))
        }
    }
}

fn peer_of(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<PeerAddr>>()
        .map(|c| c.0.0.ip())
}

impl FromRequestParts<Service> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, svc: &Service) -> Result<Self, ApiError> {
        authenticate(svc, &parts.headers, peer_of(parts)).map(Auth)
    }
}

/// A tenant when the request carries a valid key, none when it carries none; a bad key is
/// refused as anywhere else.
pub struct MaybeAuth(pub Option<Tenant>);

impl FromRequestParts<Service> for MaybeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, svc: &Service) -> Result<Self, ApiError> {
        if !parts.headers.contains_key(header::AUTHORIZATION) {
            return Ok(MaybeAuth(None));
        }
        authenticate(svc, &parts.headers, peer_of(parts)).map(|t| MaybeAuth(Some(t)))
    }
}

pub(crate) fn json_rejection(r: JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            Code::UnsupportedMediaType,
            "the body must be JSON",
            "send Content-Type: application/json",
        ),
        _ => ApiError::invalid(r.body_text()),
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        Code::PayloadTooLarge,
        "the request body is larger than this server accepts",
        "send less: the limits are http.max_body_bytes (JSON) and http.max_file_bytes (files)",
    )
}

fn bytes_rejection(r: BytesRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        ApiError::invalid(r.body_text())
    }
}

pub(crate) fn query_rejection(r: QueryRejection) -> ApiError {
    ApiError::invalid(r.body_text())
}

pub(crate) fn parse_id(id: &str) -> Result<String, ApiError> {
    SandboxId::parse(id)
        .map(|i| i.to_string())
        .ok_or_else(|| ApiError::not_found("sandbox"))
}

/// Builds the router (API + metrics + MCP over streamable HTTP).
pub fn router(svc: Service) -> Router {
    documented(svc).0
}

/// The router and the operations of its routes (what `docs/openapi.json` documents).
pub fn documented(svc: Service) -> (Router, Vec<Op>) {
    use crate::error::Code as C;
    use crate::model as m;
    use crate::openapi::SANDBOX;
    let limits = svc.config().http.clone();
    let files = Api::default()
        .op(
            Op::put("/v1/sandboxes/{id}/files/{*path}", "putFile", "files")
                .summary("Write a file (raw body, at most http.max_file_bytes)")
                .query::<FileQuery>()
                .body("application/octet-stream", None)
                .ok::<m::FileWritten>(200, "written")
                .errors(SANDBOX)
                .errors(&[
                    C::PathRefused,
                    C::FileError,
                    C::SandboxBusy,
                    C::PayloadTooLarge,
                ]),
            put_file,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/files/{*path}", "getFile", "files")
                .summary("Read a file (at most http.max_file_bytes)")
                .answer(200, "its bytes", "application/octet-stream", None)
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy]),
            get_file,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_file_bytes)));
    // Archives stream; the service bounds them (http.max_archive_bytes) as they pass.
    let archives = Api::default()
        .op(
            Op::get("/v1/sandboxes/{id}/archive", "getArchive", "files")
                .summary("Download a directory as a tar stream (streamed; files, directories and symlinks as links, never followed; FIFOs, sockets and devices skipped). Refused before the first byte when its files hold more than http.max_archive_bytes, or when the sandbox holds grants (422 unsupported: download files one by one, each is scanned). An error after the first byte cuts the stream off.")
                .query::<crate::api_files::DirQuery>()
                .answer(200, "the tar stream", "application/x-tar", None)
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::Unsupported, C::SandboxBusy, C::PayloadTooLarge]),
            crate::api_files::get_archive,
        )
        .op(
            Op::put("/v1/sandboxes/{id}/archive", "putArchive", "files")
                .summary("Upload a directory as an uncompressed tar stream (streamed, at most http.max_archive_bytes and the sandbox's disk limit) into `path` (made if missing). Entries that leave it (absolute, '..') stop the upload with 400 path_refused; links, devices and FIFOs are skipped and reported; setuid/setgid/sticky bits are dropped.")
                .query::<crate::api_files::DirQuery>()
                .body("application/x-tar", None)
                .ok::<cordon_core::ArchiveReport>(200, "what was written and skipped")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::Unsupported, C::SandboxBusy, C::PayloadTooLarge, C::UnsupportedMediaType]),
            crate::api_files::put_archive,
        )
        .map(|r| r.layer(DefaultBodyLimit::disable()));
    let (mcp, book) = crate::mcp::http_service(svc.clone());
    let mcp_router = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            (svc.clone(), book),
            mcp_auth,
        ));
    let mcp_ops = vec![
        Op::post("/mcp", "mcp", "server")
            .summary("MCP over streamable HTTP (JSON-RPC 2.0; the tools of docs/service.md#mcp, each with a title, hints, an input and an output schema). The session (Mcp-Session-Id) belongs to the key's tenant; at most max_mcp_sessions each")
            .body("application/json", None)
            .answer(200, "a JSON-RPC answer, or an SSE stream of them", "application/json", None)
            .answer(200, "a JSON-RPC answer, or an SSE stream of them", "text/event-stream", None)
            .errors(&[C::NotFound, C::TooManySandboxes]),
        Op::delete("/mcp", "mcpEnd", "server")
            .summary("End an MCP session (Mcp-Session-Id); 204")
            .answer(204, "ended", "application/json", None)
            .errors(&[C::NotFound]),
    ];
    let api = Api::default()
        .op(
            Op::get("/v1/health", "health", "server")
                .summary("Liveness for anyone ({\"status\": \"ok\"}); with a valid key also the version, the tiers' status, pool fill and live sandboxes")
                .public()
                .ok::<Health>(200, "the server is up"),
            health,
        )
        .op(
            Op::get("/metrics", "metrics", "server")
                .summary("Prometheus metrics (OpenMetrics text); needs a key unless edge.metrics_need_key = false")
                .answer(200, "the metrics", "application/openmetrics-text", None),
            metrics,
        )
        .op(
            Op::get("/.well-known/openid-configuration", "oidcDiscovery", "tokens")
                .summary("OIDC discovery document of the issuer of minted grant tokens (issuer, jwks_uri, introspection_endpoint, ES256)")
                .public()
                .ok::<cordon_engine::Discovery>(200, "the discovery document"),
            discovery,
        )
        .op(
            Op::get("/.well-known/jwks.json", "jwks", "tokens")
                .summary("The public keys (P-256, ES256) that verify minted grant tokens: the current key and those whose tokens may still be alive")
                .public()
                .ok::<cordon_engine::Jwks>(200, "the keys"),
            jwks,
        )
        .op(
            Op::post("/v1/tokens/introspect", "introspectToken", "tokens")
                .summary("RFC 7662 introspection of a minted grant token: active while its sandbox lives and it has not expired (the token is the caller's credential: no key)")
                .public()
                .body("application/x-www-form-urlencoded", Some(crate::openapi::schema::<IntrospectForm>))
                .body("application/json", Some(crate::openapi::schema::<IntrospectForm>))
                .ok::<cordon_engine::Introspection>(200, "active, and the claims when active")
                .errors(&[C::InvalidRequest]),
            introspect,
        )
        .op(
            Op::post("/v1/sandboxes", "createSandbox", "sandboxes")
                .summary("Create a sandbox (fresh from the warm pool when the spec is the pool's), through the operator's ceiling and the tier policy")
                .json::<CreateRequest>()
                .ok::<m::SandboxInfo>(201, "created")
                .errors(CREATE),
            create,
        )
        .op(
            Op::get("/v1/sandboxes", "listSandboxes", "sandboxes")
                .summary("List my live sandboxes, optionally only those carrying every given label")
                .query_param("label", "key=value; repeat it to ask for several labels", json!({"type": "string"}))
                .ok::<m::SandboxList>(200, "my sandboxes")
                .errors(&[C::InvalidRequest]),
            list,
        )
        .op(
            Op::get("/v1/sandboxes/{id}", "getSandbox", "sandboxes")
                .summary("One of my live sandboxes")
                .ok::<m::SandboxInfo>(200, "the sandbox")
                .errors(&[C::NotFound]),
            info,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}", "destroySandbox", "sandboxes")
                .summary("Destroy (idempotent: destroying a destroyed sandbox of mine succeeds with already=true)")
                .ok::<m::Destroyed>(200, "destroyed")
                .errors(&[C::NotFound]),
            destroy,
        )
        .op(
            Op::patch("/v1/sandboxes/{id}", "updateSandbox", "sandboxes")
                .summary("Change a sandbox's TTL (from its creation, paused time not counted) or idle timeout, within the server's maxima")
                .json::<m::PatchRequest>()
                .ok::<m::SandboxInfo>(200, "the sandbox")
                .errors(SANDBOX),
            patch,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/pause", "pauseSandbox", "sandboxes")
                .summary("Pause: every process stops where it is (no CPU), memory kept, TTL clock stopped; with to_disk (microvm) the whole sandbox is saved to disk, its memory freed, and it survives a server restart")
                .json::<m::PauseRequest>()
                .body_optional()
                .ok::<m::SandboxInfo>(200, "paused")
                .errors(SANDBOX)
                .errors(&[C::SandboxBusy, C::Unsupported, C::PausedQuota, C::StorageLow, C::SandboxFailure]),
            pause,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/resume", "resumeSandbox", "sandboxes")
                .summary("Resume a paused sandbox")
                .ok::<m::SandboxInfo>(200, "running again")
                .errors(SANDBOX)
                .errors(&[C::SandboxFailure]),
            resume,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/exec", "exec", "execs")
                .summary("Exec in a sandbox: lang + code, argv or wasm_base64. One JSON outcome; with stream: true or Accept: application/x-ndjson, stdout/stderr events as they come and a last outcome (or error) event (SSE with Accept: text/event-stream); with background: true its id at once (202)")
                .json::<ExecBody>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .ok::<m::ExecInfo>(202, "started in the background")
                .errors(SANDBOX)
                .errors(&[C::SandboxBusy, C::TooManyExecs, C::Unsupported, C::SandboxFailure]),
            exec,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/execs", "listExecs", "execs")
                .summary("The sandbox's background execs")
                .ok::<m::ExecList>(200, "its background execs")
                .errors(SANDBOX),
            list_execs,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/execs/{exec_id}", "attachExec", "execs")
                .summary("Attach to a background exec: its output so far, then live, then its outcome (NDJSON; SSE with Accept: text/event-stream; one JSON outcome with stream=false)")
                .query::<AttachQuery>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .errors(SANDBOX),
            attach,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/execs/{exec_id}", "stopExec", "execs")
                .summary("Stop a background exec: SIGTERM to its process tree, SIGKILL after sessions.kill_grace (signal=kill: at once)")
                .query::<StopQuery>()
                .ok::<m::ExecInfo>(200, "the exec")
                .errors(SANDBOX),
            stop_exec,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/execs/{exec_id}/stdin", "execStdin", "execs")
                .summary("Write to a background exec's stdin (data or data_base64), and close it with close: true")
                .json::<m::StdinBody>()
                .ok::<m::StdinWritten>(200, "written")
                .errors(SANDBOX),
            exec_stdin,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/execs/{exec_id}/resize", "resizeExec", "execs")
                .summary("Resize a background exec's pseudo-terminal (TIOCSWINSZ: its program gets SIGWINCH)")
                .json::<m::ResizeBody>()
                .ok::<m::ExecInfo>(200, "the exec")
                .errors(SANDBOX),
            resize_exec,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/files", "listFiles", "files")
                .summary("List a directory under /work (its entries; symlinks reported, never followed)")
                .query::<crate::api_files::DirQuery>()
                .ok::<crate::api_files::Listing>(200, "the entries")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy, C::Unsupported]),
            crate::api_files::list,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/files", "removeFile", "files")
                .summary("Remove a file, a symlink (the link itself) or an empty directory; with recursive=true a directory and everything beneath it")
                .query::<crate::api_files::RemoveQuery>()
                .ok::<crate::api_files::Done>(200, "removed")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy, C::Unsupported]),
            crate::api_files::remove,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/files/stat", "statFile", "files")
                .summary("One entry (a symlink is reported as one, not followed)")
                .query::<crate::api_files::StatQuery>()
                .ok::<crate::api_files::Stat>(200, "the entry")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy, C::Unsupported]),
            crate::api_files::stat,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/files/rename", "renameFile", "files")
                .summary("Rename or move under /work (a file at `to` is replaced); neither path may pass through a symlink")
                .json::<crate::api_files::RenameBody>()
                .ok::<crate::api_files::Done>(200, "renamed")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy, C::Unsupported]),
            crate::api_files::rename,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/files/mkdir", "makeDir", "files")
                .summary("Make a directory under /work; with parents, missing parents too and no error when it exists")
                .json::<crate::api_files::MkdirBody>()
                .ok::<crate::api_files::Done>(200, "made")
                .errors(SANDBOX)
                .errors(&[C::PathRefused, C::FileError, C::SandboxBusy, C::Unsupported]),
            crate::api_files::mkdir,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/contexts", "createContext", "contexts")
                .summary("Start a code context: a long-lived Python or JavaScript interpreter whose state persists between cells (container, gvisor, microvm; JavaScript: container)")
                .json::<m::ContextBody>()
                .ok::<m::ContextInfo>(201, "started")
                .errors(SANDBOX)
                .errors(&[C::TooManyContexts, C::Unsupported, C::SandboxFailure]),
            crate::api_contexts::create,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/contexts", "listContexts", "contexts")
                .summary("The sandbox's code contexts")
                .ok::<m::ContextList>(200, "its contexts")
                .errors(SANDBOX),
            crate::api_contexts::list,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/contexts/{context_id}", "deleteContext", "contexts")
                .summary("End a code context (its interpreter is killed; a cell running in it ends as died)")
                .ok::<m::ContextInfo>(200, "ended")
                .errors(SANDBOX),
            crate::api_contexts::delete,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/contexts/{context_id}/restart", "restartContext", "contexts")
                .summary("Start the context's interpreter again: its variables and imports are gone")
                .ok::<m::ContextInfo>(200, "restarted")
                .errors(SANDBOX)
                .errors(&[C::ContextBusy, C::SandboxFailure]),
            crate::api_contexts::restart,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/contexts/{context_id}/run", "runCell", "contexts")
                .summary("Run a cell: one JSON result, or (stream: true or Accept: application/x-ndjson; SSE with Accept: text/event-stream) stdout/stderr events as they come and a last result (or error) event. One cell at a time per context (409 context_busy)")
                .json::<m::CellBody>()
                .ok::<m::CellResult>(200, "the cell's result, or the stream of events")
                .answer(200, "the cell's result, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the cell's result, or the stream of events", "text/event-stream", None)
                .errors(SANDBOX)
                .errors(&[C::ContextBusy, C::SandboxFailure]),
            crate::api_contexts::run,
        )
        .op(
            Op::post("/v1/volumes", "createVolume", "volumes")
                .summary("Create a volume of mine: an empty file system of `size` bytes (its quota) that outlives sandboxes; refused past my ceiling (403 volume_quota) or with a name I have (409 volume_exists)")
                .json::<m::VolumeCreate>()
                .ok::<m::VolumeInfo>(201, "created")
                .errors(&[C::VolumeExists, C::VolumeQuota, C::StorageLow, C::ShuttingDown, C::Unsupported]),
            create_volume,
        )
        .op(
            Op::get("/v1/volumes", "listVolumes", "volumes")
                .summary("My volumes, with the bytes they count against my volume ceiling")
                .ok::<m::VolumeList>(200, "my volumes"),
            list_volumes,
        )
        .op(
            Op::get("/v1/volumes/{name}", "getVolume", "volumes")
                .summary("One of my volumes (another tenant's is 404)")
                .ok::<m::VolumeInfo>(200, "the volume")
                .errors(&[C::NotFound]),
            volume,
        )
        .op(
            Op::delete("/v1/volumes/{name}", "deleteVolume", "volumes")
                .summary("Delete one of my volumes and its contents; refused while a sandbox mounts it (409 volume_in_use)")
                .ok::<m::VolumeDeleted>(200, "deleted")
                .errors(&[C::NotFound, C::VolumeInUse, C::ShuttingDown]),
            delete_volume,
        )
        .op(
            Op::post("/v1/run", "run", "run")
                .summary("One-shot: create, put files, exec, destroy; one JSON outcome or streamed events as for exec")
                .json::<RunRequest>()
                .ok::<ExecOutcome>(200, "the outcome, or the stream of events")
                .answer(200, "the outcome, or the stream of events", "application/x-ndjson", None)
                .answer(200, "the outcome, or the stream of events", "text/event-stream", None)
                .errors(CREATE)
                .errors(&[C::PathRefused, C::FileError, C::TooManyExecs]),
            run,
        )
        .op(
            Op::get("/v1/audit", "audit", "audit")
                .summary("My audit rows, oldest first (policy, create, exec, file_put, file_get, egress, grant_use, destroy, ...)")
                .query::<AuditQuery>()
                .ok::<m::AuditEvents>(200, "the rows"),
            audit,
        )
        .op(
            Op::get("/v1/events", "events", "server")
                .summary("The dashboard's server-sent event stream: a `stats` event every second (live sandboxes with their tier and tenant, counts per tier and tenant, pool fill: the Snapshot schema) and an `audit` event for each audit row as it is written (the last 200 of the past 15 minutes first). The key's tenant's own; every tenant's for the tenants named in edge.dashboard_operators. It ends when the server stops.")
                .answer(200, "the stream", "text/event-stream", Some(crate::openapi::schema::<crate::dashboard::Snapshot>)),
            crate::dashboard::events,
        )
        .op(
            Op::get("/dashboard", "dashboard", "server")
                .summary("The dashboard page (read-only; it holds no data: it reads the API with the key the user gives it)")
                .public()
                .answer(200, "the page", "text/html", None),
            crate::dashboard::page,
        )
        .op(
            Op::get("/dashboard/dashboard.js", "dashboardScript", "server")
                .summary("The dashboard's script")
                .public()
                .answer(200, "the script", "text/javascript", None),
            crate::dashboard::script,
        )
        .op(
            Op::get("/dashboard/dashboard.css", "dashboardStyle", "server")
                .summary("The dashboard's style")
                .public()
                .answer(200, "the style", "text/css", None),
            crate::dashboard::style,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
        .merge(files)
        .merge(archives);
    let Api { router, mut ops } = api;
    ops.extend(mcp_ops);
    let router = router
        .merge(mcp_router)
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(middleware::from_fn(close_after_refused_body))
        .with_state(svc);
    (router, ops)
}

/// The errors of a create (and of a one-shot run's create).
const CREATE: &[Code] = &[
    Code::NotFound,
    Code::PolicyDenied,
    Code::TierUnavailable,
    Code::GrantUnavailable,
    Code::LayerUnavailable,
    Code::TooManySandboxes,
    Code::ResourceBusy,
    Code::VolumeInUse,
    Code::StorageLow,
    Code::ShuttingDown,
    Code::SandboxFailure,
];

/// A request with a body that is refused (4xx/5xx) may be answered before its body was
/// read: the server then drops the connection, and a client that kept it for its next
/// request would see that request fail. `Connection: close` tells it not to.
async fn close_after_refused_body(req: Request, next: Next) -> Response {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v != "0");
    let mut res = next.run(req).await;
    if has_body && (res.status().is_client_error() || res.status().is_server_error()) {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// Authenticates MCP requests and binds each MCP session to the tenant that opened it:
/// another key holder can neither use nor delete it (404, as for an unknown session), and
/// each tenant opens at most its ceiling's `max_mcp_sessions` at once.
async fn mcp_auth(
    State((svc, book)): State<(Service, Arc<crate::mcp::SessionBook>)>,
    mut req: Request,
    next: Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<PeerAddr>>()
        .map(|c| c.0.0.ip());
    let t = match authenticate(&svc, req.headers(), peer) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match &session {
        Some(id) => {
            if !book.owned_by(id, &t) {
                return ApiError::new(
                    Code::NotFound,
                    "no MCP session with that id",
                    "open a session with an initialize request; sessions of other tenants are not visible",
                )
                .into_response();
            }
        }
        None => {
            let cap = svc
                .gate()
                .rules_for(&cordon_engine::Principal::Tenant(t.0.clone()))
                .max_mcp_sessions;
            if book.count(&t).await >= cap {
                svc.metrics().deny("mcp_sessions");
                let mut e = ApiError::new(
                    Code::TooManySandboxes,
                    format!("you hold your limit of {cap} MCP sessions"),
                    "close sessions you no longer use (DELETE /mcp with their Mcp-Session-Id)",
                );
                e.retry_after = Some(1);
                return e.into_response();
            }
        }
    }
    let deleting = req.method() == axum::http::Method::DELETE;
    req.extensions_mut().insert(t.clone());
    let mut resp = next.run(req).await;
    // rmcp answers a session's DELETE with 202; MCP clients (the official Python SDK among
    // them) take 200 or 204 as the session ended and warn on anything else.
    if deleting && resp.status() == StatusCode::ACCEPTED {
        *resp.status_mut() = StatusCode::NO_CONTENT;
        *resp.body_mut() = Body::empty();
    }
    match (&session, resp.headers().get("mcp-session-id")) {
        (None, Some(new)) => {
            if let Ok(id) = new.to_str() {
                book.bind(id, &t);
            }
        }
        (Some(id), _) if deleting || resp.status() == StatusCode::NOT_FOUND => book.unbind(id),
        _ => {}
    }
    resp
}

/// The OIDC discovery document of the token issuer (minted grants).
async fn discovery(State(svc): State<Service>) -> Json<cordon_engine::Discovery> {
    Json(svc.issuer().discovery())
}

/// The issuer's public keys.
async fn jwks(State(svc): State<Service>) -> Json<cordon_engine::Jwks> {
    Json(svc.issuer().jwks())
}

#[derive(Deserialize, schemars::JsonSchema)]
struct IntrospectForm {
    /// The minted token (a JWT).
    token: String,
}

/// RFC 7662 token introspection: `token=<jwt>` (form or JSON). Answers only whether a
/// token this server minted is active, and its claims; the token itself is the caller's
/// credential, so no key is needed. A destroyed sandbox's tokens are inactive.
async fn introspect(
    State(svc): State<Service>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cordon_engine::Introspection>, ApiError> {
    let body = body.map_err(bytes_rejection)?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    let form: IntrospectForm = if json {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(e.to_string()))?
    } else {
        serde_urlencoded_token(&body)?
    };
    Ok(Json(svc.issuer().introspect(&form.token)))
}

/// `token=...` from an `application/x-www-form-urlencoded` body.
fn serde_urlencoded_token(body: &[u8]) -> Result<IntrospectForm, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
    for pair in text.split('&') {
        if let Some(v) = pair.strip_prefix("token=") {
            // A JWT has no characters a form encodes; refuse anything escaped.
            if v.contains('%') || v.contains('+') {
                return Err(ApiError::invalid("token must be a JWT"));
            }
            return Ok(IntrospectForm {
                token: v.to_string(),
            });
        }
    }
    Err(ApiError::invalid("give token=<the token> in the body"))
}

async fn no_route() -> ApiError {
    ApiError::new(
        Code::NoSuchRoute,
        "no such route",
        "see docs/openapi.json for the routes this server has",
    )
}

async fn no_method() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not take that method",
        "see docs/openapi.json for the methods of each route",
    )
}

/// `GET /v1/health`: the status to anyone; the rest only with a valid key.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Each tier's status on this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiers: Option<std::collections::BTreeMap<cordon_core::Tier, cordon_core::TierStatus>>,
    /// Each warm pool's size and the sandboxes ready in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pools: Option<std::collections::BTreeMap<cordon_core::Tier, PoolHealth>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_sandboxes: Option<usize>,
}

/// One warm pool.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct PoolHealth {
    pub size: usize,
    pub ready: usize,
}

/// Health: `{"status": "ok"}` to anyone; the tiers, pools and counts only with a valid key
/// (or to anyone when the operator sets `edge.metrics_need_key = false`).
async fn health(State(svc): State<Service>, MaybeAuth(t): MaybeAuth) -> Json<Health> {
    let mut h = Health {
        status: "ok".into(),
        version: None,
        tiers: None,
        pools: None,
        live_sandboxes: None,
    };
    if t.is_none() && svc.config().edge.metrics_need_key {
        return Json(h);
    }
    h.version = Some(env!("CARGO_PKG_VERSION").into());
    h.tiers = Some(svc.probes().iter().map(|(t, p)| (*t, p.status)).collect());
    h.pools = Some(
        svc.config()
            .pools
            .iter()
            .map(|(t, size)| {
                (
                    *t,
                    PoolHealth {
                        size: *size,
                        ready: svc.pool_ready(*t),
                    },
                )
            })
            .collect(),
    );
    h.live_sandboxes = Some(svc.live_count());
    Json(h)
}

async fn metrics(State(svc): State<Service>, MaybeAuth(t): MaybeAuth) -> Response {
    if t.is_none() && svc.config().edge.metrics_need_key {
        return unauthorized("/metrics needs an API key").into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        svc.metrics().encode(),
    )
        .into_response()
}

async fn create(
    State(svc): State<Service>,
    Auth(t): Auth,
    body: Result<Json<CreateRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let info = svc.create(&t, req).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// `?label=k=v` (repeatable): only sandboxes carrying every such label.
async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> Result<Json<crate::model::SandboxList>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::invalid(format!("the query is not valid: {e}")))?;
    let mut labels = Vec::new();
    for (k, v) in pairs {
        if k != "label" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {k:?}; the list takes label=key=value"
            )));
        }
        let (lk, lv) = v
            .split_once('=')
            .ok_or_else(|| ApiError::invalid("give label=key=value"))?;
        labels.push((lk.to_string(), lv.to_string()));
    }
    Ok(Json(crate::model::SandboxList {
        sandboxes: svc.list(&t, &labels),
        on_disk_bytes: svc.on_disk_bytes(&t),
    }))
}

/// An optional body: none (or an empty one) pauses in memory; `{"to_disk": true}` to disk.
async fn pause(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    let body = body.map_err(bytes_rejection)?;
    let req: crate::model::PauseRequest = if body.iter().all(u8::is_ascii_whitespace) {
        Default::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::invalid(format!(
                "the pause body: {e}; give {{\"to_disk\": true}} or none"
            ))
        })?
    };
    Ok(Json(svc.pause(&t, &id, req.to_disk).await?))
}

async fn resume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.resume(&t, &id).await?))
}

async fn patch(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<crate::model::PatchRequest>, JsonRejection>,
) -> Result<Json<crate::model::SandboxInfo>, ApiError> {
    let id = parse_id(&id)?;
    let Json(req) = body.map_err(json_rejection)?;
    Ok(Json(svc.patch(&t, &id, req).await?))
}

async fn info(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.info(&t, &id).await?).into_response())
}

async fn create_volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    body: Result<Json<crate::model::VolumeCreate>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let info = svc.create_volume(&t, req).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list_volumes(
    State(svc): State<Service>,
    Auth(t): Auth,
) -> Result<Json<crate::model::VolumeList>, ApiError> {
    Ok(Json(svc.volumes(&t).await?))
}

async fn volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(name): Path<String>,
) -> Result<Json<crate::model::VolumeInfo>, ApiError> {
    Ok(Json(svc.volume(&t, &name).await?))
}

async fn delete_volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(name): Path<String>,
) -> Result<Json<crate::model::VolumeDeleted>, ApiError> {
    Ok(Json(svc.delete_volume(&t, &name).await?))
}

async fn destroy(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::Destroyed>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(svc.destroy(&t, &id).await?))
}

/// How a client wants an exec's result.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Whole,
    Ndjson,
    Sse,
}

pub(crate) fn mode(headers: &HeaderMap, stream: bool) -> Mode {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/event-stream") {
        Mode::Sse
    } else if stream || accept.contains("application/x-ndjson") {
        Mode::Ndjson
    } else {
        Mode::Whole
    }
}

async fn exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ExecBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(json_rejection)?;
    if body.background {
        let info = svc.start_background(&t, &id, &body).await?;
        return Ok((StatusCode::ACCEPTED, Json(info)).into_response());
    }
    if body.pty.is_some() {
        return Err(ApiError::invalid(
            "a pseudo-terminal is for background execs: add \"background\": true, or leave out pty",
        ));
    }
    let m = mode(&headers, body.stream);
    let job = svc.begin_exec(&t, &id, &body)?;
    if m == Mode::Whole {
        return Ok(Json(job.run(None).await?).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = job.run(Some(tx));
    Ok(stream_response(m, rx, fut))
}

/// A background exec's id: `ex-` and a number.
fn parse_exec_id(id: &str) -> Result<String, ApiError> {
    id.strip_prefix("ex-")
        .filter(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
        .map(|_| id.to_string())
        .ok_or_else(|| ApiError::not_found("background exec"))
}

async fn list_execs(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
) -> Result<Json<crate::model::ExecList>, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(crate::model::ExecList {
        execs: svc.list_execs(&t, &id).await?,
    }))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AttachQuery {
    /// false: wait and answer the outcome as one JSON object; true (the default): stream.
    #[serde(default)]
    stream: Option<bool>,
}

/// Attaches to a background exec: replayed output, live output, then its outcome (NDJSON
/// by default, SSE with `Accept: text/event-stream`, one JSON outcome with `?stream=false`).
async fn attach(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    headers: HeaderMap,
    q: Result<Query<AttachQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let m = match mode(&headers, q.stream.unwrap_or(true)) {
        Mode::Whole if q.stream.is_none() => Mode::Ndjson,
        m => m,
    };
    if m == Mode::Whole {
        return Ok(Json(svc.attach(&t, &id, &exec_id, None).await?).into_response());
    }
    // Refused before the stream starts when the exec is not this tenant's.
    svc.list_execs_check(&t, &id, &exec_id)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = async move { svc.attach(&t, &id, &exec_id, Some(tx)).await };
    Ok(stream_response(m, rx, fut))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct StopQuery {
    /// `term` (the default: SIGTERM, then SIGKILL after the grace) or `kill` (at once).
    #[serde(default)]
    signal: Option<String>,
}

async fn stop_exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    q: Result<Query<StopQuery>, QueryRejection>,
) -> Result<Json<crate::model::ExecInfo>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let kill = match q.signal.as_deref() {
        None | Some("term") => false,
        Some("kill") => true,
        Some(_) => return Err(ApiError::invalid("signal must be term or kill")),
    };
    Ok(Json(svc.exec_signal(&t, &id, &exec_id, kill).await?))
}

async fn exec_stdin(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    body: Result<Json<crate::model::StdinBody>, JsonRejection>,
) -> Result<Json<crate::model::StdinWritten>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Json(body) = body.map_err(json_rejection)?;
    let data = body.bytes()?;
    let n = data.len();
    svc.exec_stdin(&t, &id, &exec_id, data, body.close).await?;
    Ok(Json(crate::model::StdinWritten {
        bytes: n as u64,
        closed: body.close,
    }))
}

async fn resize_exec(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, exec_id)): Path<(String, String)>,
    body: Result<Json<crate::model::ResizeBody>, JsonRejection>,
) -> Result<Json<crate::model::ExecInfo>, ApiError> {
    let id = parse_id(&id)?;
    let exec_id = parse_exec_id(&exec_id)?;
    let Json(body) = body.map_err(json_rejection)?;
    let size = cordon_core::PtySize {
        rows: body.rows,
        cols: body.cols,
    };
    Ok(Json(svc.exec_resize(&t, &id, &exec_id, size).await?))
}

async fn run(
    State(svc): State<Service>,
    Auth(t): Auth,
    headers: HeaderMap,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let (create, exec, files) = req.split();
    let m = mode(&headers, exec.stream);
    let job = svc.begin_run(&t, create, &exec, files).await?;
    if m == Mode::Whole {
        return Ok(Json(job.run(None).await?).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let fut = job.run(Some(tx));
    Ok(stream_response(m, rx, fut))
}

/// Decodes UTF-8 across chunk boundaries: an incomplete trailing sequence waits for the
/// next chunk; invalid bytes become U+FFFD.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..good + n);
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

fn frame(mode: Mode, event: &str, payload: serde_json::Value) -> Bytes {
    match mode {
        Mode::Sse => Bytes::from(format!("event: {event}\ndata: {payload}\n\n")),
        _ => {
            let mut v = payload;
            if let serde_json::Value::Object(m) = &mut v {
                m.insert("type".into(), json!(event));
            }
            Bytes::from(format!("{v}\n"))
        }
    }
}

/// Streams output chunks as they come, then the outcome (or the error) as the last event.
fn stream_response(
    mode: Mode,
    rx: mpsc::UnboundedReceiver<Chunk>,
    fut: impl std::future::Future<Output = Result<ExecOutcome, ApiError>> + Send + 'static,
) -> Response {
    stream_events(mode, rx, fut, "outcome")
}

/// Streams output chunks as they come, then the end (or the error) as the last event:
/// `last` names its event and the field that holds it.
pub(crate) fn stream_events<T: serde::Serialize + Send + 'static>(
    mode: Mode,
    mut rx: mpsc::UnboundedReceiver<Chunk>,
    fut: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    last: &'static str,
) -> Response {
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut done = std::pin::pin!(fut);
        let mut carry = [Utf8Carry::default(), Utf8Carry::default()];
        let idx = |s: OutputStream| match s {
            OutputStream::Stdout => 0usize,
            OutputStream::Stderr => 1usize,
        };
        let name = |i: usize| if i == 0 { "stdout" } else { "stderr" };
        let result = loop {
            tokio::select! {
                biased;
                // The client went away: the exec's future is dropped (its sink sees the
                // closed channel and the tier stops the program).
                _ = out_tx.closed() => return,
                Some(c) = rx.recv() => {
                    let i = idx(c.stream);
                    let text = carry[i].push(&c.data);
                    if !text.is_empty() {
                        let _ = out_tx.send(Ok(frame(mode, name(i), json!({"data": text})))).await;
                    }
                }
                r = &mut done => break r,
            }
        };
        // Output sent before the exec ended but not yet forwarded.
        while let Ok(c) = rx.try_recv() {
            let i = idx(c.stream);
            let text = carry[i].push(&c.data);
            if !text.is_empty() {
                let _ = out_tx
                    .send(Ok(frame(mode, name(i), json!({"data": text}))))
                    .await;
            }
        }
        for (i, c) in carry.iter_mut().enumerate() {
            let rest = c.finish();
            if !rest.is_empty() {
                let _ = out_tx
                    .send(Ok(frame(mode, name(i), json!({"data": rest}))))
                    .await;
            }
        }
        let last = match result {
            Ok(o) => frame(mode, last, json!({ last: o })),
            Err(e) => frame(mode, "error", json!({"error": e.to_json()})),
        };
        let _ = out_tx.send(Ok(last)).await;
    });
    let stream = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let ctype = match mode {
        Mode::Sse => "text/event-stream",
        _ => "application/x-ndjson",
    };
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct FileQuery {
    /// Octal permission bits such as `644` (the default) or `755`.
    #[serde(default)]
    mode: Option<String>,
}

/// The sandbox path of a file route: `/files/work/a.csv` names `/work/a.csv`.
fn file_path(p: &str) -> String {
    format!("/{}", p.trim_start_matches('/'))
}

async fn put_file(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, path)): Path<(String, String)>,
    q: Result<Query<FileQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::model::FileWritten>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let body = body.map_err(bytes_rejection)?;
    let mode = match q.mode {
        None => 0o644,
        Some(m) => u32::from_str_radix(&m, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| ApiError::invalid("mode must be octal permission bits like 644"))?,
    };
    Ok(Json(
        svc.put_file(&t, &id, &file_path(&path), body.to_vec(), mode)
            .await?,
    ))
}

async fn get_file(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let data = svc.get_file(&t, &id, &file_path(&path)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

async fn audit(
    State(svc): State<Service>,
    Auth(t): Auth,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<crate::model::AuditEvents>, ApiError> {
    let Query(q) = q.map_err(query_rejection)?;
    if let Some(s) = &q.sandbox
        && SandboxId::parse(s).is_none()
    {
        return Err(ApiError::invalid(
            "sandbox must be an id like sb-<32 hex digits>",
        ));
    }
    let events = svc.audit_query(&t, q).await?;
    Ok(Json(crate::model::AuditEvents { events }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_carry_across_chunks() {
        let mut c = Utf8Carry::default();
        let s = "héllo €".as_bytes();
        let mut out = String::new();
        for b in s {
            out.push_str(&c.push(&[*b]));
        }
        out.push_str(&c.finish());
        assert_eq!(out, "héllo €");
        assert_eq!(c.push(b"a\xffb"), "a\u{fffd}b");
    }
}
