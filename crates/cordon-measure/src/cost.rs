//! `cordon cost`: hosted sandboxes or self-hosted Cordon, for your volume. Every price is the
//! user's input (no vendor prices are built in); this host's capacity comes from the last
//! `cordon bench`. The model is written down in docs/cost.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use cordon_core::Tier;
use cordon_core::units::{format_size, parse_size};
use serde::Serialize;

use crate::chart::human;

/// Seconds in the month the model uses (30 days).
pub const MONTH_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

#[derive(Args)]
pub struct CostArgs {
    /// Executions per month (your volume).
    #[arg(long, value_name = "N")]
    executions_per_month: f64,
    /// Seconds one execution keeps a sandbox busy.
    #[arg(long, value_name = "SECONDS")]
    seconds_per_execution: f64,
    /// Sandboxes running at once at the peak.
    #[arg(long, value_name = "N")]
    concurrency: f64,
    /// Hosted price per sandbox-second (your vendor's, in your currency).
    #[arg(long, value_name = "PRICE")]
    price_per_sandbox_second: f64,
    /// Hosted fee per sandbox created.
    #[arg(long, value_name = "PRICE", default_value_t = 0.0)]
    fee_per_sandbox: f64,
    /// Executions that share one sandbox (1: a fresh sandbox each; 40: an agent run).
    #[arg(long, value_name = "N", default_value_t = 1.0)]
    executions_per_sandbox: f64,
    /// What one machine costs per month, all in (rent or amortized purchase, power, space).
    #[arg(long, value_name = "PRICE")]
    machine_cost: f64,
    /// Engineer-weeks per month to run the fleet (patching, on-call, upgrades).
    #[arg(long, value_name = "WEEKS")]
    engineer_weeks: f64,
    /// What one engineer-week costs.
    #[arg(long, value_name = "PRICE")]
    engineer_week_cost: f64,
    /// Cores of the machine priced (default: this host's).
    #[arg(long, value_name = "N")]
    machine_cores: Option<f64>,
    /// Memory of the machine priced, e.g. 64G (default: this host's).
    #[arg(long, value_name = "SIZE")]
    machine_memory: Option<String>,
    /// Cores a busy sandbox keeps busy (0: do not bound by CPU).
    #[arg(long, value_name = "CORES", default_value_t = 1.0)]
    cpu_per_sandbox: f64,
    /// The tier whose bench figures to use (default: the strongest the last bench measured).
    #[arg(long)]
    tier: Option<Tier>,
    /// Sandboxes one machine starts per second (overrides the bench's figure).
    #[arg(long, value_name = "N")]
    starts_per_second: Option<f64>,
    /// Peak host memory of one live sandbox, e.g. 150M (overrides the bench's figure).
    #[arg(long, value_name = "SIZE")]
    memory_per_sandbox: Option<String>,
    /// The bench JSON to read (default <data dir>/bench/last.json).
    #[arg(long, value_name = "FILE")]
    bench: Option<PathBuf>,
    /// Currency symbol for the output.
    #[arg(long, default_value = "$")]
    currency: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Where to write the chart (SVG; default <data dir>/bench/cost.svg).
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
}

/// Everything the model needs, in plain numbers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Inputs {
    pub executions_per_month: f64,
    pub seconds_per_execution: f64,
    pub concurrency: f64,
    pub executions_per_sandbox: f64,
    pub price_per_sandbox_second: f64,
    pub fee_per_sandbox: f64,
    pub machine_cost: f64,
    pub engineer_weeks: f64,
    pub engineer_week_cost: f64,
    pub machine_cores: f64,
    pub machine_memory_bytes: f64,
    pub cpu_per_sandbox: f64,
    /// Sandboxes one machine starts per second.
    pub starts_per_second: f64,
    /// Peak host memory of one live sandbox.
    pub memory_per_sandbox_bytes: f64,
}

