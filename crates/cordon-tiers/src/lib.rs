//! The tiers of this build behind one facade: a cargo feature per tier (`runtime`, `wasm`,
//! `container`, `gvisor`, `microvm`), so a binary carries exactly the tiers it names and every
//! caller (`cordon run`, `cordon serve`, `cordon doctor`, the policy step, the measuring
//! tools) asks one place what the build has.
//!
//! Each tier is one arm of an exhaustive `match` on [`Tier`]: a new tier fails to compile here
//! until it says how it is made, and nowhere else names a tier's backend.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use cordon_core::{Backend, Probe, Tier, TierStatus};
use cordon_policy::{BenchFigures, Host, bench_file};

/// Where a backend keeps what it leaves on the host: nowhere of its own (a one-shot run, a
/// probe), or a server's data dir (its scratch dirs and paused sandboxes there, so a restart
/// after a crash finds them).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(any(feature = "wasm", feature = "microvm")),
    allow(
        dead_code,
        reason = "only the wasm and microvm tiers keep files in a server's data dir"
    )
)]
enum Place<'a> {
    Process,
    /// One sandbox in a process that ends with it (`cordon run`): see
    /// [`Tiers::one_shot`].
    OneShot,
    Server(&'a Path),
    /// One sandbox of a root of its own (cordon-oci's container: see [`Own`]).
    Own(&'a Own),
}

/// What a front door that makes one sandbox of a root of its own (cordon-oci: a bundle's
/// root per container) sets on the backend it makes it with. Every field left `None` is
/// the tier's default.
#[derive(Debug, Default)]
pub struct Own {
    /// The host id pool the container tier takes the sandbox's ids from: one range made
    /// for the root (a writable root's idmapped layers are mapped onto exactly it).
    pub ids: Option<cordon_host::idpool::IdPool>,
    /// Where the microvm tier makes the root's disk (each root is a disk of its own, made
    /// at every start; no snapshot: one would be made with a cold boot and kept in the
    /// shared store, so every VM boots).
    pub root_disk: Option<std::path::PathBuf>,
    /// The cgroup (below each hierarchy's root) the sandbox's own cgroup is made in: the
    /// pod's, as the kubelet named it (`cordon_host::cgroup::place`). `None`: Cordon's.
    pub cgroup_parent: Option<String>,
    /// The pod's network namespace the sandbox joins (a tier with
    /// [`cordon_core::Features::pod_network`]; cordon-oci resolves and walls it first, ADR
    /// 0029). `None`: the tier's own network.
    pub netns: Option<std::path::PathBuf>,
    /// The loopback port of the sandbox's egress forwarder, when a pod's containers share
    /// one loopback. `None`: the tier's default.
    pub proxy_port: Option<u16>,
}

/// The tiers of this build.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tiers;

impl Tiers {
    /// The backend of `tier`, or `None` when this build does not carry it.
    pub fn backend(&self, tier: Tier) -> Option<Box<dyn Backend>> {
        make(tier, Place::Process)
    }

    /// The backend of `tier` for a process that makes one sandbox and ends with it (`cordon
    /// run`): on the container tier the sandbox's init finishes its teardown after the
    /// process has returned, holding its ids until then (ADR 0044). Never for a process
    /// that goes on making sandboxes: each one's ids stay leased until it exits.
    pub fn one_shot(&self, tier: Tier) -> Option<Box<dyn Backend>> {
        make(tier, Place::OneShot)
    }

    /// The backend of `tier` for one sandbox of a root of its own (`own`), or `None` when
    /// this build does not carry it.
    pub fn backend_for(&self, tier: Tier, own: &Own) -> Option<Box<dyn Backend>> {
        make(tier, Place::Own(own))
    }

    /// The tiers this build carries.
    pub fn compiled(&self) -> Vec<Tier> {
        Tier::ALL.iter().copied().filter(|&t| carried(t)).collect()
    }

    /// What `tier` needs and what this host has (`cordon doctor`); a tier this build does not
    /// carry is unavailable, and says so.
    pub fn probe(&self, tier: Tier) -> Probe {
        match self.backend(tier) {
            Some(b) => b.probe(),
            None => Probe {
                tier,
                status: TierStatus::Unavailable,
                capabilities: Vec::new(),
                notes: vec![format!(
                    "the {tier} tier is not part of this build of cordon; use cordon-full, \
                     which carries every tier"
                )],
            },
        }
    }

    /// The host as the policy step sees it: which of `fits` are available (`only` replaces
    /// the probe, for what-if questions) and the last bench's figures in `data_dir`.
    pub fn probe_host(&self, only: Option<&[Tier]>, fits: &[Tier], data_dir: &Path) -> Host {
        let available = match only {
            Some(ts) => ts.iter().copied().filter(|t| fits.contains(t)).collect(),
            None => fits
                .iter()
                .copied()
                .filter(|t| self.backend(*t).is_some_and(|b| b.probe().available()))
                .collect(),
        };
        let file = bench_file(data_dir);
        let bench =
            std::fs::read_to_string(&file).ok().and_then(
                |text| match BenchFigures::from_bench_json(&text) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::warn!("ignoring {}: {e}", file.display());
                        None
                    }
                },
            );
        Host { available, bench }
    }

    /// Every tier of this build for a server whose data dir is `data_dir`.
    pub fn server_backends(&self, data_dir: &Path) -> BTreeMap<Tier, Arc<dyn Backend>> {
        Tier::ALL
            .iter()
            .filter_map(|&t| make(t, Place::Server(data_dir)).map(|b| (t, Arc::from(b))))
            .collect()
    }

    /// Records a decision of `cordon run`'s policy step in `<data dir>/cli/audit.db` (the
    /// server's store format: `cordon audit --data-dir <data dir>/cli`) before anything runs.
    pub fn audit(
        &self,
        decided: &Result<cordon_engine::Admission, cordon_engine::Denial>,
        data_dir: &Path,
    ) -> Result<(), AuditError> {
        audit::record(decided, data_dir)
    }
}

