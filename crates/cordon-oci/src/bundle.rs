//! An OCI bundle: its `config.json` read, checked against what Cordon gives, and turned into
//! one Cordon request and one process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cordon_core::{Feature, Tier};
use cordon_engine::{GrantName, LimitsPatch, NodeAllowance, SandboxRequest};
use oci_spec::runtime::{LinuxNamespaceType, Process, Spec};
use serde::{Deserialize, Serialize};

use crate::allow::Granted;
use crate::node::{Allow, NamespaceKind, PRIVILEGED_CAPS};
use crate::{OciError, Result};

/// The annotations Cordon reads (a container's or, through containerd's CRI plugin, its
/// pod's). Any other `cordon.` key is refused, so a misspelt one never goes unnoticed.
pub mod annotation {
    /// Hosts the workload may reach through Cordon's egress proxy, comma-separated
    /// (`cordon run --allow-host` patterns). Without it the workload reaches nothing.
    pub const ALLOW_HOSTS: &str = "cordon.allow-hosts";
    /// Hosts always refused, comma-separated.
    pub const DENY_HOSTS: &str = "cordon.deny-hosts";
    /// Grants of the node's catalogue, by name, comma-separated.
    pub const GRANTS: &str = "cordon.grants";
    /// The tier: `container`, `gvisor` or `microvm` (default: the node config's `tier`,
    /// else `container`).
    pub const TIER: &str = "cordon.tier";
    /// Limits the bundle does not set: sizes like `256M`, a count, CPUs like `0.5`.
    pub const MEMORY: &str = "cordon.memory";
    pub const PIDS: &str = "cordon.pids";
    pub const CPUS: &str = "cordon.cpus";
    /// Size of the writable `/work` and of `/tmp`.
    pub const DISK: &str = "cordon.disk";
    pub const TMP: &str = "cordon.tmp";
    pub const ALL: [&str; 9] = [
        ALLOW_HOSTS,
        DENY_HOSTS,
        GRANTS,
        TIER,
        MEMORY,
        PIDS,
        CPUS,
        DISK,
        TMP,
    ];
    pub const PREFIX: &str = "cordon.";
}

/// The process to run, as Cordon runs it: argv, environment, working directory, terminal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub terminal: bool,
    /// The terminal's size when it is made (`process.consoleSize`); the engine may
    /// resize it later through the master it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console_size: Option<cordon_core::PtySize>,
    /// Who it runs as inside the sandbox's user namespace (`process.user`) when that is not
    /// root; `None`: the sandbox's own unprivileged user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<ProcessUser>,
}

/// A process's own user: uid, gid and supplementary groups, each from 1 to
/// [`MAX_ID`]. Id 0 is never given (it is the sandbox agent's): a root uid runs as the
/// sandbox's user, a group 0 becomes the sandbox's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
}

/// The largest id a process may run as: the sandbox's user namespace maps 65536 ids.
pub const MAX_ID: u32 = 65535;
/// The sandbox's own user and group.
pub const SANDBOX_ID: u32 = 1000;

impl ProcessUser {
    /// The user a process asks for (`uid`, `gid`, `groups`) as it runs: `None` for root.
    pub fn of(uid: u32, gid: u32, groups: &[u32]) -> Result<Option<Self>> {
        if uid == 0 {
            return Ok(None);
        }
        for (what, id) in [("uid", uid), ("gid", gid)]
            .into_iter()
            .chain(groups.iter().map(|g| ("additional gid", *g)))
        {
            if id > MAX_ID {
                return Err(OciError::Invalid(format!(
                    "the process's {what} {id} is outside the sandbox's ids (0 to {MAX_ID}); \
                     run it as a lower id"
                )));
            }
        }
        let own = |g: u32| if g == 0 { SANDBOX_ID } else { g };
        let gid = own(gid);
        let mut extra: Vec<u32> = groups.iter().map(|g| own(*g)).collect();
        extra.sort_unstable();
        extra.dedup();
        extra.retain(|g| *g != gid);
        Ok(Some(ProcessUser {
            uid,
            gid,
            groups: extra,
        }))
    }
}

