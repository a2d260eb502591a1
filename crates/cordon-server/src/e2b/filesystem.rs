//! envd's filesystem service (`filesystem.Filesystem/*`) and its `/files` upload and
//! download: stat, list, make, move, remove and the transfers.

use axum::Json;
use axum::body::Bytes;
use axum::extract::FromRequest;
use axum::extract::{Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cordon_core::{FileEntry, FileKind, FileOp};

use super::connect::{ConnectError, stream_error, unary};
use super::entry::{entry_info, stat_of};
use super::wire::*;
use super::{
    Auth, E2b, E2bBox, ENVD_PORT, api_error, check_reachable, check_user, connect_error, e2b_error,
    retry_busy, to_e2b_path, to_sandbox_path,
};
use crate::error::{ApiError, Code};

/// The deepest `ListDir` walks.
const MAX_DEPTH: u32 = 16;
/// The most entries a deep `ListDir` answers.
const MAX_ENTRIES: usize = 10_000;

/// A remove, rename or mkdir through the service's file component.
async fn file_op(e: &E2b, b: &E2bBox, id: &str, op: FileOp) -> Result<(), ApiError> {
    retry_busy(|| e.svc.files().done(&b.tenant, id, op.clone()))
        .await
        .map(drop)
}

async fn stat(e: &E2b, b: &E2bBox, id: &str, path: &str) -> Result<EntryInfo, ConnectError> {
    stat_of(e, &b.tenant, id, path).await
}

/// An E2B path as the sandbox path it names, refused unless Cordon's file API reaches it.
fn reachable(path: &str) -> Result<String, ConnectError> {
    let p = to_sandbox_path(path);
    check_reachable(&p).map_err(connect_error)?;
    Ok(p)
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// A directory's entries by name (byte order), as envd's walk reads them.
async fn list_sorted(
    e: &E2b,
    b: &E2bBox,
    id: &str,
    dir: &str,
) -> Result<std::collections::VecDeque<FileEntry>, ConnectError> {
    let mut entries = retry_busy(|| e.svc.files().list(&b.tenant, id, dir.to_string()))
        .await
        .map_err(connect_error)?
        .entries;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries.into())
}

/// `/filesystem.Filesystem/{method}`.
pub(super) async fn filesystem(
    State(e): State<E2b>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (id, b) = match e.sandbox(&headers, ENVD_PORT, Auth::Envd).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(err) = check_user(&headers, None) {
        return if method == "WatchDir" {
            stream_error(&err)
        } else {
            err.into_response()
        };
    }
    let c = super::Call {
        e: &e,
        id: &id,
        b: &b,
        headers: &headers,
        body: &body,
    };
    if method == "WatchDir" {
        return super::watch::stream(&c)
            .await
            .unwrap_or_else(|e| stream_error(&e));
    }
    let r: Result<Response, ConnectError> = async {
        match method.as_str() {
            "Stat" | "MakeDir" => {
                let req: PathRequest = c.unary()?;
                let p = reachable(&req.path)?;
                let entry = match method.as_str() {
                    "Stat" => stat(&e, &b, &id, &p).await?,
                    _ => make_dir(&e, &b, &id, &p).await?,
                };
                Ok(unary(&EntryResponse { entry }))
            }
            "ListDir" => {
                let req: ListDirRequest = c.unary()?;
                let p = reachable(&req.path)?;
                let depth = req.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
                let entries = list_dir(&e, &b, &id, &p, depth).await?;
                Ok(unary(&ListDirResponse { entries }))
            }
            "Move" => {
                let req: MoveRequest = c.unary()?;
                let from = reachable(&req.source)?;
                let to = reachable(&req.destination)?;
                file_op(
                    &e,
                    &b,
                    &id,
                    FileOp::Rename {
                        from,
                        to: to.clone(),
                    },
                )
                .await
                .map_err(connect_error)?;
                Ok(unary(&EntryResponse {
                    entry: stat(&e, &b, &id, &to).await?,
                }))
            }
            "Remove" => {
                let req: PathRequest = c.unary()?;
                let p = reachable(&req.path)?;
                let op = FileOp::Remove {
                    path: p,
                    recursive: true,
                };
                // As envd: removing what is not there is not an error.
                match file_op(&e, &b, &id, op).await.map_err(connect_error) {
                    Err(err) if err.code != "not_found" => Err(err),
                    _ => Ok(unary(&Empty {})),
                }
            }
            "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
                super::watch::unary_call(&c, &method).await
            }
            other => Err(ConnectError::unimplemented(format!(
                "filesystem.Filesystem/{other} is not served by Cordon's E2B listener"
            ))),
        }
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// The entries under `p` to `depth` levels, as envd walks: depth first, each directory's
/// entries by name, a directory's own entries right after it; at most [`MAX_ENTRIES`].
async fn list_dir(
    e: &E2b,
    b: &E2bBox,
    id: &str,
    p: &str,
    depth: u32,
) -> Result<Vec<EntryInfo>, ConnectError> {
    // As envd walks: depth first, each directory's entries by name, a
    // directory's own entries right after it.
    let mut entries = Vec::new();
    let mut frames = vec![(p.to_string(), 1u32, list_sorted(e, b, id, p).await?)];
    while let Some((dir, d, pending)) = frames.last_mut() {
        let Some(ent) = pending.pop_front() else {
            frames.pop();
            continue;
        };
        let (dir, d) = (dir.clone(), *d);
        let path = join(&dir, &ent.name);
        entries.push(entry_info(&ent, &path));
        if entries.len() >= MAX_ENTRIES {
            break;
        }
        if ent.kind == FileKind::Dir && d < depth {
            let below = list_sorted(e, b, id, &path).await?;
            frames.push((path, d + 1, below));
        }
    }
    Ok(entries)
}

/// Makes directory `p` with its parents; one that is there already is refused, as envd
/// does.
async fn make_dir(e: &E2b, b: &E2bBox, id: &str, p: &str) -> Result<EntryInfo, ConnectError> {
    if stat(e, b, id, p).await.is_ok() {
        return Err(ConnectError::new(
            "already_exists",
            format!("directory {} already exists", to_e2b_path(p)),
        ));
    }
    file_op(
        e,
        b,
        id,
        FileOp::Mkdir {
            path: p.to_string(),
            parents: true,
        },
    )
    .await
    .map_err(connect_error)?;
    stat(e, b, id, p).await
}

// ---- /files ------------------------------------------------------------------------

/// A refusal of a `/files` call: E2B's error shape with the status the SDKs map (404 for
/// a file that is not there).
fn files_error(err: ApiError) -> Response {
    if err.code == Code::FileError && err.message.contains("does not exist") {
        return e2b_error(StatusCode::NOT_FOUND, super::shown_paths(&err.message));
    }
    if err.code == Code::PathRefused {
        return e2b_error(
            StatusCode::BAD_REQUEST,
            super::shown_paths(&format!("{} ({})", err.message, err.fix)),
        );
    }
    api_error(err)
}

fn user_of(q: &FilesQuery) -> Result<(), Response> {
    check_user(&HeaderMap::new(), q.username.as_deref())
        .map_err(|e| e2b_error(StatusCode::UNAUTHORIZED, e.message))
}

/// `GET /files?path=`: the file's bytes.
pub(super) async fn get_file(
    State(e): State<E2b>,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    let who = match q.signature {
        Some(_) => e.signed(&q, "read").await,
        None => e.sandbox(&headers, ENVD_PORT, Auth::Envd).await,
    };
    let (id, b) = match who {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(r) = user_of(&q) {
        return r;
    }
    let p = to_sandbox_path(q.path.as_deref().unwrap_or(""));
    if let Err(err) = check_reachable(&p) {
        return files_error(err);
    }
    match retry_busy(|| e.svc.files().get_file(&b.tenant, &id, &p)).await {
        Ok(data) if super::gzip::accepted(&headers) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (header::CONTENT_ENCODING, "gzip"),
                (header::VARY, "Accept-Encoding"),
            ],
            super::gzip::deflate(&data),
        )
            .into_response(),
        Ok(data) => ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response(),
        Err(err) => files_error(err),
    }
}

/// The header prefix E2B's SDKs send a file's metadata under, one header a key.
const METADATA_HEADER: &str = "x-metadata-";

/// An upload's metadata from its `X-Metadata-<key>` headers (header names arrive
/// lowercased, so the keys are), checked as every file's is before anything is written.
fn upload_metadata(headers: &HeaderMap) -> Result<Metadata, Response> {
    let mut out = Metadata::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        let Ok(value) = value.to_str() else {
            return Err(e2b_error(
                StatusCode::BAD_REQUEST,
                format!("the metadata value of {key:?} is not printable US-ASCII; encode it first"),
            ));
        };
        out.insert(key.to_string(), value.to_string());
    }
    cordon_core::check_metadata(&out).map_err(|e| e2b_error(StatusCode::BAD_REQUEST, e.0))?;
    Ok(out)
}

