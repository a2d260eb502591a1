//! The transport-independent core, as components that each own their state and reach
//! the ones below them through a narrow interface; the HTTP API, MCP and the E2B surface
//! are thin layers over them, reached through [`Service`]:
//!
//! ```text
//! Service (the facade: start, shutdown, one accessor per component)
//!  ├─ Contexts ─┐
//!  ├─ Procs  ───┤ (contexts use procs' one agent call at a time)
//!  ├─ Files  ───┤
//!  ├─ Execs  ───┼─► Sessions ─► Volumes ─► Admit (gate, ledger, disk guard) ─► descriptors
//!  │            │      ├──────► Pools (backends, warm pools)
//!  │            │      └──────► timeout (what a TTL does: destroy, or pause)
//!  ├─ Snapshots ─────► Contexts, Procs, Sessions, Pools (an image kept; sandboxes started
//!  │                   from it, with a full one's contexts and background execs)
//!  ├─ pause (pausing, resuming and changing a live sandbox) ─► Sessions
//!  ├─ Reaper, Recovery (start-up) ─► Sessions, Pools
//!  └─ common: Recorder (audit), Life (stopping, background tasks), Chunk, helpers
//! ```
//!
//! No component knows [`Service`] or one above it: this module's tests fail when a
//! component names a module not below it (their `USES` table is this drawing), or imports
//! its parent's items wholesale again (`use super::*`).
//!
//! Backend calls block (syscalls, child processes), so every one runs in `spawn_blocking`.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use cordon_core::{Probe, Tier};
use cordon_engine::{BudgetLimits, Catalogue, Gate, GateSettings, Issuer, Ledger, RulesSource};
use tokio_util::sync::CancellationToken;

use crate::ServerError;
use crate::audit::{Audit, AuditEvent, Event, NewEvent, Query};
use crate::config::Config;
use crate::error::ApiError;
use crate::keys::{Keys, Tenant};
use crate::metrics::Metrics;
use crate::model::CreateRequest;

mod admit;
mod common;
mod contexts;
mod descriptors;
mod exec;
mod files;
mod pause;
mod pools;
mod ports;
mod procs;
mod reaper;
mod recovery;
mod samples;
mod sessions;
mod snapshots;
mod timeout;
mod volumes;
mod watch;

pub use admit::Admit;
pub use common::snapshots_dir;
pub use common::{Chunk, ChunkSender, Slot, Slots};
pub use contexts::{CellError, CellStatus, Contexts};
pub use exec::{ExecJob, Execs, RunJob};
pub use files::Files;
pub use pools::{Backends, Held, Pools};
pub use ports::{MAX_PORT_CONNS, Opened, PortConn};
pub use procs::{AttachCaps, AttachSlot, Procs};
pub use recovery::{RecoveryHook, scratch_dir};
pub use sessions::{PauseMode, Sessions};
pub use snapshots::{Snapshots, StartOptions};
pub use volumes::Volumes;
pub use watch::WatchBatch;

pub use crate::audit::RecoveryReport;

/// Why a presented key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefused {
    /// Not a key of this server's.
    Invalid,
    /// Not a key, from an address in its back-off: wait this many seconds.
    Backoff(u64),
}

/// The components and what the front doors read of the server.
struct Inner {
    cfg: Config,
    keys: Keys,
    throttle: crate::keys::Throttle,
    metrics: Arc<Metrics>,
    audit: Arc<Audit>,
    /// Mints grant tokens and publishes their keys.
    issuer: Arc<Issuer>,
    admit: Admit,
    pools: Pools,
    volumes: Volumes,
    sessions: Sessions,
    execs: Execs,
    files: Files,
    procs: Procs,
    contexts: Contexts,
    snapshots: Snapshots,
    life: common::Life,
    /// Audit queries and event streams each tenant has under way.
    audit_reads: Slots,
    event_streams: Slots,
    /// Each tenant's one place for encoding a large output chunk (`api::stream`).
    output_gates: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// What the descriptor limit allows, as `cordon serve` says it at start.
    capacity: String,
    _lock: File,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

impl Service {
    /// What the process's descriptor limit allows of each tier's live sandboxes.
    pub fn capacity(&self) -> &str {
        &self.inner.capacity
    }

