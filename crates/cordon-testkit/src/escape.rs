//! Escape-battery probes whose expectation is the same on every tier.

use std::net::TcpListener;

use cordon_core::{Backend, ExecRequest, Language, OutputStream, SandboxSpec, Tier};

use crate::{run_once, text};

/// Packet, raw IP, netlink-audit, vsock and AF_ALG sockets cannot be opened. Inside a VM
/// (its own kernel serves the rest to its own processes) the sockets that need privilege
/// there, raw and packet, must still be refused.
pub fn raw_and_exotic_sockets_refused(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let mut cases = vec![
        "('packet', 17, socket.SOCK_RAW, 0)",
        "('raw-icmp', 2, socket.SOCK_RAW, 1)",
        "('raw-inet6', 10, socket.SOCK_RAW, 58)",
        "('packet-dgram', 17, socket.SOCK_DGRAM, 0)",
    ];
    if !wall.own_kernel {
        cases.extend([
            "('netlink-audit', 16, socket.SOCK_RAW, 9)",
            "('vsock', 40, socket.SOCK_STREAM, 0)",
            "('alg', 38, socket.SOCK_SEQPACKET, 0)",
        ]);
    }
    let probe = format!(
        "import socket\nfor name, fam, typ, proto in [{}]:\n    try:\n        socket.socket(fam, typ, proto)\n        print('OPENED', name)\n    except OSError as e:\n        print('denied', name, e.errno)\n",
        cases.join(", ")
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    assert!(!out.contains("OPENED"), "{out}");
    assert_eq!(
        out.matches("denied").count(),
        cases.len(),
        "{out} {}",
        text(&o.stderr)
    );
}

/// A listener on the host's loopback cannot be reached by any name for the host (loopback,
/// `localhost`, QEMU's host alias, the cloud metadata address, a public address), nothing
/// reaches the listener, and the sandbox's only interface is `lo` (with the pod's `eth0` on a
/// pod's network, where the pod's wall refuses the rest).
pub fn host_loopback_unreachable(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let hosts = [
        "127.0.0.1",
        "localhost",
        "10.0.2.2",
        "169.254.169.254",
        "8.8.8.8",
    ];
    let probe = format!(
        "import socket\nfor host in {hosts:?}:\n  s = socket.socket(); s.settimeout(2)\n  try:\n    s.connect((host, {port})); print('CONNECTED', host)\n  except OSError as e:\n    print('refused', host, e.errno)\n"
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    assert!(!out.contains("CONNECTED"), "{out}");
    assert_eq!(
        out.matches("refused").count(),
        hosts.len(),
        "{out} {}",
        text(&o.stderr)
    );
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Sh,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort",
        ),
    );
    let interfaces = if wall.pod_network { "eth0\nlo" } else { "lo" };
    assert_eq!(text(&o.stdout).trim(), interfaces, "{o:?}");
}

/// A host process and the test process itself are invisible to the sandbox and cannot be
/// signalled from it (ESRCH); the sandbox sees at most `max_visible` processes.
pub fn host_processes_unsignalable(b: &dyn Backend, spec: &SandboxSpec, max_visible: usize) {
    let mut victim = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let vpid = victim.id();
    let me = std::process::id();
    let probe = format!(
        "import os, signal\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint('pids', pids)\nfor pid in ({vpid}, {me}):\n  try:\n    os.kill(pid, signal.SIGKILL); print('sent', pid)\n  except OSError as e:\n    print('failed', pid, e.errno)\n"
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    let still_running = victim.try_wait().unwrap().is_none();
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(still_running, "the host process was killed");
    assert!(out.contains(&format!("failed {vpid} 3")), "{out}");
    // The sandbox's own pid may equal the test's number; then it signals itself, not us.
    assert!(
        out.contains(&format!("failed {me} 3")) || !out.contains(&format!("sent {me}")),
        "{out}"
    );
    let pids_line = out.lines().next().unwrap_or_default();
    let visible = pids_line.matches(',').count() + 1;
    assert!(
        visible <= max_visible,
        "the sandbox sees too many processes: {pids_line}"
    );
}

/// Environment variable that carries the canary into the child test process.
pub const CANARY_VAR: &str = "CORDON_TEST_CANARY";

/// The child half of the environment-canary check: when started by [`env_canary_parent`],
/// looks everywhere a sandbox could see the environment of the process that created it and
/// checks the canary is nowhere. Returns false (doing nothing) when not started that way.
pub fn env_canary_child(b: &dyn Backend, spec: &SandboxSpec) -> bool {
    let Ok(canary) = std::env::var(CANARY_VAR) else {
        return false;
    };
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Bash,
            "env; cat /proc/1/environ /proc/self/environ; grep -rs CORDON /proc/*/environ /proc/*/cmdline; echo /work/* /tmp/*; true",
        ),
    );
    let mut all = text(&o.stdout);
    all.push_str(&text(&o.stderr));
    assert!(all.contains("HOME=/work"), "the probe did not run: {all}");
    assert!(!all.contains(&canary), "canary leaked into the sandbox");
    assert!(!all.contains("CARGO"), "host environment leaked: {all}");
    println!("CANARY-CHECK-RAN");
    true
}