/// The policy step's decision could not be recorded: nothing runs unaudited.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "recording the policy decision in {dir}/audit.db: {reason}; make the data dir \
         writable, or set CORDON_HOME to one that is"
    )]
    Store { dir: String, reason: String },
    #[error(
        "the policy step's audit is not part of this build of cordon: run `cordon run` \
         through cordon-full"
    )]
    NotCarried,
}

#[cfg(feature = "audit")]
mod audit {
    use std::path::Path;

    use cordon_engine::audit::{Audit, AuditEvent, NewEvent};

    use super::AuditError;

    pub(super) fn record(
        decided: &Result<cordon_engine::Admission, cordon_engine::Denial>,
        data_dir: &Path,
    ) -> Result<(), AuditError> {
        let dir = data_dir.join("cli");
        let fail = |reason: String| AuditError::Store {
            dir: dir.display().to_string(),
            reason,
        };
        std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
        let store = Audit::open(&dir.join("audit.db")).map_err(|e| fail(e.to_string()))?;
        let user = std::env::var("USER").unwrap_or_else(|_| "local".to_string());
        let (tier, event) = AuditEvent::of_decision(decided);
        store
            .record(&NewEvent {
                tenant: Some(&format!("cli:{user}")),
                sandbox: None,
                tier,
                event,
            })
            .map(drop)
            .map_err(|e| fail(e.to_string()))
    }
}

#[cfg(not(feature = "audit"))]
mod audit {
    use std::path::Path;

    use super::AuditError;

    pub(super) fn record(
        _decided: &Result<cordon_engine::Admission, cordon_engine::Denial>,
        _data_dir: &Path,
    ) -> Result<(), AuditError> {
        Err(AuditError::NotCarried)
    }
}

/// Whether this build carries `tier`.
fn carried(tier: Tier) -> bool {
    match tier {
        Tier::Runtime => cfg!(feature = "runtime"),
        Tier::Wasm => cfg!(feature = "wasm"),
        Tier::Container => cfg!(feature = "container"),
        Tier::Gvisor => cfg!(feature = "gvisor"),
        Tier::Microvm => cfg!(feature = "microvm"),
    }
}

/// The backend of `tier` for `place`, if this build carries it.
fn make(tier: Tier, place: Place<'_>) -> Option<Box<dyn Backend>> {
    match tier {
        Tier::Runtime => runtime(place),
        Tier::Wasm => wasm(place),
        Tier::Container => container(place),
        Tier::Gvisor => gvisor(place),
        Tier::Microvm => microvm(place),
    }
}