    /// Opens the data dir (taking its lock), recovers from a crash, starts the reaper and
    /// warm pools. Must be called inside a tokio runtime.
    pub async fn start(
        cfg: Config,
        keys: Keys,
        backends: Backends,
        recovery: Option<RecoveryHook>,
    ) -> Result<Self, ServerError> {
        let (lock_file, audit, kept) = recover(&cfg, &backends, recovery).await?;
        let probes = probe(&backends).await?;
        let issuer = Arc::new(
            Issuer::new(
                cfg.oidc
                    .issuer
                    .clone()
                    .unwrap_or_else(|| format!("http://{}", cfg.bind)),
                cfg.oidc.rotate_every.0,
                cfg.oidc.max_token_life.0,
            )
            .map_err(|e| ServerError::start("the token issuer of minted grants", e))?,
        );
        let gate = gate_of(&cfg, &probes, &backends, issuer.clone())?;
        let mut cfg = cfg;
        let fds = descriptor_plan(&mut cfg, &probes, &backends)?;
        let ledger = Ledger::new(budget_limits(&cfg, fds.plan.sandboxes));
        let audit = Arc::new(audit);
        let metrics = Arc::new(Metrics::new());
        let life = common::Life::new();
        let pools = Pools::configure(
            &cfg,
            backends,
            probes,
            &gate,
            &ledger,
            (audit.clone(), metrics.clone(), life.clone()),
        )?;
        let admit = Admit {
            gate: Arc::new(gate),
            ledger: Arc::new(ledger),
            audit: common::Recorder {
                store: audit.clone(),
            },
            metrics: metrics.clone(),
            life: life.clone(),
            data_dir: cfg.data_dir.clone(),
            min_free_disk: cfg.audit.min_free_disk.0,
            retry_after_secs: cfg.sessions.retry_after_secs,
        };
        let Parts {
            volumes,
            sessions,
            execs,
            files,
            procs,
            contexts,
            snapshots,
        } = components(&cfg, &admit, &pools, &issuer, &audit)?;
        pools.start();
        recovery::Recovery {
            sessions: sessions.clone(),
            pools: pools.clone(),
        }
        .revive_paused(kept)
        .await;
        spawn_background(&life, &sessions, &cfg);
        Ok(Service {
            inner: Arc::new(Inner {
                capacity: fds.summary.clone(),
                cfg,
                keys,
                throttle: crate::keys::Throttle::default(),
                metrics,
                audit,
                issuer,
                admit,
                pools,
                volumes,
                sessions,
                execs,
                files,
                procs,
                contexts,
                snapshots,
                life,
                audit_reads: Slots::new(
                    "your audit queries under way",
                    "wait for your other audit queries to answer, and page with after_id",
                ),
                event_streams: Slots::new(
                    "your event streams (GET /v1/events) open at once",
                    "close dashboards or event streams you no longer watch",
                ),
                output_gates: Default::default(),
                _lock: lock_file,
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The tenant of a presented key (none when the header held none in its expected
    /// form, a failing attempt too), with the failed-key back-off of its source address
    /// `peer` (none in-process). A valid key is never slowed down, whoever failed from its
    /// address before (a keyless client on loopback or behind the TLS proxy shares its
    /// address with every tenant): the back-off answers the failing attempts only, each of
    /// which counts.
    pub fn key_attempt(
        &self,
        key: Option<&str>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Tenant, KeyRefused> {
        if let Some(t) = key.and_then(|k| self.keys().tenant_for(k)) {
            return Ok(t);
        }
        if let Some(ip) = peer {
            let wait = self
                .throttle()
                .check(ip, self.config().edge.failures_before_slowdown);
            self.throttle().fail(ip);
            if let Some(wait) = wait {
                self.metrics().deny("key_backoff");
                return Err(KeyRefused::Backoff(wait));
            }
        }
        self.metrics().deny("unauthorized");
        Err(KeyRefused::Invalid)
    }

    /// Failed-key back-off per source address.
    pub fn throttle(&self) -> &crate::keys::Throttle {
        &self.inner.throttle
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn audit(&self) -> &Arc<Audit> {
        &self.inner.audit
    }

    pub fn probes(&self) -> &BTreeMap<Tier, Probe> {
        self.inner.pools.probes()
    }

    /// The gate every create and run passes.
    pub fn gate(&self) -> &Gate {
        self.inner.admit.gate()
    }

    /// Asks the gate for a template build's sandbox as `tenant` (audited as `what`), and
    /// reserves its memory under the tenant's and the host's budgets while the build
    /// runs: the build is refused as a create of that sandbox would be.
    pub async fn admit_build(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<cordon_engine::Reservation, ApiError> {
        let adm = self.inner.admit.decide(tenant, req, what).await?;
        self.inner.admit.reserve(tenant, &adm.spec).await
    }

    /// The token issuer of minted grants.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.inner.issuer
    }

    /// Fires when shutdown begins.
    pub fn cancelled(&self) -> CancellationToken {
        self.inner.life.cancel.clone()
    }

    /// Tenants' sandboxes: create, list, pause, resume, change, destroy.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// Execs and one-shot runs.
    pub fn execs(&self) -> &Execs {
        &self.inner.execs
    }

    /// Files and directories in and out of sandboxes.
    pub fn files(&self) -> &Files {
        &self.inner.files
    }

    /// Background execs.
    pub fn procs(&self) -> &Procs {
        &self.inner.procs
    }

    /// Code contexts.
    pub fn contexts(&self) -> &Contexts {
        &self.inner.contexts
    }

    /// Tenants' volumes.
    pub fn volumes(&self) -> &Volumes {
        &self.inner.volumes
    }

    /// The tiers' backends and the warm pools.
    pub fn snapshots(&self) -> &Snapshots {
        &self.inner.snapshots
    }

    pub fn pools(&self) -> &Pools {
        &self.inner.pools
    }

    /// Number of destroys under way (one-shot runs' teardowns, reaped and deleted sandboxes).
    pub fn destroys_in_flight(&self) -> usize {
        self.inner.life.destroys.len()
    }

    /// Audit rows of `tenant`.
    pub async fn audit_query(&self, tenant: &Tenant, q: Query) -> Result<Vec<Event>, ApiError> {
        // At most audit.max_reads_per_tenant under way per tenant: each is one blocking
        // thread and one read connection while it runs.
        let _slot = self
            .inner
            .audit_reads
            .take(&tenant.0, self.inner.cfg.audit.max_reads_per_tenant)
            .inspect_err(|_| self.inner.metrics.deny("audit_reads"))?;
        let audit = self.inner.audit.clone();
        let t = tenant.0.clone();
        common::blocking(move || audit.query(Some(&t), &q))
            .await?
            .map_err(common::audit_err)
    }

    /// `tenant`'s one place for encoding a large chunk of streamed output (UTF-8 repair
    /// and framing on the blocking pool): however many streams a tenant reads at once, its
    /// output's encoding takes one thread at a time, one core of the host's at most. One
    /// per tenant with a key, so the map is as large as the key file.
    pub fn output_gate(&self, tenant: &Tenant) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self
            .inner
            .output_gates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        gates
            .entry(tenant.0.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(1)))
            .clone()
    }

    /// A place for one event stream of `tenant` (`GET /v1/events`), held while it is open:
    /// `429 resource_busy` past `audit.max_event_streams_per_tenant`.
    pub fn event_stream_slot(&self, tenant: &Tenant) -> Result<Slot, ApiError> {
        self.inner
            .event_streams
            .take(&tenant.0, self.inner.cfg.audit.max_event_streams_per_tenant)
            .inspect_err(|_| self.inner.metrics.deny("event_streams"))
    }

    /// Graceful shutdown: refuses new work, destroys every sandbox and empties the pools.
    pub async fn shutdown(&self) {
        let life = &self.inner.life;
        life.stop();
        // The reaper and refills see the cancel and return (a refill's create in flight
        // finishes first, and its sandbox is drained with its pool below).
        life.background.close();
        life.background.wait().await;
        self.inner.sessions.shutdown().await;
        life.destroys.close();
        life.destroys.wait().await;
        self.inner.pools.drain().await;
        let audit = self.inner.audit.clone();
        let _ = common::blocking(move || {
            audit.record(&NewEvent::server(AuditEvent::Shutdown { graceful: true }))
        })
        .await;
    }
}

/// Opens the store and the audit log and cleans up what a previous server left behind
/// (logged); returns the data dir's lock, the audit store and the paused sandboxes kept.
async fn recover(
    cfg: &Config,
    backends: &Backends,
    recovery: Option<RecoveryHook>,
) -> Result<(File, Audit, Vec<crate::audit::PausedRow>), ServerError> {
    let (lock_file, audit, report, kept) = tokio::task::spawn_blocking({
        let cfg = cfg.clone();
        let backends = backends.clone();
        move || recovery::open_and_recover(&cfg, &backends, recovery)
    })
    .await
    .map_err(|e| ServerError::start("the startup worker", e))??;
    if !report.sandboxes.is_empty() || !report.scratch.is_empty() || !report.removed.is_empty() {
        tracing::warn!(
            sandboxes = report.sandboxes.len(),
            removed = report.removed.len(),
            scratch = report.scratch.len(),
            "cleaned up what a previous server left behind"
        );
    }
    Ok((lock_file, audit, kept))
}

/// Every tier's probe, on a blocking worker.
async fn probe(backends: &Backends) -> Result<BTreeMap<Tier, Probe>, ServerError> {
    let probes = tokio::task::spawn_blocking({
        let backends = backends.clone();
        move || {
            backends
                .iter()
                .map(|(t, b)| (*t, b.probe()))
                .collect::<BTreeMap<_, _>>()
        }
    })
    .await
    .map_err(|e| ServerError::start("the tiers' probe worker", e))?;
    Ok(probes)
}

/// The gate: the policy rules (the file's or the shipped), the bench figures, the grant
/// catalogue, which tiers are available (and why the others are not), and the templates.
fn gate_of(
    cfg: &Config,
    probes: &BTreeMap<Tier, Probe>,
    backends: &Backends,
    issuer: Arc<Issuer>,
) -> Result<Gate, ServerError> {
    let rules = match &cfg.policy.rules_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ServerError::Config(format!("reading the policy file {}: {e}", p.display()))
            })?;
            RulesSource::Text(text)
        }
        None => RulesSource::Shipped,
    };
    let bench = cfg.policy.bench_file.as_ref().and_then(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        match cordon_policy::BenchFigures::from_bench_json(&text) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!("ignoring the bench figures in {}: {e}", p.display());
                None
            }
        }
    });
    let catalogue = Catalogue::load(&cfg.grants, Some(issuer))
        .map_err(|e| ServerError::start("the grant catalogue ([[grant]])", e))?;
    let available = probes
        .iter()
        .filter(|(t, p)| p.available() && backends.contains_key(t))
        .map(|(t, _)| *t)
        .collect();
    let unavailable = probes
        .iter()
        .filter(|(_, p)| !p.available())
        .map(|(t, p)| {
            let why = p
                .capabilities
                .iter()
                .filter(|c| !c.ok && c.required)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect::<Vec<_>>()
                .join("; ");
            (*t, why)
        })
        .collect();
    let gate = Gate::new(
        GateSettings {
            default_tier: cfg.default_tier,
            default_limits: cfg.default_limits.clone(),
            max_limits: cfg.max_limits.clone(),
            default_ttl: cfg.sessions.default_ttl.0,
            max_ttl: cfg.sessions.max_ttl.0,
            default_idle: cfg.sessions.default_idle_timeout.0,
        },
        cfg.ceiling(),
        Arc::new(catalogue),
        rules,
        bench,
    )
    .with_tiers(available, unavailable);
    let templates = cordon_template::Store::open(&cfg.data_dir)
        .map_err(|e| ServerError::start("the template store under the data dir", e))?;
    let gate = gate.with_templates(templates);
    gate.load_rules().map_err(|e| {
        ServerError::Config(match &cfg.policy.rules_file {
            Some(p) => format!("the policy file {}: {e}", p.display()),
            None => e,
        })
    })?;
    Ok(gate)
}