/// How many machines, and which constraint asked for how many.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Machines {
    pub by_memory: u64,
    pub by_cpu: u64,
    pub by_start_rate: u64,
    pub by_volume: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Estimate {
    pub hosted_monthly: f64,
    pub self_hosted_monthly: f64,
    pub machines: Machines,
    /// Sandboxes one machine holds at once (memory and CPU).
    pub slots_per_machine: u64,
    /// Executions one fully used machine serves in a month.
    pub executions_per_machine_month: f64,
    pub hosted_per_execution: f64,
    pub ops_monthly: f64,
    /// Executions per month above which self-hosting is cheaper at every volume; `None`
    /// when there is no such volume (`crossover_note` says why).
    pub crossover_executions_per_month: Option<f64>,
    pub crossover_note: String,
    pub cheaper: &'static str,
}

fn check(name: &str, v: f64, ok: bool, want: &str) -> Result<(), String> {
    if !v.is_finite() || !ok {
        return Err(format!("--{name} must be {want} (got {v})"));
    }
    Ok(())
}

impl Inputs {
    /// Refuses inputs the model cannot use, naming the flag and what it needs.
    pub fn validate(&self) -> Result<(), String> {
        let nonneg = "a number >= 0";
        let pos = "a number > 0";
        check(
            "executions-per-month",
            self.executions_per_month,
            self.executions_per_month >= 0.0,
            nonneg,
        )?;
        check(
            "seconds-per-execution",
            self.seconds_per_execution,
            self.seconds_per_execution > 0.0,
            pos,
        )?;
        check(
            "concurrency",
            self.concurrency,
            self.concurrency >= 1.0,
            "at least 1",
        )?;
        check(
            "executions-per-sandbox",
            self.executions_per_sandbox,
            self.executions_per_sandbox >= 1.0,
            "at least 1",
        )?;
        for (n, v) in [
            ("price-per-sandbox-second", self.price_per_sandbox_second),
            ("fee-per-sandbox", self.fee_per_sandbox),
            ("machine-cost", self.machine_cost),
            ("engineer-weeks", self.engineer_weeks),
            ("engineer-week-cost", self.engineer_week_cost),
            ("cpu-per-sandbox", self.cpu_per_sandbox),
        ] {
            check(n, v, v >= 0.0, nonneg)?;
        }
        for (n, v) in [
            ("machine-cores", self.machine_cores),
            ("machine-memory", self.machine_memory_bytes),
            ("starts-per-second", self.starts_per_second),
            ("memory-per-sandbox", self.memory_per_sandbox_bytes),
        ] {
            check(n, v, v > 0.0, pos)?;
        }
        if self.memory_per_sandbox_bytes > self.machine_memory_bytes {
            return Err(format!(
                "one sandbox needs {} but the machine has {}: give a larger --machine-memory",
                format_size(self.memory_per_sandbox_bytes as u64),
                format_size(self.machine_memory_bytes as u64)
            ));
        }
        if self.cpu_per_sandbox > self.machine_cores {
            return Err(format!(
                "one sandbox needs {} cores but the machine has {}: give a larger --machine-cores or a smaller --cpu-per-sandbox",
                self.cpu_per_sandbox, self.machine_cores
            ));
        }
        Ok(())
    }

    /// Hosted cost per execution: its sandbox-seconds plus its share of a sandbox's fee.
    pub fn hosted_per_execution(&self) -> f64 {
        self.seconds_per_execution * self.price_per_sandbox_second
            + self.fee_per_sandbox / self.executions_per_sandbox
    }

    pub fn hosted_monthly(&self, executions: f64) -> f64 {
        executions * self.hosted_per_execution()
    }

    pub fn ops_monthly(&self) -> f64 {
        self.engineer_weeks * self.engineer_week_cost
    }

    /// Sandboxes one machine holds at once: by memory, and by CPU unless that is 0.
    pub fn slots(&self) -> u64 {
        let by_mem = (self.machine_memory_bytes / self.memory_per_sandbox_bytes).floor();
        let by_cpu = if self.cpu_per_sandbox > 0.0 {
            (self.machine_cores / self.cpu_per_sandbox).floor()
        } else {
            f64::INFINITY
        };
        by_mem.min(by_cpu) as u64
    }

    /// Executions one machine serves in a month when fully used: bound by how many
    /// sandboxes it holds (each busy `seconds_per_execution`) and how fast it starts them.
    pub fn executions_per_machine_month(&self) -> f64 {
        let by_slots = self.slots() as f64 / self.seconds_per_execution;
        let by_starts = self.starts_per_second * self.executions_per_sandbox;
        MONTH_SECONDS * by_slots.min(by_starts)
    }

