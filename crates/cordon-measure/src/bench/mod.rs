//! `cordon bench`: what each tier costs on this host, beside the peers this host already has,
//! in one run. Every tier this build has is measured (iterating `Tier::ALL` through the
//! caller's [`Tiers`], so a new tier needs no change here); speed targets are checked by
//! reading these figures, never by timed tests. The JSON schema is documented in docs/bench.md.

mod memory;
mod peers;
mod snapshots;
mod stats;
mod store;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use cordon_core::units::{format_duration, format_size};
use cordon_core::{Backend, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, Tier};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use cordon_policy::bench_doc::{
    AgentRun, BenchDoc, ExecFloor, Figure, FigureKind, LanguageFigures, MemoryFigure, PeerRatio,
    PeerReport, PlanRecord, SampleBudget, Stats, Status, Throughput, TierReport,
};
use stats::Budget;

use crate::Tiers;

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

/// The counts a run uses, resolved from the flags.
#[derive(Debug, Clone, Serialize)]
struct Plan {
    quick: bool,
    samples: Budget,
    snippets: usize,
    agent_runs: usize,
    live_sandboxes_for_memory: usize,
    throughput_window_s: f64,
    concurrency: usize,
}

impl Plan {
    /// What the stored document says of the plan.
    fn record(&self) -> PlanRecord {
        PlanRecord {
            quick: self.quick,
            samples: SampleBudget {
                max: self.samples.max,
                min: self.samples.min,
                budget: self.samples.budget.as_secs_f64(),
            },
            snippets: self.snippets,
            agent_runs: self.agent_runs,
            live_sandboxes_for_memory: self.live_sandboxes_for_memory,
            throughput_window_s: self.throughput_window_s,
            concurrency: self.concurrency,
        }
    }

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

/// The languages measured on their own per tier: a tier that runs no programs but several
/// interpreters (the wasm tier's two, whose costs differ by an order of magnitude), each
/// with its trivial snippet.
fn languages_of(tier: Tier) -> Vec<(Language, &'static str)> {
    let f = tier.features();
    if f.programs || f.languages.len() < 2 {
        return Vec::new();
    }
    f.languages.iter().map(|&l| (l, trivial_code(l))).collect()
}

/// Code in `language` that does nothing.
fn trivial_code(language: Language) -> &'static str {
    match language {
        Language::Javascript => "0",
        Language::Python => "pass",
        Language::Bash | Language::Sh => "true",
    }
}

/// The short name of `language` in a subject's name (`cordon-run-wasm-js`).
fn short_name(language: Language) -> &'static str {
    match language {
        Language::Javascript => "js",
        Language::Python => "python",
        Language::Bash => "bash",
        Language::Sh => "sh",
    }
}

/// Marks a tier's report failed, with what failed, and says so on the terminal.
fn fail(rep: &mut TierReport, what: &str, e: &anyhow::Error, out: &Out) {
    let msg = format!("{what}: {e:#}");
    out.note(&format!("cordon bench: {} tier: {msg}", rep.tier));
    rep.errors.push(msg);
    rep.status = Status::Failed;
}

/// Progress on stderr, and notes that must be seen whether or not the bar is drawn.
struct Out {
    bar: ProgressBar,
}

impl Out {
    fn new(len: u64, hidden: bool) -> Out {
        let bar = if hidden {
            ProgressBar::hidden()
        } else {
            let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            ) {
                b.set_style(style);
            }
            b.enable_steady_tick(Duration::from_millis(200));
            b
        };
        Out { bar }
    }

    fn note(&self, msg: &str) {
        if self.bar.is_hidden() {
            eprintln!("{msg}");
        } else {
            self.bar.suspend(|| eprintln!("{msg}"));
        }
    }

    fn step(&self, msg: String) {
        self.bar.set_message(msg);
    }

    fn done(&self) {
        self.bar.inc(1);
    }
}