/// The service's components over the admission, the pools and the audit store, each with
/// its part of the configuration.
struct Parts {
    volumes: Volumes,
    sessions: Sessions,
    execs: Execs,
    files: Files,
    procs: Procs,
    contexts: Contexts,
    snapshots: Snapshots,
}

fn components(
    cfg: &Config,
    admit: &Admit,
    pools: &Pools,
    issuer: &Arc<Issuer>,
    audit: &Arc<Audit>,
) -> Result<Parts, ServerError> {
    let volumes = Volumes::new(
        volumes::open_store(&cfg.data_dir)?,
        admit.clone(),
        audit.clone(),
    );
    let sessions = Sessions::new(
        issuer.clone(),
        admit.clone(),
        pools.clone(),
        volumes.clone(),
        cfg.sessions.max_ttl.0,
    );
    let execs = Execs::new(
        sessions.clone(),
        pools.clone(),
        cfg.max_limits.timeout_ms,
        (
            cfg.audit.max_egress_rows_per_exec,
            cfg.audit.max_egress_rows_per_minute,
        ),
    );
    let files = Files::new(
        sessions.clone(),
        cfg.http.max_file_bytes as u64,
        cfg.http.max_archive_bytes,
    );
    let procs = Procs::new(
        sessions.clone(),
        cfg.sessions.max_background_execs,
        cfg.sessions.kill_grace.0,
        procs::AttachCaps {
            per_tenant: cfg.sessions.max_attach_streams_per_tenant,
            per_sandbox: cfg.sessions.max_attach_streams_per_sandbox,
        },
    );
    let contexts = Contexts::new(
        sessions.clone(),
        contexts::ContextLimits {
            max_contexts: cfg.sessions.max_contexts,
            start_timeout: cfg.sessions.context_start_timeout.0,
            grace: cfg.sessions.context_grace.0,
            max_timeout_ms: cfg.max_limits.timeout_ms,
        },
    );
    let snapshots = Snapshots::new(sessions.clone(), &cfg.data_dir);
    Ok(Parts {
        volumes,
        sessions,
        execs,
        files,
        procs,
        contexts,
        snapshots,
    })
}