    /// Machines the peak concurrency needs, whatever the volume.
    fn peak_machines(&self) -> (u64, u64, u64) {
        let ceil = |v: f64| v.ceil().max(1.0) as u64;
        let by_mem = ceil(
            self.concurrency / (self.machine_memory_bytes / self.memory_per_sandbox_bytes).floor(),
        );
        let by_cpu = if self.cpu_per_sandbox > 0.0 {
            ceil(self.concurrency / (self.machine_cores / self.cpu_per_sandbox).floor())
        } else {
            1
        };
        // At the peak, `concurrency` sandboxes each live executions_per_sandbox x seconds.
        let starts_needed =
            self.concurrency / (self.executions_per_sandbox * self.seconds_per_execution);
        let by_starts = ceil(starts_needed / self.starts_per_second);
        (by_mem, by_cpu, by_starts)
    }

    pub fn machines(&self, executions: f64) -> Machines {
        let (by_memory, by_cpu, by_start_rate) = self.peak_machines();
        let by_volume = (executions / self.executions_per_machine_month()).ceil() as u64;
        Machines {
            by_memory,
            by_cpu,
            by_start_rate,
            by_volume,
            total: by_memory.max(by_cpu).max(by_start_rate).max(by_volume),
        }
    }

    pub fn self_hosted_monthly(&self, executions: f64) -> f64 {
        self.machines(executions).total as f64 * self.machine_cost + self.ops_monthly()
    }

    /// The volume above which self-hosting is cheaper at every volume, or why there is none.
    ///
    /// Self-hosted cost is a step function: with `j` machines it is `j*M + ops` while the
    /// volume fits them (up to `j*cap`); hosted is `a*E`. If `a*cap <= M` a machine's worth
    /// of executions costs less hosted than the machine, so hosted is never dearer. Else the
    /// steps rise slower than the line: find the last step whose left edge is still not
    /// cheaper (it ends every "dearer again" window) and where the line crosses it.
    pub fn crossover(&self) -> (Option<f64>, String) {
        let a = self.hosted_per_execution();
        let cap = self.executions_per_machine_month();
        let m = self.machine_cost;
        let ops = self.ops_monthly();
        let (pm, pc, ps) = self.peak_machines();
        let peak = pm.max(pc).max(ps) as f64;
        if a <= 0.0 {
            return (
                None,
                "hosted costs nothing per execution at these prices: self-hosting is never cheaper"
                    .into(),
            );
        }
        if a * cap <= m {
            return (
                None,
                format!(
                    "one machine serves at most {} executions a month for {}; hosted charges {} for as many, so hosted is cheaper at every volume",
                    human(cap),
                    money_plain(m),
                    money_plain(a * cap)
                ),
            );
        }
        // With j machines (j > peak) the step starts just above (j-1)*cap; it is cheaper
        // all along iff j*M + ops < a*(j-1)*cap, i.e. j > (a*cap + ops)/(a*cap - m).
        let threshold = (a * cap + ops) / (a * cap - m);
        let last_dearer = (threshold.ceil() - 1.0).max(peak);
        let line_meets = (last_dearer * m + ops) / a;
        let x = line_meets.min(last_dearer * cap).max(0.0);
        (
            Some(x),
            format!(
                "above {} executions a month self-hosting is cheaper at every volume",
                human(x)
            ),
        )
    }

    pub fn estimate(&self) -> Result<Estimate, String> {
        self.validate()?;
        let e = self.executions_per_month;
        let hosted = self.hosted_monthly(e);
        let selfh = self.self_hosted_monthly(e);
        let (crossover, note) = self.crossover();
        Ok(Estimate {
            hosted_monthly: hosted,
            self_hosted_monthly: selfh,
            machines: self.machines(e),
            slots_per_machine: self.slots(),
            executions_per_machine_month: self.executions_per_machine_month(),
            hosted_per_execution: self.hosted_per_execution(),
            ops_monthly: self.ops_monthly(),
            crossover_executions_per_month: crossover,
            crossover_note: note,
            cheaper: if selfh < hosted {
                "self-hosted"
            } else {
                "hosted"
            },
        })
    }

