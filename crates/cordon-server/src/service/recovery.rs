//! Start-up: the data dir, crash recovery, pool specs.

use super::*;

// ---- startup ---------------------------------------------------------------------------

/// The scratch root a tier's backend should use, under the data dir, so that a restart
/// after a crash can remove what a dead server left there.
pub fn scratch_dir(data_dir: &Path, tier: Tier) -> PathBuf {
    data_dir.join("scratch").join(tier.as_str())
}

pub(super) fn open_and_recover(
    cfg: &Config,
    backends: &Backends,
    hook: Option<RecoveryHook>,
) -> Result<(File, Audit, RecoveryReport), ServerError> {
    let dir = &cfg.data_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("creating the data dir {}", dir.display()), e))?;
    let lock_path = dir.join("cordon.lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| ServerError::io(format!("opening {}", lock_path.display()), e))?;
    if lock_file.try_lock().is_err() {
        return Err(ServerError::Locked(dir.display().to_string()));
    }
    let _ = std::fs::write(&lock_path, format!("{}\n", std::process::id()));
    let audit = Audit::open(&dir.join("audit.db"))?;
    let mut report = RecoveryReport::default();
    let rows = audit.unfinished()?;
    report.sandboxes = rows.iter().map(|r| r.id.clone()).collect();
    // The hook runs even with no unfinished rows: a server killed while a sandbox was being
    // made (before its row was written) leaves host state no row names.
    // Each tier removes what its dead sandboxes left (behind `Backend::recover`); the hook
    // is for callers with more to clean.
    for (tier, backend) in backends {
        let orphans: Vec<String> = rows
            .iter()
            .filter(|r| r.tier == tier.as_str())
            .map(|r| r.id.clone())
            .collect();
        report.removed.extend(backend.recover(&orphans));
    }
    if let Some(h) = &hook {
        report.removed.extend(h(&rows));
    }
    // After the tiers' cleanup: their sandboxes, which held binds of the volumes, are gone.
    report.removed.extend(super::volumes::recover(dir, &audit)?);
    let scratch = dir.join("scratch");
    // Nothing left mounted under it (a volume's bind in a dead sandbox's bundle) may be
    // reached by the removal below.
    cordon_host::volume::unmount_all_under(&scratch);
    if let Ok(tiers) = std::fs::read_dir(&scratch) {
        for t in tiers.flatten() {
            let Ok(entries) = std::fs::read_dir(t.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let removed = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if removed.is_ok() {
                    report.scratch.push(p.display().to_string());
                }
            }
        }
    }
    for tier in Tier::ALL {
        let _ = std::fs::create_dir_all(scratch_dir(dir, tier));
    }
    if !report.sandboxes.is_empty() || !report.scratch.is_empty() || !report.removed.is_empty() {
        for r in &rows {
            audit.sandbox_ended(
                &r.id,
                "recovered",
                "left by a server that stopped without cleanup; removed on restart",
            )?;
        }
        for r in &rows {
            audit.record(&NewEvent {
                tenant: r.tenant.as_deref(),
                sandbox: Some(&r.id),
                kind: "destroy",
                decision: Some("recovered"),
                tier: r.tier.parse().ok(),
                detail: json!({"reason": "crash-recovery", "state_was": r.state}),
            })?;
        }
        audit.record(&NewEvent {
            kind: "recovery",
            detail: serde_json::to_value(&report).unwrap_or_default(),
            ..Default::default()
        })?;
    }
    audit.record(&NewEvent {
        kind: "startup",
        detail: json!({"pid": std::process::id(), "recovered": report.sandboxes.len()}),
        ..Default::default()
    })?;
    Ok((lock_file, audit, report))
}

/// Checks a warm pool's spec as the gate checks a request's (the operator wrote it, so no
/// ceiling applies; a spec that could never be served is refused at start).
pub(super) fn check_pool_spec(spec: &SandboxSpec, gate: &Gate) -> Result<(), String> {
    spec.validate().map_err(|e| e.to_string())?;
    gate.check_max_limits(&spec.limits)?;
    for entry in spec.egress.allow.iter().chain(&spec.egress.deny) {
        cordon_egress::Pattern::parse(entry).map_err(|e| e.to_string())?;
    }
    if matches!(spec.tier, Tier::Runtime | Tier::Wasm) && !spec.egress.is_closed() {
        return Err(format!(
            "the {} tier has no network, so allow_hosts cannot apply",
            spec.tier
        ));
    }
    Ok(())
}
