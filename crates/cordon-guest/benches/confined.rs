//! What confining a host-side file call costs (`cordon_guest::confined`): a thread of its
//! own, a mount namespace holding the workspace alone, the sandbox's ids, no capabilities;
//! the same calls unconfined beside it. As root the namespace wall is measured; otherwise
//! the Landlock one.
//!
//! `cargo bench -p cordon-guest --bench confined`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cordon_guest::confined::ConfinedWorkspace;
use cordon_guest::files::Workspace;
use criterion::Criterion;

fn main() {
    let top = tempfile::tempdir().unwrap();
    let work = top.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let (uid, gid) = if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::Uid::from_raw(65534);
        nix::unistd::chown(&work, Some(nobody), Some(nix::unistd::Gid::from_raw(65534))).unwrap();
        (65534, 65534)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    let ws = Workspace::open(&work, uid, gid).unwrap();
    let cw = ConfinedWorkspace::new(&work, uid, gid).unwrap();
    println!("wall: {:?}", cw.wall());
    let data = vec![7u8; 4096];
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    let mut g = c.benchmark_group("file_call");
    g.bench_function("put_4k_in_a_b/unconfined", |b| {
        b.iter(|| ws.put("/work/a/b/f", 0o644, &data).unwrap())
    });
    g.bench_function("put_4k_in_a_b/confined", |b| {
        b.iter(|| cw.put("/work/a/b/f", 0o644, &data).unwrap())
    });
    g.bench_function("stat/unconfined", |b| {
        b.iter(|| ws.stat("/work/a/b/f").unwrap())
    });
    g.bench_function("stat/confined", |b| {
        b.iter(|| cw.stat("/work/a/b/f").unwrap())
    });
    g.bench_function("confinement_alone", |b| {
        b.iter(|| cw.run(|_| Ok(())).unwrap())
    });
    g.finish();
    c.final_summary();
}
