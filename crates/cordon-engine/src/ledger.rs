//! Aggregate budgets: how many sandboxes and how much memory (their memory limits added up)
//! each tenant and the whole server hold. A reservation is taken before a sandbox is
//! created and given back when it is dropped, so the configured maxima cannot overcommit
//! the host however many tenants ask at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Budgets of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetLimits {
    pub max_sandboxes: usize,
    pub max_sandboxes_per_tenant: usize,
    /// Memory of every live and pooled sandbox added up.
    pub max_memory: u64,
    /// The process's descriptors live sandboxes may hold, all tiers together (each holds
    /// its tier's cost, [`Ledger::hold_descriptors`]); `u64::MAX`: unbounded.
    pub max_descriptors: u64,
}

/// Why a reservation was refused; `tenant` tells whose limit is full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Full {
    pub message: String,
    /// True when the tenant's own limit is full (false: the server's).
    pub tenant: bool,
    /// True when the places being given back now (sandboxes whose teardown has begun,
    /// [`Reservation::leave`]) would make room: the caller may wait for them.
    pub pending: bool,
}

#[derive(Debug, Default)]
struct Counts {
    sandboxes: usize,
    memory: u64,
    per_tenant: BTreeMap<String, (usize, u64)>,
    /// Of those, the places being given back: in all, and per tenant.
    leaving: (usize, u64),
    leaving_per_tenant: BTreeMap<String, (usize, u64)>,
    /// The process's descriptors live sandboxes hold.
    descriptors: u64,
}

/// `(sandboxes, memory)` less `(sandboxes, memory)`.
fn less(a: (usize, u64), b: (usize, u64)) -> (usize, u64) {
    (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))
}

/// The ledger.
#[derive(Debug, Clone)]
pub struct Ledger {
    limits: BudgetLimits,
    counts: Arc<Mutex<Counts>>,
}

/// A place held under the budgets; dropping it gives the place back.
#[derive(Debug)]
pub struct Reservation {
    counts: Arc<Mutex<Counts>>,
    tenant: Option<String>,
    memory: u64,
    leaving: AtomicBool,
    /// The process's descriptors this sandbox holds ([`Ledger::hold_descriptors`]).
    descriptors: u64,
}

impl Reservation {
    /// Marks the place as being given back: its sandbox's teardown has begun and nothing
    /// will run in it again. A refusal that this place's return would lift says so
    /// ([`Full::pending`]), so a sequential client is not refused for a sandbox it has
    /// already let go of. Idempotent.
    pub fn leave(&self) {
        if self.leaving.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = usize::from(self.tenant.is_some());
        c.leaving.0 += n;
        c.leaving.1 += self.memory;
        if let Some(t) = &self.tenant {
            let e = c.leaving_per_tenant.entry(t.clone()).or_insert((0, 0));
            e.0 += 1;
            e.1 += self.memory;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if *self.leaving.get_mut() {
            let n = usize::from(self.tenant.is_some());
            c.leaving = less(c.leaving, (n, self.memory));
            if let Some(t) = &self.tenant
                && let Some(e) = c.leaving_per_tenant.get_mut(t)
            {
                *e = less(*e, (1, self.memory));
                if *e == (0, 0) {
                    c.leaving_per_tenant.remove(t);
                }
            }
        }
        c.memory = c.memory.saturating_sub(self.memory);
        c.descriptors = c.descriptors.saturating_sub(self.descriptors);
        if let Some(t) = &self.tenant {
            c.sandboxes = c.sandboxes.saturating_sub(1);
            if let Some(e) = c.per_tenant.get_mut(t) {
                e.0 = e.0.saturating_sub(1);
                e.1 = e.1.saturating_sub(self.memory);
                if e.0 == 0 && e.1 == 0 {
                    c.per_tenant.remove(t);
                }
            }
        }
    }
}

/// This host's physical memory less 1 GiB for the host itself (the default memory budget);
/// `u64::MAX` where it cannot be read.
pub fn host_memory_budget() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    match total {
        Some(t) => t.saturating_sub(1 << 30).max(256 << 20),
        None => u64::MAX,
    }
}

impl Ledger {
    pub fn new(limits: BudgetLimits) -> Self {
        Ledger {
            limits,
            counts: Arc::new(Mutex::new(Counts::default())),
        }
    }

    pub fn limits(&self) -> &BudgetLimits {
        &self.limits
    }

