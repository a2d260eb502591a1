//! The peers Cordon's tiers are measured beside: what this host can already do without
//! Cordon. Each is a command run to completion; each names the tiers it is the counterpart
//! of (a tier with no counterpart measured is compared with the peer closest in time).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cordon_core::Tier;

/// One peer: a name, what it does, the tiers it is the counterpart of, and how to run it.
pub struct Peer {
    pub name: &'static str,
    pub what: String,
    pub counterpart_of: Vec<Tier>,
    run: Box<dyn FnMut() -> Result<()>>,
}

impl Peer {
    pub fn run(&mut self) -> Result<()> {
        (self.run)()
    }
}

/// A peer that could not be set up here, and why.
pub struct Missing {
    pub name: &'static str,
    pub reason: String,
}

/// Every peer name, in the order they are reported.
pub const NAMES: [&str; 5] = ["host", "bwrap", "crun", "runsc", "qemu"];

/// Runs a command to completion with no input or output; fails on a non-zero status or
/// when it outlives `timeout` (then it is killed).
fn run_quiet(cmd: &mut Command, timeout: Duration) -> Result<()> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            if st.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            bail!(
                "{what} failed ({st}): {}",
                err.trim().lines().last().unwrap_or("")
            );
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {timeout:?}; killed it");
        }
        // Short naps: a 1 ms poll adds at most ~1 ms to a figure measured in ms.
        std::thread::sleep(Duration::from_micros(
            if start.elapsed() < Duration::from_millis(20) {
                100
            } else {
                1000
            },
        ));
    }
}

/// bwrap with the same shape of root Cordon builds: read-only /usr, fresh /proc, /dev, /tmp.
pub const BWRAP: &[&str] = &[
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--",
    "sh",
    "-c",
    "true",
];

pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|c| c.is_file())
    })
}

fn argv_command(argv: &[&str]) -> Command {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]);
    c
}

/// Builds the peers named in `only` (none when it is empty: `--peers none`); the ones that
/// cannot run here come back as [`Missing`] with the reason and the fix. `scratch` is a directory the
/// peers may use (OCI bundle, runtime state) and that the caller removes afterwards.
pub fn build(only: &[String], scratch: &Path) -> (Vec<Peer>, Vec<Missing>) {
    let mut peers = Vec::new();
    let mut missing = Vec::new();
    for name in NAMES {
        if !only.iter().any(|o| o == name) {
            continue;
        }
        let built = match name {
            "host" => Ok(Peer {
                name,
                what: "fork+exec of `sh -c true`, no isolation".into(),
                counterpart_of: vec![Tier::Runtime, Tier::Wasm],
                run: Box::new(|| run_quiet(&mut argv_command(&["sh", "-c", "true"]), TIMEOUT)),
            }),
            "bwrap" => bwrap(),
            "crun" => oci(scratch),
            "runsc" => runsc(scratch),
            "qemu" => qemu(scratch),
            _ => continue,
        };
        match built {
            Ok(p) => peers.push(p),
            Err(reason) => missing.push(Missing { name, reason }),
        }
    }
    (peers, missing)
}

const TIMEOUT: Duration = Duration::from_secs(60);

fn bwrap() -> Result<Peer, String> {
    if which("bwrap").is_none() {
        return Err("bwrap is not installed (apt-get install bubblewrap)".into());
    }
    Ok(Peer {
        name: "bwrap",
        what: "`bwrap --unshare-all` of `sh -c true`, read-only /usr (namespaces only)".into(),
        counterpart_of: vec![Tier::Container],
        run: Box::new(|| run_quiet(&mut argv_command(BWRAP), TIMEOUT)),
    })
}

/// crun (or runc where crun is missing) running `sh -c true` from a minimal OCI bundle:
/// an empty read-only root with the host's /usr bound read-only, fresh /proc, /dev, /tmp,
/// new pid, net, ipc, uts and mount namespaces. On a hybrid cgroup host (v1 controllers
/// plus a v2 mount) it runs with the v2 mount detached in a private mount namespace, which
/// crun needs (see `sys::exec_without_unified_cgroup`).
fn oci(scratch: &Path) -> Result<Peer, String> {
    let runtime = which("crun")
        .or_else(|| which("runc"))
        .ok_or("neither crun nor runc is installed (apt-get install crun; scripts/setup.sh)")?;
    let bundle = scratch.join("oci-bundle");
    let rootfs = bundle.join("rootfs");
    let state = scratch.join("oci-state");
    let io = |e: std::io::Error| format!("writing the OCI bundle in {}: {e}", bundle.display());
    for d in ["usr", "proc", "dev", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).map_err(io)?;
    }
    std::fs::create_dir_all(&state).map_err(io)?;
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        let p = rootfs.join(link);
        if p.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(to, p).map_err(io)?;
        }
    }
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh", "-c", "true"],
            "env": ["PATH=/usr/bin:/bin"],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {"bounding": [], "effective": [], "permitted": []}
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "peer",
        "mounts": [
            {"destination": "/usr", "type": "bind", "source": "/usr",
             "options": ["rbind", "ro", "nosuid", "nodev"]},
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "mode=755", "size=1m"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", "size=16m"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"}
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        }
    });
    std::fs::write(bundle.join("config.json"), config.to_string()).map_err(io)?;
    let unified = PathBuf::from("/sys/fs/cgroup/unified");
    let hybrid = is_mountpoint(&unified) && Path::new("/sys/fs/cgroup/memory").is_dir();
    let name = if runtime.ends_with("crun") {
        "crun"
    } else {
        "runc"
    };
    let mut n = 0u64;
    Ok(Peer {
        name: "crun",
        what: format!(
            "`{name} run` of `sh -c true` from a minimal OCI bundle (read-only root, host /usr){}",
            if hybrid {
                ", v2 cgroup mount detached (hybrid host)"
            } else {
                ""
            }
        ),
        counterpart_of: vec![Tier::Container],
        run: Box::new(move || {
            n += 1;
            let mut cmd = Command::new(&runtime);
            cmd.arg("--root")
                .arg(&state)
                .args(["run", "--bundle"])
                .arg(&bundle)
                .arg(format!("cordon-bench-{}-{n}", std::process::id()));
            if hybrid {
                crate::sys::exec_without_unified_cgroup(&mut cmd, &unified);
            }
            run_quiet(&mut cmd, TIMEOUT)
        }),
    })
}