impl ProcessSpec {
    /// The parts of an OCI `process` Cordon uses. Its user, capabilities and rlimits are
    /// not: the program runs as the tier's unprivileged user with no capabilities at all.
    pub fn from_oci(p: &Process) -> Result<Self> {
        let args = p.args().clone().unwrap_or_default();
        if args.is_empty() {
            return Err(OciError::Invalid(
                "the process has no args: give the program to run (the image's entrypoint or a command)"
                    .into(),
            ));
        }
        let mut env = BTreeMap::new();
        for kv in p.env().iter().flatten() {
            match kv.split_once('=') {
                Some((k, v)) if !k.is_empty() => {
                    env.insert(k.to_string(), v.to_string());
                }
                _ => {
                    return Err(OciError::Invalid(format!(
                        "environment entry {kv:?} is not KEY=VALUE; fix the container's env"
                    )));
                }
            }
        }
        let cwd = p.cwd().to_string_lossy().into_owned();
        let u = p.user();
        let user = ProcessUser::of(
            u.uid(),
            u.gid(),
            u.additional_gids().as_deref().unwrap_or_default(),
        )?;
        Ok(ProcessSpec {
            user,
            args,
            env,
            cwd: if cwd.is_empty() { "/".into() } else { cwd },
            terminal: p.terminal().unwrap_or(false),
            console_size: p
                .console_size()
                .as_ref()
                .map(|b| cordon_core::PtySize {
                    rows: u16::try_from(b.height()).unwrap_or(cordon_core::PTY_MAX),
                    cols: u16::try_from(b.width()).unwrap_or(cordon_core::PTY_MAX),
                })
                .filter(|s| s.validate().is_ok()),
        })
    }
}

/// The tiers cordon-oci runs a bundle on (those whose [`cordon_core::Features`] say `oci`).
pub fn oci_tiers() -> Vec<Tier> {
    Feature::Oci.tiers()
}

/// Reads `<bundle>/config.json`.
pub fn load(bundle: &Path) -> Result<Spec> {
    let path = bundle.join("config.json");
    Spec::load(&path).map_err(|source| OciError::BundleConfig { path, source })
}

/// The bundle's root filesystem on the host.
pub fn rootfs(spec: &Spec, bundle: &Path) -> Result<PathBuf> {
    let root = spec.root().as_ref().ok_or_else(|| {
        OciError::Invalid("the bundle's config.json has no root; name the root filesystem".into())
    })?;
    let p = root.path();
    Ok(if p.is_absolute() {
        p.clone()
    } else {
        bundle.join(p)
    })
}

fn refused(what: impl Into<String>, fix: impl Into<String>) -> OciError {
    OciError::Refused {
        what: what.into(),
        fix: fix.into(),
    }
}

/// Mount destinations the engines generate for every container (names, resolver, their own
/// markers, shared memory, Kubernetes' termination log and service account token). Cordon
/// does not mount them: the sandbox has its own `/etc/hosts` and `/dev/shm`, no resolver
/// (there is no route), and no credential enters it unless a grant says so.
const ENGINE_MOUNTS: [&str; 8] = [
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/run/.containerenv",
    "/.dockerenv",
    "/dev/shm",
    "/dev/termination-log",
    "/run/secrets",
];

