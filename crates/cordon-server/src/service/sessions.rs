//! Live sandboxes held by tenants: create, claim, list, pause, resume, change, destroy.
//! Uses the admission (the gate, the budgets), the pools (a fresh sandbox), the volumes
//! (their leases) and the audit; every component that works in a sandbox uses this one.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::Extensions;
use cordon_core::{SandboxSpec, Tier};
use cordon_engine::{Admission, Issuer, Reservation};
use tokio::sync::watch;

use super::admit::Admit;
use super::common::{Life, NewEventOwned, Recorder, audit_err, blocking, lock};
use super::pools::{Acquired, FromSnapshot, Held, Pools};
use super::volumes::Volumes;
use crate::ServerError;
use crate::audit::{AuditEvent, Created, Destroyed, Mounted, NewEvent, TeardownResult, now_ms};
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::metrics::Metrics;
use crate::model::{CreateRequest, SandboxInfo};

pub(super) type SandboxCell = Arc<Mutex<Held>>;

/// What a pause keeps of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Everything, in memory: its processes stop where they are.
    Memory,
    /// Everything, saved to disk, its memory let go (tiers with [`cordon_core::Feature::PauseToDisk`]).
    ToDisk,
    /// Its files only (E2B's `memory: false`): the workspace and what its root let it
    /// write are kept on disk, and the tier's sandbox is destroyed (its processes end, its
    /// memory, descriptors and host processes are let go); a resume starts it again from
    /// them under the same id, with its tokens, grants, limits and TTL, as a machine boots
    /// again: no process, code context or watcher of before. Tiers with
    /// [`cordon_core::Feature::SnapshotFiles`].
    Files,
}

impl PauseMode {
    /// The mode a pause request's two flags ask for; both at once is refused.
    pub fn of(to_disk: bool, files_only: bool) -> Result<PauseMode, ApiError> {
        match (to_disk, files_only) {
            (true, true) => Err(ApiError::invalid(
                "to_disk and files_only both: a pause to disk keeps everything, one to files \
                 keeps the files only; give one of them",
            )),
            (true, false) => Ok(PauseMode::ToDisk),
            (false, true) => Ok(PauseMode::Files),
            (false, false) => Ok(PauseMode::Memory),
        }
    }
}

/// The files a sandbox paused to its files keeps, in a root-only directory of the data
/// dir's snapshots, removed when this is dropped: at the resume that started the sandbox
/// again, or with its session (a destroy, a server that stops); a start after a crash
/// removes what a killed server left (no snapshot row names it).
pub(crate) struct FilesPaused {
    pub(super) image: cordon_core::SnapshotImage,
    pub(super) dir: cordon_core::SnapshotDir,
}

impl FilesPaused {
    /// The bytes they take on disk.
    pub(super) fn bytes(&self) -> u64 {
        self.image.bytes
    }
}

impl Drop for FilesPaused {
    fn drop(&mut self) {
        remove_files(self.dir.path());
    }
}

/// Removes a paused sandbox's directory of files, if there is one.
pub(super) fn remove_files(dir: &std::path::Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("removing a paused sandbox's files: {e}"),
    }
}

