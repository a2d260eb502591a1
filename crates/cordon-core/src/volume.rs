//! Volumes: named, size-limited file systems that outlive their sandboxes, mounted at a path
//! under `/work` when a sandbox is created (docs/service.md#volumes, ADR 0011).
//!
//! This module holds what every layer shares: the names and paths a request may give (both
//! from an attacker: a tenant, or the local user), and the mount a tier is asked to make.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Error, NameKind, Rejected, Result, validate_sandbox_path};

/// The smallest volume: an ext4 with a journal needs a few MiB of its own.
pub const MIN_VOLUME_BYTES: u64 = 8 << 20;

/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 8;

/// A volume mounted into a sandbox: which one, where, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name (see [`validate_volume_name`]).
    pub name: String,
    /// Where it appears, under `/work`, relative to it once validated (`data`, `a/b`).
    pub path: String,
    /// Mounted read-only (many sandboxes may); otherwise read-write (one at a time).
    #[serde(default)]
    pub read_only: bool,
    /// What the host made ready for this sandbox: never read from a request.
    #[serde(skip)]
    pub source: Option<VolumeSource>,
}

/// The host side of a mounted volume, filled in by whoever leased it (the server, `cordon
/// run`) before the tier runs. Never shown to a tenant.
#[derive(Clone)]
pub struct VolumeSource {
    /// The volume's file system, mounted on the host (root-only directory), which the
    /// native tiers bind into the sandbox with the sandbox's ids mapped.
    pub host_dir: PathBuf,
    /// Held for as long as any clone of the spec lives; the lease itself is released by
    /// its holder once the sandbox is destroyed.
    pub lease: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for VolumeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeSource").finish_non_exhaustive()
    }
}

impl PartialEq for VolumeSource {
    fn eq(&self, other: &Self) -> bool {
        self.host_dir == other.host_dir
    }
}

impl VolumeMount {
    /// A mount of `name` at `path` (any form [`validate_volume_path`] takes).
    pub fn new(name: &str, path: &str, read_only: bool) -> Result<Self> {
        validate_volume_name(name)?;
        Ok(VolumeMount {
            name: name.to_string(),
            path: validate_volume_path(path)?,
            read_only,
            source: None,
        })
    }

    /// Parses `cordon run --volume NAME:/work/PATH[:ro|:rw]`.
    pub fn parse_flag(flag: &str) -> Result<Self> {
        let bad = || Rejected::Name {
            kind: NameKind::VolumeFlag,
            name: flag.to_string(),
        };
        let (name, rest) = flag.split_once(':').ok_or_else(bad)?;
        let (path, read_only) = match rest.rsplit_once(':') {
            Some((p, "ro")) => (p, true),
            Some((p, "rw")) => (p, false),
            _ => (rest, false),
        };
        if path.is_empty() {
            return Err(bad().into());
        }
        Self::new(name, path, read_only)
    }

    /// Its path as the sandbox sees it.
    pub fn inside(&self) -> String {
        format!("{}/{}", crate::WORKDIR, self.path)
    }
}

/// Most host directories one sandbox has bound ([`HostBind`]): a pod's volumes.
pub const MAX_HOST_BINDS: usize = 32;

/// A host directory bound into the sandbox at `target`, an absolute path of the sandbox
/// ([`validate_bind_target`]): what a node's operator allowed (cordon-oci's `[allow]
/// host_path` entries and the kubelet's pod volumes). Never read from a request. `source`
/// is where its creator bound it, already checked (opened without following a link), in a
/// directory of its own; a tier with [`crate::Feature::HostPaths`] binds it with the
/// sandbox's ids mapped, never set-id programs or devices, read-only where asked.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBind {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

impl HostBind {
    /// Its target relative to `/work` when it is under it (where the sandbox's own
    /// `/work` is mounted), else `None`.
    pub fn under_work(&self) -> Option<&str> {
        self.target
            .strip_prefix(crate::WORKDIR)
            .and_then(|r| r.strip_prefix('/'))
    }
}

