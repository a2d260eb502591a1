//! Checks shared by the tiers' integration tests, so that every tier is held to the same
//! probe rather than to its own copy of it: the escape battery's tier-neutral probes
//! ([`escape`]) and the egress path ([`egress`]). Each check runs real sandboxes through the
//! [`cordon_core::Backend`] trait and panics with what it saw; test support only, never part
//! of Cordon itself. [`procs`] finds processes left running by a given binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod bench;
pub mod cli;
pub mod egress;
pub mod escape;
pub mod files;
pub mod fuzz;
pub mod image;
pub mod kube;
pub mod podman;
pub mod procs;
pub mod pyindex;
pub mod snapshot;
pub mod suite;
pub mod tls;
pub mod volumes;

use cordon_core::{Backend, ExecOutcome, ExecRequest, Language, OutputStream, SandboxSpec};

/// Runs one request in a fresh sandbox and destroys it.
pub fn run_once(b: &dyn Backend, spec: &SandboxSpec, req: &ExecRequest) -> ExecOutcome {
    let mut sb = b.create(spec).unwrap();
    let o = sb.exec(req, &mut |_: OutputStream, _: &[u8]| {}).unwrap();
    sb.destroy().unwrap();
    o
}

/// A background exec that fills the workspace ends as the same exec in the foreground does:
/// the disk limit, through the one classification of exec endings (issue 50: a background
/// exec's disk was never looked at, so it ended `exited` with code 1).
pub fn a_background_exec_that_fills_the_disk_is_the_disk_limit(
    b: &dyn Backend,
    mut spec: SandboxSpec,
) {
    spec.limits.disk_bytes = 16 << 20;
    let mut sb = b.create(&spec).unwrap();
    let fill = ExecRequest::code(Language::Bash, "head -c 64M /dev/zero > /work/big");
    let o = sb.exec(&fill, &mut |_: OutputStream, _: &[u8]| {}).unwrap();
    assert_eq!(o.termination, cordon_core::Termination::DiskLimit, "{o:?}");
    let rm = ExecRequest::code(Language::Bash, "rm -f /work/big");
    let o = sb.exec(&rm, &mut |_: OutputStream, _: &[u8]| {}).unwrap();
    assert!(o.success(), "{o:?}");
    let id = sb.start_background(&fill).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = sb.read_background(id, [0, 0], 1 << 16).unwrap().exit {
            break exit;
        }
        assert!(std::time::Instant::now() < deadline, "the exec never ended");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(exit.disk_full, "{exit:?}");
    assert_eq!(
        cordon_core::classify(&cordon_core::Evidence::of_background(&exit, false)),
        cordon_core::Termination::DiskLimit,
        "{exit:?}"
    );
    sb.destroy().unwrap();
}

/// A background exec started right after a foreground one gets its job: the foreground
/// exec's reaper, kept to serve the next exec, may still be readying itself (sending its next
/// program's socket) when the background exec is handed to it. A busy loop in the sandbox,
/// under a small CPU share, holds the reaper off the CPU in that window. It once read the
/// socket the agent closed at the background start as "not kept" and exited with the job
/// unread (the exec ended `signal 9` with no report).
pub fn a_background_exec_right_after_a_foreground_one_gets_its_job(
    b: &dyn Backend,
    mut spec: SandboxSpec,
) {
    spec.limits.cpus = 0.2;
    let mut sb = b.create(&spec).unwrap();
    let hog = sb
        .start_background(&ExecRequest::code(Language::Bash, "while :; do :; done"))
        .unwrap();
    for round in 0..15 {
        let o = sb
            .exec(
                &ExecRequest::argv(["true"]),
                &mut |_: OutputStream, _: &[u8]| {},
            )
            .unwrap();
        assert!(o.success(), "round {round}: {o:?}");
        let id = sb
            .start_background(&ExecRequest::argv(["echo", "ran"]))
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let out = loop {
            let out = sb.read_background(id, [0, 0], 1 << 16).unwrap();
            if out.exit.is_some() {
                break out;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let exit = out.exit.unwrap();
        assert_eq!(
            (exit.code, exit.signal),
            (Some(0), None),
            "round {round}: {exit:?}"
        );
        assert_eq!(text(&out.stdout), "ran\n", "round {round}");
    }
    sb.signal_background(hog, cordon_core::ProcSignal::Kill)
        .unwrap();
    sb.destroy().unwrap();
}

pub fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Runs the test `name` of the calling test binary again in a child process with `var` set
/// to a fresh canary, so the variable is in the environment from the process's start and
/// no thread changes the environment while other tests' threads read it (`set_var` in a
/// multi-threaded test binary races with C code's `getenv`). Returns the canary when called
/// in that child; in the parent it checks the child's test passed and returns `None`.
pub fn in_child_with_env(name: &str, var: &str) -> Option<String> {
    if let Ok(canary) = std::env::var(var) {
        return Some(canary);
    }
    let canary = format!("cordon-canary-{}", std::process::id());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads", "1"])
        .env(var, &canary)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} failed in its child process: {stdout}\n{}",
        text(&out.stderr)
    );
    None
}

