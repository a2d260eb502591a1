//! Times Python execs in one live wasm sandbox, for A/B runs of the guest and the backend
//! (ADR 0020): `pyloop [SOURCE] [N] [PAUSE_MS]` runs SOURCE (default `pass`) N times (200),
//! sleeping PAUSE_MS (0) before each exec as an agent reading the last answer would, and
//! prints the median, p10 and p90 of the execs alone. Build with `cargo build --release -p
//! cordon-wasm --example pyloop` after `scripts/setup.sh`; `CORDON_WASM_STANDBY=0` turns the
//! standby instances off.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring tool panics on failure
use std::time::Instant;

use cordon_core::{Backend, ExecRequest, Language, OutputStream, SandboxSpec, Tier};
use cordon_wasm::{Guest, WasmBackend};

fn main() {
    let src = std::env::args().nth(1).unwrap_or_else(|| "pass".into());
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(200);
    let b = WasmBackend::new();
    b.warm(Guest::Python).unwrap();
    let mut sb = b.create(&SandboxSpec::new(Tier::Wasm)).unwrap();
    let req = ExecRequest::code(Language::Python, src);
    let pause: u64 = std::env::args()
        .nth(3)
        .map(|s| s.parse().unwrap())
        .unwrap_or(0);
    let mut times = Vec::new();
    for _ in 0..n {
        std::thread::sleep(std::time::Duration::from_millis(pause));
        let t = Instant::now();
        let mut sink = |_: OutputStream, _: &[u8]| {};
        let o = sb.exec(&req, &mut sink).unwrap();
        assert!(o.success(), "{o:?}");
        times.push(t.elapsed().as_micros());
    }
    times.sort();
    println!(
        "median {} us, p10 {} us, p90 {} us",
        times[n / 2],
        times[n / 10],
        times[n * 9 / 10]
    );
}
