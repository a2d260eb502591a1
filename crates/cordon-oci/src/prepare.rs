//! How a bundle becomes a running sandbox, as a pipeline of types: each stage is made only
//! by the one before it, so nothing mounts what was not admitted and nothing runs what was
//! not mounted.
//!
//! [`Loaded`] (the bundle's `config.json` and its process) → [`Checked`] (the bundle's
//! asks checked against the node's allowances, its root filesystem checked, a refusal
//! recorded) → [`Admitted`] (the gate chose the tier and the limits, its decision recorded,
//! the tier's own facts checked) → [`Mounted`] (the root bound in the monitor's mount
//! namespace, writable or with mount points as the tier's [`cordon_core::Features`] say,
//! host directories bound) → [`Prepared`] (the sandbox made, its terminal, its record).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use cordon_core::{Feature, PtySize, Sandbox, SandboxSpec};
use cordon_engine::Principal;

use crate::allow::{CheckedRoot, Granted};
use crate::audit::{Audited, NodeAudit};
use crate::bundle::{self, ProcessSpec};
use crate::node::NodeConfig;
use crate::state::{Record, Root, Status};
use crate::{OciError, Result};

/// Where the bundle's root filesystem is bound, in the monitor's own mount namespace: a
/// tmpfs of its own over this (empty) directory, whose parents the sandbox's ids can pass
/// whatever the modes above the engine's state directory (containerd's are 0700). The host
/// sees only the empty directory.
pub const ROOTS_AT: &str = "/run/cordon-oci-roots";

/// What the monitor is started with.
pub struct Setup {
    pub root: Root,
    pub id: String,
    pub bundle: PathBuf,
    pub node: NodeConfig,
    /// The engine's console socket, connected by `create` (`--console-socket`): a process
    /// with a terminal gets its master there.
    pub console: Option<OwnedFd>,
}

/// Where a writable root's writes go (docs/adr/0023-oci-writable-root.md).
const UPPER: crate::rootfs::Upper = crate::rootfs::Upper::Disk;

/// The terminal size a process gets when its bundle names none.
pub(crate) const DEFAULT_CONSOLE: PtySize = PtySize { rows: 24, cols: 80 };

/// What [`prepare`] made: the sandbox, the container's process, its record and, for a
/// process with a terminal, the terminal's slave (its master went to the console socket).
pub struct Prepared {
    pub sandbox: Audited,
    pub process: ProcessSpec,
    pub record: Record,
    pub terminal: Option<OwnedFd>,
}

/// Makes the sandbox for the bundle and, for a process with a terminal, the terminal
/// (its master sent to the console socket). Errors are the caller's to report (`create`
/// prints them); nothing is left running.
pub fn prepare(setup: Setup) -> Result<Prepared> {
    Loaded::load(setup)?.check()?.admit()?.mount()?.start()
}

/// The bundle's config and its process, read.
pub struct Loaded {
    setup: Setup,
    spec: oci_spec::runtime::Spec,
    process: ProcessSpec,
}

impl Loaded {
    /// Reads the bundle's `config.json` and its process (a terminal only with a console
    /// socket to send it to).
    pub fn load(setup: Setup) -> Result<Self> {
        let spec = bundle::load(&setup.bundle)?;
        let process = ProcessSpec::from_oci(spec.process().as_ref().ok_or_else(|| {
            OciError::Invalid(
                "the bundle's config.json has no process; name the program to run".into(),
            )
        })?)?;
        if process.terminal && setup.console.is_none() {
            return Err(OciError::Invalid(
                "the process asks for a terminal but no --console-socket was given; give one \
                 (the engine's), or run the process without a terminal"
                    .into(),
            ));
        }
        Ok(Loaded {
            setup,
            spec,
            process,
        })
    }

    /// The bundle checked ([`bundle::check`]), read into a request, and its root filesystem
    /// checked ([`crate::allow::root`]). A refusal is recorded in the node's audit store,
    /// as the gate's are, before it is returned.
    pub fn check(self) -> Result<Checked> {
        let Loaded {
            setup,
            spec,
            process,
        } = self;
        let all = bundle::check(&spec, &setup.node.allow, &setup.node.kubelet).and_then(|mut g| {
            let req = bundle::request(&spec)?;
            let root = crate::allow::root(
                &bundle::rootfs(&spec, &setup.bundle)?,
                &setup.node.allow.rootfs,
                crate::rootfs::asked(&spec),
                &mut g,
            )?;
            Ok((g, req, root))
        });
        match all {
            Ok((granted, req, root)) => Ok(Checked {
                loaded: Loaded {
                    setup,
                    spec,
                    process,
                },
                granted,
                req,
                root,
            }),
            Err(e) => {
                let asked = bundle::request(&spec).unwrap_or_default();
                crate::audit::record_refusal(&setup.node, &setup.id, &asked, &e)?;
                Err(e)
            }
        }
    }
}

/// A bundle whose asks the node allows, read into a Cordon request.
pub struct Checked {
    loaded: Loaded,
    granted: Granted,
    req: cordon_engine::SandboxRequest,
    /// The directory checked, every link on the way resolved.
    root: CheckedRoot,
}

