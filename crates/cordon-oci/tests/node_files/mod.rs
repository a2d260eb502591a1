//! What a container must not take from the node or leave on it (issue 44's cordon-oci
//! items), each made as the attack is made: a node directory as its root, the caller's open
//! descriptors, an exec's environment on a command line, its record and audit rows readable
//! by every local user, and what a killed monitor leaves in /run and /var/lib.

use std::process::Command;

use super::{node_config, podman, text};

/// Item 4: a node directory is no container's root unless the node's `[allow] rootfs`
/// names it (podman `--rootfs`, a hand-written bundle's `root.path`, or a link to one), and
/// a named one keeps its root-owned files root's: with the writable root's id mapping, a
/// node secret of mode 0600 is never the workload's.
#[test]
fn a_node_directory_is_no_root_unless_the_node_names_it_and_its_root_files_stay_roots() {
    let Some(p) = podman() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node_dir = dir.path().join("nodedir");
    std::fs::create_dir_all(&node_dir).unwrap();
    // A node directory with a program in it and a root secret beside it.
    let tar = super::busybox_tar(dir.path());
    let st = Command::new("tar")
        .arg("-C")
        .arg(&node_dir)
        .arg("-xf")
        .arg(&tar)
        .status()
        .unwrap();
    assert!(st.success());
    // The mount points a tier's root needs, as an image has them.
    for (rel, is_dir) in cordon_template::MOUNT_POINTS {
        let at = node_dir.join(rel);
        if is_dir {
            std::fs::create_dir_all(&at).unwrap();
        } else {
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(&at, "").unwrap();
        }
    }
    let secret = node_dir.join("etc/node-secret");
    std::fs::write(&secret, "node-secret-value\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&node_dir, &link).unwrap();
    let read = "cat /etc/node-secret; echo rc=$?; cat /etc/motd; touch /etc/w; echo w=$?";
    let unnamed = node_config(dir.path(), "");
    for root in [&node_dir, &link] {
        let out = p.oci_under(
            &unnamed,
            &[
                "run",
                "--rm",
                "--rootfs",
                root.to_str().unwrap(),
                "sh",
                "-c",
                read,
            ],
        );
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(
            !o.contains("node-secret-value"),
            "{}: read the node's secret: {o}",
            root.display()
        );
        assert!(!out.status.success(), "{}: ran: {o}", root.display());
        assert!(e.contains("[allow] rootfs"), "{}: {e}", root.display());
    }
    // Named: it runs, and its root's files stay root's (the sandbox's root's inside: the
    // workload reads what all may read and writes nowhere root owns).
    let named = node_config(
        dir.path(),
        &format!("[allow]\nrootfs = [\"{}\"]\n", node_dir.display()),
    );
    let out = p.oci_under(
        &named,
        &[
            "run",
            "--rm",
            "--rootfs",
            node_dir.to_str().unwrap(),
            "sh",
            "-c",
            read,
        ],
    );
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !o.contains("node-secret-value"),
        "read the node's secret: {o}"
    );
    assert!(e.contains("Permission denied"), "{o}{e}");
    assert!(o.contains("rc=1\nimage\nw=1\n"), "{o}{e}");
    // Nothing the workload wrote reached the node directory.
    assert!(!node_dir.join("etc/w").exists());
}
