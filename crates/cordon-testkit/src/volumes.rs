//! The volume checks every native tier passes (ADR 0011): a volume written by one sandbox
//! is read by the next (another host id range) and stored with the canonical owner, so any
//! tier can use it after any other; read-only mounts refuse writes and may be many; a
//! read-write lease is exclusive; the quota is ENOSPC and the disk-limit outcome; and links
//! a sandbox plants in a volume reach nothing of the host's, neither for the next sandbox
//! nor for the host, which never follows anything inside one.

use std::os::unix::fs::MetadataExt;

use cordon_core::{Backend, ExecRequest, Language, SandboxSpec, Termination};
use cordon_host::volume::{VolumeError, VolumeLease, VolumeStore};

use crate::{run_once, text};

/// `base` with the leased volume mounted at `/work/{path}`.
fn with_volume(mut s: SandboxSpec, lease: &VolumeLease, path: &str) -> SandboxSpec {
    let mut m =
        cordon_core::VolumeMount::new("v", &format!("/work/{path}"), lease.read_only()).unwrap();
    m.source = Some(cordon_core::VolumeSource {
        host_dir: lease.host_dir().to_path_buf(),
        lease: None,
    });
    s.volumes.push(m);
    s
}

fn bash(b: &dyn Backend, spec: &SandboxSpec, script: &str) -> cordon_core::ExecOutcome {
    run_once(b, spec, &ExecRequest::code(Language::Bash, script))
}

/// Runs the checks on `b` with sandboxes of `base()`'s spec. Needs root (loop mounts).
pub fn battery(b: &dyn Backend, base: impl Fn() -> SandboxSpec) {
    let dir = tempfile::tempdir().unwrap();
    let store = VolumeStore::open(&dir.path().join("volumes")).unwrap();
    store.create("t", "v", 16 << 20).unwrap();
    let secret = dir.path().join("host-secret");
    std::fs::write(&secret, "host secret").unwrap();
    write_and_plant_links(b, &base, &store, &secret);
    let lease = store.mount("t", "v", true).unwrap();
    stored_as_the_canonical_owner(&store, &lease);
    read_only_reaches_nothing_of_the_host(b, &base, &lease);
    drop(lease);
    quota_is_the_disk_limit(b, &base, &store);
    store.delete("t", "v").unwrap();
    assert!(store.list("t").unwrap().is_empty());
}

/// The first sandbox writes, and plants links to the host's root and to a host file
/// (`secret`); its lease's host mount goes with the lease.
fn write_and_plant_links(
    b: &dyn Backend,
    base: &impl Fn() -> SandboxSpec,
    store: &VolumeStore,
    secret: &std::path::Path,
) {
    let lease = store.mount("t", "v", false).unwrap();
    let o = bash(
        b,
        &with_volume(base(), &lease, "data"),
        &format!(
            "echo kept > /work/data/a && mkdir /work/data/d && ln -s / /work/data/root \
             && ln -s /etc /work/data/etc && ln -s {} /work/data/secret && cat /work/data/a",
            secret.display()
        ),
    );
    assert_eq!(o.exit_code, Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "kept\n");
    let host_dir = lease.host_dir().to_path_buf();
    drop(lease);
    assert!(!host_dir.exists(), "the lease's host mount goes with it");
}

/// Stored with the canonical owner, not the sandbox's host range; the host sees the planted
/// links as links and never follows them. Read-only leases are many (`lease` is one); no
/// read-write lease and no delete meanwhile.
fn stored_as_the_canonical_owner(store: &VolumeStore, lease: &VolumeLease) {
    let md = std::fs::symlink_metadata(lease.host_dir().join("a")).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (1000, 1000),
        "stored as the canonical owner"
    );
    let link = std::fs::symlink_metadata(lease.host_dir().join("secret")).unwrap();
    assert!(link.file_type().is_symlink());
    let second = store.mount("t", "v", true).unwrap();
    assert!(matches!(
        store.mount("t", "v", false),
        Err(VolumeError::InUse { .. })
    ));
    assert!(matches!(
        store.delete("t", "v"),
        Err(VolumeError::InUse { .. })
    ));
    drop(second);
}