type Metadata = std::collections::BTreeMap<String, String>;

/// Writes one file of an upload. Writing it clears metadata it had; `metadata`, when
/// given, is then stored on it.
async fn write_one(
    e: &E2b,
    b: &E2bBox,
    id: &str,
    path: &str,
    data: Vec<u8>,
    metadata: &Metadata,
) -> Result<WriteInfo, Response> {
    let p = to_sandbox_path(path);
    check_reachable(&p).map_err(files_error)?;
    retry_busy(|| {
        e.svc
            .files()
            .put_file(&b.tenant, id, &p, data.clone(), 0o644)
    })
    .await
    .map_err(files_error)?;
    if !metadata.is_empty() {
        let op = FileOp::SetMetadata {
            path: p.clone(),
            metadata: metadata.clone(),
        };
        file_op(e, b, id, op).await.map_err(files_error)?;
    }
    let shown = to_e2b_path(&p);
    Ok(WriteInfo {
        name: shown.rsplit('/').next().unwrap_or("").to_string(),
        kind: "file",
        path: shown,
        metadata: metadata.clone(),
    })
}

/// `POST /files`: `multipart/form-data` (one part per file, its file name the destination
/// when no `path` is given) or a raw `application/octet-stream` body for `path`.
pub(super) async fn post_files(
    State(e): State<E2b>,
    Query(q): Query<FilesQuery>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let who = match q.signature {
        Some(_) => e.signed(&q, "write").await,
        None => e.sandbox(&headers, ENVD_PORT, Auth::Envd).await,
    };
    let (id, b) = match who {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(r) = user_of(&q) {
        return r;
    }
    let encoding = match super::gzip::of_upload(&headers) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let metadata = match upload_metadata(&headers) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if !metadata.is_empty()
        && let Err(err) = e.svc.files().check_metadata_served(&b.tenant, &id)
    {
        return api_error(err);
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        if encoding == super::gzip::Encoding::Gzip {
            return e2b_error(
                StatusCode::BAD_REQUEST,
                "a gzip upload is one file as application/octet-stream with ?path=",
            );
        }
        let mut mp = match Multipart::from_request(req, &()).await {
            Ok(m) => m,
            Err(err) => return e2b_error(StatusCode::BAD_REQUEST, err.body_text()),
        };
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(err) => return e2b_error(err.status(), err.body_text()),
            };
            let name = field.file_name().map(str::to_string);
            let data = match field.bytes().await {
                Ok(d) => d,
                Err(err) => return e2b_error(err.status(), err.body_text()),
            };
            let path = match (&q.path, name) {
                (Some(p), _) if !p.is_empty() => p.clone(),
                (_, Some(n)) if !n.is_empty() => n,
                _ => {
                    return e2b_error(
                        StatusCode::BAD_REQUEST,
                        "a file part without a destination: give ?path= or the part's file name",
                    );
                }
            };
            match write_one(&e, &b, &id, &path, data.to_vec(), &metadata).await {
                Ok(w) => written.push(w),
                Err(r) => return r,
            }
        }
    } else {
        let Some(path) = q.path.clone().filter(|p| !p.is_empty()) else {
            return e2b_error(StatusCode::BAD_REQUEST, "a raw upload needs ?path=");
        };
        let data = match Bytes::from_request(req, &()).await {
            Ok(d) => d,
            Err(err) => return e2b_error(err.status(), err.body_text()),
        };
        let data = match encoding {
            super::gzip::Encoding::Identity => data.to_vec(),
            super::gzip::Encoding::Gzip => {
                match super::gzip::inflate(&data, e.svc.config().http.max_file_bytes as u64) {
                    Ok(d) => d,
                    Err(r) => return r,
                }
            }
        };
        match write_one(&e, &b, &id, &path, data, &metadata).await {
            Ok(w) => written.push(w),
            Err(r) => return r,
        }
    }
    Json(written).into_response()
}
