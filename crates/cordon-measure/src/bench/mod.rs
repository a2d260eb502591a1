//! `cordon bench`: what each tier costs on this host, beside the peers this host already has,
//! in one run. Every tier this build has is measured (iterating `Tier::ALL` through the
//! caller's [`Tiers`], so a new tier needs no change here); speed targets are checked by
//! reading these figures, never by timed tests. The JSON schema is documented in docs/bench.md.

mod live;
mod measures;
mod memory;
mod peers;
mod report;
mod snapshots;
mod startup;
mod stats;
mod store;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use cordon_core::Tier;

use stats::Budget;

use crate::Tiers;
use live::{Out, Plan, fail, live_tiers};
use measures::measure_memory;
pub use report::memory_total;

/// The schema of the JSON `cordon bench` writes (docs/bench.md).
pub use cordon_policy::bench_doc::SCHEMA;

#[derive(Args)]
pub struct BenchArgs {
    /// Most samples per measurement (default 20; 5 with --quick). A subject slower than its
    /// time budget stops earlier, after a minimum of 5 (3 with --quick).
    #[arg(long)]
    iterations: Option<usize>,
    /// Only these tiers (comma-separated); default every tier this build has.
    #[arg(long, value_delimiter = ',', value_name = "TIERS")]
    tiers: Option<Vec<Tier>>,
    /// Only these peers (comma-separated: host, bwrap, crun, runsc, qemu), or `none`.
    #[arg(long, value_delimiter = ',', value_name = "PEERS")]
    peers: Option<Vec<String>>,
    /// Small counts for CI: fewer samples, 10 snippets per agent run, 1 s throughput window.
    #[arg(long)]
    quick: bool,
    /// Snippets per agent run (default 40, the shape of an agent run; 10 with --quick).
    #[arg(long)]
    snippets: Option<usize>,
    /// Seconds each measurement may take before it stops at its minimum sample count
    /// (default 15; 1.5 with --quick).
    #[arg(long, value_name = "SECONDS")]
    budget: Option<f64>,
    /// Sandboxes held live at once for the memory figure (default 4; 2 with --quick).
    #[arg(long, value_name = "N")]
    live: Option<usize>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also write the JSON to this file (it is always written to <data dir>/bench/last.json).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Where to write the chart (SVG; default <data dir>/bench/last.svg).
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Also measure `cordon run --template NAME -- sh -c true` beside the plain `cordon run`
    /// (the template must exist: `cordon template ls`).
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// Measure snapshots and forks instead: per tier that has them, the snapshot's time and
    /// size (idle, and holding --hold MiB), the first exec of 1 and of --forks sandboxes
    /// started from it, beside pause and resume (docs/snapshots.md).
    #[arg(long)]
    snapshots: bool,
    /// With --snapshots: how many sandboxes one fork starts at once (default 10, at most 20).
    #[arg(long, value_name = "N", requires = "snapshots")]
    forks: Option<usize>,
    /// With --snapshots: MiB of random bytes the second source holds (default 256).
    #[arg(long, value_name = "MIB", requires = "snapshots")]
    hold: Option<u64>,
}

impl Plan {
    fn from_args(a: &BenchArgs) -> Result<Plan> {
        let (max, min, budget, snippets, runs, live, window) = if a.quick {
            (5, 3, 1.5, 10, 1, 2, 1.0)
        } else {
            (20, 5, 15.0, 40, 3, 4, 3.0)
        };
        let max = a.iterations.unwrap_or(max);
        if max == 0 {
            bail!("--iterations must be at least 1");
        }
        let budget = a.budget.unwrap_or(budget);
        if !budget.is_finite() || budget < 0.0 {
            bail!("--budget must be a number of seconds >= 0 (e.g. --budget 10)");
        }
        let live = a.live.unwrap_or(live);
        if live == 0 {
            bail!("--live must be at least 1 (the memory figure is per live sandbox)");
        }
        let snippets = a.snippets.unwrap_or(snippets);
        if snippets == 0 {
            bail!("--snippets must be at least 1 (an agent run of 0 snippets measures nothing)");
        }
        Ok(Plan {
            quick: a.quick,
            samples: Budget {
                max,
                min: min.min(max),
                budget: Duration::from_secs_f64(budget),
            },
            snippets,
            agent_runs: runs,
            live_sandboxes_for_memory: live,
            throughput_window_s: window,
            concurrency: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        })
    }
}

