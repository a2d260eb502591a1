//! Developer tool: exec and create latency of the container tier, measured in-process.
//!
//! `cargo run --release -p cordon-container --example execloop -- [N]` prints the median,
//! p10 and p90 of N execs of `true` in one live sandbox and of N create + exec + destroy
//! cycles. Needs root (like the tier). Set CORDON_SANDBOX_INIT to compare init builds.

use std::time::Instant;

use cordon_core::{Backend, ExecRequest, OutputStream, SandboxSpec, Tier};

fn stats(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<28} median {:>7.0} us   p10 {:>7.0} us   p90 {:>7.0} us   n {}",
        at(0.5),
        at(0.1),
        at(0.9),
        v.len()
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let backend =
        cordon_container::ContainerBackend::new(cordon_container::ContainerConfig::discover());
    let spec = SandboxSpec::new(Tier::Container);
    let req = ExecRequest::argv(["true"]);
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let mut sb = backend.create(&spec)?;
    sb.exec(&req, &mut sink)?;
    let mut execs = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = sb.exec(&req, &mut sink)?;
        execs.push(t.elapsed().as_secs_f64() * 1e6);
        if !out.success() {
            return Err(format!("exec failed: {out:?}").into());
        }
    }
    sb.destroy()?;
    stats("exec `true` (live sandbox)", execs);
    let mut cold = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut sb = backend.create(&spec)?;
        sb.exec(&req, &mut sink)?;
        sb.destroy()?;
        cold.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stats("create + exec + destroy", cold);
    Ok(())
}
