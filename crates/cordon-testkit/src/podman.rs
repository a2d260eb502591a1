//! Podman with storage of its own under a test's or bench's directory, for what drives
//! cordon-oci through podman (its integration tests and benches): the host's podman storage
//! is never touched.

use std::path::Path;
use std::process::Command;

use crate::text;

/// The ulimits podman 4.3 needs under this host's hard limits, for `run` and `create`.
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// Podman's global arguments for images, containers and run state of its own under `dir`
/// (cgroupfs cgroups, events to a file).
pub fn storage_args(dir: &Path) -> Vec<String> {
    vec![
        "--root".into(),
        dir.join("storage").display().to_string(),
        "--runroot".into(),
        dir.join("run").display().to_string(),
        "--cgroup-manager".into(),
        "cgroupfs".into(),
        "--events-backend".into(),
        "file".into(),
    ]
}

/// Imports the tar archive of a root filesystem at `tar` as `image` into the storage that
/// `args` name, with `changes` (each a `--change` instruction); panics with podman's error
/// when it fails.
pub fn import(args: &[String], tar: &Path, image: &str, changes: &[&str]) {
    let out = Command::new("podman")
        .args(args)
        .arg("import")
        .args(changes.iter().flat_map(|c| ["--change", c]))
        .arg(tar)
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman import {image}: {}",
        text(&out.stderr)
    );
}

/// A tar archive of the directory `root` at `tar` (`tar -C root -cf tar .`).
pub fn tar_dir(root: &Path, tar: &Path) {
    let st = Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg(tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of {}", root.display());
}