#[cfg(feature = "runtime")]
fn runtime(_: Place<'_>) -> Option<Box<dyn Backend>> {
    Some(Box::new(cordon_runtime::RuntimeBackend::new()))
}

#[cfg(feature = "wasm")]
fn wasm(place: Place<'_>) -> Option<Box<dyn Backend>> {
    Some(Box::new(match place {
        Place::Process | Place::OneShot | Place::Own(_) => cordon_wasm::WasmBackend::new(),
        // Scratch dirs under the server's data dir, so a restart after a crash removes what
        // was left.
        Place::Server(data_dir) => cordon_wasm::WasmBackend::with_config(cordon_wasm::WasmConfig {
            scratch_root: cordon_core::scratch_dir(data_dir, Tier::Wasm),
            ..cordon_wasm::WasmConfig::default()
        }),
    }))
}

#[cfg(feature = "container")]
fn container(place: Place<'_>) -> Option<Box<dyn Backend>> {
    let mut config = cordon_container::ContainerConfig::discover();
    // A server makes sandboxes all its life: a thread of its own makes the memory cgroups
    // its creates take (cordon_host::cgroup::pool), off their path.
    if let Place::Server(_) = place
        && let Some(parent) = cordon_host::cgroup::pool_parent()
    {
        cordon_host::cgroup::pool::keep_stocked(parent);
    }
    config.end_in_init = matches!(place, Place::OneShot);
    // A one-shot run keeps the host's boot id: no other tenant shares it (ADR 0047).
    config.own_boot_id = !matches!(place, Place::OneShot);
    if let Place::Own(own) = place {
        if let Some(ids) = &own.ids {
            config.ids = ids.clone();
        }
        config.cgroup_parent = own.cgroup_parent.clone();
        config.netns = own.netns.clone();
        config.proxy_port = own.proxy_port;
    }
    Some(Box::new(cordon_container::ContainerBackend::new(config)))
}

#[cfg(feature = "gvisor")]
fn gvisor(place: Place<'_>) -> Option<Box<dyn Backend>> {
    let mut config = cordon_gvisor::GvisorConfig::discover();
    if let Place::Own(own) = place {
        config.cgroup_parent = own.cgroup_parent.clone();
        config.netns = own.netns.clone();
        config.proxy_port = own.proxy_port;
    }
    Some(Box::new(cordon_gvisor::GvisorBackend::new(config)))
}

#[cfg(feature = "microvm")]
fn microvm(place: Place<'_>) -> Option<Box<dyn Backend>> {
    let mut cfg = cordon_microvm::MicrovmConfig::discover();
    match place {
        // Sandboxes paused to disk live in the server's data dir, beside its records.
        Place::Server(data_dir) => cfg.paused_dir = data_dir.join("paused").join("microvm"),
        Place::Own(own) => {
            cfg.snapshots = false;
            cfg.root_disk = own.root_disk.clone();
            cfg.cgroup_parent = own.cgroup_parent.clone();
        }
        Place::Process | Place::OneShot => {}
    }
    Some(Box::new(cordon_microvm::MicrovmBackend::new(cfg)))
}

/// The tiers this build leaves out: each answers `None`.
macro_rules! absent {
    ($($name:ident: $feature:literal),* $(,)?) => {
        $(
            #[cfg(not(feature = $feature))]
            fn $name(_: Place<'_>) -> Option<Box<dyn Backend>> {
                None
            }
        )*
    };
}

absent!(
    runtime: "runtime",
    wasm: "wasm",
    container: "container",
    gvisor: "gvisor",
    microvm: "microvm",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_carries_the_tiers_its_features_name() {
        let t = Tiers;
        for tier in Tier::ALL {
            assert_eq!(t.backend(tier).is_some(), carried(tier), "{tier}");
            assert_eq!(t.compiled().contains(&tier), carried(tier), "{tier}");
            if let Some(b) = t.backend(tier) {
                assert_eq!(b.tier(), tier);
            } else {
                assert_eq!(t.probe(tier).status, TierStatus::Unavailable);
            }
        }
        let dir = std::env::temp_dir();
        let served = t.server_backends(&dir);
        assert_eq!(served.keys().copied().collect::<Vec<_>>(), t.compiled());
    }
}
