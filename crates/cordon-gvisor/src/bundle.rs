//! The OCI runtime config runsc is given: typed with the `oci-spec` crate, built from the
//! sandbox's facts by one pure function (so a test can read every field of it).
//!
//! The agent is the container's first process, root inside gVisor's kernel with the few
//! capabilities it needs for each exec's reaper; every program it starts runs as the
//! sandbox's uid without capabilities. The crate's defaults (its sample mounts, masked
//! paths, default capabilities and rlimits) are never taken: every field is set here or
//! left out.

use std::path::{Path, PathBuf};

use cordon_core::{Error, Result};
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilities, LinuxCpuBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

/// Where the agent binary is bound inside the sandbox.
pub(crate) const AGENT_INSIDE: &str = "/.cordon/agent";
/// Where the host's `/usr` is bound in a sandbox on a template: the agent (a program of the
/// host) loads its C library from there; the sandbox's programs come from the template.
pub(crate) const TEMPLATE_HOST_USR: &str = "/.cordon/usr";

/// The facts one start of the sandbox's runsc is configured from.
pub(crate) struct Inputs<'a> {
    /// The host uid and gid programs run as.
    pub uid: u32,
    pub limits: &'a cordon_core::Limits,
    /// The workspace on the host, bound at `/work`.
    pub work: &'a Path,
    /// The agent binary on the host.
    pub agent: &'a Path,
    /// The volumes' and host binds' idmapped binds: (bind on the host, absolute path in the
    /// sandbox, read-only).
    pub volumes: &'a [(PathBuf, String, bool)],
    /// The egress socket's directory on the host and inside, and the port the agent's
    /// forwarder listens on, when the sandbox has egress.
    pub egress: Option<Egress<'a>>,
    /// The host directory of the sockets port connections come through
    /// ([`cordon_guest::proto::PORTS_DIR`] inside): bound there read-only when the sandbox
    /// has no egress (with egress they are in the egress socket's directory, bound there).
    pub ports: &'a Path,
    /// The template's root, when the sandbox has one (else the bundle's `rootfs`).
    pub template_root: Option<&'a Path>,
    /// Host /etc entries bound read-only at the same path (no template).
    pub host_etc: Vec<PathBuf>,
    /// Cordon's own /etc files over a template's: (path inside, file on the host).
    pub etc_overlays: Vec<(PathBuf, PathBuf)>,
    /// The runsc sandbox's cgroup, as OCI names it.
    pub cgroups_path: Option<String>,
    /// A pod's network namespace the sandbox joins (with runsc's `--network=host`).
    pub netns: Option<&'a Path>,
}

/// The egress socket as the agent reaches it.
pub(crate) struct Egress<'a> {
    pub host_dir: &'a Path,
    pub inside_dir: &'a Path,
    pub socket_inside: &'a str,
    pub port: u16,
}

fn oci(what: &str) -> impl Fn(oci_spec::OciSpecError) -> Error + '_ {
    move |e| Error::Failed {
        what: format!("building the runsc config ({what})"),
        source: Box::new(e),
    }
}

/// One mount; `options` as runsc reads them.
fn mount(
    destination: impl Into<PathBuf>,
    typ: &str,
    source: impl Into<PathBuf>,
    options: &[&str],
) -> Result<Mount> {
    let mut b = MountBuilder::default()
        .destination(destination.into())
        .typ(typ)
        .source(source.into());
    if !options.is_empty() {
        b = b.options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>());
    }
    b.build().map_err(oci("a mount"))
}