/// Whether CI asks for every capability (`CORDON_REQUIRE_ALL=1`): then a test that cannot
/// run fails instead of skipping.
pub fn require_all() -> bool {
    std::env::var_os("CORDON_REQUIRE_ALL").is_some_and(|v| v == "1")
}

/// Prints a loud SKIPPING line for `test`, which cannot run here (`why`), or fails under
/// `CORDON_REQUIRE_ALL=1` (CI).
pub fn skip(test: &str, why: &str) {
    assert!(
        !require_all(),
        "{test}: cannot run ({why}) and CORDON_REQUIRE_ALL=1"
    );
    eprintln!("SKIPPING {test}: {why}");
}

/// Runs the cordon binary at `bin` with `args` as a user types them: its home at `home`, no
/// policy file named by the environment.
pub fn cordon_at(bin: &str, home: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin)
        .args(args)
        .env("CORDON_HOME", home)
        .env_remove("CORDON_POLICY")
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"))
}

/// True when running as root; otherwise says loudly that `what` is skipped, or fails when
/// CI asks for every capability (`CORDON_REQUIRE_ALL`). For test crates, and cordon-host's
/// own unit tests (a dev-dependency back onto this crate).
pub fn root_or_skip(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CORDON_REQUIRE_ALL").is_none(),
        "{what} needs root (CORDON_REQUIRE_ALL is set)"
    );
    eprintln!("\n!!!!! SKIPPING: {what} needs root !!!!!\n");
    false
}

/// The root of a tier made of the host's `/usr` shows the dynamic linker's index of it, so a
/// program's libraries are found at once rather than searched for through a dozen missing
/// directories (each a failed `openat` and `stat`; under gVisor, a trap into the sentry).
pub fn libraries_found_through_the_linkers_cache(b: &dyn Backend, spec: &SandboxSpec) {
    if !std::path::Path::new("/etc/ld.so.cache").is_file() {
        assert!(
            std::env::var_os("CORDON_REQUIRE_ALL").is_none(),
            "this host has no /etc/ld.so.cache (run ldconfig)"
        );
        eprintln!("\n!!!!! SKIPPING: this host has no /etc/ld.so.cache (run ldconfig) !!!!!\n");
        return;
    }
    let o = run_once(
        b,
        spec,
        &ExecRequest::code(Language::Sh, "LD_DEBUG=libs /bin/true 2>&1"),
    );
    let out = text(&o.stdout);
    assert!(out.contains("search cache=/etc/ld.so.cache"), "{out}");
    assert!(
        !out.contains("search path="),
        "a library was searched for: {out}"
    );
}

/// Execs in one live sandbox follow each other cleanly: what one exec left running is gone
/// before the next starts (a tier may serve them from one process namespace), and each
/// reports its own CPU time, never its predecessors'.
pub fn sequential_execs_start_clean(b: &dyn Backend, spec: &SandboxSpec) {
    let mut sb = b.create(spec).unwrap();
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let burn = ExecRequest::code(
        Language::Python,
        "import subprocess, time\n\
         subprocess.Popen(['sleep', '1000'], start_new_session=True)\n\
         subprocess.Popen(['sh', '-c', '(sleep 1001 &)'])\n\
         while time.process_time() < 2.0: pass\n\
         print('burned')",
    );
    let look = ExecRequest::code(
        Language::Sh,
        "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done; echo looked",
    );
    // A program ended by a real-time signal (which `nix`'s wait status cannot represent)
    // leaves a daemon: its exec still ends with the whole tree.
    let rt = ExecRequest::code(
        Language::Python,
        "import os, signal, subprocess\n\
         subprocess.Popen(['sleep', '1002'], start_new_session=True)\n\
         os.kill(os.getpid(), signal.SIGRTMIN)",
    );
    let o = sb.exec(&rt, &mut sink).unwrap();
    assert!(o.signal.is_some_and(|s| s >= 32), "{o:?}");
    for round in 0..2 {
        let o = sb.exec(&burn, &mut sink).unwrap();
        assert_eq!(text(&o.stdout), "burned\n", "{o:?}");
        assert!(o.usage.cpu_time_us >= 1_900_000, "round {round}: {o:?}");
        let o = sb.exec(&look, &mut sink).unwrap();
        let out = text(&o.stdout);
        assert!(out.ends_with("looked\n"), "{o:?}");
        assert!(
            !out.lines().any(|l| l == "sleep" || l == "python3"),
            "round {round}: a process of the last exec is still there: {out}"
        );
        // Charged its predecessor, it would report at least the burn's 2 s. Its own time
        // is small, but gVisor counts a task's time while the host keeps it waiting: 0.64 s
        // for this loop was seen on a loaded 2-core host, hence the wide margin.
        assert!(
            o.usage.cpu_time_us < 1_200_000,
            "round {round}: the exec was charged its predecessor's CPU: {o:?}"
        );
    }
    sb.destroy().unwrap();
}

/// Asserts that `o`, as the API writes it, has every key every tier's outcome has.
pub fn assert_outcome_shape(o: &cordon_core::ExecOutcome) {
    let v = serde_json::to_value(o).expect("an outcome serializes");
    for key in [
        "tier",
        "termination",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "usage",
        "timings",
        "weakened",
        "warnings",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
}
