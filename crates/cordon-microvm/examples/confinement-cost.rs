//! What QEMU's confinement costs a microvm create, without booting anything: the stand-in
//! QEMU (`examples/stand-in-qemu.rs`, built next to this example) is started by the real
//! launcher under the real confinement, answers the agent's handshake at once, and is
//! destroyed; the median create and destroy over ROUNDS is printed. Compare with a build of
//! an older Cordon to see what the confinement adds to a create.
//! `cargo build --release -p cordon-microvm --examples && target/release/examples/confinement-cost [ROUNDS]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use cordon_core::{Sandbox, SandboxSpec, Tier};
use cordon_microvm::{MicrovmBackend, MicrovmConfig};
use cordon_testkit::bench::{median, rounds};

fn main() {
    let rounds = rounds(50);
    let exe = std::env::current_exe().unwrap();
    let stand_in = exe.parent().unwrap().join("stand-in-qemu");
    assert!(
        stand_in.exists(),
        "build the examples first: {}",
        stand_in.display()
    );
    let tmp = std::env::temp_dir().join(format!("cordon-confinement-cost-{}", std::process::id()));
    let img = tmp.join("data/microvm");
    std::fs::create_dir_all(&img).unwrap();
    for f in ["vmlinuz-0", "initrd-0.cpio", "rootfs-0.ext4"] {
        std::fs::write(img.join(f), b"not a real image").unwrap();
    }
    std::fs::write(
        img.join("manifest.json"),
        r#"{"kernel":"vmlinuz-0","initrd":"initrd-0.cpio","rootfs":"rootfs-0.ext4","kernel_version":"x","kernel_package":"x","inputs":{}}"#,
    )
    .unwrap();
    let qemu = tmp.join("bin/qemu-plain");
    std::fs::create_dir_all(qemu.parent().unwrap()).unwrap();
    std::fs::copy(&stand_in, &qemu).unwrap();
    let mut cfg = MicrovmConfig::with_data_dir(tmp.join("data"));
    cfg.run_dir = tmp.join("run");
    cfg.snapshot_dir = tmp.join("snapshots");
    cfg.qemu = qemu;
    cfg.accel = Some(cordon_microvm::Accel::Tcg);
    let backend = MicrovmBackend::new(cfg);
    let spec = SandboxSpec::new(Tier::Microvm);
    let (mut create, mut destroy) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let mut sb = backend.create_cold(&spec).unwrap();
        create.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        sb.destroy().unwrap();
        destroy.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "stand-in QEMU, {rounds} rounds: create {:.2} ms, destroy {:.2} ms (medians)",
        median(create),
        median(destroy)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
