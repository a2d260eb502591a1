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

    fn recover(&self, orphans: &[String]) -> Vec<String> {
        self.inner().recover(orphans)
    }

    fn create_unprepared(&self, spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        self.inner().create_unprepared(spec)
    }

    fn revive(&self, id: &str) -> Option<Result<Box<dyn Sandbox>>> {
        self.inner().revive(id)
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
            // Sandboxes paused to disk live in the server's data dir, beside its records.
            Tier::Microvm => {
                let mut cfg = cordon_microvm::MicrovmConfig::discover();
                cfg.paused_dir = data_dir.join("paused").join("microvm");
                AnyBackend::Microvm(Box::new(cordon_microvm::MicrovmBackend::new(cfg)))
            }
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
