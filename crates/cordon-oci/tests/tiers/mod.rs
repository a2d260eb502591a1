//! The `cordon.tier` annotation through podman: a bundle on the gvisor and on the microvm
//! tier (its output and exit code, its stdin, `podman exec`, `podman kill`, every byte of a
//! fast writer, the workload really on that tier), a tier the node's ceiling closes
//! refused with the reason, a tier the node cannot run refused with the probe's, and
//! nothing left of the sandbox once the container is removed.

use std::path::Path;
use std::process::{Command, Stdio};

use super::passthrough::{
    BIG, LINE, assert_interleaved, assert_same, fast_writer, interleaved_writers, pattern,
};
use super::{IMAGE, OCI, Podman, have, node_config, podman, text};

/// `podman run --annotation cordon.tier=<tier>` with `args` after the image's flags.
fn run_on(p: &Podman, tier: &str, args: &[&str]) -> std::process::Output {
    let annotation = format!("cordon.tier={tier}");
    let mut all = vec!["run", "--annotation", annotation.as_str()];
    all.extend_from_slice(args);
    p.oci(&all)
}

/// The gvisor tier can run here (runsc, and its agent beside the runtime).
pub(super) fn gvisor_here() -> bool {
    let agent = Path::new(OCI).with_file_name("cordon-gvisor-agent");
    have("runsc", super::on_path("runsc"))
        && have(
            "cordon-gvisor-agent beside cordon-oci (cargo build --workspace --bins)",
            agent.is_file(),
        )
}

/// The microvm tier can run here (QEMU and the guest image, `scripts/guests.sh`).
fn microvm_here() -> bool {
    // The tier's own probe (through the facade, as cordon-oci asks it) says whether the
    // guest image loads.
    let probe = cordon_tiers::Tiers.probe(cordon_core::Tier::Microvm);
    let image = probe
        .capabilities
        .iter()
        .any(|c| c.name == "guest image" && c.ok);
    have("qemu-system-x86_64", super::on_path("qemu-system-x86_64"))
        && have("the microvm guest image (bash scripts/guests.sh)", image)
}

/// The sandbox a container's record names (read while it runs).
fn sandbox_of(id: &str) -> String {
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new("/run/cordon-oci").join(id).join("state.json")).unwrap(),
    )
    .unwrap();
    record["sandbox"].as_str().unwrap().to_string()
}

/// Every process whose command line or cgroup names `needle` (runsc's name the sandbox,
/// QEMU's cgroup is the VM's).
fn processes_naming(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = text(&cmd).replace('\0', " ");
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cmd.contains(needle) || cgroup.contains(needle) {
            found.push(cmd);
        }
    }
    found
}

