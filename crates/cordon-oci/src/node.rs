//! The node's Cordon config for `cordon-oci`: whose ceiling a container runs under, the
//! grant catalogue it may name, and the default and largest limits. Read from
//! `--cordon-config`, else `$CORDON_OCI_CONFIG`, else `/etc/cordon/oci.toml` when it exists;
//! with no file, every default of the gate holds (the container tier, no private ranges, no
//! grants).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_core::Tier;
use cordon_engine::{CeilingConfig, Gate, GateSettings, RulesSource, TenantRules};
use cordon_tiers::Tiers;
use oci_spec::runtime::{Capability, LinuxDeviceType};
use serde::Deserialize;

pub use crate::error::ConfigError;
use crate::{OciError, Result};

/// Where the node's config is read from when nothing names one.
pub const DEFAULT_PATH: &str = "/etc/cordon/oci.toml";

/// Where the node's audit store is kept when the config names none: every gate decision on a
/// container is one row there (`cordon audit --data-dir /var/lib/cordon/oci`).
pub const DEFAULT_AUDIT: &str = "/var/lib/cordon/oci/audit.db";

/// The principal every container is admitted as (its ceiling is `[ceiling]`).
pub const TENANT: &str = "oci";

/// The file's contents.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The ceiling of every container on this node: trust (default `trusted` here: see
    /// `ceiling_config`), tiers, egress ceiling, the walls it may run without (cordon.toml's
    /// tenant rules).
    pub ceiling: TenantRules,
    /// The operator's grant catalogue (cordon.toml's `[[grant]]` entries); a container names
    /// grants of it by the `cordon.grants` annotation.
    #[serde(rename = "grant")]
    pub grants: Vec<cordon_engine::GrantEntry>,
    /// Limits a container gets where neither its bundle nor its annotations set one.
    pub default_limits: Option<cordon_engine::LimitsPatch>,
    /// The largest limits a container may have.
    pub max_limits: Option<cordon_engine::LimitsPatch>,
    /// The node's audit store (default [`DEFAULT_AUDIT`]).
    pub audit: Option<PathBuf>,
    /// The tier a container runs on when its annotations name none (default
    /// `container`); `[ceiling] tiers` says which tiers a container may ask for.
    pub tier: Option<cordon_core::Tier>,
    /// What a container may ask for that Cordon refuses by default, each entry one exact
    /// thing.
    pub allow: Allow,
    /// The kubelet of this node, whose pod volumes a pod's containers get.
    pub kubelet: Kubelet,
}

/// The node's kubelet (`[kubelet]`): a pod's volumes are bind mounts from the kubelet's own
/// directory of that pod (`<root_dir>/pods/<pod uid>/`: the projected service-account
/// token, `emptyDir`, `configMap`, `secret`, `downwardAPI`), accepted as they are (read-only
/// where the pod says so, each directory opened without following a symbolic link). Any
/// other host path (a `hostPath` volume, another pod's directory) is refused unless
/// `[allow]` names it. Without `root_dir`, every pod volume is a host path.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Kubelet {
    /// The kubelet's `--root-dir` (its default: `/var/lib/kubelet`), by its plain absolute
    /// path with no symbolic link in it.
    pub root_dir: Option<PathBuf>,
}

/// The node's allowances (`[allow]`): each entry names one exact thing a bundle may ask for
/// that cordon-oci otherwise refuses. Privileged mode, the host's PID and mount namespaces
/// and the capabilities that act on the host's kernel are never allowed (see
/// docs/kubernetes.md). Every allowance a container uses is marked on the gate's decision
/// in the node's audit store.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Allow {
    /// Privileged capabilities (`SYS_ADMIN`, `SYS_PTRACE`) a bundle may list without being
    /// refused. The program still holds no capability: Cordon never gives one, on the host
    /// or in the workload's own user namespace.
    pub capabilities: Vec<Capability>,
    /// Host namespaces (`uts`, `ipc`, `network`) a bundle may ask for (podman's `--uts
    /// host`, a pod's `hostNetwork`) without being refused: the workload runs in its own
    /// namespace of that kind all the same, never the host's.
    pub namespaces: Vec<NamespaceKind>,
    /// Host devices, each by its path, type and numbers.
    #[serde(rename = "device")]
    pub devices: Vec<DeviceAllow>,
    /// Host directories, each bound at one place under `/work`.
    #[serde(rename = "host_path")]
    pub host_paths: Vec<HostPathAllow>,
    /// Node directories a bundle may name as its root filesystem (`root.path`, podman's and
    /// ctr's `--rootfs`), each by its plain absolute path. Any other root must be the
    /// engine's own (an overlay mount of its storage). The directory's root-owned files
    /// stay root's (never the workload's user's, even with a writable root).
    pub rootfs: Vec<PathBuf>,
}