/// Where the sandbox's own file systems are: no host directory is bound on or under them.
const OWN_PLACES: [&str; 4] = ["/proc", "/sys", "/dev", "/tmp"];

/// The sandbox's own files of `/etc`: no host directory is bound on them (nor on `/etc`).
const OWN_ETC: [&str; 6] = [
    "hosts",
    "hostname",
    "passwd",
    "group",
    "resolv.conf",
    "nsswitch.conf",
];

/// A host bind's target: an absolute path of plain components (no `.`, `..` or empty
/// ones, no trailing `/`), at most 16 deep and 255 bytes, not `/`, `/work` itself, nor on
/// or under the sandbox's own `/proc`, `/sys`, `/dev`, `/tmp` and `/etc`.
pub fn validate_bind_target(target: &str) -> Result<()> {
    let refuse = |reason: &str| {
        Err(Error::PathRefused {
            path: target.to_string(),
            reason: reason.to_string(),
        })
    };
    let Some(rel) = target.strip_prefix('/') else {
        return refuse("not an absolute path; give the mount's path in the container");
    };
    if rel.is_empty() || target == crate::WORKDIR {
        return refuse("names the sandbox's root or its /work; mount it on a directory of its own");
    }
    if target.len() > 255 || rel.split('/').count() > 16 || target.contains('\0') {
        return refuse(
            "too long or too deep for a mount point (at most 16 directories, 255 bytes)",
        );
    }
    if rel
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return refuse("not a plain path (no '.', '..', '//' or trailing '/')");
    }
    if OWN_PLACES
        .iter()
        .any(|p| target == *p || target.starts_with(&format!("{p}/")))
    {
        return refuse("the sandbox has its own /proc, /sys, /dev and /tmp; mount it elsewhere");
    }
    let etc_own = target
        .strip_prefix("/etc")
        .is_some_and(|r| r.is_empty() || OWN_ETC.iter().any(|f| r == format!("/{f}")));
    if etc_own {
        return refuse("the sandbox has its own /etc and its files there; mount it elsewhere");
    }
    Ok(())
}

/// A volume name: 1 to 63 of `a-z 0-9 _ -`, starting with a letter or digit (no `.`, so a
/// name is never `.`, `..` or a hidden file where volumes are kept).
pub fn validate_volume_name(name: &str) -> Result<()> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Rejected::Name {
            kind: NameKind::Volume,
            name: name.to_string(),
        }
        .into())
    }
}

/// A volume's mount point: a path under `/work` (not `/work` itself), without `..`, and no
/// deeper than 8 directories; returned relative to `/work`. Symlinks cannot be in the way:
/// the mount point is made in the sandbox's fresh `/work` before anything runs there.
pub fn validate_volume_path(path: &str) -> Result<String> {
    if !path.starts_with(crate::WORKDIR) {
        return Err(Error::PathRefused {
            path: path.to_string(),
            reason: "a volume is mounted under /work; give an absolute path like /work/data".into(),
        });
    }
    let rel = validate_sandbox_path(path)?;
    if rel.len() > 255 || rel.split('/').count() > 8 {
        return Err(Error::PathRefused {
            path: path.to_string(),
            reason: "too deep or too long for a mount point; use at most 8 directories and \
                     255 bytes under /work"
                .into(),
        });
    }
    Ok(rel)
}

