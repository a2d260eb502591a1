//! The node's audit store as `cordon-oci` writes it: the gate's decision on each container
//! (a `policy` row, with the node allowances it used) and every decision of the container's
//! egress proxy (an `egress` row each, folded as `cordon serve` folds them, and a
//! `grant_use` row per request that carried a grant). Read with `cordon audit --data-dir`.

use std::path::{Path, PathBuf};

use cordon_core::{Details, EgressEvent, EgressFold, ExecOutcome, ExecRequest};
use cordon_core::{OutputSink, ProcOutput, ProcSignal, Sandbox, SandboxId};
use cordon_engine::audit::{Audit, AuditEvent, GrantUse, NewEvent};

use crate::Result;
pub use crate::error::{AuditError, AuditFailure};
use crate::node::{DEFAULT_AUDIT, NodeConfig, TENANT};

/// At most this many distinct ordinary egress rows per drain: a flood beyond them is one
/// `truncated` row with a count (exfiltration and grant rows always go in).
const MAX_EGRESS_ROWS: usize = 200;

/// The node's audit store, open.
pub struct NodeAudit {
    store: Audit,
}

impl NodeAudit {
    /// The store the node's config names (default [`DEFAULT_AUDIT`]), made if missing.
    pub fn open(node: &NodeConfig) -> std::result::Result<Self, AuditError> {
        let path = node
            .audit
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_AUDIT));
        Self::open_at(&path)
    }

    fn open_at(path: &Path) -> std::result::Result<Self, AuditError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        // Root's alone: the rows name every container, its annotations, the hosts it
        // reached and the node allowances it used. A directory made here is 0700; the
        // store and its journal files are 0600 (SQLite gives its journals the store's mode;
        // a store made before this is made private here).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(AuditFailure::Dir)?;
        }
        let private = std::fs::Permissions::from_mode(0o600);
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .and_then(|f| f.set_permissions(private.clone()))
            .map_err(AuditFailure::Dir)?;
        let store = Audit::open(path).map_err(AuditFailure::Store)?;
        for journal in ["-wal", "-shm", "-journal"] {
            let mut p = path.as_os_str().to_owned();
            p.push(journal);
            match std::fs::set_permissions(&p, private.clone()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(AuditFailure::Dir(e).into());
                }
                _ => {}
            }
        }
        Ok(NodeAudit { store })
    }

    /// A gate decision on container `id` (its record names the node allowances it used).
    pub fn decision(
        &self,
        id: &str,
        decided: &std::result::Result<cordon_engine::Admission, cordon_engine::Denial>,
    ) -> std::result::Result<(), AuditError> {
        let (tier, event) = AuditEvent::of_decision(decided);
        self.store
            .record(&NewEvent {
                tenant: Some(TENANT),
                sandbox: Some(id),
                tier,
                event,
            })
            .map(drop)
            .map_err(|e| AuditFailure::Store(e).into())
    }

    /// Egress decisions of container `id`'s proxy (its sandbox on `tier`, of kubelet pod
    /// `pod` where it is one's), folded, each row naming the pod, with a `grant_use` row for
    /// each allowed request that carried a grant.
    pub fn egress(
        &self,
        id: &str,
        pod: Option<&str>,
        tier: cordon_core::Tier,
        events: Vec<EgressEvent>,
    ) -> std::result::Result<(), AuditError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut fold = EgressFold::new(MAX_EGRESS_ROWS);
        for ev in events {
            fold.push(ev);
        }
        let tier = Some(tier);
        let mut rows = Vec::new();
        for mut ev in fold.take() {
            ev.pod = pod.map(str::to_string);
            rows.extend(GrantUse::of(&ev).into_iter().map(AuditEvent::GrantUse));
            rows.push(AuditEvent::Egress(ev));
        }
        let rows: Vec<NewEvent> = rows
            .into_iter()
            .map(|event| NewEvent {
                tenant: Some(TENANT),
                sandbox: Some(id),
                tier,
                event,
            })
            .collect();
        self.store
            .record_all(&rows)
            .map_err(|e| AuditFailure::Store(e).into())
    }
}

/// A container's sandbox whose egress decisions go into the node's audit store as they
/// are made: drained whenever the monitor reads or signals a process and when the sandbox
/// is destroyed. Everything else is the sandbox's own (the container tier's own calls, such
/// as a start with passed stdio, through [`Audited::inner`]).
pub struct Audited {
    inner: Box<dyn Sandbox>,
    audit: NodeAudit,
    container: String,
    /// The tier its sandbox runs on (its egress rows say so).
    tier: cordon_core::Tier,
    /// What a drain took from the sandbox's report besides its egress decisions (which are
    /// in the store, not kept here), for the next caller of [`Sandbox::report`].
    kept: Details,
    /// The kubelet pod it belongs to (`namespace/name`), named on each of its egress rows.
    pod: Option<String>,
}

