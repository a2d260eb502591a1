//! The runtime tier's eval cost: a fresh in-process QuickJS per exec (thread, runtime,
//! context, console), evaluating a trivial expression, and 40 consecutive snippets.
//!
//! Run: `cargo bench -p cordon-runtime --bench eval`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench panics on failure by design

use std::time::Duration;

use cordon_core::{Backend, ExecRequest, Language, SandboxSpec, Tier};
use cordon_runtime::RuntimeBackend;
use cordon_testkit::bench::{exec_all, exec_ok, median_time};
use criterion::{Criterion, criterion_group, criterion_main};

fn snippets() -> Vec<ExecRequest> {
    let js = [
        "1 + 2",
        "console.log([1,2,3].map(x => x * 2))",
        "JSON.stringify({a: [1,2,3]})",
        "'a1b22c333'.match(/\\d+/g)",
        "let s = 0; for (let i = 0; i < 1000; i++) s += i; s",
    ];
    (0..40)
        .map(|i| ExecRequest::code(Language::Javascript, js[i % js.len()]))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut sb = RuntimeBackend::new()
        .create(&SandboxSpec::new(Tier::Runtime))
        .unwrap();
    let one = ExecRequest::code(Language::Javascript, "1 + 2");
    let all = snippets();
    let eval = median_time(|| exec_ok(sb.as_mut(), &one), 300);
    let forty = median_time(|| exec_all(sb.as_mut(), &all), 15);
    println!("\n== cordon runtime tier: medians ==");
    println!(
        "runtime eval '1 + 2'              {:8.3} ms",
        eval.as_secs_f64() * 1e3
    );
    println!(
        "40 consecutive snippets: {:8.3} ms total, {:.3} ms each",
        forty.as_secs_f64() * 1e3,
        forty.as_secs_f64() * 1e3 / 40.0
    );
    let mut g = c.benchmark_group("runtime");
    g.sample_size(50).measurement_time(Duration::from_secs(3));
    g.bench_function("eval_trivial", |x| x.iter(|| exec_ok(sb.as_mut(), &one)));
    g.sample_size(10);
    g.bench_function("40_snippets", |x| x.iter(|| exec_all(sb.as_mut(), &all)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
