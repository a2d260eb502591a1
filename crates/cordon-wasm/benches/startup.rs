//! Start-up figures of the wasm tier, side by side in one run: native `python3 -c
//! 'print(1)'`, the wasm tier's Python and JavaScript trivial prints (fresh instance from
//! precompiled code, run, outcome), and 40 consecutive snippets in one sandbox (the shape of
//! an agent run). Prints medians and the ratio against native CPython; targets: wasm Python
//! <= 2 ms and >= 5x faster than native, wasm JavaScript <= 0.5 ms.
//!
//! Run: `cargo bench -p cordon-wasm --bench startup` (after `scripts/setup.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench panics on failure by design

use std::time::Duration;

use cordon_core::{Backend, ExecRequest, Language, Sandbox, SandboxSpec, Tier};
use cordon_testkit::bench::{exec_all, exec_ok, median_time};
use cordon_wasm::{Guest, WasmBackend};
use criterion::{Criterion, criterion_group, criterion_main};

fn sandbox(b: &WasmBackend) -> Box<dyn Sandbox> {
    for g in Guest::ALL {
        b.warm(g)
            .unwrap_or_else(|e| panic!("the wasm guests are missing ({e}); run scripts/setup.sh"));
    }
    b.create(&SandboxSpec::new(Tier::Wasm)).unwrap()
}

fn native_python() {
    let s = std::process::Command::new("python3")
        .args(["-c", "print(1)"])
        .output()
        .unwrap();
    assert!(s.status.success());
}

fn snippets() -> Vec<ExecRequest> {
    let py = [
        "print(1)",
        "import json\nprint(json.dumps({'a': [1, 2, 3]}))",
        "import statistics\nprint(statistics.mean([1, 2, 3, 4]))",
        "import re\nprint(re.findall(r'\\d+', 'a1b22c333'))",
        "open('/work/n.txt', 'w').write('42')",
        "print(open('/work/n.txt').read())",
        "import collections\nprint(collections.Counter('mississippi').most_common(2))",
        "import hashlib\nprint(hashlib.sha256(b'x').hexdigest())",
    ];
    let js = [
        "1 + 2",
        "console.log([1,2,3].map(x => x * 2))",
        "JSON.stringify({a: [1,2,3]})",
        "'a1b22c333'.match(/\\d+/g)",
    ];
    let mut v = Vec::new();
    for i in 0..40 {
        if i % 3 == 2 {
            v.push(ExecRequest::code(Language::Javascript, js[i % js.len()]));
        } else {
            v.push(ExecRequest::code(Language::Python, py[i % py.len()]));
        }
    }
    v
}

fn figures() {
    let b = WasmBackend::new();
    let mut sb = sandbox(&b);
    let py = ExecRequest::code(Language::Python, "print(1)");
    let js = ExecRequest::code(Language::Javascript, "console.log(1)");
    let all = snippets();
    let native = median_time(native_python, 30);
    let wasm_py = median_time(|| exec_ok(sb.as_mut(), &py), 100);
    let wasm_js = median_time(|| exec_ok(sb.as_mut(), &js), 200);
    let forty = median_time(|| exec_all(sb.as_mut(), &all), 7);
    let create = median_time(
        || {
            let mut s = b.create(&SandboxSpec::new(Tier::Wasm)).unwrap();
            s.destroy().unwrap();
        },
        100,
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\n== cordon wasm tier: medians ==");
    println!("native python3 -c 'print(1)'      {:8.3} ms", ms(native));
    println!(
        "wasm python print(1)              {:8.3} ms   (target <= 2 ms; {:.1}x faster than native, target >= 5x)",
        ms(wasm_py),
        native.as_secs_f64() / wasm_py.as_secs_f64()
    );
    println!(
        "wasm javascript console.log(1)    {:8.3} ms   (target <= 0.5 ms)",
        ms(wasm_js)
    );
    println!("wasm sandbox create+destroy       {:8.3} ms", ms(create));
    println!(
        "40 consecutive snippets (27 py, 13 js), one sandbox: {:8.3} ms total, {:.3} ms each",
        ms(forty),
        ms(forty) / 40.0
    );
}

fn bench(c: &mut Criterion) {
    figures();
    let b = WasmBackend::new();
    let mut sb = sandbox(&b);
    let mut g = c.benchmark_group("startup");
    g.sample_size(30).measurement_time(Duration::from_secs(3));
    g.bench_function("native_python3_print", |x| x.iter(native_python));
    let py = ExecRequest::code(Language::Python, "print(1)");
    g.bench_function("wasm_python_print", |x| {
        x.iter(|| exec_ok(sb.as_mut(), &py))
    });
    let js = ExecRequest::code(Language::Javascript, "console.log(1)");
    g.bench_function("wasm_js_print", |x| x.iter(|| exec_ok(sb.as_mut(), &js)));
    let all = snippets();
    g.sample_size(10);
    g.bench_function("wasm_40_snippets", |x| {
        x.iter(|| exec_all(sb.as_mut(), &all))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
