//! The start cost of a writable root (docs/adr/0023-oci-writable-root.md), in one run:
//! 1. the root alone (`rootfs::mount_for` over a busybox root, 256 MiB upper layer) with its
//!    upper layer on a loop-mounted ext4 (`Upper::Disk`) and on a tmpfs (`Upper::Memory`),
//!    alternating, each taken down after;
//! 2. `podman run --rm <busybox image> true` with cordon-oci, the root read-only
//!    (`--read-only`) and writable (the default), alternating.
//!
//! Prints the figures; asserts nothing about them.
//! `cargo bench -p cordon-oci --bench writable_root` (root, podman; the sandbox init built
//! beside cordon-oci: `cargo build -p cordon-oci -p cordon-sandbox-init`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use cordon_oci::rootfs::{Upper, mount_for};

fn main() {
    let Some(bench) = common::setup() else {
        return;
    };
    let (runs, oci, dir, root) = (bench.runs, &bench.oci, &bench.dir, &bench.root);

    // 1. The root alone, in a mount namespace of the bench's own.
    let mounts = std::thread::scope(|s| {
        s.spawn(|| {
            cordon_guest::sys::own_mount_namespace().unwrap();
            let once = |upper: Upper, i: usize| -> f64 {
                let base = dir.path().join(format!("base-{i}"));
                std::fs::create_dir(&base).unwrap();
                nix::mount::mount(
                    Some("tmpfs"),
                    &base,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    Some("size=64k,mode=0711"),
                )
                .unwrap();
                let t0 = Instant::now();
                let r = mount_for(
                    root,
                    &base,
                    &format!("bench-{i}"),
                    256 << 20,
                    upper,
                    1 << 30,
                    cordon_oci::rootfs::Owners::Image,
                )
                .unwrap();
                let us = t0.elapsed().as_secs_f64() * 1000.0;
                assert!(r.join("bin/busybox").is_file());
                nix::mount::umount2(&base, nix::mount::MntFlags::MNT_DETACH).unwrap();
                us
            };
            once(Upper::Disk, 0);
            once(Upper::Memory, 1);
            let (mut d, mut m) = (Vec::new(), Vec::new());
            for i in 0..runs {
                d.push(once(Upper::Disk, 2 + 2 * i));
                m.push(once(Upper::Memory, 3 + 2 * i));
            }
            (d, m)
        })
        .join()
        .unwrap()
    });
    let (mut d, mut m) = mounts;
    common::show_ms("writable root, upper on ext4 (loop, 256 MiB)", &mut d);
    common::show_ms("writable root, upper on tmpfs (256 MiB)", &mut m);

    // 2. Through podman.
    let base = bench.podman_with("localhost/cordon-oci-bench-wroot:1");
    let start = |read_only: bool| -> f64 {
        common::timed_ms(
            common::podman(&base, oci, &["run", "--rm"])
                .args(if read_only { &["--read-only"][..] } else { &[] })
                .args(["localhost/cordon-oci-bench-wroot:1", "true"]),
            "podman run",
        )
    };
    start(true);
    start(false);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(start(true));
        b.push(start(false));
    }
    common::show_ms("podman run --rm true, cordon-oci, --read-only", &mut a);
    common::show_ms("podman run --rm true, cordon-oci, writable (ext4)", &mut b);
}