/// A namespace kind a bundle may ask to share with the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceKind {
    Uts,
    Ipc,
    Network,
    Pid,
    Mount,
}

impl NamespaceKind {
    /// Its name in OCI's `linux.namespaces`.
    pub fn name(self) -> &'static str {
        match self {
            NamespaceKind::Uts => "uts",
            NamespaceKind::Ipc => "ipc",
            NamespaceKind::Network => "network",
            NamespaceKind::Pid => "pid",
            NamespaceKind::Mount => "mount",
        }
    }
}

/// A host device a container may have: the node at `path` on the host, of `type` (`c` or
/// `b`) and numbers `major`:`minor`, bound at the same path in the sandbox's `/dev`. A
/// bundle's device entry must match all four, and so must the host's node when the
/// container is created.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceAllow {
    pub path: PathBuf,
    #[serde(rename = "type")]
    pub typ: LinuxDeviceType,
    pub major: i64,
    pub minor: i64,
}

/// A host directory a container may have bound: the directory `path` on the host (no
/// symbolic link anywhere in it), at `at` under `/work` in the sandbox, read-only unless
/// `writable`. A bundle's bind mount must name both exactly (and ask read-only unless the
/// entry is writable).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPathAllow {
    pub path: PathBuf,
    pub at: String,
    #[serde(default)]
    pub writable: bool,
}

/// Capabilities whose request means privileged mode: refused (unless the node's config
/// names them) even though no capability reaches the workload, so a bundle that depends on
/// them fails at create, not later.
pub const PRIVILEGED_CAPS: [Capability; 4] = [
    Capability::SysAdmin,
    Capability::SysModule,
    Capability::SysRawio,
    Capability::SysPtrace,
];

/// Capabilities that act on the host's kernel or hardware whatever namespace holds them:
/// no node config allows them.
const HOST_CAPS: [Capability; 4] = [
    Capability::SysModule,
    Capability::SysRawio,
    Capability::SysBoot,
    Capability::SysTime,
];

/// What the sandbox's `/dev` has of its own: no allowance names them.
const SANDBOX_DEV: [&str; 13] = [
    "null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr", "ptmx",
    "pts", "shm",
];

/// Whether `p` is absolute with plain components only (no `.`, `..`, empty or trailing
/// ones): the form every path of an allowance and of a bundle's request must have.
pub fn plain_absolute(p: &Path) -> bool {
    use std::path::Component;
    let text = p.to_string_lossy();
    p.is_absolute()
        && text.len() > 1
        && !text.contains("//")
        && !text.ends_with('/')
        && p.components()
            .skip(1)
            .all(|c| matches!(c, Component::Normal(_)))
}

