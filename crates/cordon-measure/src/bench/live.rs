//! What every phase of a bench shares: the plan, the tiers under measurement, the
//! trivial snippet each runs, and the progress shown while it runs.

use std::time::Duration;

use anyhow::{Result, bail};
use cordon_core::{Backend, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, Tier};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::stats::Budget;
use cordon_policy::bench_doc::{PlanRecord, SampleBudget, Status, TierReport};

use crate::Tiers;

/// The counts a run uses, resolved from the flags.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Plan {
    pub(super) quick: bool,
    pub(super) samples: Budget,
    pub(super) snippets: usize,
    pub(super) agent_runs: usize,
    pub(super) live_sandboxes_for_memory: usize,
    pub(super) throughput_window_s: f64,
    pub(super) concurrency: usize,
}

impl Plan {
    /// What the stored document says of the plan.
    pub(super) fn record(&self) -> PlanRecord {
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
}

/// The languages measured on their own per tier: a tier that runs no programs but several
/// interpreters (the wasm tier's two, whose costs differ by an order of magnitude), each
/// with its trivial snippet.
pub(super) fn languages_of(tier: Tier) -> Vec<(Language, &'static str)> {
    let f = tier.features();
    if f.programs || f.languages.len() < 2 {
        return Vec::new();
    }
    f.languages.iter().map(|&l| (l, trivial_code(l))).collect()
}

/// Code in `language` that does nothing.
pub(super) fn trivial_code(language: Language) -> &'static str {
    match language {
        Language::Javascript => "0",
        Language::Python => "pass",
        Language::Bash | Language::Sh => "true",
    }
}

/// The short name of `language` in a subject's name (`cordon-run-wasm-js`).
pub(super) fn short_name(language: Language) -> &'static str {
    match language {
        Language::Javascript => "js",
        Language::Python => "python",
        Language::Bash => "bash",
        Language::Sh => "sh",
    }
}

/// Marks a tier's report failed, with what failed, and says so on the terminal.
pub(super) fn fail(rep: &mut TierReport, what: &str, e: &anyhow::Error, out: &Out) {
    let msg = format!("{what}: {e:#}");
    out.note(&format!("cordon bench: {} tier: {msg}", rep.tier));
    rep.errors.push(msg);
    rep.status = Status::Failed;
}

/// Progress on stderr, and notes that must be seen whether or not the bar is drawn.
pub(super) struct Out {
    pub(super) bar: ProgressBar,
}

impl Out {
    pub(super) fn new(len: u64, hidden: bool) -> Out {
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

    pub(super) fn note(&self, msg: &str) {
        if self.bar.is_hidden() {
            eprintln!("{msg}");
        } else {
            self.bar.suspend(|| eprintln!("{msg}"));
        }
    }

    pub(super) fn step(&self, msg: String) {
        self.bar.set_message(msg);
    }

    pub(super) fn done(&self) {
        self.bar.inc(1);
    }
}

/// The trivial snippets tried in order; a tier's is the first it runs successfully (OS tiers
/// run a program; language-only tiers run JavaScript or Python that does nothing).
pub(super) fn trivial_candidates() -> Vec<(&'static str, ExecRequest)> {
    vec![
        ("argv `true`", ExecRequest::argv(["true"])),
        (
            "javascript `0`",
            ExecRequest::code(Language::Javascript, "0"),
        ),
        ("python `pass`", ExecRequest::code(Language::Python, "pass")),
    ]
}

pub(super) fn exec_ok(sb: &mut dyn Sandbox, req: &ExecRequest) -> Result<()> {
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
pub(super) fn cycle(b: &dyn Backend, spec: &SandboxSpec, req: &ExecRequest) -> Result<()> {
    let mut sb = b.create(spec)?;
    let r = exec_ok(sb.as_mut(), req);
    let d = sb.destroy();
    r?;
    d?;
    Ok(())
}

pub(super) fn pick_trivial(b: &dyn Backend, spec: &SandboxSpec) -> Result<(String, ExecRequest)> {
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

pub(super) struct LiveTier {
    pub(super) backend: std::sync::Arc<dyn Backend>,
    pub(super) spec: SandboxSpec,
    pub(super) trivial: ExecRequest,
    pub(super) report_index: usize,
}

/// Which of `selected` can run here, each live one with the trivial snippet it runs (its
/// first sandbox, which is also the warm-up); the rest are reported skipped or failed.
pub(super) fn live_tiers(
    build: &Tiers,
    selected: &[Tier],
    out: &Out,
) -> (Vec<TierReport>, Vec<LiveTier>) {
    let mut tiers: Vec<TierReport> = Vec::new();
    let mut live: Vec<LiveTier> = Vec::new();
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
            Err(e) => fail(&mut rep, "first sandbox", &e, out),
        }
        tiers.push(rep);
    }

    (tiers, live)
}
