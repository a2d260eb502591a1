//! Snapshots (issue 46): a live sandbox's state kept in the data dir, and sandboxes started
//! from it. Uses the sessions (the source, and every new sandbox through the same create
//! as any other: the gate, the budgets, the audit), the pools (the tier that starts it) and
//! the admission's budgets.
//!
//! A snapshot is a row in the store (tenant, name, the source's spec) and a root-only
//! directory `<data>/snapshots/<id>/` holding the tier's image. The row goes in after the
//! image is written, so a server killed mid-snapshot leaves a directory without a row,
//! which the next start removes ([`Snapshots::new`]). A sandbox started from a snapshot
//! asks the gate for the source's spec again (its tier, limits, environment, egress and
//! grants by name; never anything wider): the tenant's ceiling and quotas as they are now
//! apply, its grants are resolved anew for its own id (so the source's placeholders and
//! minted tokens are worthless in it), and its `create` row names the snapshot.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cordon_core::units::Dur;
use cordon_core::{SandboxSpec, SnapshotDir, SnapshotMode, Tier};
use cordon_engine::{GrantName, LimitsPatch};
use cordon_policy::TierChoice;

use super::common::{audit_err, blocking, gone, lock, snapshots_dir};
use super::contexts::{self, CarriedContexts};
use super::pools::FromSnapshot;
use super::procs::{self, CarriedProcs};
use super::sessions::Sessions;
use crate::audit::{AuditEvent, NewEvent, SnapshotRefusal, SnapshotRow, SnapshotTaken, now_ms};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{CreateRequest, SandboxInfo, SnapshotInfo};

/// What a full snapshot keeps of the server's own state of its sandbox: its code contexts
/// and background execs, which a sandbox started from it has again (the tier keeps their
/// processes and exec ids).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Carried {
    contexts: CarriedContexts,
    procs: CarriedProcs,
}

/// What a new sandbox from a snapshot may set of its own: its life and labels.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    pub ttl: Option<Dur>,
    pub idle_timeout: Option<Dur>,
    pub labels: BTreeMap<String, String>,
}

/// Snapshots taken and kept.
#[derive(Clone)]
pub struct Snapshots {
    sessions: Sessions,
    dir: PathBuf,
    /// Snapshots being taken: id -> (tenant, bytes they may take), counted against the
    /// tenant's `max_snapshot_bytes` until written.
    pending: Arc<Mutex<HashMap<String, (String, u64)>>>,
}

/// A snapshot's hold on its tenant's budget while it is taken.
struct Pending {
    pending: Arc<Mutex<HashMap<String, (String, u64)>>>,
    id: String,
}

impl Drop for Pending {
    fn drop(&mut self) {
        lock(&self.pending).remove(&self.id);
    }
}

fn new_id() -> Result<String, ApiError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| ApiError::internal_from("no randomness", e))?;
    Ok(format!("snap-{}", hex::encode(b)))
}