/// Runs the test `child_test` of the current test binary in a child process whose
/// environment holds a canary (also as a cloud credential), and checks it ran its check.
pub fn env_canary_parent(child_test: &str) {
    let canary = format!(
        "canary-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(CANARY_VAR, &canary)
        .env("AWS_SECRET_ACCESS_KEY", &canary)
        .output()
        .unwrap();
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "child failed: {all}");
    assert!(
        all.contains("CANARY-CHECK-RAN"),
        "child did not run the check: {all}"
    );
}

// ------------------------------------------------------------------ the battery table

/// What a case may expect of the tier's wall: the per-tier expectations of the table.
#[derive(Debug, Clone, Copy)]
pub struct Wall {
    pub tier: Tier,
    /// The sandbox's system calls reach the host's kernel (the container tier): a refusal
    /// must come from its filter (EPERM) before the kernel's code runs at all.
    pub shares_host_kernel: bool,
    /// The sandbox runs its own Linux kernel (microvm): what needs no privilege in there is
    /// the guest's business; only what would need root is checked.
    pub own_kernel: bool,
    /// File calls go through Cordon's agent into the sandbox's own `/work` (every tier's
    /// backend). False for a caller that has no such call and copies files with its own
    /// tool (`podman cp` into a container cordon-oci runs), which never reaches the
    /// sandbox's `/work`: there each copy must fail at once rather than land somewhere the
    /// workload never sees.
    pub agent_files: bool,
    /// The sandbox's root is its own and writable (an OCI bundle's `root.readonly: false`
    /// through cordon-oci): a write into it succeeds, and must stay in that sandbox: no
    /// other sandbox sees it, nor the host. `/proc` and `/dev` stay closed.
    pub writable_root: bool,
    /// The root is the sandbox's own overlay, mounted read-write with its files root's,
    /// which the sandbox's user is not (gVisor's root on a template or an OCI bundle: its
    /// upper layer in the sentry's memory, gone with the sandbox). A write into it is
    /// refused by ownership rather than by the mount.
    pub root_overlay: bool,
    /// The sandbox is in a kubelet pod's network namespace (cordon-oci, ADR 0029): its
    /// interfaces are `lo` and the pod's `eth0`, and every name for the host is refused by
    /// the pod's wall instead of by having no route.
    pub pod_network: bool,
}

impl Wall {
    /// The wall of a native tier, from its features (a new tier is held to the wall its
    /// features describe).
    pub fn of(tier: Tier) -> Wall {
        let f = tier.features();
        Wall {
            tier,
            shares_host_kernel: !f.own_kernel,
            agent_files: true,
            own_kernel: f.guest_linux,
            writable_root: false,
            root_overlay: false,
            pod_network: false,
        }
    }
}