/// Output, exit codes, stdin, a fast writer, exec, kill and removal on `tier`; `on_tier`
/// is a command whose output shows the workload runs there, `shows` what it must say.
fn the_tier_runs_a_container_as_the_container_tier_does(
    p: &Podman,
    tier: &str,
    on_tier: &str,
    shows: impl Fn(&str) -> bool,
) {
    let out = run_on(
        p,
        tier,
        &[
            "--rm",
            IMAGE,
            "sh",
            "-c",
            &format!("{on_tier}; echo out; echo err >&2; exit 3"),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.ends_with("out\n"), "{said}");
    assert!(shows(&said), "{tier}: not on the tier: {said}");
    assert!(text(&out.stderr).contains("err\n"), "{}", text(&out.stderr));
    // Standard input reaches the workload, and its end is its end.
    let annotation = format!("cordon.tier={tier}");
    assert_eq!(
        p.bytes_of_stdin(&["--annotation", &annotation], &vec![b'x'; 300_000]),
        "300000",
        "{tier}: stdin"
    );
    // Every byte of a writer as fast as the machine goes: 64 times what the agent keeps
    // of a stream, so a copy that let it drop any would show.
    let out = run_on(p, tier, &["--rm", IMAGE, "sh", "-c", &fast_writer()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), BIG, "{tier}: bytes through podman");
    assert_same(
        &format!("{tier} stdout"),
        &out.stdout,
        &pattern(LINE.trim_end(), BIG),
    );
    let out = run_on(
        p,
        tier,
        &["--rm", IMAGE, "sh", "-c", &interleaved_writers()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_interleaved(tier, &out.stdout, &out.stderr);
    // A running container: exec, a signal by name, kill, removal.
    let name = format!("oci-tier-{tier}");
    let script = "trap 'echo got USR1' USR1; echo ready; while :; do sleep 0.1; done";
    let out = run_on(p, tier, &["-d", "--name", &name, IMAGE, "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let sandbox = sandbox_of(&id);
    let out = p.oci(&["exec", &name, "sh", "-c", "echo inside; exit 4"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "inside\n");
    let said = super::passthrough::logs_until(p, &name, "ready");
    assert!(said.contains("ready"), "{said}");
    let out = p.oci(&["kill", "--signal", "USR1", &name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = super::passthrough::logs_until(p, &name, "got USR1");
    assert!(
        said.contains("got USR1"),
        "{tier}: USR1 was not delivered: {said}"
    );
    let out = p.oci(&["kill", &name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["wait", &name]);
    assert_eq!(text(&out.stdout).trim(), "137", "{}", text(&out.stderr));
    let out = p.oci(&["rm", &name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Nothing of it is left: its state, its microvm disk, no runsc sandbox or QEMU of it.
    assert!(!Path::new("/run/cordon-oci").join(&id).exists());
    assert!(!Path::new(cordon_oci::tiers::DISKS).join(&id).exists());
    let left = processes_naming(&sandbox[..19]);
    assert!(left.is_empty(), "{tier}: left running: {left:?}");
    // A killed monitor takes its runsc sandbox or VM with it, and the removal that follows
    // leaves nothing of it.
    let out = run_on(p, tier, &["-d", "--name", &name, IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let sandbox = sandbox_of(&id);
    let state = Command::new(OCI).args(["state", &id]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    let monitor = state["pid"].as_i64().unwrap() as i32;
    assert!(
        !processes_naming(&sandbox[..19]).is_empty(),
        "{tier}: nothing runs"
    );
    // A running VM holds its disk by descriptor alone: no file of it is on the node.
    assert!(
        !Path::new(cordon_oci::tiers::DISKS).join(&id).exists(),
        "{tier}: the disk's file outlived the start"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !processes_naming(&sandbox[..19]).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left = processes_naming(&sandbox[..19]);
    assert!(
        left.is_empty(),
        "{tier}: left running by a killed monitor: {left:?}"
    );
    let out = p.oci(&["rm", "-f", &name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!Path::new("/run/cordon-oci").join(&id).exists());
    // No cgroup of it either (the gvisor tier's per start, QEMU's per VM).
    let cgroups = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find /sys/fs/cgroup -maxdepth 4 -type d -name '*{}*' 2>/dev/null",
            &sandbox[3..19]
        ))
        .output()
        .unwrap();
    assert_eq!(text(&cgroups.stdout), "", "{tier}: cgroups left");
    if tier == "microvm" {
        // The tier's run directory (`<data dir>/microvm/run`), one per VM by short id.
        let run = cordon_core::default_data_dir()
            .join("microvm/run")
            .join(&sandbox[..19]);
        assert!(!run.exists(), "the VM's directory was left");
    }
}

#[test]
fn podman_runs_a_container_on_the_gvisor_tier() {
    let Some(p) = podman() else { return };
    if !gvisor_here() {
        return;
    }
    the_tier_runs_a_container_as_the_container_tier_does(p, "gvisor", "busybox dmesg", |s| {
        s.contains("Starting gVisor")
    });
}

#[test]
fn podman_runs_a_container_on_the_microvm_tier() {
    let Some(p) = podman() else { return };
    if !microvm_here() {
        return;
    }
    // The guest's own kernel: not the node's.
    let host = std::fs::read_to_string("/proc/version").unwrap();
    the_tier_runs_a_container_as_the_container_tier_does(p, "microvm", "cat /proc/version", |s| {
        s.starts_with("Linux version") && !s.contains(host.trim())
    });
}

/// Issue 44, item 16: on the microvm tier an image's device node (the test image's
/// `/etc/nulldev`, the node of the null device) opens to nothing and its set-id program
/// (`/usr/lib/cordon-test/bin/id`, of uid 5) gains no ids: the guest's root is mounted
/// `nodev,nosuid` (a node of the raw root disk or `/dev/kmsg` in an image would otherwise
/// work in the guest).
#[test]
fn podman_microvm_images_device_nodes_and_set_id_programs_do_nothing() {
    let Some(p) = podman() else { return };
    if !microvm_here() {
        return;
    }
    let out = run_on(
        p,
        "microvm",
        &[
            "--rm",
            "--read-only",
            IMAGE,
            "sh",
            "-c",
            "echo x > /etc/nulldev; echo w=$?; cat /etc/nulldev; echo r=$?; \
             /usr/lib/cordon-test/bin/id",
        ],
    );
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(o.contains("w=1\n") && o.contains("r=1\n"), "{o}{e}");
    assert!(e.contains("Permission denied"), "{o}{e}");
    assert!(o.contains("uid=1000") && !o.contains("euid"), "{o}{e}");
}

/// `-t` on `tier`: `podman run -t` and `podman exec -t` run on a terminal (the tier's own
/// in the sandbox, bridged to the monitor's), and through an engine's console socket a
/// line typed reaches the workload and its answer and the bundle's size come back.
fn the_tier_gives_a_terminal(p: &Podman, tier: &str) {
    let out = run_on(
        p,
        tier,
        &[
            "--rm",
            "-t",
            IMAGE,
            "sh",
            "-c",
            "busybox tty; [ -t 0 ] && [ -t 1 ] && echo both-terminals",
        ],
    );
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said} {}", text(&out.stderr));
    assert!(said.contains("/dev/pts/"), "{tier}: {said}");
    assert!(said.contains("both-terminals"), "{tier}: {said}");
    let name = format!("oci-tty-{tier}");
    let out = run_on(p, tier, &["-d", "--name", &name, IMAGE, "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = p.oci(&["exec", "-t", &name, "sh", "-c", "busybox tty; exit 4"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("/dev/pts/"),
        "{}",
        text(&out.stdout)
    );
    let _ = p.oci(&["rm", "-f", &name]);
    super::passthrough::console_socket_round_trip(Some(tier));
}

#[test]
fn podman_gives_a_terminal_on_the_gvisor_tier() {
    let Some(p) = podman() else { return };
    if gvisor_here() {
        the_tier_gives_a_terminal(p, "gvisor");
    }
}

#[test]
fn podman_gives_a_terminal_on_the_microvm_tier() {
    let Some(p) = podman() else { return };
    if microvm_here() {
        the_tier_gives_a_terminal(p, "microvm");
    }
}

/// A tier the node's ceiling closes is refused with the gate's rule; a tier the node
/// cannot run, with what its probe found missing; a tier cordon-oci does not run, as a bad
/// annotation. Each says so on the caller's stderr and nothing runs.
#[test]
fn podman_refuses_a_tier_the_node_closes_or_cannot_run() {
    let Some(p) = podman() else { return };
    let dir = tempfile::tempdir().unwrap();
    let closed = node_config(dir.path(), "[ceiling]\ntiers = [\"container\"]\n");
    let out = p.oci_under(
        &closed,
        &[
            "run",
            "--rm",
            "--annotation",
            "cordon.tier=gvisor",
            IMAGE,
            "echo",
            "ran",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!text(&out.stdout).contains("ran"));
    let said = text(&out.stderr);
    assert!(said.contains("cordon-oci refuses this container"), "{said}");
    assert!(said.contains("gvisor"), "{said}");
    // The container tier stays open under it.
    let out = p.oci_under(&closed, &["run", "--rm", IMAGE, "echo", "ran"]);
    assert_eq!(text(&out.stdout), "ran\n", "{}", text(&out.stderr));
    // The node's default tier when the annotation names none.
    let gvisor = node_config(dir.path(), "tier = \"gvisor\"\n");
    if gvisor_here() {
        let out = p.oci_under(&gvisor, &["run", "--rm", IMAGE, "busybox", "dmesg"]);
        assert!(
            text(&out.stdout).contains("Starting gVisor"),
            "{} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let out = run_on(p, "wasm", &["--rm", IMAGE, "echo", "ran"]);
    assert!(!text(&out.stdout).contains("ran"));
    assert!(
        text(&out.stderr).contains("the tier is container, gvisor or microvm"),
        "{}",
        text(&out.stderr)
    );
}

/// A tier this node cannot run (its probe finds no QEMU: `CORDON_QEMU` names none) is
/// refused at `create` with what is missing, and nothing of the container is left: named by
/// the bundle's annotation, or the node's default tier for a bundle that names none (the
/// gate, which chooses the tier, never falls back to another).
#[test]
fn a_tier_the_node_cannot_run_is_refused_with_the_probes_reason() {
    if !have("root", nix::unistd::geteuid().is_root()) || !super::init_beside() {
        return;
    }
    for (annotations, node) in [
        (serde_json::json!({"cordon.tier": "microvm"}), ""),
        (serde_json::json!({}), "tier = \"microvm\"\n"),
    ] {
        let d = super::node_files::Direct::new(&["/bin/busybox", "true"], false, annotations, node);
        let bundle = d.bundle.to_str().unwrap();
        let out = d
            .oci(&["create", "--bundle", bundle, "no-qemu"])
            .env("CORDON_QEMU", d.dir.path().join("no-qemu"))
            .output()
            .unwrap();
        let root = &d.root;
        assert!(!out.status.success(), "{node}: it was created");
        let said = text(&out.stderr);
        assert!(said.contains("microvm"), "{node}: {said}");
        assert!(said.contains("this node cannot run it"), "{node}: {said}");
        assert!(said.contains("qemu"), "{node}: {said}");
        assert!(
            !root.join("no-qemu").exists(),
            "{node}: the container's state was left"
        );
    }
}

/// The escape battery through podman with the workload on the gvisor tier: every case of
/// `cordon_testkit::escape::BATTERY` held to gVisor's wall, through the same adapter as the
/// container tier's (`podman exec`, `podman kill`, `podman cp`).
#[test]
fn podman_workload_on_the_gvisor_tier_passes_the_escape_battery() {
    let Some(p) = podman() else { return };
    if !gvisor_here() {
        return;
    }
    let Some(layer) = cordon_testkit::image::python_layer() else {
        have("python3, bash and /bin/busybox on the host", false);
        return;
    };
    const IMAGE: &str = "localhost/cordon-oci-battery-gvisor:1";
    // gVisor's wall, with the path's differences: a caller's files move by `podman cp`,
    // which never enters the sandbox, and the bundle's root is the sandbox's own overlay
    // (writable in the sentry's memory; the image's files stay root's).
    let wall = cordon_testkit::escape::Wall {
        agent_files: false,
        root_overlay: true,
        ..cordon_testkit::escape::Wall::of(cordon_core::Tier::Gvisor)
    };
    let gvisor = ["--annotation", "cordon.tier=gvisor"];
    let tier = (cordon_core::Tier::Gvisor, wall);
    super::escape::battery_passes(&p.args, OCI, &layer, IMAGE, &gvisor, tier);
}

/// Egress from a workload on the gvisor tier, as `cordon run --tier gvisor --allow-host`
/// gives it: the allowed loopback upstream reached through Cordon's proxy, an unlisted
/// name refused (403), and each decision an `egress` row of the node's audit store that
/// names the gvisor tier.
#[test]
fn podman_egress_on_the_gvisor_tier_goes_through_the_proxy_and_is_audited() {
    let Some(p) = podman() else { return };
    if !gvisor_here() {
        return;
    }
    let up = cordon_testkit::egress::Upstream::start();
    let port = up.port;
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(
        dir.path(),
        "[ceiling]\negress = [\"*\", \"127.0.0.1/32\"]\n",
    );
    let said = p.fetch_allowed_then(
        &config,
        port,
        &["--annotation", "cordon.tier=gvisor"],
        "echo \"unlisted $(wget -q -O- http://unlisted.example/ 2>&1)\"",
    );
    let line = said
        .lines()
        .find(|l| l.starts_with("unlisted "))
        .unwrap_or_default();
    assert!(line.contains("403"), "{said}");
    let seen = up.requests();
    assert_eq!(seen.len(), 1, "the upstream saw {seen:?}");
    let rows = super::audit_rows(dir.path());
    assert_eq!(
        rows.first().map(|r| r.tier.as_deref()),
        Some(Some("gvisor"))
    );
    let egress: Vec<(Option<&str>, Option<&str>, &str)> = rows
        .iter()
        .filter(|r| r.kind == "egress")
        .map(|r| {
            (
                r.tier.as_deref(),
                r.decision.as_deref(),
                r.detail["host"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        egress.contains(&(Some("gvisor"), Some("allow"), "127.0.0.1")),
        "{egress:?}"
    );
    assert!(
        egress.contains(&(Some("gvisor"), Some("deny"), "unlisted.example")),
        "{egress:?}"
    );
}

/// containerd's runc shim with cordon-oci as its binary (`ctr run --annotation
/// cordon.tier=gvisor`): output, exit code, and every byte of a fast writer through the
/// shim's own pipes.
#[test]
fn ctr_runs_a_container_on_the_gvisor_tier() {
    let Some(c) = super::containerd_with_image() else {
        return;
    };
    if !gvisor_here() {
        return;
    }
    let run = |id: &str, script: &str| {
        let gvisor = ["--annotation", "cordon.tier=gvisor", "--rm", IMAGE];
        c.run_on_cordon(&[&gvisor[..], &[id, "sh", "-c", script]].concat())
    };
    let out = run("g-dmesg", "busybox dmesg; echo err >&2; exit 5");
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Starting gVisor"),
        "{}",
        text(&out.stdout)
    );
    let out = run("g-big", &fast_writer());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), BIG, "bytes through ctr");
    assert_same(
        "ctr gvisor stdout",
        &out.stdout,
        &pattern(LINE.trim_end(), BIG),
    );
}

/// A caller that stops reading the process's stdout (the monitor's own, a pipe here) holds
/// the process at its pipe in the agent, never the monitor: `exec` and `state` still
/// answer while gigabytes wait to be written.
#[test]
fn a_caller_that_stops_reading_never_stalls_the_monitor() {
    if !have("root", nix::unistd::geteuid().is_root()) || !super::init_beside() || !gvisor_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs/bin")).unwrap();
    std::fs::copy("/bin/busybox", bundle.join("rootfs/bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", bundle.join("rootfs/bin/sh")).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": {"args": ["/bin/busybox", "yes"], "cwd": "/", "env": ["PATH=/bin"],
                        "user": {"uid": 0, "gid": 0}},
            "annotations": {"cordon.tier": "gvisor"},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                                     {"type": "uts"}, {"type": "mount"}]}
        })
        .to_string(),
    )
    .unwrap();
    let config = node_config(dir.path(), &super::allow_rootfs(&bundle));
    let root = dir.path().join("state");
    let oci = |args: &[&str]| {
        let mut c = Command::new("timeout");
        c.args(["30", OCI])
            .arg("--root")
            .arg(&root)
            .arg("--cordon-config")
            .arg(&config)
            .args(args);
        c
    };
    // Its stdout: a pipe this test never reads.
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let created = oci(&["create", "--bundle", bundle.to_str().unwrap(), "stall"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(tx))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(created.success());
    assert!(oci(&["start", "stall"]).status().unwrap().success());
    // `yes` fills the pipe at once; then the agent holds what it writes.
    std::thread::sleep(std::time::Duration::from_secs(2));
    // (Its stdio: /dev/null, which the monitor may hold without holding up this test.)
    let exec = oci(&["exec", "stall", "/bin/busybox", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let answered = exec.code() == Some(0);
    if !answered {
        let _ = oci(&["delete", "--force", "stall"]).status();
    }
    assert!(answered, "the monitor did not answer an exec: {exec}");
    let state = oci(&["state", "stall"]).output().unwrap();
    assert!(
        text(&state.stdout).contains("\"running\""),
        "{}",
        text(&state.stdout)
    );
    drop(rx);
    assert!(
        oci(&["delete", "--force", "stall"])
            .status()
            .unwrap()
            .success()
    );
}
