//! File operations beyond one file in and out, and directories moved as tar streams. The
//! sandbox is busy for the whole call, as for a file or an exec; the archive's bytes
//! stream through bounded channels (never a whole archive in memory), each side bounded by
//! `http.max_archive_bytes`; every call writes its audit row (archives with the stream's
//! size and sha256) before its answer.

use std::io::{self, Read, Write};

use bytes::Bytes;
use cordon_core::{
    ArchiveReport, Feature, FileOp, FileReply, FileTarget, classify_sandbox_path,
    validate_sandbox_dir,
};
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::common::{audit_err, blocking, gone, lock};
use super::sessions::Sessions;
use crate::audit::{AuditEvent, Transfer};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{Done, Listing, Stat};

/// Files in and out of tenants' sandboxes. Uses the sessions (a claimed sandbox).
#[derive(Clone)]
pub struct Files {
    sessions: Sessions,
    /// `http.max_file_bytes`: the largest file read out.
    max_file_bytes: u64,
    /// `http.max_archive_bytes`: the largest archive either way.
    max_archive_bytes: u64,
}

/// A piece of a download on its way to the client, or how the download ended.
enum Piece {
    Data(Bytes),
    End(Result<ArchiveReport, ApiError>),
}

/// How many pieces a download buffers between the sandbox and the client.
const DOWNLOAD_QUEUE: usize = 4;
/// The size of each piece sent to the client.
const PIECE: usize = 256 << 10;

/// A sandbox's answer of another kind than its op's.
fn unexpected(r: FileReply) -> ApiError {
    ApiError::internal(format!("the sandbox answered a file call with {r:?}"))
}

/// Checks an op's paths before the sandbox is claimed (in the workspace or elsewhere in the
/// sandbox's root: ADR 0031; a tier without the latter refuses it itself).
fn check_op(op: &FileOp) -> Result<(), ApiError> {
    let dir = matches!(op, FileOp::List { .. } | FileOp::Stat { .. });
    for path in op.paths() {
        classify_sandbox_path(path, dir)?;
    }
    if let FileOp::SetMetadata { metadata, .. } = op {
        cordon_core::check_metadata(metadata).map_err(|e| ApiError::invalid(e.0))?;
    }
    Ok(())
}

fn metadata_served(tier: cordon_core::Tier) -> Result<(), ApiError> {
    if tier.features().has(Feature::FileMetadata) {
        return Ok(());
    }
    Err(Feature::FileMetadata
        .unsupported(tier, "metadata on a file")
        .into())
}

/// A file's path as the sandbox names it: `/work/...`, or absolute elsewhere in its root.
fn full_path(path: &str) -> Result<String, ApiError> {
    Ok(match classify_sandbox_path(path, false)? {
        FileTarget::Workspace(rel) => format!("/work/{rel}"),
        FileTarget::Outside(rel) => format!("/{rel}"),
    })
}

fn full_dir(dir: &str) -> Result<String, ApiError> {
    let rel = validate_sandbox_dir(dir)?;
    Ok(if rel.is_empty() {
        "/work".to_string()
    } else {
        format!("/work/{rel}")
    })
}

/// Reads the upload, counting and hashing it, refusing it past `max` bytes.
struct Metered<R> {
    inner: R,
    bytes: u64,
    max: u64,
    sha: Sha256,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.max {
            return Err(io::Error::other(format!(
                "the archive is larger than this server accepts (http.max_archive_bytes = {})",
                self.max
            )));
        }
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

/// Sends a download to the client in pieces, counting and hashing it; fails once the
/// client has gone.
struct Sender {
    tx: mpsc::Sender<Piece>,
    buf: Vec<u8>,
    bytes: u64,
    sha: Sha256,
}

impl Sender {
    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE)));
        self.tx
            .blocking_send(Piece::Data(piece))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for Sender {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.sha.update(data);
        self.bytes += data.len() as u64;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIECE {
            self.send_buf()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buf()
    }
}

impl Files {
    pub(super) fn new(sessions: Sessions, max_file_bytes: u64, max_archive_bytes: u64) -> Self {
        Files {
            sessions,
            max_file_bytes,
            max_archive_bytes,
        }
    }

