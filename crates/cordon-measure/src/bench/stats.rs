//! How many samples a subject gets (their summary, `Stats`, is part of the stored document:
//! `cordon_policy::bench_doc`).

use std::time::{Duration, Instant};

use serde::Serialize;

/// How many samples a measurement takes: up to `max`, but once `budget` is spent it stops
/// as soon as it has `min` (so a subject that takes seconds per run, like a QEMU boot under
/// emulation, does not hold the whole bench hostage).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    pub max: usize,
    pub min: usize,
    #[serde(serialize_with = "secs")]
    pub budget: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Budget {
    /// Whether a subject that has `taken` samples after `spent` time wants another.
    pub fn wants_more(&self, taken: usize, spent: Duration) -> bool {
        taken < self.max && (taken < self.min || spent < self.budget)
    }

    /// Runs `f` (which returns the duration to record) until the budget says stop.
    pub fn sample(
        &self,
        mut f: impl FnMut() -> anyhow::Result<Duration>,
    ) -> anyhow::Result<Vec<Duration>> {
        let start = Instant::now();
        let mut out = Vec::new();
        while self.wants_more(out.len(), start.elapsed()) {
            out.push(f()?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::bench_doc::Stats;

    #[test]
    fn stats_pick_by_rank() {
        let d: Vec<Duration> = [5u64, 1, 3, 2, 4]
            .iter()
            .map(|&v| Duration::from_micros(v))
            .collect();
        let s = Stats::of(&d).unwrap_or_else(|| panic!("no stats"));
        assert_eq!(
            (s.median_us, s.min_us, s.max_us, s.p90_us, s.samples),
            (3, 1, 5, 5, 5)
        );
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn budget_keeps_the_minimum_and_the_maximum() {
        let b = Budget {
            max: 10,
            min: 3,
            budget: Duration::ZERO,
        };
        assert!(b.wants_more(2, Duration::from_secs(9)));
        assert!(!b.wants_more(3, Duration::from_secs(9)));
        let b = Budget {
            budget: Duration::from_secs(60),
            ..b
        };
        assert!(b.wants_more(9, Duration::ZERO));
        assert!(!b.wants_more(10, Duration::ZERO));
    }
}