/// `cordon bench` over the tiers `tiers` has; its figures go to `<data_dir>/bench/`.
pub fn bench(args: BenchArgs, tiers: &Tiers, data_dir: &Path) -> Result<i32> {
    if args.snapshots {
        let plan = snapshots::Plan {
            tiers: args.tiers.as_deref(),
            forks: args.forks.unwrap_or(10),
            hold_mib: args.hold.unwrap_or(256),
            json: args.json,
        };
        return snapshots::run(&plan, tiers, data_dir);
    }
    let plan = Plan::from_args(&args)?;
    let chart_path = match &args.chart {
        Some(p) if p.extension().is_none_or(|e| e != "svg") => bail!(
            "the chart is written as SVG (it needs no fonts on this host): give --chart a path ending in .svg, e.g. --chart bench.svg"
        ),
        Some(p) => p.clone(),
        None => cordon_policy::bench_file(data_dir).with_file_name("last.svg"),
    };
    let selected: Vec<Tier> = match &args.tiers {
        Some(t) => Tier::ALL.into_iter().filter(|x| t.contains(x)).collect(),
        None => Tier::ALL.to_vec(),
    };
    let peer_names: Vec<String> = match &args.peers {
        Some(p) if p.iter().any(|x| x == "none") => Vec::new(),
        Some(p) => {
            for x in p {
                if !peers::NAMES.contains(&x.as_str()) {
                    bail!(
                        "unknown peer {x:?}: choose from {} (comma-separated) or none",
                        peers::NAMES.join(", ")
                    );
                }
            }
            p.clone()
        }
        None => peers::NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let scratch = std::env::temp_dir().join(format!("cordon-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("creating the scratch directory {}", scratch.display()))?;
    let last = cordon_policy::bench_file(data_dir);
    let result = run_bench(
        &args,
        tiers,
        &plan,
        &selected,
        &peer_names,
        &scratch,
        (&last, &chart_path),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn run_bench(
    args: &BenchArgs,
    build: &Tiers,
    plan: &Plan,
    selected: &[Tier],
    peer_names: &[String],
    scratch: &std::path::Path,
    (last, chart_path): (&std::path::Path, &std::path::Path),
) -> Result<i32> {
    let hidden = args.json || !std::io::stderr().is_terminal();
    // Steps: per tier memory + warm + exec + agent + throughput, and the start-up phase.
    let out = Out::new((selected.len() * 5 + 1) as u64, hidden);
    // Which tiers can run, each with the trivial snippet it runs (this is also the warm-up).
    let (mut tiers, live) = live_tiers(build, selected, &out);

    // Memory first, while the process has not yet grown through the other phases (an
    // in-process tier's figure is this process's growth).
    for lt in &live {
        let tier = lt.spec.tier;
        out.step(format!("{tier}: memory of live sandboxes"));
        match measure_memory(lt, plan.live_sandboxes_for_memory) {
            Ok(m) => tiers[lt.report_index].memory = Some(m),
            Err(e) => fail(&mut tiers[lt.report_index], "memory", &e, &out),
        }
        out.done();
    }

    // Start-up: every tier's cold start and every peer, interleaved round by round so that
    // drift in the host's load hits all alike.
    let (figures, peer_reports) = startup::measure(
        plan,
        &live,
        (peer_names, scratch),
        args.template.as_deref(),
        &mut tiers,
        &out,
    )?;

    // Per tier: warm start, exec, the agent run, throughput.
    for lt in &live {
        measures::tier(lt, plan, &mut tiers[lt.report_index], &out);
    }
    out.bar.finish_and_clear();
    report::finish(
        report::Done {
            plan,
            tiers,
            figures,
            peers: peer_reports,
        },
        (args.json, args.output.as_deref()),
        (last, chart_path),
    )
}
