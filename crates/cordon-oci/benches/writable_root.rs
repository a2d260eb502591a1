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

use std::process::Command;
use std::time::Instant;

use cordon_oci::rootfs::{Upper, mount_for};

fn main() {
    let runs: usize = std::env::var("CORDON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let exe = std::env::current_exe().unwrap();
    let oci = exe.parent().unwrap().parent().unwrap().join("cordon-oci");
    if !oci.is_file() || !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPING: needs root and {} (cargo build -p cordon-oci -p cordon-sandbox-init)",
            oci.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/true")).unwrap();

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
                    &root,
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
    let show = |what: &str, v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        println!(
            "{what:<52}: median {:7.1} ms  min {:7.1} ms  max {:7.1} ms  ({} runs)",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1],
            v.len()
        );
    };
    let (mut d, mut m) = mounts;
    show("writable root, upper on ext4 (loop, 256 MiB)", &mut d);
    show("writable root, upper on tmpfs (256 MiB)", &mut m);

    // 2. Through podman.
    let tar = dir.path().join("rootfs.tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-cf"])
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap()
            .success()
    );
    let base: Vec<String> = vec![
        "--root".into(),
        dir.path().join("storage").display().to_string(),
        "--runroot".into(),
        dir.path().join("run").display().to_string(),
        "--cgroup-manager".into(),
        "cgroupfs".into(),
        "--events-backend".into(),
        "file".into(),
    ];
    let image = "localhost/cordon-oci-bench-wroot:1";
    let out = Command::new("podman")
        .args(&base)
        .arg("import")
        .arg(&tar)
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let start = |read_only: bool| -> f64 {
        let t0 = Instant::now();
        let out = Command::new("podman")
            .args(&base)
            .arg("--runtime")
            .arg(&oci)
            .args(["run", "--rm", "--network", "none"])
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(if read_only { &["--read-only"][..] } else { &[] })
            .args([image, "true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        t0.elapsed().as_secs_f64() * 1000.0
    };
    start(true);
    start(false);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(start(true));
        b.push(start(false));
    }
    show("podman run --rm true, cordon-oci, --read-only", &mut a);
    show("podman run --rm true, cordon-oci, writable (ext4)", &mut b);
}