fn is_mountpoint(p: &Path) -> bool {
    let target = p.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(&target)))
        .unwrap_or(false)
}

/// `runsc do true` on the ptrace platform (the one that works on this kind of host),
/// no network.
fn runsc(scratch: &Path) -> Result<Peer, String> {
    let bin = which("runsc")
        .ok_or("runsc is not installed (scripts/setup.d/60-gvisor.sh; Debian package runsc)")?;
    if !nix::unistd::geteuid().is_root() {
        return Err("`runsc do` needs root here; run cordon bench as root".into());
    }
    let root = scratch.join("runsc-state");
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    Ok(Peer {
        name: "runsc",
        what: "`runsc --platform=ptrace --network=none do true` (gVisor, no bundle)".into(),
        counterpart_of: vec![Tier::Gvisor],
        run: Box::new(move || {
            let mut cmd = Command::new(&bin);
            cmd.arg("--root").arg(&root).args([
                "--platform=ptrace",
                "--network=none",
                "do",
                "true",
            ]);
            run_quiet(&mut cmd, TIMEOUT)
        }),
    })
}

/// The host's TSC frequency in kHz from /proc/cpuinfo (the clock TCG's guest TSC runs at).
fn tsc_khz() -> u64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mhz: f64 = cpuinfo
        .lines()
        .filter_map(|l| l.strip_prefix("cpu MHz"))
        .filter_map(|l| l.trim_start_matches([' ', '\t', ':']).trim().parse().ok())
        .next()
        .unwrap_or(2000.0);
    (mhz * 1000.0) as u64
}

/// A bare QEMU boot: the microvm tier's guest kernel on the `microvm` machine with no
/// initrd, no disk and `panic=-1`, so the kernel boots until it finds no root, panics,
/// reboots at once and QEMU (`-no-reboot`) exits. That is the cost of booting a kernel,
/// with none of the tier's work (agent, root disk, snapshot restore).
fn qemu(scratch: &Path) -> Result<Peer, String> {
    let bin = which("qemu-system-x86_64")
        .ok_or("qemu-system-x86_64 is not installed (scripts/setup.d/50-microvm.sh)")?;
    let data = cordon_microvm::image::default_data_dir();
    // Why a peer cannot be measured is a line of the bench's report: text.
    let image = cordon_microvm::image::load(&data).map_err(|e| e.to_string())?;
    let (accel, why) = cordon_microvm::probe_accel();
    let kvm = accel == cordon_microvm::Accel::Kvm;
    let mut append = String::from("console=ttyS0 panic=-1 reboot=t quiet");
    if !kvm {
        // Under emulation the kernel's PIT calibration can hang on a busy host: give it
        // the clock instead.
        let khz = tsc_khz();
        append.push_str(&format!(
            " tsc_early_khz={khz} tsc=reliable no_timer_check lpj={}",
            khz * 4
        ));
    }
    let console = scratch.join("qemu-console.log");
    let what = format!(
        "bare QEMU `microvm` boot of the guest kernel to its no-root panic, then exit ({})",
        if kvm {
            "KVM".to_string()
        } else {
            format!("TCG: {why}")
        }
    );
    Ok(Peer {
        name: "qemu",
        what,
        counterpart_of: vec![Tier::Microvm],
        run: Box::new(move || {
            let mut cmd = Command::new(&bin);
            cmd.args([
                "-M",
                if kvm {
                    "microvm,x-option-roms=off,isa-serial=on,acpi=on"
                } else {
                    "microvm,isa-serial=on,acpi=on"
                },
                "-accel",
                if kvm { "kvm" } else { "tcg,thread=multi" },
                "-cpu",
                if kvm { "host" } else { "max" },
            ])
            .args(cordon_microvm::BARE_MACHINE)
            .args(["-smp", "1", "-m", "256M", "-serial"])
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-append")
            .arg(&append);
            run_quiet(&mut cmd, TIMEOUT)
        }),
    })
}
