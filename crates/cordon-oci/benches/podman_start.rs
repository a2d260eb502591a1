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

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    let Some(bench) = common::setup() else {
        return;
    };
    let (runs, oci) = (bench.runs, &bench.oci);
    let image = "localhost/cordon-oci-bench:1";
    let base = bench.podman_with(image);
    let start = |runtime: &Path, tier: Option<&str>| -> f64 {
        common::timed_ms(
            common::podman(&base, runtime, &["run", "--rm"])
                .args(tier_args(tier))
                .args([image, "true"]),
            &runtime.display().to_string(),
        )
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
    let rows = Rows {
        runc,
        oci,
        gvisor,
        microvm,
        vm_runs: common::count("CORDON_BENCH_MICROVM_RUNS", 3),
    };
    start(runc, None);
    start(oci, None);
    let [mut a, mut b, mut g, mut m] = rows.alternate(runs, start);
    common::show_ms("podman run --rm true, runc", &mut a);
    common::show_ms("podman run --rm true, cordon-oci", &mut b);
    common::show_ms("podman run --rm true, cordon-oci gvisor", &mut g);
    common::show_ms("podman run --rm true, cordon-oci microvm", &mut m);
    if microvm {
        disk_size(&base, oci, image);
    }
    // Output: 64 MiB written as fast as `yes | head` goes, read from podman's stdout, each
    // byte counted (under cordon-oci the engine's own pipe is the workload's stdout).
    let io_runs = common::count("CORDON_BENCH_IO_RUNS", 3);
    const BYTES: usize = 64 << 20;
    let write = |runtime: &Path, tier: Option<&str>| -> f64 {
        use std::io::Read;
        let t0 = Instant::now();
        let mut child = common::podman(&base, runtime, &["run", "--rm"])
            .args(tier_args(tier))
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
    let [mut a, mut b, mut g, mut m] = rows.alternate(io_runs, write);
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

/// The rows of a figure: runc, cordon-oci, and where the node runs them cordon-oci on the
/// gvisor and microvm tiers (microvm in the first `vm_runs` rounds only).
struct Rows<'a> {
    runc: &'a Path,
    oci: &'a Path,
    gvisor: bool,
    microvm: bool,
    vm_runs: usize,
}

impl Rows<'_> {
    /// `measure` on each row in turn, `rounds` times, so the host's load falls on all
    /// alike: the figures of runc, cordon-oci, gvisor and microvm, in that order.
    fn alternate(
        &self,
        rounds: usize,
        measure: impl Fn(&Path, Option<&str>) -> f64,
    ) -> [Vec<f64>; 4] {
        let mut rows: [Vec<f64>; 4] = Default::default();
        for i in 0..rounds {
            rows[0].push(measure(self.runc, None));
            rows[1].push(measure(self.oci, None));
            if self.gvisor {
                rows[2].push(measure(self.oci, Some("gvisor")));
            }
            if self.microvm && i < self.vm_runs {
                rows[3].push(measure(self.oci, Some("microvm")));
            }
        }
        rows
    }
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
    let out = common::podman(base, oci, &["run", "-d"])
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
