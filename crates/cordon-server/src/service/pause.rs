//! Pausing, resuming and changing a live sandbox: its paused-state budget, its TTL clock
//! and its audit rows.

use std::collections::HashMap;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::os::unix::fs::DirBuilderExt;

use cordon_core::{Feature, SnapshotDir, SnapshotMode};

use super::common::{audit_err, blocking, gone, lock};
use super::pools::Held;
use super::sessions::{BusyGuard, FilesPaused, PauseMode, Session, Sessions, remove_files};
use crate::audit::{AuditEvent, Lifecycle, NewEvent, now_ms};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::SandboxInfo;

/// A pause to disk's hold on its tenant's paused-state budget while it saves.
struct PausePending {
    pending: Arc<Mutex<HashMap<String, (String, u64)>>>,
    id: String,
}

impl Drop for PausePending {
    fn drop(&mut self) {
        lock(&self.pending).remove(&self.id);
    }
}

impl Sessions {
    /// Pauses a sandbox: its processes stop where they are (no CPU), its TTL clock stands
    /// still against `sessions.paused_ttl`, execs and file calls are refused until resumed.
    /// It keeps its place under the tenant's limits. `to_disk` (microvm) saves all of it to
    /// disk and lets go of its memory; its session is kept in the store, so it outlives a
    /// server restart.
    pub async fn pause(
        &self,
        tenant: &Tenant,
        id: &str,
        mode: PauseMode,
    ) -> Result<SandboxInfo, ApiError> {
        if mode == PauseMode::Files {
            return self.pause_files(tenant, id).await;
        }
        let to_disk = mode == PauseMode::ToDisk;
        let guard = self.claim(tenant, id)?;
        let s = guard.0.clone();
        let _pending = if to_disk {
            let limits = &s.spec.limits;
            Some(self.paused_room(
                tenant,
                &s,
                limits.memory_bytes.saturating_add(limits.disk_bytes),
            )?)
        } else {
            None
        };
        let t0 = Instant::now();
        let audit = self.audit.store.clone();
        let r = blocking(move || {
            let s = guard.0.clone();
            let _busy = guard;
            let mut cell = lock(&s.sandbox);
            let sb = cell.as_mut().ok_or_else(|| gone(&s.id))?;
            if !to_disk {
                sb.pause().map_err(ApiError::from)?;
                *lock(&s.paused_at) = Some(Instant::now());
                return Ok(None);
            }
            let bytes = sb.pause_to_disk().map_err(ApiError::from)?;
            *lock(&s.paused_at) = Some(Instant::now());
            *lock(&s.on_disk) = Some(bytes);
            // Kept for the next start, with its `pause` row, before it is reported paused.
            let row = s.paused_row(bytes);
            let event = AuditEvent::PausedToDisk {
                us: t0.elapsed().as_micros() as u64,
                on_disk_bytes: bytes,
            };
            let kept = audit.paused_put(
                &row,
                &NewEvent {
                    tenant: Some(&row.tenant),
                    sandbox: Some(&row.id),
                    tier: Some(row.tier),
                    event,
                },
            );
            if let Err(e) = kept {
                // Not kept: it must not stay paused where a restart would lose it.
                let resumed = sb.resume();
                *lock(&s.paused_at) = None;
                *lock(&s.on_disk) = None;
                tracing::error!(sandbox = %s.id, ?resumed, "keeping a paused session: {e}");
                return Err(audit_err(e));
            }
            Ok(Some(bytes))
        })
        .await?;
        let us = t0.elapsed().as_micros() as u64;
        match &r {
            // Its row went in with the session.
            Ok(Some(_)) => {}
            Ok(None) => {
                self.audit_lifecycle(&s, Lifecycle::Pause, &Ok(()), us)
                    .await?
            }
            Err(e) => {
                self.audit_lifecycle(&s, Lifecycle::Pause, &Err(e.clone()), us)
                    .await?
            }
        }
        r?;
        Ok(s.info())
    }

