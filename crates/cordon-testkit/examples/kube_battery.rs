//! The escape battery through a real Kubernetes (issue 45): every case of
//! `cordon_testkit::escape::BATTERY` run in pods of one RuntimeClass, each probe a `kubectl
//! exec`, held to the wall of the tier that RuntimeClass's handler runs.
//!
//!     scripts/k8s.sh exec target/debug/examples/kube_battery RUNTIME_CLASS TIER [--import]
//!
//! `--import` first writes the battery's image (the host's Python, bash and a static
//! busybox: `cordon_testkit::image::write_python_image`) and imports it into the node's
//! containerd as `cordon.local/battery:1` with `ctr` (scripts/k8s.sh exec sets its address
//! and namespace). Run inside the cluster's network namespace, so "the host" of the
//! network cases is the node. Exits 0 when every case passed, 1 naming those that failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use cordon_core::{SandboxSpec, Tier};
use cordon_testkit::escape::{BATTERY, Wall, run_table};
use cordon_testkit::kube::Kube;

const IMAGE: &str = "cordon.local/battery:1";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(class), Some(tier)) = (args.first(), args.get(1)) else {
        eprintln!("usage: kube_battery RUNTIME_CLASS TIER [--import]");
        return ExitCode::from(2);
    };
    let Ok(tier) = tier.parse::<Tier>() else {
        eprintln!("kube_battery: {tier} is not a tier");
        return ExitCode::from(2);
    };
    if args.iter().any(|a| a == "--import") && !import() {
        return ExitCode::FAILURE;
    }
    let kube = Kube {
        runtime_class: class.clone(),
        image: IMAGE.into(),
        tier,
        token: false,
    };
    // The tier's wall, with the path's differences: a pod's root is writable unless it
    // asks otherwise (a write must stay in its pod; on gVisor the root is the sentry's own
    // overlay, whose files the sandbox's user cannot write), and a caller's files move by
    // `kubectl cp`, through the workload's own tar, never by a file call of Cordon's agent.
    // A pod's sandbox is in the pod's network namespace, where the tier joins it.
    let overlay = tier == Tier::Gvisor;
    let wall = Wall {
        agent_files: false,
        writable_root: !overlay,
        root_overlay: overlay,
        pod_network: tier.features().pod_network,
        ..Wall::of(tier)
    };
    let spec = SandboxSpec::new(tier);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_table(&BATTERY, &kube, &spec, wall)
    })) {
        Ok(()) => {
            println!("kube_battery: every case passed on {class} ({tier})");
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// Writes the battery's image and imports it into the node's containerd.
fn import() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let Some(image) = cordon_testkit::image::write_python_image(dir.path()) else {
        return false;
    };
    let out = std::process::Command::new("ctr")
        .args(["images", "import", "--index-name", IMAGE])
        .arg(&image)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "kube_battery: ctr images import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}
