//! The figures `--tier auto` reads (`<data dir>/bench/last.json`) and how a bench run goes
//! into them. A run of some tiers (`--tiers gvisor`) or some peers merges into the stored
//! figures: every row it measured replaces the stored row of the same name, every row it did
//! not measure stays as it was, and each row keeps its own `measured_unix`. A stored document
//! from another host, or of another schema, is replaced whole.

use serde_json::{Map, Value};

use cordon_core::Tier;

/// Dates every row of a run's document with the run's `created_unix`: the figures, and the
/// tiers and peers it measured (a skipped or failed report has no figure to date).
pub fn stamp(run: &mut Value) {
    let Some(now) = run.get("created_unix").and_then(Value::as_u64) else {
        return;
    };
    for (key, all) in [("figures", true), ("tiers", false), ("peers", false)] {
        for row in rows_mut(run, key) {
            if all || measured(row) {
                row.insert("measured_unix".into(), now.into());
            }
        }
    }
}

/// The document to store: `run` (already [`stamp`]ed) with the rows of `stored` it did not
/// measure. `ratio_cordon_run_to_bwrap` is worked out again from the merged figures.
pub fn merge(stored: Option<&Value>, mut run: Value) -> Value {
    let Some(stored) = stored.filter(|s| same_source(s, &run)) else {
        return run;
    };
    let created = stored.get("created_unix").and_then(Value::as_u64);
    let dated = |row: &Map<String, Value>| {
        let mut row = row.clone();
        if let Some(c) = created
            && !row.contains_key("measured_unix")
        {
            row.insert("measured_unix".into(), c.into());
        }
        Value::Object(row)
    };
    // Figures: by subject; a stored one stays when this run has none of that name.
    let mut figures: Vec<Value> = rows(&run, "figures").cloned().map(Value::Object).collect();
    for old in rows(stored, "figures") {
        if !rows(&run, "figures").any(|f| f.get("subject") == old.get("subject")) {
            figures.push(dated(old));
        }
    }
    figures.sort_by_key(figure_order);
    // Tiers and peers: by name; a stored measured report stays unless this run measured it.
    for (key, name) in [("tiers", "tier"), ("peers", "peer")] {
        let mut out: Vec<Value> = Vec::new();
        for new in rows(&run, key) {
            let old = rows(stored, key).find(|o| o.get(name) == new.get(name));
            match old {
                Some(old) if measured(old) && !measured(new) => out.push(dated(old)),
                _ => out.push(Value::Object(new.clone())),
            }
        }
        for old in rows(stored, key) {
            if !rows(&run, key).any(|n| n.get(name) == old.get(name)) {
                out.push(dated(old));
            }
        }
        if key == "tiers" {
            out.sort_by_key(|t| {
                let tier = t.get("tier").and_then(Value::as_str);
                Tier::ALL
                    .iter()
                    .position(|x| Some(x.as_str()) == tier)
                    .unwrap_or(usize::MAX)
            });
        } else {
            out.sort_by_key(|p| peer_position(p.get("peer").and_then(Value::as_str)));
        }
        run[key] = Value::Array(out);
    }
    let median = |subject: &str| {
        figures
            .iter()
            .find(|f| f.get("subject").and_then(Value::as_str) == Some(subject))
            .and_then(|f| f.get("median_us"))
            .and_then(Value::as_f64)
    };
    run["ratio_cordon_run_to_bwrap"] = match (median("cordon-run"), median("bwrap")) {
        (Some(c), Some(b)) if b > 0.0 => (c / b).into(),
        _ => Value::Null,
    };
    run["figures"] = Value::Array(figures);
    run
}

/// The stored rows a run did not measure (subject, when measured): what a text report lists
/// as kept.
pub fn kept(merged: &Value, run_created: u64) -> Vec<(String, u64)> {
    rows(merged, "figures")
        .filter_map(|f| {
            let when = f.get("measured_unix").and_then(Value::as_u64)?;
            let subject = f.get("subject").and_then(Value::as_str)?;
            (when != run_created).then(|| (subject.to_string(), when))
        })
        .collect()
}

/// Whether a stored document's figures may be merged with a run's: the same schema, made on
/// the same host.
fn same_source(stored: &Value, run: &Value) -> bool {
    stored.get("schema") == run.get("schema") && stored.get("host") == run.get("host")
}

fn measured(row: &Map<String, Value>) -> bool {
    row.get("status").and_then(Value::as_str) == Some("measured")
}

fn rows<'a>(doc: &'a Value, key: &str) -> impl Iterator<Item = &'a Map<String, Value>> {
    doc.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn rows_mut<'a>(doc: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    doc.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn peer_position(name: Option<&str>) -> usize {
    super::peers::NAMES
        .iter()
        .position(|n| Some(*n) == name)
        .unwrap_or(usize::MAX)
}

