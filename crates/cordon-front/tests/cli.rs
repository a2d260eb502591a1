#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the `cordon` binary: `cordon bench --quick` and `cordon cost`, their
//! JSON checked against the schema in docs/bench.md and docs/cost.md, their charts parsed,
//! and the bench's figures fed back through the policy's `--tier auto`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cordon_core::Tier;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

use cordon_testkit::{require_all, skip};

/// False (after a loud SKIPPING line, or a failure under CORDON_REQUIRE_ALL=1) when not root:
/// the container tier needs root.
fn container_tier_here(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(test, "the container tier needs root");
    false
}

fn cordon(home: &Path, args: &[&str]) -> Output {
    cordon_testkit::cordon_at(BIN, home, args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The data dir the tiers' artifacts live in when the tests were not given one.
fn real_data_dir() -> PathBuf {
    cordon_microvm::image::default_data_dir()
}

/// A temp CORDON_HOME that sees the built guest artifacts (wasm guests, microvm image) of
/// the real data dir, so the bench's output lands in the temp dir while every tier runs.
fn temp_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("temp dir");
    for d in ["guests", "microvm"] {
        let real = real_data_dir().join(d);
        if real.is_dir() {
            std::os::unix::fs::symlink(&real, home.path().join(d)).expect("symlink");
        }
    }
    home
}

/// The tiers a bench JSON reports, in its order.
fn tier_names(v: &Value) -> Vec<&str> {
    v["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tier"].as_str().unwrap())
        .collect()
}

fn stats_ok(v: &Value, what: &str) {
    for k in ["median_us", "p90_us", "min_us", "max_us", "samples"] {
        assert!(v[k].is_u64(), "{what}.{k} is not an unsigned integer: {v}");
    }
    let (min, med, p90, max) = (
        v["min_us"].as_u64().unwrap(),
        v["median_us"].as_u64().unwrap(),
        v["p90_us"].as_u64().unwrap(),
        v["max_us"].as_u64().unwrap(),
    );
    assert!(
        min <= med && med <= p90 && p90 <= max,
        "{what}: order of min/median/p90/max: {v}"
    );
    assert!(v["samples"].as_u64().unwrap() >= 1, "{what}: no samples");
}