/// The ledger's limits: the configuration's, and the descriptors their plan leaves to
/// sandboxes.
fn budget_limits(cfg: &Config, max_descriptors: u64) -> BudgetLimits {
    BudgetLimits {
        max_descriptors,
        max_sandboxes: cfg.sessions.max_sandboxes,
        max_sandboxes_per_tenant: cfg.sessions.max_sandboxes_per_tenant,
        max_memory: cfg
            .budgets
            .max_memory
            .map(|s| s.0)
            .unwrap_or_else(cordon_engine::host_memory_budget),
    }
}

/// The reaper and the metrics sampler, for the service's life.
fn spawn_background(life: &common::Life, sessions: &Sessions, cfg: &Config) {
    life.background.spawn(
        reaper::Reaper {
            sessions: sessions.clone(),
            every: cfg.sessions.reap_interval.0,
            paused_ttl: cfg.sessions.paused_ttl.0,
            max_size: cfg.audit.max_size.0,
            retention_days: cfg.audit.retention_days,
        }
        .run(),
    );
    life.background.spawn(
        samples::Sampler {
            sessions: sessions.clone(),
        }
        .run(),
    );
}

/// Shares the process's descriptor limit between the listeners' connections, a reserve and
/// live sandboxes; says how many sandboxes of each tier that allows, and refuses a
/// `sessions.max_sandboxes` above what it allows of the cheapest tier that holds any (one
/// left at its default is lowered to that, with a warning).
fn descriptor_plan(
    cfg: &mut Config,
    probes: &BTreeMap<cordon_core::Tier, cordon_core::Probe>,
    backends: &Backends,
) -> Result<Capacity, ServerError> {
    descriptors::raise_limit();
    let per_listener = crate::listen::ConnLimits::of(&cfg.edge).max_connections as u64;
    // The API, the E2B listener and its HTTPS one: each has its own connection cap.
    let listeners = 1
        + u64::from(cfg.e2b.is_some())
        + u64::from(cfg.e2b.as_ref().is_some_and(|e| e.https_listen.is_some()));
    let plan = descriptors::Plan::of_process(per_listener.saturating_mul(listeners));
    let tiers: Vec<_> = probes
        .iter()
        .filter(|(t, p)| p.available() && backends.contains_key(t))
        .filter_map(|(t, _)| plan.allows(*t).map(|n| (*t, n)))
        .collect();
    let said: Vec<String> = tiers
        .iter()
        .map(|(t, n)| format!("{n} {t} ({} each)", descriptors::per_sandbox(*t)))
        .collect();
    let summary = format!(
        "its descriptor limit ({}, less {} for connections and {} in reserve) holds {}",
        plan.limit,
        plan.connections,
        plan.reserve,
        if said.is_empty() {
            "any number of sandboxes of this host's tiers".to_string()
        } else {
            format!("{} live sandboxes", said.join(", or "))
        }
    );
    tracing::info!("{summary}");
    if let Some((tier, n)) = tiers.iter().max_by_key(|(_, n)| *n)
        && cfg.sessions.max_sandboxes as u64 > *n
    {
        if !cfg.sessions.max_sandboxes_set {
            let lowered = usize::try_from(*n).unwrap_or(usize::MAX).max(1);
            tracing::warn!(
                "sessions.max_sandboxes (unset, default {}) is lowered to {lowered}: this \
                 process's descriptor limit ({}) holds at most {n} live {tier} sandboxes; raise \
                 the limit (`ulimit -n`, or LimitNOFILE= in the unit) for more",
                cfg.sessions.max_sandboxes,
                plan.limit,
            );
            cfg.sessions.max_sandboxes = lowered;
            let summary = format!(
                "{summary}; sessions.max_sandboxes (unset) lowered to {lowered} from its default"
            );
            return Ok(Capacity { plan, summary });
        }
        return Err(ServerError::Config(format!(
            "sessions.max_sandboxes is {} but this process's descriptor limit ({}, less {} \
             for connections, {} kept in reserve and {} open at start) holds at most {n} live \
             {tier} sandboxes of {} descriptors each: raise the limit (`ulimit -n`, or \
             LimitNOFILE= in the unit) to at least {}, or lower sessions.max_sandboxes to {n}",
            cfg.sessions.max_sandboxes,
            plan.limit,
            plan.connections,
            plan.reserve,
            plan.baseline,
            descriptors::per_sandbox(*tier),
            plan.limit + (cfg.sessions.max_sandboxes as u64 - n) * descriptors::per_sandbox(*tier),
        )));
    }
    Ok(Capacity { plan, summary })
}

