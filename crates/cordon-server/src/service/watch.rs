//! Directory watchers on a sandbox's workspace (E2B's `watch_dir`, the native watch
//! stream): the tier watches ([`cordon_core::Sandbox::watch`]: inotify in the agent, or
//! on the host for gvisor), bounded there; the server keeps nothing per watcher but its
//! id, so a flood inside the sandbox grows no memory here. A watcher is the tenant's own
//! (the sandbox is looked up under the caller's tenant) and ends with its sandbox. The
//! calls lock the sandbox for one agent round trip and take no busy claim: a watch read
//! waits for a file call but never refuses one.

use cordon_core::{Feature, WatchEvent, WatchOp, WatchReply, validate_sandbox_dir};

use super::common::{audit_err, blocking};
use super::procs::on_sandbox;
use super::sessions::Sessions;
use crate::audit::AuditEvent;
use crate::error::ApiError;
use crate::keys::Tenant;

/// What one read of a watcher found.
#[derive(Debug, Clone, Default)]
pub struct WatchBatch {
    pub events: Vec<WatchEvent>,
    /// Events lost since the last read (the sandbox's queue was full).
    pub dropped: u64,
    /// The watched directory is gone: nothing more will come.
    pub ended: bool,
}

impl Sessions {
    /// Starts watching `path` (a sandbox path) in sandbox `id`; the watcher's id. `via`:
    /// the listener's name, for the audit row.
    pub async fn watch_start(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
        recursive: bool,
        via: &'static str,
    ) -> Result<u64, ApiError> {
        validate_sandbox_dir(path)?;
        let s = self.session(tenant, id)?;
        self.refuse_paused(&s)?;
        if !s.tier.features().has(Feature::Watch) {
            return Err(Feature::Watch
                .unsupported(s.tier, "watching a directory")
                .into());
        }
        let audit = self.audit.store.clone();
        let path = path.to_string();
        blocking(move || -> Result<u64, ApiError> {
            let op = WatchOp::Start {
                path: path.clone(),
                recursive,
            };
            let r = on_sandbox(&s, |sb| sb.watch(&op));
            audit
                .record(&s.row(AuditEvent::WatchStart {
                    path,
                    recursive,
                    via: via.to_string(),
                    error: r.as_ref().err().map(|e| e.message.clone()),
                }))
                .map_err(audit_err)?;
            match r? {
                WatchReply::Started { id } => Ok(id),
                other => Err(unexpected(&other)),
            }
        })
        .await?
    }

    /// What watcher `watcher` of sandbox `id` queued since its last read.
    pub async fn watch_read(
        &self,
        tenant: &Tenant,
        id: &str,
        watcher: u64,
    ) -> Result<WatchBatch, ApiError> {
        let s = self.session(tenant, id)?;
        self.refuse_paused(&s)?;
        blocking(
            move || match on_sandbox(&s, |sb| sb.watch(&WatchOp::Read { id: watcher }))? {
                WatchReply::Events {
                    events,
                    dropped,
                    ended,
                } => Ok(WatchBatch {
                    events,
                    dropped,
                    ended,
                }),
                other => Err(unexpected(&other)),
            },
        )
        .await?
    }

    /// Stops watcher `watcher` of sandbox `id`.
    pub async fn watch_stop(
        &self,
        tenant: &Tenant,
        id: &str,
        watcher: u64,
    ) -> Result<(), ApiError> {
        let s = self.session(tenant, id)?;
        blocking(move || on_sandbox(&s, |sb| sb.watch(&WatchOp::Stop { id: watcher })).map(drop))
            .await?
    }
}

fn unexpected(r: &WatchReply) -> ApiError {
    ApiError::internal(format!("the sandbox answered a watch with {r:?}"))
}