/// The config for one start.
pub(crate) fn config(i: &Inputs<'_>) -> Result<Spec> {
    // With a template the root is the template's (under runsc's overlay, its upper in the
    // sentry's memory); the host's /usr is bound only at a private path, for the agent's own
    // loader and C library.
    let usr = if i.template_root.is_some() {
        TEMPLATE_HOST_USR
    } else {
        "/usr"
    };
    let mut args = match i.template_root {
        Some(_) => vec![
            format!("{TEMPLATE_HOST_USR}/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
            "--library-path".to_string(),
            format!("{TEMPLATE_HOST_USR}/lib/x86_64-linux-gnu"),
            AGENT_INSIDE.to_string(),
            i.uid.to_string(),
        ],
        None => vec![AGENT_INSIDE.to_string(), i.uid.to_string()],
    };
    if let Some(e) = &i.egress {
        args.extend([
            "--egress".to_string(),
            e.port.to_string(),
            e.socket_inside.to_string(),
        ]);
    }
    let mounts = mounts_of(i, usr)?;
    let linux = linux_of(i)?;
    let process = process_of(i, args)?;
    let root = match i.template_root {
        Some(t) => RootBuilder::default().path(t).readonly(false),
        None => RootBuilder::default().path("rootfs").readonly(true),
    }
    .build()
    .map_err(oci("root"))?;
    let mut spec = SpecBuilder::default()
        .version("1.0.2")
        .process(process)
        .root(root)
        .hostname("cordon")
        .mounts(mounts)
        .linux(linux)
        .build()
        .map_err(oci("spec"))?;
    spec.set_annotations(None);
    Ok(spec)
}

/// The sandbox's mounts: /proc, /dev and its terminals, the host's /usr (at `usr`), /tmp,
/// the workspace (at E2B's home too), the agent, the volumes, the ports or egress
/// directory and the host's /etc files.
fn mounts_of(i: &Inputs<'_>, usr: &str) -> Result<Vec<Mount>> {
    let l = i.limits;
    let tmp_size = format!("size={}", l.tmp_bytes);
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &[])?,
        mount("/dev", "tmpfs", "tmpfs", &["nosuid", "noexec", "size=64k"])?,
        // The sandbox's terminals: a devpts instance of gVisor's own kernel (ADR 0014).
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        )?,
        mount(usr, "bind", "/usr", &["rbind", "ro", "nosuid", "nodev"])?,
        mount("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", &tmp_size])?,
        mount("/work", "bind", i.work, &["rbind", "rw", "nosuid", "nodev"])?,
        mount(
            AGENT_INSIDE,
            "bind",
            i.agent,
            &["bind", "ro", "nosuid", "nodev"],
        )?,
    ];
    // The same workspace at E2B's home, where a process is then there by that name: in
    // Cordon's root, or a template's that has the directory, empty (imports make it; runsc
    // would make a missing one in the template itself; an image's own files there stay).
    let home = cordon_core::HOME_MOUNT;
    let has_home = i.template_root.is_none_or(|r| {
        cordon_template::resolve_in_root(r, home).is_some_and(|p| {
            p == r.join(home.trim_start_matches('/'))
                && std::fs::read_dir(&p).is_ok_and(|mut d| d.next().is_none())
        })
    });
    if has_home {
        mounts.push(mount(
            home,
            "bind",
            i.work,
            &["rbind", "rw", "nosuid", "nodev"],
        )?);
    }
    for (bind, path, ro) in i.volumes {
        let mode = if *ro { "ro" } else { "rw" };
        let opts = ["rbind", mode, "nosuid", "nodev"];
        mounts.push(mount(path.as_str(), "bind", bind, &opts)?);
        // Seen under /home/user too, as on the other tiers.
        if let Some(rel) = path.strip_prefix("/work/").filter(|_| has_home) {
            mounts.push(mount(format!("{home}/{rel}"), "bind", bind, &opts)?);
        }
    }
    if i.egress.is_none() {
        mounts.push(mount(
            cordon_guest::proto::PORTS_DIR,
            "bind",
            i.ports,
            &["rbind", "ro", "nosuid", "nodev", "noexec"],
        )?);
    }
    if let Some(e) = &i.egress {
        mounts.push(mount(
            e.inside_dir,
            "bind",
            e.host_dir,
            &["rbind", "ro", "nosuid", "nodev", "noexec"],
        )?);
    }
    for host in &i.host_etc {
        mounts.push(mount(
            host,
            "bind",
            host,
            &["rbind", "ro", "nosuid", "nodev", "noexec"],
        )?);
    }
    for (inside, file) in &i.etc_overlays {
        mounts.push(mount(
            inside,
            "bind",
            file,
            &["bind", "ro", "nosuid", "nodev"],
        )?);
    }
    Ok(mounts)
}