/// One case of the escape battery: its name and the probe every native tier runs, each
/// held to its own [`Wall`]'s expectations.
pub type Case = (&'static str, fn(&dyn Backend, &SandboxSpec, Wall));

/// The escape battery: every case a native tier (container, gvisor, microvm) runs alike.
/// Tier-specific checks (gVisor's own /proc, QEMU's confinement, the container's cgroup
/// view) stay in each tier's test binary.
pub const BATTERY: [Case; 10] = [
    ("host files are not visible", host_files_invisible),
    (
        "writes outside /work and /tmp fail and stay out of other sandboxes",
        writes_stay_inside,
    ),
    (
        "the host's loopback and metadata addresses are unreachable",
        host_loopback_unreachable,
    ),
    (
        "raw, packet and exotic sockets are refused",
        raw_and_exotic_sockets_refused,
    ),
    (
        "dangerous system calls are refused",
        dangerous_syscalls_refused,
    ),
    (
        "host processes are invisible and cannot be signalled",
        |b, s, w| host_processes_unsignalable(b, s, if w.own_kernel { usize::MAX } else { 3 }),
    ),
    ("setuid binaries grant nothing", setuid_grants_nothing),
    SHARED_KERNEL[0],
    SHARED_KERNEL[1],
    SHARED_KERNEL[2],
];

/// Cases about what one sandbox can do to the kernel everyone shares: counts charged to
/// other users, socket families reached through another call, a file call that blocks.
pub const SHARED_KERNEL: [Case; 3] = [
    (
        "socketpair in families other than unix is refused",
        socketpair_families_refused,
    ),
    (
        "inotify, message queues and pending signals held by a sandbox leave host root its own",
        kernel_counts_stay_inside,
    ),
    (
        "a file put onto a FIFO the sandbox made fails at once",
        fifo_put_fails_promptly,
    ),
];

/// Runs every case of `table`, each to its end, and fails naming the cases that failed.
pub fn run_table(table: &[Case], b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let mut failed = Vec::new();
    for (name, case) in table {
        eprintln!("escape case: {name}");
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(b, spec, wall)));
        if ran.is_err() {
            failed.push(*name);
        }
    }
    assert!(failed.is_empty(), "escape cases failed: {failed:?}");
}

/// Runs the whole [`BATTERY`] on a native tier.
pub fn run_battery(b: &dyn Backend, spec: &SandboxSpec) {
    run_table(&BATTERY, b, spec, Wall::of(spec.tier));
}

/// Nothing of the host's files shows: a canary written on the host now is absent, the
/// host's shadow file is neither readable nor copied in, and its home directories are
/// empty or absent.
pub fn host_files_invisible(b: &dyn Backend, spec: &SandboxSpec, _wall: Wall) {
    // One name per call: batteries of two tiers may run side by side in one test binary.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let canary = std::env::temp_dir().join(format!(
        "cordon-escape-canary-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&canary, "host-canary-content").unwrap();
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Bash,
            format!(
                "cat {c}; test -e {c} && echo CANARY-VISIBLE; cat /etc/shadow; \
                 cat /work/../etc/shadow; ls -A /root /home 2>/dev/null; \
                 cut -d' ' -f5 /proc/self/mountinfo | tr '\\n' ' '; echo; echo probe-ran",
                c = canary.display()
            ),
        ),
    );
    std::fs::remove_file(&canary).unwrap();
    let out = text(&o.stdout);
    assert!(out.contains("probe-ran"), "{out} {}", text(&o.stderr));
    assert!(
        !out.contains("host-canary-content") && !out.contains("CANARY-VISIBLE"),
        "{out}"
    );
    // No path of the host's (this checkout, the test's temporary directory) is a mount
    // point in there.
    let here = env!("CARGO_MANIFEST_DIR");
    assert!(!out.contains(here), "{out}");
    if let Ok(shadow) = std::fs::read_to_string("/etc/shadow") {
        for line in shadow.lines().filter(|l| l.contains(":$")) {
            assert!(!out.contains(line), "the host's shadow leaked: {out}");
        }
    }
}

