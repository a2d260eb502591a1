//! `update`: a running container's memory and CPU limits changed in place, as `runc update
//! --resources -` does for containerd (a kubelet's in-place pod resize). The new resources
//! pass the same gate as the bundle did at `create` (with its `cordon.*` annotations, under
//! the node's ceiling); the limits it admits are written on the container's cgroup (the one
//! the bundle named, as runc does) and the sandbox takes them ([`cordon_core::Sandbox::resize`]:
//! its own cgroup's; a tier whose sandbox's size is fixed once it runs refuses).

use cordon_engine::Principal;
use oci_spec::runtime::LinuxResources;

use crate::ctl::{Conn, Reply, Request};
use crate::node::NodeConfig;
use crate::state::Root;
use crate::{OciError, Result, bundle};

/// The limits a resize gave, as the gate admitted them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resized {
    pub memory_bytes: u64,
    pub cpus: f64,
}

/// Changes container `id`'s memory and CPU limits to what `resources` asks, within the
/// node's ceiling.
pub fn update(
    root: &Root,
    node: &NodeConfig,
    id: &str,
    resources: LinuxResources,
) -> Result<Resized> {
    let r = root.load(id)?;
    if !r.alive() {
        return Err(OciError::State(format!(
            "container {id:?} is not running; only a running container is resized"
        )));
    }
    let place = r.cgroup.as_deref().and_then(crate::tiers::placed);
    let mut spec = bundle::load(&r.bundle)?;
    let mut linux = spec.linux().clone().unwrap_or_default();
    linux.set_resources(Some(resources));
    spec.set_linux(Some(linux));
    let mut req = bundle::request(&spec)?;
    // The tier it runs on (recorded at create), whatever the bundle or the node says now.
    req.tier = r.tier.map(cordon_policy::TierChoice::Tier);
    let decided = node.gate_for(r.tier)?.admit(
        &Principal::Tenant(crate::node::TENANT.into()),
        &req,
        "oci update",
    );
    crate::audit::record_decision(node, id, &decided)?;
    let admitted = decided.map_err(|d| OciError::Refused {
        what: format!("the resize: {} (rule {})", d.message, d.rule),
        fix: d.fix.clone(),
    })?;
    let new = Resized {
        memory_bytes: admitted.spec.limits.memory_bytes,
        cpus: admitted.spec.limits.cpus,
    };
    // The container's cgroup (runc's: the one the bundle named) and the sandbox's own below
    // it. cgroup v1 keeps a child's CPU quota within its parent's: a raise widens the
    // container's first, a cut narrows the sandbox's first.
    let widen = |p: &cordon_host::cgroup::place::Placement| {
        p.resize(Some(new.memory_bytes), Some(new.cpus))
            .map_err(|e| OciError::Invalid(e.to_string()))
    };
    let raise = place
        .as_ref()
        .is_some_and(|p| p.cpus().is_none_or(|c| c <= new.cpus));
    if raise && let Some(p) = &place {
        widen(p)?;
    }
    let request = Request::Resize {
        memory_bytes: new.memory_bytes,
        cpus: new.cpus,
    };
    match Conn::connect(&root.dir(id)).and_then(|c| c.call(&request, &[])) {
        Ok(Reply::Ok) => {}
        Ok(Reply::Error { message }) => return Err(OciError::State(message)),
        Ok(other) => {
            return Err(OciError::State(format!(
                "unexpected answer from the container's monitor: {other:?}"
            )));
        }
        Err(e) => return Err(OciError::io("reaching the container's monitor", e)),
    }
    if !raise && let Some(p) = &place {
        widen(p)?;
    }
    Ok(new)
}
