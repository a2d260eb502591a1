//! The reaper: TTLs, idle timeouts (a destroy, or a pause where the create asked for one:
//! the timeout component), audit retention and the store's size bound. Uses the sessions and
//! the timeout action; nothing uses it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_core::Feature;

use super::sessions::{PauseMode, Session, Sessions};
use crate::error::Code;

/// What the reaper does and how often.
pub(super) struct Reaper {
    pub(super) sessions: Sessions,
    /// `sessions.reap_interval`.
    pub(super) every: Duration,
    /// `sessions.paused_ttl`: how long a sandbox may stay paused.
    pub(super) paused_ttl: Duration,
    /// `audit.max_size`, in bytes.
    pub(super) max_size: u64,
    /// `audit.retention_days`.
    pub(super) retention_days: u64,
}

impl Reaper {
    pub(super) async fn run(self) {
        let every = self.every;
        let paused_ttl = self.paused_ttl;
        let life = self.sessions.life.clone();
        let mut last_retention: Option<Instant> = None;
        let mut last_trim: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = life.cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let expired: Vec<(Arc<Session>, &'static str)> = self
                .sessions
                .all()
                .into_iter()
                .filter_map(|s| {
                    let reason = s.expired(paused_ttl)?;
                    if pause_at_timeout(&self.sessions, &s, reason) {
                        return None;
                    }
                    s.begin_ending(reason).then_some((s, reason))
                })
                .collect();
            for (s, reason) in expired {
                let sessions = self.sessions.clone();
                life.destroys.spawn(async move {
                    if let Err(e) = sessions.destroy_session(s, reason).await {
                        tracing::warn!(error = %e, "reaping a sandbox");
                    }
                });
            }
            if last_trim.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                last_trim = Some(Instant::now());
                let audit = self.sessions.audit.store.clone();
                let max = self.max_size;
                match tokio::task::spawn_blocking(move || audit.trim_to(max)).await {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::warn!(
                        rows = n,
                        "the audit store reached audit.max_size: its oldest rows were deleted"
                    ),
                    Ok(Err(e)) => tracing::warn!(error = %e, "audit size bound"),
                    Err(_) => {}
                }
            }
            if last_retention.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
                last_retention = Some(Instant::now());
                let audit = self.sessions.audit.store.clone();
                let days = self.retention_days;
                if let Ok(Err(e)) =
                    tokio::task::spawn_blocking(move || audit.apply_retention(days)).await
                {
                    tracing::warn!(error = %e, "audit retention");
                }
            }
        }
    }
}

/// For a session whose TTL or idle timeout (`reason`) came: true when its timeout pauses
/// it (a pause is then under way, or waits for its running exec to end: every exec is
/// bounded by its own timeout), false when it is to be destroyed. A pause that fails for
/// another reason than a request in between (the tier refused it, the tenant's
/// `max_paused_bytes` is full) destroys it as a plain timeout would.
fn pause_at_timeout(sessions: &Sessions, s: &Arc<Session>, reason: &'static str) -> bool {
    if !s.timeout.pauses() || !matches!(reason, "ttl" | "idle") {
        return false;
    }
    if s.busy.load(std::sync::atomic::Ordering::Acquire) || !s.timeout.begin_pausing() {
        return true;
    }
    let (me, s) = (sessions.clone(), s.clone());
    sessions.life.destroys.spawn(async move {
        let mode = if s.timeout.action() == cordon_engine::OnTimeout::PauseFiles {
            PauseMode::Files
        } else if s.tier.features().has(Feature::PauseToDisk) {
            PauseMode::ToDisk
        } else {
            PauseMode::Memory
        };
        let r = me.pause(&s.tenant, &s.id, mode).await;
        s.timeout.end_pausing(r.is_ok());
        match r {
            Ok(_) => tracing::info!(sandbox = %s.id, reason, "paused at its timeout"),
            // Claimed by a request in between: the next round tries again.
            Err(e) if e.code == Code::SandboxBusy => {}
            Err(e) => {
                tracing::warn!(sandbox = %s.id, error = %e, "pausing at its timeout failed: destroying it");
                if s.begin_ending(reason)
                    && let Err(e) = me.destroy_session(s.clone(), reason).await
                {
                    tracing::warn!(error = %e, "reaping a sandbox");
                }
            }
        }
    });
    true
}
