//! cordon-oci driven by the engines that call runc: podman, containerd through `ctr` and
//! through its CRI plugin as the kubelet drives it (an image imported from a busybox tarball
//! the test writes, storage of its own). Needs root, podman and busybox
//! (scripts/setup.d/70-oci.sh, 10-base.sh); without them the tests say SKIPPING, and fail
//! under CORDON_REQUIRE_ALL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cri;
mod escape;
mod node_files;
mod passthrough;
mod pod_volumes;
mod tiers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const OCI: &str = env!("CARGO_BIN_EXE_cordon-oci");
const IMAGE: &str = "localhost/cordon-oci-test:1";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether `what` can run here; loud skip, or a failure under CORDON_REQUIRE_ALL.
fn have(what: &str, ok: bool) -> bool {
    if ok {
        return true;
    }
    assert!(
        std::env::var_os("CORDON_REQUIRE_ALL").is_none(),
        "{what} is missing (CORDON_REQUIRE_ALL is set): run scripts/setup.sh"
    );
    eprintln!("\n!!!!! SKIPPING: {what} is missing !!!!!\n");
    false
}

fn on_path(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The sandbox init beside the runtime (`cargo test --workspace` builds it; alone:
/// `cargo build -p cordon-sandbox-init`).
fn init_beside() -> bool {
    let init = Path::new(OCI).with_file_name("cordon-sandbox-init");
    assert!(
        init.is_file(),
        "{} is missing: build it first with `cargo build -p cordon-sandbox-init`",
        init.display()
    );
    true
}

/// A busybox root filesystem as a tar archive, at `dir/rootfs.tar`.
fn busybox_tar(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "echo", "cat", "sleep", "ls", "id", "true", "false", "dd", "kill", "wc", "head",
        "touch", "mknod", "wget", "grep", "mount", "chroot", "env",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    // An image's own /etc and /usr/lib, for a writable root to write into.
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/motd"), "image\n").unwrap();
    std::fs::create_dir_all(root.join("usr/lib/cordon-test")).unwrap();
    // An image's set-id program (of its uid 5) and device node (the host's null device):
    // without effect in the sandbox, writable root or not.
    let suid = root.join("usr/lib/cordon-test/bin");
    std::fs::create_dir_all(&suid).unwrap();
    std::fs::copy("/bin/busybox", suid.join("id")).unwrap();
    std::os::unix::fs::chown(suid.join("id"), Some(5), Some(5)).unwrap();
    std::fs::set_permissions(
        suid.join("id"),
        std::os::unix::fs::PermissionsExt::from_mode(0o6755),
    )
    .unwrap();
    nix::sys::stat::mknod(
        &root.join("etc/nulldev"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let tar = dir.join("rootfs.tar");
    cordon_testkit::podman::tar_dir(&root, &tar);
    tar
}

/// Podman with storage of its own and the busybox image imported into it; `None` where
/// podman cannot run here.
struct Podman {
    _dir: tempfile::TempDir,
    args: Vec<String>,
}

fn podman() -> Option<&'static Podman> {
    static P: OnceLock<Option<Podman>> = OnceLock::new();
    P.get_or_init(|| {
        let root = nix::unistd::geteuid().is_root();
        if !have("root", root)
            || !have("podman", on_path("podman"))
            || !have("runc", on_path("runc"))
            || !have("busybox", Path::new("/bin/busybox").is_file())
            || !init_beside()
        {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let tar = busybox_tar(dir.path());
        let args = cordon_testkit::podman::storage_args(dir.path());
        cordon_testkit::podman::import(&args, &tar, IMAGE, &[]);
        Some(Podman { _dir: dir, args })
    })
    .as_ref()
}

impl Podman {
    /// `podman --runtime <runtime> <args>`, with the ulimits podman 4.3 needs under this
    /// host's hard limits (for `run` and `create`).
    fn cmd(&self, runtime: &str, args: &[&str]) -> Output {
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg("podman")
            .args(&self.args)
            .arg("--runtime")
            .arg(runtime);
        let mut args = args.iter();
        if let Some(sub) = args.next() {
            c.arg(sub);
            if *sub == "run" || *sub == "create" {
                c.args(cordon_testkit::podman::ULIMITS);
            }
        }
        c.args(args);
        c.output().unwrap()
    }

    /// What `wc -c` counts of `input` given on the standard input of `podman run -i` on
    /// cordon-oci (with `flags` before the image), trimmed.
    fn bytes_of_stdin(&self, flags: &[&str], input: &[u8]) -> String {
        use std::io::Write;
        let mut child = Command::new("podman")
            .args(&self.args)
            .args(["--runtime", OCI, "run", "--rm", "-i"])
            .args(cordon_testkit::podman::ULIMITS)
            .args(flags)
            .args([IMAGE, "wc", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        text(&out.stdout).trim().to_string()
    }

    /// Runs a container on cordon-oci under the node config `config`, allowed to reach the
    /// egress test upstream on `port` (with `flags` before the image), whose script fetches
    /// the upstream's `/allowed` through the proxy and then runs `then`. Checks the run
    /// succeeded and printed the upstream's body first; returns all it printed.
    fn fetch_allowed_then(&self, config: &Path, port: u16, flags: &[&str], then: &str) -> String {
        let script = format!("wget -q -O- http://127.0.0.1:{port}/allowed; echo; {then}");
        let allow = format!("cordon.allow-hosts=127.0.0.1/32:{port}");
        let mut args = vec!["run", "--rm", "--annotation", &allow];
        args.extend_from_slice(flags);
        args.extend([IMAGE, "sh", "-c", &script]);
        let out = self.oci_under(config, &args);
        let said = text(&out.stdout);
        assert!(out.status.success(), "{said} {}", text(&out.stderr));
        assert!(
            said.starts_with(&format!("{}\n", cordon_testkit::egress::Upstream::BODY)),
            "{said} {}",
            text(&out.stderr)
        );
        said
    }

    fn oci(&self, args: &[&str]) -> Output {
        self.cmd(OCI, args)
    }

    /// `podman --runtime cordon-oci` with the node's Cordon config at `config` (podman
    /// passes a `--runtime-flag` on to every call of the runtime but its cleanup's).
    fn oci_under(&self, config: &Path, args: &[&str]) -> Output {
        let mut all = vec!["--runtime-flag".to_string()];
        all.push(format!("cordon-config={}", config.display()));
        all.extend(args.iter().map(|a| a.to_string()));
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg("podman")
            .args(&self.args)
            .args(["--runtime", OCI]);
        let (flags, rest) = all.split_at(2);
        c.args(flags);
        let mut rest = rest.iter();
        if let Some(sub) = rest.next() {
            c.arg(sub);
            if sub == "run" || sub == "create" {
                c.args(cordon_testkit::podman::ULIMITS);
            }
        }
        c.args(rest);
        c.output().unwrap()
    }
}

/// A node config in `dir` (its audit store there too) with `body` after the audit line.
fn node_config(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("oci.toml");
    std::fs::write(
        &path,
        format!("audit = \"{}\"\n{body}", dir.join("audit.db").display()),
    )
    .unwrap();
    path
}

/// The node config lines that name `bundle`'s `rootfs` as a root a bundle may have: a
/// hand-written bundle's root is a node directory, not the engine's (issue 44, item 4).
fn allow_rootfs(bundle: &Path) -> String {
    format!(
        "[allow]\nrootfs = [\"{}\"]\n",
        bundle.join("rootfs").display()
    )
}

/// The rows of the node's audit store a [`node_config`] in `dir` names, oldest first.
fn audit_rows(dir: &Path) -> Vec<cordon_engine::audit::Event> {
    let store = cordon_engine::audit::Audit::open(&dir.join("audit.db")).unwrap();
    let mut rows = store
        .query(
            None,
            &cordon_engine::audit::Query {
                limit: Some(1000),
                ..Default::default()
            },
        )
        .unwrap();
    rows.sort_by_key(|r| r.id);
    rows
}

#[test]
fn podman_runs_a_container_with_its_output_and_exit_code() {
    let Some(p) = podman() else { return };
    let out = p.oci(&[
        "run",
        "--rm",
        "--network",
        "none",
        IMAGE,
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err\n"), "{}", text(&out.stderr));
    // A workload ended by a signal is reported as such (128 + 15).
    let out = p.oci(&["run", "--rm", IMAGE, "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    // Standard input reaches the workload.
    assert_eq!(p.bytes_of_stdin(&[], b"12345"), "5");
}

#[test]
fn podman_exec_kill_and_rm_on_a_running_container() {
    let Some(p) = podman() else { return };
    let out = p.oci(&[
        "run",
        "-d",
        "--name",
        "oci-exec-kill",
        IMAGE,
        "sleep",
        "300",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let out = p.oci(&["exec", "oci-exec-kill", "sh", "-c", "echo inside; exit 4"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "inside\n");
    // The process runs as the sandbox's unprivileged user, whatever the image says.
    let out = p.oci(&["exec", "oci-exec-kill", "id", "-u"]);
    assert_eq!(text(&out.stdout).trim(), "1000");
    // The runtime's own view: running, and its pid is alive.
    let state = Command::new(OCI).args(["state", &id]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    assert_eq!(state["status"], "running", "{state}");
    let pid = state["pid"].as_i64().unwrap() as i32;
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let out = p.oci(&["kill", "oci-exec-kill"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["wait", "oci-exec-kill"]);
    assert_eq!(text(&out.stdout).trim(), "137", "{}", text(&out.stderr));
    let out = p.oci(&["rm", "oci-exec-kill"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Nothing of it is left: its state, its monitor.
    assert!(!Path::new("/run/cordon-oci").join(&id).exists());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| !c.contains("__monitor"))
    );
}

#[test]
fn podman_memory_limit_from_the_bundle_is_enforced() {
    let Some(p) = podman() else { return };
    // A 100 MiB buffer under a 32 MiB limit: the OOM killer ends it (137); the same
    // program under 256 MiB runs.
    for (memory, code) in [("32m", 137), ("256m", 0)] {
        let out = p.oci(&[
            "run",
            "--rm",
            "--memory",
            memory,
            IMAGE,
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=100M",
            "count=1",
        ]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{memory}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn podman_privileged_host_namespaces_and_host_paths_are_refused() {
    let Some(p) = podman() else { return };
    for (flags, says) in [
        (&["--privileged"][..], "privileged mode"),
        (&["--cap-add", "SYS_ADMIN"][..], "privileged mode"),
        (&["--network", "host"][..], "host's network namespace"),
        (&["--pid", "host"][..], "host's pid namespace"),
        (&["-v", "/etc:/hostetc"][..], "host path at /hostetc"),
        (&["--device", "/dev/zero"][..], "a host device"),
    ] {
        let mut args = vec!["run", "--rm"];
        args.extend_from_slice(flags);
        args.extend([IMAGE, "echo", "ran"]);
        let out = p.oci(&args);
        assert!(!out.status.success(), "{flags:?} ran");
        assert!(!text(&out.stdout).contains("ran"), "{flags:?} ran");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{flags:?}: {err}");
    }
}

/// The runtime's own command line, without an engine: a traversing id is refused before
/// anything is made, and an unknown container is named.
#[test]
fn ids_that_name_paths_are_refused_by_every_command() {
    let root = tempfile::tempdir().unwrap();
    for cmd in [
        &["state", "../../etc"][..],
        &["delete", "../x"],
        &["start", "a/b"],
    ] {
        let out = Command::new(OCI)
            .arg("--root")
            .arg(root.path())
            .args(cmd)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("invalid container id"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = Command::new(OCI)
        .arg("--root")
        .arg(root.path())
        .args(["state", "nosuch"])
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("does not exist"));
}

/// A reader that closes its end early (`cordon-oci state ID | head -c1`) ends every
/// printing command quietly with 141 (as a shell reports SIGPIPE): never a panic.
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let root = tempfile::tempdir().unwrap();
    let r = cordon_oci::state::Root::new(Some(root.path()));
    std::fs::create_dir_all(r.dir("c1")).unwrap();
    r.save(&cordon_oci::state::Record {
        id: "c1".into(),
        bundle: root.path().to_path_buf(),
        pid: 1,
        pid_start: 1,
        status: cordon_oci::state::Status::Stopped,
        created: cordon_oci::state::now_rfc3339(),
        annotations: Default::default(),
        sandbox: None,
        exit_code: Some(0),
        tier: None,
        cgroup: None,
        netns: None,
    })
    .unwrap();
    for cmd in [
        &["state", "c1"][..],
        &["list"],
        &["list", "--format", "json"],
        &["ps", "c1"],
        &["features"],
    ] {
        // A pipe whose reading end is closed before the command writes.
        let (rx, tx) = nix::unistd::pipe().unwrap();
        drop(rx);
        let out = Command::new(OCI)
            .arg("--root")
            .arg(root.path())
            .args(cmd)
            .stdout(std::process::Stdio::from(tx))
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert_eq!(out.status.code(), Some(141), "{cmd:?}: {err}");
        assert_eq!(err, "", "{cmd:?}");
    }
}

/// A bundle refused before the gate (privileged mode, a host namespace, a host device, an
/// unknown annotation) is a refused `policy` row of the node's audit store, with the reason,
/// like a refusal of the gate itself.
#[test]
fn refusals_of_the_bundle_check_are_audit_rows() {
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(dir.path(), "");
    let node = cordon_oci::node::NodeConfig::load(Some(&config)).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let namespaces =
        r#"[{"type":"pid"},{"type":"network"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]"#;
    let cases = [
        (
            "priv",
            format!(
                r#""process": {{"args": ["sh"], "cwd": "/", "user": {{"uid": 0, "gid": 0}}, "capabilities": {{"bounding": ["CAP_SYS_ADMIN"]}}}}, "linux": {{"namespaces": {namespaces}}}"#
            ),
            "privileged mode",
        ),
        (
            "hostnet",
            r#""process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}}, "linux": {"namespaces": [{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]}"#.to_string(),
            "host's network namespace",
        ),
        (
            "dev",
            format!(
                r#""process": {{"args": ["sh"], "cwd": "/", "user": {{"uid": 0, "gid": 0}}}}, "linux": {{"namespaces": {namespaces}, "devices": [{{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}}]}}"#
            ),
            "/dev/sda",
        ),
        (
            "annot",
            format!(
                r#""process": {{"args": ["sh"], "cwd": "/", "user": {{"uid": 0, "gid": 0}}}}, "linux": {{"namespaces": {namespaces}}}, "annotations": {{"cordon.memroy": "1G"}}"#
            ),
            "unknown annotation",
        ),
    ];
    for (id, body, says) in &cases {
        std::fs::write(
            bundle.join("config.json"),
            format!(r#"{{"ociVersion": "1.0.2", "root": {{"path": "rootfs"}}, {body}}}"#),
        )
        .unwrap();
        let e = cordon_oci::monitor::prepare(cordon_oci::monitor::Setup {
            root: cordon_oci::state::Root::new(Some(&dir.path().join("state"))),
            id: id.to_string(),
            bundle: bundle.clone(),
            node: node.clone(),
            console: None,
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains(says), "{id}: {e}");
    }
    let rows = audit_rows(dir.path());
    assert_eq!(rows.len(), cases.len(), "{rows:?}");
    for (row, (id, _, says)) in rows.iter().zip(&cases) {
        assert_eq!(row.kind, "policy");
        assert_eq!(row.sandbox.as_deref(), Some(*id));
        assert_eq!(row.decision.as_deref(), Some("deny"), "{row:?}");
        let detail = row.detail.to_string();
        assert!(detail.contains(says), "{id}: {detail}");
        assert!(detail.contains("oci create"), "{id}: {detail}");
    }
}

/// Each way docs/kubernetes.md gives to name the node's config is the one read: a
/// privileged bundle's refusal lands in the audit store that config names. `--cordon-config`
/// and `$CORDON_OCI_CONFIG` on a direct call, and `/etc/cordon/oci.toml` when nothing names
/// one (in a mount namespace of the test's own, whose `/etc` is a tmpfs: the host's is
/// untouched). Podman's `--runtime-flag cordon-config=...` is the podman tests' way
/// (`Podman::oci_under`).
#[test]
fn each_documented_way_of_naming_the_node_config_is_read() {
    if !have("root", nix::unistd::geteuid().is_root()) || !have("unshare", on_path("unshare")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
            "linux": {"namespaces": [{"type":"pid"},{"type":"network"},{"type":"ipc"},
                                     {"type":"uts"},{"type":"mount"}]}}"#,
    )
    .unwrap();
    let state = dir.path().join("state");
    for way in ["flag", "env", "default"] {
        let at = dir.path().join(way);
        std::fs::create_dir_all(&at).unwrap();
        let config = node_config(&at, "");
        let mut c = match way {
            "default" => {
                let mut c = Command::new("unshare");
                c.args(["-m", "--propagation", "private", "sh", "-c"])
                    .arg(
                        "mount -t tmpfs cordon-test /etc && mkdir /etc/cordon && \
                         cp \"$1\" /etc/cordon/oci.toml && shift && exec \"$@\"",
                    )
                    .arg("sh")
                    .arg(&config)
                    .arg(OCI);
                c
            }
            _ => Command::new(OCI),
        };
        c.env_remove("CORDON_OCI_CONFIG");
        match way {
            "flag" => {
                c.arg("--cordon-config").arg(&config);
            }
            "env" => {
                c.env("CORDON_OCI_CONFIG", &config);
            }
            _ => {}
        }
        let out = c
            .arg("--root")
            .arg(&state)
            .args(["create", "--bundle"])
            .arg(&bundle)
            .arg(format!("cfg-{way}"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{way}");
        assert!(
            text(&out.stderr).contains("privileged"),
            "{way}: {}",
            text(&out.stderr)
        );
        let rows = audit_rows(&at);
        assert_eq!(rows.len(), 1, "{way}: {rows:?}");
        assert_eq!(
            rows[0].sandbox.as_deref(),
            Some(format!("cfg-{way}").as_str())
        );
        assert_eq!(rows[0].decision.as_deref(), Some("deny"));
    }
}

/// A containerd of the test's own: its root, state and sockets in a temporary directory,
/// the CRI plugin off. Dropped, it stops, with every shim it started.
struct Containerd {
    dir: tempfile::TempDir,
    daemon: std::process::Child,
}

impl Containerd {
    /// With `cri`, its CRI plugin on, with a runtime handler `cordon` (the runc shim,
    /// cordon-oci as its binary, `cordon.*` pod annotations passed on), `pause` as the
    /// pods' sandbox image and a loopback-only CNI network.
    fn start(cri: Option<&str>) -> Containerd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("c.sock").display(),
        );
        match cri {
            None => config.insert_str(0, "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"),
            Some(pause) => {
                // The pod's network: loopback (the distribution's plugin) and a stand-in
                // plugin that reports an eth0 without making one, so the CRI plugin has
                // the address it wants and nothing is set up on the host. Cordon gives the
                // workload its own loopback-only namespace whatever the pod's.
                let cni = d.join("cni");
                let bin = d.join("cni-bin");
                std::fs::create_dir_all(&cni).unwrap();
                std::fs::create_dir_all(&bin).unwrap();
                std::os::unix::fs::symlink("/usr/lib/cni/loopback", bin.join("loopback")).unwrap();
                let stand_in = bin.join("cordon-test-net");
                std::fs::write(
                    &stand_in,
                    "#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = ADD ] || exit 0\n\
                     printf '{\"cniVersion\":\"0.4.0\",\"interfaces\":[{\"name\":\"eth0\",\"sandbox\":\"%s\"}],\
                     \"ips\":[{\"version\":\"4\",\"address\":\"192.0.2.2/24\",\"interface\":0}]}' \"$CNI_NETNS\"\n",
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755))
                    .unwrap();
                std::fs::write(
                    cni.join("10-cordon-test.conflist"),
                    r#"{"cniVersion": "0.4.0", "name": "cordon-test", "plugins": [{"type": "loopback"}, {"type": "cordon-test-net"}]}"#,
                )
                .unwrap();
                let p = "plugins.\"io.containerd.grpc.v1.cri\"";
                let rt = format!("{p}.containerd.runtimes.cordon");
                config.push_str(&format!(
                    "[{p}]\n  sandbox_image = \"{pause}\"\n  stream_server_address = \"127.0.0.1\"\n\
                     [{p}.cni]\n  bin_dir = \"{bin}\"\n  conf_dir = \"{cni}\"\n\
                     [{p}.containerd]\n  default_runtime_name = \"cordon\"\n\
                     [{rt}]\n  runtime_type = \"io.containerd.runc.v2\"\n\
                       pod_annotations = [\"cordon.*\"]\n  container_annotations = [\"cordon.*\"]\n\
                     [{rt}.options]\n  BinaryName = \"{OCI}\"\n  Root = \"{runc_root}\"\n",
                    cni = cni.display(),
                    bin = bin.display(),
                    runc_root = d.join("runc-root").display(),
                ));
            }
        }
        std::fs::write(d.join("config.toml"), config).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("containerd.log")).unwrap())
            .spawn()
            .unwrap();
        let c = Containerd { dir, daemon };
        // Bounded: containerd answers within seconds here.
        for _ in 0..300 {
            if c.ctr(&["version"]).status.success() {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!(
            "containerd did not answer: {}",
            std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap_or_default()
        );
    }

    /// The end of containerd's log, for a failure's message.
    fn log(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains("level=info")).collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("c.sock")
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["120", "ctr", "--address"])
            .arg(self.sock())
            .args(args)
            .output()
            .unwrap()
    }

    /// `ctr run` through the runc shim with cordon-oci as its binary (its state under this
    /// containerd's directory) and `args` after.
    fn run_on_cordon(&self, args: &[&str]) -> Output {
        let runc_root = self.dir.path().join("runc-root");
        let mut all = vec![
            "run",
            "--runc-binary",
            OCI,
            "--runc-root",
            runc_root.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        self.ctr(&all)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Containers a failed test left: their monitors outlive a killed shim (as runc's
        // containers do), so they are deleted here.
        for ns in ["default", "k8s.io"] {
            let root = self.dir.path().join("runc-root").join(ns);
            for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                let _ = Command::new(OCI)
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force"])
                    .arg(e.file_name())
                    .output();
            }
        }
        // The shims of this containerd name its socket on their command line.
        kill_naming(&self.sock().display().to_string(), self.daemon.id());
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// A podman image as a docker archive, for containerd and Docker to import.
fn image_archive(p: &Podman, dir: &Path, image: &str) -> PathBuf {
    let tar = dir.join(format!("{}.tar", image.replace(['/', ':'], "_")));
    let out = Command::new("podman")
        .args(&p.args)
        .args(["save", "-o"])
        .arg(&tar)
        .arg(image)
        .output()
        .unwrap();
    assert!(out.status.success(), "podman save: {}", text(&out.stderr));
    tar
}

/// A private containerd with the test image imported (`None` after a SKIPPING line when
/// podman, containerd or ctr is missing).
fn containerd_with_image() -> Option<Containerd> {
    let p = podman()?;
    if !have(
        "containerd and ctr",
        on_path("containerd") && on_path("ctr"),
    ) {
        return None;
    }
    let c = Containerd::start(None);
    let archive = image_archive(p, c.dir.path(), IMAGE);
    let out = c.ctr(&["image", "import", archive.to_str().unwrap()]);
    assert!(out.status.success(), "ctr import: {}", text(&out.stderr));
    Some(c)
}

#[test]
fn containerd_runs_a_container_through_the_runc_shim_with_cordon_as_its_binary() {
    let Some(c) = containerd_with_image() else {
        return;
    };
    let runc_root = c.dir.path().join("runc-root");
    let run = |args: &[&str]| c.run_on_cordon(args);
    // Its root is writable (containerd's default), the write its own: the next container of
    // the image, and containerd's snapshots on the node, never see it.
    let out = run(&[
        "--rm",
        IMAGE,
        "c-once",
        "sh",
        "-c",
        "echo from-ctr; echo w > /etc/ctr-w && cat /etc/ctr-w; exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from-ctr\nw\n");
    let out = run(&["--rm", IMAGE, "c-next", "sh", "-c", "test ! -e /etc/ctr-w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let found = Command::new("find")
        .arg(c.dir.path())
        .args(["-name", "ctr-w"])
        .output()
        .unwrap();
    assert_eq!(
        text(&found.stdout),
        "",
        "a write reached containerd's storage"
    );
    // A long-lived task: exec into it, list its processes, kill it.
    let out = run(&["-d", IMAGE, "c-long", "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "c-long",
        "sh",
        "-c",
        "echo exec-out; exit 6",
    ]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "exec-out\n");
    let out = c.ctr(&["task", "ps", "c-long"]);
    assert!(
        text(&out.stdout).lines().count() >= 2,
        "{}",
        text(&out.stdout)
    );
    // The runtime's state is where the shim said (the root, then the namespace).
    assert!(runc_root.join("default/c-long/state.json").is_file());
    let out = c.ctr(&["task", "kill", "--signal", "SIGKILL", "c-long"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut stopped = false;
    for _ in 0..100 {
        let ls = text(&c.ctr(&["task", "ls"]).stdout);
        if ls
            .lines()
            .any(|l| l.starts_with("c-long") && l.contains("STOPPED"))
        {
            stopped = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(stopped, "the task did not stop");
    assert!(c.ctr(&["task", "delete", "c-long"]).status.success());
    assert!(c.ctr(&["container", "delete", "c-long"]).status.success());
    assert!(
        !runc_root.join("default/c-long").exists(),
        "its state was left"
    );
    // The walls hold: privileged is refused here too, with the reason in ctr's error.
    let out = run(&["--rm", "--privileged", IMAGE, "c-priv", "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("privileged"),
        "{}",
        text(&out.stderr)
    );
}

/// The pods' sandbox image: the busybox root with a command that waits (a pause).
const PAUSE: &str = "localhost/cordon-oci-pause:1";

#[test]
fn cri_runs_a_pod_with_the_cordon_handler_and_refuses_one_over_the_ceiling() {
    let Some(p) = podman() else { return };
    if !have("containerd", on_path("containerd") && on_path("ctr"))
        || !have(
            "the CNI loopback plugin",
            Path::new("/usr/lib/cni/loopback").is_file(),
        )
    {
        return;
    }
    let tar = busybox_tar(&tempfile::tempdir().unwrap().keep());
    cordon_testkit::podman::import(&p.args, &tar, PAUSE, &["CMD [\"/bin/sleep\", \"100000\"]"]);
    let c = Containerd::start(Some(PAUSE));
    for image in [IMAGE, PAUSE] {
        let archive = image_archive(p, c.dir.path(), image);
        let out = c.ctr(&["-n", "k8s.io", "image", "import", archive.to_str().unwrap()]);
        assert!(out.status.success(), "ctr import: {}", text(&out.stderr));
    }
    let logs = c.dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Bounded: a stuck call fails the test rather than holding the build lock.
    let flow = async {
        use cri::*;
        let mut api = Cri::connect(c.sock()).await.unwrap();
        let pod = |name: &str, annotations: &[(&str, &str)]| PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: logs.display().to_string(),
            labels: HashMap::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        // A pod that asks for more than the node's ceiling: refused, the reason in the
        // CRI error.
        let refused = api
            .call::<_, RunPodSandboxResponse>(
                "RunPodSandbox",
                RunPodSandboxRequest {
                    config: Some(pod("greedy", &[("cordon.memory", "64G")])),
                    runtime_handler: "cordon".into(),
                },
            )
            .await
            .unwrap_err();
        let msg = refused.message();
        assert!(msg.contains("cordon-oci refuses this container"), "{msg}");
        assert!(msg.contains("memory"), "{msg}");
        let config = pod("agent", &[("cordon.memory", "64M")]);
        let ran: RunPodSandboxResponse = api
            .call(
                "RunPodSandbox",
                RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: "cordon".into(),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.log()));
        let pod_id = ran.pod_sandbox_id;
        let created: ContainerId = api
            .call(
                "CreateContainer",
                CreateContainerRequest {
                    pod_sandbox_id: pod_id.clone(),
                    config: Some(ContainerConfig {
                        metadata: Some(ContainerMetadata {
                            name: "task".into(),
                            attempt: 0,
                        }),
                        image: Some(ImageSpec {
                            image: IMAGE.into(),
                        }),
                        command: vec!["sleep".into(), "300".into()],
                        args: vec![],
                        envs: vec![KeyValue {
                            key: "TASK".into(),
                            value: "cri".into(),
                        }],
                        annotations: HashMap::new(),
                        log_path: "task.log".into(),
                    }),
                    sandbox_config: Some(config.clone()),
                },
            )
            .await
            .unwrap();
        let id = created.container_id;
        let _: Empty = api
            .call(
                "StartContainer",
                ContainerId {
                    container_id: id.clone(),
                },
            )
            .await
            .unwrap();
        let exec = |cmd: &[&str]| ExecSyncRequest {
            container_id: id.clone(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 60,
        };
        let out: ExecSyncResponse = api
            .call("ExecSync", exec(&["sh", "-c", "echo $TASK; id -u; exit 3"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 3, "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "cri\n1000\n");
        let st: ContainerStatusResponse = api
            .call(
                "ContainerStatus",
                ContainerId {
                    container_id: id.clone(),
                },
            )
            .await
            .unwrap();
        assert_eq!(st.status.unwrap().state, CONTAINER_RUNNING);
        let _: Empty = api
            .call(
                "StopPodSandbox",
                PodSandboxId {
                    pod_sandbox_id: pod_id.clone(),
                },
            )
            .await
            .unwrap();
        let st: ContainerStatusResponse = api
            .call(
                "ContainerStatus",
                ContainerId {
                    container_id: id.clone(),
                },
            )
            .await
            .unwrap();
        assert_eq!(st.status.unwrap().state, CONTAINER_EXITED);
        let _: Empty = api
            .call(
                "RemovePodSandbox",
                PodSandboxId {
                    pod_sandbox_id: pod_id,
                },
            )
            .await
            .unwrap();
    };
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(180), flow)
            .await
            .unwrap_or_else(|_| panic!("the CRI calls took over 180 s\n{}", c.log()))
    });
}

/// Kills every process whose command line names `marker` (the shims a daemon of this test
/// started: they name its socket or state directory), except `but`.
fn kill_naming(marker: &str, but: u32) {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if text(&cmd).contains(marker) && pid != but as i32 && pid != std::process::id() as i32 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A Docker daemon of the test's own: data root, exec root and socket in a temporary
/// directory, no bridge and no iptables, a runtime `cordon` that is cordon-oci. Dropped,
/// it stops, with its containerd and shims.
struct Dockerd {
    dir: tempfile::TempDir,
    daemon: std::process::Child,
}

impl Dockerd {
    fn start() -> Dockerd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = serde_json::json!({
            "data-root": d.join("data"),
            "exec-root": d.join("exec"),
            "pidfile": d.join("docker.pid"),
            "hosts": [format!("unix://{}", d.join("docker.sock").display())],
            "bridge": "none",
            "iptables": false,
            "ip6tables": false,
            "ip-forward": false,
            "ip-masq": false,
            "userland-proxy": false,
            "exec-opts": ["native.cgroupdriver=cgroupfs"],
            "runtimes": {"cordon": {"path": OCI}},
        });
        std::fs::write(d.join("daemon.json"), config.to_string()).unwrap();
        let daemon = Command::new("dockerd")
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("dockerd.log")).unwrap())
            .spawn()
            .unwrap();
        let docker = Dockerd { dir, daemon };
        for _ in 0..300 {
            if docker.docker(&["version"]).status.success() {
                return docker;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!(
            "dockerd did not answer: {}",
            std::fs::read_to_string(docker.dir.path().join("dockerd.log")).unwrap_or_default()
        );
    }

    fn docker(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["120", "docker", "-H"])
            .arg(format!(
                "unix://{}",
                self.dir.path().join("docker.sock").display()
            ))
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        for _ in 0..100 {
            if matches!(self.daemon.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        kill_naming(&self.dir.path().display().to_string(), 0);
    }
}

#[test]
fn docker_runs_a_container_with_runtime_cordon() {
    let Some(p) = podman() else { return };
    if !have(
        "dockerd and docker",
        on_path("dockerd") && on_path("docker"),
    ) {
        return;
    }
    let d = Dockerd::start();
    let archive = image_archive(p, d.dir.path(), IMAGE);
    let out = d.docker(&["load", "-i", archive.to_str().unwrap()]);
    assert!(out.status.success(), "docker load: {}", text(&out.stderr));
    let run = ["run", "--runtime", "cordon", "--network", "none"];
    let with = |more: &[&str]| {
        let mut all = run.to_vec();
        all.extend_from_slice(more);
        d.docker(&all)
    };
    let out = with(&["--rm", IMAGE, "sh", "-c", "echo from-docker; exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from-docker\n");
    let out = with(&["-d", "--name", "d-long", IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = d.docker(&["exec", "d-long", "sh", "-c", "echo dexec; id -u; exit 8"]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "dexec\n1000\n");
    assert!(d.docker(&["kill", "d-long"]).status.success());
    let out = d.docker(&["wait", "d-long"]);
    assert_eq!(text(&out.stdout).trim(), "137", "{}", text(&out.stderr));
    assert!(d.docker(&["rm", "d-long"]).status.success());
    let out = with(&[
        "--rm",
        "--memory",
        "32m",
        IMAGE,
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=100M",
        "count=1",
    ]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    let out = with(&["--rm", "--privileged", IMAGE, "echo", "ran"]);
    assert!(!out.status.success() && !text(&out.stdout).contains("ran"));
    assert!(
        text(&out.stderr).contains("privileged mode"),
        "{}",
        text(&out.stderr)
    );
}

/// The image the escape battery runs on: the host's Python, bash and a static busybox
/// (`cordon_testkit::image::python_layer`, as the tiers' template battery), imported.
const BATTERY_IMAGE: &str = "localhost/cordon-oci-battery:1";

/// The whole escape battery (`cordon_testkit::escape::BATTERY`, every case held to the
/// container tier's wall) through the OCI path: each sandbox a container that podman runs
/// with cordon-oci (asking for `NET_ADMIN`, which it does not get), each probe a `podman
/// exec`, each file call a `podman cp`; the root writable, as podman asks by default (a
/// write into it stays in its container). Then what the battery does not look at, with
/// `--read-only`: the workload cannot write its root, make a device node, mount, or see
/// `/sys` (under runc the same script sees `/sys`).
#[test]
fn podman_workload_passes_the_escape_battery() {
    let Some(p) = podman() else { return };
    let Some(layer) = cordon_testkit::image::python_layer() else {
        have("python3, bash and /bin/busybox on the host", false);
        return;
    };
    // The container tier's wall, with one difference of the path: a caller's files move
    // by `podman cp`, which never enters the sandbox (see cordon-oci's rootfs seal).
    // Podman's default root is writable (`root.readonly: false`): a write into it must stay
    // in that container.
    let wall = cordon_testkit::escape::Wall {
        agent_files: false,
        writable_root: true,
        ..cordon_testkit::escape::Wall::of(cordon_core::Tier::Container)
    };
    let tier = (cordon_core::Tier::Container, wall);
    let (b, spec) = escape::battery_passes(&p.args, OCI, &layer, BATTERY_IMAGE, &[], tier);
    // With `--read-only`, no write reaches the root at all.
    let read_only = escape::PodmanOci {
        podman: b.podman.clone(),
        image: b.image.clone(),
        run_args: b
            .run_args
            .iter()
            .cloned()
            .chain(["--read-only".to_string()])
            .collect(),
    };
    let o = cordon_testkit::run_once(
        &read_only,
        &spec,
        &cordon_core::ExecRequest::code(
            cordon_core::Language::Sh,
            "touch /rootfile 2>/dev/null && echo root-writable; \
             mknod /tmp/sda b 8 0 2>/dev/null && echo mknod-ok; \
             mount -t tmpfs x /tmp 2>/dev/null && echo mount-ok; \
             ls /sys/class 2>/dev/null && echo sys-visible; \
             touch /tmp/ok && echo tmp-writable",
        ),
    );
    let said = text(&o.stdout);
    for breach in ["root-writable", "mknod-ok", "mount-ok", "sys-visible"] {
        assert!(!said.contains(breach), "{breach}: {said}");
    }
    assert!(said.contains("tmp-writable"), "{said} {}", text(&o.stderr));
}

/// Egress from a container through podman, as `cordon run --allow-host` gives it: with the
/// `cordon.allow-hosts` annotation naming a loopback upstream the test runs, the workload
/// reaches it through Cordon's proxy (and only through it); another port, an unlisted
/// name, the metadata address and a private address get the proxy's 403; each decision is
/// an `egress` row in the node's audit store. Without the annotation there is no proxy and
/// no route at all.
#[test]
fn podman_egress_reaches_allowed_hosts_through_the_proxy_only() {
    let Some(p) = podman() else { return };
    let up = cordon_testkit::egress::Upstream::start();
    let port = up.port;
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(
        dir.path(),
        "[ceiling]\negress = [\"*\", \"127.0.0.1/32\"]\n",
    );
    let refused = [
        (
            "other-port",
            format!("http://127.0.0.1:{}/", port.wrapping_add(1)),
        ),
        ("unlisted", "http://unlisted.example/".to_string()),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_string(),
        ),
        ("private", "http://10.0.0.1/".to_string()),
    ];
    let mut script = String::new();
    for (label, url) in &refused {
        script.push_str(&format!("echo \"{label} $(wget -q -O- {url} 2>&1)\"; "));
    }
    // Past the proxy: the sandbox's own loopback has nothing on the upstream's port.
    script.push_str(&format!(
        "env -u http_proxy -u HTTP_PROXY wget -q -T 3 -O- http://127.0.0.1:{port}/direct \
         2>/dev/null || echo direct-refused"
    ));
    let said = p.fetch_allowed_then(&config, port, &[], &script);
    for (label, _) in &refused {
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap_or_default();
        assert!(line.contains("403"), "{label}: {said}");
    }
    assert!(said.contains("direct-refused"), "{said}");
    let seen = up.requests();
    assert_eq!(seen.len(), 1, "the upstream saw {seen:?}");
    assert!(seen[0].starts_with("GET /allowed "), "{seen:?}");
    // Each decision is a row of the node's audit store, after the gate's.
    let rows = audit_rows(dir.path());
    assert_eq!(rows.first().map(|r| r.kind.as_str()), Some("policy"));
    let egress: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.kind == "egress")
        .map(|r| {
            (
                r.decision.clone().unwrap_or_default(),
                r.detail["host"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        egress.contains(&("allow".into(), "127.0.0.1".into())),
        "{egress:?}"
    );
    for host in ["unlisted.example", "169.254.169.254", "10.0.0.1"] {
        assert!(
            egress.contains(&("deny".into(), host.into())),
            "{host}: {egress:?}"
        );
    }
    assert!(rows.iter().all(|r| r.sandbox == rows[0].sandbox));

    // No annotation: no proxy variables, no route, nothing reached.
    let out = p.oci_under(
        &config,
        &[
            "run",
            "--rm",
            IMAGE,
            "sh",
            "-c",
            &format!(
                "env | grep -ci proxy; wc -l < /proc/net/route; \
                 http_proxy=http://127.0.0.1:3128 wget -q -T 3 -O- http://127.0.0.1:{port}/via-proxy \
                 2>/dev/null || echo no-proxy; \
                 wget -q -T 3 -O- http://127.0.0.1:{port}/direct 2>/dev/null || echo no-route"
            ),
        ],
    );
    let said = text(&out.stdout);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(
        lines,
        ["0", "1", "no-proxy", "no-route"],
        "{said} {}",
        text(&out.stderr)
    );
    assert_eq!(up.requests().len(), 1, "{:?}", up.requests());
}

/// A device node the test makes in the host's `/dev` (the null device's numbers, open to
/// all), removed when dropped.
struct TestDevice(PathBuf);

impl TestDevice {
    fn make() -> TestDevice {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        let path = PathBuf::from(format!("/dev/cordon-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(1, 3),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        TestDevice(path)
    }
}

impl Drop for TestDevice {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The node's allowances through podman: each refused request passes once the node's
/// config names that exact thing, and gets it (a host directory read-only or writable
/// under /work, a host device in /dev; a capability or a host namespace accepted while the
/// workload still has none and its own); each near miss stays refused; every allowance
/// used is marked on the gate's decision in the node's audit store.
#[test]
fn podman_node_allowances_admit_exactly_what_they_name() {
    let Some(p) = podman() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ro = d.join("models");
    let rw = d.join("out");
    std::fs::create_dir(&ro).unwrap();
    std::fs::create_dir(&rw).unwrap();
    std::fs::write(ro.join("weights.txt"), "host-data\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&rw, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::symlink(&ro, d.join("link")).unwrap();
    std::fs::create_dir(d.join("secret")).unwrap();
    let dev = TestDevice::make();
    let devname = dev.0.display().to_string();
    let body = format!(
        "[allow]\ncapabilities = [\"SYS_PTRACE\"]\nnamespaces = [\"uts\"]\n\
         [[allow.device]]\npath = \"{devname}\"\ntype = \"c\"\nmajor = 1\nminor = 3\n\
         [[allow.host_path]]\npath = \"{ro}\"\nat = \"/work/models\"\n\
         [[allow.host_path]]\npath = \"{rw}\"\nat = \"/work/out\"\nwritable = true\n\
         [[allow.host_path]]\npath = \"{link}\"\nat = \"/work/link\"\n",
        ro = ro.display(),
        rw = rw.display(),
        link = d.join("link").display(),
    );
    let empty = tempfile::tempdir().unwrap();
    let bare = node_config(empty.path(), "");
    let config = node_config(d, &body);
    let vol = |host: &Path, at: &str, mode: &str| format!("{}:{at}{mode}", host.display());
    let models = vol(&ro, "/work/models", ":ro");
    let out = vol(&rw, "/work/out", "");
    let device = devname.clone();
    let run = |cfg: &Path, flags: &[&str], script: &str| {
        let mut args = vec!["run", "--rm"];
        args.extend_from_slice(flags);
        args.extend([IMAGE, "sh", "-c", script]);
        p.oci_under(cfg, &args)
    };
    // Refused on a node that names nothing; admitted, and given, on one that names it.
    let asks: [(&[&str], &str); 5] = [
        (&["-v", &models], "a host path at /work/models"),
        (&["-v", &out], "a host path at /work/out"),
        (&["--device", &device], "a host device"),
        (&["--cap-add", "SYS_PTRACE"], "SYS_PTRACE"),
        (&["--uts", "host"], "host's uts namespace"),
    ];
    for (flags, says) in asks {
        let o = run(&bare, flags, "echo ran");
        let err = text(&o.stderr);
        assert!(
            !o.status.success() && !text(&o.stdout).contains("ran"),
            "{flags:?} ran"
        );
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let o = run(
        &config,
        &[
            "-v",
            &models,
            "-v",
            &out,
            "--device",
            &device,
            "--cap-add",
            "SYS_PTRACE",
            "--uts",
            "host",
        ],
        &format!(
            "cat /work/models/weights.txt; \
             touch /work/models/x 2>/dev/null && echo RO-WRITTEN; \
             echo from-the-workload > /work/out/result.txt && echo rw-written; \
             echo hi > {devname} && cat {devname} && echo device-used; \
             grep CapEff /proc/self/status; cat /proc/sys/kernel/hostname"
        ),
    );
    let said = text(&o.stdout);
    assert!(o.status.success(), "{said} {}", text(&o.stderr));
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines[0], "host-data", "{said}");
    assert!(!said.contains("RO-WRITTEN"), "{said}");
    assert!(
        said.contains("rw-written\n") && said.contains("device-used\n"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(rw.join("result.txt")).unwrap(),
        "from-the-workload\n"
    );
    // The capability and the host's UTS namespace were accepted, not given.
    assert!(said.contains("CapEff:\t0000000000000000"), "{said}");
    assert_ne!(lines.last().copied(), Some(host_name.trim()), "{said}");
    // Near misses stay refused: another device, capability, namespace, directory, place,
    // a writable bind of a read-only entry, a `..` path, a symbolic link.
    let dotdot = format!("{}/../secret:/work/models:ro", ro.display());
    let link = vol(&d.join("link"), "/work/link", ":ro");
    let other_place = vol(&ro, "/work/elsewhere", ":ro");
    let writable = vol(&ro, "/work/models", "");
    let secret = vol(&d.join("secret"), "/work/models", ":ro");
    let near: [(&[&str], &str); 8] = [
        (&["--device", "/dev/zero"], "a host device"),
        (&["--cap-add", "SYS_ADMIN"], "SYS_ADMIN"),
        (&["--network", "host"], "host's network namespace"),
        (&["-v", &other_place], "host path at /work/elsewhere"),
        (&["-v", &writable], "read-only"),
        (&["-v", &dotdot], "host path at /work/models"),
        (&["-v", &secret], "host path at /work/models"),
        (&["-v", &link], "host path at /work/link"),
    ];
    for (flags, says) in near {
        let o = run(&config, flags, "echo ran");
        let err = text(&o.stderr);
        assert!(
            !o.status.success() && !text(&o.stdout).contains("ran"),
            "{flags:?} ran"
        );
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    // The allowances used are marked on the admitted container's decision.
    let rows = audit_rows(d);
    let marked: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r.kind == "policy" && r.decision.as_deref() == Some("allow"))
        .filter_map(|r| r.detail["node_allowances"].as_array())
        .flatten()
        .collect();
    let kinds: Vec<&str> = marked.iter().filter_map(|a| a["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "capability",
            "host_namespace",
            "device",
            "host_path",
            "host_path"
        ],
        "{marked:?}"
    );
    assert!(
        marked.iter().any(|a| a["kind"] == "host_path"
            && a["path"] == ro.display().to_string()
            && a["writable"] == false),
        "{marked:?}"
    );
    assert!(
        marked
            .iter()
            .any(|a| a["kind"] == "device" && a["path"] == devname.as_str()),
        "{marked:?}"
    );
}

/// `podman cp` into a running container joins the mount namespace of the container's
/// process (cordon-oci's monitor, a process of the node) and copies at its root: it must
/// meet the container's own files, never the node's. Before, a copy to a container path
/// landed at that path on the node, and a copy out read the node's file.
#[test]
fn podman_cp_into_a_running_container_never_reaches_the_node() {
    let Some(p) = podman() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dropped = dir.path().join("dropped");
    let secret = dir.path().join("node-secret");
    std::fs::write(&secret, "node-only").unwrap();
    let from = dir.path().join("from");
    std::fs::write(&from, "payload").unwrap();
    let out = p.oci(&["run", "-d", "--name", "oci-cp", IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let into = p.oci(&[
        "cp",
        from.to_str().unwrap(),
        &format!("oci-cp:{}", dropped.display()),
    ]);
    let back = dir.path().join("back");
    let out_of = p.oci(&[
        "cp",
        &format!("oci-cp:{}", secret.display()),
        back.to_str().unwrap(),
    ]);
    // The image's own files can still be copied out.
    let image_file = dir.path().join("busybox");
    let ok = p.oci(&["cp", "oci-cp:/bin/busybox", image_file.to_str().unwrap()]);
    let _ = p.oci(&["rm", "-f", "oci-cp"]);
    assert!(
        !dropped.exists(),
        "podman cp wrote the node's {}",
        dropped.display()
    );
    assert!(!into.status.success(), "{}", text(&into.stdout));
    assert!(
        !back.exists() && !out_of.status.success(),
        "podman cp read the node's file"
    );
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert_eq!(
        std::fs::metadata(&image_file).unwrap().len(),
        std::fs::metadata("/bin/busybox").unwrap().len()
    );
}

/// The loop devices backed by container `id`'s upper layer (its image, unlinked once
/// mounted, is named for the container).
fn upper_loops(id: &str) -> Vec<String> {
    let image = format!("{}/{id}.img", cordon_oci::rootfs::UPPERS);
    let mut found = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file"))
            && b.trim_end().trim_end_matches(" (deleted)") == image
        {
            found.push(name);
        }
    }
    found
}

/// `root.readonly: false` (podman's default): the workload writes the image's `/etc` and
/// `/usr/lib` and reads its writes back; the image's root is its own user (1000) as a root
/// process runs; nothing reaches the image's layers or podman's container layer (under runc
/// the same write lands in podman's storage), another container of the image sees none of
/// it, past the disk limit (`cordon.disk`) a write fails with ENOSPC, `--read-only` still
/// refuses every write, and after `podman rm`, or a killed monitor and `delete`, no loop
/// device, mount or file of the upper layer is left.
#[test]
fn podman_writable_root_keeps_its_writes_to_itself_within_its_bound() {
    let Some(p) = podman() else { return };
    let storage = p._dir.path().join("storage");
    let found_in_storage = |name: &str| -> bool {
        let out = Command::new("find")
            .arg(&storage)
            .args(["-name", name])
            .output()
            .unwrap();
        !text(&out.stdout).trim().is_empty()
    };
    let write = "echo written > /etc/cordon-w && mkdir -p /usr/lib/cordon-test/d && \
                 echo deep > /usr/lib/cordon-test/d/cordon-w2 && \
                 cat /etc/cordon-w /usr/lib/cordon-test/d/cordon-w2 /etc/motd && \
                 ls -lnd /etc /etc/motd | while read m l u g r; do echo owner $u:$g; done";
    let out = p.oci(&[
        "run",
        "-d",
        "--name",
        "oci-wroot",
        IMAGE,
        "sh",
        "-c",
        &format!("{write} && sleep 300"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let logs = || {
        for _ in 0..100 {
            let out = p.oci(&["logs", "oci-wroot"]);
            if text(&out.stdout).contains("owner") {
                return text(&out.stdout);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the workload wrote nothing");
    };
    let said = logs();
    assert_eq!(
        said, "written\ndeep\nimage\nowner 1000:1000\nowner 1000:1000\n",
        "{said}"
    );
    // The image's set-id program runs as the workload's own user; its device node opens
    // for nothing (nodev), for reading or writing.
    let out = p.oci(&[
        "exec",
        "oci-wroot",
        "sh",
        "-c",
        "/usr/lib/cordon-test/bin/id; ls -ln /usr/lib/cordon-test/bin/id | cut -c1-10; \
         cat /etc/nulldev && echo READ; echo x > /etc/nulldev && echo WROTE; true",
    ]);
    let said = text(&out.stdout);
    assert!(
        said.starts_with("uid=1000(sandbox) gid=1000(sandbox) "),
        "{said}"
    );
    assert!(!said.contains("euid") && !said.contains("egid"), "{said}");
    assert!(said.contains("-rwsr-sr-x"), "{said}");
    assert!(!said.contains("READ") && !said.contains("WROTE"), "{said}");
    // While it runs: its upper layer is a loop device of its own, whose image is unlinked.
    assert_eq!(upper_loops(&id).len(), 1, "{:?}", upper_loops(&id));
    assert!(
        !Path::new(cordon_oci::rootfs::UPPERS)
            .join(format!("{id}.img"))
            .exists()
    );
    // Another container of the same image sees none of it.
    let out = p.oci(&[
        "run",
        "--rm",
        IMAGE,
        "sh",
        "-c",
        "test ! -e /etc/cordon-w && test ! -e /usr/lib/cordon-test/d && cat /etc/motd",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "image\n");
    // Nothing reached the node's storage: the image's layer nor podman's container layer.
    assert!(
        !found_in_storage("cordon-w"),
        "a write reached podman's storage"
    );
    assert!(
        !found_in_storage("cordon-w2"),
        "a write reached podman's storage"
    );
    // A write past the disk limit fails with ENOSPC, and the root stays usable.
    let out = p.oci(&[
        "run", "--rm", "--annotation", "cordon.disk=16M", IMAGE, "sh", "-c",
        "dd if=/dev/zero of=/usr/lib/big bs=1M count=64; echo rc=$?; rm /usr/lib/big && echo again > /etc/x && cat /etc/x",
    ]);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(e.contains("No space left on device"), "{o}{e}");
    assert!(o.contains("rc=1") && o.ends_with("again\n"), "{o}{e}");
    // --read-only: exactly as before, no write anywhere in the root.
    let out = p.oci(&[
        "run",
        "--rm",
        "--read-only",
        IMAGE,
        "sh",
        "-c",
        "touch /etc/x || touch /usr/lib/x || touch /x; echo rc=$?",
    ]);
    assert_eq!(text(&out.stdout), "rc=1\n", "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Read-only file system"),
        "{}",
        text(&out.stderr)
    );
    // Removed: no loop device, no image file, no monitor holding the mounts.
    let state = Command::new(OCI).args(["state", &id]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    let monitor = state["pid"].as_i64().unwrap();
    let out = p.oci(&["rm", "-f", "oci-wroot"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let gone = || {
        (0..500).any(|_| {
            let none = upper_loops(&id).is_empty();
            if !none {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            none
        })
    };
    assert!(gone(), "loop devices left: {:?}", upper_loops(&id));
    assert!(
        !Path::new(&format!("/proc/{monitor}/ns")).exists()
            || std::fs::read_to_string(format!("/proc/{monitor}/cmdline"))
                .is_ok_and(|c| !c.contains("__monitor"))
    );
    // A killed monitor: its mounts go with its namespace; `delete` finds nothing left.
    let out = p.oci(&[
        "run",
        "-d",
        "--name",
        "oci-wroot-k",
        IMAGE,
        "sh",
        "-c",
        "echo x > /etc/y; sleep 300",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(upper_loops(&id).len(), 1);
    let state = Command::new(OCI).args(["state", &id]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    let monitor = state["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(gone(), "loop devices left: {:?}", upper_loops(&id));
    // As a monitor killed between making its disk's image and unlinking it leaves it.
    let left = Path::new(cordon_oci::rootfs::UPPERS).join(format!("{id}.img"));
    std::fs::write(&left, b"").unwrap();
    let out = p.oci(&["rm", "-f", "oci-wroot-k"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!left.exists(), "delete left the upper layer's image");
}
