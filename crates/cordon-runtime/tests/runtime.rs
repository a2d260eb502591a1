//! The runtime tier's integration tests: its part of the escape battery. The tier has no
//! I/O objects at all, so most escapes are "the object does not exist".

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests panic on failure by design

use std::time::Instant;

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, Language, OutputStream, SandboxSpec, Termination,
    Tier,
};
use cordon_runtime::RuntimeBackend;

fn spec() -> SandboxSpec {
    let mut s = SandboxSpec::new(Tier::Runtime);
    s.limits.timeout_ms = 5_000;
    s.limits.memory_bytes = 64 << 20;
    s
}

fn run_with(spec: &SandboxSpec, src: &str) -> ExecOutcome {
    let mut sb = RuntimeBackend::new().create(spec).expect("create");
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let o = sb
        .exec(&ExecRequest::code(Language::Javascript, src), &mut sink)
        .expect("exec");
    sb.destroy().expect("destroy");
    o
}

fn js(src: &str) -> ExecOutcome {
    run_with(&spec(), src)
}

fn out(o: &ExecOutcome) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn evaluates_and_prints() {
    let o = js("1 + 2");
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "3\n");
    assert_eq!(o.tier, Tier::Runtime);
    let o = js("console.log([1,2,3].map(x => x * 2)); console.error('e')");
    assert_eq!(out(&o), "[ 2, 4, 6 ]\n");
    assert_eq!(o.stderr, b"e\n");
    let o = js("throw new Error('boom')");
    assert_eq!(o.exit_code, Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Error: boom"));
    assert!(o.warnings.iter().any(|w| w.contains("weakest wall")));
}

#[test]
fn no_io_objects_exist() {
    let o = js(
        "[typeof require, typeof process, typeof std, typeof os, typeof fetch, \
                typeof XMLHttpRequest, typeof WebSocket, typeof Deno, typeof setTimeout].join()",
    );
    assert_eq!(
        out(&o),
        "'undefined,undefined,undefined,undefined,undefined,undefined,undefined,undefined,undefined'\n"
    );
    // No module loader: dynamic import of host modules fails.
    let o = js("import('os').then(() => console.log('loaded'), e => console.log('refused'))");
    assert!(!out(&o).contains("loaded"), "{}", out(&o));
}

#[test]
fn environment_canary_never_appears() {
    let Some(canary) =
        cordon_testkit::in_child_with_env("environment_canary_never_appears", "CORDON_TEST_CANARY")
    else {
        return;
    };
    let o = js("Object.getOwnPropertyNames(globalThis).join(' ')");
    assert!(!out(&o).contains(&canary));
    assert!(!out(&o).contains("CORDON_TEST_CANARY"));
}

#[test]
fn files_are_refused() {
    let mut sb = RuntimeBackend::new().create(&spec()).unwrap();
    // Refused as the feature it is, naming the tiers that have it: a workspace file, and a
    // file outside the workspace (ADR 0031).
    for (r, feature) in [
        (
            sb.put_file("/work/a", b"x", 0o644).map(drop),
            cordon_core::Feature::Files,
        ),
        (
            sb.get_file("/etc/passwd", 10).map(drop),
            cordon_core::Feature::FilesOutside,
        ),
    ] {
        match r {
            Err(Error::Unsupported { fix, .. }) => assert_eq!(fix, feature.fix()),
            other => panic!("{other:?}"),
        }
    }
    // No workspace: the directory calls say so, and name the tiers that have one.
    let list = sb.file_op(&cordon_core::FileOp::List {
        path: "/work".into(),
    });
    let tar = sb.get_archive("/work", 1 << 20, &mut Vec::new());
    let up = sb.put_archive("/work", &mut &b""[..]);
    for r in [list.map(|_| ()), tar.map(|_| ()), up.map(|_| ())] {
        match r {
            Err(e @ Error::Unsupported { .. }) => {
                assert!(e.to_string().contains("container"), "{e}")
            }
            other => panic!("expected unsupported, got {other:?}"),
        }
    }
}

#[test]
fn infinite_loop_times_out() {
    let mut s = spec();
    s.limits.timeout_ms = 200;
    let t = Instant::now();
    let o = run_with(&s, "for(;;){}");
    assert_eq!(o.termination, Termination::Timeout, "{o:#?}");
    assert!(t.elapsed().as_millis() < 2000);
    let o = run_with(&s, "try { for(;;){} } catch (e) { console.log('caught') }");
    assert_eq!(
        o.termination,
        Termination::Timeout,
        "the deadline must not be catchable"
    );
    assert!(!out(&o).contains("caught"));
}

#[test]
fn memory_bomb_is_out_of_memory() {
    let o = js("let a = []; for(;;) a.push(new Array(1e6).fill(1.5))");
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:#?}");
    let o = js("'x'.repeat(1 << 29)");
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:#?}");
}

/// The memory limit is read from the engine's refusal, not from what the script wrote: a
/// script that prints "out of memory" and fails exited (code 1), and one that caught a
/// real refusal and went on to finish exited cleanly. (The old tier searched its stderr
/// for the words and called the first one out-of-memory.)
#[test]
fn out_of_memory_is_the_engines_refusal_not_the_scripts_words() {
    let o = js("console.error('cache: out of memory, retrying'); throw new Error('gave up')");
    assert_eq!(o.termination, Termination::Exited, "{o:#?}");
    assert_eq!(o.exit_code, Some(1), "{o:#?}");
    let o = js("try { 'x'.repeat(1 << 29) } catch (e) { console.log(String(e)) } 'done'");
    assert_eq!(o.termination, Termination::Exited, "{o:#?}");
    assert_eq!(o.exit_code, Some(0), "{o:#?}");
    assert!(out(&o).contains("done"), "{o:#?}");
}

#[test]
fn deep_recursion_is_contained() {
    let o = js("function f(n) { return f(n + 1) + 1 } f(0)");
    assert!(!o.success());
    assert_eq!(o.termination, Termination::Exited, "{o:#?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("stack"),
        "{o:#?}"
    );
    assert!(js("1").success());
}

#[test]
fn output_flood_is_truncated() {
    let mut s = spec();
    s.limits.stdout_bytes = 32 << 10;
    let o = run_with(&s, "for(;;) console.log('x'.repeat(1000))");
    assert_eq!(o.termination, Termination::OutputLimit, "{o:#?}");
    assert!(o.stdout_truncated);
    assert_eq!(o.stdout.len(), 32 << 10);
}

#[test]
fn only_javascript_runs_here() {
    let mut sb = RuntimeBackend::new().create(&spec()).unwrap();
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let r = sb.exec(&ExecRequest::code(Language::Python, "print(1)"), &mut sink);
    assert!(matches!(
        r,
        Err(Error::Rejected(cordon_core::Rejected::TierLanguage { .. }))
    ));
    let r = sb.exec(&ExecRequest::argv(["sh", "-c", "id"]), &mut sink);
    assert!(
        matches!(&r, Err(Error::Unsupported { fix, .. }) if *fix == cordon_core::Feature::Programs.fix()),
        "{r:?}"
    );
}

#[test]
fn outcome_has_the_shape_of_every_tier() {
    cordon_testkit::assert_outcome_shape(&js("1"));
}
