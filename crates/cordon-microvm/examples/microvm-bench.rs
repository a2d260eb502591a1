//! Start-up figures of the microvm tier, in one run: cold boot to agent-ready, restore from
//! the snapshot to agent-ready, and an exec of trivial Python in a ready VM (medians).
//! `cargo run --release -p cordon-microvm --example microvm-bench [-- ROUNDS]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use cordon_core::{ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, Tier};
use cordon_microvm::{MicrovmBackend, MicrovmConfig};
use cordon_testkit::bench::{median, rounds};

fn main() {
    let rounds = rounds(5);
    let backend = MicrovmBackend::new(MicrovmConfig::discover());
    let (accel, why) = backend.accel().clone();
    let spec = SandboxSpec::new(Tier::Microvm);
    // Make sure the snapshot exists before timing restores.
    drop(backend.create_restored(&spec).unwrap());
    let (mut cold, mut restore, mut py) = (Vec::new(), Vec::new(), Vec::new());
    let mut sink = |_: OutputStream, _: &[u8]| {};
    for _ in 0..rounds {
        let t = Instant::now();
        let mut sb = backend.create_cold(&spec).unwrap();
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        sb.destroy().unwrap();
        let t = Instant::now();
        let mut sb = backend.create_restored(&spec).unwrap();
        restore.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let o = sb
            .exec(&ExecRequest::code(Language::Python, "print(1)"), &mut sink)
            .unwrap();
        assert!(o.success(), "{o:?}");
        py.push(t.elapsed().as_secs_f64() * 1e3);
        sb.destroy().unwrap();
    }
    let (c, r, p) = (median(cold), median(restore), median(py));
    println!(
        "microvm bench, accelerator {} ({why}), {rounds} rounds, medians:",
        accel.as_str()
    );
    println!("  cold boot to agent-ready      {c:9.1} ms");
    println!(
        "  restore to agent-ready        {r:9.1} ms   ({:.1}x faster than cold boot)",
        c / r
    );
    println!("  exec python3 -c 'print(1)'    {p:9.1} ms");
}
