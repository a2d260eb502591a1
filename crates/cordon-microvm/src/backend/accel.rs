//! The accelerator: hardware KVM only where it is really usable, TCG otherwise (and the
//! warning every result carries then).

use std::fs;
use std::path::Path;

use crate::qemu::Accel;

/// Decides whether KVM is really usable here: `/dev/kvm` alone is not enough (a paravirtual
/// `kvm_pvm` device emulates guest kernel code ~1000x slower and crashes stock kernels).
/// Returns the accelerator and why. `CORDON_MICROVM_ACCEL=tcg|kvm` overrides.
pub fn probe_accel() -> (Accel, String) {
    match std::env::var("CORDON_MICROVM_ACCEL").as_deref() {
        Ok("tcg") => return (Accel::Tcg, "TCG forced by CORDON_MICROVM_ACCEL".into()),
        Ok("kvm") => return (Accel::Kvm, "KVM forced by CORDON_MICROVM_ACCEL".into()),
        _ => {}
    }
    if !Path::new("/dev/kvm").exists() {
        return (Accel::Tcg, "no /dev/kvm on this host".into());
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        return (
            Accel::Tcg,
            "/dev/kvm is the paravirtual kvm_pvm module (no VMX/SVM): guest kernel code runs \
             emulated ~1000x slower and stock kernels crash under it"
                .into(),
        );
    }
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !hw {
        return (
            Accel::Tcg,
            "the CPU shows no VMX/SVM: /dev/kvm is not hardware virtualization".into(),
        );
    }
    if !Path::new("/sys/module/kvm_intel").exists() && !Path::new("/sys/module/kvm_amd").exists() {
        return (Accel::Tcg, "neither kvm_intel nor kvm_amd is loaded".into());
    }
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => (
            Accel::Kvm,
            "hardware KVM (VMX/SVM, kvm_intel/kvm_amd)".into(),
        ),
        Err(e) => (Accel::Tcg, format!("cannot open /dev/kvm: {e}")),
    }
}

pub(super) fn tcg_warning(reason: &str) -> String {
    format!(
        "microvm runs under TCG software emulation, not KVM ({reason}): the wall is the same, \
         but boots take seconds and guest code runs many times slower"
    )
}
