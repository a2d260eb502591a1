//! Container start through podman, runc against cordon-oci, in one run: `podman run --rm
//! <busybox image> true` timed end to end (podman's own work is in both), alternating the
//! runtimes so the host's load falls on all alike: runc, cordon-oci on the container tier,
//! and (where the node can run them) on the gvisor and microvm tiers (`cordon.tier`; fewer
//! runs of microvm, `CORDON_BENCH_MICROVM_RUNS`, default 3: it boots under TCG here).
//! Prints the figures; asserts nothing about them. Then the same for 64 MiB of output (`yes
//! | head`), every byte counted, and the size of a microvm container's disk.
//! `cargo bench -p cordon-oci --bench podman_start` (root, podman, runc; the
//! sandbox init built beside cordon-oci: `cargo build -p cordon-oci -p cordon-sandbox-init`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    let runs: usize = std::env::var("CORDON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    // The bench binary is target/<profile>/deps/podman_start-*: cordon-oci sits two up.
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
    let image = "localhost/cordon-oci-bench:1";
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
    let start = |runtime: &Path, tier: Option<&str>| -> f64 {
        let t0 = Instant::now();
        let out = Command::new("podman")
            .args(&base)
            .arg("--runtime")
            .arg(runtime)
            .args(["run", "--rm", "--network", "none"])
            .args(tier_args(tier))
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args([image, "true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            runtime.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        t0.elapsed().as_secs_f64() * 1000.0
    };
    let runc = Path::new("/usr/sbin/runc");
    // One of each first, not counted: podman's and the page cache's first-time costs.
    let gvisor = Command::new("sh")
        .args(["-c", "command -v runsc"])
        .output()
        .is_ok_and(|o| o.status.success());
    let microvm = cordon_tiers::Tiers
        .probe(cordon_core::Tier::Microvm)
        .capabilities
        .iter()
        .any(|c| c.name == "guest image" && c.ok);
    if !gvisor || !microvm {
        eprintln!("note: no runsc or no microvm guest image here: those rows are left out");
    }
    let vm_runs: usize = std::env::var("CORDON_BENCH_MICROVM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    start(runc, None);
    start(&oci, None);
    let (mut a, mut b, mut g, mut m) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        a.push(start(runc, None));
        b.push(start(&oci, None));
        if gvisor {
            g.push(start(&oci, Some("gvisor")));
        }
        if microvm && i < vm_runs {
            m.push(start(&oci, Some("microvm")));
        }
    }
    let show = |name: &str, v: &mut Vec<f64>| {
        if v.is_empty() {
            return;
        }
        v.sort_by(f64::total_cmp);
        println!(
            "podman run --rm true, {name:<18}: median {:7.1} ms  min {:7.1} ms  max {:7.1} ms  ({} runs)",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1],
            v.len()
        );
    };
    show("runc", &mut a);
    show("cordon-oci", &mut b);
    show("cordon-oci gvisor", &mut g);
    show("cordon-oci microvm", &mut m);
    if microvm {
        disk_size(&base, &oci, image);
    }
    // Output: 64 MiB written as fast as `yes | head` goes, read from podman's stdout, each
    // byte counted (under cordon-oci the engine's own pipe is the workload's stdout).
    let io_runs: usize = std::env::var("CORDON_BENCH_IO_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    const BYTES: usize = 64 << 20;
    let write = |runtime: &Path, tier: Option<&str>| -> f64 {
        use std::io::Read;
        let t0 = Instant::now();
        let mut child = Command::new("podman")
            .args(&base)
            .arg("--runtime")
            .arg(runtime)
            .args(["run", "--rm", "--network", "none"])
            .args(tier_args(tier))
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args([image, "busybox", "sh", "-c"])
            .arg(format!(
                "busybox yes 0123456789abcdef | busybox head -c {BYTES}"
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        let mut out = child.stdout.take().unwrap();
        loop {
            match out.read(&mut buf).unwrap() {
                0 => break,
                n => got += n,
            }
        }
        assert!(child.wait().unwrap().success(), "{}", runtime.display());
        assert_eq!(got, BYTES, "{}: bytes that arrived", runtime.display());
        t0.elapsed().as_secs_f64()
    };
    let (mut a, mut b, mut g, mut m) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..io_runs {
        a.push(write(runc, None));
        b.push(write(&oci, None));
        if gvisor {
            g.push(write(&oci, Some("gvisor")));
        }
        if microvm && i < vm_runs {
            m.push(write(&oci, Some("microvm")));
        }
    }
    let show = |name: &str, v: &mut Vec<f64>| {
        if v.is_empty() {
            return;
        }
        v.sort_by(f64::total_cmp);
        let mib = (BYTES >> 20) as f64;
        println!(
            "podman run, 64 MiB of output, {name:<18}: median {:6.2} s ({:6.1} MiB/s)  min {:6.2} s  ({} runs, every byte arrived)",
            v[v.len() / 2],
            mib / v[v.len() / 2],
            v[0],
            v.len()
        );
    };
    show("runc", &mut a);
    show("cordon-oci", &mut b);
    show("cordon-oci gvisor", &mut g);
    show("cordon-oci microvm", &mut m);
}

/// `--annotation cordon.tier=<tier>` for a tier other than the default.
fn tier_args(tier: Option<&str>) -> Vec<String> {
    tier.map(|t| vec!["--annotation".to_string(), format!("cordon.tier={t}")])
        .unwrap_or_default()
}

/// The disk a microvm container's root becomes (made at create under the node's disk,
/// unlinked once QEMU holds it): its size and what it takes on the node's disk, read
/// through the descriptor of a running container's QEMU.
fn disk_size(base: &[String], oci: &Path, image: &str) {
    use std::os::unix::fs::MetadataExt;
    let out = Command::new("podman")
        .args(base)
        .arg("--runtime")
        .arg(oci)
        .args(["run", "-d", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(tier_args(Some("microvm")))
        .args([image, "busybox", "sleep", "60"])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let wanted = format!("{}/{id}/root.ext4", cordon_oci::tiers::DISKS);
    // Bounded: the processes of the node, each's descriptors.
    let held = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| std::fs::read_dir(p.path().join("fd")).ok())
        .flat_map(|fds| fds.flatten())
        .find(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with(&wanted))
        });
    match held.map(|fd| std::fs::metadata(fd.path())) {
        Some(Ok(m)) => println!(
            "microvm container's disk (a busybox image): {:.1} MiB, {:.1} MiB allocated on the node's disk",
            m.len() as f64 / (1 << 20) as f64,
            (m.blocks() * 512) as f64 / (1 << 20) as f64
        ),
        _ => eprintln!("no process holds the disk {wanted}"),
    }
    let _ = Command::new("podman")
        .args(base)
        .arg("--runtime")
        .arg(oci)
        .args(["rm", "-f", &id])
        .output();
}
