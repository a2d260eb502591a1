//! The reaper: TTLs, idle timeouts, audit retention and the store's size bound.

use super::*;

impl Service {
    // ---- background tasks ------------------------------------------------------------

    pub(super) async fn reaper(self) {
        let every = self.inner.cfg.sessions.reap_interval.0;
        let paused_ttl = self.inner.cfg.sessions.paused_ttl.0;
        let mut last_retention: Option<Instant> = None;
        let mut last_trim: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let expired: Vec<(Arc<Session>, &'static str)> = lock(&self.inner.sessions)
                .values()
                .filter_map(|s| {
                    let reason = s.expired(paused_ttl)?;
                    s.begin_ending(reason).then(|| (s.clone(), reason))
                })
                .collect();
            for (s, reason) in expired {
                let svc = self.clone();
                self.inner.destroys.spawn(async move {
                    if let Err(e) = svc.destroy_session(s, reason).await {
                        tracing::warn!(error = %e, "reaping a sandbox");
                    }
                });
            }
            if last_trim.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                last_trim = Some(Instant::now());
                let audit = self.inner.audit.clone();
                let max = self.inner.cfg.audit.max_size.0;
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
                let audit = self.inner.audit.clone();
                let days = self.inner.cfg.audit.retention_days;
                if let Ok(Err(e)) =
                    tokio::task::spawn_blocking(move || audit.apply_retention(days)).await
                {
                    tracing::warn!(error = %e, "audit retention");
                }
            }
        }
    }
}