/// The descriptor plan and what it allows, said at start.
struct Capacity {
    plan: descriptors::Plan,
    summary: String,
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Which sibling modules each component may use: the graph in this module's docs (and
    /// docs/design.md), one way, from the front doors down to the shared parts.
    const USES: &[(&str, &[&str])] = &[
        ("common", &[]),
        ("descriptors", &[]),
        ("admit", &["common", "descriptors"]),
        ("pools", &["common"]),
        ("volumes", &["admit", "common"]),
        ("timeout", &[]),
        (
            "sessions",
            &["admit", "common", "pools", "timeout", "volumes"],
        ),
        ("pause", &["common", "pools", "sessions"]),
        ("exec", &["common", "pools", "sessions"]),
        ("files", &["common", "sessions"]),
        ("ports", &["common", "sessions"]),
        ("procs", &["common", "exec", "sessions"]),
        ("contexts", &["common", "procs", "sessions"]),
        ("watch", &["common", "procs", "sessions"]),
        ("samples", &["common", "sessions"]),
        (
            "snapshots",
            &["common", "contexts", "pools", "procs", "sessions"],
        ),
        ("reaper", &["sessions"]),
        ("recovery", &["common", "pools", "sessions", "volumes"]),
    ];

    /// The product code of each component's own file (its tests, after `#[cfg(test)]`,
    /// left out): `(component, file, text)`.
    fn components() -> Vec<(&'static str, PathBuf, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/service");
        USES.iter()
            .map(|(name, _)| {
                let flat = dir.join(format!("{name}.rs"));
                let file = if flat.exists() {
                    flat
                } else {
                    dir.join(name).join("mod.rs")
                };
                let text = std::fs::read_to_string(&file).unwrap();
                let product = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                (*name, file, product)
            })
            .collect()
    }