    /// Writes a file into a sandbox (under /work, or elsewhere where the tier reaches).
    pub async fn put_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
        data: Vec<u8>,
        mode: u32,
    ) -> Result<crate::model::FileWritten, ApiError> {
        let full = full_path(path)?;
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.sessions.audit.store.clone();
        let p = full.clone();
        let n = data.len();
        // The sandbox stays busy until the blocking call has ended, even if the client
        // gives up first: the guard travels with the work, not with the request.
        blocking(move || -> Result<(), ApiError> {
            let _busy = guard;
            let digest = hex::encode(Sha256::digest(&data));
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.put_file(&p, &data, mode)
            };
            audit
                .record(&s.row(AuditEvent::FilePut(Transfer {
                    path: p,
                    bytes: Some(n as u64),
                    sha256: Some(digest),
                    mode: Some(mode),
                    report: None,
                    error: r.as_ref().err().map(|e| e.to_string()),
                })))
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await??;
        Ok(crate::model::FileWritten {
            path: full,
            bytes: n as u64,
        })
    }

    /// Reads a file out of a sandbox (under /work, or elsewhere where the tier reaches), at
    /// most the configured size.
    pub async fn get_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
    ) -> Result<Vec<u8>, ApiError> {
        let full = full_path(path)?;
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.sessions.audit.store.clone();
        let max = self.max_file_bytes;
        let data = blocking(move || -> Result<Vec<u8>, ApiError> {
            let _busy = guard;
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.get_file(&full, max)
            };
            audit
                .record(&s.row(AuditEvent::FileGet(Transfer {
                    path: full,
                    bytes: r.as_ref().map(|d| d.len() as u64).ok(),
                    sha256: r.as_ref().map(|d| hex::encode(Sha256::digest(d))).ok(),
                    mode: None,
                    report: None,
                    error: r.as_ref().err().map(|e| e.to_string()),
                })))
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await??;
        Ok(data)
    }

    /// Refused unless the sandbox's tier keeps metadata on files: asked before an upload
    /// carrying some writes anything.
    pub fn check_metadata_served(&self, tenant: &Tenant, id: &str) -> Result<(), ApiError> {
        metadata_served(self.sessions.session(tenant, id)?.tier)
    }

    /// A directory's listing (the API's route and MCP's tool).
    pub async fn list(&self, tenant: &Tenant, id: &str, path: String) -> Result<Listing, ApiError> {
        let op = FileOp::List { path: path.clone() };
        match self.file_op(tenant, id, op).await? {
            FileReply::Entries { entries, truncated } => Ok(Listing {
                path,
                entries,
                truncated,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// One path's entry, never through a symlink (the API's route and MCP's tool).
    pub async fn stat(&self, tenant: &Tenant, id: &str, path: String) -> Result<Stat, ApiError> {
        let op = FileOp::Stat { path: path.clone() };
        match self.file_op(tenant, id, op).await? {
            FileReply::Entry { entry } => Ok(Stat { path, entry }),
            other => Err(unexpected(other)),
        }
    }

    /// A remove, rename, mkdir or metadata change (the API's routes and MCP's tools).
    pub async fn done(&self, tenant: &Tenant, id: &str, op: FileOp) -> Result<Done, ApiError> {
        let name = op.name();
        let (path, to) = match &op {
            FileOp::Rename { from, to } => (from.clone(), Some(to.clone())),
            other => (other.path().to_string(), None),
        };
        match self.file_op(tenant, id, op).await? {
            FileReply::Done => Ok(Done { op: name, path, to }),
            other => Err(unexpected(other)),
        }
    }

    /// Runs one file operation in a sandbox (list, stat, remove, rename, mkdir).
    pub async fn file_op(
        &self,
        tenant: &Tenant,
        id: &str,
        op: FileOp,
    ) -> Result<FileReply, ApiError> {
        check_op(&op)?;
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        if matches!(op, FileOp::SetMetadata { .. }) {
            metadata_served(s.tier)?;
        }
        let audit = self.sessions.audit.store.clone();
        blocking(move || -> Result<FileReply, ApiError> {
            let _busy = guard;
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.file_op(&op)
            };
            audit
                .record(&s.row(AuditEvent::FileOp {
                    op: op.clone(),
                    error: r.as_ref().err().map(|e| e.to_string()),
                }))
                .map_err(audit_err)?;
            r.map_err(ApiError::from)
        })
        .await?
    }

    /// Extracts a tar stream into the directory `dir` of a sandbox, as it arrives.
    pub async fn put_archive<S>(
        &self,
        tenant: &Tenant,
        id: &str,
        dir: &str,
        body: S,
    ) -> Result<ArchiveReport, ApiError>
    where
        S: Stream<Item = Result<Bytes, io::Error>> + Send + Unpin + 'static,
    {
        let full = full_dir(dir)?;
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.sessions.audit.store.clone();
        let max = self.max_archive_bytes;
        // The body is read on the blocking thread as the sandbox takes it.
        let src = SyncIoBridge::new(StreamReader::new(body));
        blocking(move || -> Result<ArchiveReport, ApiError> {
            let _busy = guard;
            let mut src = Metered {
                inner: src,
                bytes: 0,
                max,
                sha: Sha256::new(),
            };
            let r = {
                let mut cell = lock(&s.sandbox);
                let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
                sb.put_archive(&full, &mut src)
            };
            // The rest (a tar's trailing blocks) is read too, so the size and digest are
            // the whole stream's.
            let _ = io::copy(&mut src, &mut io::sink());
            let r = r.map_err(ApiError::from).map_err(|e| {
                if src.bytes > max {
                    ApiError::new(
                        Code::PayloadTooLarge,
                        format!(
                            "the archive is larger than this server accepts \
                             (http.max_archive_bytes = {max})"
                        ),
                        "send a smaller archive, in parts, or ask the operator to raise the limit",
                    )
                } else {
                    e
                }
            });
            let sha = hex::encode(std::mem::take(&mut src.sha).finalize());
            audit
                .record(&s.row(AuditEvent::ArchivePut(Transfer {
                    path: full.clone(),
                    bytes: Some(src.bytes),
                    sha256: Some(sha),
                    mode: None,
                    report: r.as_ref().ok().cloned(),
                    error: r.as_ref().err().map(|e| e.message.clone()),
                })))
                .map_err(audit_err)?;
            r
        })
        .await?
    }

    /// Starts a download of the directory `dir` as a tar stream. An error found before the
    /// first byte (no such directory, too large, refused) is the answer; one after it ends
    /// the stream with an error (the client sees a cut-off body).
    pub async fn get_archive(
        &self,
        tenant: &Tenant,
        id: &str,
        dir: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static, ApiError> {
        let full = full_dir(dir)?;
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        let audit = self.sessions.audit.store.clone();
        let max = self.max_archive_bytes;
        let (tx, mut rx) = mpsc::channel::<Piece>(DOWNLOAD_QUEUE);
        let end = tx.clone();
        tokio::task::spawn_blocking(move || {
            let busy = guard;
            let mut out = Sender {
                tx,
                buf: Vec::with_capacity(PIECE),
                bytes: 0,
                sha: Sha256::new(),
            };
            let r = {
                let mut cell = lock(&s.sandbox);
                match cell.as_mut() {
                    None => Err(gone(&s.id)),
                    Some(sb) => sb
                        .get_archive(&full, max, &mut out)
                        .map_err(ApiError::from)
                        .and_then(|rep| {
                            out.flush().map(|()| rep).map_err(|e| {
                                ApiError::new(
                                    Code::FileError,
                                    format!("the download of {full} was cut off: {e}"),
                                    "download it again",
                                )
                            })
                        }),
                }
            };
            let sha = hex::encode(std::mem::take(&mut out.sha).finalize());
            let row = audit.record(&s.row(AuditEvent::ArchiveGet(Transfer {
                path: full.clone(),
                bytes: Some(out.bytes),
                sha256: Some(sha),
                mode: None,
                report: r.as_ref().ok().cloned(),
                error: r.as_ref().err().map(|e| e.message.clone()),
            })));
            let r = match row {
                Ok(_) => r,
                Err(e) => Err(audit_err(e)),
            };
            // The sandbox is free before the stream's end is sent: a client that sends
            // its next call the moment the body ends must not find it busy.
            drop(busy);
            let _ = end.blocking_send(Piece::End(r));
        });
        // The first piece decides the status: data, or the error that came first.
        let first = match rx.recv().await {
            Some(Piece::Data(b)) => Some(b),
            Some(Piece::End(Ok(_))) => None,
            Some(Piece::End(Err(e))) => return Err(e),
            None => return Err(ApiError::internal("the download's worker ended early")),
        };
        let head = futures_util::stream::iter(first.map(Ok));
        let rest = futures_util::stream::unfold(Some(rx), |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(Piece::Data(b)) => Some((Ok(b), Some(rx))),
                Some(Piece::End(Ok(_))) | None => None,
                Some(Piece::End(Err(e))) => Some((Err(io::Error::other(e.message)), None)),
            }
        });
        Ok(head.chain(rest))
    }
}
