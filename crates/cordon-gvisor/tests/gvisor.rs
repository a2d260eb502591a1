#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The gvisor tier end to end. Needs runsc and root; skips loudly without them (fails with
//! CORDON_REQUIRE_ALL=1).

use cordon_core::{Backend, ExecRequest, Language, OutputStream, SandboxSpec, Termination, Tier};
use cordon_gvisor::{GvisorBackend, GvisorConfig};

fn backend() -> Option<GvisorBackend> {
    let b = GvisorBackend::new(GvisorConfig::discover());
    if b.probe().available() {
        return Some(b);
    }
    if std::env::var_os("CORDON_REQUIRE_ALL").is_some_and(|v| v == "1") {
        panic!("the gvisor tier is unavailable: {:?}", b.probe());
    }
    eprintln!(
        "SKIPPING gvisor tests: runsc missing or not root ({:?})",
        b.probe()
    );
    None
}

fn run(b: &GvisorBackend, spec: &SandboxSpec, req: ExecRequest) -> cordon_core::ExecOutcome {
    let mut sb = b.create(spec).unwrap();
    let o = sb.exec(&req, &mut |_: OutputStream, _: &[u8]| {}).unwrap();
    sb.destroy().unwrap();
    o
}

#[test]
fn probe_names_the_tier() {
    let p = GvisorBackend::new(GvisorConfig::discover()).probe();
    assert_eq!(p.tier, Tier::Gvisor);
    assert!(p.capabilities.iter().any(|c| c.name == "runsc"));
}

#[test]
fn true_exits_zero_and_status_propagates() {
    let Some(b) = backend() else { return };
    let spec = SandboxSpec::new(Tier::Gvisor);
    let o = run(&b, &spec, ExecRequest::argv(["true"]));
    assert_eq!((o.termination, o.exit_code), (Termination::Exited, Some(0)));
    let o = run(
        &b,
        &spec,
        ExecRequest::code(Language::Sh, "echo out; echo err >&2; exit 7"),
    );
    assert_eq!(o.exit_code, Some(7));
    assert_eq!(o.stdout, b"out\n");
    assert_eq!(o.stderr, b"err\n");
}

#[test]
fn walls_hold() {
    let Some(b) = backend() else { return };
    let spec = SandboxSpec::new(Tier::Gvisor);
    // Unprivileged, read-only root, no network beyond loopback, no host files.
    let o = run(
        &b,
        &spec,
        ExecRequest::code(
            Language::Sh,
            "id -u; touch /usr/x 2>/dev/null && echo WROTE-USR; ls /root 2>/dev/null && echo HOST-ROOT; \
             cat /etc/shadow 2>/dev/null && echo SHADOW; ls /sys/class/net 2>/dev/null | grep -v lo; echo done",
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("1000\n"), "{out}");
    for bad in ["WROTE-USR", "HOST-ROOT", "SHADOW", "eth"] {
        assert!(!out.contains(bad), "{bad}: {out}");
    }
    assert!(out.contains("done"));
}

#[test]
fn timeout_and_output_limit_and_files() {
    let Some(b) = backend() else { return };
    let mut spec = SandboxSpec::new(Tier::Gvisor);
    spec.limits.timeout_ms = 500;
    spec.limits.stdout_bytes = 1000;
    let o = run(&b, &spec, ExecRequest::argv(["sleep", "10"]));
    assert_eq!(o.termination, Termination::Timeout);
    let o = run(&b, &spec, ExecRequest::argv(["yes"]));
    assert_eq!(o.termination, Termination::OutputLimit);
    assert_eq!(o.stdout.len(), 1000);

    spec.limits.timeout_ms = 20_000;
    let mut sb = b.create(&spec).unwrap();
    sb.put_file("/work/in.txt", b"41", 0o644).unwrap();
    let o = sb
        .exec(
            &ExecRequest::code(
                Language::Sh,
                "echo $(( $(cat in.txt) + 1 )) > /work/out.txt",
            ),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    assert!(o.success(), "{o:?}");
    assert_eq!(sb.get_file("/work/out.txt", 100).unwrap(), b"42\n");
    assert!(sb.get_file("/etc/passwd", 100).is_err());
    assert!(sb.put_file("/work/../etc/x", b"", 0o644).is_err());
    sb.destroy().unwrap();
}
