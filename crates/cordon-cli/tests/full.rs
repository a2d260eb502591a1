//! `cordon-full` as a binary. (The CLI's behaviour is tested through the front, in
//! crates/cordon-front/tests/cli.rs, which execs this binary beside it; building this test
//! also builds `cordon-full` for those.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn it_has_every_command() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-full"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "run", "doctor", "bench", "cost", "image", "serve", "mcp", "audit", "policy",
    ] {
        assert!(help.contains(&format!("  {cmd} ")), "{cmd} missing: {help}");
    }
}
