//! Admission: the gate's decision, the tenant's and the server's budgets, the disk guard.
//! Below every other component: it knows the gate, the ledger and the audit, no sandbox.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_core::SandboxSpec;
use cordon_engine::{Admission, Gate, Ledger, Principal, Reservation, Resolved};

use super::common::{Life, NewEventOwned, Recorder};
use crate::audit::AuditEvent;
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::metrics::Metrics;
use crate::model::CreateRequest;

/// How long a new sandbox waits for places under the limits that are being given back
/// (teardowns under way) before it is refused, and how often it looks.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);
const TEARDOWN_POLL: Duration = Duration::from_millis(5);

/// The gate's decisions and the places under the budgets.
#[derive(Clone)]
pub struct Admit {
    /// The gate every create and run passes: the operator's ceiling, the grant catalogue
    /// and the tier policy.
    pub(super) gate: Arc<Gate>,
    /// Sandboxes and memory held, per tenant and in all.
    pub(super) ledger: Arc<Ledger>,
    pub(super) audit: Recorder,
    pub(super) metrics: Arc<Metrics>,
    pub(super) life: Life,
    pub(super) data_dir: PathBuf,
    /// `audit.min_free_disk`: the free space new sandboxes leave the data dir.
    pub(super) min_free_disk: u64,
    /// The Retry-After of a refusal for a full budget.
    pub(super) retry_after_secs: u64,
}

impl Admit {
    /// The gate every create and run passes.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A tenant's rules, the operator's ceiling's defaults applied.
    pub(super) fn rules(&self, tenant: &Tenant) -> Resolved {
        self.gate.rules_for(&Principal::Tenant(tenant.0.clone()))
    }

    /// Turns a create request into a spec, or refuses it. Every decision is audited.
    pub(super) async fn decide(
        &self,
        tenant: &Tenant,
        req: &CreateRequest,
        what: &str,
    ) -> Result<Admission, ApiError> {
        let (adm, row) = self.decide_later(tenant, req, what).await?;
        self.audit.record(row).await?;
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
        let decided = self.gate.admit(&who, req, what);
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
                self.audit.record(row).await?;
                let e = ApiError::from(d);
                self.metrics.deny(e.code.as_str());
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
        let rules = self.rules(tenant);
        let deadline = Instant::now() + TEARDOWN_WAIT;
        let reserved = loop {
            match self.ledger.reserve(
                &tenant.0,
                spec.limits.memory_bytes,
                (rules.max_sandboxes, rules.max_memory),
            ) {
                Err(full) if full.pending && Instant::now() < deadline => {
                    tokio::time::sleep(TEARDOWN_POLL).await;
                    // A server that began to stop meanwhile answers so at once.
                    self.life.stopping()?;
                }
                other => break other,
            }
        };
        match reserved {
            Ok(mut r) => {
                let n = super::descriptors::per_sandbox(spec.tier);
                if n == 0 {
                    return Ok(r);
                }
                match self.ledger.hold_descriptors(&mut r, n) {
                    Ok(()) => Ok(r),
                    Err(full) => {
                        self.metrics.deny("resource_busy");
                        tracing::warn!(
                            tier = %spec.tier,
                            "a create was refused: {}",
                            full.message
                        );
                        let mut e = ApiError::new(
                            Code::ResourceBusy,
                            format!(
                                "this server cannot hold another {} sandbox: {}",
                                spec.tier, full.message
                            ),
                            "destroy sandboxes you no longer need, or retry after the \
                             Retry-After seconds; the operator can raise the server's \
                             descriptor limit (ulimit -n)",
                        );
                        e.retry_after = Some(self.retry_after_secs.max(1));
                        Err(e)
                    }
                }
            }
            Err(full) => {
                self.metrics.deny("too_many_sandboxes");
                let mut e = ApiError::new(
                    Code::TooManySandboxes,
                    full.message,
                    "destroy sandboxes you no longer need, or retry after the Retry-After seconds",
                );
                e.retry_after = Some(self.retry_after_secs.max(1));
                Err(e)
            }
        }
    }

    /// Refuses a new sandbox while the data dir's file system is nearly full: the audit
    /// store must be able to write what every running sandbox does.
    pub(super) fn disk_guard(&self) -> Result<(), ApiError> {
        let need = self.min_free_disk;
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
        match nix::sys::statvfs::statvfs(&self.data_dir) {
            Ok(v) => Some(v.blocks_available().saturating_mul(v.fragment_size())),
            Err(e) => {
                tracing::warn!(error = %e, "reading the data dir's free space");
                None
            }
        }
    }

    /// The `503 storage_low` refusal (naming no host path), counted in the metrics.
    pub(super) fn storage_low(&self, message: &str, fix: &str) -> ApiError {
        self.metrics.deny("storage_low");
        let mut e = ApiError::new(Code::StorageLow, message, fix);
        e.retry_after = Some(60);
        e
    }
}
