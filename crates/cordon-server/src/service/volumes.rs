//! Volumes: create, list, delete, and the leases a sandbox's create takes (ADR 0011).
//!
//! The `volumes` table says which volumes a tenant has (the API's only way to a volume:
//! another tenant's name is never found), `volume_mounts` which sandboxes mount them now;
//! the host's lock on each image (`cordon_host::volume`) is what makes a read-write mount
//! exclusive, whoever else holds it.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cordon_core::SandboxSpec;
use cordon_host::volume::{VolumeLease, VolumeStore};

use super::admit::Admit;
use super::common::{NewEventOwned, audit_err, blocking};
use crate::ServerError;
use crate::audit::{Audit, AuditEvent, VolumeOutcome, VolumeRefusal, VolumeRow};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{VolumeCreate, VolumeInfo, VolumeList, VolumeMountInfo};

/// Tenants' volumes: the store on the host and their rows in the audit store. Uses the
/// admission (the disk guard, the tenant's ceiling); the sessions use it for their leases.
#[derive(Clone)]
pub struct Volumes {
    store: VolumeStore,
    admit: Admit,
    audit: Arc<Audit>,
}

/// The volume store under a data dir.
pub(super) fn open_store(data_dir: &Path) -> Result<VolumeStore, ServerError> {
    VolumeStore::open(&data_dir.join("volumes"))
        .map_err(|e| ServerError::start("the volume store under the data dir", e))
}

/// Crash recovery: what a dead server left mounted is unmounted (its sandboxes are gone,
/// and with them its locks), its mount rows forgotten, and a volume whose file a create
/// never finished is forgotten too.
pub(super) fn recover(data_dir: &Path, audit: &Audit) -> Result<Vec<String>, ServerError> {
    let store = open_store(data_dir)?;
    let mut done = store.sweep();
    let stale = audit.volumes_unmounted(None)?;
    if stale > 0 {
        done.push(format!("{stale} stale volume mount rows"));
    }
    for (tenant, name) in audit.all_volumes()? {
        if matches!(
            store.facts(&tenant, &name),
            Err(cordon_host::volume::VolumeError::NotFound(_))
        ) {
            audit.volume_remove(&tenant, &name)?;
            done.push(format!(
                "volume {name:?} of {tenant:?}: its create never finished"
            ));
        }
    }
    Ok(done)
}

fn info(row: VolumeRow, used: u64) -> VolumeInfo {
    VolumeInfo {
        name: row.name,
        size: row.size,
        used,
        created_ms: row.created_ms,
        mounts: row
            .mounts
            .into_iter()
            .map(|m| VolumeMountInfo {
                sandbox: m.sandbox,
                read_only: m.read_only,
                since_ms: m.since_ms,
            })
            .collect(),
    }
}

impl Volumes {
    pub(super) fn new(store: VolumeStore, admit: Admit, audit: Arc<Audit>) -> Self {
        Volumes {
            store,
            admit,
            audit,
        }
    }

    async fn volume_rows(
        &self,
        tenant: &Tenant,
        name: Option<&str>,
    ) -> Result<Vec<VolumeInfo>, ApiError> {
        let audit = self.audit.clone();
        let store = self.store.clone();
        let (t, n) = (tenant.0.clone(), name.map(str::to_string));
        blocking(move || -> Result<Vec<VolumeInfo>, ServerError> {
            let rows = audit.volumes(&t, n.as_deref())?;
            Ok(rows
                .into_iter()
                .map(|r| {
                    let used = store.facts(&t, &r.name).map_or(0, |f| f.allocated);
                    info(r, used)
                })
                .collect())
        })
        .await?
        .map_err(audit_err)
    }

    /// Creates a volume of `tenant`, within its ceiling (`max_volumes`, `max_volume_bytes`).
    pub async fn create(&self, tenant: &Tenant, req: VolumeCreate) -> Result<VolumeInfo, ApiError> {
        self.admit.life.stopping()?;
        cordon_core::validate_volume_name(&req.name).map_err(ApiError::from)?;
        let size = req.size.0 & !4095;
        if size < cordon_core::MIN_VOLUME_BYTES {
            return Err(ApiError::invalid(format!(
                "a volume holds at least {} MiB; give a larger size",
                cordon_core::MIN_VOLUME_BYTES >> 20
            )));
        }
        self.admit.disk_guard()?;
        let rules = self.admit.rules(tenant);
        let audit = self.audit.clone();
        let (t, n) = (tenant.0.clone(), req.name.clone());
        let added = blocking(move || {
            audit.volume_add(&t, &n, size, (rules.max_volumes, rules.max_volume_bytes))
        })
        .await?;
        match added {
            Ok(()) => {}
            Err(VolumeRefusal::Exists) => {
                return Err(cordon_host::volume::VolumeError::Exists(req.name).into());
            }
            Err(VolumeRefusal::Ceiling { count, bytes }) => {
                self.admit.metrics.deny("volume_quota");
                let e = ApiError::new(
                    Code::VolumeQuota,
                    format!(
                        "a volume of {size} bytes would pass your volume ceiling: you have \
                         {count} of at most {} volumes, {bytes} of at most {} bytes",
                        rules.max_volumes, rules.max_volume_bytes
                    ),
                    "delete volumes you no longer need (DELETE /v1/volumes/{name}), or ask \
                     for a smaller one",
                );
                self.record_volume(
                    tenant,
                    AuditEvent::VolumeCreate {
                        name: req.name.clone(),
                        size,
                        outcome: VolumeOutcome::Denied(e.failure()),
                    },
                )
                .await?;
                return Err(e);
            }
            Err(VolumeRefusal::Store(e)) => return Err(audit_err(e)),
        }
        let store = self.store.clone();
        let audit = self.audit.clone();
        let (t, n) = (tenant.0.clone(), req.name.clone());
        let t0 = Instant::now();
        let made = blocking(move || {
            let made = store.create(&t, &n, size);
            if made.is_err() {
                // Nothing was made: the name and its bytes are free again.
                let _ = audit.volume_remove(&t, &n);
            }
            made
        })
        .await?;
        let us = t0.elapsed().as_micros() as u64;
        let facts = match made {
            Ok(f) => f,
            Err(e) => {
                let e = ApiError::from(e);
                self.record_volume(
                    tenant,
                    AuditEvent::VolumeCreate {
                        name: req.name.clone(),
                        size,
                        outcome: VolumeOutcome::Failed(e.failure()),
                    },
                )
                .await?;
                return Err(e);
            }
        };
        self.record_volume(
            tenant,
            AuditEvent::VolumeCreate {
                name: req.name.clone(),
                size,
                outcome: VolumeOutcome::Done {
                    us: Some(us),
                    size: None,
                },
            },
        )
        .await?;
        self.get(tenant, &facts.name).await
    }

