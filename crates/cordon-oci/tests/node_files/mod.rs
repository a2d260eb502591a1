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
struct Direct {
    dir: tempfile::TempDir,
    bundle: PathBuf,
    config: PathBuf,
    root: PathBuf,
}

impl Direct {
    fn new(args: &[&str], readonly: bool, annotations: serde_json::Value, extra: &str) -> Self {
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

    fn oci(&self, args: &[&str]) -> Command {
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
    fn create(&self, id: &str) -> Command {
        let log = std::fs::File::create(self.dir.path().join(format!("{id}.log"))).unwrap();
        let mut c = self.oci(&["create", "--bundle", self.bundle.to_str().unwrap(), id]);
        c.stdout(log.try_clone().unwrap()).stderr(log);
        c
    }

    fn log(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{id}.log"))).unwrap_or_default()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.oci(args).output().unwrap()
    }

    /// The container's record, as its state file holds it.
    fn record(&self, id: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.root.join(id).join("state.json")).unwrap())
            .unwrap()
    }
}

fn setup() -> bool {
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
