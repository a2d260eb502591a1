//! Start-up: the data dir, crash recovery, and the sessions paused to disk that a
//! previous server kept. Uses the sessions and the pools (the tiers' backends); nothing
//! uses it but the service's start.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cordon_core::Tier;

use super::common::{blocking, lock};
use super::pools::Backends;
use super::pools::{Acquired, Held, Pools};
use super::sessions::{Session, Sessions};
use crate::ServerError;
use crate::audit::{Audit, AuditEvent, LiveRow, NewEvent, PausedRow, RecoveryReport, now_ms};
use crate::config::Config;
use crate::error::ApiError;
use crate::keys::Tenant;

/// The scratch root a tier's backend should use, under the data dir, so that a restart
/// after a crash can remove what a dead server left there.
pub use cordon_core::scratch_dir;

/// Cleans up what a crashed server left of sandboxes of the given rows (cgroups,
/// processes, tier-specific files); returns one line per thing removed. Injected by the
/// caller, which knows the tiers.
pub type RecoveryHook = Arc<dyn Fn(&[LiveRow]) -> Vec<String> + Send + Sync>;

pub(super) fn open_and_recover(
    cfg: &Config,
    backends: &Backends,
    hook: Option<RecoveryHook>,
) -> Result<(File, Audit, RecoveryReport, Vec<PausedRow>), ServerError> {
    let dir = &cfg.data_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("creating the data dir {}", dir.display()), e))?;
    let lock_file = lock_data_dir(dir)?;
    let audit = Audit::open(&dir.join("audit.db"))?;
    let mut report = RecoveryReport::default();
    // Sessions paused to disk on a tier this server has are kept (revived once the service
    // runs); a row that does not decode, or of a tier it lacks, ends like any other.
    let mut kept = Vec::new();
    for row in audit.paused_all()? {
        match row {
            Ok(r) if backends.contains_key(&r.tier) => kept.push(r),
            Ok(r) => {
                tracing::warn!(sandbox = %r.id, "a sandbox paused to disk on a tier this server lacks is removed")
            }
            Err((id, why)) => {
                tracing::warn!(sandbox = %id, "a sandbox paused to disk whose record does not decode ({why}) is removed")
            }
        }
    }
    let rows: Vec<LiveRow> = audit
        .unfinished()?
        .into_iter()
        .filter(|r| !kept.iter().any(|k| k.id == r.id))
        .collect();
    report.sandboxes = rows.iter().map(|r| r.id.clone()).collect();
    // The hook runs even with no unfinished rows: a server killed while a sandbox was being
    // made (before its row was written) leaves host state no row names.
    // Each tier removes what its dead sandboxes left (behind `Backend::recover`); the hook
    // is for callers with more to clean.
    for (tier, backend) in backends {
        let orphans: Vec<String> = rows
            .iter()
            .filter(|r| r.tier == tier.as_str())
            .map(|r| r.id.clone())
            .collect();
        report.removed.extend(backend.recover(&orphans));
    }
    if let Some(h) = &hook {
        report.removed.extend(h(&rows));
    }
    // After the tiers' cleanup: their sandboxes, which held binds of the volumes, are gone.
    report.removed.extend(super::volumes::recover(dir, &audit)?);
    report.scratch.extend(clear_scratch(dir));
    for tier in Tier::ALL {
        let _ = std::fs::create_dir_all(scratch_dir(dir, tier));
    }
    // What template builds and imports (the operator's commands) that died mid-way left:
    // their staging dirs, the scratch ext4 mounted there and so its loop device. A live
    // one's dir is locked and stays.
    let swept = cordon_template::Store::open(dir)
        .and_then(|s| s.sweep_staging())
        .unwrap_or_else(|e| {
            tracing::warn!("sweeping the template store's staging dir: {e}");
            0
        });
    if swept > 0 {
        report.removed.push(format!(
            "template staging: {swept} dirs of dead builds or imports"
        ));
    }
    if !report.sandboxes.is_empty() || !report.scratch.is_empty() || !report.removed.is_empty() {
        for r in &rows {
            audit.sandbox_ended(
                &r.id,
                "recovered",
                "left by a server that stopped without cleanup; removed on restart",
            )?;
        }
        for r in &rows {
            audit.record(&NewEvent {
                tenant: r.tenant.as_deref(),
                sandbox: Some(&r.id),
                tier: r.tier.parse().ok(),
                event: AuditEvent::Recovered {
                    state_was: r.state.clone(),
                },
            })?;
        }
        audit.record(&NewEvent::server(AuditEvent::Recovery(report.clone())))?;
    }
    audit.record(&NewEvent::server(AuditEvent::Startup {
        pid: std::process::id(),
        recovered: report.sandboxes.len(),
    }))?;
    report.kept = kept.iter().map(|k| k.id.clone()).collect();
    Ok((lock_file, audit, report, kept))
}

