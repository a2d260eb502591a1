//! The file routes beyond one file in and out: list, stat, remove, rename, mkdir, and a
//! directory as a tar stream (`application/x-tar`, streamed both ways).

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use cordon_core::{ArchiveReport, FileEntry, FileOp, FileReply};
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};

use crate::api::{Auth, json_rejection, parse_id, query_rejection};
use crate::error::{ApiError, Code};
use crate::service::Service;

/// `?path=` naming a directory; `/work` when left out.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DirQuery {
    #[serde(default = "work")]
    path: String,
}

fn work() -> String {
    cordon_core::WORKDIR.to_string()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatQuery {
    path: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenameBody {
    from: String,
    to: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MkdirBody {
    path: String,
    #[serde(default)]
    parents: bool,
}

/// A directory's entries.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// More entries than one listing returns (`cordon_core::MAX_LIST_ENTRIES`).
    pub truncated: bool,
}

/// One entry, with the path asked about.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Stat {
    pub path: String,
    #[serde(flatten)]
    pub entry: FileEntry,
}

/// What a remove, rename or mkdir did.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Done {
    pub op: &'static str,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

fn unexpected(r: FileReply) -> ApiError {
    ApiError::internal(format!("the sandbox answered a file call with {r:?}"))
}

/// A remove, rename or mkdir (the API's routes and MCP's tools).
pub(crate) async fn file_done(
    svc: &Service,
    t: &crate::keys::Tenant,
    id: &str,
    op: FileOp,
) -> Result<Done, ApiError> {
    let name = op.name();
    let (path, to) = match &op {
        FileOp::Rename { from, to } => (from.clone(), Some(to.clone())),
        other => (other.path().to_string(), None),
    };
    match svc.file_op(t, id, op).await? {
        FileReply::Done => Ok(Done { op: name, path, to }),
        other => Err(unexpected(other)),
    }
}

/// A directory's listing (the API's route and MCP's tool).
pub(crate) async fn list_dir(
    svc: &Service,
    t: &crate::keys::Tenant,
    id: &str,
    path: String,
) -> Result<Listing, ApiError> {
    let op = FileOp::List { path: path.clone() };
    match svc.file_op(t, id, op).await? {
        FileReply::Entries { entries, truncated } => Ok(Listing {
            path,
            entries,
            truncated,
        }),
        other => Err(unexpected(other)),
    }
}

/// One path's entry, never through a symlink (the API's route and MCP's tool).
pub(crate) async fn stat_path(
    svc: &Service,
    t: &crate::keys::Tenant,
    id: &str,
    path: String,
) -> Result<Stat, ApiError> {
    let op = FileOp::Stat { path: path.clone() };
    match svc.file_op(t, id, op).await? {
        FileReply::Entry { entry } => Ok(Stat { path, entry }),
        other => Err(unexpected(other)),
    }
}

pub(crate) async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<DirQuery>, QueryRejection>,
) -> Result<Json<Listing>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    Ok(Json(list_dir(&svc, &t, &id, q.path).await?))
}

pub(crate) async fn stat(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<StatQuery>, QueryRejection>,
) -> Result<Json<Stat>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    Ok(Json(stat_path(&svc, &t, &id, q.path).await?))
}

pub(crate) async fn remove(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<RemoveQuery>, QueryRejection>,
) -> Result<Json<Done>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let op = FileOp::Remove {
        path: q.path,
        recursive: q.recursive,
    };
    file_done(&svc, &t, &id, op).await.map(Json)
}

pub(crate) async fn rename(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<RenameBody>, JsonRejection>,
) -> Result<Json<Done>, ApiError> {
    let id = parse_id(&id)?;
    let Json(b) = body.map_err(json_rejection)?;
    file_done(
        &svc,
        &t,
        &id,
        FileOp::Rename {
            from: b.from,
            to: b.to,
        },
    )
    .await
    .map(Json)
}

pub(crate) async fn mkdir(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<MkdirBody>, JsonRejection>,
) -> Result<Json<Done>, ApiError> {
    let id = parse_id(&id)?;
    let Json(b) = body.map_err(json_rejection)?;
    let op = FileOp::Mkdir {
        path: b.path,
        parents: b.parents,
    };
    file_done(&svc, &t, &id, op).await.map(Json)
}

/// Extracts the request's tar stream into `?path=` (made if missing) as it arrives.
pub(crate) async fn put_archive(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<DirQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ArchiveReport>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !(ctype.starts_with("application/x-tar") || ctype.starts_with("application/octet-stream")) {
        return Err(ApiError::new(
            Code::UnsupportedMediaType,
            "an archive upload must be an uncompressed tar stream",
            "send Content-Type: application/x-tar",
        ));
    }
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(svc.put_archive(&t, &id, &q.path, stream).await?))
}

/// Streams the directory `?path=` (default `/work`) as a tar archive.
pub(crate) async fn get_archive(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<DirQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    let stream = svc.get_archive(&t, &id, &q.path).await?;
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(resp)
}
