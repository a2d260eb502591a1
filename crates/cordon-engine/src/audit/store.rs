//! The audit store: SQLite (WAL) with numbered schema migrations and retention.
//!
//! Every decision is one row in `events`, written before the response that reports it. The
//! `sandboxes` table tracks each sandbox's state so the next start after a crash knows
//! which ones a dead server left behind. Calls block: async callers use `spawn_blocking`.

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use cordon_core::Tier;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::event::AuditEvent;

pub(super) mod snapshots;

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: events and sandboxes.
    "CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time_ms INTEGER NOT NULL,
        tenant TEXT,
        sandbox TEXT,
        kind TEXT NOT NULL,
        decision TEXT,
        tier TEXT,
        detail TEXT NOT NULL
     );
     CREATE INDEX events_tenant_id ON events(tenant, id);
     CREATE INDEX events_sandbox ON events(sandbox);
     CREATE INDEX events_time ON events(time_ms);
     CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        tenant TEXT,
        tier TEXT NOT NULL,
        state TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        ended_ms INTEGER,
        end_reason TEXT
     );
     CREATE INDEX sandboxes_state ON sandboxes(state);",
    // 2: volumes and who mounts them (docs/service.md#volumes).
    "CREATE TABLE volumes (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_ms INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
     );
     CREATE TABLE volume_mounts (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        sandbox TEXT NOT NULL,
        read_only INTEGER NOT NULL,
        since_ms INTEGER NOT NULL,
        PRIMARY KEY (tenant, name, sandbox)
     );
     CREATE INDEX volume_mounts_sandbox ON volume_mounts(sandbox);",
    // 3: sandboxes paused to disk, kept across a restart (docs/service.md#pause-and-resume).
    "CREATE TABLE paused_sessions (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        tier TEXT NOT NULL,
        spec TEXT NOT NULL,
        labels TEXT NOT NULL,
        source TEXT NOT NULL,
        start_us INTEGER NOT NULL,
        created_ms INTEGER NOT NULL,
        ttl_ms INTEGER NOT NULL,
        idle_ms INTEGER NOT NULL,
        last_used_ms INTEGER NOT NULL,
        paused_ms INTEGER NOT NULL,
        paused_since_ms INTEGER NOT NULL,
        on_disk_bytes INTEGER NOT NULL
     );",
    // 4: an index for every filter of a query, each ending in the id the rows are ordered
    // by, so a query reads the rows it answers and no others however large the store
    // (before, a tenant's kind or sandbox filter walked every row after `after_id`).
    "CREATE INDEX events_tenant_kind_id ON events(tenant, kind, id);
     CREATE INDEX events_tenant_sandbox_id ON events(tenant, sandbox, id);
     CREATE INDEX events_kind_id ON events(kind, id);
     DROP INDEX events_sandbox;
     CREATE INDEX events_sandbox_id ON events(sandbox, id);",
    // 5: snapshots kept by tenants (docs/snapshots.md), their images in the data dir.
    "CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT,
        tier TEXT NOT NULL,
        mode TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        format INTEGER NOT NULL,
        source TEXT NOT NULL,
        spec TEXT NOT NULL,
        grants TEXT NOT NULL,
        created_ms INTEGER NOT NULL
     );
     CREATE UNIQUE INDEX snapshots_tenant_name ON snapshots(tenant, name);",
    // 6: what a full snapshot carries of the server's own state of its sandbox (its code
    // contexts and background execs), JSON the server reads back.
    "ALTER TABLE snapshots ADD COLUMN carried TEXT NOT NULL DEFAULT '';",
];

/// A kept session as decoded, or its id and why it did not decode.
pub type PausedDecoded = Result<PausedRow, (String, PausedRowError)>;

