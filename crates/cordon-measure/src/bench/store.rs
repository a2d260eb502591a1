//! The figures `--tier auto` reads (`<data dir>/bench/last.json`) and how a bench run goes
//! into them. A run of some tiers (`--tiers gvisor`) or some peers merges into the stored
//! figures: every row it measured replaces the stored row of the same name, every row it did
//! not measure stays as it was, and each row keeps its own `measured_unix`. A stored document
//! from another host, or of another schema, is replaced whole.

use cordon_core::Tier;
use cordon_policy::bench_doc::{BenchDoc, Figure, FigureKind, Status};

/// Dates every row of a run's document with the run's `created_unix`: the figures, and the
/// tiers and peers it measured (a skipped or failed report has no figure to date).
pub fn stamp(run: &mut BenchDoc) {
    let now = Some(run.created_unix);
    for f in &mut run.figures {
        f.measured_unix = now;
    }
    for t in run
        .tiers
        .iter_mut()
        .filter(|t| t.status == Status::Measured)
    {
        t.measured_unix = now;
    }
    for p in run
        .peers
        .iter_mut()
        .filter(|p| p.status == Status::Measured)
    {
        p.measured_unix = now;
    }
}

/// The document to store: `run` (already [`stamp`]ed) with the rows of `stored` it did not
/// measure. `ratio_cordon_run_to_bwrap` is worked out again from the merged figures.
pub fn merge(stored: Option<&BenchDoc>, mut run: BenchDoc) -> BenchDoc {
    let Some(stored) = stored.filter(|s| same_source(s, &run)) else {
        // A first bench (or one from another build or host) stores this run alone, with
        // its own ratio: it was left out, so a fresh host's first `cordon bench` printed no
        // `cordon run` / bwrap ratio at all.
        run.ratio_cordon_run_to_bwrap = run_to_bwrap(&run);
        return run;
    };
    // A row from before rows had dates takes its document's.
    let created = (stored.created_unix > 0).then_some(stored.created_unix);
    // Figures: by subject; a stored one stays when this run has none of that name.
    for old in &stored.figures {
        if run.figure(&old.subject).is_none() {
            let mut old = old.clone();
            old.measured_unix = old.measured_unix.or(created);
            run.figures.push(old);
        }
    }
    run.figures.sort_by_key(figure_order);
    // Tiers and peers: by name; a stored measured report stays unless this run measured it.
    run.tiers = merged_rows(
        std::mem::take(&mut run.tiers),
        &stored.tiers,
        |t| t.tier.as_str().to_string(),
        |t| t.status == Status::Measured,
        |t| t.measured_unix = t.measured_unix.or(created),
    );
    run.tiers
        .sort_by_key(|t| tier_position(Some(t.tier.as_str())));
    run.peers = merged_rows(
        std::mem::take(&mut run.peers),
        &stored.peers,
        |p| p.peer.clone(),
        |p| p.status == Status::Measured,
        |p| p.measured_unix = p.measured_unix.or(created),
    );
    run.peers.sort_by_key(|p| peer_position(Some(&p.peer)));
    run.ratio_cordon_run_to_bwrap = run_to_bwrap(&run);
    run
}

/// `cordon run`'s median over bwrap's, when `doc` has both.
fn run_to_bwrap(doc: &BenchDoc) -> Option<f64> {
    let median = |subject: &str| doc.figure(subject).map(|f| f.median_us as f64);
    match (median("cordon-run"), median("bwrap")) {
        (Some(c), Some(b)) if b > 0.0 => Some(c / b),
        _ => None,
    }
}

/// This run's rows, each replaced by the stored row of the same name when only the stored
/// one was measured, then the stored rows this run has no row for (dated).
fn merged_rows<T: Clone>(
    new: Vec<T>,
    stored: &[T],
    name: impl Fn(&T) -> String,
    measured: impl Fn(&T) -> bool,
    date: impl Fn(&mut T),
) -> Vec<T> {
    let stored_row = |n: &str| stored.iter().find(|o| name(o) == n);
    let mut out: Vec<T> = Vec::new();
    for row in &new {
        match stored_row(&name(row)) {
            Some(old) if measured(old) && !measured(row) => {
                let mut old = old.clone();
                date(&mut old);
                out.push(old);
            }
            _ => out.push(row.clone()),
        }
    }
    for old in stored {
        if !new.iter().any(|n| name(n) == name(old)) {
            let mut old = old.clone();
            date(&mut old);
            out.push(old);
        }
    }
    out
}