    /// Holds a place for one sandbox of `tenant` with `memory` bytes, within the tenant's
    /// own maxima (`tenant_max`: sandboxes, memory) and the server's.
    pub fn reserve(
        &self,
        tenant: &str,
        memory: u64,
        tenant_max: (Option<usize>, Option<u64>),
    ) -> Result<Reservation, Full> {
        // A tenant the operator gave no memory budget has its default share, never the
        // whole server's.
        let tenant_max = (
            tenant_max.0,
            Some(tenant_max.1.unwrap_or_else(|| self.default_tenant_memory())),
        );
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (mine, my_mem) = c.per_tenant.get(tenant).copied().unwrap_or((0, 0));
        let max_mine = tenant_max
            .0
            .unwrap_or(self.limits.max_sandboxes_per_tenant)
            .min(self.limits.max_sandboxes_per_tenant);
        // Whether every limit holds for held places `all` (server) and `own` (tenant's).
        let fits = |all: (usize, u64), own: (usize, u64)| {
            all.0 < self.limits.max_sandboxes
                && own.0 < max_mine
                && tenant_max
                    .1
                    .is_none_or(|max| own.1.saturating_add(memory) <= max)
                && all.1.saturating_add(memory) <= self.limits.max_memory
        };
        let pending = fits(
            less((c.sandboxes, c.memory), c.leaving),
            less(
                (mine, my_mem),
                c.leaving_per_tenant.get(tenant).copied().unwrap_or((0, 0)),
            ),
        );
        let full = |message: String, tenant: bool| {
            Err(Full {
                message,
                tenant,
                pending,
            })
        };
        if c.sandboxes >= self.limits.max_sandboxes {
            return full(
                format!(
                    "the server holds its limit of {} sandboxes",
                    self.limits.max_sandboxes
                ),
                false,
            );
        }
        if mine >= max_mine {
            return full(format!("you hold your limit of {max_mine} sandboxes"), true);
        }
        if let Some(max) = tenant_max.1
            && my_mem.saturating_add(memory) > max
        {
            return full(
                format!(
                    "your sandboxes' memory would add up to more than your budget of {max} bytes"
                ),
                true,
            );
        }
        if c.memory.saturating_add(memory) > self.limits.max_memory {
            return full(
                format!(
                    "the server's memory budget ({} bytes) is taken by live sandboxes",
                    self.limits.max_memory
                ),
                false,
            );
        }
        c.sandboxes += 1;
        c.memory += memory;
        let e = c.per_tenant.entry(tenant.to_string()).or_insert((0, 0));
        e.0 += 1;
        e.1 += memory;
        Ok(Reservation {
            counts: self.counts.clone(),
            tenant: Some(tenant.to_string()),
            memory,
            leaving: AtomicBool::new(false),
            descriptors: 0,
        })
    }

    /// The memory budget of a tenant the operator gave none (`max_memory` in its rules):
    /// a quarter of the server's budget, or the tenant's proportion of the sandboxes
    /// (`max_sandboxes_per_tenant / max_sandboxes`) when that is more (a server for one
    /// tenant gives it all), as the other budgets leave room for the other tenants. Before,
    /// it was the whole budget, and one tenant's idle sandboxes refused every other
    /// tenant's create.
    pub fn default_tenant_memory(&self) -> u64 {
        let l = &self.limits;
        let all = l.max_sandboxes.max(1) as u128;
        let per = (l.max_sandboxes_per_tenant.min(l.max_sandboxes) as u128).max(all.div_ceil(4));
        u64::try_from(u128::from(l.max_memory) * per / all).unwrap_or(l.max_memory)
    }