/// The next sandbox, mounting it read-only (deep under `/work`): it reads, cannot write,
/// and the planted links reach nothing of the host's.
fn read_only_reaches_nothing_of_the_host(
    b: &dyn Backend,
    base: &impl Fn() -> SandboxSpec,
    lease: &VolumeLease,
) {
    let o = bash(
        b,
        &with_volume(base(), lease, "in/v"),
        "cat /work/in/v/a; touch /work/in/v/b 2>&1 || echo REFUSED; \
         cat /work/in/v/secret 2>&1 || echo NO-SECRET; cat /work/in/v/etc/shadow 2>&1 || echo NO-SHADOW; \
         echo ROOT: $(ls /work/in/v/root/) :END; stat -c %u /work/in/v/d; \
         touch /work/in/x && echo PARENT-OK",
    );
    let out = text(&o.stdout);
    assert!(
        out.starts_with("kept\n") && out.contains("REFUSED"),
        "{out}"
    );
    assert!(
        !out.contains("host secret") && out.contains("NO-SECRET"),
        "{out}"
    );
    assert!(
        out.contains("NO-SHADOW") && out.contains("PARENT-OK"),
        "{out}"
    );
    let root = out
        .split("ROOT:")
        .nth(1)
        .unwrap()
        .split(":END")
        .next()
        .unwrap();
    assert!(root.contains(" work ") && root.contains(" usr"), "{root}");
    // (A sandbox root may have its own /home: the container tier's link of E2B's home.)
    for host_only in [" boot ", " var ", " root "] {
        assert!(
            !root.contains(host_only),
            "the link to / reached the host's root: {root}"
        );
    }
}

/// Its quota is its file system's size: past it, ENOSPC and the disk-limit outcome.
fn quota_is_the_disk_limit(b: &dyn Backend, base: &impl Fn() -> SandboxSpec, store: &VolumeStore) {
    let lease = store.mount("t", "v", false).unwrap();
    let o = bash(
        b,
        &with_volume(base(), &lease, "data"),
        "dd if=/dev/zero of=/work/data/big bs=1M count=64",
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:?}");
    assert!(
        text(&o.stderr).contains("No space left"),
        "{}",
        text(&o.stderr)
    );
    drop(lease);
}

/// Prints what a volume adds to a create (the figures of ADR 0011): medians of `n` creates
/// plus destroys without a volume, and with one (its lease: lock and loop mount; the create
/// with the bind; the destroy; the lease's release: unmount and the loop device cleared).
/// Run with `--nocapture`; nothing is asserted on time.
pub fn print_cost(b: &dyn Backend, base: impl Fn() -> SandboxSpec, n: usize) {
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let store = VolumeStore::open(&dir.path().join("volumes")).unwrap();
    let t = Instant::now();
    store.create("t", "v", 64 << 20).unwrap();
    let mkfs_us = t.elapsed().as_micros();
    let median = |mut v: Vec<u128>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (mut plain, mut with, mut lease_us, mut release_us) = (vec![], vec![], vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let mut sb = b.create(&base()).unwrap();
        sb.destroy().unwrap();
        plain.push(t.elapsed().as_micros());
        let t = Instant::now();
        let lease = store.mount("t", "v", false).unwrap();
        lease_us.push(t.elapsed().as_micros());
        let mut sb = b.create(&with_volume(base(), &lease, "data")).unwrap();
        sb.destroy().unwrap();
        let r = Instant::now();
        drop(lease);
        release_us.push(r.elapsed().as_micros());
        with.push(t.elapsed().as_micros());
    }
    println!(
        "volume cost, {} tier, median of {n}: create+destroy {} us without a volume, {} us with \
         one ({} us of it the lease, {} us the release); creating a 64 MiB volume {mkfs_us} us",
        base().tier,
        median(plain),
        median(with),
        median(lease_us),
        median(release_us)
    );
}
