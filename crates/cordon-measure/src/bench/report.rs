//! The bench's document and tables: the nearest peer of each tier, the printed tables
//! and the host's facts.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cordon_core::Tier;
use cordon_core::units::{format_duration, format_size};

use cordon_policy::bench_doc::{
    BenchDoc, Figure, FigureKind, PeerRatio, PeerReport, Stats, Status, TierReport,
};

use cordon_policy::bench_doc::SCHEMA;

use super::live::Plan;
use super::store;

pub(super) fn nearest_peer(tier: Tier, median_us: u64, peers: &[PeerReport]) -> Option<PeerRatio> {
    let measured: Vec<(&PeerReport, u64)> = peers
        .iter()
        .filter_map(|p| p.cold_start.map(|s| (p, s.median_us.max(1))))
        .collect();
    let dist = |p: u64| ((median_us.max(1) as f64) / p as f64).ln().abs();
    let closest = |c: &[(&PeerReport, u64)]| {
        c.iter()
            .min_by(|a, b| dist(a.1).total_cmp(&dist(b.1)))
            .map(|(p, m)| (p.peer.clone(), *m))
    };
    let kin: Vec<(&PeerReport, u64)> = measured
        .iter()
        .filter(|(p, _)| p.counterpart_of.contains(&tier))
        .copied()
        .collect();
    let (peer, m, basis) = match closest(&kin) {
        Some((p, m)) => (p, m, "counterpart"),
        None => {
            let (p, m) = closest(&measured)?;
            (p, m, "closest")
        }
    };
    Some(PeerRatio {
        peer,
        basis: basis.to_string(),
        ratio: median_us as f64 / m as f64,
    })
}

pub(super) fn us(v: u64) -> String {
    format_duration(Duration::from_micros(v))
}

pub(super) fn print_tables(
    figures: &[Figure],
    tiers: &[TierReport],
    ratio: Option<f64>,
    plan: &Plan,
) {
    println!("start-up: create + trivial exec + destroy (medians of interleaved rounds)");
    println!(
        "{:<22} {:<5} {:>10} {:>10} {:>10} {:>4}  what",
        "subject", "kind", "median", "p90", "min", "n"
    );
    for f in figures {
        println!(
            "{:<22} {:<5} {:>10} {:>10} {:>10} {:>4}  {}",
            f.subject,
            f.kind.as_str(),
            us(f.median_us),
            us(f.p90_us),
            us(f.min_us),
            f.samples,
            f.what
        );
    }
    print_tier_table(tiers, plan);
    print_tier_notes(tiers);
    println!(
        "cold = create + trivial exec + destroy; warm = take a pre-created sandbox + trivial exec; \
         agent run = create + {} execs + destroy; mem/sbx = peak PSS per live sandbox; \
         starts/s = cold starts completed per second by {} threads",
        plan.snippets, plan.concurrency
    );
    if let Some(r) = ratio {
        println!("\ncordon run / bwrap median ratio: {r:.2} (target <= 1.00)");
    }
}

/// One row per tier: its cold, warm and exec medians, the agent run, memory, start rate
/// and its nearest peer.
fn print_tier_table(tiers: &[TierReport], plan: &Plan) {
    println!(
        "\n{:<10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>9}  vs peer (cold/peer)",
        "tier",
        "cold",
        "warm",
        "exec",
        format!("{}x exec", plan.snippets),
        "agent run",
        "mem/sbx",
        "starts/s"
    );
    let opt = |s: &Option<Stats>| s.map(|s| us(s.median_us)).unwrap_or_else(|| "-".into());
    for t in tiers {
        if t.status == Status::Skipped {
            println!(
                "{:<10} skipped: {}",
                t.tier.as_str(),
                t.reason.as_deref().unwrap_or("")
            );
            continue;
        }
        println!(
            "{:<10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>9}  {}{}",
            t.tier.as_str(),
            opt(&t.cold_start),
            opt(&t.warm_start),
            opt(&t.exec),
            t.agent_run
                .as_ref()
                .map(|a| us(a.execs_total.median_us))
                .unwrap_or_else(|| "-".into()),
            t.agent_run
                .as_ref()
                .map(|a| us(a.per_run.median_us))
                .unwrap_or_else(|| "-".into()),
            t.memory
                .as_ref()
                .map(|m| format_size(m.per_sandbox_bytes))
                .unwrap_or_else(|| "-".into()),
            t.throughput
                .as_ref()
                .map(|x| format!("{:.1}", x.starts_per_sec))
                .unwrap_or_else(|| "-".into()),
            t.peer
                .as_ref()
                .map(|p| format!("{:.2}x {} ({})", p.ratio, p.peer, p.basis))
                .unwrap_or_else(|| "-".into()),
            if t.status == Status::Failed {
                "  [some measurements failed]"
            } else {
                ""
            }
        );
    }
}