/// Why a kept session's row does not decode.
#[derive(Debug, thiserror::Error)]
pub enum PausedRowError {
    #[error("{0}")]
    Column(#[from] rusqlite::Error),
    #[error("unknown tier {0:?}")]
    Tier(String),
    #[error("its {what}: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// A session paused to disk, as the store keeps it for the next start: everything its
/// session holds but the sandbox, which the tier revives from its own files.
#[derive(Debug, Clone, PartialEq)]
pub struct PausedRow {
    pub id: String,
    pub tenant: String,
    pub tier: Tier,
    pub spec: cordon_core::SandboxSpec,
    pub labels: std::collections::BTreeMap<String, String>,
    pub source: String,
    pub start_us: u64,
    pub created_ms: i64,
    pub ttl_ms: i64,
    pub idle_ms: i64,
    /// Milliseconds of its (unpaused) age at its last request's end.
    pub last_used_ms: i64,
    /// Milliseconds it spent paused before this pause.
    pub paused_ms: i64,
    /// When this pause began (ms since the epoch).
    pub paused_since_ms: i64,
    pub on_disk_bytes: u64,
}

/// One volume as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeRow {
    pub name: String,
    pub size: u64,
    pub created_ms: i64,
    /// The sandboxes mounting it now.
    pub mounts: Vec<MountRow>,
}

/// One sandbox mounting a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountRow {
    pub sandbox: String,
    pub read_only: bool,
    pub since_ms: i64,
}

/// Why a volume could not be recorded.
#[derive(Debug)]
pub enum VolumeRefusal {
    Exists,
    /// The tenant's count or total would pass its ceiling: (count, bytes) it has now.
    Ceiling {
        count: usize,
        bytes: u64,
    },
    Store(StoreError),
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One audit row as stored and returned by the query API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Event {
    pub id: i64,
    pub time_ms: i64,
    pub tenant: Option<String>,
    pub sandbox: Option<String>,
    pub kind: String,
    pub decision: Option<String>,
    pub tier: Option<String>,
    pub detail: serde_json::Value,
}

/// A row to write: who, which sandbox and tier, and the event.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    pub tenant: Option<&'a str>,
    pub sandbox: Option<&'a str>,
    pub tier: Option<Tier>,
    pub event: AuditEvent,
}

impl<'a> NewEvent<'a> {
    /// A row of no tenant's, sandbox's or tier's (the server's own: start, stop, recovery).
    pub fn server(event: AuditEvent) -> Self {
        NewEvent {
            tenant: None,
            sandbox: None,
            tier: None,
            event,
        }
    }
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("audit store: {0}; check that the data dir is writable and not on a full disk")]
    Sqlite(#[from] rusqlite::Error),
    #[error("audit store: {0}")]
    Config(String),
    #[error("audit store: encoding a row: {0}")]
    Encode(#[from] serde_json::Error),
}

/// A query: rows of one tenant (or all, from the CLI), optionally of one sandbox or kind.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Query {
    #[serde(default)]
    pub sandbox: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    /// Only rows with an id above this (paging).
    #[serde(default)]
    pub after_id: Option<i64>,
    /// Only rows at or after this time (ms since the epoch).
    #[serde(default)]
    pub since_ms: Option<i64>,
    /// At most this many rows (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A sandbox the store believes is alive (or pooled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRow {
    pub id: String,
    pub tenant: Option<String>,
    pub tier: String,
    pub state: String,
}

/// Each tenant's egress rows a minute: what one tenant's flood may add to the store.
pub struct RowBudget {
    per_minute: u32,
    used: Mutex<std::collections::HashMap<String, (std::time::Instant, u32)>>,
}