    /// The service's modules import what they use by name: none takes its parent's
    /// items wholesale (`use super::*`), which is how the components once reached into one
    /// another's state. Test modules (after `#[cfg(test)]`) may.
    #[test]
    fn no_service_module_imports_its_parent_wholesale() {
        let mut offenders = Vec::new();
        for (_, file, text) in components() {
            for (n, line) in text.lines().enumerate() {
                let l = line.trim();
                if l.starts_with("use super::*") || l.starts_with("pub use super::*") {
                    offenders.push(format!("{}:{}", file.display(), n + 1));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "`use super::*` in the service's modules (import what you use by name): {offenders:?}"
        );
    }

    /// Every component names only the components below it (`super::<module>`), and never
    /// the service itself (`super::Service`, `super::Inner`): the dependencies go one way.
    #[test]
    fn components_use_only_the_components_below_them() {
        // A new module takes its place in the graph before it is checked.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/service");
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            if stem != "mod" {
                assert!(
                    USES.iter().any(|(n, _)| *n == stem),
                    "service/{stem} is not in USES: add it with the components it uses"
                );
            }
        }
        let mut offenders = Vec::new();
        for (name, file, text) in components() {
            let allowed = USES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, u)| *u)
                .unwrap();
            for (i, _) in text.match_indices("super::") {
                let rest = &text[i + "super::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !allowed.contains(&used.as_str()) {
                    offenders.push(format!("{}: super::{used}", file.display()));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "a service component uses one that is not below it (see USES and docs/design.md): {offenders:?}"
        );
    }
}
