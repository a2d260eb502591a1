//! A pod's volumes as the kubelet hands them to the runtime (issue 45, item 3): bind mounts
//! from the kubelet's own directory of the pod (`[kubelet] root_dir`, the pod named by
//! containerd's `io.kubernetes.cri.sandbox-uid`), written here as the kubelet lays them out:
//! accepted on the container and gvisor tiers at the path the bundle says (through an
//! image's links, inside its root), read-only where asked, an emptyDir's writes in the
//! node's directory (where the kubelet measures its sizeLimit); a directory reached through
//! a link, another pod's directory and a plain host path are refused; the microvm tier
//! refuses them with the reason.

use std::path::{Path, PathBuf};

use super::node_files::{Direct, setup};
use super::text;

const UID: &str = "4f9dfd02-d4cc-48a7-9070-1e2c844e9551";
const TOKEN_AT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The kubelet's directory of pod `UID` under `kubelet` (a root dir of its own): its
/// projected token and an emptyDir, as the kubelet makes them.
fn pod_dir(kubelet: &Path) -> (PathBuf, PathBuf) {
    let vols = kubelet.join("pods").join(UID).join("volumes");
    let token = vols.join("kubernetes.io~projected/kube-api-access-x");
    let data = token.join("..2026_12_06");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("token"), "a.b.c").unwrap();
    std::os::unix::fs::symlink("..2026_12_06", token.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/token", token.join("token")).unwrap();
    let scratch = vols.join("kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::set_permissions(
        &scratch,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    (token, scratch)
}

fn bind(source: &Path, dest: &str, ro: bool) -> serde_json::Value {
    let mode = if ro { "ro" } else { "rw" };
    serde_json::json!({"destination": dest, "type": "bind", "source": source,
                       "options": ["rbind", "rprivate", mode]})
}

/// A bundle running `script` on `tier`, under a node whose kubelet's root is
/// `dir/kubelet`; its mounts are given by [`with_mounts`].
fn direct(script: &str, tier: &str) -> Direct {
    let annotations = serde_json::json!({"cordon.tier": tier,
                                         "io.kubernetes.cri.sandbox-uid": UID});
    let d = Direct::new(&["sh", "-c", script], true, annotations, "");
    let kubelet = d.dir.path().join("kubelet");
    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(
        &d.config,
        format!("{text}\n[kubelet]\nroot_dir = \"{}\"\n", kubelet.display()),
    )
    .unwrap();
    // The image's /var/run is a link to /run, as in most images: the token's mount point
    // is made at /run/secrets/…, inside the image's root.
    let rootfs = d.bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("run")).unwrap();
    std::fs::create_dir_all(rootfs.join("var")).unwrap();
    std::os::unix::fs::symlink("../run", rootfs.join("var/run")).unwrap();
    d
}

