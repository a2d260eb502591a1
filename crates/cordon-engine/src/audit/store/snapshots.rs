//! Snapshots' rows (issue 46): one per snapshot a tenant keeps, next to its image in the
//! server's data dir. The row goes in only once the image is written, so a server killed
//! while taking one leaves an image directory and no row, which the next start removes.

use cordon_core::{SandboxSpec, SnapshotImage, SnapshotMode, Tier};
use rusqlite::{OptionalExtension, params};

use super::{Audit, NewEvent, StoreError, insert_event, lock};

/// A snapshot as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    /// `snap-` and 128 random bits in hex.
    pub id: String,
    pub tenant: String,
    /// Its tenant's name for it, unique among the tenant's snapshots.
    pub name: Option<String>,
    pub image: SnapshotImage,
    /// The sandbox it was taken of.
    pub source: String,
    /// The source's spec (its limits, environment, egress and template), what every sandbox
    /// started from it asks the gate for again.
    pub spec: SandboxSpec,
    /// The source's grants, by catalogue name (a spec's grants are never serialized).
    pub grants: Vec<String>,
    pub created_ms: i64,
    /// What the server keeps of the sandbox's own state beside the image (its code contexts
    /// and background execs, for a full snapshot), as the server encoded it; empty if none.
    pub carried: String,
}

/// Why a snapshot could not be recorded.
#[derive(Debug)]
pub enum SnapshotRefusal {
    /// The tenant has a snapshot of that name.
    Exists,
    /// The tenant's snapshots would pass `max_bytes`: the bytes they hold now.
    Ceiling {
        bytes: u64,
    },
    Store(StoreError),
}

impl From<rusqlite::Error> for SnapshotRefusal {
    fn from(e: rusqlite::Error) -> Self {
        SnapshotRefusal::Store(StoreError::Sqlite(e))
    }
}

fn json<T: serde::Serialize>(v: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Config(format!("encoding {what}: {e}")))
}

impl Audit {
    /// Records a snapshot and its audit row, if the tenant's snapshots stay within
    /// `max_bytes` with it and its name is free; checked and written in one transaction.
    pub fn snapshot_add(
        &self,
        row: &SnapshotRow,
        max_bytes: u64,
        event: &NewEvent<'_>,
    ) -> Result<(), SnapshotRefusal> {
        let spec = json(&row.spec, "a sandbox spec").map_err(SnapshotRefusal::Store)?;
        let grants = json(&row.grants, "grants").map_err(SnapshotRefusal::Store)?;
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        if let Some(name) = &row.name {
            let taken: Option<i64> = tx
                .query_row(
                    "SELECT 1 FROM snapshots WHERE tenant = ?1 AND name = ?2",
                    params![row.tenant, name],
                    |r| r.get(0),
                )
                .optional()?;
            if taken.is_some() {
                return Err(SnapshotRefusal::Exists);
            }
        }
        let held: i64 = tx.query_row(
            "SELECT COALESCE(SUM(bytes), 0) FROM snapshots WHERE tenant = ?1",
            params![row.tenant],
            |r| r.get(0),
        )?;
        let held = held.max(0) as u64;
        if held.saturating_add(row.image.bytes) > max_bytes {
            return Err(SnapshotRefusal::Ceiling { bytes: held });
        }
        tx.execute(
            "INSERT INTO snapshots (id, tenant, name, tier, mode, bytes, format, source, spec,
               grants, created_ms, carried)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                row.id,
                row.tenant,
                row.name,
                row.image.tier.as_str(),
                row.image.mode.as_str(),
                row.image.bytes as i64,
                row.image.format,
                row.source,
                spec,
                grants,
                row.created_ms,
                row.carried,
            ],
        )?;
        insert_event(&tx, event).map_err(SnapshotRefusal::Store)?;
        tx.commit()?;
        Ok(())
    }

    /// `tenant`'s snapshots, oldest first (`None`: every tenant's, for the start's sweep).
    /// Rows that do not decode are left out (and logged).
    pub fn snapshots(&self, tenant: Option<&str>) -> Result<Vec<SnapshotRow>, StoreError> {
        let c = lock(&self.conn);
        let mut st = c.prepare_cached(
            "SELECT id, tenant, name, tier, mode, bytes, format, source, spec, grants, created_ms,
               carried
             FROM snapshots WHERE (?1 IS NULL OR tenant = ?1) ORDER BY created_ms, id",
        )?;
        let rows = st
            .query_map(params![tenant], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    (r.get::<_, String>(3)?, r.get::<_, String>(4)?),
                    (r.get::<_, i64>(5)?, r.get::<_, i64>(6)?),
                    r.get::<_, String>(7)?,
                    (r.get::<_, String>(8)?, r.get::<_, String>(9)?),
                    (r.get::<_, i64>(10)?, r.get::<_, String>(11)?),
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::with_capacity(rows.len());
        for (
            id,
            tenant,
            name,
            (tier, mode),
            (bytes, format),
            source,
            (spec, grants),
            (created_ms, carried),
        ) in rows
        {
            let decoded = (|| {
                Some(SnapshotRow {
                    image: SnapshotImage {
                        tier: tier.parse::<Tier>().ok()?,
                        mode: mode.parse::<SnapshotMode>().ok()?,
                        bytes: bytes.max(0) as u64,
                        format: u32::try_from(format).ok()?,
                    },
                    spec: serde_json::from_str(&spec).ok()?,
                    grants: serde_json::from_str(&grants).ok()?,
                    id: id.clone(),
                    tenant,
                    name,
                    source,
                    created_ms,
                    carried,
                })
            })();
            match decoded {
                Some(row) => out.push(row),
                None => tracing::warn!(snapshot = %id, "a snapshot row that does not decode"),
            }
        }
        Ok(out)
    }

    /// Forgets `tenant`'s snapshot `id` and writes `event`; false if it had none of that id.
    pub fn snapshot_remove(
        &self,
        tenant: &str,
        id: &str,
        event: &NewEvent<'_>,
    ) -> Result<bool, StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        let gone = tx.execute(
            "DELETE FROM snapshots WHERE tenant = ?1 AND id = ?2",
            params![tenant, id],
        )?;
        if gone > 0 {
            insert_event(&tx, event)?;
        }
        tx.commit()?;
        Ok(gone > 0)
    }
}