    /// [`PauseMode::Files`]: a filesystem snapshot of the sandbox into its own directory,
    /// then its tier's sandbox destroyed. The snapshot counts against the tenant's
    /// `max_paused_bytes` (at the sandbox's disk limit while it is taken, then at what it
    /// took).
    async fn pause_files(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ApiError> {
        let guard = self.claim(tenant, id)?;
        let s = guard.0.clone();
        for f in [Feature::Pause, Feature::SnapshotFiles] {
            if !s.tier.features().has(f) {
                return Err(ApiError::from(
                    f.unsupported(s.tier, "pausing a sandbox to its files"),
                ));
            }
        }
        let _pending = self.paused_room(tenant, &s, s.spec.limits.disk_bytes)?;
        let dir = SnapshotDir::new(
            super::common::snapshots_dir(&self.admit.data_dir).join(format!("paused-{}", s.id)),
        );
        let t0 = Instant::now();
        let r = blocking(move || {
            let s = guard.0.clone();
            let _busy = guard;
            // What an earlier pause's removal could not remove goes first.
            remove_files(dir.path());
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir.path())
                .map_err(|e| ApiError::internal_from("making a paused sandbox's directory", e))?;
            let mut cell = lock(&s.sandbox);
            let Some(sb) = cell.as_mut() else {
                remove_files(dir.path());
                return Err(gone(&s.id));
            };
            // Copied as the tier's filesystem snapshot is, its processes running (the
            // container tier's agent copies, and cannot while frozen): a file being written
            // at that moment may be kept partway, as after a machine's power cut.
            let image = match sb.snapshot(SnapshotMode::Filesystem, &dir) {
                Ok(i) => i,
                Err(e) => {
                    remove_files(dir.path());
                    return Err(ApiError::from(e));
                }
            };
            // Its files are kept: the sandbox itself goes. Its interrupter goes first: a
            // destroy under way must never signal the pid of a process already reaped.
            drop(lock(&s.interrupt).take());
            if let Some(mut old) = cell.take()
                && let Err(e) = old.destroy()
            {
                tracing::warn!(sandbox = %s.id, "pausing to files: destroying the sandbox: {e}");
            }
            *lock(&s.files) = Some(FilesPaused { image, dir });
            *lock(&s.paused_at) = Some(Instant::now());
            s.reset_state();
            Ok(())
        })
        .await
        .and_then(|r| r);
        let us = t0.elapsed().as_micros() as u64;
        self.audit_lifecycle(&s, Lifecycle::Pause, &r, us).await?;
        r?;
        Ok(s.info())
    }

    /// Before a pause to disk or to files: its state (`want`: the most it can take, its
    /// memory and disk limits to disk, its disk limit to files) must fit under the tenant's
    /// `max_paused_bytes` beside what its other sandboxes paused so hold, and the data dir's
    /// file system must keep `audit.min_free_disk` free after writing it. A sandbox already
    /// on disk takes no more. The room is held (against concurrent pauses of the tenant)
    /// until the guard drops.
    fn paused_room(
        &self,
        tenant: &Tenant,
        s: &Session,
        want: u64,
    ) -> Result<PausePending, ApiError> {
        let pending = PausePending {
            pending: self.paused_pending.clone(),
            id: s.id.clone(),
        };
        if s.held_on_disk().is_some() {
            return Ok(pending);
        }
        let mut reserved = lock(&self.paused_pending);
        let on_disk: u64 = lock(&self.map)
            .values()
            .filter(|o| o.tenant == *tenant && o.id != s.id)
            .filter_map(|o| o.held_on_disk())
            .sum();
        let held = reserved
            .iter()
            .filter(|(id, (t, _))| *t == tenant.0 && **id != s.id)
            .map(|(_, (_, b))| *b)
            .fold(on_disk, u64::saturating_add);
        let budget = self.admit.rules(tenant).max_paused_bytes;
        if held.saturating_add(want) > budget {
            self.metrics.deny("paused_quota");
            return Err(ApiError::new(
                Code::PausedQuota,
                format!(
                    "pausing this sandbox to disk could take {} MiB (its memory and disk \
                     limits), and this tenant's sandboxes paused to disk already hold {} MiB \
                     of its {} MiB",
                    want >> 20,
                    held >> 20,
                    budget >> 20
                ),
                "pause it in memory (no to_disk), or resume or destroy a sandbox paused to \
                 disk first; the operator sets max_paused_bytes",
            ));
        }
        let need = want.saturating_add(self.admit.min_free_disk);
        if let Some(free) = self.admit.data_dir_free()
            && free < need
        {
            tracing::error!(free, need, "no room to pause a sandbox to disk");
            return Err(self.admit.storage_low(
                "the server has no room on disk to keep this sandbox's state",
                "pause it in memory (no to_disk), or retry later",
            ));
        }
        reserved.insert(s.id.clone(), (tenant.0.clone(), want));
        Ok(pending)
    }

