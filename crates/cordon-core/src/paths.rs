//! Paths inside a sandbox: the workspace's two mount points and the check every file in
//! or out passes, and where a path outside the workspace leads. Below the spec and the volumes, which both use it.

use crate::{Error, Result};

/// The writable workspace inside every sandbox; files in and out must stay under it.
pub const WORKDIR: &str = "/work";

/// The workspace's second mount point on every program tier: E2B's home, where code
/// written for E2B's sandboxes starts (`getcwd` there answers it). The same files as
/// [`WORKDIR`], which stays the name of Cordon's own API.
pub const HOME_MOUNT: &str = "/home/user";

/// Validates a directory path inside the sandbox and returns it relative to [`WORKDIR`]:
/// as [`validate_sandbox_path`], but `/work` itself (`/work`, `/work/`, `.`) is allowed and
/// comes back empty.
pub fn validate_sandbox_dir(path: &str) -> Result<String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed == WORKDIR || path == "." || path == "./" {
        return Ok(String::new());
    }
    validate_sandbox_path(path)
}

/// Validates a path inside the sandbox for a file in or out and returns it relative to
/// [`WORKDIR`]. Relative paths are taken under `/work`. Anything that would leave `/work`
/// (`..`, another absolute root, NUL) is refused. Symlinks are refused later, at open time,
/// by the code that opens the file inside the sandbox.
pub fn validate_sandbox_path(path: &str) -> Result<String> {
    let refuse = |reason: &str| {
        Err(Error::PathRefused {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    if path.is_empty() {
        return refuse("empty path; give a path under /work");
    }
    if path.contains('\0') {
        return refuse("contains a NUL byte");
    }
    if path.len() > 4096 {
        return refuse("longer than 4096 bytes");
    }
    let rel = if let Some(rest) = path.strip_prefix(WORKDIR) {
        if rest.is_empty() {
            return refuse("names /work itself; give a file under it");
        }
        match rest.strip_prefix('/') {
            Some(r) => r,
            None => return refuse("outside /work; files in and out live under /work"),
        }
    } else if path.starts_with('/') {
        return refuse("outside /work; files in and out live under /work");
    } else {
        path
    };
    let mut parts = Vec::new();
    for comp in rel.split('/') {
        match comp {
            "" | "." => continue,
            ".." => return refuse("contains '..'; give a path that stays under /work"),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return refuse("names /work itself; give a file under it");
    }
    let rel = parts.join("/");
    // The limit holds for the path the file has in the sandbox, however it was given: a
    // relative path is accepted exactly when its /work form is.
    if WORKDIR.len() + 1 + rel.len() > 4096 {
        return refuse("longer than 4096 bytes as a path under /work");
    }
    Ok(rel)
}

/// Where a file call's path leads (ADR 0031).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileTarget {
    /// The workspace: the path relative to [`WORKDIR`] (empty: `/work` itself, for a
    /// directory call). Served where the workspace is (the agent, or the host's confined
    /// view of it).
    Workspace(String),
    /// Elsewhere in the sandbox's own root (`/tmp`, the image's files): the path relative
    /// to `/` (empty: `/` itself, for a directory call), normalised, never through `..`.
    /// Served by the agent inside the sandbox, as the sandbox's user, never following a
    /// symlink; tiers without [`crate::Feature::FilesOutside`] refuse it.
    Outside(String),
}

/// Top-level directories of a sandbox the file API never reaches, whatever the tier: the
/// kernel's views (`/proc`, `/sys`) and the devices (`/dev`). The agent's own directories
/// are refused too ([`AGENT_DIRS`]).
pub const UNREACHABLE: [&str; 3] = ["proc", "sys", "dev"];

/// The one file under `/proc` the file API reads: the sandbox's boot id, as its programs
/// read it (on the container tier, the sandbox's own: ADR 0047). E2B's suites read it
/// through the file API to tell a filesystem-only pause from a memory one.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The agent's own directories in a sandbox (relative to its root): its egress and port
/// sockets (`/run/cordon`), and on the gvisor tier its binary, egress socket and host
/// binds (`/.cordon`). Never reached by the file API.
pub const AGENT_DIRS: [&str; 2] = ["run/cordon", ".cordon"];

/// Classifies a file call's path: a relative path, `/work/...` and `/home/user/...` are
/// the workspace's (checked as [`validate_sandbox_path`] checks them); any other absolute
/// path is [`FileTarget::Outside`], refused when it climbs (`..`), names `/proc`, `/sys`,
/// `/dev` or the agent's own directories ([`AGENT_DIRS`]) or what is beneath them, or (unless `dir`, a directory call)
/// names `/` itself.
pub fn classify_sandbox_path(path: &str, dir: bool) -> Result<FileTarget> {
    let refuse = |reason: &str| {
        Err(Error::PathRefused {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    let workspace = |p: &str| {
        if dir {
            validate_sandbox_dir(p)
        } else {
            validate_sandbox_path(p)
        }
        .map(FileTarget::Workspace)
    };
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return workspace(path);
    }
    let mut parts = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => continue,
            ".." => return refuse("contains '..'; give the path without it"),
            c => parts.push(c),
        }
    }
    let rel = parts.join("/");
    match parts.first() {
        Some(&"work") => return workspace(&format!("/{rel}")),
        Some(&"home") if parts.get(1) == Some(&"user") => {
            let rest = parts[2..].join("/");
            return workspace(&format!("{WORKDIR}/{rest}"));
        }
        // Whatever the call: only a read of it is answered (by the agent); any other call
        // on it is refused where it is served (a kernel filesystem).
        Some(&"proc") if format!("/{rel}") == BOOT_ID => return Ok(FileTarget::Outside(rel)),
        Some(top) if UNREACHABLE.contains(top) => {
            return refuse(
                "the file API never reaches /proc, /sys or /dev; read them with an exec \
                 (commands.run)",
            );
        }
        None if !dir => return refuse("names / itself; give a file path"),
        _ => {}
    }
    if AGENT_DIRS
        .iter()
        .any(|d| rel == *d || rel.starts_with(&format!("{d}/")))
    {
        return refuse("the agent's own directory (/run/cordon, /.cordon); give another path");
    }
    Ok(FileTarget::Outside(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_workspace_are_classified_or_refused() {
        let c = |p: &str, dir: bool| classify_sandbox_path(p, dir).ok();
        let ws = |r: &str| Some(FileTarget::Workspace(r.to_string()));
        let out = |r: &str| Some(FileTarget::Outside(r.to_string()));
        assert_eq!(c("/work/a", false), ws("a"));
        assert_eq!(c("a/./b", false), ws("a/b"));
        assert_eq!(c("/home/user/a", false), ws("a"));
        assert_eq!(c("//work//a", false), ws("a"));
        assert_eq!(c("/work", true), ws(""));
        assert_eq!(c("/tmp/x", false), out("tmp/x"));
        assert_eq!(c("/tmp//./x/", false), out("tmp/x"));
        assert_eq!(c("/home/username/x", false), out("home/username/x"));
        assert_eq!(c("/workx", false), out("workx"));
        assert_eq!(c("/", true), out(""));
        for bad in [
            "/",
            "/tmp/../etc/passwd",
            "/work/../etc",
            "/proc/self/environ",
            "/proc",
            "//proc/1/root",
            "/./sys/kernel",
            "/dev/mem",
            "/run/cordon",
            "/run/cordon/egress.sock",
            "/.cordon/agent",
            "/tmp/a\0b",
        ] {
            assert!(
                matches!(
                    classify_sandbox_path(bad, false),
                    Err(Error::PathRefused { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(c("/run/cordonx", false), out("run/cordonx"));
        assert_eq!(c("/procx", false), out("procx"));
        // The boot id is the one file of /proc a file call names (not its neighbours).
        assert_eq!(
            c("/proc/sys/kernel/random/boot_id", false),
            out("proc/sys/kernel/random/boot_id")
        );
        assert_eq!(
            c("//proc/./sys/kernel/random/boot_id", false),
            out("proc/sys/kernel/random/boot_id")
        );
        for bad in [
            "/proc/sys/kernel/random/uuid",
            "/proc/sys/kernel/random",
            "/proc/sys/kernel/random/boot_id/x",
            "/proc/self/root/proc/sys/kernel/random/boot_id",
        ] {
            assert!(classify_sandbox_path(bad, false).is_err(), "{bad:?}");
        }
    }
}

/// Bounded fuzzing of the sandbox path validator (docs/fuzzing.md); `CORDON_FUZZ_CASES`
/// runs longer campaigns.
#[cfg(test)]
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::config;
    use proptest::prelude::*;

    /// Paths made of the pieces that matter to the validator, with any prefix.
    fn path() -> impl Strategy<Value = String> {
        let comp = prop_oneof![
            Just(String::new()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("...".to_string()),
            Just("work".to_string()),
            Just("a\0b".to_string()),
            "[a-z.é ]{1,6}",
            "[a-z]{250,260}",
            "[a-z]{4085,4100}",
        ];
        let prefix = prop_oneof![
            Just(""),
            Just("/"),
            Just("/work"),
            Just("/work/"),
            Just("/workx/"),
            Just("//work/")
        ];
        (prefix, prop::collection::vec(comp, 0..24))
            .prop_map(|(p, comps)| format!("{p}{}", comps.join("/")))
    }

    /// The reference: where the path lands, resolved component by component from the
    /// workspace (`None`: it leaves /work at some point or names another root).
    fn model(path: &str) -> Option<Vec<&str>> {
        let rel = match path.strip_prefix("/work/") {
            Some(r) => r,
            None if path.starts_with('/') => return None,
            None => path,
        };
        let mut at: Vec<&str> = Vec::new();
        for c in rel.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    at.pop()?;
                }
                c => at.push(c),
            }
        }
        Some(at)
    }

    proptest! {
        #![proptest_config(config(2048))]

        #[test]
        fn accepted_paths_never_escape_and_normalise_idempotently(
            p in prop_oneof![path(), any::<String>()]
        ) {
            let Ok(rel) = validate_sandbox_path(&p) else {
                // Refused: fine, unless it is a plain path under /work the model resolves
                // without any `..` (then it had to be accepted).
                if let Some(at) = model(&p) {
                    let plain = !p.split('/').any(|c| c == "..") && !p.contains('\0');
                    let fits = WORKDIR.len() + 1 + at.join("/").len() <= 4096 && p.len() <= 4096;
                    prop_assert!(!(plain && fits && !at.is_empty()), "refused {p:?}");
                }
                return Ok(());
            };
            prop_assert!(!rel.is_empty() && !rel.starts_with('/') && !rel.contains('\0'));
            prop_assert!(rel.split('/').all(|c| !matches!(c, "" | "." | "..")), "{rel:?}");
            prop_assert_eq!(model(&p), Some(rel.split('/').collect::<Vec<_>>()));
            // Idempotent, and the absolute form names the same file.
            prop_assert_eq!(validate_sandbox_path(&rel).ok(), Some(rel.clone()));
            let abs = format!("{WORKDIR}/{rel}");
            prop_assert_eq!(validate_sandbox_path(&abs).ok(), Some(rel.clone()));
        }
    }
}
