//! The server's descriptor table as a budget: what each live sandbox of a tier holds, what
//! the connections and the rest of the process keep, and how many sandboxes that allows.
//! A create past it is refused at admission (`429 resource_busy`), never an accept that
//! fails for every tenant once the table is full (issue 49).

use cordon_core::Tier;

/// Descriptors of the server's process one live sandbox of `tier` holds
/// ([`cordon_core::Features::server_descriptors`], where each tier's figure and how it was
/// measured are written down).
pub fn per_sandbox(tier: Tier) -> u64 {
    tier.features().server_descriptors
}

/// Raises the process's soft descriptor limit to its hard limit (as the wasm tier does at
/// its start), so the plan shares all the operator allowed; a failure keeps the soft one.
pub fn raise_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(error = %e, "raising the descriptor limit to its hard limit");
    }
}

/// How the process's descriptor limit is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The process's descriptor limit (soft).
    pub limit: u64,
    /// Open when the service started (the audit store, the data dir's lock, the tiers).
    pub baseline: u64,
    /// The listeners' connection caps added up.
    pub connections: u64,
    /// Kept for accepting, health, lists, execs' pipes and destroys.
    pub reserve: u64,
    /// What live sandboxes may hold together.
    pub sandboxes: u64,
}

impl Plan {
    pub fn new(limit: u64, baseline: u64, connections: u64) -> Self {
        let reserve = (limit / 16).max(64);
        Plan {
            limit,
            baseline,
            connections,
            reserve,
            sandboxes: limit
                .saturating_sub(baseline)
                .saturating_sub(connections)
                .saturating_sub(reserve),
        }
    }

    /// This process's plan: its limit now, the descriptors it has open, `connections`.
    pub fn of_process(connections: u64) -> Self {
        let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let baseline = std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count() as u64);
        Plan::new(limit, baseline, connections)
    }

    /// How many live sandboxes of `tier` the budget holds (`None`: unbounded by it).
    pub fn allows(&self, tier: Tier) -> Option<u64> {
        match per_sandbox(tier) {
            0 => None,
            n => Some(self.sandboxes / n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_keeps_the_connections_and_a_reserve() {
        let p = Plan::new(256, 20, 128);
        assert_eq!(p.reserve, 64);
        assert_eq!(p.sandboxes, 44);
        // A container sandbox holds one descriptor (ADR 0038).
        assert_eq!(p.allows(Tier::Container), Some(44));
        assert_eq!(p.allows(Tier::Wasm), None);
        let tiny = Plan::new(100, 20, 50);
        assert_eq!(tiny.sandboxes, 0);
    }
}
