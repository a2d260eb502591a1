//! What a container must not take from the node or leave on it (issue 44's cordon-oci
//! items), each made as the attack is made: a node directory as its root, the caller's open
//! descriptors, an exec's environment on a command line, its record and audit rows readable
//! by every local user, and what a killed monitor leaves in /run and /var/lib.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::{IMAGE, OCI, have, node_config, podman, text};

/// A hand-written bundle of the busybox root (`dir/bundle`, its root `rootfs`), a node
/// config in `dir` that names that root in `[allow] rootfs` (plus `extra`), and a runtime
/// root of the test's own.
pub(super) struct Direct {
    pub(super) dir: tempfile::TempDir,
    pub(super) bundle: PathBuf,
    pub(super) config: PathBuf,
    pub(super) root: PathBuf,
}

impl Direct {
    pub(super) fn new(
        args: &[&str],
        readonly: bool,
        annotations: serde_json::Value,
        extra: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        super::busybox_tar(&bundle);
        std::fs::write(
            bundle.join("config.json"),
            serde_json::json!({
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs", "readonly": readonly},
                "process": {"args": args, "cwd": "/", "env": ["PATH=/bin"],
                            "user": {"uid": 0, "gid": 0}},
                "annotations": annotations,
                "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                                         {"type": "uts"}, {"type": "mount"}]}
            })
            .to_string(),
        )
        .unwrap();
        let config = node_config(
            dir.path(),
            &format!("{extra}{}", super::allow_rootfs(&bundle)),
        );
        let root = dir.path().join("state");
        Direct {
            dir,
            bundle,
            config,
            root,
        }
    }

    pub(super) fn oci(&self, args: &[&str]) -> Command {
        let mut c = Command::new("timeout");
        c.args(["60", OCI])
            .arg("--root")
            .arg(&self.root)
            .arg("--cordon-config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// `create` with the monitor's stdio on a file (the monitor outlives the call).
    pub(super) fn create(&self, id: &str) -> Command {
        let log = std::fs::File::create(self.dir.path().join(format!("{id}.log"))).unwrap();
        let mut c = self.oci(&["create", "--bundle", self.bundle.to_str().unwrap(), id]);
        c.stdout(log.try_clone().unwrap()).stderr(log);
        c
    }

    pub(super) fn log(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{id}.log"))).unwrap_or_default()
    }

    pub(super) fn run(&self, args: &[&str]) -> Output {
        self.oci(args).output().unwrap()
    }

    /// The container's record, as its state file holds it.
    pub(super) fn record(&self, id: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.root.join(id).join("state.json")).unwrap())
            .unwrap()
    }
}

pub(super) fn setup() -> bool {
    have("root", nix::unistd::geteuid().is_root())
        && have("busybox", Path::new("/bin/busybox").is_file())
        && super::init_beside()
}

