//! The file routes beyond one file in and out: list, stat, remove, rename, mkdir, and a
//! directory as a tar stream (`application/x-tar`, streamed both ways).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use cordon_core::{ArchiveReport, FileOp};
use futures_util::TryStreamExt;
use serde::Deserialize;

use super::extract::{Auth, bytes_rejection, json_rejection, parse_id, query_rejection};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::model::{self as m, Done, Listing, Stat};
use crate::openapi::{Api, Op, SANDBOX};
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

pub(crate) async fn list(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<DirQuery>, QueryRejection>,
) -> Result<Json<Listing>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    Ok(Json(svc.files().list(&t, &id, q.path).await?))
}

pub(crate) async fn stat(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    q: Result<Query<StatQuery>, QueryRejection>,
) -> Result<Json<Stat>, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = q.map_err(query_rejection)?;
    Ok(Json(svc.files().stat(&t, &id, q.path).await?))
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
    svc.files().done(&t, &id, op).await.map(Json)
}

pub(crate) async fn rename(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(id): Path<String>,
    body: Result<Json<RenameBody>, JsonRejection>,
) -> Result<Json<Done>, ApiError> {
    let id = parse_id(&id)?;
    let Json(b) = body.map_err(json_rejection)?;
    let op = FileOp::Rename {
        from: b.from,
        to: b.to,
    };
    svc.files().done(&t, &id, op).await.map(Json)
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
    svc.files().done(&t, &id, op).await.map(Json)
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
    Ok(Json(
        svc.files().put_archive(&t, &id, &q.path, stream).await?,
    ))
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
    let stream = svc.files().get_archive(&t, &id, &q.path).await?;
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(resp)
}

/// The file routes: one file in or out (bounded by http.max_file_bytes), the operations on
/// paths (bounded by http.max_body_bytes), and directories as tar streams (unbounded here:
/// the service bounds them, http.max_archive_bytes, as they pass).
pub(super) fn routes(limits: &HttpLimits) -> Api {
    let one = Api::default()
        .op(
            Op::put("/v1/sandboxes/{id}/files/{*path}", "putFile", "files")
                .summary("Write a file (raw body, at most http.max_file_bytes)")
                .query::<FileQuery>()
                .body("application/octet-stream", None)
                .ok::<m::FileWritten>(200, "written")
                .errors(SANDBOX)
                .errors(&[
                    Code::PathRefused,
                    Code::FileError,
                    Code::SandboxBusy,
                    Code::PayloadTooLarge,
                ]),
            put_file,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/files/{*path}", "getFile", "files")
                .summary("Read a file (at most http.max_file_bytes)")
                .answer(200, "its bytes", "application/octet-stream", None)
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy]),
            get_file,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_file_bytes)));
    let archives = Api::default()
        .op(
            Op::get("/v1/sandboxes/{id}/archive", "getArchive", "files")
                .summary("Download a directory as a tar stream (streamed; files, directories and symlinks as links, never followed; FIFOs, sockets and devices skipped). Refused before the first byte when its files hold more than http.max_archive_bytes, or when the sandbox holds grants (422 unsupported: download files one by one, each is scanned). An error after the first byte cuts the stream off.")
                .query::<DirQuery>()
                .answer(200, "the tar stream", "application/x-tar", None)
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::Unsupported, Code::SandboxBusy, Code::PayloadTooLarge]),
            get_archive,
        )
        .op(
            Op::put("/v1/sandboxes/{id}/archive", "putArchive", "files")
                .summary("Upload a directory as an uncompressed tar stream (streamed, at most http.max_archive_bytes and the sandbox's disk limit) into `path` (made if missing). Entries that leave it (absolute, '..') stop the upload with 400 path_refused; links, devices and FIFOs are skipped and reported; setuid/setgid/sticky bits are dropped.")
                .query::<DirQuery>()
                .body("application/x-tar", None)
                .ok::<cordon_core::ArchiveReport>(200, "what was written and skipped")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::Unsupported, Code::SandboxBusy, Code::PayloadTooLarge, Code::UnsupportedMediaType]),
            put_archive,
        )
        .map(|r| r.layer(DefaultBodyLimit::disable()));
    Api::default()
        .op(
            Op::get("/v1/sandboxes/{id}/files", "listFiles", "files")
                .summary("List a directory under /work (its entries; symlinks reported, never followed)")
                .query::<DirQuery>()
                .ok::<Listing>(200, "the entries")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy, Code::Unsupported]),
            list,
        )
        .op(
            Op::delete("/v1/sandboxes/{id}/files", "removeFile", "files")
                .summary("Remove a file, a symlink (the link itself) or an empty directory; with recursive=true a directory and everything beneath it")
                .query::<RemoveQuery>()
                .ok::<Done>(200, "removed")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy, Code::Unsupported]),
            remove,
        )
        .op(
            Op::get("/v1/sandboxes/{id}/files/stat", "statFile", "files")
                .summary("One entry (a symlink is reported as one, not followed)")
                .query::<StatQuery>()
                .ok::<Stat>(200, "the entry")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy, Code::Unsupported]),
            stat,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/files/rename", "renameFile", "files")
                .summary("Rename or move under /work (a file at `to` is replaced); neither path may pass through a symlink")
                .json::<RenameBody>()
                .ok::<Done>(200, "renamed")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy, Code::Unsupported]),
            rename,
        )
        .op(
            Op::post("/v1/sandboxes/{id}/files/mkdir", "makeDir", "files")
                .summary("Make a directory under /work; with parents, missing parents too and no error when it exists")
                .json::<MkdirBody>()
                .ok::<Done>(200, "made")
                .errors(SANDBOX)
                .errors(&[Code::PathRefused, Code::FileError, Code::SandboxBusy, Code::Unsupported]),
            mkdir,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
        .merge(one)
        .merge(archives)
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
        svc.files()
            .put_file(&t, &id, &file_path(&path), body.to_vec(), mode)
            .await?,
    ))
}

async fn get_file(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let data = svc.files().get_file(&t, &id, &file_path(&path)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}
