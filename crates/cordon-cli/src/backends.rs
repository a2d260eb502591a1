//! The tiers this build of Cordon has, dispatched through one enum.

use cordon_core::{Backend, Probe, Result, Sandbox, SandboxSpec, Tier};

/// Every backend compiled into this binary.
pub enum AnyBackend {
    Runtime(cordon_runtime::RuntimeBackend),
    Wasm(cordon_wasm::WasmBackend),
    Container(cordon_container::ContainerBackend),
    Microvm(Box<cordon_microvm::MicrovmBackend>),
    Gvisor(cordon_gvisor::GvisorBackend),
}

impl AnyBackend {
    /// The backend for a tier, or `None` when this build has no such tier.
    pub fn for_tier(tier: Tier) -> Option<Self> {
        match tier {
            Tier::Container => Some(AnyBackend::Container(
                cordon_container::ContainerBackend::new(
                    cordon_container::ContainerConfig::discover(),
                ),
            )),
            Tier::Wasm => Some(AnyBackend::Wasm(cordon_wasm::WasmBackend::new())),
            Tier::Runtime => Some(AnyBackend::Runtime(cordon_runtime::RuntimeBackend::new())),
            Tier::Microvm => Some(AnyBackend::Microvm(Box::new(
                cordon_microvm::MicrovmBackend::new(cordon_microvm::MicrovmConfig::discover()),
            ))),
            Tier::Gvisor => Some(AnyBackend::Gvisor(cordon_gvisor::GvisorBackend::new(
                cordon_gvisor::GvisorConfig::discover(),
            ))),
        }
    }

    fn inner(&self) -> &dyn Backend {
        match self {
            AnyBackend::Runtime(b) => b,
            AnyBackend::Wasm(b) => b,
            AnyBackend::Container(b) => b,
            AnyBackend::Microvm(b) => b.as_ref(),
            AnyBackend::Gvisor(b) => b,
        }
    }
}

impl Backend for AnyBackend {
    fn tier(&self) -> Tier {
        self.inner().tier()
    }

    fn probe(&self) -> Probe {
        self.inner().probe()
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        self.inner().create(spec)
    }
}

/// Every tier this build has, for `cordon serve` and `cordon mcp`: wasm scratch dirs go
/// under the server's data dir so a restart after a crash can remove what was left.
pub fn server_backends(data_dir: &std::path::Path) -> cordon_server::Backends {
    let mut map = cordon_server::Backends::new();
    for tier in Tier::ALL {
        let backend = match tier {
            Tier::Wasm => AnyBackend::Wasm(cordon_wasm::WasmBackend::with_config(
                cordon_wasm::WasmConfig {
                    scratch_root: cordon_server::scratch_dir(data_dir, Tier::Wasm),
                    ..cordon_wasm::WasmConfig::default()
                },
            )),
            other => match AnyBackend::for_tier(other) {
                Some(b) => b,
                None => continue,
            },
        };
        map.insert(
            tier,
            std::sync::Arc::new(backend) as std::sync::Arc<dyn Backend>,
        );
    }
    map
}

/// Cleans up after a server that died without destroying its sandboxes: container
/// sandboxes' cgroups (and every process still in them) and egress socket directories,
/// gvisor sandboxes whose owner is gone. Wasm scratch dirs are removed by the server
/// itself; runtime sandboxes live only in the dead process.
pub fn recovery_hook() -> cordon_server::RecoveryHook {
    std::sync::Arc::new(|rows: &[cordon_server::audit::LiveRow]| {
        let ids: std::collections::BTreeSet<&str> = rows
            .iter()
            .filter(|r| r.tier == Tier::Container.as_str())
            .map(|r| r.id.as_str())
            .collect();
        let mut removed: Vec<String> = if ids.is_empty() {
            Vec::new()
        } else {
            cordon_container::cgroup::reap_orphans(|name| !ids.contains(name))
                .into_iter()
                .map(|name| format!("cgroup cordon/{name} (and its processes)"))
                .collect()
        };
        // A server killed mid-create leaves a cgroup no row names; its init died with the
        // server (parent-death signal), so the cgroup is empty.
        removed.extend(
            cordon_container::cgroup::reap_empty(std::time::Duration::from_secs(1))
                .into_iter()
                .map(|name| format!("empty cgroup cordon/{name}")),
        );
        // Container sandboxes' egress sockets (and CA bundles) whose proxy died with the
        // server.
        removed.extend(
            cordon_container::egress::reap_stale()
                .into_iter()
                .map(|id| format!("egress socket dir of {id}")),
        );
        // gvisor sandboxes whose owner is gone: runsc state, cgroups, bundles, mounts.
        removed.extend(
            cordon_gvisor::GvisorBackend::new(cordon_gvisor::GvisorConfig::discover())
                .reap_orphans()
                .into_iter()
                .map(|what| format!("gvisor: {what}")),
        );
        removed
    })
}