/// Writing anywhere but /work and /tmp fails (with a writable root: anywhere but `/proc`
/// and `/dev`); /work and /tmp are writable, and what one sandbox writes there (or in its
/// writable root) another sandbox does not see; nothing reaches the host's /usr.
pub fn writes_stay_inside(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let quiet = &mut |_: OutputStream, _: &[u8]| {};
    let mut sb = b.create(spec).unwrap();
    let tag = format!("cordon-escape-{}", std::process::id());
    let o = sb
        .exec(
            &ExecRequest::code(
                Language::Bash,
                format!(
                    "for p in /usr/{tag} /etc/{tag} /{tag} /bin/{tag} /proc/{tag} /dev/{tag} /usr/lib/{tag}; do \
                     if echo hi > $p 2>/dev/null; then echo WROTE $p; fi; done; \
                     echo ok > /work/w && echo ok > /tmp/t && echo inside-ok"
                ),
            ),
            quiet,
        )
        .unwrap();
    let out = text(&o.stdout);
    // Both stay for the sandbox's next exec.
    let kept = sb
        .exec(
            &ExecRequest::code(Language::Bash, "cat /work/w /tmp/t"),
            quiet,
        )
        .unwrap();
    let mut other = b.create(spec).unwrap();
    let seen = other
        .exec(
            &ExecRequest::code(
                Language::Bash,
                format!(
                    "test -e /work/w && echo WORK-SHARED; test -e /tmp/t && echo TMP-SHARED; \
                     for p in /usr/{tag} /etc/{tag} /{tag} /bin/{tag} /usr/lib/{tag}; do \
                     test -e $p && echo SHARED $p; done; true"
                ),
            ),
            quiet,
        )
        .unwrap();
    other.destroy().unwrap();
    sb.destroy().unwrap();
    if wall.writable_root {
        for closed in [format!("/proc/{tag}"), format!("/dev/{tag}")] {
            assert!(!out.contains(&format!("WROTE {closed}")), "{out}");
        }
        assert!(out.contains(&format!("WROTE /usr/{tag}")), "{out}");
    } else {
        assert!(!out.contains("WROTE"), "{out}");
    }
    assert!(out.contains("inside-ok"), "{out} {}", text(&o.stderr));
    assert_eq!(text(&kept.stdout), "ok\nok\n", "{kept:?}");
    assert_eq!(text(&seen.stdout), "", "{seen:?}");
    for dir in ["/usr", "/etc", "/usr/lib", "/bin"] {
        assert!(
            !std::path::Path::new(dir).join(&tag).exists(),
            "{dir}/{tag} reached the host"
        );
    }
}

/// Calls into kernel features a sandbox must not reach, with their numbers (x86-64) and
/// arguments.
const SYSCALLS: [(&str, [i64; 5]); 25] = [
    ("ptrace-attach-1", [101, 16, 1, 0, 0]),
    ("mount", [165, 0, 0, 0, 0]),
    ("umount2", [166, 0, 0, 0, 0]),
    ("unshare-user", [272, 0x1000_0000, 0, 0, 0]),
    ("unshare-net", [272, 0x4000_0000, 0, 0, 0]),
    ("setns", [308, 0, 0, 0, 0]),
    ("keyctl", [250, 0, 0, 0, 0]),
    ("add_key", [248, 0, 0, 0, 0]),
    ("bpf", [321, 0, 0, 0, 0]),
    ("io_uring_setup", [425, 1, 0, 0, 0]),
    ("userfaultfd", [323, 0, 0, 0, 0]),
    ("perf_event_open", [298, 0, 0, 0, 0]),
    ("kexec_load", [246, 0, 0, 0, 0]),
    ("init_module", [175, 0, 0, 0, 0]),
    ("finit_module", [313, 0, 0, 0, 0]),
    ("delete_module", [176, 0, 0, 0, 0]),
    ("pivot_root", [155, 0, 0, 0, 0]),
    ("chroot", [161, 0, 0, 0, 0]),
    ("reboot", [169, 0xfee1_dead, 672_274_793, 0x0123_4567, 0]),
    ("swapon", [167, 0, 0, 0, 0]),
    ("clone-newuser", [56, 0x1000_0000 | 17, 0, 0, 0]),
    ("clone-newpid", [56, 0x2000_0000 | 17, 0, 0, 0]),
    ("clone3", [435, 0, 0, 0, 0]),
    ("process_vm_readv", [310, 1, 0, 0, 0]),
    ("open_by_handle_at", [304, 0, 0, 0, 0]),
];