/// Whether `key` has the shape of a snapshot's id (`snap-` and 32 hex digits, as
/// [`new_id`] makes them).
fn is_id_shaped(key: &str) -> bool {
    key.strip_prefix("snap-")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A snapshot name: as a template's (1 to 64 of `a-z 0-9 . _ -`), never an id's shape (a
/// lookup takes either, so a name shaped like an id could shadow another snapshot's id).
/// Other names starting `snap-` are names like any other (E2B's suites use them).
fn validate_name(name: &str) -> Result<(), ApiError> {
    cordon_core::validate_template_name(name)
        .map_err(|e| ApiError::invalid(e.to_string().replace("template", "snapshot")))?;
    if is_id_shaped(name) {
        return Err(ApiError::invalid(
            "a snapshot name may not have an id's shape (snap- and 32 hex digits); choose another name",
        ));
    }
    Ok(())
}

fn not_found() -> ApiError {
    ApiError::new(
        Code::NotFound,
        "no snapshot with that id or name",
        "list yours with GET /v1/snapshots; snapshots of other tenants are not visible",
    )
}

impl Snapshots {
    /// The snapshots of the data dir; images a killed server left without a row (a
    /// snapshot cut short) are removed.
    pub(super) fn new(sessions: Sessions, data_dir: &std::path::Path) -> Self {
        let dir = snapshots_dir(data_dir);
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            tracing::error!("making the snapshots' directory: {e}");
        }
        let me = Snapshots {
            sessions,
            dir,
            pending: Arc::default(),
        };
        me.sweep();
        me
    }

    /// Removes every image directory that no row names.
    fn sweep(&self) {
        let kept: std::collections::HashSet<String> =
            match self.sessions.audit.store.snapshots(None) {
                Ok(rows) => rows.into_iter().map(|r| r.id).collect(),
                Err(e) => {
                    tracing::error!("reading the snapshots' rows; none removed: {e}");
                    return;
                }
            };
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !kept.contains(&name) {
                tracing::warn!(snapshot = %name, "removing a snapshot cut short");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    fn image_dir(&self, id: &str) -> SnapshotDir {
        SnapshotDir::new(self.dir.join(id))
    }

    /// The tenant's snapshot named `key` (its id or its name).
    pub async fn get(&self, tenant: &Tenant, key: &str) -> Result<SnapshotInfo, ApiError> {
        Ok(info(&self.row(tenant, key).await?))
    }

    async fn row(&self, tenant: &Tenant, key: &str) -> Result<SnapshotRow, ApiError> {
        let store = self.sessions.audit.store.clone();
        let t = tenant.0.clone();
        let rows = blocking(move || store.snapshots(Some(&t)))
            .await?
            .map_err(audit_err)?;
        rows.into_iter()
            .find(|r| r.id == key || r.name.as_deref() == Some(key))
            .ok_or_else(not_found)
    }

    /// The tenant's snapshots, oldest first.
    pub async fn list(&self, tenant: &Tenant) -> Result<Vec<SnapshotInfo>, ApiError> {
        let store = self.sessions.audit.store.clone();
        let t = tenant.0.clone();
        let rows = blocking(move || store.snapshots(Some(&t)))
            .await?
            .map_err(audit_err)?;
        Ok(rows.iter().map(info).collect())
    }

    /// Takes a snapshot of the tenant's sandbox `id`; `mode` left out is the most the
    /// tier keeps (full where it can, else its files).
    pub async fn take(
        &self,
        tenant: &Tenant,
        id: &str,
        name: Option<String>,
        mode: Option<SnapshotMode>,
    ) -> Result<SnapshotInfo, ApiError> {
        if let Some(n) = &name {
            validate_name(n)?;
            if self.row(tenant, n).await.is_ok() {
                return Err(exists(n));
            }
        }
        let guard = self.sessions.claim(tenant, id)?;
        let s = guard.0.clone();
        let features = s.tier.features();
        let mode = mode.unwrap_or(if features.snapshot_full {
            SnapshotMode::Full
        } else {
            SnapshotMode::Filesystem
        });
        let snap = new_id()?;
        // A mode the tier lacks costs no budget: the tier refuses it (with its reason)
        // before writing anything.
        let _pending = if features.has(mode.feature()) {
            Some(self.room(tenant, &snap, &s.spec, mode)?)
        } else {
            None
        };
        let dir = self.image_dir(&snap);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.path())
            .map_err(|e| ApiError::internal_from("making a snapshot's directory", e))?;
        // The session is claimed: no cell or start runs while its state is read.
        let carried = if mode == SnapshotMode::Full {
            let c = Carried {
                contexts: contexts::carry(&s),
                procs: procs::carry(&s),
            };
            serde_json::to_string(&c)
                .map_err(|e| ApiError::internal_from("encoding a snapshot's contexts", e))?
        } else {
            String::new()
        };
        let t0 = Instant::now();
        let (tier, spec, cell, sid) = (s.tier, s.spec.clone(), s.sandbox.clone(), s.id.clone());
        let d = dir.clone();
        let taken = blocking(move || {
            let _busy = guard;
            let mut held = lock(&cell);
            let sb = held.as_mut().ok_or_else(|| gone(&sid))?;
            sb.snapshot(mode, &d).map_err(ApiError::from)
        })
        .await
        .and_then(|r| r);
        let us = t0.elapsed().as_micros() as u64;
        let image = match taken {
            Ok(image) => image,
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir.path());
                let event = AuditEvent::Snapshot(SnapshotTaken {
                    snapshot: None,
                    name,
                    mode,
                    bytes: None,
                    us,
                    error: Some(e.failure()),
                });
                self.record(tenant, id, tier, event).await?;
                return Err(e);
            }
        };
        let row = SnapshotRow {
            id: snap.clone(),
            tenant: tenant.0.clone(),
            name,
            grants: spec.grants.iter().map(|g| g.name.clone()).collect(),
            spec,
            image,
            source: id.to_string(),
            created_ms: now_ms(),
            carried,
        };
        self.add_row(tenant, id, &row, (mode, us), dir.path())
            .await?;
        Ok(info(&row))
    }

    /// Adds a taken snapshot's row (and its audit event) within the tenant's snapshot
    /// budget; refused, its image dir `dir` is removed.
    async fn add_row(
        &self,
        tenant: &Tenant,
        id: &str,
        row: &SnapshotRow,
        (mode, us): (SnapshotMode, u64),
        dir: &std::path::Path,
    ) -> Result<(), ApiError> {
        let budget = self.sessions.admit.rules(tenant).max_snapshot_bytes;
        let store = self.sessions.audit.store.clone();
        let (r, t, i) = (row.clone(), tenant.0.clone(), id.to_string());
        let event = AuditEvent::Snapshot(SnapshotTaken {
            snapshot: Some(row.id.clone()),
            name: row.name.clone(),
            mode,
            bytes: Some(row.image.bytes),
            us,
            error: None,
        });
        let added = blocking(move || {
            store.snapshot_add(
                &r,
                budget,
                &NewEvent {
                    tenant: Some(&t),
                    sandbox: Some(&i),
                    tier: Some(r.image.tier),
                    event,
                },
            )
        })
        .await?;
        if let Err(refused) = added {
            let _ = std::fs::remove_dir_all(dir);
            return Err(match refused {
                SnapshotRefusal::Exists => exists(row.name.as_deref().unwrap_or_default()),
                SnapshotRefusal::Ceiling { bytes } => {
                    self.over_budget(row.image.bytes, bytes, budget, "it took")
                }
                SnapshotRefusal::Store(e) => audit_err(e),
            });
        }
        Ok(())
    }

    /// Before a snapshot: what it may take (the sandbox's disk limit, and its memory limit
    /// for a full one of a tier whose memory outlives an exec) must fit under the tenant's `max_snapshot_bytes` beside its other
    /// snapshots and those being taken, and the data dir must keep `audit.min_free_disk`
    /// free after it. Held until the guard drops.
    fn room(
        &self,
        tenant: &Tenant,
        snap: &str,
        spec: &SandboxSpec,
        mode: SnapshotMode,
    ) -> Result<Pending, ApiError> {
        // A full snapshot holds memory only where something of it outlives an exec (a
        // process or a code context); the wasm tier's full snapshot is its files.
        let f = spec.tier.features();
        let memory = mode == SnapshotMode::Full
            && (f.has(cordon_core::Feature::Background) || f.has(cordon_core::Feature::Contexts));
        let want = if memory {
            spec.limits
                .memory_bytes
                .saturating_add(spec.limits.disk_bytes)
        } else {
            spec.limits.disk_bytes
        };
        let kept: u64 = self
            .sessions
            .audit
            .store
            .snapshots(Some(&tenant.0))
            .map_err(audit_err)?
            .iter()
            .map(|r| r.image.bytes)
            .sum();
        let mut pending = lock(&self.pending);
        let held = pending
            .values()
            .filter(|(t, _)| *t == tenant.0)
            .map(|(_, b)| *b)
            .fold(kept, u64::saturating_add);
        let budget = self.sessions.admit.rules(tenant).max_snapshot_bytes;
        if held.saturating_add(want) > budget {
            return Err(self.over_budget(want, held, budget, "it could take"));
        }
        let need = want.saturating_add(self.sessions.admit.min_free_disk);
        if let Some(free) = self.sessions.admit.data_dir_free()
            && free < need
        {
            tracing::error!(free, need, "no room for a snapshot");
            return Err(self.sessions.admit.storage_low(
                "the server has no room on disk to keep this snapshot",
                "delete snapshots you no longer need, or retry later",
            ));
        }
        pending.insert(snap.to_string(), (tenant.0.clone(), want));
        Ok(Pending {
            pending: self.pending.clone(),
            id: snap.to_string(),
        })
    }

    fn over_budget(&self, want: u64, held: u64, budget: u64, how: &str) -> ApiError {
        self.sessions.metrics.deny("snapshot_quota");
        ApiError::new(
            Code::SnapshotQuota,
            format!(
                "this snapshot is {} MiB ({how}: the sandbox's limits bound it), and this \
                 tenant's snapshots already hold {} MiB of its {} MiB",
                want.div_ceil(1 << 20),
                held >> 20,
                budget >> 20
            ),
            "delete snapshots you no longer need (DELETE /v1/snapshots/{id}), or snapshot a \
             sandbox with a smaller disk limit; the operator sets max_snapshot_bytes",
        )
    }

    /// Deletes the tenant's snapshot `key` (id or name) and its image; sandboxes started
    /// from it live on.
    pub async fn delete(&self, tenant: &Tenant, key: &str) -> Result<(), ApiError> {
        let row = self.row(tenant, key).await?;
        let store = self.sessions.audit.store.clone();
        let (t, id, tier, bytes) = (
            tenant.0.clone(),
            row.id.clone(),
            row.image.tier,
            row.image.bytes,
        );
        let removed = blocking(move || {
            store.snapshot_remove(
                &t,
                &id,
                &NewEvent {
                    tenant: Some(&t),
                    sandbox: None,
                    tier: Some(tier),
                    event: AuditEvent::SnapshotDelete {
                        snapshot: id.clone(),
                        bytes,
                    },
                },
            )
        })
        .await?
        .map_err(audit_err)?;
        if !removed {
            return Err(not_found());
        }
        let dir = self.image_dir(&row.id);
        blocking(move || {
            if let Err(e) = std::fs::remove_dir_all(dir.path()) {
                tracing::warn!("removing a deleted snapshot's image: {e}");
            }
        })
        .await
    }

    /// Starts `count` (1 to [`cordon_core::MAX_FORKS`]) sandboxes from the tenant's
    /// snapshot `key`, each a create through the gate; each one's outcome, in order.
    pub async fn start(
        &self,
        tenant: &Tenant,
        key: &str,
        count: u32,
        opts: StartOptions,
    ) -> Result<Vec<Result<SandboxInfo, ApiError>>, ApiError> {
        if !(1..=cordon_core::MAX_FORKS).contains(&count) {
            return Err(ApiError::invalid(format!(
                "count {count}: start 1 to {} sandboxes from one snapshot at a time",
                cordon_core::MAX_FORKS
            )));
        }
        crate::model::validate_labels(&opts.labels)?;
        let row = self.row(tenant, key).await?;
        let req = request_of(&row, &opts);
        let from = FromSnapshot {
            id: row.id.clone(),
            image: row.image.clone(),
            dir: self.image_dir(&row.id),
        };
        let carried: Option<Carried> = (!row.carried.is_empty())
            .then(|| serde_json::from_str(&row.carried))
            .transpose()
            .map_err(|e| ApiError::internal_from("reading a snapshot's contexts", e))?;
        let starts =
            (0..count).map(|_| self.sessions.create_from(tenant, req.clone(), Some(&from)));
        let started = futures_util::future::join_all(starts).await;
        if let Some(c) = &carried {
            for info in started.iter().flatten() {
                if let Ok(s) = self.sessions.session(tenant, &info.id) {
                    contexts::restore(&s, c.contexts.clone());
                    procs::restore(&s, c.procs.clone());
                }
            }
        }
        Ok(started)
    }

    /// Takes a snapshot of the tenant's sandbox `id` and starts `count` sandboxes from it,
    /// then deletes it (E2B's `fork`): the mode is the most the tier keeps.
    pub async fn fork(
        &self,
        tenant: &Tenant,
        id: &str,
        count: u32,
        opts: StartOptions,
    ) -> Result<(String, Vec<Result<SandboxInfo, ApiError>>), ApiError> {
        if !(1..=cordon_core::MAX_FORKS).contains(&count) {
            return Err(ApiError::invalid(format!(
                "count {count}: fork 1 to {} sandboxes at a time",
                cordon_core::MAX_FORKS
            )));
        }
        let snap = self.take(tenant, id, None, None).await?;
        let started = self.start(tenant, &snap.id, count, opts).await;
        if let Err(e) = self.delete(tenant, &snap.id).await {
            tracing::warn!(snapshot = %snap.id, "deleting a fork's snapshot: {}", e.message);
        }
        Ok((snap.id, started?))
    }

    async fn record(
        &self,
        tenant: &Tenant,
        sandbox: &str,
        tier: Tier,
        event: AuditEvent,
    ) -> Result<(), ApiError> {
        self.sessions
            .audit
            .record(super::common::NewEventOwned {
                tenant: Some(tenant.0.clone()),
                sandbox: Some(sandbox.to_string()),
                tier: Some(tier),
                event,
            })
            .await
            .map(|_| ())
    }
}