/// Checks a sandbox's volume mounts together: each valid, at most [`MAX_MOUNTS`], no volume
/// twice and no mount point inside another's (a volume's contents are the previous
/// sandbox's writing, so nothing is ever made inside one).
pub fn validate_mounts(mounts: &[VolumeMount]) -> Result<()> {
    if mounts.len() > MAX_MOUNTS {
        return Err(Rejected::TooMany {
            what: "volumes",
            asked: mounts.len(),
            max: MAX_MOUNTS,
        }
        .into());
    }
    for (i, m) in mounts.iter().enumerate() {
        validate_volume_name(&m.name)?;
        let rel = validate_volume_path(&m.inside())?;
        if rel != m.path {
            return Err(Error::PathRefused {
                path: m.inside(),
                reason: "not in its plain form; give it as /work/a/b".into(),
            });
        }
        for other in &mounts[..i] {
            if other.name == m.name {
                return Err(Rejected::Twice {
                    kind: NameKind::Volume,
                    name: m.name.clone(),
                }
                .into());
            }
            let nested = |a: &str, b: &str| a == b || b.starts_with(&format!("{a}/"));
            if nested(&other.path, &m.path) || nested(&m.path, &other.path) {
                return Err(Error::PathRefused {
                    path: m.inside(),
                    reason: format!(
                        "overlaps the mount point of volume {:?} ({}); give each volume a \
                         path of its own, neither inside the other",
                        other.name,
                        other.inside()
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bind_targets_are_plain_and_never_the_sandboxs_own_places() {
        for ok in [
            "/scratch",
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "/work/data",
            "/etc/app",
        ] {
            validate_bind_target(ok).unwrap();
        }
        for bad in [
            "",
            "/",
            "scratch",
            "/work",
            "/a/../b",
            "/a//b",
            "/a/",
            "/a/./b",
            "/proc",
            "/proc/1",
            "/dev/shm",
            "/sys/fs",
            "/tmp",
            "/etc",
            "/etc/hosts",
            "/etc/passwd",
        ] {
            assert!(validate_bind_target(bad).is_err(), "{bad:?}");
        }
        let b = HostBind {
            source: "/x".into(),
            target: "/work/a/b".into(),
            read_only: true,
        };
        assert_eq!(b.under_work(), Some("a/b"));
        let b = HostBind {
            target: "/workx".into(),
            ..b
        };
        assert_eq!(b.under_work(), None);
    }

    #[test]
    fn names() {
        for ok in ["a", "data", "my-cache_2", "0x"] {
            validate_volume_name(ok).unwrap();
        }
        for bad in [
            "",
            "A",
            ".",
            "..",
            "a.b",
            "-a",
            "a/b",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(validate_volume_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(validate_volume_path("/work/data").unwrap(), "data");
        assert_eq!(validate_volume_path("/work/a//b/").unwrap(), "a/b");
        for bad in [
            "/work",
            "/work/",
            "/etc",
            "/",
            "data",
            "/work/../etc",
            "/work/a/../../etc",
            "/workx",
            "/work/a\0b",
            "/work/1/2/3/4/5/6/7/8/9",
        ] {
            assert!(validate_volume_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn flags() {
        let m = VolumeMount::parse_flag("cache:/work/cache:ro").unwrap();
        assert_eq!(
            (m.name.as_str(), m.path.as_str(), m.read_only),
            ("cache", "cache", true)
        );
        let m = VolumeMount::parse_flag("d:/work/x").unwrap();
        assert!(!m.read_only);
        for bad in ["d", "d:", "d:/etc", "D:/work/x", "d:/work/../x:ro"] {
            assert!(VolumeMount::parse_flag(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn overlapping_mounts_refused() {
        let m = |n: &str, p: &str| VolumeMount::new(n, p, false).unwrap();
        validate_mounts(&[m("a", "/work/a"), m("b", "/work/ab")]).unwrap();
        assert!(validate_mounts(&[m("a", "/work/a"), m("b", "/work/a/b")]).is_err());
        assert!(validate_mounts(&[m("a", "/work/a/b"), m("b", "/work/a")]).is_err());
        assert!(validate_mounts(&[m("a", "/work/a"), m("a", "/work/b")]).is_err());
        let mut raw = m("a", "/work/a");
        raw.path = "a/../../etc".into();
        assert!(validate_mounts(&[raw]).is_err());
    }
}