impl Checked {
    /// Admits the request through the node's gate, which chooses the tier (the bundle's
    /// `cordon.tier`, else the node's `tier`, as the policy allows) and the limits; the
    /// decision is recorded before anything runs (one that cannot be recorded stops the
    /// container). Then what the chosen tier cannot do is refused.
    pub fn admit(self) -> Result<Admitted> {
        let Checked {
            loaded,
            granted,
            req,
            root,
        } = self;
        let node = &loaded.setup.node;
        let asked = match req.tier {
            Some(cordon_policy::TierChoice::Tier(t)) => Some(t),
            _ => None,
        };
        let gate = node.gate_for(asked)?;
        let mut decided = gate.admit(
            &Principal::Tenant(crate::node::TENANT.into()),
            &req,
            "oci create",
        );
        // The node's allowances the bundle uses, marked on the decision.
        match &mut decided {
            Ok(a) => a.record.node_allowances = granted.record.clone(),
            Err(d) => d.record.node_allowances = granted.record.clone(),
        }
        let audit = crate::audit::record_decision(node, &loaded.setup.id, &decided)?;
        let admitted = decided.map_err(|d| OciError::Refused {
            what: format!("{} (rule {})", d.message, d.rule),
            fix: d.fix.clone(),
        })?;
        let spec = admitted.spec;
        let features = spec.tier.features();
        for (asks, feature, what) in [
            (
                !granted.host_paths.is_empty(),
                Feature::HostPaths,
                "a host path or a pod volume",
            ),
            (
                !granted.devices.is_empty(),
                Feature::HostDevices,
                "a host device",
            ),
        ] {
            if asks && !features.has(feature) {
                return Err(OciError::Refused {
                    what: format!("it asks for {what} on the {} tier", spec.tier),
                    fix: format!(
                        "{} (the node's [allow] entries are for them), or run it without the mount or device",
                        feature.fix()
                    ),
                });
            }
        }
        Ok(Admitted {
            loaded,
            granted,
            root,
            spec,
            audit,
        })
    }
}

/// A bundle the gate admitted, on the tier it chose.
pub struct Admitted {
    loaded: Loaded,
    granted: Granted,
    root: CheckedRoot,
    spec: SandboxSpec,
    audit: NodeAudit,
}

impl Admitted {
    /// Binds the bundle's root in the monitor's own mount namespace as the tier takes it:
    /// writable (`root.readonly: false`, where the tier has a writable root: its writes in
    /// a layer of its own; the other tiers keep it read-only), with the tier's mount points
    /// layered over it where the tier needs them; then the host directories the node
    /// allowed.
    pub fn mount(self) -> Result<Mounted> {
        let Admitted {
            loaded,
            granted,
            root,
            mut spec,
            audit,
        } = self;
        let features = spec.tier.features();
        let mut mount_at = bind_rootfs(&root)?;
        let writable = (features.writable_root && crate::rootfs::asked(&loaded.spec))
            .then(|| {
                let size = spec.limits.disk_bytes;
                // A node directory's root-owned files stay root's (never the workload's).
                let owners = if root.node_dir {
                    crate::rootfs::Owners::Node
                } else {
                    crate::rootfs::Owners::Image
                };
                let id = &loaded.setup.id;
                crate::rootfs::mount(&root.path, Path::new(ROOTS_AT), id, size, UPPER, owners)
            })
            .transpose()?;
        bundle::seal_rootfs(&root.path)?;
        let base = Path::new(ROOTS_AT);
        spec.host_binds = crate::allow::bind_host_paths(granted.host_paths, base, &root.path)?;
        if features.root_mount_points {
            let targets: Vec<&str> = spec.host_binds.iter().map(|b| b.target.as_str()).collect();
            mount_at = crate::tiers::with_mount_points(&mount_at, &targets)?;
        }
        spec.devices = granted.devices;
        spec.resolved_template = Some(cordon_core::ResolvedTemplate {
            name: format!("oci:{}", loaded.setup.id),
            digest: String::new(),
            root: writable.as_ref().map_or(mount_at, |w| w.root.clone()),
            env: Default::default(),
            languages: Default::default(),
            lease: None,
            writable: writable.is_some(),
        });
        Ok(Mounted {
            loaded,
            spec,
            audit,
            writable,
        })
    }
}

/// The sandbox's root and volumes, bound where its init finds them.
pub struct Mounted {
    loaded: Loaded,
    spec: SandboxSpec,
    audit: NodeAudit,
    writable: Option<crate::rootfs::Writable>,
}

