//! The tiers this build of Cordon has, dispatched through one enum.

use cordon_core::{Backend, Probe, Result, Sandbox, SandboxSpec, Tier};

/// Every backend compiled into this binary.
pub enum AnyBackend {
    Runtime(cordon_runtime::RuntimeBackend),
    Wasm(cordon_wasm::WasmBackend),
    Container(cordon_container::ContainerBackend),
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
            _ => None,
        }
    }

    fn inner(&self) -> &dyn Backend {
        match self {
            AnyBackend::Runtime(b) => b,
            AnyBackend::Wasm(b) => b,
            AnyBackend::Container(b) => b,
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