/// The sandbox's namespaces (a pod's network one joined), its memory and CPU limits, its
/// cgroup; nothing of the host's ids or devices.
fn linux_of(i: &Inputs<'_>) -> Result<oci_spec::runtime::Linux> {
    let l = i.limits;
    let mem = l.memory_bytes as i64;
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ]
    .into_iter()
    .map(|t| {
        let mut ns = LinuxNamespaceBuilder::default().typ(t);
        if let (LinuxNamespaceType::Network, Some(path)) = (t, i.netns) {
            ns = ns.path(path);
        }
        ns.build().map_err(oci("a namespace"))
    })
    .collect::<Result<Vec<_>>>()?;
    let mut resources = LinuxResourcesBuilder::default()
        .memory(
            LinuxMemoryBuilder::default()
                .limit(mem)
                .swap(mem)
                .build()
                .map_err(oci("memory"))?,
        )
        .cpu(
            LinuxCpuBuilder::default()
                .period(100_000u64)
                .quota((l.cpus * 100_000.0) as i64)
                .build()
                .map_err(oci("cpu"))?,
        )
        .build()
        .map_err(oci("resources"))?;
    resources.set_devices(None);
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .resources(resources)
        .build()
        .map_err(oci("linux"))?;
    linux
        .set_uid_mappings(None)
        .set_gid_mappings(None)
        .set_sysctl(None)
        .set_devices(None)
        .set_rootfs_propagation(None)
        .set_masked_paths(None)
        .set_readonly_paths(None)
        .set_mount_label(None)
        .set_cgroups_path(i.cgroups_path.as_ref().map(PathBuf::from));
    Ok(linux)
}

/// The agent's process: root in gVisor's kernel with only the capabilities it needs, its
/// open-files limit, `args`.
fn process_of(i: &Inputs<'_>, args: Vec<String>) -> Result<oci_spec::runtime::Process> {
    let l = i.limits;
    // What the agent needs inside gVisor's kernel and nothing more: namespaces and /proc
    // mounts for each exec's reaper, taking the sandbox's uid, killing a reaper. Programs
    // lose every one of them (and the bounding set) before they run. CAP_DAC_OVERRIDE: the
    // forwarder (the agent's child, outside every exec) opens the egress socket, whose
    // directory is the sandbox uid's alone.
    let caps: oci_spec::runtime::Capabilities = [
        Capability::SysAdmin,
        Capability::DacOverride,
        Capability::Setuid,
        Capability::Setgid,
        Capability::Setpcap,
        Capability::Kill,
    ]
    .into_iter()
    .collect();
    let mut capabilities = LinuxCapabilities::default();
    capabilities
        .set_bounding(Some(caps.clone()))
        .set_effective(Some(caps.clone()))
        .set_permitted(Some(caps))
        .set_inheritable(None)
        .set_ambient(None);
    let nofile = l.open_files.max(1024);
    let mut process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(0u32)
                .gid(0u32)
                .build()
                .map_err(oci("user"))?,
        )
        .args(args)
        .env(vec!["PATH=/usr/bin:/bin".to_string(), "HOME=/".to_string()])
        .cwd("/")
        .capabilities(capabilities)
        .no_new_privileges(true)
        .rlimits(vec![
            PosixRlimitBuilder::default()
                .typ(PosixRlimitType::RlimitNofile)
                .hard(nofile)
                .soft(nofile)
                .build()
                .map_err(oci("rlimit"))?,
        ])
        .build()
        .map_err(oci("process"))?;
    process.set_io_priority(None).set_exec_cpu_affinity(None);
    Ok(process)
}