impl Allow {
    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let bad = |entry: String, why: &str| {
            Err(ConfigError::Allow {
                entry,
                why: why.to_string(),
            })
        };
        for c in &self.capabilities {
            if HOST_CAPS.contains(c) {
                return bad(
                    format!("capability {c}"),
                    "it acts on the host's kernel or hardware whatever namespace holds it; \
                     a container that needs it runs on runc, not behind Cordon",
                );
            }
            if !PRIVILEGED_CAPS.contains(c) {
                return bad(
                    format!("capability {c}"),
                    "cordon-oci refuses only SYS_ADMIN and SYS_PTRACE among the capabilities \
                     a node may allow; any other is accepted without an entry (and not given)",
                );
            }
        }
        for n in &self.namespaces {
            let why = match n {
                NamespaceKind::Pid => {
                    "the host's processes would be visible to the workload and signalled by \
                     it; a pod with hostPID runs on runc, not behind Cordon"
                }
                NamespaceKind::Mount => {
                    "the host's mounts would be the workload's; a container that needs them \
                     runs on runc, not behind Cordon"
                }
                _ => continue,
            };
            return bad(format!("namespace {}", n.name()), why);
        }
        for d in &self.devices {
            let entry = format!("device {}", d.path.display());
            if !plain_absolute(&d.path)
                || !d.path.starts_with("/dev")
                || d.path == Path::new("/dev")
            {
                return bad(
                    entry,
                    "name the device by its plain absolute path under /dev",
                );
            }
            let name = d.path.strip_prefix("/dev").unwrap_or(&d.path);
            let first = name.iter().next().and_then(|c| c.to_str()).unwrap_or("");
            if SANDBOX_DEV.contains(&first) {
                return bad(
                    entry,
                    "the sandbox has its own (null, zero, full, random, urandom, tty, its \
                     terminals and shared memory); name another device",
                );
            }
            if !matches!(d.typ, LinuxDeviceType::C | LinuxDeviceType::B) {
                return bad(entry, "its type is c (character) or b (block)");
            }
            if d.major < 0 || d.minor < 0 {
                return bad(entry, "its major and minor numbers are not negative");
            }
        }
        if self.host_paths.len() > cordon_core::MAX_MOUNTS {
            return bad(
                "host_path".into(),
                "at most 8 host paths (a sandbox's mounts under /work)",
            );
        }
        for r in &self.rootfs {
            if !plain_absolute(r) {
                return bad(
                    format!("rootfs {}", r.display()),
                    "name the directory by its plain absolute path (no '.', '..' or trailing '/')",
                );
            }
        }
        for h in &self.host_paths {
            let entry = format!("host_path {}", h.path.display());
            if !plain_absolute(&h.path) {
                return bad(
                    entry,
                    "name the directory by its plain absolute path (no '.', '..' or trailing '/')",
                );
            }
            if let Err(e) = cordon_core::validate_volume_path(&h.at) {
                return bad(entry, &format!("its `at`: {e}"));
            }
        }
        Ok(())
    }
}

impl NodeConfig {
    /// The config named by `flag`, else `$CORDON_OCI_CONFIG`, else [`DEFAULT_PATH`] if it
    /// exists, else the defaults.
    pub fn load(flag: Option<&Path>) -> Result<Self> {
        let named = flag
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("CORDON_OCI_CONFIG").map(PathBuf::from));
        let path = match named {
            Some(p) => p,
            None if Path::new(DEFAULT_PATH).is_file() => PathBuf::from(DEFAULT_PATH),
            None => return Ok(NodeConfig::default()),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            OciError::io(
                format!("reading the node's Cordon config {}", path.display()),
                e,
            )
        })?;
        Ok(Self::parse(&text)?)
    }

    /// The config in `text`, every entry checked.
    pub fn parse(text: &str) -> std::result::Result<Self, ConfigError> {
        // The ceiling's entries (egress patterns, tiers) are checked as they are read.
        let cfg: NodeConfig = toml::from_str(text)?;
        cfg.allow.validate()?;
        if let Some(r) = &cfg.kubelet.root_dir
            && (!plain_absolute(r) || r == Path::new("/"))
        {
            return Err(ConfigError::Allow {
                entry: format!("kubelet root_dir {}", r.display()),
                why: "name the kubelet's --root-dir by its plain absolute path (no '.', '..' \
                      or trailing '/')"
                    .into(),
            });
        }
        if let Some(t) = cfg.tier
            && !t.features().oci
        {
            return Err(ConfigError::Allow {
                entry: format!("tier = \"{t}\""),
                why: "cordon-oci runs the container, gvisor and microvm tiers".into(),
            });
        }
        Ok(cfg)
    }

    fn ceiling_config(&self) -> CeilingConfig {
        let mut c = CeilingConfig::default();
        let mut rules = self.ceiling.clone();
        // The node's operator chose this runtime for the pods that name it: its workloads
        // are trusted unless the config says `trust = "untrusted"`, which then refuses the
        // container tier (the policy wants a kernel boundary for untrusted code) and admits
        // gvisor and microvm.
        rules.trust.get_or_insert(cordon_policy::Trust::Trusted);
        c.tenants.insert(TENANT.to_string(), rules);
        c
    }

    /// The gate a container that names no tier is admitted by.
    pub fn gate(&self) -> Result<Gate> {
        self.gate_for(None)
    }

    /// The gate a container is admitted by, which chooses its tier: the one it `asked`
    /// for (its `cordon.tier`), else the node's `tier`, else the gate's default, as the
    /// ceiling and the policy allow. The tier it would take is probed (a tier without a
    /// kernel of its own is open on every node); when the node cannot run it, the gate
    /// refuses it with the reason.
    pub fn gate_for(&self, asked: Option<cordon_core::Tier>) -> Result<Gate> {
        let catalogue =
            cordon_engine::Catalogue::load(&self.grants, None).map_err(ConfigError::Catalogue)?;
        let mut settings = GateSettings::default();
        if let Some(t) = self.tier {
            settings.default_tier = t;
        }
        let (available, unavailable) = availability(asked.unwrap_or(settings.default_tier));
        if let Some(d) = &self.default_limits {
            settings.default_limits = d.apply(&settings.default_limits);
        }
        if let Some(m) = &self.max_limits {
            settings.max_limits = m.apply(&settings.max_limits);
        }
        Ok(Gate::new(
            settings,
            self.ceiling_config(),
            Arc::new(catalogue),
            RulesSource::Shipped,
            None,
        )
        .with_tiers(available, unavailable))
    }
}