/// The order the bench writes its figures in: tiers (each CLI row after its tier), then
/// peers.
fn figure_order(f: &Value) -> (usize, usize) {
    let subject = f.get("subject").and_then(Value::as_str);
    let tier_pos = |name: Option<&str>| {
        Tier::ALL
            .iter()
            .position(|t| Some(t.as_str()) == name)
            .unwrap_or(usize::MAX)
    };
    match f.get("kind").and_then(Value::as_str) {
        Some("tier") => (0, tier_pos(subject) * 2),
        Some("cli") => (
            0,
            tier_pos(f.get("tier").and_then(Value::as_str)).saturating_mul(2) + 1,
        ),
        _ => (1, peer_position(subject)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::{Autonomy, BenchFigures, Host, Request, Rules, Shape, TierChoice, Trust};
    use serde_json::json;

    const T0: u64 = 1_700_000_000;
    const T1: u64 = T0 + 9 * 86_400;

    fn figure(subject: &str, kind: &str, median: u64) -> Value {
        json!({"subject": subject, "kind": kind, "what": "test", "median_us": median,
               "p90_us": median, "min_us": median, "samples": 5})
    }

    fn tier(t: &str, status: &str, cold: Option<u64>) -> Value {
        let mut v = json!({"tier": t, "status": status});
        if let Some(c) = cold {
            v["cold_start"] = json!({"median_us": c});
        }
        v
    }

    fn doc(created: u64, figures: Vec<Value>, tiers: Vec<Value>, peers: Vec<Value>) -> Value {
        let mut d = json!({"schema": super::super::SCHEMA, "host": "h", "created_unix": created,
                           "figures": figures, "tiers": tiers, "peers": peers});
        stamp(&mut d);
        d
    }

    /// The full set a first `cordon bench` stores: every tier and two peers.
    fn full() -> Value {
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

    fn dated(d: &Value, subject: &str) -> (Option<u64>, Option<u64>) {
        let f =
            rows(d, "figures").find(|f| f.get("subject").and_then(Value::as_str) == Some(subject));
        (
            f.and_then(|f| f.get("median_us")).and_then(Value::as_u64),
            f.and_then(|f| f.get("measured_unix"))
                .and_then(Value::as_u64),
        )
    }

    fn chosen(d: &Value) -> Tier {
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
            bench: Some(BenchFigures::from_bench_json(&d.to_string()).unwrap()),
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
        let subjects: Vec<&str> = rows(&merged, "figures")
            .filter_map(|f| f.get("subject").and_then(Value::as_str))
            .collect();
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
        let tiers: Vec<(&str, Option<u64>)> = rows(&merged, "tiers")
            .map(|t| {
                (
                    t.get("tier").and_then(Value::as_str).unwrap(),
                    t.get("measured_unix").and_then(Value::as_u64),
                )
            })
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
        assert_eq!(rows(&merged, "peers").count(), 2);
        assert_eq!(merged["ratio_cordon_run_to_bwrap"].as_f64(), Some(2.0));
        assert_eq!(merged["created_unix"].as_u64(), Some(T1));
        assert_eq!(kept(&merged, T1).len(), 7);
        // The partial bench did not change which tier is fastest: auto still picks wasm (the
        // old whole-file replace left only gvisor measured, so it ranked gvisor first).
        assert_eq!(chosen(&merged), before);
        let figures = BenchFigures::from_bench_json(&merged.to_string()).unwrap();
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
        let status = |key: &str, name: &str, id: &str| {
            rows(&merged, key)
                .find(|r| r.get(name).and_then(Value::as_str) == Some(id))
                .and_then(|r| r.get("status").and_then(Value::as_str).map(String::from))
        };
        assert_eq!(
            status("tiers", "tier", "gvisor").as_deref(),
            Some("measured")
        );
        assert_eq!(
            status("peers", "peer", "bwrap").as_deref(),
            Some("measured")
        );
        assert_eq!(dated(&merged, "gvisor"), (Some(150_000), Some(T0)));
        assert_eq!(dated(&merged, "wasm"), (Some(1_500), Some(T1)));

        // Another host's figures, or no stored file: the run's document as it is.
        let mut other = stored.clone();
        other["host"] = "elsewhere".into();
        assert_eq!(merge(Some(&other), run.clone()), run);
        assert_eq!(merge(None, run.clone()), run);

        // A stored file from before rows had dates: its rows take its created_unix.
        let mut undated = stored;
        for f in rows_mut(&mut undated, "figures") {
            f.remove("measured_unix");
        }
        let merged = merge(Some(&undated), run);
        assert_eq!(dated(&merged, "microvm"), (Some(40_000), Some(T0)));
    }
}
