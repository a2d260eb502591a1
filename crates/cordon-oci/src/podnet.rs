//! A kubelet pod's network (docs/adr/0029-oci-pod-cgroup-and-network.md): which network
//! namespace a container's sandbox joins, and the wall the pod's sandbox (pause) monitor
//! puts in that namespace before anything joins it.
//!
//! containerd runs CNI before it creates the pod's sandbox container, whose bundle names the
//! pod's namespace by path; every other container of the pod names `/proc/<pid>/ns/net`,
//! `<pid>` being the sandbox container's reported pid, which under cordon-oci is its
//! monitor, a process in the node's namespace. That path is resolved through the monitor's
//! record to the pod's. Nothing else is joined: a bundle that names another namespace gets
//! its sandbox's own, as before, and the node's own is refused by [`crate::bundle::check`].
//!
//! The wall is one nf_tables table, loaded by `nft` (Debian's nftables, installed by
//! scripts/setup.d/70-oci.sh) from a thread of the monitor moved into the pod's namespace:
//! nothing leaves the pod but on loopback (the egress forwarder, sidecars, port-forward) or
//! as an answer to a connection that came in (probes, Services); every other connection is
//! reset or refused at once. The workload cannot change it: the namespace belongs to the
//! node's user namespace, where it holds no capability.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::state::Root;
use crate::{OciError, Result};

/// containerd's CRI annotation saying whether a container is a pod's sandbox.
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// The table the wall is (its name is how a test or a person finds it: `nft list table inet
/// cordon_pod` in the pod's namespace).
pub const TABLE: &str = "cordon_pod";

/// The wall's ruleset, for `nft -f -`: the table replaced whole in one transaction.
const RULESET: &str = "table inet cordon_pod
delete table inet cordon_pod
table inet cordon_pod {
  chain output {
    type filter hook output priority filter; policy drop;
    oif \"lo\" accept
    ct state established,related accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }
}
";

/// The first loopback port a pod's container's egress forwarder may take, and how many
/// follow it (a pod's containers share one loopback: each forwarder has a port of its own).
const FORWARDER_PORTS: std::ops::Range<u16> =
    cordon_host::egress::SANDBOX_PROXY_PORT..cordon_host::egress::SANDBOX_PROXY_PORT + 64;

/// What a container does with its pod's network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNet {
    /// The pod's sandbox container: its monitor walls the namespace at this path; its own
    /// sandbox (a pause) joins nothing.
    Walls(PathBuf),
    /// A container of the pod: its sandbox joins the namespace at this path, walled by the
    /// pod's sandbox monitor.
    Joins(PathBuf),
}

impl PodNet {
    /// The pod's namespace.
    pub fn path(&self) -> &Path {
        match self {
            PodNet::Walls(p) | PodNet::Joins(p) => p,
        }
    }
}

/// Resolves the bundle's network namespace (see the module's text): `None` when the
/// container's sandbox has a namespace of its own.
pub fn resolve(spec: &Spec, root: &Root) -> Result<Option<PodNet>> {
    let Some(path) = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|ns| ns.iter().find(|n| n.typ() == LinuxNamespaceType::Network))
        .and_then(|n| n.path().clone())
    else {
        return Ok(None);
    };
    if crate::bundle::is_host_namespace(&path, "network") {
        // Only where the node allowed it (checked before): its own namespace all the same.
        return Ok(None);
    }
    if let Some(pid) = crate::bundle::monitor_pid(&path) {
        return Ok(root
            .by_monitor(pid)
            .and_then(|r| r.netns)
            .map(PodNet::Joins));
    }
    let sandbox = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(CONTAINER_TYPE))
        .is_some_and(|t| t == "sandbox");
    // A pod's namespace is CNI's file, never another process's namespace.
    Ok((sandbox && !path.starts_with("/proc")).then_some(PodNet::Walls(path)))
}