    /// Points for the chart: both costs from 0 to `xmax`, with the self-hosted steps drawn
    /// as steps.
    pub fn curve(&self, xmax: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut xs: Vec<f64> = (0..=400).map(|i| xmax * i as f64 / 400.0).collect();
        let cap = self.executions_per_machine_month();
        let steps = (xmax / cap).floor() as u64;
        if steps <= 500 {
            for k in 1..=steps {
                let x = k as f64 * cap;
                xs.push(x);
                xs.push((x * (1.0 + 1e-9)).min(xmax));
            }
        }
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let hosted = xs.iter().map(|&x| self.hosted_monthly(x)).collect();
        let selfh = xs.iter().map(|&x| self.self_hosted_monthly(x)).collect();
        (xs, hosted, selfh)
    }
}

fn money_plain(v: f64) -> String {
    amount(v)
}

/// Two decimals, or enough significant digits for amounts under one unit (0.0012).
fn amount(v: f64) -> String {
    if v == 0.0 || v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        let digits = (-v.abs().log10()).ceil() as usize + 2;
        format!("{v:.digits$}")
    }
}

/// What the last bench measured for one tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchCapacity {
    pub tier: Tier,
    pub starts_per_second: f64,
    pub memory_per_sandbox_bytes: f64,
    pub cores: Option<f64>,
    pub memory_total_bytes: Option<f64>,
}

/// Reads a tier's capacity from bench JSON (schema cordon-bench/1): the given tier, or the
/// strongest tier with both figures.
pub fn capacity_from_bench(text: &str, tier: Option<Tier>) -> Result<BenchCapacity, String> {
    let doc = cordon_policy::bench_doc::BenchDoc::parse(text)?;
    if doc.tiers.is_empty() {
        return Err(
            "the bench JSON has no `tiers` (written by an older cordon): run `cordon bench` again"
                .into(),
        );
    }
    let figures = |t: &cordon_policy::bench_doc::TierReport| -> Option<(Tier, f64, f64)> {
        let sps = t.throughput.as_ref()?.starts_per_sec;
        let mem = t.memory.as_ref()?.per_sandbox_bytes as f64;
        Some((t.tier, sps, mem))
    };
    let tiers = &doc.tiers;
    let found: Vec<(Tier, f64, f64)> = tiers.iter().filter_map(figures).collect();
    let pick = match tier {
        Some(want) => found.iter().find(|(t, _, _)| *t == want).ok_or_else(|| {
            format!(
                "the last bench has no throughput and memory figures for the {want} tier: run `cordon bench --tiers {want}` (or give --starts-per-second and --memory-per-sandbox)"
            )
        })?,
        None => found.iter().max_by_key(|(t, _, _)| *t).ok_or(
            "the last bench measured no tier's throughput and memory: run `cordon bench` (or give --starts-per-second and --memory-per-sandbox)",
        )?,
    };
    Ok(BenchCapacity {
        tier: pick.0,
        starts_per_second: pick.1,
        // A tier whose sandboxes cost no measurable memory still takes some: 1 MiB floor.
        memory_per_sandbox_bytes: pick.2.max(1024.0 * 1024.0),
        cores: doc.cores.map(|c| c as f64),
        memory_total_bytes: doc.memory_total_bytes.map(|m| m as f64),
    })
}

fn size_arg(flag: &str, s: &str) -> Result<f64> {
    parse_size(s)
        .map(|v| v as f64)
        .map_err(|e| anyhow::anyhow!("--{flag} {s:?}: {e} (e.g. 64G or 150M)"))
}