/// One live sandbox held by a tenant.
pub(super) struct Session {
    pub(super) id: String,
    pub(super) tenant: Tenant,
    pub(super) tier: Tier,
    pub(super) spec: SandboxSpec,
    pub(super) created_ms: i64,
    pub(super) created: Instant,
    /// Its time to live and idle timeout in ms (PATCH changes them).
    pub(super) ttl_ms: AtomicI64,
    pub(super) idle_ms: AtomicI64,
    /// The client's labels.
    pub(super) labels: Mutex<BTreeMap<String, String>>,
    /// Milliseconds since `created` of the last request's end.
    pub(super) last_used: AtomicI64,
    pub(super) busy: AtomicBool,
    pub(super) source: &'static str,
    pub(super) start_us: u64,
    pub(super) sandbox: SandboxCell,
    /// Ends a running exec at once, so destroying a busy sandbox does not wait for it (the
    /// tier's sandbox of now: a resume from its files starts another).
    pub(super) interrupt: Mutex<Option<cordon_core::Interrupter>>,
    /// Why it is being destroyed, once that has begun. The session stays listed (as
    /// `destroying`) until its sandbox is gone and the destroy is audited, so a sandbox
    /// missing from the list always has its destroy row on record.
    pub(super) ending: OnceLock<&'static str>,
    /// Set once the destroy is done and audited; a second destroy waits on it.
    pub(super) ended: watch::Sender<bool>,
    /// What the components above keep of it (its background execs, its code contexts),
    /// one value of each type: it goes with the session, and the session names none of
    /// their types (they depend on it, not it on them).
    state: Mutex<Extensions>,
    /// Since when it is paused, if it is.
    pub(super) paused_at: Mutex<Option<Instant>>,
    /// Milliseconds it spent paused before the current pause (its TTL clock stood still).
    pub(super) paused_ms: AtomicI64,
    /// Bytes it holds on disk while paused to disk.
    pub(super) on_disk: Mutex<Option<u64>>,
    /// Its files, while it is paused keeping its files only: its tier's sandbox is gone.
    pub(super) files: Mutex<Option<FilesPaused>>,
    /// How many times a resume started it again from its files.
    pub(super) restarts: AtomicU32,
    /// The volumes it mounts, let go once it is destroyed.
    pub(super) volume_leases: Mutex<super::volumes::Leases>,
    /// Its place under the limits, given back once its destroy has ended (not when the
    /// last reference to the session goes, which a stream or task may hold longer).
    pub(super) slot: Mutex<Option<Reservation>>,
    /// What its TTL or idle timeout does ([`super::timeout`]).
    pub(super) timeout: super::timeout::TimeoutState,
}

