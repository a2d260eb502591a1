//! [`FullTiers`]: every tier of this build, as `cordon run` (with the policy step's probe and
//! audit record) and the measuring tools take them.

use cordon_core::{Backend, Tier};

use crate::backends::{self, AnyBackend};
use crate::policy;

/// Every tier of this build for `cordon run`, with the policy step's probe and audit record.
pub struct FullTiers;

impl cordon_front::run::Tiers for FullTiers {
    fn backend(&self, tier: Tier) -> Option<Box<dyn Backend>> {
        AnyBackend::for_tier(tier).map(|b| Box::new(b) as Box<dyn Backend>)
    }

    fn probe_host(&self, fits: &[Tier], data_dir: &std::path::Path) -> cordon_policy::Host {
        policy::probe_host(None, fits, data_dir)
    }

    fn audit(
        &self,
        decided: &std::result::Result<cordon_engine::Admission, cordon_engine::Denial>,
        data_dir: &std::path::Path,
    ) -> anyhow::Result<()> {
        policy::audit_record(decided, data_dir)
    }
}

/// The same tiers for the measuring tools (`cordon bench`, `cordon serve --bench`).
impl cordon_measure::Tiers for FullTiers {
    fn backend(&self, tier: Tier) -> Option<Box<dyn Backend>> {
        cordon_front::run::Tiers::backend(self, tier)
    }

    fn server_backends(&self, data_dir: &std::path::Path) -> cordon_server::Backends {
        backends::server_backends(data_dir)
    }
}