/// The trivial snippets tried in order; a tier's is the first it runs successfully (OS tiers
/// run a program; language-only tiers run JavaScript or Python that does nothing).
fn trivial_candidates() -> Vec<(&'static str, ExecRequest)> {
    vec![
        ("argv `true`", ExecRequest::argv(["true"])),
        (
            "javascript `0`",
            ExecRequest::code(Language::Javascript, "0"),
        ),
        ("python `pass`", ExecRequest::code(Language::Python, "pass")),
    ]
}

fn exec_ok(sb: &mut dyn Sandbox, req: &ExecRequest) -> Result<()> {
    let o = sb.exec(req, &mut |_: OutputStream, _: &[u8]| {})?;
    if !o.success() {
        bail!(
            "the trivial snippet did not succeed: {:?} {}{}",
            o.termination,
            String::from_utf8_lossy(&o.stderr).trim(),
            // How the tier says the sandbox failed, where it knows.
            o.extra
                .failure
                .as_deref()
                .map(|f| format!(" (failure: {f})"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// create + exec + destroy, the unit of a cold start.
fn cycle(b: &dyn Backend, spec: &SandboxSpec, req: &ExecRequest) -> Result<()> {
    let mut sb = b.create(spec)?;
    let r = exec_ok(sb.as_mut(), req);
    let d = sb.destroy();
    r?;
    d?;
    Ok(())
}

fn pick_trivial(b: &dyn Backend, spec: &SandboxSpec) -> Result<(String, ExecRequest)> {
    let mut tried = Vec::new();
    for (name, req) in trivial_candidates() {
        match cycle(b, spec, &req) {
            Ok(()) => return Ok((name.to_string(), req)),
            Err(e) => tried.push(format!("{name}: {e:#}")),
        }
    }
    bail!(
        "no trivial snippet runs in this tier ({}); check `cordon doctor` and try `cordon run --tier {}`",
        tried.join("; "),
        spec.tier
    )
}

/// The `cordon` front beside this binary (this binary when there is none).
fn front_binary() -> Result<PathBuf> {
    let this = std::env::current_exe()?;
    Ok(this
        .parent()
        .map(|d| d.join("cordon"))
        .filter(|p| p.is_file())
        .unwrap_or(this))
}

/// A whole `cordon` process as a start-up subject (kind `cli`): `exe` with `args`, output
/// discarded, success required.
fn cli_subject(
    name: &str,
    tier: Tier,
    exe: &std::path::Path,
    args: &[&str],
    note: &str,
) -> Subject {
    let shown = format!("cordon {}", args.join(" "));
    let (exe, args): (PathBuf, Vec<String>) = (
        exe.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    Subject {
        name: name.into(),
        kind: FigureKind::Cli,
        tier: Some(tier),
        what: format!("`{shown}`, {tier} tier, end to end (a whole CLI process; {note})"),
        run: Box::new(move || {
            let st = Command::new(&exe)
                .args(&args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                bail!("`{shown}` failed: {st}; try it by hand to see why");
            }
            Ok(())
        }),
        samples: Vec::new(),
        spent: Duration::ZERO,
        error: None,
    }
}

/// A subject of the interleaved start-up phase.
struct Subject {
    name: String,
    kind: FigureKind,
    tier: Option<Tier>,
    what: String,
    run: Box<dyn FnMut() -> Result<()>>,
    samples: Vec<Duration>,
    spent: Duration,
    error: Option<String>,
}

struct LiveTier {
    backend: std::sync::Arc<dyn Backend>,
    spec: SandboxSpec,
    trivial: ExecRequest,
    report_index: usize,
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
    let mut tiers: Vec<TierReport> = Vec::new();
    let mut live: Vec<LiveTier> = Vec::new();

    // Which tiers can run, each with the trivial snippet it runs (this is also the warm-up).
    for &tier in selected {
        let mut rep = TierReport::new(tier);
        let Some(backend) = build.backend(tier) else {
            rep.status = Status::Skipped;
            rep.reason = Some("this build of cordon has no such tier".into());
            out.note(&format!(
                "cordon bench: SKIPPING tier {tier}: not in this build"
            ));
            tiers.push(rep);
            continue;
        };
        let probe = backend.probe();
        if !probe.available() {
            let why: Vec<String> = probe
                .capabilities
                .iter()
                .filter(|c| !c.ok && c.required)
                .map(|c| {
                    format!(
                        "{}: {}{}",
                        c.name,
                        c.detail,
                        c.fix
                            .as_deref()
                            .map(|f| format!(" (fix: {f})"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            let reason = format!("unavailable here: {}", why.join("; "));
            out.note(&format!(
                "cordon bench: SKIPPING tier {tier}: {reason}; see `cordon doctor`"
            ));
            rep.status = Status::Skipped;
            rep.reason = Some(reason);
            tiers.push(rep);
            continue;
        }
        out.step(format!("{tier}: first sandbox"));
        let spec = SandboxSpec::new(tier);
        match pick_trivial(backend.as_ref(), &spec) {
            Ok((name, req)) => {
                rep.trivial = Some(name);
                live.push(LiveTier {
                    backend: std::sync::Arc::from(backend),
                    spec,
                    trivial: req,
                    report_index: tiers.len(),
                });
            }
            Err(e) => fail(&mut rep, "first sandbox", &e, &out),
        }
        tiers.push(rep);
    }

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
    let (peer_list, missing) = peers::build(peer_names, scratch);
    let mut peer_reports: Vec<PeerReport> = Vec::new();
    for m in missing {
        out.note(&format!(
            "cordon bench: SKIPPING peer {}: {}",
            m.name, m.reason
        ));
        peer_reports.push(PeerReport {
            peer: m.name.to_string(),
            status: Status::Skipped,
            reason: Some(m.reason),
            what: String::new(),
            counterpart_of: Vec::new(),
            cold_start: None,
            measured_unix: None,
        });
    }
    let mut subjects: Vec<Subject> = Vec::new();
    for lt in &live {
        let (b, spec, req) = (lt.backend.clone(), lt.spec.clone(), lt.trivial.clone());
        subjects.push(Subject {
            name: lt.spec.tier.to_string(),
            kind: FigureKind::Tier,
            tier: None,
            what: format!(
                "{} tier in-process: create + trivial exec + destroy",
                lt.spec.tier
            ),
            run: Box::new(move || cycle(b.as_ref(), &spec, &req)),
            samples: Vec::new(),
            spent: Duration::ZERO,
            error: None,
        });
        // The whole CLI, end to end: what a user pays per `cordon run` (the `cordon` front
        // beside this binary; the container tier runs without cordon-full).
        let exe = front_binary()?;
        if lt.spec.tier.features().front_runs {
            let init = exe.with_file_name(cordon_container::INIT_BINARY);
            let linked = match (dynamically_linked(&exe), dynamically_linked(&init)) {
                (Some(false), Some(false)) => "static front and init".to_string(),
                (Some(true), _) | (_, Some(true)) => {
                    "dynamically linked front or init: `make build` makes both static".to_string()
                }
                _ => "linkage unknown".to_string(),
            };
            subjects.push(cli_subject(
                "cordon-run",
                Tier::Container,
                &exe,
                &["run", "--", "sh", "-c", "true"],
                &linked,
            ));
            if let Some(t) = &args.template {
                subjects.push(cli_subject(
                    "cordon-run-template",
                    Tier::Container,
                    &exe,
                    &["run", "--template", t, "--", "sh", "-c", "true"],
                    &format!("the root made from template {t}; {linked}"),
                ));
            }
        }
        let languages = languages_of(lt.spec.tier);
        if !languages.is_empty() {
            // What a user's `cordon run` goes through is the front; without one beside this
            // binary the figure is this binary's own start, and says so.
            let via = if exe.file_name().is_some_and(|n| n == "cordon") {
                "a new process each time, through the `cordon` front"
            } else {
                "a new process each time, of this binary itself: there is no `cordon` front \
                 beside it (`make build` makes one)"
            };
            let tier = lt.spec.tier;
            for (lang, code) in languages {
                subjects.push(cli_subject(
                    &format!("cordon-run-{tier}-{}", short_name(lang)),
                    tier,
                    &exe,
                    &[
                        "run",
                        "--tier",
                        tier.as_str(),
                        "--lang",
                        lang.as_str(),
                        "-c",
                        code,
                    ],
                    via,
                ));
            }
        }
    }
    let mut counterparts = Vec::new();
    for mut p in peer_list {
        out.step(format!("peer {}: warm-up", p.name));
        match p.run() {
            Ok(()) => {
                counterparts.push((p.name.to_string(), p.counterpart_of.clone()));
                subjects.push(Subject {
                    name: p.name.to_string(),
                    kind: FigureKind::Peer,
                    tier: None,
                    what: p.what.clone(),
                    run: Box::new(move || p.run()),
                    samples: Vec::new(),
                    spent: Duration::ZERO,
                    error: None,
                });
            }
            Err(e) => {
                let reason = format!("does not run here: {e:#}");
                out.note(&format!("cordon bench: SKIPPING peer {}: {reason}", p.name));
                peer_reports.push(PeerReport {
                    peer: p.name.to_string(),
                    status: Status::Skipped,
                    reason: Some(reason),
                    what: p.what.clone(),
                    counterpart_of: p.counterpart_of.clone(),
                    cold_start: None,
                    measured_unix: None,
                });
            }
        }
    }
    // The cordon-run subject has had no warm-up yet.
    for s in subjects.iter_mut().filter(|s| s.kind == FigureKind::Cli) {
        if let Err(e) = (s.run)() {
            s.error = Some(format!("{e:#}"));
        }
    }
    let mut round = 0;
    loop {
        let mut any = false;
        round += 1;
        for s in subjects.iter_mut() {
            if s.error.is_some() || !plan.samples.wants_more(s.samples.len(), s.spent) {
                continue;
            }
            any = true;
            out.step(format!("start-up round {round}: {}", s.name));
            let t = Instant::now();
            let r = (s.run)();
            let el = t.elapsed();
            s.spent += el;
            match r {
                Ok(()) => s.samples.push(el),
                Err(e) => s.error = Some(format!("{e:#}")),
            }
        }
        if !any {
            break;
        }
    }
    out.done();
    let mut figures = Vec::new();
    for s in &subjects {
        let stats = Stats::of(&s.samples);
        if let Some(st) = stats
            && s.error.is_none()
        {
            figures.push(Figure {
                subject: s.name.clone(),
                kind: s.kind,
                tier: s.tier,
                what: s.what.clone(),
                median_us: st.median_us,
                p90_us: st.p90_us,
                min_us: st.min_us,
                samples: st.samples,
                measured_unix: None,
            });
        }
        match s.kind {
            FigureKind::Tier => {
                if let Some(rep) = tiers.iter_mut().find(|r| r.tier.as_str() == s.name) {
                    match &s.error {
                        Some(e) => fail(rep, "cold start", &anyhow::anyhow!("{e}"), &out),
                        None => rep.cold_start = stats,
                    }
                }
            }
            FigureKind::Peer => {
                if let Some(e) = &s.error {
                    out.note(&format!("cordon bench: peer {} failed: {e}", s.name));
                }
                peer_reports.push(PeerReport {
                    peer: s.name.clone(),
                    status: if s.error.is_some() {
                        Status::Failed
                    } else {
                        Status::Measured
                    },
                    reason: s.error.clone(),
                    what: s.what.clone(),
                    counterpart_of: counterparts
                        .iter()
                        .find(|(n, _)| *n == s.name)
                        .map(|(_, c)| c.clone())
                        .unwrap_or_default(),
                    cold_start: if s.error.is_some() { None } else { stats },
                    measured_unix: None,
                });
            }
            _ => {
                if let Some(e) = &s.error {
                    out.note(&format!("cordon bench: {} failed: {e}", s.name));
                }
            }
        }
    }
    peer_reports.sort_by_key(|p| {
        peers::NAMES
            .iter()
            .position(|n| *n == p.peer)
            .unwrap_or(usize::MAX)
    });

    // Per tier: warm start, exec, the agent run, throughput.
    for lt in &live {
        let tier = lt.spec.tier;
        let rep_i = lt.report_index;
        out.step(format!("{tier}: warm (pool) start"));
        match measure_warm(lt, &plan.samples) {
            Ok(s) => tiers[rep_i].warm_start = Stats::of(&s),
            Err(e) => fail(&mut tiers[rep_i], "warm start", &e, &out),
        }
        out.done();
        match measure_unprepared(lt, &plan.samples) {
            Some(Ok(s)) => tiers[rep_i].unprepared_start = Stats::of(&s),
            Some(Err(e)) => fail(&mut tiers[rep_i], "start without its snapshot", &e, &out),
            None => {}
        }
        out.step(format!("{tier}: exec in a live sandbox"));
        match measure_exec(lt, &lt.trivial, &plan.samples) {
            Ok(s) => tiers[rep_i].exec = Stats::of(&s),
            Err(e) => fail(&mut tiers[rep_i], "exec", &e, &out),
        }
        match measure_floor(lt, plan) {
            Ok(f) => tiers[rep_i].exec_floor = f,
            Err(e) => fail(&mut tiers[rep_i], "exec floor", &e, &out),
        }
        out.done();
        for (language, snippet) in languages_of(tier) {
            out.step(format!("{tier}: {language} cold start and exec"));
            let req = ExecRequest::code(language, snippet);
            let cold = plan
                .samples
                .sample(|| {
                    let t = Instant::now();
                    cycle(lt.backend.as_ref(), &lt.spec, &req)?;
                    Ok(t.elapsed())
                })
                .map(|v| Stats::of(&v));
            let figures = cold.and_then(|cold_start| {
                let exec = measure_exec(lt, &req, &plan.samples)?;
                let run = measure_snippets(lt, &req, plan.snippets, &plan.samples)?;
                let paused = measure_after_pause(lt, &req, PAUSE, &plan.samples)?;
                Ok(LanguageFigures {
                    language,
                    snippet: snippet.to_string(),
                    cold_start,
                    exec: Stats::of(&exec),
                    run: Stats::of(&run),
                    run_snippets: plan.snippets,
                    exec_after_pause: Stats::of(&paused),
                    pause_ms: PAUSE.as_millis() as u64,
                })
            });
            match figures {
                Ok(f) => tiers[rep_i].languages.push(f),
                Err(e) => fail(
                    &mut tiers[rep_i],
                    &format!("{language} `{snippet}`"),
                    &e,
                    &out,
                ),
            }
        }
        out.step(format!("{tier}: agent run of {} snippets", plan.snippets));
        match measure_agent(lt, plan) {
            Ok(a) => tiers[rep_i].agent_run = a,
            Err(e) => fail(&mut tiers[rep_i], "agent run", &e, &out),
        }
        out.done();
        out.step(format!(
            "{tier}: sandboxes started per second ({} at once)",
            plan.concurrency
        ));
        match measure_throughput(lt, plan) {
            Ok(t) => tiers[rep_i].throughput = Some(t),
            Err(e) => fail(&mut tiers[rep_i], "throughput", &e, &out),
        }
        out.done();
    }
    out.bar.finish_and_clear();

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
    let ratio = report.ratio_cordon_run_to_bwrap;
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
    if let Some(p) = &args.output {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
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
    let failed = tiers.iter().any(|t| t.status == Status::Failed);
    if args.json {
        println!("{text}");
    } else {
        print_tables(&figures, &tiers, ratio, plan);
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
        let kept = store::kept(&report, created);
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
            args.output
                .as_ref()
                .map(|p| format!(", {}", p.display()))
                .unwrap_or_default(),
            chart_path.display()
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

fn nearest_peer(tier: Tier, median_us: u64, peers: &[PeerReport]) -> Option<PeerRatio> {
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

fn measure_memory(lt: &LiveTier, n: usize) -> Result<MemoryFigure> {
    // Let whatever the first sandbox left behind go before the baseline.
    std::thread::sleep(Duration::from_millis(50));
    let baseline = memory::tree_pss(std::process::id());
    let sampler = memory::Sampler::start();
    let mut boxes = Vec::new();
    let mut result = Ok(());
    for _ in 0..n {
        match lt.backend.create(&lt.spec) {
            Ok(mut sb) => {
                let r = exec_ok(sb.as_mut(), &lt.trivial);
                boxes.push(sb);
                if let Err(e) = r {
                    result = Err(e);
                    break;
                }
            }
            Err(e) => {
                result = Err(e.into());
                break;
            }
        }
    }
    let peak = sampler.finish();
    for mut sb in boxes {
        let _ = sb.destroy();
    }
    result?;
    Ok(MemoryFigure {
        per_sandbox_bytes: peak.saturating_sub(baseline) / n.max(1) as u64,
        live_sandboxes: n,
        method: memory::METHOD.to_string(),
    })
}

/// Take a pre-created sandbox (as the server's warm pool holds them: the default spec,
/// created ahead) and run the trivial snippet; creation and destruction are off the clock.
fn measure_warm(lt: &LiveTier, b: &Budget) -> Result<Vec<Duration>> {
    const POOL: usize = 4;
    let start = Instant::now();
    let mut out = Vec::new();
    while b.wants_more(out.len(), start.elapsed()) {
        let n = POOL.min(b.max - out.len()).max(1);
        let mut pool = Vec::with_capacity(n);
        for _ in 0..n {
            pool.push(lt.backend.create(&lt.spec)?);
        }
        loop {
            let t = Instant::now();
            let Some(mut sb) = pool.pop() else { break };
            let r = exec_ok(sb.as_mut(), &lt.trivial);
            let el = t.elapsed();
            let _ = sb.destroy();
            r?;
            out.push(el);
        }
    }
    Ok(out)
}

/// `req` in one live sandbox, again and again (after one unmeasured run).
/// Create + trivial exec + destroy where the tier starts without what it prepares ahead
/// (`None` for tiers that prepare nothing). Each sample is a full start (a guest boot under
/// emulation takes seconds), so the budget usually stops it at its minimum.
fn measure_unprepared(lt: &LiveTier, b: &Budget) -> Option<Result<Vec<Duration>>> {
    let first = Instant::now();
    let mut sb = match lt.backend.create_unprepared(&lt.spec)? {
        Ok(sb) => sb,
        Err(e) => return Some(Err(e.into())),
    };
    let once = |sb: &mut Box<dyn Sandbox>| -> Result<()> {
        let r = exec_ok(sb.as_mut(), &lt.trivial);
        let d = sb.destroy();
        r?;
        d?;
        Ok(())
    };
    if let Err(e) = once(&mut sb) {
        return Some(Err(e));
    }
    let mut samples = vec![first.elapsed()];
    let start = Instant::now();
    while b.wants_more(samples.len(), start.elapsed()) {
        let t = Instant::now();
        let made = lt.backend.create_unprepared(&lt.spec)?;
        let r = made
            .map_err(anyhow::Error::from)
            .and_then(|mut sb| once(&mut sb));
        if let Err(e) = r {
            return Some(Err(e));
        }
        samples.push(t.elapsed());
    }
    Some(Ok(samples))
}

/// The fork+exec floor inside one live sandbox ([`ExecFloor`]), for tiers whose trivial
/// snippet is one program (`None` for the others). Each sample times a shell's loop of
/// `plan.snippets` runs of the program and an empty loop, one after the other, through the
/// tier: their difference is the loop's execs alone.
fn measure_floor(lt: &LiveTier, plan: &Plan) -> Result<Option<ExecFloor>> {
    let cordon_core::Command::Argv(argv) = &lt.trivial.command else {
        return Ok(None);
    };
    let [name] = argv.as_slice() else {
        return Ok(None);
    };
    let n = plan.snippets;
    // The program by its path: the shell's own `true` is a builtin and would fork nothing.
    let script = |count: usize| {
        ExecRequest::argv([
            "sh".to_string(),
            "-c".to_string(),
            format!(
                "for p in /usr/bin/{name} /bin/{name}; do [ -x \"$p\" ] && break; done; \
                 i=0; while [ $i -lt {count} ]; do \"$p\" || exit 3; i=$((i+1)); done; \
                 echo \"$p\""
            ),
        ])
    };
    let (full, empty) = (script(n), script(0));
    let budget = Budget {
        max: plan.samples.max.min(5),
        min: plan.samples.min.min(3).min(plan.samples.max),
        budget: plan.samples.budget,
    };
    let timed = |sb: &mut dyn Sandbox, req: &ExecRequest| -> Result<(Duration, String)> {
        let t = Instant::now();
        let o = sb.exec(req, &mut |_: OutputStream, _: &[u8]| {})?;
        let el = t.elapsed();
        if !o.success() {
            bail!(
                "a shell loop of `{name}` did not succeed: {:?} {}",
                o.termination,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok((el, String::from_utf8_lossy(&o.stdout).trim().to_string()))
    };
    let mut sb = lt.backend.create(&lt.spec)?;
    let r = (|| {
        let (_, program) = timed(sb.as_mut(), &full)?;
        timed(sb.as_mut(), &empty)?;
        let v = budget.sample(|| {
            let (with, _) = timed(sb.as_mut(), &full)?;
            let (without, _) = timed(sb.as_mut(), &empty)?;
            Ok(with.saturating_sub(without) / n as u32)
        })?;
        Ok::<_, anyhow::Error>((program, v))
    })();
    let d = sb.destroy();
    let (program, v) = r?;
    d?;
    let per_exec = Stats::of(&v).context("no sample of the exec floor was taken")?;
    Ok(Some(ExecFloor {
        program,
        execs: n,
        per_exec,
    }))
}

fn measure_exec(lt: &LiveTier, req: &ExecRequest, b: &Budget) -> Result<Vec<Duration>> {
    measure_snippets(lt, req, 1, b)
}

/// The pause before each sample of [`measure_after_pause`]: shorter than any agent's think
/// time, long enough for work a tier does between execs.
const PAUSE: Duration = Duration::from_millis(20);

/// `req` in one live sandbox, each sample taken `pause` after the last answer (after two
/// unmeasured runs, so that a tier that prepares from the second exec on has).
fn measure_after_pause(
    lt: &LiveTier,
    req: &ExecRequest,
    pause: Duration,
    b: &Budget,
) -> Result<Vec<Duration>> {
    measure_live(lt, req, 1, pause, b)
}

/// `n` execs of `req` back to back in one live sandbox, each sample their total.
fn measure_snippets(
    lt: &LiveTier,
    req: &ExecRequest,
    n: usize,
    b: &Budget,
) -> Result<Vec<Duration>> {
    measure_live(lt, req, n, Duration::ZERO, b)
}

/// `n` execs of `req` back to back in one live sandbox, each sample their total, taken
/// `pause` after the last answer (after one unmeasured run, two with a pause).
fn measure_live(
    lt: &LiveTier,
    req: &ExecRequest,
    n: usize,
    pause: Duration,
    b: &Budget,
) -> Result<Vec<Duration>> {
    let mut sb = lt.backend.create(&lt.spec)?;
    let r = (|| {
        exec_ok(sb.as_mut(), req)?;
        if !pause.is_zero() {
            exec_ok(sb.as_mut(), req)?;
        }
        b.sample(|| {
            std::thread::sleep(pause);
            let t = Instant::now();
            for _ in 0..n {
                exec_ok(sb.as_mut(), req)?;
            }
            Ok(t.elapsed())
        })
    })();
    let d = sb.destroy();
    let v = r?;
    d?;
    Ok(v)
}

fn measure_agent(lt: &LiveTier, plan: &Plan) -> Result<Option<AgentRun>> {
    let (mut execs, mut runs) = (Vec::new(), Vec::new());
    for _ in 0..plan.agent_runs {
        let t0 = Instant::now();
        let mut sb = lt.backend.create(&lt.spec)?;
        let t1 = Instant::now();
        let r = (|| {
            for _ in 0..plan.snippets {
                exec_ok(sb.as_mut(), &lt.trivial)?;
            }
            Ok::<_, anyhow::Error>(())
        })();
        let t2 = Instant::now();
        let d = sb.destroy();
        let t3 = Instant::now();
        r?;
        d?;
        execs.push(t2 - t1);
        runs.push(t3 - t0);
    }
    Ok(match (Stats::of(&execs), Stats::of(&runs)) {
        (Some(e), Some(r)) => Some(AgentRun {
            snippets: plan.snippets,
            execs_total: e,
            per_run: r,
        }),
        _ => None,
    })
}

/// Cold starts (create + trivial exec + destroy) completed per second by `concurrency`
/// threads for a fixed window; a cycle begun before the window closes is counted and the
/// time it took too.
fn measure_throughput(lt: &LiveTier, plan: &Plan) -> Result<Throughput> {
    let window = Duration::from_secs_f64(plan.throughput_window_s);
    let start = Instant::now();
    let deadline = start + window;
    let results: Vec<Result<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..plan.concurrency)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0;
                    while Instant::now() < deadline {
                        cycle(lt.backend.as_ref(), &lt.spec, &lt.trivial)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut completed = 0;
    for r in results {
        completed += r?;
    }
    Ok(Throughput {
        starts_per_sec: completed as f64 / elapsed.as_secs_f64().max(1e-9),
        concurrency: plan.concurrency,
        window_s: plan.throughput_window_s,
        completed,
    })
}

fn us(v: u64) -> String {
    format_duration(Duration::from_micros(v))
}

fn print_tables(figures: &[Figure], tiers: &[TierReport], ratio: Option<f64>, plan: &Plan) {
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

fn hostname() -> String {
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

/// Whether the ELF executable at `path` asks for a dynamic loader (has a `PT_INTERP`
/// program header); `None` when it cannot be read as a 64-bit little-endian ELF file.
fn dynamically_linked(path: &std::path::Path) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    const PT_INTERP: u32 = 3;
    let mut f = std::fs::File::open(path).ok()?;
    let mut eh = [0u8; 64];
    f.read_exact(&mut eh).ok()?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(eh[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes(eh[54..56].try_into().ok()?) as usize;
    let phnum = u16::from_le_bytes(eh[56..58].try_into().ok()?) as usize;
    if phentsize < 4 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; phentsize * phnum];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut ph).ok()?;
    Some(ph.chunks(phentsize).any(|h| {
        h.get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            == Some(PT_INTERP)
    }))
}

#[cfg(test)]
mod tests {
    use super::dynamically_linked;

    #[test]
    fn linkage_is_read_from_the_program_headers() {
        // This test binary is a dynamically linked glibc program.
        let me = std::env::current_exe().unwrap();
        assert_eq!(dynamically_linked(&me), Some(true));
        // A file that is not ELF, and one that is too short, are unknown, not static.
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\necho hi\n".repeat(10)).unwrap();
        assert_eq!(dynamically_linked(&text), None);
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x7fELF\x02\x01").unwrap();
        assert_eq!(dynamically_linked(&short), None);
        // An ELF header whose program headers have no PT_INTERP reads as static.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        let fake = dir.path().join("static");
        std::fs::write(&fake, &elf).unwrap();
        assert_eq!(dynamically_linked(&fake), Some(false));
        elf[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        std::fs::write(&fake, &elf).unwrap();
        assert_eq!(dynamically_linked(&fake), Some(true));
    }
}