/// The stored rows a run did not measure (subject, when measured): what a text report lists
/// as kept.
pub fn kept(merged: &BenchDoc, run_created: u64) -> Vec<(String, u64)> {
    merged
        .figures
        .iter()
        .filter_map(|f| {
            let when = f.measured_unix?;
            (when != run_created).then(|| (f.subject.clone(), when))
        })
        .collect()
}

/// Whether a stored document's figures may be merged with a run's: the same schema, made on
/// the same host.
fn same_source(stored: &BenchDoc, run: &BenchDoc) -> bool {
    stored.schema == run.schema && stored.host == run.host
}

fn peer_position(name: Option<&str>) -> usize {
    super::peers::NAMES
        .iter()
        .position(|n| Some(*n) == name)
        .unwrap_or(usize::MAX)
}

fn tier_position(name: Option<&str>) -> usize {
    Tier::ALL
        .iter()
        .position(|t| Some(t.as_str()) == name)
        .unwrap_or(usize::MAX)
}

/// The order the bench writes its figures in: tiers (each CLI row after its tier), then
/// peers.
fn figure_order(f: &Figure) -> (usize, usize) {
    match f.kind {
        FigureKind::Tier => (0, tier_position(Some(&f.subject)) * 2),
        FigureKind::Cli => (
            0,
            tier_position(f.tier.map(Tier::as_str)).saturating_mul(2) + 1,
        ),
        FigureKind::Peer => (1, peer_position(Some(&f.subject))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::{Autonomy, BenchFigures, Host, Request, Rules, Shape, TierChoice, Trust};
    use serde_json::{Value, json};

    const T0: u64 = 1_700_000_000;
    const T1: u64 = T0 + 9 * 86_400;

    fn figure(subject: &str, kind: &str, median: u64) -> Value {
        json!({"subject": subject, "kind": kind, "what": "test", "median_us": median,
               "p90_us": median, "min_us": median, "samples": 5})
    }

    fn tier(t: &str, status: &str, cold: Option<u64>) -> Value {
        let mut v = json!({"tier": t, "status": status});
        if let Some(c) = cold {
            v["cold_start"] =
                json!({"median_us": c, "p90_us": c, "min_us": c, "max_us": c, "samples": 5});
        }
        v
    }

    fn doc(created: u64, figures: Vec<Value>, tiers: Vec<Value>, peers: Vec<Value>) -> BenchDoc {
        let mut d: BenchDoc = serde_json::from_value(
            json!({"schema": super::super::SCHEMA, "host": "h", "created_unix": created,
                   "figures": figures, "tiers": tiers, "peers": peers}),
        )
        .unwrap();
        stamp(&mut d);
        d
    }

    /// A fresh host's first bench has nothing stored to merge with: its ratio is still
    /// worked out (it was left out, and `cordon bench` printed none).
    #[test]
    fn a_first_bench_has_its_cordon_run_to_bwrap_ratio() {
        let first = merge(None, full());
        assert_eq!(first.ratio_cordon_run_to_bwrap, Some(2.0));
    }

    /// The full set a first `cordon bench` stores: every tier and two peers.
    fn full() -> BenchDoc {
        doc(
            T0,
            vec![
                figure("runtime", "tier", 300),
                figure("wasm", "tier", 2_000),
                figure("container", "tier", 9_000),
                json!({"subject": "cordon-run", "kind": "cli", "tier": "container", "what": "t",
                       "median_us": 10_000, "p90_us": 1, "min_us": 1, "samples": 5}),
                figure("gvisor", "tier", 150_000),
                figure("microvm", "tier", 40_000),
                figure("host", "peer", 1_000),
                figure("bwrap", "peer", 5_000),
            ],
            ["runtime", "wasm", "container", "gvisor", "microvm"]
                .into_iter()
                .map(|t| tier(t, "measured", Some(1)))
                .collect(),
            ["host", "bwrap"]
                .into_iter()
                .map(|p| json!({"peer": p, "status": "measured"}))
                .collect(),
        )
    }

    fn dated(d: &BenchDoc, subject: &str) -> (Option<u64>, Option<u64>) {
        let f = d.figure(subject);
        (f.map(|f| f.median_us), f.and_then(|f| f.measured_unix))
    }

    fn text(d: &BenchDoc) -> String {
        serde_json::to_string(d).unwrap()
    }

    fn chosen(d: &BenchDoc) -> Tier {
        let rules = Rules::default_rules().unwrap();
        let req = Request {
            trust: Trust::Untrusted,
            autonomy: Autonomy::Compute,
            shape: Shape::ManyShort,
            allow_hosts: Vec::new(),
            tier: TierChoice::Auto,
        };
        let host = Host {
            available: [Tier::Wasm, Tier::Gvisor, Tier::Microvm]
                .into_iter()
                .collect(),
            bench: Some(BenchFigures::from_bench_json(&text(d)).unwrap()),
        };
        rules.decide(&req, &host).unwrap().chosen
    }

    #[test]
    fn a_partial_bench_keeps_the_figures_and_dates_it_did_not_measure() {
        let stored = full();
        let before = chosen(&stored);
        assert_eq!(before, Tier::Wasm);
        // `cordon bench --tiers gvisor --peers none`, nine days later, gvisor faster now.
        let run = doc(
            T1,
            vec![figure("gvisor", "tier", 120_000)],
            vec![tier("gvisor", "measured", Some(120_000))],
            Vec::new(),
        );
        let merged = merge(Some(&stored), run);
        assert_eq!(dated(&merged, "gvisor"), (Some(120_000), Some(T1)));
        for (s, us) in [
            ("runtime", 300),
            ("wasm", 2_000),
            ("container", 9_000),
            ("cordon-run", 10_000),
            ("microvm", 40_000),
            ("host", 1_000),
            ("bwrap", 5_000),
        ] {
            assert_eq!(dated(&merged, s), (Some(us), Some(T0)), "{s}");
        }
        let subjects: Vec<&str> = merged.figures.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(
            subjects,
            [
                "runtime",
                "wasm",
                "container",
                "cordon-run",
                "gvisor",
                "microvm",
                "host",
                "bwrap"
            ]
        );
        let tiers: Vec<(&str, Option<u64>)> = merged
            .tiers
            .iter()
            .map(|t| (t.tier.as_str(), t.measured_unix))
            .collect();
        assert_eq!(
            tiers,
            [
                ("runtime", Some(T0)),
                ("wasm", Some(T0)),
                ("container", Some(T0)),
                ("gvisor", Some(T1)),
                ("microvm", Some(T0)),
            ]
        );
        assert_eq!(merged.peers.len(), 2);
        assert_eq!(merged.ratio_cordon_run_to_bwrap, Some(2.0));
        assert_eq!(merged.created_unix, T1);
        assert_eq!(kept(&merged, T1).len(), 7);
        // The partial bench did not change which tier is fastest: auto still picks wasm (the
        // old whole-file replace left only gvisor measured, so it ranked gvisor first).
        assert_eq!(chosen(&merged), before);
        let figures = BenchFigures::from_bench_json(&text(&merged)).unwrap();
        assert_eq!(figures.measured_unix.get(&Tier::Wasm), Some(&T0));
        assert_eq!(figures.measured_unix.get(&Tier::Gvisor), Some(&T1));
    }

    #[test]
    fn a_measured_row_is_not_replaced_by_a_skip_and_other_hosts_are_not_merged() {
        let stored = full();
        // gvisor selected again but unavailable now: its stored report and figure stay.
        let run = doc(
            T1,
            vec![figure("wasm", "tier", 1_500)],
            vec![
                tier("wasm", "measured", Some(1_500)),
                tier("gvisor", "skipped", None),
            ],
            vec![json!({"peer": "bwrap", "status": "skipped"})],
        );
        let merged = merge(Some(&stored), run.clone());
        let tier_status = merged
            .tiers
            .iter()
            .find(|t| t.tier == Tier::Gvisor)
            .map(|t| t.status);
        assert_eq!(tier_status, Some(Status::Measured));
        let peer_status = merged
            .peers
            .iter()
            .find(|p| p.peer == "bwrap")
            .map(|p| p.status);
        assert_eq!(peer_status, Some(Status::Measured));
        assert_eq!(dated(&merged, "gvisor"), (Some(150_000), Some(T0)));
        assert_eq!(dated(&merged, "wasm"), (Some(1_500), Some(T1)));

        // Another host's figures, or no stored file: the run's document as it is.
        let mut other = stored.clone();
        other.host = "elsewhere".into();
        assert_eq!(merge(Some(&other), run.clone()), run);
        assert_eq!(merge(None, run.clone()), run);

        // A stored file from before rows had dates: its rows take its created_unix.
        let mut undated = stored;
        for f in &mut undated.figures {
            f.measured_unix = None;
        }
        let merged = merge(Some(&undated), run);
        assert_eq!(dated(&merged, "microvm"), (Some(40_000), Some(T0)));
    }
}