impl Audited {
    pub fn new(
        inner: Box<dyn Sandbox>,
        audit: NodeAudit,
        container: &str,
        tier: cordon_core::Tier,
    ) -> Self {
        Audited {
            inner,
            audit,
            container: container.to_string(),
            tier,
            kept: Details::default(),
            pod: None,
        }
    }

    /// Names the kubelet pod the container belongs to on its egress rows, from containerd's
    /// CRI annotations on its bundle (`io.kubernetes.cri.sandbox-namespace` and `-name`).
    pub fn in_pod(mut self, annotations: &std::collections::BTreeMap<String, String>) -> Self {
        let get = |k: &str| annotations.get(k).filter(|v| !v.is_empty());
        if let (Some(ns), Some(name)) = (
            get("io.kubernetes.cri.sandbox-namespace"),
            get("io.kubernetes.cri.sandbox-name"),
        ) {
            self.pod = Some(format!("{ns}/{name}"));
        }
        self
    }

    /// The tier its sandbox runs on.
    pub fn tier(&self) -> cordon_core::Tier {
        self.tier
    }

    /// The sandbox itself (a process started on it is read through [`Audited`], whose
    /// reads record its egress decisions).
    pub fn inner(&mut self) -> &mut dyn Sandbox {
        self.inner.as_mut()
    }

    /// Records the egress decisions made since the last drain. A row that cannot be
    /// written is reported on the monitor's stderr (the engine's log); the container runs on.
    fn drain(&mut self) {
        let mut d = self.inner.report();
        let events = std::mem::take(&mut d.egress);
        if let Err(e) = self
            .audit
            .egress(&self.container, self.pod.as_deref(), self.tier, events)
        {
            // Never a panic: the engine may have closed the monitor's stderr.
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("cordon-oci: container {}: {e}\n", self.container),
            );
        }
        self.kept.merge(d);
    }
}