    /// Holds memory for the server's own use (warm pools), outside any tenant's count.
    pub fn reserve_pool(&self, memory: u64) -> Result<Reservation, Full> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.memory.saturating_add(memory) > self.limits.max_memory {
            return Err(Full {
                message: format!(
                    "warm pools would hold more than the server's memory budget ({} bytes)",
                    self.limits.max_memory
                ),
                tenant: false,
                pending: false,
            });
        }
        c.memory += memory;
        Ok(Reservation {
            counts: self.counts.clone(),
            tenant: None,
            memory,
            leaving: AtomicBool::new(false),
            descriptors: 0,
        })
    }

    /// Adds `n` of the process's descriptors to what `place`'s sandbox holds, or says why
    /// not: the descriptors every live sandbox holds may not pass `max_descriptors`, so the
    /// server keeps what it needs to accept connections and answer the others.
    pub fn hold_descriptors(&self, place: &mut Reservation, n: u64) -> Result<(), Full> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.descriptors.saturating_add(n) > self.limits.max_descriptors {
            return Err(Full {
                message: format!(
                    "the server's live sandboxes hold {} of the {} descriptors its descriptor \
                     limit leaves them, and this sandbox needs {n} more",
                    c.descriptors, self.limits.max_descriptors
                ),
                tenant: false,
                pending: false,
            });
        }
        c.descriptors += n;
        place.descriptors += n;
        Ok(())
    }

    /// The process's descriptors live sandboxes hold now.
    pub fn descriptors_held(&self) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .descriptors
    }

    /// Sandboxes and memory held now: in all, and by `tenant`.
    pub fn held(&self, tenant: &str) -> ((usize, u64), (usize, u64)) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (
            (c.sandboxes, c.memory),
            c.per_tenant.get(tenant).copied().unwrap_or((0, 0)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant the operator gave the whole memory budget.
    const WHOLE: (Option<usize>, Option<u64>) = (None, Some(1000));

    /// Issue 44: by default one tenant's share was the whole server budget, so 11 idle
    /// sandboxes of one tenant refused every other tenant's create. Without a budget of
    /// its own a tenant holds at most its default share, and another tenant's create fits.
    #[test]
    fn a_tenant_without_a_budget_leaves_room_for_the_others() {
        let l = Ledger::new(BudgetLimits {
            max_sandboxes: 64,
            max_sandboxes_per_tenant: 16,
            max_descriptors: u64::MAX,
            max_memory: 4096,
        });
        assert_eq!(l.default_tenant_memory(), 1024);
        let mut held = Vec::new();
        let refusal = loop {
            match l.reserve("a", 100, (None, None)) {
                Ok(r) => held.push(r),
                Err(e) => break e,
            }
            assert!(held.len() <= 16, "a took {} sandboxes", held.len());
        };
        println!("a holds {} sandboxes: {refusal}", held.len());
        assert!(refusal.tenant, "{refusal}");
        assert!(refusal.message.contains("your budget"), "{refusal}");
        assert_eq!(held.len(), 10);
        for _ in 0..3 {
            held.push(
                l.reserve("b", 300, (None, None))
                    .unwrap_or_else(|e| panic!("b: {e}")),
            );
        }
    }

    #[test]
    fn memory_and_counts_are_bounded_per_tenant_and_in_all() {
        let l = Ledger::new(BudgetLimits {
            max_sandboxes: 3,
            max_sandboxes_per_tenant: 2,
            max_descriptors: u64::MAX,
            max_memory: 1000,
        });
        let a1 = l.reserve("a", 400, (None, None)).unwrap();
        let _a2 = l.reserve("a", 100, (None, None)).unwrap();
        let e = l.reserve("a", 1, (None, None)).unwrap_err();
        assert!(e.tenant, "{e}");
        // The server's memory budget binds across tenants.
        let e = l.reserve("b", 600, (None, None)).unwrap_err();
        assert!(!e.tenant, "{e}");
        let e = l.reserve("b", 300, (None, Some(200))).unwrap_err();
        assert!(e.tenant, "{e}");
        let _b = l.reserve("b", 300, (None, None)).unwrap();
        assert!(
            l.reserve("c", 1, (None, None)).is_err(),
            "server count full"
        );
        drop(a1);
        assert_eq!(l.held("a"), ((2, 400), (1, 100)));
        let _c = l.reserve("c", 500, (None, None)).unwrap();
        let _pool = l.reserve_pool(100).unwrap();
        assert!(l.reserve_pool(1).is_err(), "1000 of 1000 bytes held");
    }

    #[test]
    fn a_refusal_says_whether_places_being_given_back_would_lift_it() {
        let l = Ledger::new(BudgetLimits {
            max_sandboxes: 3,
            max_sandboxes_per_tenant: 1,
            max_descriptors: u64::MAX,
            max_memory: 1000,
        });
        let a = l.reserve("a", 100, (None, None)).unwrap();
        let e = l.reserve("a", 100, (None, None)).unwrap_err();
        assert!(e.tenant && !e.pending, "a held place: {e:?}");
        a.leave();
        a.leave();
        let e = l.reserve("a", 100, (None, None)).unwrap_err();
        assert!(e.tenant && e.pending, "a place on its way back: {e:?}");
        // Another tenant's departing place lifts nothing of a's own limit.
        let b = l.reserve("b", 100, (None, None)).unwrap();
        b.leave();
        drop(a);
        let a2 = l.reserve("a", 100, (None, None)).unwrap();
        let e = l.reserve("a", 100, (None, None)).unwrap_err();
        assert!(!e.pending, "{e:?}");
        // The server's memory: only what is leaving counts as coming back.
        let c = l.reserve("c", 700, WHOLE).unwrap();
        let e = l.reserve("d", 200, WHOLE).unwrap_err();
        assert!(!e.tenant && e.pending, "b's 100 bytes are leaving: {e:?}");
        let e = l.reserve("d", 300, WHOLE).unwrap_err();
        assert!(!e.pending, "100 bytes leaving are not enough: {e:?}");
        c.leave();
        let e = l.reserve("d", 300, WHOLE).unwrap_err();
        assert!(e.pending, "{e:?}");
        drop((b, c));
        let _d = l.reserve("d", 300, WHOLE).unwrap();
        drop(a2);
        assert_eq!(l.held("a"), ((1, 300), (0, 0)));
    }

    #[test]
    fn descriptors_are_held_until_the_sandbox_goes() {
        let l = Ledger::new(BudgetLimits {
            max_sandboxes: 10,
            max_sandboxes_per_tenant: 10,
            max_memory: 1000,
            max_descriptors: 20,
        });
        let mut a = l.reserve("t", 1, (None, None)).unwrap();
        l.hold_descriptors(&mut a, 8).unwrap();
        let mut b = l.reserve("t", 1, (None, None)).unwrap();
        l.hold_descriptors(&mut b, 8).unwrap();
        let mut c = l.reserve("t", 1, (None, None)).unwrap();
        let full = l.hold_descriptors(&mut c, 8).unwrap_err();
        assert!(
            full.message.contains("16 of the 20 descriptors"),
            "{}",
            full.message
        );
        assert_eq!(l.descriptors_held(), 16);
        drop(a);
        l.hold_descriptors(&mut c, 8).unwrap();
        drop((b, c));
        assert_eq!(l.descriptors_held(), 0);
    }
}