impl RowBudget {
    pub fn new(per_minute: u32) -> Self {
        RowBudget {
            per_minute,
            used: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Takes up to `want` rows of `tenant`'s budget for this minute; returns how many it got.
    pub fn take(&self, tenant: &str, want: usize) -> usize {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        // Forget tenants whose minute is over, so the map stays as small as the active set.
        if used.len() > 1024 {
            used.retain(|_, (start, _)| now.duration_since(*start).as_secs() < 60);
        }
        let (start, n) = used.entry(tenant.to_string()).or_insert((now, 0));
        if now.duration_since(*start).as_secs() >= 60 {
            *start = now;
            *n = 0;
        }
        let left = self.per_minute.saturating_sub(*n) as usize;
        let got = want.min(left);
        *n = n.saturating_add(u32::try_from(got).unwrap_or(u32::MAX));
        got
    }
}

/// The store: one connection that writes, and read-only connections beside it for the
/// queries (WAL: a reader sees the last commit and never waits for the writer, nor the
/// writer for it), so however long a query takes, the rows of every running request are
/// written meanwhile.
pub struct Audit {
    conn: Mutex<Connection>,
    /// The store's file (none in memory: the queries then use the writing connection).
    path: Option<std::path::PathBuf>,
    /// Read-only connections not in use (at most [`IDLE_READERS`] are kept).
    readers: Mutex<Vec<Connection>>,
}

/// Idle read connections kept for the next queries.
const IDLE_READERS: usize = 4;
/// Rows one statement of a trim deletes at most: the writer's lock is let go between
/// them, so the rows of running requests are written while a large trim goes on.
const TRIM_CHUNK: i64 = 5_000;

fn lock(m: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn insert_event(c: &Connection, e: &NewEvent<'_>) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO events (time_ms, tenant, sandbox, kind, decision, tier, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        now_ms(),
        e.tenant,
        e.sandbox,
        e.event.kind(),
        e.event.decision(),
        e.tier.map(|t| t.as_str()),
        e.event.detail()?
    ])?;
    Ok(())
}

fn insert_sandbox(
    c: &Connection,
    id: &str,
    tenant: Option<&str>,
    tier: Tier,
    state: &str,
) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO sandboxes (id, tenant, tier, state, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(id) DO UPDATE SET tenant = excluded.tenant, state = excluded.state",
    )?
    .execute(params![id, tenant, tier.as_str(), state, now_ms()])?;
    Ok(())
}