/// Per tier, below the table: the start without its prepared snapshot, the exec floor and
/// each language's figures.
fn print_tier_notes(tiers: &[TierReport]) {
    let opt = |s: &Option<Stats>| s.map(|s| us(s.median_us)).unwrap_or_else(|| "-".into());
    for t in tiers {
        if let (Some(prepared), Some(unprepared)) = (&t.cold_start, &t.unprepared_start) {
            println!(
                "{:<10} cold without its prepared start (microvm: a full boot, not a restore): {} ({:.1}x the cold figure)",
                t.tier.as_str(),
                us(unprepared.median_us),
                unprepared.median_us as f64 / prepared.median_us.max(1) as f64
            );
        }
    }
    for t in tiers {
        if let Some(f) = &t.exec_floor {
            let over = t
                .exec
                .map(|e| {
                    format!(
                        "; the exec above is {} over it",
                        us(e.median_us.saturating_sub(f.per_exec.median_us))
                    )
                })
                .unwrap_or_default();
            println!(
                "{:<10} exec floor: a shell in the live sandbox forks and execs {} in {} \
                 (median of {} samples of {}){over}",
                t.tier.as_str(),
                f.program,
                us(f.per_exec.median_us),
                f.per_exec.samples,
                f.execs
            );
        }
    }
    for t in tiers {
        for l in &t.languages {
            println!(
                "{:<10} {} `{}`: cold {} (in-process create + exec + destroy), exec {} (live sandbox), {} after a {} ms pause, {} in one sandbox {}",
                t.tier.as_str(),
                l.language,
                l.snippet,
                opt(&l.cold_start),
                opt(&l.exec),
                opt(&l.exec_after_pause),
                l.pause_ms,
                l.run_snippets,
                opt(&l.run)
            );
        }
    }
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This host's memory in bytes (MemTotal), 0 when /proc/meminfo cannot be read.
pub fn memory_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// What a run measured, for its document and tables.
pub(super) struct Done<'a> {
    pub(super) plan: &'a Plan,
    pub(super) tiers: Vec<TierReport>,
    pub(super) figures: Vec<Figure>,
    pub(super) peers: Vec<PeerReport>,
}

/// Writes the run's document (merged with what it did not measure), the chart and the
/// tables (or the JSON); the exit code says whether a measurement failed.
pub(super) fn finish(
    done: Done<'_>,
    (json, output): (bool, Option<&Path>),
    (last, chart_path): (&Path, &Path),
) -> Result<i32> {
    let Done {
        plan,
        mut tiers,
        figures,
        peers: peer_reports,
    } = done;
    for rep in tiers.iter_mut() {
        if let Some(cold) = &rep.cold_start {
            rep.peer = nearest_peer(rep.tier, cold.median_us, &peer_reports);
        }
    }
    let created = cordon_core::units::unix_now();
    let mut report = BenchDoc {
        schema: SCHEMA.to_string(),
        cordon_version: env!("CARGO_PKG_VERSION").to_string(),
        host: hostname(),
        cores: Some(plan.concurrency as u64),
        memory_total_bytes: Some(memory_total()),
        created_unix: created,
        plan: Some(plan.record()),
        iterations: Some(plan.samples.max),
        figures: figures.clone(),
        tiers: tiers.clone(),
        peers: peer_reports,
        ratio_cordon_run_to_bwrap: None,
    };
    store::stamp(&mut report);
    // What this run did not measure stays as stored, each row with its own date. A stored
    // document that no longer reads (another schema) is replaced whole.
    let stored = std::fs::read_to_string(last)
        .ok()
        .and_then(|t| BenchDoc::parse(&t).ok());
    let report = store::merge(stored.as_ref(), report);
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(dir) = last.parent() {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "creating {} (set CORDON_HOME to a writable directory)",
                dir.display()
            )
        })?;
    }
    std::fs::write(last, &text).with_context(|| {
        format!(
            "writing {} (set CORDON_HOME to a writable directory)",
            last.display()
        )
    })?;
    if let Some(p) = output {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    draw_chart(&report, chart_path)?;
    let failed = tiers.iter().any(|t| t.status == Status::Failed);
    if json {
        println!("{text}");
    } else {
        show(
            &report,
            (&figures, &tiers),
            plan,
            (created, last, chart_path, output),
        );
    }
    if figures.iter().all(|f| f.kind != FigureKind::Tier) {
        bail!(
            "no tier could be measured on this host: see the SKIPPING lines above and `cordon doctor`"
        );
    }
    if failed {
        eprintln!(
            "cordon bench: some measurements failed (see above and `errors` in the JSON); the rest were written"
        );
        return Ok(1);
    }
    Ok(0)
}

/// Draws the chart of the document's figures (medians, peers marked).
fn draw_chart(report: &BenchDoc, chart_path: &Path) -> Result<()> {
    let bars: Vec<crate::chart::Bar> = report
        .figures
        .iter()
        .map(|f| crate::chart::Bar {
            label: f.subject.clone(),
            peer: f.kind == FigureKind::Peer,
            value_us: f.median_us,
        })
        .collect();
    crate::chart::bench_svg(chart_path, &bars, &hostname())
        .with_context(|| format!("drawing the chart {}", chart_path.display()))?;
    Ok(())
}

/// Prints the tables, the template ratio, what was kept from earlier benches and where it
/// all went.
fn show(
    report: &BenchDoc,
    (figures, tiers): (&[Figure], &[TierReport]),
    plan: &Plan,
    (created, last, chart_path, output): (u64, &Path, &Path, Option<&Path>),
) {
    let ratio = report.ratio_cordon_run_to_bwrap;
    print_tables(figures, tiers, ratio, plan);
    let median = |name: &str| {
        figures
            .iter()
            .find(|f| f.subject == name)
            .map(|f| f.median_us as f64)
    };
    if let (Some(t), Some(p)) = (median("cordon-run-template"), median("cordon-run"))
        && p > 0.0
    {
        println!(
            "cordon run --template / cordon run median ratio: {:.2} (target <= 1.50)",
            t / p
        );
    }
    let kept = store::kept(report, created);
    if !kept.is_empty() {
        println!(
            "\nkept from earlier benches (not measured by this run): {}",
            kept.iter()
                .map(|(s, when)| format!(
                    "{s} (measured {})",
                    cordon_core::units::format_age(*when, created)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "\nwritten: {} (feeds `cordon run --tier auto`){}; chart {}",
        last.display(),
        output
            .map(|p| format!(", {}", p.display()))
            .unwrap_or_default(),
        chart_path.display()
    );
}
