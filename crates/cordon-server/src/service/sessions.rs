//! Live sandboxes held by tenants: create, claim, list, destroy.

use super::*;

/// A sandbox that is destroyed off the async runtime if it is ever dropped still alive
/// (a cancelled request, an early return): a backend's destroy blocks, and some backends
/// own resources that must not be dropped on a runtime thread.
pub struct Held(pub(super) Option<Box<dyn Sandbox>>);

impl Held {
    pub(super) fn new(sb: Box<dyn Sandbox>) -> Self {
        Held(Some(sb))
    }

    pub(super) fn as_mut(&mut self) -> Option<&mut Box<dyn Sandbox>> {
        self.0.as_mut()
    }

    pub(super) fn take(&mut self) -> Option<Box<dyn Sandbox>> {
        self.0.take()
    }

    pub(super) fn id(&self) -> String {
        self.0
            .as_ref()
            .map(|s| s.id().to_string())
            .unwrap_or_default()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(mut sb) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn_blocking(move || {
                        let _ = sb.destroy();
                        drop(sb);
                    });
                }
                Err(_) => {
                    let _ = sb.destroy();
                }
            }
        }
    }
}

pub(super) type SandboxCell = Arc<Mutex<Held>>;

/// One live sandbox held by a tenant.
pub(super) struct Session {
    pub(super) id: String,
    pub(super) tenant: Tenant,
    pub(super) tier: Tier,
    pub(super) spec: SandboxSpec,
    pub(super) created_ms: i64,
    pub(super) created: Instant,
    pub(super) ttl: Duration,
    pub(super) idle: Duration,
    /// Milliseconds since `created` of the last request's end.
    pub(super) last_used: AtomicI64,
    pub(super) busy: AtomicBool,
    pub(super) source: &'static str,
    pub(super) start_us: u64,
    pub(super) sandbox: SandboxCell,
    /// Ends a running exec at once, so destroying a busy sandbox does not wait for it.
    pub(super) interrupt: Option<cordon_core::Interrupter>,
    /// Why it is being destroyed, once that has begun. The session stays listed (as
    /// `destroying`) until its sandbox is gone and the destroy is audited, so a sandbox
    /// missing from the list always has its destroy row on record.
    pub(super) ending: OnceLock<&'static str>,
    /// Set once the destroy is done and audited; a second destroy waits on it.
    pub(super) ended: watch::Sender<bool>,
    pub(super) _slot: Reservation,
}

