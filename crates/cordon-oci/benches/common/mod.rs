//! What the cordon-oci benches share: their setup (root, cordon-oci built beside the bench, a
//! busybox root), podman with storage of the bench's own and that root imported into it, a
//! timed `podman run`, and the line a figure is printed on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cordon_testkit::podman;

pub struct Bench {
    /// Timed runs of each kind (`CORDON_BENCH_RUNS`, default 15).
    pub runs: usize,
    /// The cordon-oci built beside the bench.
    pub oci: PathBuf,
    pub dir: tempfile::TempDir,
    /// A root filesystem of busybox and `/bin/true`.
    pub root: PathBuf,
}

/// A count from the environment variable `var`, else `default`.
pub fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The bench's setup; `None` (saying SKIPPING) without root or cordon-oci.
pub fn setup() -> Option<Bench> {
    // The bench binary is target/<profile>/deps/<bench>-*: cordon-oci sits two up.
    let exe = std::env::current_exe().unwrap();
    let oci = exe.parent().unwrap().parent().unwrap().join("cordon-oci");
    if !oci.is_file() || !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPING: needs root and {} (cargo build -p cordon-oci -p cordon-sandbox-init)",
            oci.display()
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/true")).unwrap();
    Some(Bench {
        runs: count("CORDON_BENCH_RUNS", 15),
        oci,
        dir,
        root,
    })
}

impl Bench {
    /// Podman's global arguments for storage of the bench's own, with its root imported
    /// into it as `image`.
    pub fn podman_with(&self, image: &str) -> Vec<String> {
        let tar = self.dir.path().join("rootfs.tar");
        podman::tar_dir(&self.root, &tar);
        let base = podman::storage_args(self.dir.path());
        podman::import(&base, &tar, image, &[]);
        base
    }
}

/// `podman <base> --runtime <runtime> <sub> --network none` with the ulimits podman needs
/// here; the caller adds its flags, the image and the command.
pub fn podman(base: &[String], runtime: &Path, sub: &[&str]) -> Command {
    let mut c = Command::new("podman");
    c.args(base)
        .arg("--runtime")
        .arg(runtime)
        .args(sub)
        .args(["--network", "none"])
        .args(podman::ULIMITS);
    c
}

/// Runs `cmd` to its end, checking it succeeded (naming `what`), and returns how long it
/// took in milliseconds.
pub fn timed_ms(cmd: &mut Command, what: &str) -> f64 {
    let t0 = Instant::now();
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t0.elapsed().as_secs_f64() * 1000.0
}

/// Prints the median, least and most of `v` (milliseconds) as `what`'s line; nothing for
/// no runs.
pub fn show_ms(what: &str, v: &mut [f64]) {
    if v.is_empty() {
        return;
    }
    v.sort_by(f64::total_cmp);
    println!(
        "{what:<52}: median {:7.1} ms  min {:7.1} ms  max {:7.1} ms  ({} runs)",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1],
        v.len()
    );
}
