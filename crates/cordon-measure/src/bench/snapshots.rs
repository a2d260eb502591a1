//! `cordon bench --snapshots`: what a snapshot and a fork cost on each tier that has them
//! (issue 46), side by side, beside the same tier's pause and resume.
//!
//! Per tier, for a sandbox idle with a Python process and for one holding `--hold` MiB
//! (random bytes, so nothing compresses them away): the time to take the snapshot (the
//! source's pause included) and the image's size on disk; the time from asking for N
//! sandboxes from it (N = 1 and N = `--forks`, started at once from as many threads) to each
//! one's first exec; the source's own next exec; and pause/resume of the source. The mode is
//! the most the tier keeps: `full` where it has it, else `filesystem`. What a `full`
//! snapshot holds is memory, so the held bytes are a Python process's where the tier has
//! processes that outlive an exec; on a tier whose lasting state is its files (a
//! `filesystem` snapshot, or the wasm tier's) they are a file in `/work`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cordon_core::units::format_size;
use cordon_core::{
    Backend, ExecRequest, Feature, Language, OutputStream, Sandbox, SandboxSpec, SnapshotDir,
    SnapshotImage, SnapshotMode, Tier,
};
use serde::Serialize;

use crate::Tiers;

/// The JSON document `cordon bench --snapshots --json` prints (and always writes to
/// `<data dir>/bench/snapshots.json`).
#[derive(Debug, Serialize)]
pub struct SnapshotBench {
    pub schema: &'static str,
    pub forks: usize,
    pub hold_mib: u64,
    pub rows: Vec<Row>,
    /// Tiers not measured, with why.
    pub skipped: Vec<(Tier, String)>,
}

/// One tier in one state.
#[derive(Debug, Serialize)]
pub struct Row {
    pub tier: Tier,
    pub mode: SnapshotMode,
    /// What the source held: 0 for idle.
    pub held_mib: u64,
    /// Where the held bytes were: "memory" (a Python process) or "files" (`/work`).
    pub held_in: &'static str,
    pub snapshot_ms: f64,
    pub image_bytes: u64,
    /// The source's first exec after the snapshot.
    pub source_exec_ms: f64,
    /// From the start request to the fork's first exec's end, one fork.
    pub fork_1_ms: f64,
    /// The same for `forks` at once: each fork's, in order of their ends.
    pub fork_n_ms: Vec<f64>,
    /// Pause and resume of the source, where the tier pauses.
    pub pause_ms: Option<f64>,
    pub resume_ms: Option<f64>,
}

pub const SCHEMA: &str = "cordon.bench.snapshots/1";

/// The flags of `cordon bench --snapshots`.
pub struct Plan<'a> {
    pub tiers: Option<&'a [Tier]>,
    pub forks: usize,
    pub hold_mib: u64,
    pub json: bool,
}

pub fn run(plan: &Plan<'_>, build: &Tiers, data_dir: &Path) -> Result<i32> {
    if !(1..=cordon_core::MAX_FORKS as usize).contains(&plan.forks) {
        bail!(
            "--forks must be 1 to {} (the most one fork call starts)",
            cordon_core::MAX_FORKS
        );
    }
    let mut doc = SnapshotBench {
        schema: SCHEMA,
        forks: plan.forks,
        hold_mib: plan.hold_mib,
        rows: Vec::new(),
        skipped: Vec::new(),
    };
    // Images live where the server keeps its own: on the data dir's filesystem.
    let images = cordon_policy::bench_file(data_dir).with_file_name("snapshot-images");
    std::fs::create_dir_all(&images).with_context(|| format!("creating {}", images.display()))?;
    let mut failed = false;
    for tier in plan
        .tiers
        .map_or_else(|| Tier::ALL.to_vec(), <[Tier]>::to_vec)
    {
        let f = tier.features();
        if !f.has(Feature::SnapshotFull) && !f.has(Feature::SnapshotFiles) {
            doc.skipped
                .push((tier, "the tier has no snapshots".to_string()));
            continue;
        }
        let Some(backend) = build.backend(tier).filter(|b| b.probe().available()) else {
            doc.skipped
                .push((tier, "unavailable here (see `cordon doctor`)".to_string()));
            continue;
        };
        for held in [0, plan.hold_mib] {
            if !plan.json {
                eprintln!("cordon bench --snapshots: {tier}, holding {held} MiB");
            }
            match measure(backend.as_ref(), tier, held, plan.forks, &images) {
                Ok(row) => doc.rows.push(row),
                Err(e) => {
                    eprintln!("cordon bench --snapshots: {tier} holding {held} MiB: {e:#}");
                    failed = true;
                }
            }
        }
    }
    let json = serde_json::to_string_pretty(&doc)?;
    let file = cordon_policy::bench_file(data_dir).with_file_name("snapshots.json");
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&file, &json).with_context(|| format!("writing {}", file.display()))?;
    if plan.json {
        println!("{json}");
    } else {
        print_table(&doc);
        println!("(JSON: {})", file.display());
    }
    Ok(i32::from(failed))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The request whose end counts as a sandbox's first exec on `tier`.
