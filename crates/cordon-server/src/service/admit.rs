//! Admission: the gate's decision, the tenant's and the server's budgets, the disk guard.

use super::*;

impl Service {
    // ---- policy ----------------------------------------------------------------------

    /// The gate every create and run passes.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// The token issuer of minted grants.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.inner.issuer
    }

    /// Turns a create request into a spec, or refuses it. Every decision is audited.
    pub(super) async fn decide(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<Admission, ApiError> {
        let (adm, row) = self.decide_later(tenant, req, what).await?;
        self.record(row).await?;
        Ok(adm)
    }

    /// [`Self::decide`], but an allowed request's policy row is returned for the caller to
    /// write with its next rows (before anything it reports); a refusal's is written here.
    pub(super) async fn decide_later(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<(Admission, NewEventOwned), ApiError> {
        let who = Principal::Tenant(tenant.0.clone());
        let decided = self.inner.gate.admit(&who, req, what);
        let (tier, event) = AuditEvent::of_decision(&decided);
        let row = NewEventOwned {
            tenant: Some(tenant.0.clone()),
            sandbox: None,
            tier,
            event,
        };
        match decided {
            Ok(adm) => Ok((adm, row)),
            Err(d) => {
                self.record(row).await?;
                let e = ApiError::from(d);
                self.inner.metrics.deny(e.code.as_str());
                Err(e)
            }
        }
    }

    /// Reserves a place under the budgets, or says when to retry. A refusal that places
    /// being given back would lift (sandboxes whose teardown has begun, such as the one-shot
    /// run a client has just had its answer from) waits for them, up to
    /// [`TEARDOWN_WAIT`]: a client that runs one thing after another is never refused for
    /// a sandbox it has already let go of.
    pub(super) async fn reserve(
        &self,
        tenant: &Tenant,
        spec: &SandboxSpec,
    ) -> Result<Reservation, ApiError> {
        self.disk_guard()?;
        let rules = self
            .inner
            .gate
            .rules_for(&Principal::Tenant(tenant.0.clone()));
        let deadline = Instant::now() + TEARDOWN_WAIT;
        let reserved = loop {
            match self.inner.ledger.reserve(
                &tenant.0,
                spec.limits.memory_bytes,
                (rules.max_sandboxes, rules.max_memory),
            ) {
                Err(full) if full.pending && Instant::now() < deadline => {
                    tokio::time::sleep(TEARDOWN_POLL).await;
                    // A server that began to stop meanwhile answers so at once.
                    self.stopping()?;
                }
                other => break other,
            }
        };
        match reserved {
            Ok(r) => Ok(r),
            Err(full) => {
                self.inner.metrics.deny("too_many_sandboxes");
                let mut e = ApiError::new(
                    Code::TooManySandboxes,
                    full.message,
                    "destroy sandboxes you no longer need, or retry after the Retry-After seconds",
                );
                e.retry_after = Some(self.inner.cfg.sessions.retry_after_secs.max(1));
                Err(e)
            }
        }
    }

    /// Refuses a new sandbox while the data dir's file system is nearly full: the audit
    /// store must be able to write what every running sandbox does.
    pub(super) fn disk_guard(&self) -> Result<(), ApiError> {
        let need = self.inner.cfg.audit.min_free_disk.0;
        if need == 0 {
            return Ok(());
        }
        let Some(free) = self.data_dir_free() else {
            return Ok(());
        };
        if free >= need {
            return Ok(());
        }
        tracing::error!(
            free,
            need,
            "the data dir's file system is nearly full: new sandboxes are refused"
        );
        Err(self.storage_low(
            "the server is low on storage and takes no new sandboxes for now",
            "retry later; the operator has been told (free space under audit.min_free_disk)",
        ))
    }

    /// Free bytes on the data dir's file system; `None` (logged) when it cannot be read.
    pub(super) fn data_dir_free(&self) -> Option<u64> {
        match nix::sys::statvfs::statvfs(&self.inner.cfg.data_dir) {
            Ok(v) => Some(v.blocks_available().saturating_mul(v.fragment_size())),
            Err(e) => {
                tracing::warn!(error = %e, "reading the data dir's free space");
                None
            }
        }
    }

    /// The `503 storage_low` refusal (naming no host path), counted in the metrics.
    pub(super) fn storage_low(&self, message: &str, fix: &str) -> ApiError {
        self.inner.metrics.deny("storage_low");
        let mut e = ApiError::new(Code::StorageLow, message, fix);
        e.retry_after = Some(60);
        e
    }
}