/// What counts as refused for `call` on this wall: the errnos allowed, or `None` where the
/// tier's own kernel serves the call to its sandbox (nothing of the host's is reached).
fn refusal(wall: Wall, call: &str) -> Option<&'static [i32]> {
    const EPERM: &[i32] = &[1];
    // Not permitted or not in the kernel: EPERM, EACCES, ENODEV, ENOSYS, EOPNOTSUPP.
    const REFUSED: &[i32] = &[1, 13, 19, 38, 95];
    // Any failure: a call that needs privilege the sandbox's user lacks.
    const FAILED: &[i32] = &[1, 2, 3, 9, 13, 14, 16, 19, 22, 25, 38, 95];
    let privileged = [
        "mount",
        "umount2",
        "kexec_load",
        "init_module",
        "finit_module",
        "delete_module",
        "pivot_root",
        "chroot",
        "reboot",
        "swapon",
        "open_by_handle_at",
    ];
    match wall.tier {
        // Its filter answers first: ENOSYS for clone3 (so libc falls back to clone, whose
        // flags the filter can read), EPERM for everything else.
        Tier::Container if call == "clone3" => Some(&[38]),
        Tier::Container => Some(EPERM),
        // gVisor's kernel serves namespaces, io_uring, ptrace and clone within the sandbox;
        // setns is given descriptor 0, which names no namespace (EINVAL, nothing done).
        Tier::Gvisor => match call {
            "ptrace-attach-1" | "unshare-user" | "unshare-net" | "io_uring_setup"
            | "clone-newuser" | "clone-newpid" | "clone3" | "process_vm_readv" => None,
            "setns" => Some(&[1, 13, 19, 22, 38, 95]),
            _ => Some(REFUSED),
        },
        // The guest's own kernel: only what needs its root is checked.
        _ => privileged.contains(&call).then_some(FAILED),
    }
}

/// The kernel features in [`SYSCALLS`] are refused as the tier's wall says (each call from
/// a fresh child, so a namespace one call made cannot lend the next its privileges), and the same
/// through the tools a user would reach for: a mount made inside a namespace the sandbox
/// may create stays there.
pub fn dangerous_syscalls_refused(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let calls: Vec<String> = SYSCALLS
        .iter()
        .map(|(name, a)| {
            format!(
                "  '{name}': ({}, {}, {}, {}, {}),",
                a[0], a[1], a[2], a[3], a[4]
            )
        })
        .collect();
    let probe = format!(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\ncalls = {{\n{}\n}}\nfor name, (nr, a, b, c, d) in calls.items():\n  if os.fork() == 0:\n    r = libc.syscall(nr, ctypes.c_long(a), ctypes.c_long(b), ctypes.c_long(c), ctypes.c_long(d))\n    if r == 0 and name.startswith('clone'):\n      os._exit(0)\n    print(name, 'ALLOWED' if r >= 0 else ctypes.get_errno(), flush=True)\n    os._exit(0)\n  os.wait()\n",
        calls.join("\n")
    );
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    assert_eq!(
        out.lines().count(),
        SYSCALLS.len(),
        "{out} {}",
        text(&o.stderr)
    );
    for line in out.lines() {
        let (name, res) = line.split_once(' ').unwrap();
        let Some(allowed) = refusal(wall, name) else {
            continue;
        };
        assert_ne!(res, "ALLOWED", "{name} was allowed: {out}");
        let errno: i32 = res.parse().unwrap();
        assert!(
            allowed.contains(&errno),
            "{name}: errno {errno}, want one of {allowed:?}: {out}"
        );
    }
    let tag = format!("cordon-ns-{}", std::process::id());
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Sh,
            format!(
                "mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; \
                 unshare -Urm sh -c 'mount -t tmpfs none /usr && touch /usr/{tag} && echo NS-MOUNT' 2>/dev/null; \
                 test -e /usr/{tag} && echo LEAKED; echo probe-ran"
            ),
        ),
    );
    let out = text(&o.stdout);
    assert!(out.contains("probe-ran"), "{out} {}", text(&o.stderr));
    assert!(!out.contains("MOUNTED") && !out.contains("LEAKED"), "{out}");
    if wall.shares_host_kernel {
        assert!(
            !out.contains("NS-MOUNT"),
            "a user namespace was made: {out}"
        );
    }
    assert!(!std::path::Path::new("/usr").join(&tag).exists());
}

