//! The container tier's Landlock ruleset: read and execute everywhere in the sandbox's own
//! root, write only in `/work`, `/tmp`, `/dev/shm`, the writable host binds (a pod's
//! emptyDir) and the few device files; no signals or
//! abstract unix sockets outside the sandbox (where the kernel supports scoping).
//!
//! TCP is not Landlock's: the sandbox's network namespace is its own (loopback only, no
//! route, made by init), so programs bind and connect there freely (a dev server reached by
//! a later exec), and nothing leads out of it (issue 47). Landlock's network rules name
//! ports, never addresses, and allow only what they list, so they could not say "any port
//! but the egress forwarder's"; that port is held by the forwarder, bound before any program
//! runs and kept open by the agent for the sandbox's life (`cordon_guest::forwarder`).

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RestrictionStatus,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The ABI whose filesystem rights Cordon requires (6.7+ kernels: the same ABI as before
/// TCP was left to the network namespace, so no kernel that ran sandboxes stops).
pub const REQUIRED_ABI: ABI = ABI::V4;

/// Why the Landlock ruleset could not be built; each keeps the landlock crate's error.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("Landlock ABI {abi:?} rights are not supported: {source}")]
    Rights {
        abi: ABI,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("{what}: {source}")]
    Ruleset {
        what: String,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("opening {path} for Landlock: {source}")]
    Open {
        path: String,
        #[source]
        source: landlock::PathFdError,
    },
}

fn step(what: impl Into<String>) -> impl FnOnce(landlock::RulesetError) -> LandlockError {
    let what = what.into();
    move |source| LandlockError::Ruleset { what, source }
}

/// A path of the sandbox's root (after pivot_root: never a host path), opened for a rule.
fn open(path: &str) -> Result<PathFd, LandlockError> {
    PathFd::new(path).map_err(|source| LandlockError::Open {
        path: path.to_string(),
        source,
    })
}

/// Builds the ruleset. Call inside the sandbox's root (after pivot_root). `writable_root`:
/// a template build's step, which may write anywhere in its own root (its working copy).
/// `devices`: extra device nodes under `/dev` (names such as `fuse`), read and written as
/// the sandbox's own devices are. `writable`: the writable host binds outside `/work` (a
/// pod's emptyDir), written beneath as `/work` is.
pub fn build(
    writable_root: bool,
    devices: &[String],
    writable: &[String],
) -> Result<RulesetCreated, LandlockError> {
    let fs_all = AccessFs::from_all(REQUIRED_ABI);
    let fs_read = AccessFs::from_read(REQUIRED_ABI);
    let rw_file = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(fs_all)
        .map_err(|source| LandlockError::Rights {
            abi: REQUIRED_ABI,
            source,
        })?;
    // Scopes (ABI 6) where the kernel has them; never required.
    let ruleset = ruleset
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(step("Landlock scopes"))?
        .set_compatibility(CompatLevel::HardRequirement);
    let mut created = ruleset
        .create()
        .map_err(step("creating the Landlock ruleset"))?;
    created = created
        .add_rule(PathBeneath::new(
            open("/")?,
            if writable_root { fs_all } else { fs_read },
        ))
        .map_err(step("the Landlock rule for /"))?;
    for dir in ["/work", "/tmp", "/dev/shm"]
        .into_iter()
        .chain(writable.iter().map(String::as_str))
    {
        created = created
            .add_rule(PathBeneath::new(open(dir)?, fs_all))
            .map_err(step(format!("the Landlock rule for {dir}")))?;
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
            .add_rule(PathBeneath::new(open(dev)?, rw_file))
            .map_err(step(format!("the Landlock rule for {dev}")))?;
    }
    for name in devices {
        let dev = format!("/dev/{name}");
        created = created
            .add_rule(PathBeneath::new(open(&dev)?, rw_file))
            .map_err(step(format!("the Landlock rule for {dev}")))?;
    }
    // The sandbox's own devpts (its terminals, and ptmx for new ones), where it has one.
    if std::path::Path::new("/dev/pts/ptmx").exists() {
        created = created
            .add_rule(PathBeneath::new(open("/dev/pts")?, rw_file))
            .map_err(step("the Landlock rule for /dev/pts"))?;
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

#[cfg(test)]
mod tests {
    use super::{LandlockError, open};

    #[test]
    fn a_path_that_cannot_be_opened_keeps_the_crates_error() {
        let Err(e) = open("/no/such/cordon/path") else {
            panic!("a missing path was opened");
        };
        assert!(matches!(&e, LandlockError::Open { path, .. } if path == "/no/such/cordon/path"));
        let source = std::error::Error::source(&e).expect("the landlock crate's error is kept");
        assert!(source.downcast_ref::<landlock::PathFdError>().is_some());
    }
}