/// `cordon cost`; the last bench and the default chart are under `data_dir`.
pub fn cost(args: CostArgs, data_dir: &Path) -> Result<i32> {
    let cap = capacity(&args, data_dir)?;
    let inputs = Inputs {
        executions_per_month: args.executions_per_month,
        seconds_per_execution: args.seconds_per_execution,
        concurrency: args.concurrency,
        executions_per_sandbox: args.executions_per_sandbox,
        price_per_sandbox_second: args.price_per_sandbox_second,
        fee_per_sandbox: args.fee_per_sandbox,
        machine_cost: args.machine_cost,
        engineer_weeks: args.engineer_weeks,
        engineer_week_cost: args.engineer_week_cost,
        machine_cores: cap.machine_cores,
        machine_memory_bytes: cap.machine_memory,
        cpu_per_sandbox: args.cpu_per_sandbox,
        starts_per_second: cap.starts,
        memory_per_sandbox_bytes: cap.mem,
    };
    let est = inputs
        .estimate()
        .map_err(|e| anyhow::anyhow!("{e}; see `cordon cost --help`"))?;
    let chart = match &args.chart {
        Some(p) if p.extension().is_none_or(|e| e != "svg") => bail!(
            "the chart is written as SVG: give --chart a path ending in .svg, e.g. --chart cost.svg"
        ),
        Some(p) => p.clone(),
        None => data_dir.join("bench").join("cost.svg"),
    };
    draw(&inputs, &est, &chart, &args.currency)?;
    if args.json {
        let v = serde_json::json!({
            "schema": "cordon-cost/1",
            "inputs": inputs,
            "sources": {"starts_per_second": cap.starts_source, "memory_per_sandbox": cap.mem_source},
            "estimate": est,
            "chart": chart,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    print_estimate(
        &inputs,
        &est,
        (&cap.starts_source, &cap.mem_source),
        &chart,
        &args.currency,
    );
    Ok(0)
}

/// One machine's capacity and where each figure came from (a flag, or the last bench).
struct Capacity {
    machine_cores: f64,
    machine_memory: f64,
    starts: f64,
    starts_source: String,
    mem: f64,
    mem_source: String,
}

/// The machine's cores and memory, and its start rate and memory per sandbox from the flags
/// or the last bench (scaled to the machine's cores).
fn capacity(args: &CostArgs, data_dir: &Path) -> Result<Capacity> {
    let bench_path = args
        .bench
        .clone()
        .unwrap_or_else(|| cordon_policy::bench_file(data_dir));
    let mem_override = args
        .memory_per_sandbox
        .as_deref()
        .map(|s| size_arg("memory-per-sandbox", s))
        .transpose()?;
    let need_bench = args.starts_per_second.is_none() || mem_override.is_none();
    let bench = if need_bench {
        let text = match std::fs::read_to_string(&bench_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "no bench figures at {}: run `cordon bench` on the machine you would self-host on (or give both --starts-per-second and --memory-per-sandbox)",
                bench_path.display()
            ),
            Err(e) => bail!("reading {}: {e}", bench_path.display()),
        };
        Some(
            capacity_from_bench(&text, args.tier)
                .map_err(|e| anyhow::anyhow!("{}: {e}", bench_path.display()))?,
        )
    } else {
        None
    };
    let here_cores = std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0);
    let machine_cores = args.machine_cores.unwrap_or(here_cores);
    let machine_memory = match &args.machine_memory {
        Some(s) => size_arg("machine-memory", s)?,
        None => crate::bench::memory_total() as f64,
    };
    // The bench's starts/s used every core of the host it ran on; a machine with more or
    // fewer cores is assumed to scale with them.
    let (starts, starts_source) = match (args.starts_per_second, &bench) {
        (Some(s), _) => (s, "--starts-per-second".to_string()),
        (None, Some(b)) => {
            let bench_cores = b.cores.unwrap_or(here_cores).max(1.0);
            let scaled = b.starts_per_second * machine_cores / bench_cores;
            (
                scaled,
                if (machine_cores - bench_cores).abs() < f64::EPSILON {
                    format!("last bench, {} tier", b.tier)
                } else {
                    format!(
                        "last bench, {} tier, scaled from {bench_cores} to {machine_cores} cores",
                        b.tier
                    )
                },
            )
        }
        (None, None) => bail!("no starts-per-second figure: give --starts-per-second"),
    };
    let (mem, mem_source) = match (mem_override, &bench) {
        (Some(m), _) => (m, "--memory-per-sandbox".to_string()),
        (None, Some(b)) => (
            b.memory_per_sandbox_bytes,
            format!("last bench, {} tier", b.tier),
        ),
        (None, None) => bail!("no memory-per-sandbox figure: give --memory-per-sandbox"),
    };
    Ok(Capacity {
        machine_cores,
        machine_memory,
        starts,
        starts_source,
        mem,
        mem_source,
    })
}

/// Prints the estimate: the workload, one machine's capacity, both costs and the crossover.
fn print_estimate(
    inputs: &Inputs,
    est: &Estimate,
    (starts_source, mem_source): (&str, &str),
    chart: &Path,
    c: &str,
) {
    let money = |v: f64| format!("{c}{}", amount(v));
    let e = inputs.executions_per_month;
    println!(
        "workload: {} executions/month, {} s each, peak {} at once, {} per sandbox",
        human(e),
        inputs.seconds_per_execution,
        inputs.concurrency,
        inputs.executions_per_sandbox
    );
    println!(
        "capacity of one machine ({} cores, {}): {:.1} sandboxes started/s ({starts_source}), {} per sandbox ({mem_source}) -> {} sandboxes at once, {} executions/month",
        inputs.machine_cores,
        format_size(inputs.machine_memory_bytes as u64),
        inputs.starts_per_second,
        format_size(inputs.memory_per_sandbox_bytes as u64),
        est.slots_per_machine,
        human(est.executions_per_machine_month)
    );
    let avg = e * inputs.seconds_per_execution / MONTH_SECONDS;
    if avg > inputs.concurrency {
        println!(
            "note: the volume keeps {avg:.1} sandboxes busy on average, more than --concurrency {}; machines are sized for the volume",
            inputs.concurrency
        );
    }
    println!();
    println!(
        "hosted:      {:>14}/month  ({} per execution: {} s x {c}{}/s + {c}{} fee / {} execution(s))",
        money(est.hosted_monthly),
        money(est.hosted_per_execution),
        inputs.seconds_per_execution,
        inputs.price_per_sandbox_second,
        inputs.fee_per_sandbox,
        inputs.executions_per_sandbox
    );
    let m = &est.machines;
    println!(
        "self-hosted: {:>14}/month  ({} machine(s) x {} + {} engineer-weeks x {} = {})",
        money(est.self_hosted_monthly),
        m.total,
        money(inputs.machine_cost),
        inputs.engineer_weeks,
        money(inputs.engineer_week_cost),
        money(est.ops_monthly)
    );
    println!(
        "             machines needed by memory {}, by CPU {}, by start rate {}, by volume {}",
        m.by_memory, m.by_cpu, m.by_start_rate, m.by_volume
    );
    println!(
        "\ncheaper at your volume: {} (by {})",
        est.cheaper,
        money((est.hosted_monthly - est.self_hosted_monthly).abs())
    );
    match est.crossover_executions_per_month {
        Some(x) => println!(
            "crossover: {} executions/month ({x:.0}); {}",
            human(x),
            est.crossover_note
        ),
        None => println!("crossover: none; {}", est.crossover_note),
    }
    println!("chart: {}", chart.display());
}

fn draw(inputs: &Inputs, est: &Estimate, path: &Path, currency: &str) -> Result<()> {
    let e = inputs.executions_per_month;
    let xmax = [
        e * 2.0,
        est.crossover_executions_per_month.unwrap_or(0.0) * 1.5,
        est.executions_per_machine_month * 0.01,
    ]
    .into_iter()
    .fold(1.0, f64::max);
    let (volumes, hosted, self_hosted) = inputs.curve(xmax);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    crate::chart::cost_svg(
        path,
        &crate::chart::CostCurve {
            volumes,
            hosted,
            self_hosted,
            crossover: est.crossover_executions_per_month,
            volume: e,
            currency: currency.to_string(),
        },
    )
    .with_context(|| format!("drawing the chart {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    /// The worked example in docs/cost.md.
    fn example() -> Inputs {
        Inputs {
            executions_per_month: 1_000_000.0,
            seconds_per_execution: 2.0,
            concurrency: 10.0,
            executions_per_sandbox: 1.0,
            price_per_sandbox_second: 0.0001,
            fee_per_sandbox: 0.001,
            machine_cost: 100.0,
            engineer_weeks: 0.1,
            engineer_week_cost: 2000.0,
            machine_cores: 8.0,
            machine_memory_bytes: 16384.0 * MIB,
            cpu_per_sandbox: 1.0,
            starts_per_second: 50.0,
            memory_per_sandbox_bytes: 100.0 * MIB,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn the_worked_example_by_hand() {
        let i = example();
        // Memory holds 163 sandboxes, CPU 8: 8 slots.
        assert_eq!(i.slots(), 8);
        // 8 slots / 2 s = 4 executions/s; 50 starts/s; 4 x 2,592,000.
        assert!(close(i.executions_per_machine_month(), 10_368_000.0));
        // 2 s x 0.0001 + 0.001 fee = 0.0012 per execution; x 1M.
        assert!(close(i.hosted_per_execution(), 0.0012));
        let est = i.estimate().unwrap_or_else(|e| panic!("{e}"));
        assert!(close(est.hosted_monthly, 1200.0));
        // Peak 10: memory 1 machine, CPU ceil(10/8) = 2, starts 10/2 s = 5/s -> 1, volume 1.
        assert_eq!(
            est.machines,
            Machines {
                by_memory: 1,
                by_cpu: 2,
                by_start_rate: 1,
                by_volume: 1,
                total: 2
            }
        );
        // 2 x 100 + 0.1 x 2000.
        assert!(close(est.self_hosted_monthly, 400.0));
        assert_eq!(est.cheaper, "self-hosted");
        // Two machines and ops cost 400: hosted reaches it at 400 / 0.0012.
        let x = est
            .crossover_executions_per_month
            .unwrap_or_else(|| panic!("no crossover"));
        assert!(close(x, 400.0 / 0.0012), "{x}");
        assert!(i.self_hosted_monthly(x * 1.0001) < i.hosted_monthly(x * 1.0001));
        assert!(i.self_hosted_monthly(x * 0.9999) >= i.hosted_monthly(x * 0.9999));
    }

    #[test]
    fn crossover_on_a_later_step() {
        // Dear machines: the line crosses the 5-machine step. cap = 10,368,000, a*cap =
        // 12,441.6; (a*cap + ops)/(a*cap - M) = 12,641.6/2,441.6 = 5.18 -> the last step
        // whose start is dearer is 5 machines (from 41,472,000); the line meets 5 x 10,000
        // + 200 at 50,200 / 0.0012 = 41,833,333.3.
        let i = Inputs {
            machine_cost: 10_000.0,
            ..example()
        };
        let (x, _) = i.crossover();
        let x = x.unwrap_or_else(|| panic!("no crossover"));
        assert!(close(x, 50_200.0 / 0.0012), "{x}");
        // Dearer just below it, cheaper at every volume above it (spot checks on steps).
        assert!(i.self_hosted_monthly(x - 1000.0) > i.hosted_monthly(x - 1000.0));
        for v in [x + 1.0, 51_840_001.0, 62_208_001.0, 1e9, 1e10] {
            assert!(
                i.self_hosted_monthly(v) < i.hosted_monthly(v),
                "self-hosted dearer at {v}"
            );
        }
        // Below the crossover there are cheaper windows (the end of the 4-machine step),
        // which is why the crossover is defined as "cheaper at every larger volume".
        assert!(i.self_hosted_monthly(41_472_000.0) < i.hosted_monthly(41_472_000.0));
    }

    #[test]
    fn no_crossover_when_a_machine_costs_more_than_its_hosted_work() {
        // a = 2 x 0.0000025 = 0.000005; a*cap = 51.84 < 100 a machine.
        let i = Inputs {
            price_per_sandbox_second: 0.0000025,
            fee_per_sandbox: 0.0,
            ..example()
        };
        let est = i.estimate().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(est.crossover_executions_per_month, None);
        assert!(
            est.crossover_note
                .contains("hosted is cheaper at every volume")
        );
        assert_eq!(est.cheaper, "hosted");
        assert!(close(est.hosted_monthly, 5.0));
        for v in [0.0, 1e6, 1e8, 1e10] {
            assert!(i.self_hosted_monthly(v) >= i.hosted_monthly(v));
        }
        let free = Inputs {
            price_per_sandbox_second: 0.0,
            fee_per_sandbox: 0.0,
            ..example()
        };
        assert_eq!(free.crossover().0, None);
    }

    #[test]
    fn executions_per_sandbox_share_the_fee_and_the_starts() {
        let i = Inputs {
            executions_per_sandbox: 40.0,
            ..example()
        };
        // 0.0002 + 0.001 / 40.
        assert!(close(i.hosted_per_execution(), 0.000225));
        // Starts bound: 50/s x 40 = 2000 executions/s, slots bound 4/s: slots win.
        assert!(close(i.executions_per_machine_month(), 10_368_000.0));
        let slow = Inputs {
            starts_per_second: 1.0,
            ..example()
        };
        // 1 start/s x 1 execution: 2,592,000 a month; peak 10 / 2 s = 5 starts/s -> 5.
        assert!(close(slow.executions_per_machine_month(), MONTH_SECONDS));
        assert_eq!(slow.machines(0.0).by_start_rate, 5);
    }

    #[test]
    fn bad_inputs_are_refused_naming_the_flag() {
        let cases: Vec<(Inputs, &str)> = vec![
            (
                Inputs {
                    seconds_per_execution: 0.0,
                    ..example()
                },
                "--seconds-per-execution must be a number > 0",
            ),
            (
                Inputs {
                    executions_per_month: -5.0,
                    ..example()
                },
                "--executions-per-month must be a number >= 0",
            ),
            (
                Inputs {
                    price_per_sandbox_second: f64::NAN,
                    ..example()
                },
                "--price-per-sandbox-second",
            ),
            (
                Inputs {
                    concurrency: 0.0,
                    ..example()
                },
                "--concurrency must be at least 1",
            ),
            (
                Inputs {
                    memory_per_sandbox_bytes: 32768.0 * MIB,
                    ..example()
                },
                "give a larger --machine-memory",
            ),
            (
                Inputs {
                    cpu_per_sandbox: 16.0,
                    ..example()
                },
                "give a larger --machine-cores",
            ),
            (
                Inputs {
                    starts_per_second: 0.0,
                    ..example()
                },
                "--starts-per-second must be a number > 0",
            ),
        ];
        for (i, want) in cases {
            let err = i.estimate().err().unwrap_or_default();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[test]
    fn capacity_comes_from_the_bench_json() {
        let json = r#"{"schema":"cordon-bench/1","cores":2,"memory_total_bytes":1000,
            "figures":[],
            "tiers":[
              {"tier":"container","status":"measured",
               "throughput":{"starts_per_sec":250.0,"concurrency":2,"window_s":3.0,"completed":750},
               "memory":{"per_sandbox_bytes":2000000,"live_sandboxes":4}},
              {"tier":"gvisor","status":"measured",
               "throughput":{"starts_per_sec":12.5,"concurrency":2,"window_s":3.0,"completed":37},
               "memory":{"per_sandbox_bytes":17000000,"live_sandboxes":4}},
              {"tier":"microvm","status":"skipped"}
            ]}"#;
        let c = capacity_from_bench(json, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.tier, c.starts_per_second), (Tier::Gvisor, 12.5));
        assert_eq!(c.cores, Some(2.0));
        let c = capacity_from_bench(json, Some(Tier::Container)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.memory_per_sandbox_bytes, 2_000_000.0);
        let err = capacity_from_bench(json, Some(Tier::Microvm))
            .err()
            .unwrap_or_default();
        assert!(err.contains("cordon bench --tiers microvm"), "{err}");
        let err = capacity_from_bench(r#"{"figures":[]}"#, None)
            .err()
            .unwrap_or_default();
        assert!(err.contains("run `cordon bench` again"), "{err}");
    }

    #[test]
    fn the_curve_has_both_lines_and_the_steps() {
        let i = Inputs {
            machine_cost: 10_000.0,
            ..example()
        };
        let (x, h, s) = i.curve(60_000_000.0);
        assert_eq!((x.len(), h.len()), (s.len(), s.len()));
        assert!(x.windows(2).all(|w| w[0] < w[1]));
        assert!(x.contains(&10_368_000.0));
    }
}