fn first_exec(tier: Tier) -> ExecRequest {
    if tier.features().has(Feature::Programs) {
        ExecRequest::argv(["true"])
    } else {
        ExecRequest::code(Language::Python, "pass")
    }
}

/// Runs `req`; a tier that says it is busy (the wasm tier's share of instance slots and
/// descriptors, when ten forks' first execs come at once) is asked again, as a client
/// would, every 10 ms for at most 60 s.
fn exec_ok(sb: &mut dyn Sandbox, req: &ExecRequest) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let o = loop {
        match sb.exec(req, &mut |_: OutputStream, _: &[u8]| {}) {
            Err(cordon_core::Error::Busy { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => break r?,
        }
    };
    if !o.success() {
        bail!(
            "an exec failed: {:?} {}",
            o.termination,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// The source: its spec, and the sandbox holding `held` MiB where the mode keeps them.
fn source(b: &dyn Backend, tier: Tier, mode: SnapshotMode, held: u64) -> Result<Source> {
    let mut spec = SandboxSpec::new(tier);
    spec.limits.timeout_ms = 120_000;
    spec.limits.memory_bytes = spec.limits.memory_bytes.max((held << 20) * 2 + (512 << 20));
    spec.limits.disk_bytes = spec.limits.disk_bytes.max((held << 20) + (64 << 20));
    let mut sb = b.create(&spec)?;
    let in_memory = mode == SnapshotMode::Full && tier.features().has(Feature::Background);
    if in_memory {
        let holder = format!(
            "import os, sys\nb = bytearray(os.urandom({held} << 20))\nprint('held', flush=True)\n\
             sys.stdin.read()"
        );
        let id = sb.start_background(&ExecRequest::argv(["python3", "-u", "-c", &holder]))?;
        wait_for_line(sb.as_mut(), id, "held")?;
    } else {
        exec_ok(sb.as_mut(), &ExecRequest::code(Language::Python, "pass"))?;
        // In files of 16 MiB: one file call carries at most a frame of the agent's.
        let mut piece = vec![0u8; 16 << 20];
        for i in 0..held.div_ceil(16) {
            let len = ((held - i * 16).min(16) << 20) as usize;
            getrandom::fill(&mut piece[..len]).context("drawing random bytes")?;
            sb.put_file(&format!("/work/held-{i}.bin"), &piece[..len], 0o644)?;
        }
    }
    Ok(Source {
        spec,
        sb,
        held_in: if in_memory || held == 0 {
            "memory"
        } else {
            "files"
        },
    })
}

struct Source {
    spec: SandboxSpec,
    sb: Box<dyn Sandbox>,
    held_in: &'static str,
}

/// Polls a background exec's stdout until a line starts with `word` (60 s at most).
fn wait_for_line(sb: &mut dyn Sandbox, id: u64, word: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while Instant::now() < deadline {
        let got = sb.read_background(id, [out.len() as u64, 0], 1 << 16)?;
        out.extend_from_slice(&got.stdout);
        if String::from_utf8_lossy(&out)
            .lines()
            .any(|l| l.starts_with(word))
        {
            return Ok(());
        }
        if got.exit.is_some() {
            bail!(
                "the holding process ended: {}",
                String::from_utf8_lossy(&got.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the holding process did not start in 60 s")
}

fn measure(b: &dyn Backend, tier: Tier, held: u64, n: usize, images: &Path) -> Result<Row> {
    let mode = if tier.features().has(Feature::SnapshotFull) {
        SnapshotMode::Full
    } else {
        SnapshotMode::Filesystem
    };
    let Source {
        spec,
        mut sb,
        held_in,
    } = source(b, tier, mode, held)?;
    let (mut pause_ms, mut resume_ms) = (None, None);
    if tier.features().has(Feature::Pause) {
        let t = Instant::now();
        sb.pause()?;
        pause_ms = Some(ms(t.elapsed()));
        let t = Instant::now();
        sb.resume()?;
        resume_ms = Some(ms(t.elapsed()));
    }
    let dir = tempfile::Builder::new()
        .prefix("image-")
        .tempdir_in(images)
        .context("making the image's directory")?;
    let image_dir = SnapshotDir::new(dir.path());
    let t = Instant::now();
    let image = sb.snapshot(mode, &image_dir)?;
    let snapshot_ms = ms(t.elapsed());
    let req = first_exec(tier);
    let t = Instant::now();
    exec_ok(sb.as_mut(), &req)?;
    let source_exec_ms = ms(t.elapsed());
    let fork_1 = forks(b, &image, &image_dir, &spec, &req, 1)?;
    let fork_n = forks(b, &image, &image_dir, &spec, &req, n)?;
    sb.destroy()?;
    Ok(Row {
        tier,
        mode,
        held_mib: held,
        held_in,
        snapshot_ms,
        image_bytes: image.bytes,
        source_exec_ms,
        fork_1_ms: fork_1.first().copied().unwrap_or_default(),
        fork_n_ms: fork_n,
        pause_ms,
        resume_ms,
    })
}

/// Starts `n` sandboxes from the image at once, each from its own thread; each one's time
/// from the start to its first exec's end, sorted. Every fork is destroyed before it returns.
fn forks(
    b: &dyn Backend,
    image: &SnapshotImage,
    dir: &SnapshotDir,
    spec: &SandboxSpec,
    req: &ExecRequest,
    n: usize,
) -> Result<Vec<f64>> {
    let t = Instant::now();
    let ended: Vec<Result<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| -> Result<f64> {
                    let mut f = b.start_from_snapshot(image, dir, spec)?;
                    let r = exec_ok(f.as_mut(), req).map(|()| ms(t.elapsed()));
                    let d = f.destroy();
                    let took = r?;
                    d?;
                    Ok(took)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a fork's thread panicked")))
            })
            .collect()
    });
    let mut times = ended.into_iter().collect::<Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

fn print_table(doc: &SnapshotBench) {
    let n = doc.forks;
    println!(
        "{:<10} {:<10} {:<16} {:>10} {:>10} {:>12} {:>10} {:>22} {:>16}",
        "tier",
        "mode",
        "holding",
        "snapshot",
        "image",
        "source exec",
        "1 fork",
        format!("{n} forks: first/median/all"),
        "pause / resume"
    );
    for r in &doc.rows {
        let holding = if r.held_mib == 0 {
            "idle".to_string()
        } else {
            format!("{} MiB in {}", r.held_mib, r.held_in)
        };
        let median = r.fork_n_ms.get(r.fork_n_ms.len() / 2).copied();
        let pr = match (r.pause_ms, r.resume_ms) {
            (Some(p), Some(q)) => format!("{p:.0} / {q:.0} ms"),
            _ => "-".to_string(),
        };
        println!(
            "{:<10} {:<10} {:<16} {:>7.0} ms {:>10} {:>9.0} ms {:>7.0} ms {:>22} {:>16}",
            r.tier.as_str(),
            r.mode.as_str(),
            holding,
            r.snapshot_ms,
            format_size(r.image_bytes),
            r.source_exec_ms,
            r.fork_1_ms,
            format!(
                "{:.0}/{:.0}/{:.0} ms",
                r.fork_n_ms.first().copied().unwrap_or_default(),
                median.unwrap_or_default(),
                r.fork_n_ms.last().copied().unwrap_or_default()
            ),
            pr
        );
    }
    for (tier, why) in &doc.skipped {
        println!("{tier}: not measured: {why}");
    }
    println!(
        "(times in ms; a fork's is from the start request to its first exec's end. E2B \
         publishes about 4 s per GiB to pause and about 1 s to resume: docs/snapshots.md)"
    );
}