impl Session {
    /// An audit row of this sandbox's: its tenant, id and tier.
    pub(super) fn row(&self, event: AuditEvent) -> NewEvent<'_> {
        NewEvent {
            tenant: Some(&self.tenant.0),
            sandbox: Some(&self.id),
            tier: Some(self.tier),
            event,
        }
    }

    /// A session for a sandbox just acquired: `(ttl, idle)` bound its life; a one-shot
    /// run's starts `busy` and unbounded (its own task ends it).
    pub(super) fn new(
        tenant: &Tenant,
        spec: SandboxSpec,
        acq: Acquired,
        slot: Reservation,
        (ttl, idle): (Duration, Duration),
        busy: bool,
    ) -> Self {
        Session {
            id: acq.sandbox.id(),
            tenant: tenant.clone(),
            tier: spec.tier,
            spec,
            created_ms: now_ms(),
            created: Instant::now(),
            ttl_ms: AtomicI64::new(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
            idle_ms: AtomicI64::new(i64::try_from(idle.as_millis()).unwrap_or(i64::MAX)),
            labels: Mutex::new(BTreeMap::new()),
            last_used: AtomicI64::new(0),
            busy: AtomicBool::new(busy),
            source: acq.source,
            start_us: acq.start_us,
            interrupt: Mutex::new(acq.sandbox.0.as_ref().and_then(|sb| sb.interrupter())),
            sandbox: Arc::new(Mutex::new(acq.sandbox)),
            ending: OnceLock::new(),
            ended: watch::channel(false).0,
            state: Mutex::default(),
            paused_at: Mutex::new(None),
            paused_ms: AtomicI64::new(0),
            on_disk: Mutex::new(None),
            files: Mutex::new(None),
            restarts: AtomicU32::new(0),
            volume_leases: Mutex::default(),
            slot: Mutex::new(Some(slot)),
            timeout: super::timeout::TimeoutState::default(),
        }
    }

    /// A component's state of this session (`T`'s default at first).
    pub(super) fn state<T: Default + Send + 'static>(&self) -> Arc<Mutex<T>> {
        let mut all = lock(&self.state);
        if let Some(s) = all.get::<Arc<Mutex<T>>>() {
            return s.clone();
        }
        let s = Arc::new(Mutex::new(T::default()));
        all.insert(s.clone());
        s
    }

    /// Forgets what the components above keep of it (its background execs, code contexts,
    /// watchers): after a resume from its files, none of their processes exists.
    pub(super) fn reset_state(&self) {
        *lock(&self.state) = Extensions::new();
    }

    /// Marks its place under the limits as on its way back: a new sandbox that only this
    /// place keeps out waits for the teardown instead of being refused.
    pub(super) fn leaving(&self) {
        if let Some(r) = lock(&self.slot).as_ref() {
            r.leave();
        }
    }

    /// Marks the session as being destroyed for `reason`; false if that had begun already.
    pub(super) fn begin_ending(&self, reason: &'static str) -> bool {
        let first = self.ending.set(reason).is_ok();
        // Pairs with the fence in `claim`: the destroy's later look at `busy` sees a claim
        // that missed this mark, and interrupts its exec.
        fence(Ordering::SeqCst);
        first
    }

    /// Waits until a destroy begun elsewhere is done and audited.
    pub(super) async fn wait_ended(&self) {
        let mut rx = self.ended.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|done| *done).await;
    }

    pub(super) fn touch(&self) {
        let age = self.created.elapsed().as_millis() as i64 - self.paused_total_ms();
        self.last_used.store(age, Ordering::Relaxed);
    }

    /// The bytes it holds on disk while paused to disk or to its files.
    pub(super) fn held_on_disk(&self) -> Option<u64> {
        let to_disk = *lock(&self.on_disk);
        to_disk.or_else(|| lock(&self.files).as_ref().map(|f| f.bytes()))
    }

    pub(super) fn info(&self) -> SandboxInfo {
        let on_disk = self.held_on_disk();
        SandboxInfo {
            id: self.id.clone(),
            tier: self.tier,
            state: if self.ending.get().is_some() {
                "destroying".into()
            } else if self.is_paused() {
                "paused".into()
            } else {
                "live".into()
            },
            created_ms: self.created_ms,
            expires_ms: self
                .created_ms
                .saturating_add(self.ttl_ms.load(Ordering::Relaxed))
                .saturating_add(self.paused_total_ms()),
            idle_timeout_ms: self.idle_ms.load(Ordering::Relaxed).max(0) as u64,
            paused: self.is_paused(),
            on_disk: on_disk.is_some(),
            on_disk_bytes: on_disk,
            on_timeout: self.timeout.action(),
            restarts: self.restarts.load(Ordering::Acquire),
            labels: lock(&self.labels).clone(),
            last_used_ms: self.created_ms
                + self.last_used.load(Ordering::Relaxed)
                + self.paused_total_ms(),
            limits: self.spec.limits.clone(),
            allow_hosts: cordon_core::egress::pattern_texts(&self.spec.egress.allow),
            source: self.source.into(),
            start_us: self.start_us,
            busy: self.busy.load(Ordering::Relaxed),
        }
    }

    /// What the store keeps of it while it is paused to disk.
    pub(super) fn paused_row(&self, on_disk_bytes: u64) -> crate::audit::PausedRow {
        crate::audit::PausedRow {
            id: self.id.clone(),
            tenant: self.tenant.0.clone(),
            tier: self.tier,
            spec: self.spec.clone(),
            labels: lock(&self.labels).clone(),
            source: self.source.to_string(),
            start_us: self.start_us,
            created_ms: self.created_ms,
            ttl_ms: self.ttl_ms.load(Ordering::Relaxed),
            idle_ms: self.idle_ms.load(Ordering::Relaxed),
            last_used_ms: self.last_used.load(Ordering::Relaxed),
            paused_ms: self.paused_ms.load(Ordering::Relaxed),
            paused_since_ms: now_ms(),
            on_disk_bytes,
        }
    }

    pub(super) fn is_paused(&self) -> bool {
        lock(&self.paused_at).is_some()
    }

    /// Milliseconds it has spent paused, the current pause included.
    pub(super) fn paused_total_ms(&self) -> i64 {
        let now = lock(&self.paused_at).map_or(0, |at| at.elapsed().as_millis() as i64);
        self.paused_ms.load(Ordering::Relaxed) + now
    }

    /// Why the reaper should end it now, if it should. A paused sandbox's TTL and idle
    /// clocks stand still; it may stay paused for `paused_ttl`.
    pub(super) fn expired(&self, paused_ttl: Duration) -> Option<&'static str> {
        if let Some(at) = *lock(&self.paused_at) {
            return (at.elapsed() >= paused_ttl).then_some("paused-ttl");
        }
        let age = self.created.elapsed().as_millis() as i64 - self.paused_total_ms();
        if age >= self.ttl_ms.load(Ordering::Relaxed) {
            return Some("ttl");
        }
        let idle_for = age - self.last_used.load(Ordering::Relaxed).max(0);
        if !self.busy.load(Ordering::Relaxed) && idle_for >= self.idle_ms.load(Ordering::Relaxed) {
            return Some("idle");
        }
        None
    }
}