/// Where Kubernetes mounts a pod's service-account token: bound as the pod's other volumes
/// are when it comes from the kubelet's pod directory (`[kubelet] root_dir`), else left
/// out, as the engines' own mounts are.
const TOKEN_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The annotation containerd's CRI gives every container of a pod: the pod's uid.
const POD_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Filesystems the engines mount that the tier gives on its own terms (its own /proc, /dev,
/// devpts, no /sys) or that hold nothing of the host's.
const OWN_FILESYSTEMS: [&str; 7] = [
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];

/// Refuses what Cordon does not give a container unless the node's allowances (`allow`)
/// name that exact thing: a privileged capability, a host namespace (a namespace type left
/// out, or one joined by a path that is the host's), a host device, a host path. Privileged
/// mode is refused whatever the node says. Returns what the allowances gave.
pub fn check(spec: &Spec, allow: &Allow, kubelet: &crate::node::Kubelet) -> Result<Granted> {
    let mut granted = Granted::default();
    let annotations = spec.annotations().clone().unwrap_or_default();
    if annotations
        .get("io.podman.annotations.privileged")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(refused(
            "it asks for privileged mode",
            "run it without --privileged; Cordon never runs a container privileged, whatever the node's config",
        ));
    }
    check_capabilities(spec, allow, &mut granted)?;
    let Some(linux) = spec.linux() else {
        return Err(OciError::Invalid(
            "the bundle's config.json has no linux section; cordon-oci runs Linux containers only"
                .into(),
        ));
    };
    check_namespaces(linux, allow, &mut granted)?;
    for d in linux.devices().iter().flatten() {
        crate::allow::device(d, &allow.devices, &mut granted)?;
    }
    let pod = annotations.get(POD_UID).map(String::as_str);
    for m in spec.mounts().iter().flatten() {
        check_mount(m, allow, kubelet, pod, &mut granted)?;
    }
    Ok(granted)
}

/// A privileged capability in any of the process's sets, unless the node allows it.
fn check_capabilities(spec: &Spec, allow: &Allow, granted: &mut Granted) -> Result<()> {
    let Some(caps) = spec
        .process()
        .as_ref()
        .and_then(|p| p.capabilities().as_ref())
    else {
        return Ok(());
    };
    let sets = [
        caps.bounding(),
        caps.effective(),
        caps.permitted(),
        caps.inheritable(),
        caps.ambient(),
    ];
    for set in sets.into_iter().flatten() {
        for c in PRIVILEGED_CAPS.iter().filter(|c| set.contains(c)) {
            if !allow.capabilities.contains(c) {
                return Err(refused(
                    format!("it asks for privileged mode (capability {c})"),
                    "drop the capability (and --privileged); under Cordon a workload has no capabilities on the host",
                ));
            }
            granted.note(NodeAllowance::Capability {
                name: format!("CAP_{c}"),
            });
        }
    }
    Ok(())
}

/// A host namespace (a kind left out, or one joined by the host's path), unless the node
/// allows that kind; the container runs in its own namespace of that kind all the same.
fn check_namespaces(
    linux: &oci_spec::runtime::Linux,
    allow: &Allow,
    granted: &mut Granted,
) -> Result<()> {
    let namespaces = linux.namespaces().clone().unwrap_or_default();
    for (kind, allowed) in [
        (LinuxNamespaceType::Pid, NamespaceKind::Pid),
        (LinuxNamespaceType::Network, NamespaceKind::Network),
        (LinuxNamespaceType::Ipc, NamespaceKind::Ipc),
        (LinuxNamespaceType::Uts, NamespaceKind::Uts),
        (LinuxNamespaceType::Mount, NamespaceKind::Mount),
    ] {
        let name = allowed.name();
        let asks = match namespaces.iter().find(|n| n.typ() == kind) {
            None => Some(format!("it asks for the host's {name} namespace")),
            Some(ns) => ns
                .path()
                .as_ref()
                .filter(|path| is_host_namespace(path, name))
                .map(|_| format!("it asks to join the host's {name} namespace")),
        };
        let Some(what) = asks else { continue };
        if !allow.namespaces.contains(&allowed) {
            return Err(refused(
                what,
                format!("give the container its own {name} namespace"),
            ));
        }
        // Allowed: it runs in its own namespace of that kind all the same.
        granted.note(NodeAllowance::HostNamespace {
            namespace: name.to_string(),
        });
    }
    Ok(())
}