/// A setuid program gives the sandbox's user nothing: `passwd -S root` and `su` fail, the
/// user is never root, and where the tier shows the host's kernel the mount /usr is on (the
/// host's /usr, or a template's root) is read-only and nosuid.
pub fn setuid_grants_nothing(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(
            Language::Sh,
            "command -v passwd >/dev/null && { passwd -S root; echo rc=$?; }; \
             su -c id root </dev/null 2>/dev/null; cat /proc/self/mountinfo; \
             { echo x > /usr/cordon-probe; } 2>/dev/null || echo usr-write-refused; \
             echo uid=$(id -u)",
        ),
    );
    let out = text(&o.stdout);
    assert!(!out.contains("rc=0"), "passwd succeeded: {out}");
    assert!(!out.contains("uid=0"), "{out} {}", text(&o.stderr));
    assert!(out.contains("uid="), "{out} {}", text(&o.stderr));
    if !wall.own_kernel {
        // The mount /usr is on: its own (the host's, bound in), else the root (a template's).
        let mount_at = |at: &str| {
            out.lines()
                .find(|l| l.split_whitespace().nth(4) == Some(at))
        };
        let usr = mount_at("/usr")
            .or_else(|| mount_at("/"))
            .unwrap_or_default();
        if (spec.resolved_template.is_some() || wall.root_overlay) && !wall.shares_host_kernel {
            // gVisor on a template: the root is the sandbox's own overlay (its upper in the
            // sentry's memory, gone with the sandbox), so it is writable by design; the
            // template's files stay root's, which the sandbox's user is not.
            assert!(
                usr.contains(" - overlay "),
                "the template root is not an overlay: {usr}"
            );
            assert!(out.contains("usr-write-refused"), "/usr was written: {out}");
        } else {
            assert!(usr.contains("ro"), "/usr is writable: {usr}");
        }
        if wall.shares_host_kernel {
            assert!(usr.contains("nosuid"), "/usr allows setuid: {usr}");
        }
    }
}

/// `socketpair()` opens nothing but unix pairs: a family the kernel lacks a pair for still
/// runs its socket creation (module autoload included) before failing, so on a tier that
/// shares the host kernel each one must be refused by the filter, with EPERM.
pub fn socketpair_families_refused(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let probe = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fds = (ctypes.c_int * 2)()
cases = [('tipc', 30, 1), ('tipc-seq', 30, 5), ('netlink', 16, 2), ('inet', 2, 1),
         ('inet6', 10, 2), ('packet', 17, 2), ('vsock', 40, 1), ('alg', 38, 5),
         ('unspec', 0, 1), ('unix', 1, 1)]
for name, fam, typ in cases:
    r = libc.socketpair(fam, typ, 0, fds)
    print(name, 'OPENED' if r == 0 else ctypes.get_errno())
"#;
    let o = run_once(b, spec, &ExecRequest::code(Language::Python, probe));
    let out = text(&o.stdout);
    let lines: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(lines.len(), 10, "{out} {}", text(&o.stderr));
    for (name, result) in lines {
        if name == "unix" {
            assert_eq!(result, "OPENED", "a unix pair must work: {out}");
        } else if wall.shares_host_kernel {
            assert_eq!(
                result, "1",
                "socketpair({name}) was not refused by the filter: {out}"
            );
        } else {
            assert_ne!(result, "OPENED", "socketpair({name}) opened: {out}");
        }
    }
}

/// Python that opens inotify instances and message queues and queues blocked real-time
/// signals until refused, prints `held` with what it got, and sleeps holding them.
const HOLD_KERNEL_COUNTS: &str = r#"
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
n, err = 0, 0
while n < 4096:
    if libc.inotify_init1(0o2000000) < 0:
        err = ctypes.get_errno(); break
    n += 1
class Attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long),
                ('msgsize', ctypes.c_long), ('curmsgs', ctypes.c_long), ('pad', ctypes.c_long * 4)]
q = 0
try:
    libc.mq_open.restype = ctypes.c_int
    for size, count in ((8192, 10), (1024, 10), (128, 10), (1, 1)):
        for i in range(300):
            a = Attr(0, count, size, 0)
            name = ('/cordon-q%d-%d' % (size, i)).encode()
            if libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
                break
            q += 1
except AttributeError:
    pass
# Real-time signals queued to itself and blocked: each is a pending signal charged to the
# user that owns it, up to RLIMIT_SIGPENDING.
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
sig = 0
while sig < 200000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) == 0:
    sig += 1
print('held', n, err, q, sig, flush=True)
time.sleep(600)
"#;

