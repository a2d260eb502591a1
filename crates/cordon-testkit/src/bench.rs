//! What the benches and the bench examples share: medians of timed runs, a round count
//! from the command line, and execs that must succeed.

use std::time::{Duration, Instant};

use cordon_core::{ExecRequest, OutputStream, Sandbox};

/// Runs `f` once to warm up, then `n` times; the median of those `n` runs.
pub fn median_time(mut f: impl FnMut(), n: usize) -> Duration {
    f();
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[n / 2]
}

/// The median of figures (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// How many rounds to run: the first command-line argument, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `req` in `sb`, its output dropped; panics unless it succeeded.
pub fn exec_ok(sb: &mut dyn Sandbox, req: &ExecRequest) {
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let o = sb.exec(req, &mut sink).expect("the exec runs");
    assert!(o.success(), "{o:?}");
}

/// Runs every request of `all` in `sb` in turn, each as [`exec_ok`].
pub fn exec_all(sb: &mut dyn Sandbox, all: &[ExecRequest]) {
    for r in all {
        exec_ok(sb, r);
    }
}