    async fn record_volume(&self, tenant: &Tenant, event: AuditEvent) -> Result<(), ApiError> {
        self.admit
            .audit
            .record(NewEventOwned {
                tenant: Some(tenant.0.clone()),
                sandbox: None,
                tier: None,
                event,
            })
            .await
            .map(|_| ())
    }

    /// `tenant`'s volumes and its ceiling.
    pub async fn list(&self, tenant: &Tenant) -> Result<VolumeList, ApiError> {
        let volumes = self.volume_rows(tenant, None).await?;
        let rules = self.admit.rules(tenant);
        Ok(VolumeList {
            used_bytes: volumes.iter().map(|v| v.size).sum(),
            allocated_bytes: volumes.iter().map(|v| v.used).sum(),
            quota_bytes: rules.max_volume_bytes,
            max_volumes: rules.max_volumes,
            volumes,
        })
    }

    /// One volume of `tenant` (another tenant's is not found).
    pub async fn get(&self, tenant: &Tenant, name: &str) -> Result<VolumeInfo, ApiError> {
        cordon_core::validate_volume_name(name).map_err(|_| not_found(name))?;
        self.volume_rows(tenant, Some(name))
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| not_found(name))
    }

    /// Deletes a volume no sandbox mounts (refused while one does).
    pub async fn delete(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<crate::model::VolumeDeleted, ApiError> {
        self.admit.life.stopping()?;
        let v = self.get(tenant, name).await?;
        let store = self.store.clone();
        let audit = self.audit.clone();
        let (t, n) = (tenant.0.clone(), name.to_string());
        let deleted = blocking(move || -> Result<(), ApiError> {
            match store.delete(&t, &n) {
                // A file a crash left half made (or never made) goes with its row.
                Ok(()) | Err(cordon_host::volume::VolumeError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            audit.volume_remove(&t, &n).map_err(audit_err)
        })
        .await?;
        let outcome = match &deleted {
            Ok(()) => VolumeOutcome::Done {
                us: None,
                size: Some(v.size),
            },
            Err(e) => VolumeOutcome::Failed(e.failure()),
        };
        let event = AuditEvent::VolumeDelete {
            name: name.to_string(),
            outcome,
        };
        self.record_volume(tenant, event).await?;
        deleted?;
        Ok(crate::model::VolumeDeleted {
            name: name.to_string(),
            deleted: true,
        })
    }

    /// Leases the volumes a create asks for and fills in their host side; the leases are
    /// held by the session and let go once its sandbox is destroyed.
    pub(super) async fn lease(
        &self,
        tenant: &Tenant,
        spec: &mut SandboxSpec,
    ) -> Result<Leases, ApiError> {
        if spec.volumes.is_empty() {
            return Ok(Leases::default());
        }
        for m in &spec.volumes {
            self.get(tenant, &m.name).await?;
        }
        let store = self.store.clone();
        let wanted: Vec<(String, bool)> = spec
            .volumes
            .iter()
            .map(|m| (m.name.clone(), m.read_only))
            .collect();
        let t = tenant.0.clone();
        let leases = blocking(move || -> Result<Vec<VolumeLease>, ApiError> {
            // On an error the leases taken so far drop here, off the runtime.
            wanted
                .iter()
                .map(|(name, ro)| store.mount(&t, name, *ro).map_err(ApiError::from))
                .collect()
        })
        .await??;
        for (m, l) in spec.volumes.iter_mut().zip(&leases) {
            m.source = Some(cordon_core::VolumeSource {
                host_dir: l.host_dir().to_path_buf(),
                lease: None,
            });
        }
        Ok(Leases(leases))
    }
}

/// A sandbox's volume leases. Dropped anywhere (a failed or cancelled create, a session
/// never destroyed), they are let go off the async runtime: an unmount waits for the file
/// system, and the sandbox's own teardown, to be gone.
#[derive(Default)]
pub(super) struct Leases(pub(super) Vec<VolumeLease>);

impl Drop for Leases {
    fn drop(&mut self) {
        let leases = std::mem::take(&mut self.0);
        if leases.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || drop(leases));
            }
            Err(_) => drop(leases),
        }
    }
}

fn not_found(name: &str) -> ApiError {
    cordon_host::volume::VolumeError::NotFound(name.to_string()).into()
}