/// A sandbox that holds as many inotify instances and message queue bytes as it can get
/// leaves host root able to make its own: the sandbox's use is charged to its own host
/// ids, not to root's (whose namespace it used to be). Checked by this test process (root)
/// while the sandbox holds them. (In the container tier Landlock already refuses
/// `mq_open` with EACCES, so there the queue half holds nothing; the inotify half is the
/// one that failed before.)
pub fn kernel_counts_stay_inside(b: &dyn Backend, spec: &SandboxSpec, _wall: Wall) {
    use nix::mqueue::{MQ_OFlag, MqAttr, mq_close, mq_open, mq_unlink};
    let mut sb = b.create(spec).unwrap();
    let stop = sb.interrupter();
    let mut req = ExecRequest::code(Language::Python, HOLD_KERNEL_COUNTS);
    // Tiers that cannot interrupt a running exec end this one by its timeout. The microvm
    // tier under TCG emulation starts Python slowly, and slower still beside CI's other
    // jobs (CI saw the probe time out at 15 s before it held anything).
    req.timeout_ms = Some(if spec.tier == cordon_core::Tier::Microvm {
        60_000
    } else {
        15_000
    });
    let mut seen = String::new();
    // What host root could still do while the sandbox held its counts: inotify, a message
    // queue, a queued signal.
    type HostChecks = (Result<(), String>, Result<(), String>, Result<(), String>);
    let mut host: Option<HostChecks> = None;
    let mut sink = |s: OutputStream, d: &[u8]| {
        if s != OutputStream::Stdout || host.is_some() {
            return;
        }
        seen.push_str(&String::from_utf8_lossy(d));
        if !(seen.contains("held") && seen.ends_with('\n')) {
            return;
        }
        let inotify = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::IN_CLOEXEC)
            .map(drop)
            .map_err(|e| format!("inotify_init: {e}"));
        let name =
            std::ffi::CString::new(format!("/cordon-host-probe-{}", std::process::id())).unwrap();
        let attr = MqAttr::new(0, 1, 1, 0);
        let mq = mq_open(
            name.as_c_str(),
            MQ_OFlag::O_CREAT | MQ_OFlag::O_EXCL | MQ_OFlag::O_RDWR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            Some(&attr),
        )
        .map(|q| {
            let _ = mq_close(q);
            let _ = mq_unlink(name.as_c_str());
        })
        .map_err(|e| format!("mq_open: {e}"));
        host = Some((inotify, mq, host_can_queue_a_signal()));
        if let Some(stop) = &stop {
            stop();
        }
    };
    let ran = sb.exec(&req, &mut sink);
    let _ = sb.destroy();
    let Some((inotify, mq, sigpending)) = host else {
        panic!("the probe never held anything: {seen} {ran:?}");
    };
    let held: Vec<u64> = seen
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        held.first().is_some_and(|&n| n > 0),
        "the sandbox got no inotify instance: {seen}"
    );
    assert!(
        held.get(3).is_some_and(|&n| n > 0),
        "the sandbox queued no signal: {seen}"
    );
    assert_eq!(
        inotify,
        Ok(()),
        "host root's inotify ran out: sandbox {seen}"
    );
    assert_eq!(
        mq,
        Ok(()),
        "host root's message queue bytes ran out: sandbox {seen}"
    );
    assert_eq!(
        sigpending,
        Ok(()),
        "host root's pending signals ran out: sandbox {seen}"
    );
}

