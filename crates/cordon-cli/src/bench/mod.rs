//! `cordon bench`: measure start-up cost of the tiers on this host, beside its peers, in one
//! run. Speed targets are checked by reading these figures, never by timed tests.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use cordon_core::units::format_duration;
use cordon_core::{Backend, ExecRequest, OutputStream, SandboxSpec, Tier};
use serde::Serialize;

use crate::backends::AnyBackend;

#[derive(Args)]
pub struct BenchArgs {
    /// Runs of each subject (interleaved round by round, so drift hits all alike).
    #[arg(long, default_value_t = 40)]
    iterations: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON to this file.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Figure {
    subject: String,
    what: String,
    median_us: u64,
    p90_us: u64,
    min_us: u64,
    samples: usize,
}

type Subject = (String, String, Box<dyn FnMut() -> Result<()>>);

fn spawn_quiet(cmd: &[&str]) -> Result<()> {
    let st = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("{} failed: {st}", cmd.join(" "));
    }
    Ok(())
}

/// bwrap with the same shape of root Cordon builds: read-only /usr, fresh /proc, /dev, /tmp.
pub const BWRAP: &[&str] = &[
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--",
    "sh",
    "-c",
    "true",
];

fn have(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

pub fn bench(args: BenchArgs) -> Result<i32> {
    let exe = std::env::current_exe()?;
    let exe_s = exe.display().to_string();
    let mut subjects: Vec<Subject> = Vec::new();
    subjects.push((
        "host".into(),
        "fork+exec `sh -c true`, no isolation".into(),
        Box::new(|| spawn_quiet(&["sh", "-c", "true"])),
    ));
    if have("bwrap") && spawn_quiet(BWRAP).is_ok() {
        subjects.push((
            "bwrap".into(),
            "`bwrap --unshare-all` of `sh -c true` (namespaces only)".into(),
            Box::new(|| spawn_quiet(BWRAP)),
        ));
    } else {
        eprintln!(
            "cordon bench: bwrap is not installed or does not run here; skipping that peer (apt-get install bubblewrap)"
        );
    }
    let container = AnyBackend::for_tier(Tier::Container);
    if let Some(b) = container.as_ref().filter(|b| b.probe().available()) {
        let exe2 = exe_s.clone();
        subjects.push((
            "cordon-run".into(),
            "`cordon run -- sh -c true`, container tier, end to end (a whole CLI process)".into(),
            Box::new(move || spawn_quiet(&[&exe2, "run", "--", "sh", "-c", "true"])),
        ));
        let _ = b;
        let lib = AnyBackend::for_tier(Tier::Container);
        subjects.push((
            "container".into(),
            "container tier in-process: create + exec `sh -c true` + destroy".into(),
            Box::new(move || {
                let Some(b) = &lib else {
                    bail!("no container backend")
                };
                let mut sb = b.create(&SandboxSpec::new(Tier::Container))?;
                let o = sb.exec(
                    &ExecRequest::argv(["sh", "-c", "true"]),
                    &mut |_: OutputStream, _: &[u8]| {},
                )?;
                sb.destroy()?;
                if !o.success() {
                    bail!("sh -c true failed in the sandbox: {:?}", o.termination);
                }
                Ok(())
            }),
        ));
    } else {
        eprintln!(
            "cordon bench: the container tier is unavailable here (see `cordon doctor`); skipping it"
        );
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); subjects.len()];
    // One warm-up round, not counted.
    for (_, _, f) in subjects.iter_mut() {
        f()?;
    }
    for _ in 0..args.iterations {
        for (i, (_, _, f)) in subjects.iter_mut().enumerate() {
            let t = Instant::now();
            f()?;
            samples[i].push(t.elapsed());
        }
    }
    let figures: Vec<Figure> = subjects
        .iter()
        .zip(samples.iter_mut())
        .map(|((name, what, _), s)| {
            s.sort();
            let pick = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize].as_micros() as u64;
            Figure {
                subject: name.clone(),
                what: what.clone(),
                median_us: pick(0.5),
                p90_us: pick(0.9),
                min_us: pick(0.0),
                samples: s.len(),
            }
        })
        .collect();
    let median = |n: &str| {
        figures
            .iter()
            .find(|f| f.subject == n)
            .map(|f| f.median_us as f64)
    };
    let ratio = match (median("cordon-run"), median("bwrap")) {
        (Some(c), Some(b)) if b > 0.0 => Some(c / b),
        _ => None,
    };
    let report = serde_json::json!({
        "host": hostname(),
        "iterations": args.iterations,
        "figures": figures,
        "ratio_cordon_run_to_bwrap": ratio,
    });
    if let Some(p) = &args.output {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    println!(
        "{:<12} {:>10} {:>10} {:>10}  what",
        "subject", "median", "p90", "min"
    );
    for f in &figures {
        let d = |us: u64| format_duration(Duration::from_micros(us));
        println!(
            "{:<12} {:>10} {:>10} {:>10}  {}",
            f.subject,
            d(f.median_us),
            d(f.p90_us),
            d(f.min_us),
            f.what
        );
    }
    if let Some(r) = ratio {
        println!("\ncordon run / bwrap median ratio: {r:.2} (target <= 1.00)");
    }
    Ok(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