impl Mounted {
    /// Makes the sandbox on the admitted tier, the process's terminal where it has one,
    /// and the container's record.
    pub fn start(self) -> Result<Prepared> {
        let Mounted {
            loaded,
            spec: mut sandbox_spec,
            audit,
            writable,
        } = self;
        let Loaded {
            setup,
            spec,
            process,
        } = loaded;
        let ids = writable.as_ref().map(|w| crate::rootfs::pool(&w.ids));
        // The pod's cgroup, as the kubelet named it: the monitor in it, the sandbox below it.
        let placement = crate::tiers::placement(&spec, &setup.id)?;
        let net = pod_network(&spec, &setup.root, &mut sandbox_spec)?;
        let mut sandbox =
            crate::tiers::create(&sandbox_spec, &setup.id, ids, placement.as_ref(), &net)?;
        // Its ids stay leased until the monitor ends.
        std::mem::forget(writable);
        let tier = sandbox_spec.tier;
        let terminal = match (&setup.console, process.terminal) {
            (Some(console), true) => Some(console_for(sandbox.as_mut(), tier, console, &process)?),
            _ => None,
        };
        let record = Record {
            id: setup.id.clone(),
            bundle: setup.bundle.clone(),
            pid: std::process::id() as i32,
            pid_start: crate::state::start_time(std::process::id() as i32).unwrap_or(0),
            status: Status::Created,
            created: crate::state::now_rfc3339(),
            annotations: spec
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            sandbox: Some(sandbox.id().as_str().to_string()),
            exit_code: None,
            tier: Some(tier),
            cgroup: placement.as_ref().map(|p| p.rel().to_string()),
            netns: net.netns.clone(),
        };
        // The backend's sandbox owns everything; the backend itself holds nothing more.
        // Its proxy's decisions go to the node's audit store as they are made.
        let sandbox = Audited::new(sandbox, audit, &setup.id, tier).in_pod(&record.annotations);
        Ok(Prepared {
            sandbox,
            process,
            record,
            terminal,
        })
    }
}

/// The pod's network for the container (`crate::podnet`): a pod's sandbox container walls
/// the pod's namespace and its own sandbox (a pause) gets no egress; a container of the pod
/// whose tier can joins the namespace, its egress forwarder on a port of the pod's loopback
/// no other container holds.
fn pod_network(
    spec: &oci_spec::runtime::Spec,
    root: &crate::state::Root,
    sandbox: &mut SandboxSpec,
) -> Result<crate::tiers::Net> {
    use crate::podnet::PodNet;
    Ok(match crate::podnet::resolve(spec, root)? {
        Some(PodNet::Walls(path)) => {
            crate::podnet::wall(&path)?;
            sandbox.egress = Default::default();
            sandbox.grants.clear();
            crate::tiers::Net {
                netns: Some(path),
                ..Default::default()
            }
        }
        Some(PodNet::Joins(path)) if sandbox.tier.features().pod_network => {
            let wants_egress = cordon_host::egress::wanted(sandbox);
            crate::tiers::Net {
                proxy_port: wants_egress
                    .then(|| crate::podnet::forwarder_port(&path))
                    .transpose()?,
                join: true,
                netns: Some(path),
            }
        }
        // A tier with a network of its own (the microvm's guest): reached by exec only.
        Some(PodNet::Joins(_)) | None => crate::tiers::Net::default(),
    })
}

/// A terminal in the sandbox for `process`: its master goes to the engine over `console`
/// (as runc sends it), its slave is returned for the process.
fn console_for(
    sandbox: &mut dyn Sandbox,
    tier: cordon_core::Tier,
    console: &impl AsFd,
    process: &ProcessSpec,
) -> Result<OwnedFd> {
    let size = process.console_size.unwrap_or(DEFAULT_CONSOLE);
    let t = crate::tiers::open_terminal(sandbox, tier, size)?;
    crate::ctl::send_console(console, &t.name, t.master.as_fd()).map_err(|e| {
        OciError::io(
            "sending the terminal to the console socket (is the engine still listening?)",
            e,
        )
    })?;
    Ok(t.slave)
}

/// A private mount namespace for the monitor (and the sandbox's init it starts), with the
/// bundle's root bound under [`ROOTS_AT`] in it; returns where. It goes away with the
/// monitor.
fn bind_rootfs(root: &CheckedRoot) -> Result<PathBuf> {
    use nix::mount::{MsFlags, mount};
    use std::os::unix::fs::DirBuilderExt;
    let m = |what: &str| {
        let what = what.to_string();
        move |e: nix::Error| OciError::io(what, e.into())
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(m(
        "making the monitor's mount namespace (run cordon-oci as root)",
    ))?;
    cordon_guest::sys::make_mounts_private().map_err(m("making the monitor's mounts private"))?;
    let base = Path::new(ROOTS_AT);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(base)
        .map_err(|e| OciError::io(format!("making {ROOTS_AT}"), e))?;
    mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=64k,mode=0711"),
    )
    .map_err(m("mounting the roots' tmpfs"))?;
    let at = base.join("root");
    std::fs::create_dir(&at).map_err(|e| OciError::io("making the root's mount point", e))?;
    // The directory that was checked, or nothing.
    let dir = root.reopen()?;
    let source = format!("/proc/self/fd/{}", dir.as_raw_fd());
    cordon_guest::sys::bind_recursive(Path::new(&source), &at)
        .map_err(|e| OciError::io("binding the bundle's root filesystem", e.into()))?;
    Ok(at)
}