/// Clears a session's busy flag when an exec or file call ends.
pub(super) struct BusyGuard(pub(super) Arc<Session>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.store(false, Ordering::Release);
    }
}

/// The live sandboxes by id, each with its tenant.
pub(super) type Map = Arc<Mutex<HashMap<String, Arc<Session>>>>;

/// Tenants' live sandboxes.
#[derive(Clone)]
pub struct Sessions {
    pub(super) map: Map,
    /// Pauses to disk under way: session id -> (tenant, bytes its state may take), counted
    /// against the tenant's `max_paused_bytes` until the save ends.
    pub(super) paused_pending: Arc<Mutex<HashMap<String, (String, u64)>>>,
    /// Mints grant tokens; a destroyed sandbox's are refused from then on.
    issuer: Arc<Issuer>,
    pub(super) admit: Admit,
    pub(super) pools: Pools,
    volumes: Volumes,
    pub(super) audit: Recorder,
    pub(super) metrics: Arc<Metrics>,
    pub(super) life: Life,
    /// `sessions.max_ttl`: what a PATCH may give.
    pub(super) max_ttl: Duration,
}

impl Sessions {
    pub(super) fn new(
        issuer: Arc<Issuer>,
        admit: Admit,
        pools: Pools,
        volumes: Volumes,
        max_ttl: Duration,
    ) -> Self {
        Sessions {
            map: Map::default(),
            paused_pending: Arc::default(),
            issuer,
            audit: admit.audit.clone(),
            metrics: admit.metrics.clone(),
            life: admit.life.clone(),
            admit,
            pools,
            volumes,
            max_ttl,
        }
    }

    /// Fails once the server has begun to stop.
    pub(super) fn stopping(&self) -> Result<(), ApiError> {
        self.life.stopping()
    }

    /// Number of sandboxes tenants hold.
    pub fn count(&self) -> usize {
        lock(&self.map).len()
    }

    /// Every session (shutdown, the reaper).
    pub(super) fn all(&self) -> Vec<Arc<Session>> {
        lock(&self.map).values().cloned().collect()
    }

    /// Adds a session (a sandbox revived from disk).
    pub(super) fn insert(&self, s: Session) {
        self.metrics
            .live
            .get_or_create(&Metrics::tier(s.tier))
            .inc();
        lock(&self.map).insert(s.id.clone(), Arc::new(s));
    }

