//! The container tier's Landlock ruleset: read and execute everywhere in the sandbox's own
//! root, write only in `/work`, `/tmp`, `/dev/shm` and the few device files; no TCP bind, and
//! TCP connect only to the egress forwarder's port when egress is on; no signals or abstract
//! unix sockets outside the sandbox (where the kernel supports scoping).

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    RestrictionStatus, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus,
    Scope,
};

/// The ABI whose filesystem and network rights Cordon requires (6.7+ kernels).
pub const REQUIRED_ABI: ABI = ABI::V4;

/// Builds the ruleset. Call inside the sandbox's root (after pivot_root). `writable_root`:
/// a template build's step, which may write anywhere in its own root (its working copy).
/// `devices`: extra device nodes under `/dev` (names such as `fuse`), read and written as
/// the sandbox's own devices are.
pub fn build(
    connect_port: Option<u16>,
    writable_root: bool,
    devices: &[String],
) -> Result<RulesetCreated, String> {
    let fs_all = AccessFs::from_all(REQUIRED_ABI);
    let fs_read = AccessFs::from_read(REQUIRED_ABI);
    let rw_file = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(fs_all)
        .and_then(|r| r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp))
        .map_err(|e| format!("Landlock ABI {REQUIRED_ABI:?} rights are not supported: {e}"))?;
    // Scopes (ABI 6) where the kernel has them; never required.
    let ruleset = ruleset
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(|e| format!("Landlock scopes: {e}"))?
        .set_compatibility(CompatLevel::HardRequirement);
    let mut created = ruleset
        .create()
        .map_err(|e| format!("creating the Landlock ruleset: {e}"))?;
    let path = |p: &str| PathFd::new(p).map_err(|e| format!("opening {p} for Landlock: {e}"));
    created = created
        .add_rule(PathBeneath::new(
            path("/")?,
            if writable_root { fs_all } else { fs_read },
        ))
        .map_err(|e| e.to_string())?;
    for dir in ["/work", "/tmp", "/dev/shm"] {
        created = created
            .add_rule(PathBeneath::new(path(dir)?, fs_all))
            .map_err(|e| e.to_string())?;
    }
    for dev in [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/tty",
        "/dev/random",
        "/dev/urandom",
    ] {
        created = created
            .add_rule(PathBeneath::new(path(dev)?, rw_file))
            .map_err(|e| e.to_string())?;
    }
    for name in devices {
        created = created
            .add_rule(PathBeneath::new(path(&format!("/dev/{name}"))?, rw_file))
            .map_err(|e| e.to_string())?;
    }
    // The sandbox's own devpts (its terminals, and ptmx for new ones), where it has one.
    if std::path::Path::new("/dev/pts/ptmx").exists() {
        created = created
            .add_rule(PathBeneath::new(path("/dev/pts")?, rw_file))
            .map_err(|e| e.to_string())?;
    }
    if let Some(port) = connect_port {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| e.to_string())?;
    }
    Ok(created)
}

/// Enforces a ruleset on the calling process; fails unless fully enforced.
pub fn enforce(ruleset: &RulesetCreated) -> std::io::Result<()> {
    let status: RestrictionStatus = ruleset
        .try_clone()?
        .restrict_self()
        .map_err(|e| std::io::Error::other(format!("Landlock: {e}")))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        other => Err(std::io::Error::other(format!(
            "Landlock ruleset only {other:?} on this kernel"
        ))),
    }
}

/// The Landlock ABI this kernel offers, or an explanation of why none.
pub fn probe() -> Result<i32, String> {
    crate::sys::landlock_abi()
}