/// One mount: the engines' own pass, a bind mount is a pod volume of `pod` (the pod's uid),
/// the service-account token or a host path the node allows, and any other filesystem one
/// the tier gives on its own terms.
fn check_mount(
    m: &oci_spec::runtime::Mount,
    allow: &Allow,
    kubelet: &crate::node::Kubelet,
    pod: Option<&str>,
    granted: &mut Granted,
) -> Result<()> {
    let dest = m.destination().to_string_lossy();
    let dest = dest.trim_end_matches('/');
    let options = m.options().clone().unwrap_or_default();
    let bind =
        m.typ().as_deref() == Some("bind") || options.iter().any(|o| o == "bind" || o == "rbind");
    if ENGINE_MOUNTS.contains(&dest) {
        return Ok(());
    }
    if bind {
        let source = m.source().clone().unwrap_or_default();
        let read_only = options.iter().any(|o| o == "ro");
        if crate::allow::pod_volume(&source, dest, read_only, kubelet, pod, granted)? {
            return Ok(());
        }
        if dest == TOKEN_MOUNT {
            return Ok(());
        }
        crate::allow::host_path(&source, dest, read_only, &allow.host_paths, granted)?;
        return Ok(());
    }
    let typ = m.typ().as_deref().unwrap_or("");
    if !OWN_FILESYSTEMS.contains(&typ) {
        return Err(refused(
            format!("it asks for a {typ:?} mount at {dest}"),
            "remove the mount; a Cordon sandbox has its own /proc, /dev, /tmp and /work",
        ));
    }
    Ok(())
}