/// Every pid whose parent chain leads to `top` (`top` included).
fn tree(top: i32) -> Vec<i32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if let Some(ppid) = rest.split(' ').nth(1).and_then(|p| p.parse::<i32>().ok()) {
            parent.insert(pid, ppid);
        }
    }
    parent
        .keys()
        .copied()
        .filter(|p| {
            let mut at = *p;
            for _ in 0..64 {
                if at == top {
                    return true;
                }
                match parent.get(&at) {
                    Some(pp) if *pp > 0 => at = *pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// The processes (of `pids`) that hold a descriptor of the file at `path`.
fn holders(pids: &[i32], path: &Path) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        })
        .collect()
}

/// Item 15: a descriptor the caller left open (an engine's `--preserve-fds`, a shell's
/// redirection) reaches neither the monitor nor anything it starts: not the sandbox's
/// process 1, not its init, not the container's process.
#[test]
fn the_callers_open_descriptors_never_reach_the_sandbox() {
    if !setup() {
        return;
    }
    let d = Direct::new(&["sleep", "300"], true, serde_json::json!({}), "");
    let secret = d.dir.path().join("caller-secret");
    std::fs::write(&secret, "the caller's\n").unwrap();
    let file = std::fs::File::open(&secret).unwrap();
    // Inherited by the runtime as an engine's own descriptor would be.
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let created = d.create("fds").status().unwrap();
    drop(file);
    assert!(created.success(), "{}", d.log("fds"));
    assert!(
        d.run(&["start", "fds"]).status.success(),
        "{}",
        d.log("fds")
    );
    let monitor = d.record("fds")["pid"].as_i64().unwrap() as i32;
    let all = tree(monitor);
    // The monitor, the sandbox's init and its process 1 at least.
    assert!(all.len() >= 3, "the container's processes: {all:?}");
    let held = holders(&all, &secret);
    let _ = d.run(&["delete", "--force", "fds"]);
    assert!(
        held.is_empty(),
        "the caller's descriptor reached {held:?} of the container's processes {all:?}"
    );
}

/// Item 17: the container's record and the node's audit store are root's alone: another
/// local user reads neither, though the directories above let every user pass.
#[test]
fn the_record_and_the_audit_rows_are_roots_alone() {
    if !setup() || !have("setpriv", super::on_path("setpriv")) {
        return;
    }
    let d = Direct::new(&["sleep", "300"], true, serde_json::json!({}), "");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        d.create("private").status().unwrap().success(),
        "{}",
        d.log("private")
    );
    let as_nobody = |path: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "cat",
            ])
            .arg(path)
            .output()
            .unwrap()
    };
    // Root reads it.
    assert_eq!(d.record("private")["status"], "created");
    let state = d.root.join("private/state.json");
    let audit = d.dir.path().join("audit.db");
    let read = [as_nobody(&state), as_nobody(&audit)];
    let _ = d.run(&["delete", "--force", "private"]);
    for (what, out) in ["state.json", "audit.db"].iter().zip(&read) {
        assert!(
            !out.status.success() && out.stdout.is_empty(),
            "another user read the container's {what}: {} bytes",
            out.stdout.len()
        );
        assert!(
            text(&out.stderr).contains("Permission denied"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// Whether a process's command line holds `needle`, and which.
fn command_lines_holding(needle: &str) -> Vec<(i32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmd = text(&std::fs::read(e.path().join("cmdline")).ok()?).replace('\0', " ");
            cmd.contains(needle).then_some((pid, cmd))
        })
        .collect()
}

/// Item 10: an exec's process (its environment included) is never on a command line,
/// which every local user reads: podman's `exec -d -e`, as the engine runs it (conmon
/// calls `exec --detach --process FILE`), with the exec running.
#[test]
fn an_execs_environment_is_never_on_a_command_line() {
    let Some(p) = podman() else { return };
    let name = "oci-exec-env";
    let _ = p.oci(&["rm", "-f", name]);
    let out = p.oci(&["run", "-d", "--name", name, IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let secret = format!("cordon-exec-secret-{}", std::process::id());
    // The exec keeps its variable where the next exec reads it, and runs on.
    let out = p.oci(&[
        "exec",
        "-d",
        "-e",
        &format!("TOKEN={secret}"),
        name,
        "sh",
        "-c",
        "echo \"$TOKEN\" > /tmp/token; sleep 300",
    ]);
    // The exec runs: its relay is up (and, on the old code, holds the process in argv).
    let ran = out.status.success();
    let seen = command_lines_holding(&secret);
    let env = p.oci(&[
        "exec",
        name,
        "sh",
        "-c",
        "i=0; while [ $i -lt 600 ] && [ ! -s /tmp/token ]; do sleep 0.1; i=$((i+1)); done; \
         cat /tmp/token",
    ]);
    let _ = p.oci(&["rm", "-f", name]);
    assert!(ran, "{}", text(&out.stderr));
    assert!(
        text(&env.stdout).contains(&secret),
        "the exec did not get its environment: {}",
        text(&env.stderr)
    );
    assert!(seen.is_empty(), "on a command line: {seen:?}");
}

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
    let run = |config: &Path, root: &Path| {
        let root = root.to_str().unwrap();
        let out = p.oci_under(config, &["run", "--rm", "--rootfs", root, "sh", "-c", read]);
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let unnamed = node_config(dir.path(), "");
    for root in [&node_dir, &link] {
        let (ran, o, e) = run(&unnamed, root);
        let at = root.display();
        assert!(
            !o.contains("node-secret-value"),
            "{at}: read the node's secret: {o}"
        );
        assert!(!ran, "{at}: ran: {o}");
        assert!(e.contains("[allow] rootfs"), "{at}: {e}");
    }
    // Named: it runs, and its root's files stay root's (the sandbox's root's inside: the
    // workload reads what all may read and writes nowhere root owns).
    let named = node_config(
        dir.path(),
        &format!("[allow]\nrootfs = [\"{}\"]\n", node_dir.display()),
    );
    let (_, o, e) = run(&named, &node_dir);
    assert!(
        !o.contains("node-secret-value"),
        "read the node's secret: {o}"
    );
    assert!(e.contains("Permission denied"), "{o}{e}");
    assert!(o.contains("rc=1\nimage\nw=1\n"), "{o}{e}");
    // Nothing the workload wrote reached the node directory.
    assert!(!node_dir.join("etc/w").exists());
}

/// Where a killed monitor's proxy leaves its socket directory and CA bundle.
fn egress_left(sandbox: &str) -> Vec<PathBuf> {
    [
        PathBuf::from("/run/cordon/egress").join(sandbox),
        PathBuf::from("/run/cordon/egress-ca").join(format!("{sandbox}.pem")),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect()
}

/// Item 14, the proxy: a monitor killed while its container has egress leaves its proxy's
/// socket directory and CA bundle in /run; `delete` removes both.
#[test]
fn delete_removes_the_proxy_files_a_killed_monitor_left() {
    if !setup() {
        return;
    }
    let d = Direct::new(
        &["sleep", "300"],
        true,
        serde_json::json!({"cordon.allow-hosts": "example.com"}),
        "[ceiling]\negress = [\"*\"]\n",
    );
    assert!(
        d.create("egress-k").status().unwrap().success(),
        "{}",
        d.log("egress-k")
    );
    let record = d.record("egress-k");
    let sandbox = record["sandbox"].as_str().unwrap().to_string();
    assert_eq!(
        egress_left(&sandbox).len(),
        2,
        "the proxy's files while it runs"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(record["pid"].as_i64().unwrap() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = d.run(&["delete", "--force", "egress-k"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let left = egress_left(&sandbox);
    assert!(left.is_empty(), "left after delete: {left:?}");
}

/// The pid of the monitor of container `id` (a `__monitor` process naming it), if any.
fn monitor_of(id: &str) -> Option<i32> {
    command_lines_holding(&format!("__monitor {id} "))
        .first()
        .map(|(pid, _)| *pid)
}

/// Item 14, the disk: a monitor killed while it makes its writable root's image (a sparse
/// file of the disk limit's size, 16 GiB here) leaves it under /var/lib, and no record
/// names it; the failed `create` and `delete` of that id remove it.
#[test]
fn a_monitor_killed_while_it_makes_its_disk_leaves_no_image() {
    if !setup() || !have("mkfs.ext4", super::on_path("mkfs.ext4")) {
        return;
    }
    let d = Direct::new(
        &["sleep", "300"],
        false,
        serde_json::json!({"cordon.disk": "16G"}),
        "",
    );
    let mut caught = 0;
    for attempt in 0..5 {
        let id = format!("disk-k{attempt}-{}", std::process::id());
        let image = Path::new(cordon_oci::rootfs::UPPERS).join(format!("{id}.img"));
        let mut create = d.create(&id).spawn().unwrap();
        // Its monitor first, then the image (made, not yet unlinked): then it is killed.
        let mut monitor = None;
        let mut killed = false;
        loop {
            match monitor {
                None => monitor = monitor_of(&id),
                Some(m) if image.exists() => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(m),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    killed = image.exists();
                    break;
                }
                Some(_) => {}
            }
            if create.try_wait().unwrap().is_some() {
                break;
            }
        }
        let created = create.wait().unwrap();
        if !killed {
            // Too quick to catch this time: it ran; remove it and try again.
            let _ = d.run(&["delete", "--force", &id]);
            continue;
        }
        caught += 1;
        assert!(
            !created.success(),
            "create succeeded with its monitor killed"
        );
        let out = d.run(&["delete", "--force", &id]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(!image.exists(), "the writable root's image was left");
        assert!(!d.root.join(&id).exists(), "the container's state was left");
        break;
    }
    assert!(caught > 0, "the monitor was never caught making its image");
}

/// Item 14 for a directory the caller cannot see the record of: a monitor killed before
/// it wrote its record leaves a microvm disk's directory named by the id; `delete` of that
/// id removes it (as a monitor killed mid-way leaves it).
#[test]
fn delete_of_an_id_without_a_record_removes_its_left_disk() {
    if !have("root", nix::unistd::geteuid().is_root()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("state");
    let id = format!("disk-left-{}", std::process::id());
    let disk = Path::new(cordon_oci::tiers::DISKS).join(&id);
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::write(disk.join("root.ext4"), b"").unwrap();
    // Its state directory as `create` made it, with no record in it.
    std::fs::create_dir_all(root.join(&id)).unwrap();
    let out = Command::new(OCI)
        .arg("--root")
        .arg(&root)
        .args(["delete", "--force", &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!disk.exists(), "the microvm disk was left");
    assert!(!root.join(&id).exists(), "the state directory was left");
}