/// Runs `f` on a thread of its own moved into the network namespace at `netns`.
fn in_namespace<T: Send>(netns: &Path, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let ns = std::fs::File::open(netns)
        .map_err(|e| OciError::io("opening the pod's network namespace", e))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(OciError::Netns)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(OciError::Invalid(
                "walling the pod's network namespace failed".into(),
            ))
        })
    })
}

/// Puts the wall in the pod's namespace at `netns` (replacing one there), and lets the
/// pod's programs serve on ports below 1024 there as they do on runc (the namespace's
/// `ip_unprivileged_port_start`: the workload is no root of that namespace's owner).
pub fn wall(netns: &Path) -> Result<()> {
    in_namespace(netns, || {
        std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
            .map_err(|e| OciError::io("opening the pod's low ports to its programs", e))?;
        let missing = |e: std::io::Error| {
            OciError::io(
                "running nft to wall the pod's network (install Debian's nftables: make setup)",
                e,
            )
        };
        // Where Debian puts it, whatever PATH the engine gave the runtime.
        let nft = ["/usr/sbin/nft", "/sbin/nft"]
            .into_iter()
            .find(|p| Path::new(p).is_file())
            .unwrap_or("nft");
        let mut nft = Command::new(nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(missing)?;
        if let Some(mut stdin) = nft.stdin.take() {
            stdin.write_all(RULESET.as_bytes()).map_err(missing)?;
        }
        let out = nft.wait_with_output().map_err(missing)?;
        if !out.status.success() {
            return Err(OciError::Invalid(format!(
                "the pod's network could not be walled (nft: {}); the pod is refused",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    })
}

/// A loopback port of the pod's namespace at `netns` that nothing holds, for a container's
/// egress forwarder (which binds it for the sandbox's life, on IPv6's loopback too).
pub fn forwarder_port(netns: &Path) -> Result<u16> {
    in_namespace(netns, || {
        let free = |port: u16| {
            let v6 = std::net::TcpListener::bind(("::1", port));
            let v6_free = match &v6 {
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::AddrNotAvailable,
            };
            v6_free && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        };
        FORWARDER_PORTS.clone().find(|p| free(*p)).ok_or_else(|| {
            OciError::Invalid(format!(
                "every port from {} to {} of the pod's loopback is taken; a pod has at most \
                 that many Cordon containers with egress",
                FORWARDER_PORTS.start,
                FORWARDER_PORTS.end - 1
            ))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ns: serde_json::Value, container_type: Option<&str>) -> Spec {
        let mut annotations = serde_json::Map::new();
        if let Some(t) = container_type {
            annotations.insert(CONTAINER_TYPE.into(), t.into());
        }
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": {"namespaces": [ns]}
        }))
        .unwrap()
    }

    #[test]
    fn only_a_pods_sandbox_walls_and_only_through_a_monitor_is_joined() {
        let root = Root::new(Some(Path::new("/nonexistent-cordon-oci-root")));
        let net = |path: &str| serde_json::json!({"type": "network", "path": path});
        // A pod sandbox's own namespace (any path but the node's or a monitor's) is walled.
        let pause = spec(net("/run/netns/cni-1234"), Some("sandbox"));
        assert_eq!(
            resolve(&pause, &root).unwrap(),
            Some(PodNet::Walls("/run/netns/cni-1234".into()))
        );
        // The same path on a container that is no pod's sandbox: its own namespace.
        for t in [Some("container"), None] {
            assert_eq!(
                resolve(&spec(net("/run/netns/cni-1234"), t), &root).unwrap(),
                None
            );
        }
        // The node's own namespace is never walled or joined.
        assert_eq!(
            resolve(&spec(net("/proc/self/ns/net"), Some("sandbox")), &root).unwrap(),
            None
        );
        // A process that is no monitor: nothing joined.
        let pid1 = spec(net("/proc/1/ns/net"), Some("container"));
        assert_eq!(resolve(&pid1, &root).unwrap(), None);
        // No path: its own.
        let own = spec(serde_json::json!({"type": "network"}), Some("sandbox"));
        assert_eq!(resolve(&own, &root).unwrap(), None);
    }
}