/// The checks of docs/bench.md's schema `cordon-bench/1`.
fn check_bench_schema(v: &Value) {
    assert_eq!(v["schema"], "cordon-bench/1");
    assert!(v["host"].is_string() && v["cordon_version"].is_string());
    assert!(v["cores"].as_u64().unwrap() >= 1);
    assert!(v["memory_total_bytes"].is_u64());
    assert!(v["created_unix"].as_u64().unwrap() > 1_600_000_000);
    assert!(v["iterations"].as_u64().unwrap() >= 1);
    let plan = &v["plan"];
    for k in [
        "snippets",
        "agent_runs",
        "live_sandboxes_for_memory",
        "concurrency",
    ] {
        assert!(plan[k].as_u64().unwrap() >= 1, "plan.{k}: {plan}");
    }
    assert!(plan["quick"].is_boolean() && plan["throughput_window_s"].is_f64());
    assert!(plan["samples"]["max"].is_u64() && plan["samples"]["budget"].is_f64());
    assert!(v["ratio_cordon_run_to_bwrap"].is_null() || v["ratio_cordon_run_to_bwrap"].is_f64());

    let figures = v["figures"].as_array().expect("figures is an array");
    assert!(!figures.is_empty(), "no figures");
    for f in figures {
        assert!(f["subject"].is_string() && f["what"].is_string(), "{f}");
        let kind = f["kind"].as_str().unwrap();
        assert!(["tier", "peer", "cli"].contains(&kind), "kind {kind}");
        for k in ["median_us", "p90_us", "min_us", "samples"] {
            assert!(f[k].is_u64(), "figures[].{k}: {f}");
        }
        if kind == "tier" {
            assert!(f["subject"].as_str().unwrap().parse::<Tier>().is_ok());
        }
    }

    let any_peer = v["peers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["status"] == "measured");
    let tiers = v["tiers"].as_array().expect("tiers is an array");
    for t in tiers {
        let tier: Tier = t["tier"].as_str().unwrap().parse().unwrap();
        let status = t["status"].as_str().unwrap();
        match status {
            "skipped" | "failed" => {
                assert!(
                    t["reason"].is_string() || t["errors"].is_array(),
                    "{tier} {status} without a reason: {t}"
                );
            }
            "measured" => {
                assert!(t["trivial"].is_string());
                for k in ["cold_start", "warm_start", "exec"] {
                    stats_ok(&t[k], &format!("{tier}.{k}"));
                }
                let a = &t["agent_run"];
                assert!(a["snippets"].as_u64().unwrap() >= 1);
                stats_ok(&a["execs_total"], "agent_run.execs_total");
                stats_ok(&a["per_run"], "agent_run.per_run");
                let m = &t["memory"];
                assert!(m["per_sandbox_bytes"].is_u64() && m["method"].is_string());
                assert!(m["live_sandboxes"].as_u64().unwrap() >= 1);
                let th = &t["throughput"];
                assert!(th["starts_per_sec"].as_f64().unwrap() > 0.0, "{th}");
                assert!(th["completed"].as_u64().unwrap() >= 1);
                assert!(th["concurrency"].as_u64().unwrap() >= 1);
                if any_peer {
                    let p = &t["peer"];
                    assert!(p["peer"].is_string(), "{tier} has no peer ratio: {t}");
                    assert!(["counterpart", "closest"].contains(&p["basis"].as_str().unwrap()));
                    assert!(p["ratio"].as_f64().unwrap() > 0.0);
                }
                // The tier's headline figure is its cold start.
                let fig = figures
                    .iter()
                    .find(|f| f["subject"] == tier.as_str())
                    .expect("a figure per measured tier");
                assert_eq!(fig["median_us"], t["cold_start"]["median_us"]);
            }
            other => panic!("unknown tier status {other}"),
        }
    }
    for p in v["peers"].as_array().unwrap() {
        assert!(
            p["peer"].is_string() && p["counterpart_of"].is_array(),
            "{p}"
        );
        match p["status"].as_str().unwrap() {
            "measured" => stats_ok(&p["cold_start"], "peer cold_start"),
            "skipped" | "failed" => assert!(p["reason"].is_string(), "{p}"),
            other => panic!("unknown peer status {other}"),
        }
    }
}

/// Parses the SVG and checks there is a labelled bar per subject.
fn check_bench_chart(path: &Path, subjects: &[String]) {
    let svg = std::fs::read_to_string(path).expect("the chart file exists");
    let doc = roxmltree::Document::parse(&svg).expect("the chart is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect();
    for s in subjects {
        assert!(texts.contains(s), "no label {s} on the chart: {texts:?}");
    }
    // Bars: filled rects in the tier or peer colour.
    let bars = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect"))
        .filter(|n| matches!(n.attribute("fill"), Some("#2E6EB4") | Some("#969696")))
        .count();
    // One per subject plus the two legend swatches at most.
    assert!(bars >= subjects.len(), "{bars} bars for {subjects:?}");
}

#[test]
fn a_bench_of_one_tier_keeps_the_stored_figures_of_the_others() {
    // A full figure set, stored nine days ago on this host.
    let home = temp_home();
    let then = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 9 * 86_400;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let fig = |subject: &str, kind: &str, us: u64| {
        serde_json::json!({"subject": subject, "kind": kind, "what": "planted",
            "median_us": us, "p90_us": us, "min_us": us, "samples": 5})
    };
    let tiers: Vec<Value> = ["wasm", "gvisor", "microvm"]
        .iter()
        .map(|t| serde_json::json!({"tier": t, "status": "measured"}))
        .collect();
    let stored = serde_json::json!({
        "schema": "cordon-bench/1", "host": host.trim(), "created_unix": then,
        "figures": [fig("wasm", "tier", 2_000), fig("gvisor", "tier", 150_000),
                    fig("microvm", "tier", 40_000), fig("host", "peer", 1_000)],
        "tiers": tiers,
        "peers": [{"peer": "host", "status": "measured"}],
    });
    std::fs::create_dir_all(home.path().join("bench")).unwrap();
    let last = home.path().join("bench/last.json");
    std::fs::write(&last, stored.to_string()).unwrap();
    let explain = |args: &[&str]| {
        let mut a = vec![
            "policy",
            "explain",
            "--trust",
            "untrusted",
            "--autonomy",
            "compute",
        ];
        a.extend(args);
        let o = cordon(home.path(), &a);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    let pick = |o: String| serde_json::from_str::<Value>(&o).unwrap()["chosen"].clone();
    let before = pick(explain(&["--available", "wasm,gvisor,microvm", "--json"]));
    assert_eq!(before, "wasm");

    // Bench one tier only (the runtime tier runs in-process anywhere).
    let o = cordon(
        home.path(),
        &[
            "bench", "--quick", "--budget", "0", "--tiers", "runtime", "--peers", "none", "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&last).unwrap()).unwrap();
    let row = |subject: &str| {
        v["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["subject"] == subject)
            .cloned()
            .unwrap_or(Value::Null)
    };
    for (s, us) in [
        ("wasm", 2_000),
        ("gvisor", 150_000),
        ("microvm", 40_000),
        ("host", 1_000),
    ] {
        assert_eq!(row(s)["median_us"], us, "{s}: {v}");
        assert_eq!(row(s)["measured_unix"], then, "{s}: {v}");
    }
    assert!(
        row("runtime")["measured_unix"].as_u64().unwrap() > then,
        "{v}"
    );
    let tiers = tier_names(&v);
    assert_eq!(tiers, ["runtime", "wasm", "gvisor", "microvm"]);
    assert_eq!(v["peers"][0]["peer"], "host");

    // The ranking the partial bench did not touch is the same, and explain says how old
    // each figure is.
    assert_eq!(
        pick(explain(&["--available", "wasm,gvisor,microvm", "--json"])),
        before
    );
    let shown = explain(&["--available", "wasm,gvisor,microvm"]);
    assert!(shown.contains("wasm 2.0 ms measured 9 d ago"), "{shown}");
}

#[test]
fn bench_quick_end_to_end_feeds_the_policy() {
    const T: &str = "bench_quick_end_to_end_feeds_the_policy";
    if !nix::unistd::geteuid().is_root() {
        return skip(T, "not root: the container and gvisor tiers need root");
    }
    let home = temp_home();
    let out_json = home.path().join("out.json");
    let chart = home.path().join("chart.svg");
    let o = cordon(
        home.path(),
        &[
            "bench",
            "--quick",
            "--budget",
            "1",
            "--json",
            "--output",
            out_json.to_str().unwrap(),
            "--chart",
            chart.to_str().unwrap(),
        ],
    );
    let stderr = text(&o.stderr);
    eprintln!("{stderr}");
    assert_eq!(o.status.code(), Some(0), "cordon bench failed: {stderr}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON object");
    check_bench_schema(&v);

    // Every tier this build has is reported, measured or skipped with its reason.
    let tiers = tier_names(&v);
    assert_eq!(
        tiers,
        Tier::ALL.iter().map(|t| t.as_str()).collect::<Vec<_>>()
    );
    if require_all() {
        for t in v["tiers"].as_array().unwrap() {
            assert_eq!(t["status"], "measured", "CORDON_REQUIRE_ALL: {t}");
        }
        for p in v["peers"].as_array().unwrap() {
            assert_eq!(p["status"], "measured", "CORDON_REQUIRE_ALL: {p}");
        }
    }

    // The same JSON in --output and in <data dir>/bench/last.json.
    let last = home.path().join("bench/last.json");
    let last_text = std::fs::read_to_string(&last).expect("last.json written");
    assert_eq!(
        serde_json::from_str::<Value>(&last_text).unwrap(),
        serde_json::from_str::<Value>(&std::fs::read_to_string(&out_json).unwrap()).unwrap()
    );

    let subjects: Vec<String> = v["figures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["subject"].as_str().unwrap().to_string())
        .collect();
    check_bench_chart(&chart, &subjects);
    // The wasm tier's whole-CLI figures run the `cordon` front beside cordon-full, as a
    // user's `cordon run` does, and say so.
    let wasm_cli: Vec<&Value> = v["figures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["subject"]
                .as_str()
                .is_some_and(|s| s.starts_with("cordon-run-wasm"))
        })
        .collect();
    if require_all() {
        assert_eq!(wasm_cli.len(), 2, "{subjects:?}");
    }
    for f in wasm_cli {
        let what = f["what"].as_str().unwrap();
        assert!(what.contains("through the `cordon` front"), "{what}");
    }

    // last.json round-trips through the policy's reader: each measured tier's cold start.
    let figures = cordon_policy::BenchFigures::from_bench_json(&last_text).unwrap();
    let measured: Vec<(Tier, u64)> = v["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "measured")
        .map(|t| {
            (
                t["tier"].as_str().unwrap().parse().unwrap(),
                t["cold_start"]["median_us"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(!measured.is_empty());
    for (t, us) in &measured {
        assert_eq!(figures.median_us.get(t), Some(us), "{t}");
    }
    assert_eq!(
        figures.median_us.len(),
        measured.len(),
        "peers are not tiers"
    );
    // The wasm tier's languages each carry a run of snippets in one live sandbox (10 with
    // --quick), which takes longer than one exec of the same snippet.
    for t in v["tiers"].as_array().unwrap() {
        if t["tier"] != "wasm" || t["status"] != "measured" {
            continue;
        }
        let langs = t["languages"].as_array().expect("wasm languages");
        assert_eq!(langs.len(), 2, "{t}");
        for l in langs {
            assert_eq!(l["run_snippets"], 10, "{l}");
            let run = l["run"]["median_us"].as_u64().expect("a run figure");
            let one = l["exec"]["median_us"].as_u64().unwrap();
            assert!(run >= one, "{l}");
            // And an exec after an agent's pause, measured as such.
            assert_eq!(l["pause_ms"], 20, "{l}");
            assert!(
                l["exec_after_pause"]["median_us"].as_u64().unwrap() > 0,
                "{l}"
            );
        }
    }

    // Tiers whose trivial snippet is a program carry the fork+exec floor inside a live
    // sandbox: a shell's loop of the program by its path, 10 execs a sample with --quick.
    for t in v["tiers"].as_array().unwrap() {
        if t["status"] != "measured" {
            continue;
        }
        let floor = &t["exec_floor"];
        if t["trivial"] == "argv `true`" {
            let program = floor["program"].as_str().expect("a floor's program");
            assert!(program.ends_with("bin/true"), "{t}");
            assert_eq!(floor["execs"], 10, "{t}");
            assert!(floor["per_exec"]["samples"].as_u64().unwrap() >= 1, "{t}");
            assert!(floor["per_exec"]["median_us"].as_u64().unwrap() > 0, "{t}");
        } else {
            assert!(floor.is_null(), "{t}");
        }
    }
    if require_all() {
        for tier in ["container", "gvisor", "microvm"] {
            let t = v["tiers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["tier"] == tier)
                .unwrap();
            assert!(t["exec_floor"].is_object(), "CORDON_REQUIRE_ALL: {t}");
        }
    }

    // --tier auto ranks by those figures: the fastest allowed tier is chosen.
    let explain = |home: &Path, available: &str| -> Value {
        let o = cordon(
            home,
            &[
                "policy",
                "explain",
                "--trust",
                "trusted",
                "--autonomy",
                "compute",
                "--available",
                available,
                "--json",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let names: Vec<&str> = measured.iter().map(|(t, _)| t.as_str()).collect();
    let d = explain(home.path(), &names.join(","));
    assert_eq!(d["ranking"]["by"], "bench", "{d}");
    let allowed: Vec<Tier> = serde_json::from_value(d["allowed"].clone()).unwrap();
    let fastest = measured
        .iter()
        .filter(|(t, _)| allowed.contains(t))
        .min_by_key(|(_, us)| *us)
        .map(|(t, _)| *t)
        .unwrap();
    assert_eq!(d["chosen"], fastest.as_str(), "{d}");

    // With the figures turned around the choice follows them, not the static order.
    let mut flipped: Value = serde_json::from_str(&last_text).unwrap();
    for f in flipped["figures"].as_array_mut().unwrap() {
        if f["kind"] == "tier" {
            let us = f["median_us"].as_u64().unwrap();
            f["median_us"] = Value::from(1_000_000_000 / us.max(1));
        }
    }
    std::fs::write(&last, flipped.to_string()).unwrap();
    let d = explain(home.path(), &names.join(","));
    let slowest = measured
        .iter()
        .filter(|(t, _)| allowed.contains(t))
        .max_by_key(|(_, us)| *us)
        .map(|(t, _)| *t)
        .unwrap();
    assert_eq!(d["chosen"], slowest.as_str(), "{d}");
    std::fs::write(&last, &last_text).unwrap();

    // And cordon cost reads this bench's capacity.
    let o = cordon(
        home.path(),
        &[
            "cost",
            "--executions-per-month",
            "100000",
            "--seconds-per-execution",
            "1",
            "--concurrency",
            "2",
            "--price-per-sandbox-second",
            "0.0001",
            "--machine-cost",
            "50",
            "--engineer-weeks",
            "0.05",
            "--engineer-week-cost",
            "1000",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let c: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        c["sources"]["starts_per_second"]
            .as_str()
            .unwrap()
            .starts_with("last bench"),
        "{c}"
    );
}

#[test]
fn bench_refuses_bad_flags_with_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let o = cordon(home.path(), &["bench", "--chart", "x.png"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("ending in .svg"),
        "{}",
        text(&o.stderr)
    );
    let o = cordon(home.path(), &["bench", "--peers", "docker"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("choose from host, bwrap, crun, runsc, qemu"));
    let o = cordon(home.path(), &["bench", "--iterations", "0"]);
    assert!(text(&o.stderr).contains("--iterations must be at least 1"));
}

const COST_ARGS: &[&str] = &[
    "cost",
    "--executions-per-month",
    "1000000",
    "--seconds-per-execution",
    "2",
    "--concurrency",
    "10",
    "--price-per-sandbox-second",
    "0.0001",
    "--fee-per-sandbox",
    "0.001",
    "--machine-cost",
    "100",
    "--engineer-weeks",
    "0.1",
    "--engineer-week-cost",
    "2000",
    "--machine-cores",
    "8",
    "--machine-memory",
    "16G",
];

/// A bench JSON as `cordon bench` writes it, trimmed to what cost reads, made on 8 cores.
fn fake_bench(home: &Path) {
    let v = serde_json::json!({
        "schema": "cordon-bench/1",
        "cores": 8,
        "memory_total_bytes": 17179869184u64,
        "figures": [],
        "tiers": [
            {"tier": "container", "status": "measured",
             "throughput": {"starts_per_sec": 50.0, "concurrency": 8, "window_s": 3.0, "completed": 150},
             "memory": {"per_sandbox_bytes": 104857600u64, "live_sandboxes": 4, "method": "test"}},
            {"tier": "microvm", "status": "skipped", "reason": "test"}
        ]
    });
    std::fs::create_dir_all(home.join("bench")).unwrap();
    std::fs::write(home.join("bench/last.json"), v.to_string()).unwrap();
}

#[test]
fn cost_end_to_end_matches_the_worked_example() {
    let home = tempfile::tempdir().unwrap();
    fake_bench(home.path());
    let chart = home.path().join("cost.svg");
    let mut args = COST_ARGS.to_vec();
    args.extend(["--json", "--chart", chart.to_str().unwrap()]);
    let o = cordon(home.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    // docs/cost.md's schema.
    assert_eq!(v["schema"], "cordon-cost/1");
    let e = &v["estimate"];
    for k in [
        "hosted_monthly",
        "self_hosted_monthly",
        "executions_per_machine_month",
        "hosted_per_execution",
        "ops_monthly",
        "crossover_executions_per_month",
    ] {
        assert!(e[k].is_f64(), "estimate.{k}: {e}");
    }
    for k in ["by_memory", "by_cpu", "by_start_rate", "by_volume", "total"] {
        assert!(e["machines"][k].is_u64(), "machines.{k}");
    }
    assert!(e["crossover_note"].is_string() && e["cheaper"].is_string());
    assert!(v["inputs"]["starts_per_second"].is_f64());
    assert_eq!(
        v["sources"]["starts_per_second"],
        "last bench, container tier"
    );
    // The figures of docs/cost.md's worked example, by hand.
    assert!((e["hosted_monthly"].as_f64().unwrap() - 1200.0).abs() < 1e-6);
    assert!((e["self_hosted_monthly"].as_f64().unwrap() - 400.0).abs() < 1e-6);
    assert_eq!(e["machines"]["total"], 2);
    let x = e["crossover_executions_per_month"].as_f64().unwrap();
    assert!((x - 400.0 / 0.0012).abs() < 1e-3, "{x}");
    assert_eq!(e["cheaper"], "self-hosted");

    let svg = std::fs::read_to_string(&chart).expect("the cost chart exists");
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let lines: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| n.attribute("stroke-width") == Some("2"))
        .collect();
    assert!(lines.len() >= 2, "both cost lines are drawn");
    assert!(
        doc.descendants()
            .any(|n| n.has_tag_name("text") && n.text().unwrap_or("").contains("crossover")),
        "the crossover is marked"
    );

    // The human output says the same.
    let o = cordon(home.path(), COST_ARGS);
    let out = text(&o.stdout);
    assert!(
        out.contains("$1200.00/month") && out.contains("$400.00/month"),
        "{out}"
    );
    assert!(out.contains("crossover: 333.3k executions/month"), "{out}");
}

#[test]
fn cost_without_a_bench_or_with_bad_input_says_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    let o = cordon(home.path(), COST_ARGS);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(
        err.contains("no bench figures") && err.contains("run `cordon bench`"),
        "{err}"
    );
    // Explicit figures replace the bench.
    let mut args = COST_ARGS.to_vec();
    args.extend([
        "--starts-per-second",
        "50",
        "--memory-per-sandbox",
        "100M",
        "--chart",
    ]);
    let chart = home.path().join("c.svg");
    args.push(chart.to_str().unwrap());
    let o = cordon(home.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("--starts-per-second"));

    let mut bad = args.clone();
    let i = bad
        .iter()
        .position(|a| *a == "--seconds-per-execution")
        .unwrap();
    bad[i + 1] = "0";
    let o = cordon(home.path(), &bad);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("--seconds-per-execution must be a number > 0"),
        "{}",
        text(&o.stderr)
    );
    // No crossover: hosted work worth less than a machine.
    let mut cheap = args.clone();
    let i = cheap
        .iter()
        .position(|a| *a == "--price-per-sandbox-second")
        .unwrap();
    cheap[i + 1] = "0.0000025";
    let i = cheap
        .iter()
        .position(|a| *a == "--fee-per-sandbox")
        .unwrap();
    cheap[i + 1] = "0";
    let o = cordon(home.path(), &cheap);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stdout).contains("crossover: none"),
        "{}",
        text(&o.stdout)
    );
}

/// `cordon run` records every policy decision, allowed or refused, before anything runs;
/// `cordon audit` reads them back.
#[test]
fn run_audits_every_policy_decision() {
    if !container_tier_here("run_audits_every_policy_decision") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let run_in_container = |trust: &str| {
        cordon(
            home.path(),
            &[
                "run",
                "--trust",
                trust,
                "--autonomy",
                "compute",
                "--tier",
                "container",
                "--",
                "true",
            ],
        )
    };
    // Untrusted input may not run in a container: refused (exit 125), naming the rule.
    let out = run_in_container("untrusted");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("untrusted-needs-kernel-boundary"));
    // Trusted work runs where the policy puts it.
    let out = run_in_container("trusted");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let db = home.path().join("cli");
    let out = cordon(
        home.path(),
        &[
            "audit",
            "--data-dir",
            db.to_str().unwrap(),
            "--kind",
            "policy",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let decisions: Vec<&str> = rows.iter().filter_map(|r| r["decision"].as_str()).collect();
    assert!(
        decisions.contains(&"deny") && decisions.contains(&"allow"),
        "{rows:?}"
    );
    let all = text(&out.stdout);
    assert!(all.contains("untrusted-needs-kernel-boundary"), "{all}");
    assert!(all.contains("\"chosen\":\"container\""), "{all}");
}

/// The `cordon` front runs `cordon run` on the container tier by itself and hands every
/// other command to `cordon-full` beside it; without `cordon-full` it says so. Checked with a
/// copy of the front alone in a directory (the sandbox init given by CORDON_SANDBOX_INIT).
#[test]
fn the_front_runs_container_runs_alone_and_hands_the_rest_over() {
    if !container_tier_here("the_front_runs_container_runs_alone_and_hands_the_rest_over") {
        return;
    }
    let init = Path::new(BIN).with_file_name("cordon-sandbox-init");
    assert!(init.is_file(), "{} not built", init.display());
    let home = temp_home();
    // Through the real layout: another command reaches cordon-full.
    let o = cordon(home.path(), &["policy", "show"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let alone = tempfile::tempdir().unwrap();
    let front = alone.path().join("cordon");
    std::fs::copy(BIN, &front).unwrap();
    let run = |args: &[&str]| {
        // Another test forking while the copy was open for writing holds that descriptor
        // until its child execs (ETXTBSY): wait for it, a bounded number of times.
        for _ in 0..50 {
            match Command::new(&front)
                .args(args)
                .env("CORDON_HOME", home.path())
                .env("CORDON_SANDBOX_INIT", &init)
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other.unwrap(),
            }
        }
        panic!("{} stayed busy", front.display());
    };
    let o = run(&["run", "--json", "--", "sh", "-c", "echo front; exit 3"]);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} / {}", text(&o.stdout), text(&o.stderr)));
    assert_eq!(v["stdout"], "front\n", "{v}");
    assert_eq!(v["tier"], "container", "{v}");
    assert_eq!(o.status.code(), Some(3));
    // Anything else needs cordon-full, which is not there (as after `make demo`): a clear
    // error at once, exit 125, naming the command that makes it ready.
    for (args, fix) in [
        (&["doctor"][..], "`cordon setup container`"),
        (
            &[
                "run", "--tier", "wasm", "--lang", "python", "-c", "print(1)",
            ][..],
            "the wasm tier is not set up on this machine: run `cordon setup wasm`",
        ),
        (
            &["run", "--tier", "gvisor", "--", "true"][..],
            "run `cordon setup gvisor`",
        ),
        (
            &["run", "--tier=microvm", "--", "true"][..],
            "run `cordon setup microvm`",
        ),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(fix),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    // `cordon setup` refuses what is not a tier before it runs anything.
    let o = run(&["setup", "kvm"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no tier 'kvm'"),
        "{}",
        text(&o.stderr)
    );
}

/// With `cordon-full` built but a tier's guest artifacts missing (a data dir no setup filled),
/// a request for that tier fails at once, never building anything, and names `cordon setup
/// TIER`; `cordon doctor` lists the missing parts with the same command.
#[test]
fn a_tier_whose_parts_are_missing_fails_at_once_naming_its_setup() {
    // A data dir with nothing built in it.
    let home = tempfile::tempdir().unwrap();
    let o = cordon(
        home.path(),
        &[
            "run", "--tier", "wasm", "--lang", "python", "-c", "print(1)",
        ],
    );
    assert!(!o.status.success(), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("cordon setup wasm"),
        "{}",
        text(&o.stderr)
    );
    let o = cordon(home.path(), &["doctor"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("fix: run `cordon setup wasm`"), "{out}");
    assert!(out.contains("fix: run `cordon setup microvm`"), "{out}");
}

/// Log lines written to a pipe (a CI log, a script capturing stderr) are plain text: no
/// terminal colour codes, through the front and through cordon-full alike.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    if !container_tier_here("logs_to_a_pipe_carry_no_colour_codes") {
        return;
    }
    let home = temp_home();
    for args in [
        &["run", "--", "true"][..],
        &["run", "--tier", "wasm", "--lang", "javascript", "-c", "0"][..],
    ] {
        let o = Command::new(BIN)
            .args(args)
            .env("CORDON_HOME", home.path())
            .env("CORDON_LOG", "debug")
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(err.contains("DEBUG"), "{args:?}: no debug log line: {err}");
        assert!(
            !err.contains('\u{1b}'),
            "{args:?}: colour codes in a pipe: {err:?}"
        );
    }
}

/// A private copy of the built sandbox init (in a directory the caller holds), so the
/// processes running it are this test's alone.
fn private_init() -> (tempfile::TempDir, PathBuf) {
    let built = Path::new(BIN).with_file_name("cordon-sandbox-init");
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("cordon-sandbox-init");
    std::fs::copy(&built, &init).unwrap();
    (dir, init)
}

/// `cordon run` starts the sandbox init before it parses its arguments. A run that then
/// needs no sandbox (bad flags, an invalid limit) stops it, and a run that used it leaves
/// nothing either: no process of that init (or of the namespaces it made) outlives the CLI.
/// The init is a private copy here, so other tests' sandboxes do not count.
#[test]
fn an_init_started_early_does_not_outlive_the_run() {
    if !container_tier_here("an_init_started_early_does_not_outlive_the_run") {
        return;
    }
    let (_dir, init) = private_init();
    let home = temp_home();
    for (args, ok) in [
        (&["run", "--pids", "0", "--", "true"][..], false),
        (&["run", "--no-such-flag", "--", "true"][..], false),
        (&["run", "--", "true"][..], true),
    ] {
        let o = Command::new(BIN)
            .args(args)
            .env("CORDON_HOME", home.path())
            .env("CORDON_SANDBOX_INIT", &init)
            .output()
            .unwrap();
        assert_eq!(o.status.success(), ok, "{args:?}: {}", text(&o.stderr));
        let left =
            cordon_testkit::procs::wait_until_none_run(&init, std::time::Duration::from_secs(3));
        assert!(left.is_empty(), "{args:?}: init processes left: {left:?}");
    }
}

/// A `cordon run` returns at its program's report and leaves the rest of the teardown to the
/// sandbox init, which holds the sandbox's host ids until it is done (ADR 0044). Killed
/// outright mid-run, the CLI leaves it to the init too: the sandbox's processes, its cgroup
/// in every hierarchy and its id lease are all gone within moments. Before, the init died
/// with the CLI (its parent-death signal was SIGKILL) and the sandbox's emptied cgroup
/// directories stayed until a server's sweep.
#[test]
fn a_run_killed_mid_program_is_ended_by_its_init() {
    let test = "a_run_killed_mid_program_is_ended_by_its_init";
    if !container_tier_here(test) {
        return;
    }
    killed_run_is_ended_by_its_init(Path::new(BIN), &["run", "--", "sleep", "60"]);
    // `cordon-full run` (a run with a policy step goes there) ends its sandbox the same way.
    let full = Path::new(BIN).with_file_name("cordon-full");
    if full.is_file() {
        killed_run_is_ended_by_its_init(
            &full,
            &[
                "run",
                "--trust",
                "trusted",
                "--autonomy",
                "compute",
                "--tier",
                "container",
                "--",
                "sleep",
                "60",
            ],
        );
    } else {
        skip(
            test,
            "cordon-full is not built beside cordon (cargo build --workspace)",
        );
    }
}

/// Starts `bin args` (a run of `sleep 60` on the container tier), stops its sandbox's agent
/// once it is up and kills the CLI, and checks that the sandbox's init ends the sandbox
/// within 5 s, letting the host ids go only after the cgroup.
fn killed_run_is_ended_by_its_init(bin: &Path, args: &[&str]) {
    use std::time::{Duration, Instant};
    let (_dir, init) = private_init();
    let home = temp_home();
    let mut run = Command::new(bin)
        .args(args)
        .env("CORDON_HOME", home.path())
        .env("CORDON_SANDBOX_INIT", &init)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The sandbox's agent: the process of the private init that is in a sandbox's cgroup.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (agent, id, id_base) = loop {
        let found = cordon_testkit::procs::running_from(&init)
            .into_iter()
            .find_map(|pid| {
                // The sandbox's PID 1: pid 1 of the one namespace below the host's (an exec's
                // reaper is pid 1 of one more).
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let nspid: Vec<&str> = status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))?
                    .split_whitespace()
                    .collect();
                if nspid.len() != 2 || nspid[1] != "1" {
                    return None;
                }
                let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                let id = cg
                    .split(['/', '\n'])
                    .find(|part| part.starts_with("sb-"))?
                    .to_string();
                let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).ok()?;
                let base: u32 = map.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, id, base))
            });
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no sandbox agent of {} showed up",
            init.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // A stopped agent never sees its channel close: only the init, told by the CLI's end,
    // can end the sandbox.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    run.kill().unwrap();
    run.wait().unwrap();
    let cgroup_dirs = || -> Vec<PathBuf> {
        let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
        roots.extend(
            std::fs::read_dir("/sys/fs/cgroup")
                .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        roots
            .into_iter()
            .map(|r| r.join("cordon").join(&id))
            .filter(|d| d.exists())
            .collect()
    };
    let lease_free = || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/run/cordon/ids/leases")
            .unwrap();
        let mut lock = nix::libc::flock {
            l_type: nix::libc::F_WRLCK as nix::libc::c_short,
            l_whence: nix::libc::SEEK_SET as nix::libc::c_short,
            l_start: nix::libc::off_t::from(id_base),
            l_len: 65536,
            l_pid: 0,
        };
        let free = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock)).is_ok();
        lock.l_type = nix::libc::F_UNLCK as nix::libc::c_short;
        let _ = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock));
        free
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = cordon_testkit::procs::running_from(&init);
        let dirs = cgroup_dirs();
        let free = lease_free();
        // The ids go last: never while the sandbox's cgroup is still there.
        assert!(
            dirs.is_empty() || !free,
            "{}: host ids {id_base} free while {dirs:?} are still there",
            bin.display()
        );
        if procs.is_empty() && dirs.is_empty() && free {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: 5 s after the run was killed: init processes {procs:?}, cgroup directories \
             {dirs:?}, host ids {id_base} free: {free}",
            bin.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The figures of one tier's row in `serve --bench` output: the numbers before each unit.
fn bench_row(out: &str, tier: &str, nth: usize) -> Vec<f64> {
    let line = out
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(tier))
        .nth(nth)
        .unwrap_or_else(|| panic!("no row {nth} for {tier} in:\n{out}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|w| w.trim_end_matches('x').parse::<f64>().ok())
        .collect()
}

/// `cordon serve --bench` measures warm against cold runs through a real server for each
/// tier asked for, and for the container tier splits a warm run into the backend's exec,
/// the program's own time and the create a cold run adds.
#[test]
fn serve_bench_measures_warm_and_cold_runs_through_the_api() {
    if !container_tier_here("serve_bench_measures_warm_and_cold_runs_through_the_api") {
        return;
    }
    let home = temp_home();
    let o = cordon(
        home.path(),
        &[
            "serve",
            "--bench",
            "--iterations",
            "5",
            "--tiers",
            "wasm,container",
        ],
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    for tier in ["wasm", "container"] {
        // run warm, run cold, cold/warm, exec in sandbox, of it the exec
        let r = bench_row(&out, tier, 0);
        assert_eq!(r.len(), 5, "{tier}: {r:?}\n{out}");
        assert!(r.iter().all(|v| *v > 0.0), "{tier}: {r:?}");
        assert!((r[2] - r[1] / r[0]).abs() < 0.1, "{tier}: ratio {r:?}");
        assert!(
            r[4] <= r[3],
            "{tier}: the backend's exec within the API's: {r:?}"
        );
    }
    // run warm, backend exec, program, create, bound
    let r = bench_row(&out, "container", 1);
    assert_eq!(r.len(), 5, "{r:?}\n{out}");
    assert!(r.iter().all(|v| *v > 0.0), "{r:?}");
    assert!(
        r[2] <= r[1] && r[1] <= r[0],
        "program within exec within run: {r:?}"
    );
    assert!((r[4] - (r[3] + r[2]) / r[2]).abs() < 0.1, "bound: {r:?}");
    // The wasm tier does not tell its program apart: no second row for it.
    assert_eq!(
        out.lines()
            .filter(|l| l.split_whitespace().next() == Some("wasm"))
            .count(),
        1,
        "{out}"
    );
}

/// A tiny HTTP/1.1 client for loopback (one request per connection).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), rest.to_string())
}

/// A `cordon serve` of this build on a loopback port, stopped when dropped.
struct Served {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn serve(home: &Path, extra: &str) -> Served {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cordon.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{}\"\nbind = \"127.0.0.1:0\"\n[[keys]]\ntenant = \"alice\"\nkey = \"{KEY}\"\n{extra}",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env("CORDON_HOME", home)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("://")
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(!addr.is_empty(), "cordon serve printed {line:?}");
    Served {
        child,
        addr,
        _dir: dir,
    }
}

const KEY: &str = "ck_adapters_test_key_0123456789abcdef0123456789";

/// One MCP tool call over streamable HTTP (initialize, initialized, the call); the tool's
/// text result or error text.
fn mcp_call(addr: &str, tool: &str, args: Value) -> String {
    let auth = format!("Bearer {KEY}");
    let base = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "cordon-test", "version": "1"}}});
    let (s, head, body) = http(addr, "POST", "/mcp", &base, &init.to_string());
    assert_eq!(s, 200, "{head}\n{body}");
    let session = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("mcp-session-id:")
                .then(|| l.split_once(':').unwrap().1.trim().to_string())
        })
        .expect("an MCP session id");
    let mut with = base.to_vec();
    with.push(("Mcp-Session-Id", session.as_str()));
    let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    http(addr, "POST", "/mcp", &with, &note.to_string());
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}});
    let (s, head, body) = http(addr, "POST", "/mcp", &with, &call.to_string());
    assert_eq!(s, 200, "{head}\n{body}");
    // One JSON-RPC answer, plain or as an SSE `data:` line.
    let msg = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim).or(Some(l.trim())))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no answer to the call: {body}"));
    msg["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_string)
        .or_else(|| msg["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| msg.to_string())
}

/// The same request refused through the HTTP API is refused identically through MCP and
/// `cordon run`: all three front doors build the engine's one request type and pass the
/// same gate (here a tenant whose ceiling equals the local operator's, so the rows differ
/// only in the door).
#[test]
fn the_three_front_doors_refuse_identically() {
    let home = temp_home();
    let server = serve(
        home.path(),
        "[tenants.alice]\ntrust = \"trusted\"\ntiers = [\"runtime\", \"wasm\", \"container\", \"gvisor\", \"microvm\"]\negress = [\"*\", \"0.0.0.0/0:*\", \"[::/0]:*\"]\n",
    );
    struct Row {
        body: Value,
        flags: &'static [&'static str],
        rule: &'static str,
        code: &'static str,
    }
    let rows = [
        Row {
            body: serde_json::json!({"trust": "untrusted", "autonomy": "compute", "tier": "container"}),
            flags: &[
                "--trust",
                "untrusted",
                "--autonomy",
                "compute",
                "--tier",
                "container",
                "--",
                "true",
            ],
            rule: "untrusted-needs-kernel-boundary",
            code: "policy_denied",
        },
        Row {
            body: serde_json::json!({"trust": "trusted", "autonomy": "read-files", "tier": "runtime"}),
            flags: &[
                "--trust",
                "trusted",
                "--autonomy",
                "read-files",
                "--tier",
                "runtime",
                "--lang",
                "javascript",
                "-c",
                "1",
            ],
            rule: "runtime-only-for-trusted-compute",
            code: "policy_denied",
        },
        Row {
            body: serde_json::json!({"trust": "trusted", "autonomy": "internet", "tier": "wasm", "allow_hosts": ["pkgs.example.test"]}),
            flags: &[
                "--trust",
                "trusted",
                "--autonomy",
                "internet",
                "--tier",
                "wasm",
                "--allow-host",
                "pkgs.example.test",
                "--lang",
                "python",
                "-c",
                "1",
            ],
            rule: "wasm-is-pure-computation",
            code: "policy_denied",
        },
        Row {
            body: serde_json::json!({"tier": "container", "allow_hosts": ["not a host!"]}),
            flags: &[
                "--tier",
                "container",
                "--allow-host",
                "not a host!",
                "--",
                "true",
            ],
            rule: "request",
            code: "invalid_request",
        },
    ];
    for row in &rows {
        // HTTP
        let auth = format!("Bearer {KEY}");
        let (s, head, body) = http(
            &server.addr,
            "POST",
            "/v1/sandboxes",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            &row.body.to_string(),
        );
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{head}\n{body}"));
        assert_eq!(v["code"], row.code, "HTTP {}: {v}", row.body);
        assert_eq!(v["rule"], row.rule, "HTTP {}: {v}", row.body);
        assert!(s == 403 || s == 400, "{s}");
        let message = v["message"].as_str().unwrap().to_string();
        // MCP
        let said = mcp_call(&server.addr, "create_sandbox", row.body.clone());
        assert!(
            said.contains(&message),
            "MCP {}: {said} (HTTP said {message})",
            row.body
        );
        assert!(said.contains(row.code), "MCP {}: {said}", row.body);
        // cordon run
        let mut argv = vec!["run"];
        argv.extend_from_slice(row.flags);
        let out = cordon(home.path(), &argv);
        assert_eq!(out.status.code(), Some(125), "cordon run {:?}", row.flags);
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("refused ({}): {message}", row.rule)),
            "cordon run {:?}: {err} (HTTP said {message})",
            row.flags
        );
    }
}

/// `--out` into a directory other users may write (no sticky bit) is refused, and nothing
/// is written there; into a private one, the file lands whole with nothing else beside it.
/// Before, the file was written under a predictable name in any directory, following a
/// link planted at that name: a user who could write the directory had root overwrite any
/// file with sandbox-chosen bytes.
#[test]
fn run_out_refuses_a_directory_others_may_write() {
    use std::os::unix::fs::PermissionsExt;
    if !container_tier_here("run_out_refuses_a_directory_others_may_write") {
        return;
    }
    let home = temp_home();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let dest = shared.path().join("result.txt");
    let out = format!("/work/result.txt:{}", dest.display());
    let args = [
        "run",
        "--out",
        &out,
        "--",
        "sh",
        "-c",
        "echo sandbox > result.txt",
    ];
    let o = cordon(home.path(), &args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains("no sticky bit") && err.contains("chmod +t"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(shared.path()).unwrap().count(),
        0,
        "{err}"
    );
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = cordon(home.path(), &args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "sandbox\n");
    assert_eq!(std::fs::read_dir(shared.path()).unwrap().count(), 1);
}

/// `--out` through a path one of whose parent directories a local user swapped for a link to
/// a directory only root may write: refused, nothing lands behind the link (before, root
/// followed the link and wrote the sandbox's bytes there).
#[test]
fn run_out_refuses_a_link_in_a_parent_directory() {
    use std::os::unix::fs::PermissionsExt;
    let test = "run_out_refuses_a_link_in_a_parent_directory";
    if !container_tier_here(test) {
        return;
    }
    let home = temp_home();
    let top = tempfile::tempdir().unwrap();
    let private = top.path().join("etc-cron.d");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let user = top.path().join("home-bob");
    std::fs::create_dir(&user).unwrap();
    std::os::unix::fs::symlink(&private, user.join("results")).unwrap();
    let out = format!("/work/job:{}", user.join("results").join("job").display());
    let args = [
        "run",
        "--out",
        &out,
        "--",
        "sh",
        "-c",
        "echo '* * * * * root id' > job",
    ];
    let o = cordon(home.path(), &args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0, "{err}");
}

/// `cordon template import|ls|rm` and `cordon run --template` as a user types them, on an
/// image file the test writes (the hostile busybox image of the template tests).
#[test]
fn templates_import_list_run_and_remove_from_the_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let test = "templates_import_list_run_and_remove_from_the_command_line";
    if !container_tier_here(test) {
        return;
    }
    let Some(bb) = cordon_testkit::image::busybox_layer() else {
        skip(test, "no /bin/busybox (apt-get install busybox-static)");
        return;
    };
    let home = tempfile::tempdir().unwrap();
    // As /var/lib/cordon: the sandbox's ids may pass through to a template's root.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let h = home.path();
    let image = h.join("image.oci.tar");
    std::fs::write(
        &image,
        cordon_testkit::image::hostile_image(Some(bb)).oci_tar(false),
    )
    .unwrap();
    let o = cordon(
        h,
        &[
            "template",
            "import",
            image.to_str().unwrap(),
            "--name",
            "mytool",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("imported mytool sha256:"),
        "{}",
        text(&o.stdout)
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("dropped layer") && err.contains("device node"),
        "{err}"
    );
    let o = cordon(h, &["template", "ls"]);
    let ls = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        ls.lines().any(|l| l.starts_with("mytool ")
            && l.contains("container")
            && l.contains("import oci-layout image.oci.tar")),
        "{ls}"
    );
    let o = cordon(
        h,
        &["run", "--template", "mytool", "--", "cat", "/greeting.txt"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "hello from layer 1\n");
    let o = cordon(
        h,
        &[
            "run",
            "--template",
            "mytool",
            "--lang",
            "sh",
            "-c",
            "echo $GREETING",
        ],
    );
    assert_eq!(text(&o.stdout), "from-the-image\n", "{}", text(&o.stderr));
    let o = cordon(
        h,
        &[
            "run",
            "--template",
            "mytool",
            "--lang",
            "python",
            "-c",
            "print(1)",
        ],
    );
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("no python interpreter"), "{err}");
    assert!(!err.contains(h.to_str().unwrap()), "{err}");
    let o = cordon(h, &["run", "--template", "nope", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("no template named \"nope\""),
        "{}",
        text(&o.stderr)
    );
    // `cordon bench --template` measures a run from the template beside the plain run.
    let o = cordon(
        h,
        &[
            "bench",
            "--tiers",
            "container",
            "--peers",
            "none",
            "--quick",
            "--budget",
            "1",
            "--template",
            "mytool",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let figures = v["figures"].as_array().unwrap();
    let row = |name: &str| figures.iter().find(|f| f["subject"] == name).cloned();
    let t = row("cordon-run-template").expect("a template row");
    assert_eq!(t["kind"], "cli");
    assert!(
        t["what"].as_str().unwrap().contains("--template mytool"),
        "{t}"
    );
    assert!(t["samples"].as_u64().unwrap() >= 3, "{t}");
    assert!(row("cordon-run").is_some(), "{v}");
    let o = cordon(h, &["template", "rm", "mytool"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("removed template mytool"),
        "{}",
        text(&o.stdout)
    );
    let o = cordon(h, &["template", "ls"]);
    assert!(!text(&o.stdout).contains("mytool"), "{}", text(&o.stdout));
}