/// Runs the container to its end; returns its output and whether it was created.
fn run_to_end(d: &Direct, id: &str) -> (bool, String) {
    let created = d.create(id).status().unwrap();
    if !created.success() {
        return (false, d.log(id));
    }
    assert!(d.run(&["start", id]).status.success(), "{}", d.log(id));
    let monitor = d.record(id)["pid"].as_i64().unwrap() as i32;
    // The monitor ends with the container's process (bounded: the script is short).
    for _ in 0..600 {
        if !Path::new(&format!("/proc/{monitor}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = d.run(&["delete", "--force", id]);
    (true, d.log(id))
}

const SCRIPT: &str = "cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo; \
     echo written > /scratch/f && echo wrote; \
     (echo x > /var/run/secrets/kubernetes.io/serviceaccount/new) 2>/dev/null && echo TOOK-A-WRITE; \
     grep -c ' /run/secrets/kubernetes.io/serviceaccount ' /proc/self/mountinfo";

fn pod_volumes_are_bound_where_the_bundle_says(tier: &str) {
    let d = direct(SCRIPT, tier);
    let (token, scratch) = pod_dir(&d.dir.path().join("kubelet"));
    let d = with_mounts(
        d,
        vec![
            bind(&token, TOKEN_AT, true),
            bind(&scratch, "/scratch", false),
        ],
    );
    let (created, out) = run_to_end(&d, "pod1");
    assert!(created, "{tier}: refused: {out}");
    assert!(out.starts_with("a.b.c\nwrote\n"), "{tier}: {out}");
    assert!(
        !out.contains("TOOK-A-WRITE"),
        "{tier}: a read-only volume took a write: {out}"
    );
    // The emptyDir's write is in the kubelet's directory, where its sizeLimit is measured.
    assert_eq!(
        std::fs::read_to_string(scratch.join("f")).unwrap_or_default(),
        "written\n",
        "{tier}: {out}"
    );
}

/// [`direct`]'s bundle given `mounts` (once the pod's directory exists in its dir).
fn with_mounts(d: Direct, mounts: Vec<serde_json::Value>) -> Direct {
    let path = d.bundle.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["mounts"] = serde_json::Value::Array(mounts);
    std::fs::write(&path, cfg.to_string()).unwrap();
    d
}

#[test]
fn pod_volumes_are_bound_on_the_container_tier() {
    if !setup() {
        return;
    }
    pod_volumes_are_bound_where_the_bundle_says("container");
}

#[test]
fn pod_volumes_are_bound_on_the_gvisor_tier() {
    if !setup() || !super::tiers::gvisor_here() {
        return;
    }
    pod_volumes_are_bound_where_the_bundle_says("gvisor");
}

/// The attack: a component of the volume's path in the pod's directory is a link to the
/// node's /etc (made by anything that can write there), so a bind that follows it would
/// give the pod the node's files. It is refused, and nothing runs.
#[test]
fn a_pod_volume_reached_through_a_link_is_refused() {
    if !setup() {
        return;
    }
    let d = direct("cat /cfg/passwd", "container");
    let kubelet = d.dir.path().join("kubelet");
    let vols = kubelet.join("pods").join(UID).join("volumes");
    std::fs::create_dir_all(&vols).unwrap();
    std::os::unix::fs::symlink("/etc", vols.join("kubernetes.io~configmap")).unwrap();
    let d = with_mounts(
        d,
        vec![bind(&vols.join("kubernetes.io~configmap"), "/cfg", true)],
    );
    let (created, out) = run_to_end(&d, "linked");
    assert!(!created, "a volume through a link to /etc was bound: {out}");
    assert!(!out.contains("root:"), "{out}");
    assert!(out.contains("cordon-oci refuses this container"), "{out}");
    assert!(out.contains("symbolic link"), "{out}");
    // The same below a linked component.
    let d = direct("ls /cfg", "container");
    let vols = d.dir.path().join("kubelet/pods").join(UID);
    std::fs::create_dir_all(&vols).unwrap();
    std::os::unix::fs::symlink("/etc", vols.join("volumes")).unwrap();
    let d = with_mounts(d, vec![bind(&vols.join("volumes/ssl"), "/cfg", true)]);
    let (created, out) = run_to_end(&d, "linked2");
    assert!(!created, "a volume below a link to /etc was bound: {out}");
}

/// Another pod's directory and a host path outside the kubelet's are host paths: refused
/// unless `[allow]` names them; the microvm tier refuses pod volumes with the reason.
#[test]
fn other_pods_volumes_host_paths_and_the_microvm_tier_are_refused() {
    if !setup() {
        return;
    }
    for (source, id) in [
        ("kubelet/pods/other-uid/volumes/x", "other"),
        ("host-dir", "host"),
    ] {
        let d2 = direct("true", "container");
        let source = d2.dir.path().join(source);
        std::fs::create_dir_all(&source).unwrap();
        let d2 = with_mounts(d2, vec![bind(&source, "/data", true)]);
        let (created, out) = run_to_end(&d2, id);
        assert!(!created, "{id}: bound: {out}");
        assert!(out.contains("host path at /data"), "{id}: {out}");
    }
    let d = direct("true", "microvm");
    let (token, _) = pod_dir(&d.dir.path().join("kubelet"));
    let d = with_mounts(d, vec![bind(&token, TOKEN_AT, true)]);
    let (created, out) = run_to_end(&d, "vm");
    assert!(!created, "{out}");
    let said = text(out.as_bytes());
    assert!(said.contains("pod volume on the microvm tier"), "{said}");
    assert!(said.contains("container or gvisor"), "{said}");
}
