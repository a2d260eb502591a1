//! `cordon setup [TIER...]`: makes tiers ready before a request asks for them, and what the
//! front says when a command or tier needs parts this host has not built.
//!
//! Cordon is built from its source tree: setup runs that tree's `scripts/setup-tier.sh`
//! (packages, the release build of `cordon-full`, the tier's guest artifacts; each step
//! idempotent and timed). The tree is found beside the running binary (`target/release/cordon`
//! is two levels below it) or where this binary was compiled from.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use cordon_core::Tier;

/// The script `cordon setup` runs, relative to the source tree.
const SCRIPT: &str = "scripts/setup-tier.sh";

/// The tiers `cordon setup` takes, beside `all`.
const TIERS: [Tier; 4] = [Tier::Container, Tier::Wasm, Tier::Gvisor, Tier::Microvm];

/// The source tree holding [`SCRIPT`]: an ancestor of `exe` (up to four levels), else the
/// tree this binary was built from.
pub fn source_tree(exe: &Path) -> Option<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    exe.ancestors()
        .skip(1)
        .take(4)
        .map(Path::to_path_buf)
        .chain(std::iter::once(built_from))
        .find(|d| d.join(SCRIPT).is_file())
}

/// Checks `cordon setup`'s arguments: tier names or `all`. An error names the choices.
pub fn check_tiers(args: &[OsString]) -> Result<(), String> {
    for a in args {
        let a = a.to_string_lossy();
        if a == "all" || TIERS.iter().any(|t| t.as_str() == a) {
            continue;
        }
        if a == "-h" || a == "--help" {
            return Err(usage());
        }
        return Err(format!(
            "cordon setup: no tier '{a}'; {}",
            usage().trim_start_matches("usage: ")
        ));
    }
    Ok(())
}

fn usage() -> String {
    let names: Vec<&str> = TIERS.iter().map(|t| t.as_str()).collect();
    format!(
        "usage: cordon setup [TIER...] with TIER one of {} or all (no TIER: all); makes the \
         tiers ready: their packages, their build and their guest artifacts",
        names.join(", ")
    )
}

/// `cordon setup ARGS...`: runs the source tree's setup script in this process's place.
/// Returns only on failure, with the exit status to use.
pub fn run(args: &[OsString]) -> i32 {
    if let Err(msg) = check_tiers(args) {
        eprintln!("{msg}");
        return 2;
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let Some(tree) = source_tree(&exe) else {
        eprintln!(
            "cordon: error: `cordon setup` builds from Cordon's source tree, and none was found \
             beside this binary: run it as target/release/cordon of a checkout, or run \
             {SCRIPT} there"
        );
        return 125;
    };
    let err = std::process::Command::new("bash")
        .arg(tree.join(SCRIPT))
        .args(args)
        .exec();
    eprintln!("cordon: error: cannot run {SCRIPT} with bash ({err}); install bash");
    125
}

/// What the front says when `cordon-full` (every command but the container tier's `cordon
/// run`) is not built beside it: the tier a `cordon run` asked for and the command that makes
/// it ready, else the command that builds the rest.
pub fn not_built_message(args: &[OsString]) -> String {
    let command = args.get(1).map(|a| a.to_string_lossy().into_owned());
    if command.as_deref() == Some("run")
        && let Some(tier) = asked_tier(args)
    {
        return format!(
            "cordon: error: the {tier} tier is not set up on this machine: run `{}` (it \
             installs the tier's packages and builds its parts; nothing is built during a \
             request)",
            tier.setup_command()
        );
    }
    match command {
        Some(c) if !c.starts_with('-') => format!(
            "cordon: error: `cordon {c}` needs {full}, which is not built beside this cordon \
             (`make demo` builds only the container tier's `cordon run`): run `cordon setup \
             container` for every command, or `cordon setup all` for every tier",
            full = crate::FULL_BINARY
        ),
        _ => format!(
            "cordon: error: {} is not built beside this cordon: run `cordon setup all`",
            crate::FULL_BINARY
        ),
    }
}

/// The tier a `cordon run` names with `--tier T` (or `--tier=T`) before any `--`.
fn asked_tier(args: &[OsString]) -> Option<Tier> {
    let mut it = args.iter().skip(2).map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        let value = match a.strip_prefix("--tier") {
            Some("") => it.next().map(|v| v.into_owned()),
            Some(v) => v.strip_prefix('=').map(str::to_owned),
            None => None,
        };
        if let Some(v) = value {
            return Tier::ALL.into_iter().find(|t| t.as_str() == v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_run_on_a_tier_that_is_not_built_names_its_setup() {
        for (argv, tier) in [
            (&["cordon", "run", "--tier", "wasm", "-c", "1"][..], "wasm"),
            (
                &["cordon", "run", "--tier=gvisor", "--", "true"][..],
                "gvisor",
            ),
            (
                &["cordon", "run", "--lang", "python", "--tier", "microvm"][..],
                "microvm",
            ),
        ] {
            let m = not_built_message(&os(argv));
            assert!(m.contains(&format!("`cordon setup {tier}`")), "{m}");
            assert!(m.contains(&format!("the {tier} tier is not set up")), "{m}");
        }
        // A `--tier` after `--` is the program's.
        let m = not_built_message(&os(&["cordon", "run", "--", "x", "--tier", "wasm"]));
        assert!(!m.contains("cordon setup wasm"), "{m}");
        let m = not_built_message(&os(&["cordon", "serve"]));
        assert!(m.contains("`cordon serve` needs cordon-full"), "{m}");
        assert!(m.contains("`cordon setup container`"), "{m}");
    }

    #[test]
    fn setup_takes_tiers_and_all_only() {
        assert!(check_tiers(&os(&["wasm", "microvm", "all"])).is_ok());
        let e = check_tiers(&os(&["kvm"])).unwrap_err();
        assert!(
            e.contains("no tier 'kvm'") && e.contains("wasm, gvisor, microvm"),
            "{e}"
        );
        assert!(
            check_tiers(&os(&["runtime"])).is_err(),
            "the runtime tier has nothing to set up"
        );
    }

    #[test]
    fn the_source_tree_is_found_above_the_binary() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("repo");
        std::fs::create_dir_all(tree.join("scripts")).unwrap();
        std::fs::create_dir_all(tree.join("target/release")).unwrap();
        std::fs::write(tree.join(SCRIPT), "").unwrap();
        let found = source_tree(&tree.join("target/release/cordon")).unwrap();
        assert_eq!(found.canonicalize().unwrap(), tree.canonicalize().unwrap());
    }
}