/// The bind mounts' destinations (runsc makes a missing one in the root it is given).
pub(crate) fn bind_destinations(spec: &Spec) -> impl Iterator<Item = &Path> {
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| m.typ().as_deref() == Some("bind"))
        .map(|m| m.destination().as_path())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sorted_caps(v: &mut serde_json::Value) {
        for set in ["bounding", "effective", "permitted"] {
            if let Some(a) = v["process"]["capabilities"][set].as_array_mut() {
                a.sort_by_key(|c| c.as_str().unwrap_or_default().to_string());
            }
        }
    }

    /// Every field runsc reads, as the tier wrote it by hand before the typed config: the
    /// crate's defaults (sample mounts, masked paths, more capabilities) never leak in.
    #[test]
    fn the_config_is_exactly_what_the_tier_asks_for() {
        let limits = cordon_core::Limits {
            memory_bytes: 256 << 20,
            cpus: 1.5,
            open_files: 64,
            tmp_bytes: 1 << 20,
            ..Default::default()
        };
        let volumes = vec![(PathBuf::from("/b/v1"), "/work/data".to_string(), true)];
        let i = Inputs {
            uid: 100_000,
            limits: &limits,
            work: Path::new("/b/work"),
            agent: Path::new("/opt/agent"),
            volumes: &volumes,
            ports: Path::new("/b/ports"),
            egress: Some(Egress {
                host_dir: Path::new("/run/e"),
                inside_dir: Path::new("/.cordon/egress"),
                socket_inside: "/.cordon/egress/s.sock",
                port: 3128,
            }),
            template_root: None,
            host_etc: vec![PathBuf::from("/etc/alternatives")],
            etc_overlays: Vec::new(),
            cgroups_path: Some("/cordon-gvisor/sb-1".into()),
            netns: None,
        };
        let mut got = serde_json::to_value(config(&i).unwrap()).unwrap();
        sorted_caps(&mut got);
        let caps = json!([
            "CAP_DAC_OVERRIDE",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETPCAP",
            "CAP_SETUID",
            "CAP_SYS_ADMIN"
        ]);
        let want = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": ["/.cordon/agent", "100000", "--egress", "3128", "/.cordon/egress/s.sock"],
                "env": ["PATH=/usr/bin:/bin", "HOME=/"],
                "cwd": "/",
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
                "noNewPrivileges": true,
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": "cordon",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "size=64k"]},
                {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
                {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"]},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=1048576"]},
                {"destination": "/work", "type": "bind", "source": "/b/work", "options": ["rbind", "rw", "nosuid", "nodev"]},
                {"destination": "/.cordon/agent", "type": "bind", "source": "/opt/agent", "options": ["bind", "ro", "nosuid", "nodev"]},
                {"destination": "/home/user", "type": "bind", "source": "/b/work", "options": ["rbind", "rw", "nosuid", "nodev"]},
                {"destination": "/work/data", "type": "bind", "source": "/b/v1", "options": ["rbind", "ro", "nosuid", "nodev"]},
                {"destination": "/home/user/data", "type": "bind", "source": "/b/v1", "options": ["rbind", "ro", "nosuid", "nodev"]},
                {"destination": "/.cordon/egress", "type": "bind", "source": "/run/e", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]},
                {"destination": "/etc/alternatives", "type": "bind", "source": "/etc/alternatives", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
                "resources": {
                    "memory": {"limit": 256 << 20, "swap": 256 << 20},
                    "cpu": {"period": 100000, "quota": 150000}
                },
                "cgroupsPath": "/cordon-gvisor/sb-1"
            }
        });
        assert_eq!(got, want);
    }

    #[test]
    fn a_template_root_is_writable_and_the_hosts_usr_moves_aside() {
        let limits = cordon_core::Limits::default();
        let i = Inputs {
            uid: 7,
            limits: &limits,
            work: Path::new("/w"),
            agent: Path::new("/a"),
            volumes: &[],
            ports: Path::new("/b/ports"),
            egress: None,
            template_root: Some(Path::new("/t/root")),
            host_etc: Vec::new(),
            etc_overlays: vec![(
                PathBuf::from("/etc/hosts"),
                PathBuf::from("/b/rootfs/etc/hosts"),
            )],
            cgroups_path: None,
            netns: None,
        };
        let spec = config(&i).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["root"], json!({"path": "/t/root", "readonly": false}));
        assert_eq!(
            v["process"]["args"][0],
            format!("{TEMPLATE_HOST_USR}/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
        );
        assert!(v["linux"].get("cgroupsPath").is_none());
        let binds: Vec<&Path> = bind_destinations(&spec).collect();
        assert!(binds.contains(&Path::new(TEMPLATE_HOST_USR)));
        assert!(binds.contains(&Path::new("/etc/hosts")));
        assert!(!binds.contains(&Path::new("/usr")));
    }
}