    /// Resumes a paused sandbox; its processes continue where they stopped.
    pub async fn resume(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ApiError> {
        self.stopping()?;
        let s = self.session(tenant, id)?;
        if !s.is_paused() {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "the sandbox is not paused",
                "pause it first (POST /v1/sandboxes/{id}/pause)",
            ));
        }
        if s.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(ApiError::new(
                Code::SandboxBusy,
                "the sandbox is being paused or resumed by another request",
                "wait for it to finish",
            ));
        }
        let guard = BusyGuard(s.clone());
        // As a claim does: either this sees a destroy's mark, or the destroy sees the flag.
        fence(Ordering::SeqCst);
        if s.ending.get().is_some() {
            return Err(gone(&s.id));
        }
        let t0 = Instant::now();
        // Paused to its files: started again from them, on a blocking worker that holds the
        // busy flag to the end (a request cancelled meanwhile cannot leave it half done).
        let restart = if lock(&s.files).is_some() {
            Some(self.pools.serving(s.tier)?)
        } else {
            None
        };
        let audit = self.audit.store.clone();
        let r = blocking(move || {
            let s = guard.0.clone();
            let _busy = guard;
            if let Some(backend) = &restart {
                restart_from_files(&s, backend.as_ref()).map_err(|e| (e, false))?;
            }
            let mut cell = lock(&s.sandbox);
            let sb = cell.as_mut().ok_or_else(|| (gone(&s.id), false))?;
            let from_disk = lock(&s.on_disk).is_some();
            if restart.is_some() {
                // A fresh sandbox: nothing of it is paused.
            } else if let Err(e) = sb.resume() {
                // A resume from disk that failed (a state refused, a VM that did not come
                // back) lost the sandbox: it is destroyed below.
                return Err((ApiError::from(e), from_disk));
            }
            if from_disk {
                *lock(&s.on_disk) = None;
                if let Err(e) = audit.paused_remove(&s.id) {
                    tracing::warn!(sandbox = %s.id, "forgetting a resumed session: {e}");
                }
            }
            if let Some(at) = lock(&s.paused_at).take() {
                s.paused_ms
                    .fetch_add(at.elapsed().as_millis() as i64, Ordering::Relaxed);
            }
            // Its TTL again and its idle clock from now, before the busy hold goes: the
            // reaper must never see it live with the TTL that paused it (it paused it
            // again while the resume's audit row was written, and the resume then answered
            // "live" for a sandbox paused behind it).
            if let Some(span) = s.timeout.resumed() {
                let age = s.created.elapsed().as_millis() as i64 - s.paused_total_ms();
                s.ttl_ms.store(age.saturating_add(span), Ordering::Relaxed);
            }
            s.touch();
            Ok::<(), (ApiError, bool)>(())
        })
        .await?;
        let us = t0.elapsed().as_micros() as u64;
        let (r, lost) = match r {
            Ok(()) => (Ok(()), false),
            Err((e, lost)) => (Err(e), lost),
        };
        self.audit_lifecycle(&s, Lifecycle::Resume, &r, us).await?;
        if lost && s.begin_ending("resume-failed") {
            self.destroy_session(s.clone(), "resume-failed").await?;
        }
        r?;
        Ok(s.info())
    }

    async fn audit_lifecycle(
        &self,
        s: &Arc<Session>,
        action: Lifecycle,
        r: &Result<(), ApiError>,
        us: u64,
    ) -> Result<(), ApiError> {
        let audit = self.audit.store.clone();
        let (t, i, tier) = (s.tenant.0.clone(), s.id.clone(), s.tier);
        let event = AuditEvent::Lifecycle {
            action,
            us,
            error: r.as_ref().err().map(ApiError::failure),
        };
        blocking(move || {
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                tier: Some(tier),
                event,
            })
        })
        .await?
        .map(|_| ())
        .map_err(audit_err)
    }

    /// Changes a sandbox's TTL (from its creation, paused time not counted) or idle
    /// timeout, within the server's maxima.
    pub async fn patch(
        &self,
        tenant: &Tenant,
        id: &str,
        req: crate::model::PatchRequest,
    ) -> Result<SandboxInfo, ApiError> {
        let s = self.session(tenant, id)?;
        if s.ending.get().is_some() {
            return Err(gone(&s.id));
        }
        let max_ttl = self.max_ttl;
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        if let Some(ttl) = req.ttl {
            if ttl.0.is_zero() || ttl.0 > max_ttl {
                return Err(ApiError::new(
                    Code::PolicyDenied,
                    format!("the TTL must be between 1 ms and {} s", max_ttl.as_secs()),
                    "give a shorter ttl (the server's sessions.max_ttl bounds it)",
                ));
            }
            let age = s.created.elapsed().as_millis() as i64 - s.paused_total_ms();
            if ms(ttl.0) <= age {
                return Err(ApiError::invalid(format!(
                    "the sandbox is {} s old already; give a TTL longer than its age",
                    age / 1000
                )));
            }
        }
        if let Some(idle) = req.idle_timeout
            && (idle.0.is_zero() || idle.0 > max_ttl)
        {
            return Err(ApiError::new(
                Code::PolicyDenied,
                format!(
                    "the idle timeout must be between 1 ms and {} s",
                    max_ttl.as_secs()
                ),
                "give a shorter idle_timeout (the server's sessions.max_ttl bounds it)",
            ));
        }
        if let Some(ttl) = req.ttl {
            s.ttl_ms.store(ms(ttl.0), Ordering::Relaxed);
        }
        if let Some(idle) = req.idle_timeout {
            s.idle_ms.store(ms(idle.0), Ordering::Relaxed);
        }
        let audit = self.audit.store.clone();
        let (t, i, tier) = (s.tenant.0.clone(), s.id.clone(), s.tier);
        let event = AuditEvent::Patch {
            ttl_ms: req.ttl.map(|d| ms(d.0)),
            idle_timeout_ms: req.idle_timeout.map(|d| ms(d.0)),
        };
        // A session paused to disk keeps its new clocks for the next start too.
        let on_disk = *lock(&s.on_disk);
        let kept = on_disk.map(|bytes| {
            let mut row = s.paused_row(bytes);
            if let Some(at) = *lock(&s.paused_at) {
                row.paused_since_ms = now_ms() - at.elapsed().as_millis() as i64;
            }
            row
        });
        blocking(move || {
            let event = NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                tier: Some(tier),
                event,
            };
            match &kept {
                Some(row) => audit.paused_put(row, &event).map(|()| 0),
                None => audit.record(&event),
            }
        })
        .await?
        .map_err(audit_err)?;
        Ok(s.info())
    }
}