impl Audit {
    /// Records a new volume of `tenant`, if its count and total size stay within
    /// `(max_count, max_bytes)` with it; checked and written under one lock and transaction.
    pub fn volume_add(
        &self,
        tenant: &str,
        name: &str,
        size: u64,
        (max_count, max_bytes): (usize, u64),
    ) -> Result<(), VolumeRefusal> {
        let store = |e: rusqlite::Error| VolumeRefusal::Store(StoreError::Sqlite(e));
        let mut c = lock(&self.conn);
        let tx = c.transaction().map_err(store)?;
        let exists: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM volumes WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get(0),
            )
            .optional()
            .map_err(store)?;
        if exists.is_some() {
            return Err(VolumeRefusal::Exists);
        }
        let (count, bytes): (i64, i64) = tx
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM volumes WHERE tenant = ?1",
                params![tenant],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(store)?;
        let (count, bytes) = (count as usize, bytes as u64);
        if count + 1 > max_count || bytes.saturating_add(size) > max_bytes {
            return Err(VolumeRefusal::Ceiling { count, bytes });
        }
        tx.execute(
            "INSERT INTO volumes (tenant, name, size, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![tenant, name, size as i64, now_ms()],
        )
        .map_err(store)?;
        tx.commit().map_err(store)
    }

    /// Forgets a volume (and any mount row of it).
    pub fn volume_remove(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        tx.execute(
            "DELETE FROM volume_mounts WHERE tenant = ?1 AND name = ?2",
            params![tenant, name],
        )?;
        tx.execute(
            "DELETE FROM volumes WHERE tenant = ?1 AND name = ?2",
            params![tenant, name],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// `tenant`'s volumes by name, with their mounts; `name` picks one.
    pub fn volumes(&self, tenant: &str, name: Option<&str>) -> Result<Vec<VolumeRow>, StoreError> {
        let c = lock(&self.conn);
        let mut st = c.prepare_cached(
            "SELECT name, size, created_ms FROM volumes
             WHERE tenant = ?1 AND (?2 IS NULL OR name = ?2) ORDER BY name",
        )?;
        let mut rows = st
            .query_map(params![tenant, name], |r| {
                Ok(VolumeRow {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    created_ms: r.get(2)?,
                    mounts: Vec::new(),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut st = c.prepare_cached(
            "SELECT sandbox, read_only, since_ms FROM volume_mounts
             WHERE tenant = ?1 AND name = ?2 ORDER BY since_ms, sandbox",
        )?;
        for v in &mut rows {
            v.mounts = st
                .query_map(params![tenant, v.name], |r| {
                    Ok(MountRow {
                        sandbox: r.get(0)?,
                        read_only: r.get::<_, i64>(1)? != 0,
                        since_ms: r.get(2)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
        }
        Ok(rows)
    }

    /// Every tenant's volumes as `(tenant, name)` (crash recovery compares them with the
    /// host's files).
    pub fn all_volumes(&self) -> Result<Vec<(String, String)>, StoreError> {
        let c = lock(&self.conn);
        let mut st = c.prepare("SELECT tenant, name FROM volumes")?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Records that `sandbox` mounts these volumes of `tenant`, with `events`, in one
    /// transaction.
    pub fn volumes_mounted(
        &self,
        tenant: &str,
        sandbox: &str,
        mounts: &[(String, bool)],
        events: &[NewEvent<'_>],
    ) -> Result<(), StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        for (name, ro) in mounts {
            tx.execute(
                "INSERT OR REPLACE INTO volume_mounts (tenant, name, sandbox, read_only, since_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![tenant, name, sandbox, *ro as i64, now_ms()],
            )?;
        }
        for e in events {
            insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets the mounts of `sandbox` (its destroy), or of every sandbox (a start: no
    /// sandbox of an earlier server lives on). Returns how many there were.
    pub fn volumes_unmounted(&self, sandbox: Option<&str>) -> Result<usize, StoreError> {
        Ok(lock(&self.conn).execute(
            "DELETE FROM volume_mounts WHERE ?1 IS NULL OR sandbox = ?1",
            params![sandbox],
        )?)
    }

    /// Opens (creating and migrating) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        let mut a = Self::setup(conn)?;
        a.path = Some(path.to_path_buf());
        Ok(a)
    }

    /// Opens the store read-only-ish for the CLI (still migrates a fresh file).
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::setup(Connection::open_in_memory()?)
    }

    /// Runs `f` on a read-only connection of its own (the writing one for a store in
    /// memory).
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(path) = &self.path else {
            return f(&lock(&self.conn));
        };
        let idle = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match idle {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                c.busy_timeout(std::time::Duration::from_secs(5))?;
                c
            }
        };
        let r = f(&conn);
        let mut idle = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_READERS {
            idle.push(conn);
        }
        r
    }

    fn setup(mut conn: Connection) -> Result<Self, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let version = usize::try_from(version).unwrap_or(0);
        if version > MIGRATIONS.len() {
            return Err(StoreError::Config(format!(
                "the audit store has schema version {version}, newer than this cordon ({}); use a newer cordon",
                MIGRATIONS.len()
            )));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(Audit {
            conn: Mutex::new(conn),
            path: None,
            readers: Mutex::new(Vec::new()),
        })
    }

    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(lock(&self.conn).pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    /// Writes one row and returns its id.
    pub fn record(&self, e: &NewEvent<'_>) -> Result<i64, StoreError> {
        let c = lock(&self.conn);
        insert_event(&c, e)?;
        Ok(c.last_insert_rowid())
    }

    /// Writes rows in one transaction (one commit for an exec and all it reports).
    pub fn record_all(&self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        for e in events {
            insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Bytes the store's live pages take (free pages a delete left are reused, so they do
    /// not count).
    pub fn used_bytes(&self) -> Result<u64, StoreError> {
        let c = lock(&self.conn);
        let pages: i64 = c.pragma_query_value(None, "page_count", |r| r.get(0))?;
        let free: i64 = c.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
        let size: i64 = c.pragma_query_value(None, "page_size", |r| r.get(0))?;
        Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(0))
    }

    /// Deletes events until the store's live pages fit in `max_bytes` (with a tenth to
    /// spare, so the next minute's rows do not trip it again); returns rows deleted. A
    /// bound of 0 keeps everything.
    ///
    /// Each tenant's rows are bounded by its own share, never by another's flood: the rows
    /// that fit are shared out fairly (a tenant with fewer rows than an equal share keeps
    /// them all, the rest is split evenly among the others; the server's own rows count as
    /// one more tenant), and only a tenant past its share loses rows, its oldest first.
    pub fn trim_to(&self, max_bytes: u64) -> Result<usize, StoreError> {
        if max_bytes == 0 {
            return Ok(0);
        }
        let target = max_bytes - max_bytes / 10;
        let mut deleted = 0;
        // Bounded: a store that cannot shrink below the bound by deleting events (a huge
        // sandboxes table) stops when a round deletes nothing.
        for _ in 0..20 {
            let used = self.used_bytes()?;
            if used <= target {
                break;
            }
            let counts: Vec<(Option<String>, i64)> = {
                let c = lock(&self.conn);
                let mut st = c.prepare("SELECT tenant, count(*) FROM events GROUP BY tenant")?;
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?
            };
            let rows: i64 = counts.iter().map(|(_, n)| n).sum();
            if rows == 0 {
                break;
            }
            // The rows that fit, at the store's mean row size.
            let fit = ((rows as f64) * (target as f64 / used as f64)).floor() as i64;
            let shares = fair_shares(&counts.iter().map(|(_, n)| *n).collect::<Vec<_>>(), fit);
            let mut round = 0;
            for ((tenant, n), share) in counts.iter().zip(shares) {
                let mut over = n - share;
                while over > 0 {
                    let chunk = over.min(TRIM_CHUNK);
                    let gone = lock(&self.conn).execute(
                        "DELETE FROM events WHERE id IN
                           (SELECT id FROM events WHERE tenant IS ?1 ORDER BY id LIMIT ?2)",
                        params![tenant, chunk],
                    )?;
                    if gone == 0 {
                        break;
                    }
                    over -= gone as i64;
                    round += gone;
                }
            }
            if round == 0 {
                break;
            }
            deleted += round;
        }
        Ok(deleted)
    }

    /// Records that a sandbox exists (state `live` or `pooled`).
    pub fn sandbox_started(
        &self,
        id: &str,
        tenant: Option<&str>,
        tier: Tier,
        state: &str,
    ) -> Result<(), StoreError> {
        insert_sandbox(&lock(&self.conn), id, tenant, tier, state)
    }

    /// Records that a sandbox is live for `tenant` and writes `events`, all in one
    /// transaction (one commit instead of one per row).
    pub fn sandbox_started_with(
        &self,
        id: &str,
        tenant: Option<&str>,
        tier: Tier,
        events: &[NewEvent<'_>],
    ) -> Result<(), StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        insert_sandbox(&tx, id, tenant, tier, "live")?;
        for e in events {
            insert_event(&tx, e)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records that a sandbox ended (destroyed, reaped, recovered after a crash); a
    /// session paused to disk is forgotten with it.
    pub fn sandbox_ended(&self, id: &str, state: &str, reason: &str) -> Result<(), StoreError> {
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        tx.execute(
            "UPDATE sandboxes SET state = ?2, ended_ms = ?3, end_reason = ?4 WHERE id = ?1",
            params![id, state, now_ms(), reason],
        )?;
        tx.execute("DELETE FROM paused_sessions WHERE id = ?1", params![id])?;
        tx.commit()?;
        Ok(())
    }

    /// Keeps a session paused to disk (and the `pause` row with it), replacing any earlier.
    pub fn paused_put(&self, row: &PausedRow, event: &NewEvent<'_>) -> Result<(), StoreError> {
        let spec = serde_json::to_string(&row.spec)
            .map_err(|e| StoreError::Config(format!("encoding a sandbox spec: {e}")))?;
        let labels = serde_json::to_string(&row.labels)
            .map_err(|e| StoreError::Config(format!("encoding labels: {e}")))?;
        let mut c = lock(&self.conn);
        let tx = c.transaction()?;
        tx.execute(
            "INSERT OR REPLACE INTO paused_sessions (id, tenant, tier, spec, labels, source,
               start_us, created_ms, ttl_ms, idle_ms, last_used_ms, paused_ms, paused_since_ms,
               on_disk_bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            params![
                row.id,
                row.tenant,
                row.tier.as_str(),
                spec,
                labels,
                row.source,
                row.start_us as i64,
                row.created_ms,
                row.ttl_ms,
                row.idle_ms,
                row.last_used_ms,
                row.paused_ms,
                row.paused_since_ms,
                row.on_disk_bytes as i64,
            ],
        )?;
        insert_event(&tx, event)?;
        tx.commit()?;
        Ok(())
    }

    /// Forgets a session paused to disk (it was resumed).
    pub fn paused_remove(&self, id: &str) -> Result<(), StoreError> {
        lock(&self.conn).execute("DELETE FROM paused_sessions WHERE id = ?1", params![id])?;
        Ok(())
    }

    /// The sessions paused to disk, oldest first. A row that does not decode is reported
    /// by id with why, so the start can end it.
    pub fn paused_all(&self) -> Result<Vec<PausedDecoded>, StoreError> {
        let c = lock(&self.conn);
        let mut st = c.prepare(
            "SELECT id, tenant, tier, spec, labels, source, start_us, created_ms, ttl_ms, idle_ms,
               last_used_ms, paused_ms, paused_since_ms, on_disk_bytes
             FROM paused_sessions ORDER BY created_ms",
        )?;
        let rows = st
            .query_map([], |r| {
                let id: String = r.get(0)?;
                let text = |i: usize| r.get::<_, String>(i);
                let (tier, spec, labels) = (text(2)?, text(3)?, text(4)?);
                let json = |what: &'static str| {
                    move |source: serde_json::Error| PausedRowError::Json { what, source }
                };
                let decoded = (|| -> Result<PausedRow, PausedRowError> {
                    Ok(PausedRow {
                        id: id.clone(),
                        tenant: text(1)?,
                        tier: tier
                            .parse()
                            .map_err(|_| PausedRowError::Tier(tier.clone()))?,
                        spec: serde_json::from_str(&spec).map_err(json("spec"))?,
                        labels: serde_json::from_str(&labels).map_err(json("labels"))?,
                        source: text(5)?,
                        start_us: r.get::<_, i64>(6)?.max(0) as u64,
                        created_ms: r.get(7)?,
                        ttl_ms: r.get(8)?,
                        idle_ms: r.get(9)?,
                        last_used_ms: r.get(10)?,
                        paused_ms: r.get(11)?,
                        paused_since_ms: r.get(12)?,
                        on_disk_bytes: r.get::<_, i64>(13)?.max(0) as u64,
                    })
                })();
                Ok(decoded.map_err(|why| (id, why)))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// The tenant and state of a sandbox the store knows, if any.
    pub fn sandbox_state(&self, id: &str) -> Result<Option<(Option<String>, String)>, StoreError> {
        Ok(lock(&self.conn)
            .query_row(
                "SELECT tenant, state FROM sandboxes WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// Sandboxes still marked live or pooled: after a crash, what the dead server left.
    pub fn unfinished(&self) -> Result<Vec<LiveRow>, StoreError> {
        let c = lock(&self.conn);
        let mut st = c.prepare(
            "SELECT id, tenant, tier, state FROM sandboxes WHERE state IN ('live', 'pooled') ORDER BY created_ms",
        )?;
        let rows = st
            .query_map([], |r| {
                Ok(LiveRow {
                    id: r.get(0)?,
                    tenant: r.get(1)?,
                    tier: r.get(2)?,
                    state: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Rows matching `q`; `tenant = None` means every tenant (the CLI, never the API).
    ///
    /// Run on a read connection of its own, with only the filters given in its SQL so the
    /// planner takes the index of each (migration 4): a query reads the rows it answers,
    /// never the whole store. `since_ms` starts at the first row written at or after it
    /// (ids follow the write order; a clock stepped back may hide rows written after it).
    pub fn query(&self, tenant: Option<&str>, q: &Query) -> Result<Vec<Event>, StoreError> {
        let (sql, values) = query_sql(tenant, q);
        self.read(|c| {
            let mut st = c.prepare_cached(&sql)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                    let detail: String = r.get(7)?;
                    Ok(Event {
                        id: r.get(0)?,
                        time_ms: r.get(1)?,
                        tenant: r.get(2)?,
                        sandbox: r.get(3)?,
                        kind: r.get(4)?,
                        decision: r.get(5)?,
                        tier: r.get(6)?,
                        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    /// Deletes events older than `days` days and ended sandboxes as old; returns rows deleted.
    pub fn apply_retention(&self, days: u64) -> Result<usize, StoreError> {
        if days == 0 {
            return Ok(0);
        }
        let cutoff = now_ms() - (days as i64).saturating_mul(86_400_000);
        let c = lock(&self.conn);
        let n = c.execute("DELETE FROM events WHERE time_ms < ?1", params![cutoff])?;
        let m = c.execute(
            "DELETE FROM sandboxes WHERE ended_ms IS NOT NULL AND ended_ms < ?1",
            params![cutoff],
        )?;
        Ok(n + m)
    }

    /// Deletes events before `cutoff_ms` (for retention tests and the CLI).
    pub fn delete_before(&self, cutoff_ms: i64) -> Result<usize, StoreError> {
        Ok(
            lock(&self.conn)
                .execute("DELETE FROM events WHERE time_ms < ?1", params![cutoff_ms])?,
        )
    }
}

/// A query's SQL with only the filters it has, and their values in order.
fn query_sql(tenant: Option<&str>, q: &Query) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut sql = String::from(
        "SELECT id, time_ms, tenant, sandbox, kind, decision, tier, detail FROM events WHERE id > ?",
    );
    let mut values = vec![Value::Integer(q.after_id.unwrap_or(0))];
    for (col, v) in [
        ("tenant", tenant),
        ("sandbox", q.sandbox.as_deref()),
        ("kind", q.kind.as_deref()),
    ] {
        if let Some(v) = v {
            sql.push_str(&format!(" AND {col} = ?"));
            values.push(Value::Text(v.to_string()));
        }
    }
    if let Some(since) = q.since_ms.filter(|s| *s > 0) {
        sql.push_str(
            " AND time_ms >= ? AND id >= (SELECT id FROM events INDEXED BY events_time
               WHERE time_ms >= ? ORDER BY time_ms LIMIT 1)",
        );
        values.push(Value::Integer(since));
        values.push(Value::Integer(since));
    }
    sql.push_str(" ORDER BY id LIMIT ?");
    values.push(Value::Integer(i64::from(
        q.limit.unwrap_or(100).clamp(1, 1000),
    )));
    (sql, values)
}

/// Shares `fit` rows out among tenants holding `counts` rows (max-min fair: a tenant under
/// an equal share keeps all it has, what it leaves is split among the others). Returns
/// each tenant's share, in the order given.
fn fair_shares(counts: &[i64], fit: i64) -> Vec<i64> {
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by_key(|&i| counts[i]);
    let mut shares = vec![0; counts.len()];
    let mut left = fit.max(0);
    for (k, &i) in order.iter().enumerate() {
        let equal = left / (counts.len() - k) as i64;
        shares[i] = counts[i].min(equal);
        left -= shares[i];
    }
    shares
}

#[cfg(test)]
mod tests;
