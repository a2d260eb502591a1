//! The init binary as a user would meet it. (Its work is tested through the container tier,
//! whose tests start it for every sandbox; building this test also builds the binary those
//! tests and the CLI's find next to theirs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn run_by_hand_it_refuses_and_says_what_to_use() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-sandbox-init"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use `cordon run`"), "{err}");
}