/// The tiers this node can run for a bundle the gate would put on `wanted` (the tier it
/// names, else the node's default): `wanted` alone, when it has no kernel of its own (it
/// needs what cordon-oci itself needs: root and the host's namespaces) or its probe says
/// so (else its reason, which the gate gives back in its refusal). No other tier is open,
/// so the gate never falls back to a tier the bundle and the node did not name.
pub fn availability(wanted: Tier) -> (BTreeSet<Tier>, Vec<(Tier, String)>) {
    let mut available = BTreeSet::new();
    let mut unavailable = Vec::new();
    let probe = if wanted.features().own_kernel {
        Some(Tiers.probe(wanted))
    } else {
        available.insert(wanted);
        None
    };
    if let Some(p) = probe {
        if p.available() {
            available.insert(wanted);
        } else {
            let why: Vec<String> = p
                .capabilities
                .iter()
                .filter(|c| !c.ok && c.required)
                .map(|c| match &c.fix {
                    Some(fix) => format!("{} is missing ({fix})", c.name),
                    None => format!("{} is missing", c.name),
                })
                .collect();
            unavailable.push((
                wanted,
                format!("this node cannot run it: {}", why.join("; ")),
            ));
        }
    }
    (available, unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in docs/kubernetes.md is a config this parser takes.
    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../../docs/kubernetes.md");
        let start = doc.find("```toml\ntier = ").expect("the example") + "```toml\n".len();
        let body = &doc[start..];
        let body = &body[..body.find("```").expect("its end")];
        let cfg = NodeConfig::parse(body).unwrap();
        assert_eq!(cfg.grants.len(), 1);
        assert_eq!(cfg.tier, Some(cordon_core::Tier::Container));
        cfg.gate().unwrap();
        let start = doc.find("```toml\n[allow]").expect("the allowances") + "```toml\n".len();
        let body = &doc[start..];
        let body = &body[..body.find("```").expect("its end")];
        let allow = NodeConfig::parse(body).unwrap().allow;
        assert_eq!((allow.devices.len(), allow.host_paths.len()), (1, 1));
    }

    #[test]
    fn every_gate_decision_is_a_row_in_the_nodes_audit_store() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeConfig {
            audit: Some(dir.path().join("a/audit.db")),
            ..NodeConfig::parse("[ceiling]\ntrust = \"untrusted\"\n").unwrap()
        };
        let who = cordon_engine::Principal::Tenant(TENANT.into());
        let gate = node.gate().unwrap();
        let denied = gate.admit(&who, &cordon_engine::SandboxRequest::default(), "t");
        assert!(denied.is_err());
        crate::audit::record_decision(&node, "ctr-1", &denied).unwrap();
        let allowed = NodeConfig::default().gate().unwrap().admit(
            &who,
            &cordon_engine::SandboxRequest::default(),
            "t",
        );
        crate::audit::record_decision(&node, "ctr-2", &allowed).unwrap();
        let store = cordon_engine::audit::Audit::open(&dir.path().join("a/audit.db")).unwrap();
        let rows = store
            .query(None, &cordon_engine::audit::Query::default())
            .unwrap();
        let seen: Vec<(Option<&str>, Option<&str>, &str)> = rows
            .iter()
            .map(|r| (r.sandbox.as_deref(), r.decision.as_deref(), r.kind.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (Some("ctr-1"), Some("deny"), "policy"),
                (Some("ctr-2"), Some("allow"), "policy")
            ]
        );
        assert!(rows.iter().all(|r| r.tenant.as_deref() == Some(TENANT)));
    }

    /// The gate chooses the tier: the annotation's, else the node's `tier` (the gate's
    /// default), else the container tier; a node default cordon-oci does not run is refused
    /// when read.
    #[test]
    fn the_gate_chooses_the_annotations_tier_then_the_nodes() {
        use cordon_core::Tier;
        let who = cordon_engine::Principal::Tenant(TENANT.into());
        let plain = cordon_engine::SandboxRequest::default();
        let default = NodeConfig::default();
        let gvisor = NodeConfig::parse("tier = \"gvisor\"\n").unwrap();
        assert_eq!(
            default.gate().unwrap().settings().default_tier,
            Tier::Container
        );
        assert_eq!(gvisor.gate().unwrap().settings().default_tier, Tier::Gvisor);
        let chosen = default.gate().unwrap().admit(&who, &plain, "t").unwrap();
        assert_eq!(chosen.spec.tier, Tier::Container);
        // A node whose default is gvisor, asked for the container tier: the gate gives it.
        let asks = cordon_engine::SandboxRequest {
            tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
            ..Default::default()
        };
        let chosen = gvisor.gate_for(Some(Tier::Container)).unwrap();
        assert_eq!(
            chosen.admit(&who, &asks, "t").unwrap().spec.tier,
            Tier::Container
        );
        let e = NodeConfig::parse("tier = \"wasm\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("container, gvisor and microvm"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(NodeConfig::parse("privileged = true\n").is_err());
        assert!(NodeConfig::parse("[ceiling]\nallow_privileged = true\n").is_err());
    }

    /// A config that does not parse, or whose ceiling is bad (refused as it is read), keeps
    /// the error that says why as its source.
    #[test]
    fn config_errors_keep_their_source() {
        use std::error::Error as _;
        let e = NodeConfig::parse("[ceiling\n").unwrap_err();
        assert!(matches!(e, ConfigError::Toml(_)), "{e:?}");
        assert!(e.source().is_some_and(|s| s.is::<toml::de::Error>()));
        let e = NodeConfig::parse("[ceiling]\negress = [\"10.0.0.0/33\"]\n").unwrap_err();
        assert!(matches!(e, ConfigError::Toml(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("egress rule \"10.0.0.0/33\" is not valid"),
            "{e}"
        );
        let wrapped = OciError::from(e);
        assert!(wrapped.source().is_some(), "{wrapped:?}");
    }

    #[test]
    fn an_untrusted_node_refuses_the_container_tier_and_a_default_node_admits_it() {
        let req = cordon_engine::SandboxRequest::default();
        let who = cordon_engine::Principal::Tenant(TENANT.into());
        let default = NodeConfig::default().gate().unwrap();
        assert_eq!(
            default.admit(&who, &req, "t").unwrap().spec.tier,
            cordon_core::Tier::Container
        );
        let untrusted = NodeConfig::parse("[ceiling]\ntrust = \"untrusted\"\n").unwrap();
        assert!(untrusted.gate().unwrap().admit(&who, &req, "t").is_err());
    }
}
