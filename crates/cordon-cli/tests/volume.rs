//! `cordon volume` and `cordon run --volume` as the local user types them: the local user
//! is an attacker too, so names and mount points are checked, a read-only mount refuses
//! writes, and what one run writes the next reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

const BIN: &str = env!("CARGO_BIN_EXE_cordon-full");

fn cordon(home: &Path, args: &[&str]) -> Output {
    cordon_testkit::cordon_at(BIN, home, args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn volumes_are_made_mounted_checked_and_removed_from_the_command_line() {
    if !nix::unistd::geteuid().is_root() {
        cordon_testkit::skip("volumes", "they need root");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let h = home.path();
    let o = cordon(h, &["volume", "create", "data", "--size", "16M"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = cordon(h, &["volume", "create", "data", "--size", "16M"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("exists already"),
        "{}",
        text(&o.stderr)
    );
    for bad in ["Data", "../x", "a.b", "a/b"] {
        let o = cordon(h, &["volume", "create", bad, "--size", "16M"]);
        assert_eq!(o.status.code(), Some(125), "{bad}");
    }

    let run = |volume: &str, script: &str| {
        cordon(
            h,
            &["run", "--lang", "bash", "--volume", volume, "-c", script],
        )
    };
    let o = run(
        "data:/work/data",
        "echo written > /work/data/f && stat -c %u /work/data/f",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "1000\n");
    let o = run("data:/work/in/d:ro", "cat /work/in/d/f; touch /work/in/d/g");
    assert_eq!(text(&o.stdout), "written\n");
    assert!(text(&o.stderr).contains("Read-only"), "{}", text(&o.stderr));
    assert_ne!(o.status.code(), Some(0));
    // Mount points stay under /work; unknown volumes are named as such; no host path shows.
    for bad in [
        "data:/etc",
        "data:/work/../etc",
        "data:/work",
        "data:work",
        "data",
    ] {
        let o = run(bad, "true");
        assert_eq!(o.status.code(), Some(125), "{bad}: {}", text(&o.stderr));
        assert!(
            !text(&o.stderr).contains(&h.display().to_string()),
            "{}",
            text(&o.stderr)
        );
    }
    let o = run("nope:/work/x", "true");
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("no volume \"nope\""),
        "{}",
        text(&o.stderr)
    );

    let o = cordon(h, &["volume", "ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["name"], "data");
    assert_eq!(list[0]["size"], 16 << 20);
    let o = cordon(h, &["volume", "rm", "data"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = cordon(h, &["volume", "ls", "--json"]);
    assert_eq!(text(&o.stdout).trim(), "[]");
}