/// Takes the data dir's lock (its file names this process): one server per
/// data dir.
fn lock_data_dir(dir: &std::path::Path) -> Result<File, ServerError> {
    let lock_path = dir.join("cordon.lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| ServerError::io(format!("opening {}", lock_path.display()), e))?;
    if lock_file.try_lock().is_err() {
        return Err(ServerError::Locked(dir.display().to_string()));
    }
    let _ = std::fs::write(&lock_path, format!("{}\n", std::process::id()));
    Ok(lock_file)
}

/// Removes what dead sandboxes left in each tier's scratch dir (nothing mounted under it
/// first); returns what it removed.
fn clear_scratch(dir: &std::path::Path) -> Vec<String> {
    let mut removed_paths = Vec::new();
    let scratch = dir.join("scratch");
    // Nothing left mounted under it (a volume's bind in a dead sandbox's bundle) may be
    // reached by the removal below.
    cordon_host::volume::unmount_all_under(&scratch);
    if let Ok(tiers) = std::fs::read_dir(&scratch) {
        for t in tiers.flatten() {
            let Ok(entries) = std::fs::read_dir(t.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let removed = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if removed.is_ok() {
                    removed_paths.push(p.display().to_string());
                }
            }
        }
    }
    removed_paths
}

/// Why a session paused to disk was not revived (its files are removed, its end audited).
#[derive(Debug, thiserror::Error)]
enum ReviveError {
    #[error("no backend of its tier")]
    NoBackend,
    #[error("{0}")]
    Worker(#[source] ApiError),
    #[error("{0}")]
    Tier(#[source] cordon_core::Error),
    #[error("its tier keeps no state of it")]
    NoState,
    #[error("over the tenant's budget at the restart: {0}")]
    OverBudget(String),
}

/// Brings back what a previous server kept.
pub(super) struct Recovery {
    pub(super) sessions: Sessions,
    pub(super) pools: Pools,
}

impl Recovery {
    /// Brings back the sessions paused to disk that a previous server kept: each tier
    /// revives its sandbox from its own files (holding nothing until resumed). One that
    /// cannot be revived, or no longer fits the tenant's budget, is ended and its files
    /// removed.
    pub(super) async fn revive_paused(&self, rows: Vec<PausedRow>) {
        for row in rows {
            let (id, tier, tenant) = (row.id.clone(), row.tier, row.tenant.clone());
            let why = match self.revive_one(row).await {
                Ok(()) => continue,
                Err(why) => why,
            };
            tracing::warn!(sandbox = %id, "a sandbox paused to disk was not kept: {why}");
            let audit = self.sessions.audit.store.clone();
            let backend = self.pools.backend(tier);
            let _ = blocking(move || {
                if let Some(b) = backend {
                    b.recover(std::slice::from_ref(&id));
                }
                let _ = audit.sandbox_ended(&id, "destroyed", "resume-failed");
                audit.record(&NewEvent {
                    tenant: Some(&tenant),
                    sandbox: Some(&id),
                    tier: Some(tier),
                    event: AuditEvent::ResumeFailed {
                        error: why.to_string(),
                    },
                })
            })
            .await;
        }
    }

    async fn revive_one(&self, row: PausedRow) -> Result<(), ReviveError> {
        let tenant = Tenant(row.tenant.clone());
        let backend = self.pools.backend(row.tier).ok_or(ReviveError::NoBackend)?;
        let id = row.id.clone();
        let revived = blocking(move || backend.revive(&id))
            .await
            .map_err(ReviveError::Worker)?;
        let sb = match revived {
            Some(Ok(sb)) => sb,
            Some(Err(e)) => return Err(ReviveError::Tier(e)),
            None => return Err(ReviveError::NoState),
        };
        let held = Held::new(sb);
        // Its place under the limits (not the disk guard's: it is not new, and its disk is
        // already spent). Limits lowered since it was paused can leave no room for it.
        let admit = &self.sessions.admit;
        let rules = admit.rules(&tenant);
        let slot = admit
            .ledger
            .reserve(
                &row.tenant,
                row.spec.limits.memory_bytes,
                (rules.max_sandboxes, rules.max_memory),
            )
            .map_err(|e| ReviveError::OverBudget(e.message))?;
        let ms = |v: i64| Duration::from_millis(v.max(0) as u64);
        let now = now_ms();
        let ago = |t: i64| {
            Instant::now()
                .checked_sub(ms(now - t))
                .unwrap_or_else(Instant::now)
        };
        let mut s = Session::new(
            &tenant,
            row.spec.clone(),
            Acquired {
                sandbox: held,
                source: if row.source == "pool" { "pool" } else { "cold" },
                start_us: row.start_us,
            },
            slot,
            (ms(row.ttl_ms), ms(row.idle_ms)),
            false,
        );
        s.created_ms = row.created_ms;
        s.created = ago(row.created_ms);
        *lock(&s.labels) = row.labels;
        s.last_used.store(row.last_used_ms, Ordering::Relaxed);
        s.paused_ms.store(row.paused_ms, Ordering::Relaxed);
        *lock(&s.paused_at) = Some(ago(row.paused_since_ms));
        *lock(&s.on_disk) = Some(row.on_disk_bytes);
        self.sessions.insert(s);
        Ok(())
    }
}