/// Makes the bundle's root filesystem read-only at its own path in the monitor's mount
/// namespace (the host's view is untouched), after the sandbox's root was bound from it.
/// A caller that copies files into the running container by joining the mount namespace of
/// its process (`podman cp`) then fails at once: its copy would otherwise land in the
/// image's files under the sandbox's own `/work` and `/tmp`, where the workload never sees
/// it, and be reported as done.
pub fn seal_rootfs(rootfs: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    let fail = |e: nix::Error| OciError::io("sealing the bundle's root filesystem", e.into());
    cordon_guest::sys::bind_recursive(rootfs, rootfs).map_err(fail)?;
    mount(
        None::<&str>,
        rootfs,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(fail)
}

/// Gives the calling thread (the monitor's first, whose mount namespace a caller joins to
/// copy files into a running container: `podman cp` copies at the root of
/// `/proc/<pid>/ns/mnt`) a mount namespace of its own whose root is the bundle's root
/// filesystem, read-only ([`seal_rootfs`]): such a copy then meets the image's files and
/// fails to write, instead of landing at that path on the node. The monitor's other threads
/// keep the node's view (a new mount namespace takes the calling thread's file system
/// context with it, nothing more).
pub fn show_callers_only_the_rootfs(rootfs: &Path) -> Result<()> {
    use nix::mount::{MntFlags, umount2};
    let fail = |what: &'static str| {
        move |e: nix::Error| {
            OciError::io(format!("{what} (the callers' view of the root)"), e.into())
        }
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(fail("unshare"))?;
    cordon_guest::sys::make_mounts_private().map_err(fail("making mounts private"))?;
    nix::unistd::chdir(rootfs).map_err(fail("chdir"))?;
    nix::unistd::pivot_root(".", ".").map_err(fail("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(fail("detaching the node's root"))?;
    nix::unistd::chdir("/").map_err(fail("chdir"))?;
    Ok(())
}

/// Whether the namespace at `path` is the host's: the one this runtime runs in (the node's,
/// as the caller sees it) or init's, where it can be read.
pub(crate) fn is_host_namespace(path: &Path, name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let proc_name = match name {
        "network" => "net",
        "mount" => "mnt",
        other => other,
    };
    let Ok(asked) = std::fs::metadata(path) else {
        // A path that cannot be read is not joined either: the sandbox makes its own.
        return false;
    };
    if monitor_pid(path).is_some() {
        // A pod's other containers are told to join its sandbox container's namespaces,
        // by the pid the runtime reported for it: under Cordon that is the pod sandbox's
        // monitor, a host process. Nothing is joined (each container has its own), so
        // this is no request for the host's.
        return false;
    }
    ["self", "1"].iter().any(|who| {
        std::fs::metadata(format!("/proc/{who}/ns/{proc_name}"))
            .is_ok_and(|h| h.ino() == asked.ino() && h.dev() == asked.dev())
    })
}

/// The pid when `path` is `/proc/<pid>/ns/...` of a cordon-oci monitor (this same program).
pub(crate) fn monitor_pid(path: &Path) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let mut parts = path.components().skip(1);
    let (Some(proc_), Some(pid)) = (parts.next(), parts.next()) else {
        return None;
    };
    if proc_.as_os_str() != "proc" {
        return None;
    }
    let pid: i32 = pid.as_os_str().to_str()?.parse().ok()?;
    let same_program = match (
        std::fs::metadata(format!("/proc/{pid}/exe")),
        std::fs::metadata("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    (same_program && cmdline.split(|b| *b == 0).any(|a| a == b"__monitor")).then_some(pid)
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn bad_annotation(key: &str, value: &str, want: &'static str) -> OciError {
    OciError::Annotation {
        key: key.to_string(),
        value: value.to_string(),
        want,
    }
}

/// The Cordon request a bundle makes: its limits (memory, pids, CPU quota), then the
/// `cordon.*` annotations (an annotation and a bundle limit together: the smaller holds).
pub fn request(spec: &Spec) -> Result<SandboxRequest> {
    let annotations = spec.annotations().clone().unwrap_or_default();
    let mut req = SandboxRequest::default();
    let mut limits = LimitsPatch::default();
    if let Some(res) = spec.linux().as_ref().and_then(|l| l.resources().as_ref()) {
        if let Some(m) = res.memory().as_ref().and_then(|m| m.limit())
            && m > 0
        {
            limits.memory_bytes = Some(m as u64);
        }
        if let Some(p) = res.pids().as_ref().map(|p| p.limit())
            && p > 0
        {
            limits.pids = Some(u32::try_from(p).unwrap_or(u32::MAX));
        }
        if let Some(cpu) = res.cpu()
            && let (Some(q), Some(period)) = (cpu.quota(), cpu.period())
            && q > 0
            && period > 0
        {
            limits.cpus = Some(q as f64 / period as f64);
        }
    }
    let min_u64 = |a: Option<u64>, b: u64| Some(a.map_or(b, |a| a.min(b)));
    let mut keys: Vec<&String> = annotations.keys().collect();
    keys.sort();
    for key in keys {
        let value = &annotations[key];
        if !key.starts_with(annotation::PREFIX) {
            continue;
        }
        let size = || {
            cordon_core::units::parse_size(value)
                .map_err(|_| bad_annotation(key, value, "give a size such as 256M or 1G"))
        };
        match key.as_str() {
            annotation::ALLOW_HOSTS => req.allow_hosts = list(value),
            annotation::DENY_HOSTS => req.deny_hosts = list(value),
            annotation::GRANTS => req.grants = list(value).into_iter().map(GrantName).collect(),
            annotation::TIER => {
                let tier = oci_tiers()
                    .into_iter()
                    .find(|t| t.as_str() == value)
                    .ok_or_else(|| {
                        bad_annotation(key, value, "the tier is container, gvisor or microvm")
                    })?;
                req.tier = Some(cordon_policy::TierChoice::Tier(tier));
            }
            annotation::MEMORY => limits.memory_bytes = min_u64(limits.memory_bytes, size()?),
            annotation::DISK => limits.disk_bytes = Some(size()?),
            annotation::TMP => limits.tmp_bytes = Some(size()?),
            annotation::PIDS => {
                let n: u32 = value
                    .parse()
                    .map_err(|_| bad_annotation(key, value, "give a number of processes"))?;
                limits.pids = Some(limits.pids.map_or(n, |p| p.min(n)));
            }
            annotation::CPUS => {
                let n: f64 = value
                    .parse()
                    .ok()
                    .filter(|n: &f64| n.is_finite() && *n > 0.0)
                    .ok_or_else(|| bad_annotation(key, value, "give CPUs such as 0.5 or 2"))?;
                limits.cpus = Some(limits.cpus.map_or(n, |c| c.min(n)));
            }
            _ => {
                return Err(OciError::UnknownAnnotation {
                    key: key.to_string(),
                    known: &annotation::ALL,
                });
            }
        }
    }
    req.limits = limits;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Spec {
        let mut base = serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
            "linux": {"namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"}
            ]}
        });
        merge(&mut base, json);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn refusal(s: &Spec) -> String {
        refusal_under(s, &Allow::default())
    }

    fn refusal_under(s: &Spec, allow: &Allow) -> String {
        match check(s, allow, &Default::default()) {
            Err(OciError::Refused { what, .. }) => what,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn the_process_user_is_kept_but_never_id_0() {
        assert_eq!(ProcessUser::of(0, 0, &[]).unwrap(), None);
        assert_eq!(ProcessUser::of(0, 5, &[6]).unwrap(), None);
        let u = ProcessUser::of(1234, 0, &[0, 3456, 3456, 1000])
            .unwrap()
            .unwrap();
        assert_eq!((u.uid, u.gid, u.groups), (1234, SANDBOX_ID, vec![3456]));
        let u = ProcessUser::of(7, 8, &[8, 9]).unwrap().unwrap();
        assert_eq!(u.groups, vec![9]);
        for (uid, gid, groups) in [(70000, 1, vec![]), (1, 70000, vec![]), (1, 1, vec![65536])] {
            let e = ProcessUser::of(uid, gid, &groups).unwrap_err().to_string();
            assert!(e.contains("outside the sandbox's ids"), "{e}");
        }
    }

    #[test]
    fn a_plain_bundle_passes() {
        check(
            &spec(serde_json::json!({})),
            &Allow::default(),
            &Default::default(),
        )
        .unwrap();
    }

    #[test]
    fn host_namespaces_are_refused() {
        let s = spec(serde_json::json!({"linux": {"namespaces": [
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}
        ]}}));
        assert!(refusal(&s).contains("network"));
        let s = spec(serde_json::json!({"linux": {"namespaces": [
            {"type": "pid", "path": "/proc/self/ns/pid"}, {"type": "network"}, {"type": "ipc"},
            {"type": "uts"}, {"type": "mount"}
        ]}}));
        assert!(refusal(&s).contains("join the host's pid"));
    }

    #[test]
    fn privileged_devices_and_host_paths_are_refused() {
        let s =
            spec(serde_json::json!({"process": {"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}}));
        assert!(refusal(&s).contains("privileged"));
        let s =
            spec(serde_json::json!({"annotations": {"io.podman.annotations.privileged": "TRUE"}}));
        assert!(refusal(&s).contains("privileged"));
        let s = spec(serde_json::json!({"linux": {"devices": [
            {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}
        ]}}));
        assert!(refusal(&s).contains("host device"));
        let s = spec(serde_json::json!({"mounts": [
            {"destination": "/data", "type": "bind", "source": "/", "options": ["rbind"]}
        ]}));
        assert!(refusal(&s).contains("/data"));
        // The engine's own files are not mounted, and not refused.
        let s = spec(serde_json::json!({"mounts": [
            {"destination": "/etc/hosts", "type": "bind", "source": "/x/hosts", "options": ["bind"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]}));
        check(&s, &Allow::default(), &Default::default()).unwrap();
    }

    /// Each allowance admits exactly what it names: the refused request passes once the
    /// node names it, and a near miss (another capability, namespace, device, number, path,
    /// place, a writable bind of a read-only entry, a `..` or a symbolic link) stays refused.
    #[test]
    fn node_allowances_admit_exactly_what_they_name() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("link")).unwrap();
        // A device every Linux host has, by its real numbers here.
        let null = std::fs::metadata("/dev/kmsg").unwrap().rdev();
        let (major, minor) = (
            nix::sys::stat::major(null) as i64,
            nix::sys::stat::minor(null) as i64,
        );
        let allow = crate::node::NodeConfig::parse(&format!(
            "[allow]\ncapabilities = [\"SYS_PTRACE\"]\nnamespaces = [\"uts\"]\n\
             [[allow.device]]\npath = \"/dev/kmsg\"\ntype = \"c\"\nmajor = {major}\nminor = {minor}\n\
             [[allow.device]]\npath = \"/dev/mem\"\ntype = \"c\"\nmajor = {major}\nminor = {}\n\
             [[allow.host_path]]\npath = \"{d}\"\nat = \"/work/data\"\n\
             [[allow.host_path]]\npath = \"{l}\"\nat = \"/work/link\"\n",
            minor + 100,
            d = data.display(),
            l = dir.path().join("link").display(),
        ))
        .unwrap()
        .allow;
        let caps =
            |c: &str| spec(serde_json::json!({"process": {"capabilities": {"bounding": [c]}}}));
        assert!(refusal(&caps("CAP_SYS_PTRACE")).contains("SYS_PTRACE"));
        let g = check(&caps("CAP_SYS_PTRACE"), &allow, &Default::default()).unwrap();
        assert_eq!(
            g.record,
            vec![NodeAllowance::Capability {
                name: "CAP_SYS_PTRACE".into()
            }]
        );
        assert!(refusal_under(&caps("CAP_SYS_ADMIN"), &allow).contains("SYS_ADMIN"));
        let without = |kind: &str| {
            let all = ["pid", "network", "ipc", "uts", "mount"];
            let ns: Vec<_> = all
                .iter()
                .filter(|k| **k != kind)
                .map(|k| serde_json::json!({"type": k}))
                .collect();
            spec(serde_json::json!({"linux": {"namespaces": ns}}))
        };
        assert!(refusal(&without("uts")).contains("host's uts"));
        let g = check(&without("uts"), &allow, &Default::default()).unwrap();
        assert_eq!(
            g.record,
            vec![NodeAllowance::HostNamespace {
                namespace: "uts".into()
            }]
        );
        assert!(refusal_under(&without("network"), &allow).contains("host's network"));
        let device = |path: &str, minor: i64| {
            spec(serde_json::json!({"linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                               {"type": "uts"}, {"type": "mount"}],
                "devices": [{"path": path, "type": "c", "major": major, "minor": minor}]
            }}))
        };
        let g = check(&device("/dev/kmsg", minor), &allow, &Default::default()).unwrap();
        assert_eq!(g.devices, vec!["kmsg".to_string()]);
        // Another device, other numbers, and an entry the host's node does not match.
        assert!(refusal_under(&device("/dev/full", minor), &allow).contains("/dev/full"));
        assert!(refusal_under(&device("/dev/kmsg", minor + 1), &allow).contains("/dev/kmsg"));
        assert!(
            refusal_under(&device("/dev/mem", minor + 100), &allow)
                .contains("not that device on this node")
        );
        let bind = |source: &str, dest: &str, ro: bool| {
            let mut options = vec!["rbind"];
            if ro {
                options.push("ro");
            }
            spec(serde_json::json!({"mounts": [
                {"destination": dest, "type": "bind", "source": source, "options": options}
            ]}))
        };
        let d = data.display().to_string();
        assert!(refusal(&bind(&d, "/work/data", true)).contains("host path at /work/data"));
        let g = check(&bind(&d, "/work/data", true), &allow, &Default::default()).unwrap();
        assert_eq!(g.host_paths.len(), 1);
        assert_eq!(
            g.record,
            vec![NodeAllowance::HostPath {
                path: d.clone(),
                at: "/work/data".into(),
                writable: false
            }]
        );
        for (source, dest, ro, says) in [
            (d.clone(), "/work/other", true, "host path at /work/other"),
            (
                d.clone(),
                "/work/data",
                false,
                "the node allows it read-only",
            ),
            (
                format!("{d}/../data"),
                "/work/data",
                true,
                "not a plain absolute path",
            ),
            (
                dir.path().join("link").display().to_string(),
                "/work/link",
                true,
                "symbolic link",
            ),
        ] {
            let r = refusal_under(&bind(&source, dest, ro), &allow);
            assert!(r.contains(says), "{source} at {dest}: {r}");
        }
    }

    /// What no node config can allow is refused when the config is read, with the reason.
    #[test]
    fn what_cannot_be_made_safe_cannot_be_allowed() {
        for (body, says) in [
            ("[allow]\nnamespaces = [\"pid\"]\n", "hostPID"),
            ("[allow]\nnamespaces = [\"mount\"]\n", "host's mounts"),
            (
                "[allow]\ncapabilities = [\"SYS_MODULE\"]\n",
                "host's kernel",
            ),
            (
                "[allow]\ncapabilities = [\"NET_ADMIN\"]\n",
                "without an entry",
            ),
            (
                "[[allow.device]]\npath = \"/etc/passwd\"\ntype = \"c\"\nmajor = 1\nminor = 3\n",
                "under /dev",
            ),
            (
                "[[allow.device]]\npath = \"/dev/x\"\ntype = \"p\"\nmajor = 1\nminor = 3\n",
                "type is c",
            ),
            (
                "[[allow.device]]\npath = \"/dev/pts/0\"\ntype = \"c\"\nmajor = 136\nminor = 0\n",
                "has its own",
            ),
            (
                "[[allow.host_path]]\npath = \"/srv/../etc\"\nat = \"/work/x\"\n",
                "plain absolute path",
            ),
            (
                "[[allow.host_path]]\npath = \"/srv/x\"\nat = \"/etc\"\n",
                "under /work",
            ),
            ("[allow]\nprivileged = true\n", "unknown field"),
        ] {
            let e = crate::node::NodeConfig::parse(body)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn limits_come_from_the_bundle_then_the_annotations() {
        let s = spec(serde_json::json!({
            "linux": {"resources": {"memory": {"limit": 67108864}, "pids": {"limit": 50}}},
            "annotations": {"cordon.memory": "32M", "cordon.disk": "8M",
                            "cordon.allow-hosts": "a.example, b.example", "other": "x"}
        }));
        let r = request(&s).unwrap();
        assert_eq!(r.limits.memory_bytes, Some(32 << 20));
        assert_eq!(r.limits.pids, Some(50));
        assert_eq!(r.limits.disk_bytes, Some(8 << 20));
        assert_eq!(r.allow_hosts, vec!["a.example", "b.example"]);
        for (tier, want) in [
            ("container", cordon_core::Tier::Container),
            ("gvisor", cordon_core::Tier::Gvisor),
            ("microvm", cordon_core::Tier::Microvm),
        ] {
            let s = spec(serde_json::json!({"annotations": {"cordon.tier": tier}}));
            assert_eq!(
                request(&s).unwrap().tier,
                Some(cordon_policy::TierChoice::Tier(want))
            );
        }
        for other in ["wasm", "runtime", "auto", "GVISOR"] {
            let s = spec(serde_json::json!({"annotations": {"cordon.tier": other}}));
            let e = request(&s).unwrap_err().to_string();
            assert!(e.contains("container, gvisor or microvm"), "{other}: {e}");
        }
        let s = spec(serde_json::json!({"annotations": {"cordon.memroy": "1G"}}));
        assert!(
            request(&s)
                .unwrap_err()
                .to_string()
                .contains("unknown annotation")
        );
    }
}