fn exists(name: &str) -> ApiError {
    ApiError::new(
        Code::SnapshotExists,
        format!("you have a snapshot named {name:?} already"),
        "choose another name, or delete that snapshot first",
    )
}

fn info(r: &SnapshotRow) -> SnapshotInfo {
    SnapshotInfo {
        id: r.id.clone(),
        name: r.name.clone(),
        tier: r.image.tier,
        mode: r.image.mode,
        bytes: r.image.bytes,
        source: r.source.clone(),
        created_ms: r.created_ms,
        template: r.spec.template.clone(),
    }
}

/// The create a sandbox from `row` asks the gate for: the source's spec, nothing wider,
/// and the new sandbox's own life and labels. Volumes are not part of a snapshot.
fn request_of(row: &SnapshotRow, opts: &StartOptions) -> CreateRequest {
    let l = &row.spec.limits;
    CreateRequest {
        tier: Some(TierChoice::Tier(row.image.tier)),
        limits: LimitsPatch {
            timeout_ms: Some(l.timeout_ms),
            memory_bytes: Some(l.memory_bytes),
            pids: Some(l.pids),
            disk_bytes: Some(l.disk_bytes),
            tmp_bytes: Some(l.tmp_bytes),
            cpus: Some(l.cpus),
            stdout_bytes: Some(l.stdout_bytes),
            stderr_bytes: Some(l.stderr_bytes),
            open_files: Some(l.open_files),
            fuel: l.fuel,
        },
        env: row.spec.env.clone(),
        allow_hosts: cordon_core::egress::pattern_texts(&row.spec.egress.allow),
        deny_hosts: cordon_core::egress::pattern_texts(&row.spec.egress.deny),
        grants: row.grants.iter().cloned().map(GrantName).collect(),
        allow_weaker: row.spec.allow_weaker.clone(),
        template: row.spec.template.clone(),
        ttl: opts.ttl,
        idle_timeout: opts.idle_timeout,
        labels: opts.labels.clone(),
        ..Default::default()
    }
}