impl Session {
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
            ttl,
            idle,
            last_used: AtomicI64::new(0),
            busy: AtomicBool::new(busy),
            source: acq.source,
            start_us: acq.start_us,
            interrupt: acq.sandbox.0.as_ref().and_then(|sb| sb.interrupter()),
            sandbox: Arc::new(Mutex::new(acq.sandbox)),
            ending: OnceLock::new(),
            ended: watch::channel(false).0,
            _slot: slot,
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
        self.last_used
            .store(self.created.elapsed().as_millis() as i64, Ordering::Relaxed);
    }

    pub(super) fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.clone(),
            tier: self.tier,
            state: if self.ending.get().is_some() {
                "destroying".into()
            } else {
                "live".into()
            },
            created_ms: self.created_ms,
            expires_ms: self.created_ms + self.ttl.as_millis() as i64,
            idle_timeout_ms: self.idle.as_millis() as u64,
            last_used_ms: self.created_ms + self.last_used.load(Ordering::Relaxed),
            limits: self.spec.limits.clone(),
            allow_hosts: self.spec.egress.allow.clone(),
            source: self.source.into(),
            start_us: self.start_us,
            busy: self.busy.load(Ordering::Relaxed),
        }
    }

    /// Why the reaper should end it now, if it should.
    pub(super) fn expired(&self) -> Option<&'static str> {
        let age = self.created.elapsed();
        if age >= self.ttl {
            return Some("ttl");
        }
        let idle_for = age
            .as_millis()
            .saturating_sub(self.last_used.load(Ordering::Relaxed).max(0) as u128);
        if !self.busy.load(Ordering::Relaxed) && idle_for >= self.idle.as_millis() {
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

impl Service {
    // ---- sessions --------------------------------------------------------------------

    /// Creates a sandbox for `tenant`.
    pub async fn create(
        &self,
        tenant: &Tenant,
        req: CreateRequest,
    ) -> Result<SandboxInfo, ApiError> {
        self.stopping()?;
        let Admission {
            spec, ttl, idle, ..
        } = self.decide(tenant, &req, "create").await?;
        let slot = self.reserve(tenant, &spec)?;
        let acq = match self.acquire(&spec).await {
            Ok(a) => a,
            Err(e) => {
                self.record(NewEventOwned {
                    tenant: Some(tenant.0.clone()),
                    sandbox: None,
                    kind: "create",
                    decision: Some("error"),
                    tier: Some(spec.tier),
                    detail: json!({"error": e.to_json()}),
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
        let audit = self.inner.audit.clone();
        let (t, i, tier) = (tenant.0.clone(), id.clone(), spec.tier);
        let detail = json!({
            "source": session.source,
            "start_us": session.start_us,
            "limits": spec.limits,
            "allow_hosts": spec.egress.allow,
            "ttl_ms": ttl.as_millis() as u64,
            "idle_timeout_ms": idle.as_millis() as u64,
        });
        let written = blocking(move || -> Result<(), ServerError> {
            audit.sandbox_started(&i, Some(&t), tier, "live")?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                kind: "create",
                decision: Some("ok"),
                tier: Some(tier),
                detail,
            })?;
            Ok(())
        })
        .await?;
        if let Err(e) = written {
            session.begin_ending("audit-failure");
            self.destroy_session(session, "audit-failure").await.ok();
            return Err(audit_err(e));
        }
        self.inner
            .metrics
            .live
            .get_or_create(&Metrics::tier(spec.tier))
            .inc();
        let info = session.info();
        lock(&self.inner.sessions).insert(id, session);
        Ok(info)
    }

    pub(super) fn session(&self, tenant: &Tenant, id: &str) -> Result<Arc<Session>, ApiError> {
        let s = lock(&self.inner.sessions).get(id).cloned();
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
        s.touch();
        Ok(BusyGuard(s))
    }

    /// Sandboxes `tenant` holds.
    pub fn list(&self, tenant: &Tenant) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = lock(&self.inner.sessions)
            .values()
            .filter(|s| s.tenant == *tenant)
            .map(|s| s.info())
            .collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
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
    pub async fn destroy(&self, tenant: &Tenant, id: &str) -> Result<serde_json::Value, ApiError> {
        let s = {
            let map = lock(&self.inner.sessions);
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
                self.inner
                    .destroys
                    .spawn(async move { svc.destroy_session(s, "client").await })
                    .await
                    .map_err(|e| ApiError::internal(format!("the destroy task failed: {e}")))??;
                Ok(json!({"id": id, "state": "destroyed", "already": false}))
            }
            Some(s) => {
                s.wait_ended().await;
                Ok(json!({"id": id, "state": "destroyed", "already": true}))
            }
            None => {
                let audit = self.inner.audit.clone();
                let i = id.to_string();
                let known = blocking(move || audit.sandbox_state(&i))
                    .await?
                    .map_err(audit_err)?;
                match known {
                    Some((Some(owner), state)) if owner == tenant.0 && state != "live" => {
                        Ok(json!({"id": id, "state": "destroyed", "already": true}))
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
        // Tokens minted for it are refused from now on (introspection answers inactive).
        self.inner.issuer.end_sandbox(&s.id);
        // A running exec holds the sandbox: end it rather than wait for its timeout.
        if s.busy.load(Ordering::Acquire)
            && let Some(interrupt) = &s.interrupt
        {
            interrupt();
        }
        let cell = s.sandbox.clone();
        let audit = self.inner.audit.clone();
        let (t, i, tier) = (s.tenant.0.clone(), s.id.clone(), s.tier);
        let res = blocking(move || -> Result<serde_json::Value, ServerError> {
            let t0 = Instant::now();
            let taken = lock(&cell).take();
            let outcome = match taken {
                Some(mut sb) => match sb.destroy() {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => json!({"ok": false, "error": e.to_string()}),
                },
                None => json!({"ok": true, "note": "already gone"}),
            };
            let detail = json!({
                "reason": reason,
                "destroy_us": t0.elapsed().as_micros() as u64,
                "result": outcome,
            });
            audit.sandbox_ended(&i, "destroyed", reason)?;
            audit.record(&NewEvent {
                tenant: Some(&t),
                sandbox: Some(&i),
                kind: "destroy",
                decision: Some(reason),
                tier: Some(tier),
                detail: detail.clone(),
            })?;
            Ok(detail)
        })
        .await;
        {
            let mut map = lock(&self.inner.sessions);
            if map.get(&s.id).is_some_and(|m| Arc::ptr_eq(m, &s)) {
                map.remove(&s.id);
            }
        }
        s.ended.send_replace(true);
        self.inner
            .metrics
            .live
            .get_or_create(&Metrics::tier(s.tier))
            .dec();
        res?.map(|_| ()).map_err(audit_err)
    }
}