/// Whether a root process on the host can still queue a (blocked) real-time signal to
/// itself: run as a separate process, since queuing one in this multi-threaded test binary
/// could land on a thread that does not block it.
fn host_can_queue_a_signal() -> Result<(), String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import ctypes, os, signal\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n\
             r = libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0))\n\
             print('ok' if r == 0 else 'errno %d' % ctypes.get_errno())",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if said == "ok" {
        Ok(())
    } else {
        Err(format!(
            "sigqueue: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A FIFO made in `/work` by the program, then written and read through the file calls:
/// each returns at once and the sandbox still runs programs after. Where the FIFO is a
/// file of the host's kernel (the container tier) both calls are refused: the agent opens
/// without blocking and takes only regular files. Where it lives in the sandbox's own
/// kernel (gVisor's sentry keeps FIFOs to itself) the host sees no FIFO and the put
/// writes a regular file. Before, the write blocked the agent in `open()` for as long as
/// nobody read the FIFO, so the call never returned. Through a caller without file calls
/// ([`Wall::agent_files`] false) both copies fail at once.
pub fn fifo_put_fails_promptly(b: &dyn Backend, spec: &SandboxSpec, wall: Wall) {
    let mut sb = b.create(spec).unwrap();
    let o = sb
        .exec(
            &ExecRequest::code(Language::Sh, "mkfifo /work/fifo && echo made"),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    assert_eq!(text(&o.stdout), "made\n", "{o:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    // On its own thread: a blocked call must fail this test, not hang it.
    std::thread::spawn(move || {
        let put = sb.put_file("/work/fifo", b"x", 0o644);
        let get = sb.get_file("/work/fifo", 100);
        let after = sb
            .exec(
                &ExecRequest::argv(["echo", "still-here"]),
                &mut |_: OutputStream, _: &[u8]| {},
            )
            .map(|o| text(&o.stdout));
        let _ = sb.destroy();
        let _ = tx.send((put, get, after));
    });
    let (put, get, after) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a file call onto a FIFO never returned");
    fn refused<T>(r: &cordon_core::Result<T>) -> bool {
        matches!(r, Err(cordon_core::Error::PathRefused { reason, .. }) if reason.contains("not a regular file"))
    }
    if !wall.agent_files {
        // The caller's own copy cannot reach the sandbox's FIFO (or anything of its /work):
        // it says so at once, neither blocking nor pretending to have delivered.
        assert!(
            put.is_err(),
            "a copy into the sandbox's /work succeeded: {put:?}"
        );
        assert!(
            get.is_err(),
            "a copy out of the sandbox's /work succeeded: {get:?}"
        );
    } else if wall.shares_host_kernel || put.is_err() {
        assert!(refused(&put), "{put:?}");
        assert!(refused(&get), "{get:?}");
    } else {
        assert_eq!(get.as_deref().ok(), Some(&b"x"[..]), "{get:?}");
    }
    assert_eq!(after.unwrap(), "still-here\n");
}

/// A background program that fills its user's queue of pending signals (RLIMIT_SIGPENDING)
/// first, then waits.
const FILL_SIGNAL_QUEUE: &str = r#"
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n = 0
while n < 200000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) == 0:
    n += 1
print('held', n, ctypes.get_errno(), flush=True)
time.sleep(600)
"#;

/// A program cannot make itself unstoppable by filling its user's queue of pending signals:
/// the signal the agent queues to relay a raise (the path of cordon-oci's `kill`, which a
/// kubelet's stop becomes) is refused then, and the raise must still reach the program, a
/// TERM to it alone and a KILL to every process of the exec. Before, both raises failed with
/// EAGAIN, and a kubelet retried its kill for ever while the pod ran on.
pub fn a_full_signal_queue_stops_no_raise(b: &dyn Backend, spec: &SandboxSpec) {
    let mut sb = b.create(spec).unwrap();
    for (signal, all) in [(libc_sig::TERM, false), (libc_sig::KILL, true)] {
        let id = sb
            .start_background(&ExecRequest::code(Language::Python, FILL_SIGNAL_QUEUE))
            .unwrap();
        let mut said = String::new();
        for _ in 0..600 {
            let out = sb.read_background(id, [0, 0], 4096).unwrap();
            said = format!("{}{}", text(&out.stdout), text(&out.stderr));
            if said.contains("held") || out.exit.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let held: u64 = said
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(held > 0, "the program queued no signal: {said}");
        sb.raise_background(id, signal, all)
            .unwrap_or_else(|e| panic!("signal {signal} to a program with a full queue: {e}"));
        let mut exit = None;
        for _ in 0..300 {
            exit = sb.read_background(id, [0, 0], 4096).unwrap().exit;
            if exit.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let exit = exit.unwrap_or_else(|| panic!("signal {signal} did not end the program"));
        assert_eq!(exit.signal, Some(signal), "{exit:?}");
    }
    sb.destroy().unwrap();
}

/// Signal numbers (x86-64 Linux) the checks send.
mod libc_sig {
    pub const TERM: i32 = 15;
    pub const KILL: i32 = 9;
}