/// A resume of a sandbox paused to its files (on a blocking worker, the session claimed):
/// its tier starts it again from them under its id, with the spec it was admitted with (its
/// limits, egress, grants and template). A destroy begun meanwhile gets the new sandbox
/// destroyed here; a start that fails keeps the files and leaves it paused, and the tenant
/// is told no more than that (the tier's reason, which may name host paths, is logged).
fn restart_from_files(s: &Session, backend: &dyn cordon_core::Backend) -> Result<(), ApiError> {
    let (image, dir) = match lock(&s.files).as_ref() {
        Some(f) => (f.image.clone(), f.dir.clone()),
        None => return Err(gone(&s.id)),
    };
    let Some(id) = cordon_core::SandboxId::parse(&s.id) else {
        return Err(ApiError::internal(
            "a paused sandbox's id is not a sandbox id",
        ));
    };
    let mut spec = s.spec.clone();
    spec.id = Some(id.clone());
    let mut new = backend
        .start_from_snapshot(&image, &dir, &spec)
        .map_err(|e| {
            tracing::warn!(sandbox = %s.id, "starting a sandbox again from its files: {e}");
            ApiError::new(
                Code::SandboxFailure,
                "the sandbox could not be started again from its files",
                "retry the resume (its files are kept until it is destroyed)",
            )
        })?;
    let mut cell = lock(&s.sandbox);
    if new.id() != &id || s.ending.get().is_some() {
        drop(cell);
        if let Err(e) = new.destroy() {
            tracing::warn!(sandbox = %s.id, "destroying a sandbox started for an ending one: {e}");
        }
        return Err(gone(&s.id));
    }
    *lock(&s.interrupt) = new.interrupter();
    *cell = Held::new(new);
    s.restarts.fetch_add(1, Ordering::AcqRel);
    // Started: its files go.
    drop(lock(&s.files).take());
    Ok(())
}