    /// Shutdown: destroys every session but those paused to disk, which are kept (their
    /// files and record left in place) for the next start.
    pub(super) async fn shutdown(&self) {
        let mut tasks = Vec::new();
        for s in self.all() {
            if lock(&s.on_disk).is_some() && !s.busy.load(Ordering::Acquire) {
                let sb = lock(&s.sandbox).take();
                blocking(move || drop(sb)).await.ok();
                self.forget(&s.id);
                continue;
            }
            let me = self.clone();
            tasks.push(tokio::spawn(async move {
                if s.begin_ending("shutdown") {
                    me.destroy_session(s, "shutdown").await
                } else {
                    // Another destroy (the reaper's or a client's) is under way.
                    s.wait_ended().await;
                    Ok(())
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    /// Forgets a session without a destroy (one paused to disk, kept for the next start).
    pub(super) fn forget(&self, id: &str) {
        lock(&self.map).remove(id);
    }

    /// Creates a sandbox for `tenant`.
    pub async fn create(
        &self,
        tenant: &Tenant,
        req: CreateRequest,
    ) -> Result<SandboxInfo, ApiError> {
        self.create_from(tenant, req, None).await
    }

    /// Creates a sandbox for `tenant`, from a snapshot's image where `from` names one: the
    /// same gate, budgets and audit as any create, its `create` row naming the snapshot.
    pub(super) async fn create_from(
        &self,
        tenant: &Tenant,
        req: CreateRequest,
        from: Option<&FromSnapshot>,
    ) -> Result<SandboxInfo, ApiError> {
        self.stopping()?;
        crate::model::validate_labels(&req.labels)?;
        let labels = req.labels.clone();
        let Admission {
            mut spec,
            ttl,
            idle,
            ..
        } = self.admit.decide(tenant, &req, "create").await?;
        super::timeout::check(&req, spec.tier)?;
        let slot = self.admit.reserve(tenant, &spec).await?;
        let leases = match self.volumes.lease(tenant, &mut spec).await {
            Ok(l) => l,
            Err(e) => {
                self.audit
                    .record(NewEventOwned {
                        tenant: Some(tenant.0.clone()),
                        sandbox: None,
                        tier: Some(spec.tier),
                        event: AuditEvent::VolumeMountFailed {
                            volumes: spec.volumes.clone(),
                            error: e.failure(),
                        },
                    })
                    .await?;
                return Err(e);
            }
        };
        let acq = match self.pools.acquire_from(&spec, from).await {
            Ok(a) => a,
            Err(e) => {
                drop(leases);
                self.audit
                    .record(NewEventOwned {
                        tenant: Some(tenant.0.clone()),
                        sandbox: None,
                        tier: Some(spec.tier),
                        event: AuditEvent::CreateFailed { error: e.failure() },
                    })
                    .await?;
                return Err(e);
            }
        };
        let id = acq.sandbox.id();
        let session = Arc::new(Session::new(
            tenant,
            spec.clone(),
            acq,
            slot,
            (ttl, idle),
            false,
        ));
        *lock(&session.labels) = labels;
        *lock(&session.volume_leases) = leases;
        session.timeout.set(req.on_timeout, ttl);
        let written = self
            .audit_created(&session, tenant, &spec, (ttl, idle), from)
            .await?;
        if let Err(e) = written {
            session.begin_ending("audit-failure");
            self.destroy_session(session, "audit-failure").await.ok();
            return Err(audit_err(e));
        }
        self.metrics
            .live
            .get_or_create(&Metrics::tier(spec.tier))
            .inc();
        let info = session.info();
        lock(&self.map).insert(id, session);
        Ok(info)
    }

    /// Records a created sandbox: its live row, its create event and its volumes' mounts,
    /// in the audit store (on a blocking worker). The inner error is the store's.
    async fn audit_created(
        &self,
        session: &Session,
        tenant: &Tenant,
        spec: &SandboxSpec,
        (ttl, idle): (Duration, Duration),
        from: Option<&FromSnapshot>,
    ) -> Result<Result<(), ServerError>, ApiError> {
        let audit = self.audit.store.clone();
        let (t, i, tier) = (tenant.0.clone(), session.id.clone(), spec.tier);
        let mounts: Vec<(String, bool)> = spec
            .volumes
            .iter()
            .map(|v| (v.name.clone(), v.read_only))
            .collect();
        let mounted: Vec<Mounted> = spec
            .volumes
            .iter()
            .map(|v| Mounted {
                name: v.name.clone(),
                path: v.inside(),
                read_only: v.read_only,
            })
            .collect();
        let created = Created {
            source: session.source.to_string(),
            start_us: session.start_us,
            limits: spec.limits.clone(),
            allow_hosts: Some(cordon_core::egress::pattern_texts(&spec.egress.allow)),
            ttl_ms: Some(ttl.as_millis() as u64),
            idle_timeout_ms: Some(idle.as_millis() as u64),
            one_shot: false,
            snapshot: from.map(|f| f.id.clone()),
        };
        blocking(move || -> Result<(), ServerError> {
            audit.sandbox_started(&i, Some(&t), tier, "live")?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                tier: Some(tier),
                event: AuditEvent::Create(created),
            })?;
            if !mounts.is_empty() {
                audit.volumes_mounted(
                    &t,
                    &i,
                    &mounts,
                    &[NewEvent {
                        tenant: Some(&t),
                        sandbox: Some(&i),
                        tier: Some(tier),
                        event: AuditEvent::VolumeMount { volumes: mounted },
                    }],
                )?;
            }
            Ok(())
        })
        .await
    }

    pub(super) fn session(&self, tenant: &Tenant, id: &str) -> Result<Arc<Session>, ApiError> {
        let s = lock(&self.map).get(id).cloned();
        match s {
            Some(s) if s.tenant == *tenant => Ok(s),
            _ => Err(ApiError::not_found("sandbox")),
        }
    }

    pub(super) fn claim(&self, tenant: &Tenant, id: &str) -> Result<BusyGuard, ApiError> {
        self.stopping()?;
        let s = self.session(tenant, id)?;
        if s.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(ApiError::new(
                Code::SandboxBusy,
                "the sandbox is running another request",
                "wait for it to finish, or use another sandbox for parallel work",
            ));
        }
        // Checked after taking the busy flag, with a fence that pairs with the one in
        // `begin_ending`: either this sees the mark, or the destroy sees the flag and
        // interrupts the exec.
        fence(Ordering::SeqCst);
        if let Some(reason) = s.ending.get() {
            s.busy.store(false, Ordering::Release);
            return Err(ApiError::new(
                Code::SandboxGone,
                format!("the sandbox is being destroyed ({reason})"),
                "create a new sandbox",
            ));
        }
        if let Err(e) = self.refuse_paused(&s) {
            s.busy.store(false, Ordering::Release);
            return Err(e);
        }
        s.touch();
        Ok(BusyGuard(s))
    }

    /// Refuses a call on a paused sandbox.
    pub(super) fn refuse_paused(&self, s: &Session) -> Result<(), ApiError> {
        if s.is_paused() {
            return Err(ApiError::new(
                Code::SandboxPaused,
                "the sandbox is paused",
                "resume it first: POST /v1/sandboxes/{id}/resume",
            ));
        }
        Ok(())
    }

    /// Live sandboxes of `tenant`, or of every tenant when none is given (an operator's
    /// dashboard), each with its tenant, oldest first.
    pub fn live_sandboxes(&self, tenant: Option<&Tenant>) -> Vec<(Tenant, SandboxInfo)> {
        let mut v: Vec<(Tenant, SandboxInfo)> = lock(&self.map)
            .values()
            .filter(|s| tenant.is_none_or(|t| s.tenant == *t))
            .map(|s| (s.tenant.clone(), s.info()))
            .collect();
        v.sort_by(|a, b| (a.1.created_ms, &a.1.id).cmp(&(b.1.created_ms, &b.1.id)));
        v
    }

    /// Sandboxes `tenant` holds, those carrying every label of `labels` only.
    pub fn list(&self, tenant: &Tenant, labels: &[(String, String)]) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = lock(&self.map)
            .values()
            .filter(|s| s.tenant == *tenant)
            .filter(|s| {
                let mine = lock(&s.labels);
                labels.iter().all(|(k, v)| mine.get(k) == Some(v))
            })
            .map(|s| s.info())
            .collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// Bytes of disk `tenant`'s sandboxes paused to disk (or to their files) hold.
    pub fn on_disk_bytes(&self, tenant: &Tenant) -> u64 {
        lock(&self.map)
            .values()
            .filter(|s| s.tenant == *tenant)
            .filter_map(|s| s.held_on_disk())
            .sum()
    }

    /// One sandbox of `tenant`; a destroyed one is reported as such.
    pub async fn info(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ApiError> {
        if let Ok(s) = self.session(tenant, id) {
            return Ok(s.info());
        }
        Err(ApiError::not_found("live sandbox"))
    }

    /// Destroys a sandbox; destroying one already destroyed succeeds again. A sandbox the
    /// reaper is destroying is waited for and then reported as already destroyed.
    pub async fn destroy(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> Result<crate::model::Destroyed, ApiError> {
        let s = {
            let map = lock(&self.map);
            match map.get(id) {
                Some(s) if s.tenant == *tenant => Some(s.clone()),
                Some(_) => return Err(ApiError::not_found("sandbox")),
                None => None,
            }
        };
        match s {
            Some(s) if s.begin_ending("client") => {
                // Detached from this request: a client that goes away mid-request must not
                // leave the sandbox half destroyed and listed as `destroying` for ever.
                let svc = self.clone();
                self.life
                    .destroys
                    .spawn(async move { svc.destroy_session(s, "client").await })
                    .await
                    .map_err(|e| ApiError::internal_from("the destroy task failed", e))??;
                Ok(crate::model::Destroyed::new(id, false))
            }
            Some(s) => {
                s.wait_ended().await;
                Ok(crate::model::Destroyed::new(id, true))
            }
            None => {
                let audit = self.audit.store.clone();
                let i = id.to_string();
                let known = blocking(move || audit.sandbox_state(&i))
                    .await?
                    .map_err(audit_err)?;
                match known {
                    Some((Some(owner), state)) if owner == tenant.0 && state != "live" => {
                        Ok(crate::model::Destroyed::new(id, true))
                    }
                    _ => Err(ApiError::not_found("sandbox")),
                }
            }
        }
    }

    /// Destroys a session marked as ending, audits it, and only then takes it off the map.
    pub(super) async fn destroy_session(
        &self,
        s: Arc<Session>,
        reason: &'static str,
    ) -> Result<(), ApiError> {
        s.leaving();
        // Tokens minted for it are refused from now on (introspection answers inactive).
        self.issuer.end_sandbox(&s.id);
        // A running exec holds the sandbox: end it rather than wait for its timeout.
        if s.busy.load(Ordering::Acquire)
            && let Some(interrupt) = lock(&s.interrupt).clone()
        {
            interrupt();
        }
        let cell = s.sandbox.clone();
        let audit = self.audit.store.clone();
        let (t, i, tier) = (s.tenant.0.clone(), s.id.clone(), s.tier);
        let s2 = s.clone();
        let res = blocking(move || -> Result<(), ServerError> {
            let t0 = Instant::now();
            let taken = lock(&cell).take();
            let outcome = match taken {
                Some(mut sb) => match sb.destroy() {
                    Ok(()) => TeardownResult {
                        ok: true,
                        error: None,
                        note: None,
                    },
                    Err(e) => TeardownResult {
                        ok: false,
                        error: Some(e.to_string()),
                        note: None,
                    },
                },
                None => TeardownResult {
                    ok: true,
                    error: None,
                    note: Some("already gone".into()),
                },
            };
            // A sandbox paused to its files leaves them behind: they go with it.
            drop(lock(&s2.files).take());
            // Only now that the sandbox is gone (and with it its binds of them): the
            // volumes' host mounts go, and their locks with them.
            let leases = std::mem::take(&mut lock(&s2.volume_leases).0);
            let volumes = leases.len();
            drop(leases);
            if volumes > 0 {
                audit.volumes_unmounted(Some(&i))?;
            }
            let destroyed = Destroyed {
                reason: reason.to_string(),
                destroy_us: t0.elapsed().as_micros() as u64,
                result: outcome,
                volumes_released: volumes,
            };
            audit.sandbox_ended(&i, "destroyed", reason)?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                tier: Some(tier),
                event: AuditEvent::Destroy(destroyed),
            })?;
            Ok(())
        })
        .await;
        {
            let mut map = lock(&self.map);
            if map.get(&s.id).is_some_and(|m| Arc::ptr_eq(m, &s)) {
                map.remove(&s.id);
            }
        }
        // The sandbox is gone: its place is free now.
        drop(lock(&s.slot).take());
        s.ended.send_replace(true);
        self.metrics
            .live
            .get_or_create(&Metrics::tier(s.tier))
            .dec();
        res?.map_err(audit_err)
    }
}