impl Sandbox for Audited {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }

    fn exec(
        &mut self,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> cordon_core::Result<ExecOutcome> {
        let o = self.inner.exec(req, sink);
        self.drain();
        o
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> cordon_core::Result<()> {
        self.inner.put_file(path, data, mode)
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> cordon_core::Result<Vec<u8>> {
        self.inner.get_file(path, max_bytes)
    }

    fn file_op(&mut self, op: &cordon_core::FileOp) -> cordon_core::Result<cordon_core::FileReply> {
        self.inner.file_op(op)
    }

    fn put_archive(
        &mut self,
        dir: &str,
        tar: &mut dyn std::io::Read,
    ) -> cordon_core::Result<cordon_core::ArchiveReport> {
        self.inner.put_archive(dir, tar)
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> cordon_core::Result<cordon_core::ArchiveReport> {
        self.inner.get_archive(dir, max_bytes, out)
    }

    fn start_background(&mut self, req: &ExecRequest) -> cordon_core::Result<u64> {
        self.inner.start_background(req)
    }

    fn read_background(
        &mut self,
        id: u64,
        from: [u64; 2],
        max: u64,
    ) -> cordon_core::Result<ProcOutput> {
        let out = self.inner.read_background(id, from, max);
        self.drain();
        out
    }

    fn write_background(&mut self, id: u64, data: &[u8]) -> cordon_core::Result<()> {
        self.inner.write_background(id, data)
    }

    fn start_attached(
        &mut self,
        req: &ExecRequest,
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
        terminal: bool,
        user: Option<cordon_core::ProcUser>,
    ) -> cordon_core::Result<u64> {
        self.inner.start_attached(req, stdio, terminal, user)
    }

    fn open_terminal(
        &mut self,
        size: cordon_core::PtySize,
    ) -> cordon_core::Result<cordon_core::Terminal> {
        self.inner.open_terminal(size)
    }

    fn start_relayed(
        &mut self,
        req: &ExecRequest,
        user: Option<cordon_core::ProcUser>,
    ) -> cordon_core::Result<u64> {
        self.inner.start_relayed(req, user)
    }

    fn raise_background(&mut self, id: u64, signal: i32, all: bool) -> cordon_core::Result<()> {
        let r = self.inner.raise_background(id, signal, all);
        self.drain();
        r
    }

    fn signal_background(&mut self, id: u64, signal: ProcSignal) -> cordon_core::Result<()> {
        let r = self.inner.signal_background(id, signal);
        self.drain();
        r
    }

    fn resize_background(
        &mut self,
        id: u64,
        size: cordon_core::PtySize,
    ) -> cordon_core::Result<()> {
        self.inner.resize_background(id, size)
    }

    fn pause(&mut self) -> cordon_core::Result<()> {
        self.inner.pause()
    }

    fn pause_to_disk(&mut self) -> cordon_core::Result<u64> {
        self.inner.pause_to_disk()
    }

    fn on_disk_bytes(&self) -> Option<u64> {
        self.inner.on_disk_bytes()
    }

    fn resume(&mut self) -> cordon_core::Result<()> {
        self.inner.resume()
    }

    fn resize(&mut self, memory_bytes: u64, cpus: f64) -> cordon_core::Result<()> {
        self.inner.resize(memory_bytes, cpus)
    }

    fn start_us(&self) -> u64 {
        self.inner.start_us()
    }

    fn destroy(&mut self) -> cordon_core::Result<()> {
        // The last decisions first: the proxy goes with the sandbox.
        self.drain();
        self.inner.destroy()
    }

    fn report(&mut self) -> Details {
        self.drain();
        std::mem::take(&mut self.kept)
    }

    fn interrupter(&self) -> Option<cordon_core::Interrupter> {
        self.inner.interrupter()
    }

    fn set_owner(&mut self, owner: &str) {
        self.inner.set_owner(owner)
    }
}

/// Opens the node's store and records a gate decision on container `id`.
pub fn record_decision(
    node: &NodeConfig,
    id: &str,
    decided: &std::result::Result<cordon_engine::Admission, cordon_engine::Denial>,
) -> Result<NodeAudit> {
    let audit = NodeAudit::open(node)?;
    audit.decision(id, decided)?;
    Ok(audit)
}

/// Records a refusal made before the gate (the bundle's check or its annotations: privileged
/// mode, a host namespace, a host device, an unknown annotation) as a `policy` row refused,
/// like the gate's own refusals; `req` is what the bundle asked for, as far as it was read.
/// Any other error is not a decision and records nothing.
pub fn record_refusal(
    node: &NodeConfig,
    id: &str,
    req: &cordon_engine::SandboxRequest,
    refused: &crate::OciError,
) -> Result<()> {
    use crate::OciError as E;
    use cordon_engine::{DenyCode, GateRule};
    let (code, rule, message, fix) = match refused {
        E::Refused { what, fix } => (
            DenyCode::PolicyDenied,
            GateRule::OciBundle,
            what.clone(),
            fix.as_str(),
        ),
        E::Invalid(_)
        | E::BundleConfig { .. }
        | E::Annotation { .. }
        | E::UnknownAnnotation { .. } => (
            DenyCode::InvalidRequest,
            GateRule::Request,
            refused.to_string(),
            "fix the container's config.json or its annotations",
        ),
        _ => return Ok(()),
    };
    let gate = node.gate()?;
    let denial = gate.refusal(
        &cordon_engine::Principal::Tenant(TENANT.into()),
        req,
        "oci create",
        code,
        rule,
        &message,
        fix,
    );
    record_decision(node, id, &Err(denial)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// The node's audit store, its journal files and a directory made for it are root's
    /// alone, a store made wider before included: another local user reads no row of it
    /// (issue 44, item 17).
    #[test]
    fn the_nodes_audit_store_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("made/audit.db");
        let node = NodeConfig {
            audit: Some(path.clone()),
            ..NodeConfig::default()
        };
        let who = cordon_engine::Principal::Tenant(TENANT.into());
        let decided =
            node.gate()
                .unwrap()
                .admit(&who, &cordon_engine::SandboxRequest::default(), "t");
        record_decision(&node, "c1", &decided).unwrap();
        assert_eq!(mode(&dir.path().join("made")), 0o700);
        for f in ["audit.db", "audit.db-wal", "audit.db-shm"] {
            let p = dir.path().join("made").join(f);
            if f == "audit.db" || p.exists() {
                assert_eq!(mode(&p), 0o600, "{f}");
            }
        }
        // A store another version left readable by all is made private when opened.
        let old = dir.path().join("old.db");
        drop(Audit::open(&old).unwrap());
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        let node = NodeConfig {
            audit: Some(old.clone()),
            ..NodeConfig::default()
        };
        record_decision(&node, "c2", &decided).unwrap();
        assert_eq!(mode(&old), 0o600);
    }
}
