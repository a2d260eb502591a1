//! The wasm tier's integration tests, including its part of the escape battery. They need
//! the guests `scripts/setup.sh` builds and fail loudly (never skip) when they are missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests panic on failure by design

use std::sync::OnceLock;
use std::time::Instant;

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, Language, Sandbox, SandboxSpec, Termination, Tier,
    TierStatus,
};
use cordon_wasm::{Guest, WasmBackend, WasmConfig};

#[path = "wasm/snapshots.rs"]
mod snapshots;

fn backend() -> &'static WasmBackend {
    static B: OnceLock<WasmBackend> = OnceLock::new();
    B.get_or_init(|| {
        let b = WasmBackend::new();
        let probe = b.probe();
        assert_eq!(
            probe.status,
            TierStatus::Available,
            "the wasm tier's guests are missing: run `cordon setup wasm` (or scripts/setup.sh) first. Probe: {probe:#?}"
        );
        for g in Guest::ALL {
            b.warm(g)
                .unwrap_or_else(|e| panic!("loading the {g:?} guest: {e}"));
        }
        b
    })
}

fn spec() -> SandboxSpec {
    let mut s = SandboxSpec::new(Tier::Wasm);
    s.limits.timeout_ms = 10_000;
    s.limits.memory_bytes = 256 << 20;
    s
}

fn exec_in(sb: &mut dyn Sandbox, req: &ExecRequest) -> ExecOutcome {
    let mut streamed = Vec::new();
    let o = sb
        .exec(req, &mut |_s: cordon_core::OutputStream, d: &[u8]| {
            streamed.extend_from_slice(d)
        })
        .unwrap_or_else(|e| panic!("exec failed: {e}"));
    assert_eq!(
        streamed.len(),
        o.stdout.len() + o.stderr.len(),
        "the sink saw all output"
    );
    o
}

fn run_with(spec: &SandboxSpec, lang: Language, src: &str) -> ExecOutcome {
    let mut sb = backend().create(spec).expect("create");
    let o = exec_in(sb.as_mut(), &ExecRequest::code(lang, src));
    sb.destroy().expect("destroy");
    o
}

fn py(src: &str) -> ExecOutcome {
    run_with(&spec(), Language::Python, src)
}

fn js(src: &str) -> ExecOutcome {
    run_with(&spec(), Language::Javascript, src)
}

fn out(o: &ExecOutcome) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &ExecOutcome) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn contained(o: &ExecOutcome) {
    assert!(
        !o.success(),
        "expected the attempt to fail; stdout: {} stderr: {}",
        out(o),
        err(o)
    );
    assert_ne!(o.termination, Termination::SandboxFailure, "{o:#?}");
}

#[test]
fn python_runs_with_the_stdlib() {
    let o = py("import json, statistics\nprint(statistics.mean([1,2,3]), json.dumps({'a': 1}))");
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "2 {\"a\": 1}\n");
    assert_eq!(o.tier, Tier::Wasm);
    let o = py("import sys\nsys.exit(3)");
    assert_eq!(o.termination, Termination::Exited);
    assert_ne!(o.exit_code, Some(0));
    let o = py("raise ValueError('boom')");
    assert_eq!(o.exit_code, Some(1));
    assert!(err(&o).contains("ValueError: boom"), "{}", err(&o));
}

#[test]
fn python_reads_stdin_and_args() {
    let mut sb = backend().create(&spec()).unwrap();
    let mut req = ExecRequest::new(cordon_core::Command::Code {
        language: Language::Python,
        source: "import sys\nprint(sys.argv[1:], sys.stdin.read().upper())".into(),
        args: vec!["a".into(), "b".into()],
    });
    req.stdin = Some(b"hello".to_vec());
    let o = exec_in(sb.as_mut(), &req);
    assert_eq!(out(&o), "['a', 'b'] HELLO\n", "{o:#?}");
}

#[test]
fn javascript_runs() {
    let o = js("console.log([1,2,3].map(x => x * 2))");
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "[ 2, 4, 6 ]\n");
    let o = js("1 + 2");
    assert_eq!(out(&o), "3\n");
    let o = js("throw new TypeError('nope')");
    assert_eq!(o.exit_code, Some(1));
    assert!(err(&o).contains("TypeError: nope"), "{}", err(&o));
}

#[test]
fn javascript_runs_see_fresh_randomness_and_the_current_time() {
    // The JavaScript guest starts from a snapshot taken at setup time: nothing that must
    // differ per run (Math.random's state, the clock) may come out of it.
    let src = "console.log(JSON.stringify([Math.random(), Math.random(), Date.now(), performance.timeOrigin, \
               performance.now(), Math.random.name, Math.random.length, \
               Object.getOwnPropertyDescriptor(Math, 'random').enumerable, \
               Array.from({length: 10000}, Math.random).every(x => x >= 0 && x < 1)]))";
    let mut sb = backend().create(&spec()).unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as f64;
        let o = exec_in(sb.as_mut(), &ExecRequest::code(Language::Javascript, src));
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as f64;
        assert!(o.success(), "{o:#?}");
        let v: serde_json::Value = serde_json::from_str(out(&o).trim()).unwrap();
        let num = |i: usize| v[i].as_f64().unwrap_or_else(|| panic!("{v}"));
        assert_ne!(num(0), num(1), "{v}");
        let now = num(2);
        assert!(
            now >= before && now <= after,
            "Date.now(): {v}: not in {before}..{after}"
        );
        // QuickJS's performance clock is the monotonic one (which WASI starts per run); the
        // snapshot's time origin is exactly 0, a run's is later.
        assert!(num(3) > 0.0, "performance.timeOrigin: {v}");
        assert!(num(4) >= 0.0 && num(4) < 60_000.0, "performance.now(): {v}");
        assert_eq!(v[5], "random", "{v}");
        assert_eq!(v[6], 0, "{v}");
        assert_eq!(v[7], false, "{v}");
        assert_eq!(v[8], true, "{v}");
        runs.push((num(0), num(1)));
    }
    sb.destroy().unwrap();
    assert_ne!(
        runs[0], runs[1],
        "two runs drew the same Math.random() values"
    );
}

#[test]
fn python_draws_fresh_randomness_in_every_exec() {
    // The guest starts from a snapshot taken when it was built: whatever state it drew then
    // would repeat in every exec unless each exec draws its own.
    let src = "import random, uuid, os, tempfile\n\
               print(random.random(), random.getrandbits(64), uuid.uuid4(), os.urandom(8).hex())";
    let mut sb = backend().create(&spec()).unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let o = exec_in(sb.as_mut(), &ExecRequest::code(Language::Python, src));
        assert!(o.success(), "{o:#?}");
        seen.push(out(&o));
    }
    sb.destroy().unwrap();
    let other = py(src);
    seen.push(out(&other));
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            for (x, y) in a.split_whitespace().zip(b.split_whitespace()) {
                assert_ne!(x, y, "two execs drew the same value: {seen:?}");
            }
        }
    }
}

#[test]
fn python_holds_nothing_of_its_build() {
    // The standard library was readable while the guest was built; in a sandbox it is not.
    let o = py("import sys\nprint(sys.version_info[:2])\n\
                open('/usr/local/lib/python3.13/os.py').read()");
    contained(&o);
    assert_eq!(out(&o), "(3, 13)\n");
    assert!(err(&o).contains("FileNotFoundError"), "{}", err(&o));
    let o = py("import os\nprint(os.listdir('/usr/local/lib/python3.13'))");
    contained(&o);
    assert!(err(&o).contains("FileNotFoundError"), "{}", err(&o));
    // A module the snapshot does not hold is refused with the tier's message, not looked up.
    let o = py("import tabnanny");
    contained(&o);
    assert!(err(&o).contains("--tier container"), "{}", err(&o));
    // The snippet's own modules import from its working directory, as with `python -c`;
    // they do not shadow what the snapshot holds.
    let mut sb = backend().create(&spec()).unwrap();
    sb.put_file("helper.py", b"X = 42\n", 0o644).unwrap();
    sb.put_file("json.py", b"raise SystemExit(9)\n", 0o644)
        .unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, "import helper, json\nprint(helper.X)"),
    );
    assert_eq!(out(&o), "42\n", "{}", err(&o));
    sb.destroy().unwrap();
    // Its files, environment and working directory are the exec's own.
    let o = py("import os\nopen('mine.txt', 'w').write('x')\n\
                print(os.getcwd(), sorted(os.listdir('/work')), os.environ.get('HOME'))");
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "/work ['mine.txt'] /work\n");
}

#[test]
fn python_encodes_with_every_codec() {
    // Codecs are imported on first use; the guest preloads them all.
    let o = py(
        "print('é€'.encode('utf-16-le').hex(), 'é'.encode('latin-1'), \
                b'\\x80'.decode('cp1252'), 'bücher.example'.encode('idna'), \
                __import__('codecs').encode('abc', 'rot13'), \
                'ß'.encode('cp437'), 'ä'.encode('mac_roman'), 'テ'.encode('shift_jis'))",
    );
    assert!(o.success(), "{}", err(&o));
    assert_eq!(
        out(&o),
        "e900ac20 b'\\xe9' € b'xn--bcher-kva.example' nop b'\\xe1' b'\\x8a' b'\\x83e'\n"
    );
}

#[test]
fn missing_module_names_the_limits_and_the_tier_to_use() {
    for m in ["numpy", "socket", "subprocess", "_socket", "ctypes"] {
        let o = py(&format!("import {m}"));
        contained(&o);
        let e = err(&o);
        assert!(e.contains("ModuleNotFoundError"), "{m}: {e}");
        assert!(e.contains("--tier container"), "{m}: {e}");
    }
}

#[test]
fn files_move_in_and_out_of_work() {
    let mut sb = backend().create(&spec()).unwrap();
    sb.put_file("/work/in.csv", b"a,b\n1,2\n", 0o644).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "import csv\nrows = list(csv.reader(open('in.csv')))\nopen('/work/out.txt','w').write(str(len(rows)))",
        ),
    );
    assert!(o.success(), "{o:#?}");
    assert_eq!(sb.get_file("/work/out.txt", 100).unwrap(), b"2");
    assert!(sb.get_file("/work/out.txt", 0).is_err());
    sb.destroy().unwrap();
    assert!(matches!(
        sb.get_file("/work/out.txt", 100),
        Err(Error::Gone { .. })
    ));
}

// ---- escape battery ----

#[test]
fn host_files_are_invisible() {
    let o = py("print(open('/etc/passwd').read())");
    contained(&o);
    assert!(!out(&o).contains("root:"));
    let o = py("print(open('/work/../etc/passwd').read())");
    contained(&o);
    let o = py("import os\nprint(os.listdir('/'))");
    assert!(!out(&o).contains("etc"), "{}", out(&o));
    let o = py("import os\nprint(open('/proc/self/environ').read())");
    contained(&o);
}

#[test]
fn environment_canary_never_appears() {
    let Some(canary) =
        cordon_testkit::in_child_with_env("environment_canary_never_appears", "CORDON_TEST_CANARY")
    else {
        return;
    };
    let o = py("import os\nprint(dict(os.environ))");
    assert!(o.success(), "{o:#?}");
    assert!(!out(&o).contains(&canary));
    assert!(out(&o).contains("HOME"), "{}", out(&o));
    let o = js("typeof process + ' ' + typeof std + ' ' + typeof os");
    assert_eq!(out(&o), "'undefined undefined undefined'\n");
    let mut s = spec();
    s.env.insert("GIVEN".into(), "yes".into());
    let o = run_with(
        &s,
        Language::Python,
        "import os\nprint(os.environ.get('GIVEN'), 'CORDON_TEST_CANARY' in os.environ)",
    );
    assert_eq!(out(&o), "yes False\n");
}

#[test]
fn no_sockets_no_subprocesses() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let o = py(&format!(
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}))"
    ));
    contained(&o);
    assert!(
        listener.accept().is_err(),
        "the guest reached the host's listener"
    );
    let o = py("import os\nos.system('id')");
    contained(&o);
    let o = py("import os\nos.fork()");
    contained(&o);
    let o = py("import os\nos.execv('/bin/sh', ['sh'])");
    contained(&o);
}

#[test]
fn writes_stay_inside_work() {
    let marker = format!("/tmp/cordon-wasm-escape-{}", std::process::id());
    for target in [marker.as_str(), "/work/../escape", "../escape"] {
        let o = py(&format!("open({target:?}, 'w').write('x')"));
        contained(&o);
    }
    assert!(!std::path::Path::new(&marker).exists());
}

#[test]
fn path_tricks_on_files_out_are_refused() {
    let mut sb = backend().create(&spec()).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "import os\nos.mkdir('d')\nopen('d/real','w').write('ok')\n\
             for src, dst in [('../../../../etc/passwd', 'up'), ('/etc/passwd', 'abs'), ('d', 'dirlink')]:\n\
             \ttry:\n\t\tos.symlink(src, dst)\n\texcept OSError as e:\n\t\tprint('refused', dst, e)",
        ),
    );
    assert!(o.success(), "{o:#?}");
    for p in [
        "/work/up",
        "/work/abs",
        "/work/dirlink/real",
        "/work/../etc/passwd",
        "d/../../x",
    ] {
        match sb.get_file(p, 1 << 20) {
            Err(Error::PathRefused { .. }) | Err(Error::File { .. }) => {}
            other => panic!("{p}: expected a refusal, got {other:?}"),
        }
    }
    // A path outside /work is a feature this tier does not have (ADR 0031), said as such.
    match sb.get_file("/etc/passwd", 1 << 20) {
        Err(Error::Unsupported { fix, .. }) => {
            assert_eq!(fix, cordon_core::Feature::FilesOutside.fix())
        }
        other => panic!("/etc/passwd: expected the feature's refusal, got {other:?}"),
    }
    assert_eq!(sb.get_file("/work/d/real", 100).unwrap(), b"ok");
    assert!(matches!(
        sb.put_file("/work/dirlink/x", b"x", 0o644),
        Err(Error::PathRefused { .. }) | Err(Error::File { .. })
    ));
}

#[test]
fn infinite_loop_times_out() {
    let mut s = spec();
    s.limits.timeout_ms = 300;
    for (lang, src) in [
        (Language::Python, "while True: pass"),
        (Language::Javascript, "for(;;){}"),
        (Language::Python, "import time\ntime.sleep(60)"),
    ] {
        let t = Instant::now();
        let o = run_with(&s, lang, src);
        assert_eq!(o.termination, Termination::Timeout, "{src}: {o:#?}");
        assert!(
            t.elapsed().as_millis() < 3000,
            "{src} took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn fuel_bounds_cpu_deterministically() {
    let mut s = spec();
    s.limits.fuel = Some(10_000_000);
    let o = run_with(&s, Language::Javascript, "for(;;){}");
    assert_eq!(o.termination, Termination::Timeout, "{o:#?}");
    assert!(
        o.warnings.iter().any(|w| w.contains("fuel")),
        "{:?}",
        o.warnings
    );
}

#[test]
fn memory_bomb_is_out_of_memory() {
    let mut s = spec();
    s.limits.memory_bytes = 96 << 20;
    for (lang, src) in [
        (Language::Python, "x = bytearray(1 << 30)"),
        (
            Language::Python,
            "a = []\nwhile True: a.append('x' * 10**6)",
        ),
        (
            Language::Javascript,
            "let a = []; for(;;) a.push(new Array(1e6).fill(1.5))",
        ),
    ] {
        let o = run_with(&s, lang, src);
        assert_eq!(o.termination, Termination::OutOfMemory, "{src}: {o:#?}");
        assert!(o.usage.peak_memory_bytes <= 96 << 20, "{o:#?}");
    }
}

#[test]
fn deep_recursion_is_contained() {
    for (lang, src) in [
        (Language::Python, "def f(n): return f(n + 1)\nf(0)"),
        (
            Language::Python,
            "import sys\nsys.setrecursionlimit(10**7)\ndef f(n): return f(n + 1)\nf(0)",
        ),
        (
            Language::Javascript,
            "function f(n) { return f(n + 1) + 1 } f(0)",
        ),
    ] {
        let o = py_or_js(lang, src);
        contained(&o);
    }
    // And the backend still works afterwards.
    assert!(py("print(1)").success());
}

fn py_or_js(lang: Language, src: &str) -> ExecOutcome {
    run_with(&spec(), lang, src)
}

#[test]
fn output_flood_is_truncated() {
    let mut s = spec();
    s.limits.stdout_bytes = 64 << 10;
    for (lang, src) in [
        (Language::Python, "while True: print('x' * 1000)"),
        (
            Language::Javascript,
            "for(;;) console.log('x'.repeat(1000))",
        ),
    ] {
        let o = run_with(&s, lang, src);
        assert_eq!(o.termination, Termination::OutputLimit, "{src}: {o:#?}");
        assert!(o.stdout_truncated);
        assert_eq!(o.stdout.len(), 64 << 10);
    }
}

#[test]
fn scratch_disk_flood_hits_the_disk_limit() {
    let mut s = spec();
    s.limits.disk_bytes = 4 << 20;
    let mut sb = backend().create(&s).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "f = open('/work/big', 'wb')\nwhile True:\n    f.write(b'x' * 65536)\n    f.flush()",
        ),
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:#?}");
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "import os\ni = 0\nwhile True:\n    open(f'/work/f{i}', 'w').close()\n    i += 1",
        ),
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:#?}");
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "import os\nprint(os.path.getsize('/work/big'))",
        ),
    );
    let size: u64 = out(&o).trim().parse().unwrap();
    assert!(size <= 4 << 20, "the file grew past the limit: {size}");
    assert!(
        sb.put_file("/work/more", &vec![0u8; 5 << 20], 0o644)
            .is_err()
    );
}

/// Nests directories past the host's PATH_MAX (each opened relative to the last, so every
/// path the guest gives is short), then writes 1 MiB files at the bottom.
const DEEP_WRITE: &str = r#"
import os
fd = os.open('/work', os.O_RDONLY | os.O_DIRECTORY)
name = 'd' * 200
for i in range(30):
    os.mkdir(name, dir_fd=fd)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
chunk = b'x' * (1 << 20)
total = 0
try:
    for i in range(MANY):
        f = os.open(f'f{i}', os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        view = memoryview(chunk)
        while view:
            n = os.write(f, view)
            total += n
            view = view[n:]
        os.close(f)
except OSError as e:
    print('refused', e.errno)
print('wrote', total)
"#;

fn wrote(o: &ExecOutcome) -> u64 {
    let text = out(o);
    let line = text
        .lines()
        .find(|l| l.starts_with("wrote "))
        .unwrap_or_else(|| panic!("{o:#?}"));
    line[6..].trim().parse().unwrap()
}

#[test]
fn nesting_past_path_max_does_not_walk_around_the_disk_limit() {
    let mut s = spec();
    s.limits.disk_bytes = 16 << 20;
    let mut sb = backend().create(&s).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, DEEP_WRITE.replace("MANY", "64")),
    );
    let first = wrote(&o);
    assert!(out(&o).contains("refused"), "{o:#?}");
    assert!(
        first <= 16 << 20,
        "{first} bytes written under a 16 MiB disk"
    );
    // The count outlives the exec: the next exec, and a file put, find the disk full.
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(
            Language::Python,
            "open('/work/more', 'wb').write(b'x' * (1 << 20))",
        ),
    );
    assert_eq!(o.termination, Termination::DiskLimit, "{o:#?}");
    assert!(
        sb.put_file("/work/more", &vec![0u8; 1 << 20], 0o644)
            .is_err()
    );
    sb.destroy().unwrap();
}

#[test]
fn open_descriptors_are_capped_per_sandbox() {
    let mut s = spec();
    s.limits.open_files = 64;
    let o = run_with(
        &s,
        Language::Python,
        "fs = []\ntry:\n    for i in range(5000):\n        fs.append(open(f'/work/f{i}', 'w'))\n\
         except OSError as e:\n    print('refused', e.errno)\nprint('opened', len(fs))",
    );
    assert!(!out(&o).contains("opened 5000"), "{o:#?}");
    assert_eq!(o.termination, Termination::ProcessLimit, "{o:#?}");
    assert!(
        o.warnings.iter().any(|w| w.contains("open files")),
        "{:?}",
        o.warnings
    );
    // Below the cap the same program runs.
    let o = run_with(
        &s,
        Language::Python,
        "fs = [open(f'/work/f{i}', 'w') for i in range(32)]\nprint('opened', len(fs))",
    );
    assert_eq!(out(&o).trim(), "opened 32", "{o:#?}");
}

// ---- users' own modules ----

fn wasm_req(bytes: Vec<u8>, args: &[&str]) -> ExecRequest {
    ExecRequest::wasm(bytes, args.iter().map(|s| s.to_string()).collect())
}

const HELLO_P1: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello from wasm\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 16))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#;

#[test]
fn user_p1_module_runs() {
    let mut sb = backend().create(&spec()).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(wat::parse_str(HELLO_P1).unwrap(), &["a"]),
    );
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "hello from wasm\n");
}

/// Prints its last argument and a newline (a WASI preview 1 command module).
const ECHO_LAST_ARG_P1: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 96) "\n")
  (func (export "_start") (local $argc i32) (local $last i32)
    (if (call $args_sizes_get (i32.const 100) (i32.const 104)) (then unreachable))
    (if (call $args_get (i32.const 200) (i32.const 1024)) (then unreachable))
    (local.set $argc (i32.load (i32.const 100)))
    (local.set $last (i32.load (i32.add (i32.const 196) (i32.mul (local.get $argc) (i32.const 4)))))
    ;; the last argument without its NUL, then the newline: one write each (the adapter
    ;; writes one buffer per call)
    (i32.store (i32.const 0) (local.get $last))
    (i32.store (i32.const 4) (i32.sub (i32.sub (i32.add (i32.const 1024) (i32.load (i32.const 104))) (local.get $last)) (i32.const 1)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
    (i32.store (i32.const 0) (i32.const 96))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))
"#;

#[test]
fn user_p2_component_runs() {
    // A wasi:cli/command component: the module above behind wasmtime's preview 1 adapter.
    let module = wat::parse_str(ECHO_LAST_ARG_P1).unwrap();
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .adapter(
            "wasi_snapshot_preview1",
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
        )
        .unwrap()
        .validate(true)
        .encode()
        .unwrap();
    assert_eq!(
        &component[4..8],
        &[0x0d, 0x00, 0x01, 0x00],
        "not a component"
    );
    let mut sb = backend().create(&spec()).unwrap();
    let o = exec_in(sb.as_mut(), &wasm_req(component, &["x", "42"]));
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "42\n");
}

/// Checks that its memory is pristine (data segment intact, 200 scattered bytes and the
/// grown part zero), then dirties all of it: every run in a reused slot must start clean.
const DIRTIES_MEMORY: &str = r#"
(module
  (memory 64)
  (data (i32.const 16) "A")
  (func (export "_start") (local $i i32) (local $a i32)
    (if (i32.ne (i32.load8_u (i32.const 16)) (i32.const 65)) (then unreachable))
    (i32.store8 (i32.const 16) (i32.const 90))
    (loop $l
      (local.set $a (i32.add (i32.mul (local.get $i) (i32.const 20000)) (i32.const 100)))
      (if (i32.load8_u (local.get $a)) (then unreachable))
      (i32.store8 (local.get $a) (i32.const 171))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 200))))
    (if (i32.ne (memory.grow (i32.const 16)) (i32.const 64)) (then unreachable))
    (if (i32.load8_u (i32.const 4300000)) (then unreachable))
    (i32.store8 (i32.const 4300000) (i32.const 171))))
"#;

#[test]
fn every_exec_starts_from_pristine_memory() {
    let mut sb = backend().create(&spec()).unwrap();
    let module = wat::parse_str(DIRTIES_MEMORY).unwrap();
    for round in 0..6 {
        let o = exec_in(sb.as_mut(), &wasm_req(module.clone(), &[]));
        assert!(o.success(), "round {round}: memory left over: {o:#?}");
    }
    // The Python guest: what one exec changes in the interpreter is gone in the next.
    let dirty = "import sys, json\nsys.cordon_left = 1\njson.cordon_left = 1\n\
                 keep = [bytearray(b'x' * 4096) for _ in range(2000)]\nprint('dirty')";
    let check =
        "import sys, json\nprint(hasattr(sys, 'cordon_left'), hasattr(json, 'cordon_left'))";
    for round in 0..4 {
        let o = exec_in(sb.as_mut(), &ExecRequest::code(Language::Python, dirty));
        assert_eq!(out(&o), "dirty\n", "round {round}: {o:#?}");
        let o = exec_in(sb.as_mut(), &ExecRequest::code(Language::Python, check));
        assert_eq!(
            out(&o),
            "False False\n",
            "round {round}: state leaked: {o:#?}"
        );
    }
}

#[test]
fn malformed_and_hostile_modules_get_clear_errors() {
    let mut sb = backend().create(&spec()).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"#!/bin/sh\necho hi".to_vec(), "not a WebAssembly binary"),
        (b"\0asm\x01\0\0\0\x01\xff\xff\xff".to_vec(), "does not compile"),
        (b"\0asm\x0d\0\x01\0\xff".to_vec(), "does not compile"),
        (
            wat::parse_str(r#"(module (import "env" "escape" (func)) (func (export "_start")))"#)
                .unwrap(),
            "imports something",
        ),
        (
            wat::parse_str(r#"(module (import "wasi_snapshot_preview1" "sock_open" (func (param i32 i32 i32) (result i32))) (func (export "_start")))"#)
                .unwrap(),
            "imports something",
        ),
        (wat::parse_str("(module (func (export \"main\")))").unwrap(), "_start"),
    ];
    for (bytes, want) in cases {
        let mut sink = |_: cordon_core::OutputStream, _: &[u8]| {};
        match sb.exec(&wasm_req(bytes, &[]), &mut sink) {
            Err(e @ (Error::Invalid(_) | Error::Malformed { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains(want), "{want}: {msg}")
            }
            other => panic!("{want}: expected a clear error, got {other:?}"),
        }
    }
    // A module asking for 4 GiB of memory up front hits the memory limit, not the host.
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(
            wat::parse_str("(module (memory 65536) (func (export \"_start\")))").unwrap(),
            &[],
        ),
    );
    assert_eq!(o.termination, Termination::OutOfMemory, "{o:#?}");
    // Traps are reported as signals with a reason.
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(
            wat::parse_str("(module (func (export \"_start\") unreachable))").unwrap(),
            &[],
        ),
    );
    assert_eq!(o.termination, Termination::Signalled, "{o:#?}");
    assert_eq!(o.signal, Some(6));
}

#[test]
fn stale_or_tampered_cache_is_rebuilt_never_run() {
    let home = tempfile::tempdir().unwrap();
    let src = backend().data_dir().join("guests");
    let dst = home.path().join("guests");
    std::fs::create_dir_all(&dst).unwrap();
    let manifest: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(src.join("manifest.json")).unwrap()).unwrap();
    let js_file = manifest["javascript"].clone();
    std::fs::copy(src.join(&js_file), dst.join(&js_file)).unwrap();
    std::fs::write(
        dst.join("manifest.json"),
        serde_json::to_vec(&serde_json::json!({ "javascript": js_file })).unwrap(),
    )
    .unwrap();
    let cfg = || WasmConfig {
        data_dir: home.path().to_path_buf(),
        ..WasmConfig::default()
    };
    // The first exec in a fresh data dir compiles the guest inside its time: room for a
    // loaded host (three suites side by side took 47 s once). What is tested is the cache.
    let mut long = spec();
    long.limits.timeout_ms = 180_000;
    let run_js = |b: &WasmBackend| {
        let mut sb = b.create(&long).unwrap();
        let o = exec_in(
            sb.as_mut(),
            &ExecRequest::code(Language::Javascript, "6 * 7"),
        );
        // The whole outcome when it is not 42 (a timeout and a crash read the same here).
        assert_eq!(out(&o), "42\n", "{o:?}");
        o
    };
    assert_eq!(out(&run_js(&WasmBackend::with_config(cfg()))), "42\n");
    let cached: Vec<_> = std::fs::read_dir(dst.join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    // Written with its identity, so the next process maps it without hashing; it runs.
    let id = cached[0].with_extension("cwasm.id");
    assert!(id.is_file(), "{} not written", id.display());
    assert_eq!(out(&run_js(&WasmBackend::with_config(cfg()))), "42\n");
    // Tamper with the precompiled code: it must be detected and rebuilt.
    let mut bytes = std::fs::read(&cached[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&cached[0], &bytes).unwrap();
    assert_eq!(out(&run_js(&WasmBackend::with_config(cfg()))), "42\n");
    assert_ne!(
        std::fs::read(&cached[0]).unwrap(),
        bytes,
        "tampered entry was kept"
    );
    // Tamper with the source artifact: refused with the fix, never run.
    let mut wasm = std::fs::read(dst.join(&js_file)).unwrap();
    let n = wasm.len() - 1;
    wasm[n] ^= 0xff;
    std::fs::write(dst.join(&js_file), wasm).unwrap();
    std::fs::remove_dir_all(dst.join("cache")).unwrap();
    let b = WasmBackend::with_config(cfg());
    let mut sb = b.create(&spec()).unwrap();
    let mut sink = |_: cordon_core::OutputStream, _: &[u8]| {};
    match sb.exec(&ExecRequest::code(Language::Javascript, "1"), &mut sink) {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(e.to_string().contains("cordon setup wasm"), "{e}")
        }
        other => panic!("expected the tampered guest to be refused, got {other:?}"),
    }
    // And the probe reports the missing Python guest with the fix.
    let probe = b.probe();
    let py = probe
        .capabilities
        .iter()
        .find(|c| c.name == "python guest")
        .unwrap();
    assert!(
        !py.ok && py.fix.as_deref() == Some("run `cordon setup wasm`"),
        "{py:?}"
    );
}

#[test]
fn outcome_has_the_shape_of_every_tier() {
    let o = py("print('hi')");
    cordon_testkit::assert_outcome_shape(&o);
    let v = serde_json::to_value(&o).unwrap();
    assert_eq!(v["termination"], "exited");
    assert!(o.usage.wall_time_us > 0);
}

#[test]
fn network_policies_are_refused_up_front() {
    let mut s = spec();
    s.egress.allow.push("example.com".parse().unwrap());
    match backend().create(&s) {
        Err(Error::Unsupported { fix, .. }) => assert_eq!(fix, cordon_core::Feature::Network.fix()),
        other => panic!("{:?}", other.map(|s| s.id().to_string())),
    }
}

#[test]
fn one_tenants_execs_cannot_take_every_instance_slot() {
    backend(); // the guests are there
    let b = WasmBackend::with_config(WasmConfig {
        pool: cordon_wasm::PoolSize {
            concurrent_execs: 4,
            per_owner: 2,
            ..Default::default()
        },
        ..WasmConfig::default()
    });
    b.warm(Guest::Python).unwrap();
    let spec_for = |owner: &str| {
        let mut s = spec();
        s.owner = Some(owner.to_string());
        s
    };
    // Tenant A starts as many sleeping execs as the engine has slots.
    let sleepers: Vec<_> = (0..4)
        .map(|_| {
            let (b, s) = (b.clone(), spec_for("tenant-a"));
            std::thread::spawn(move || {
                let mut sb = b.create(&s).unwrap();
                let mut sink = |_: cordon_core::OutputStream, _: &[u8]| {};
                let r = sb.exec(
                    &ExecRequest::code(Language::Python, "import time\ntime.sleep(6)"),
                    &mut sink,
                );
                // A message for the test's assertion (the error crosses a thread).
                r.map(|o| o.termination).map_err(|e| e.to_string())
            })
        })
        .collect();
    // Give them time to start (a synchronisation wait, not a measurement).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // Another tenant still gets a slot.
    let o = run_on(&b, &spec_for("tenant-b"), "print('b runs')");
    assert_eq!(out(&o), "b runs\n", "{o:#?}");
    let results: Vec<_> = sleepers.into_iter().map(|t| t.join().unwrap()).collect();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.contains("share")))
        .count();
    assert_eq!(refused, 2, "{results:?}");
}

fn run_on(b: &WasmBackend, s: &SandboxSpec, src: &str) -> ExecOutcome {
    let mut sb = b.create(s).unwrap();
    let o = exec_in(sb.as_mut(), &ExecRequest::code(Language::Python, src));
    sb.destroy().unwrap();
    o
}

/// A WASI command module of `funcs` functions whose bodies hold `ops` additions each
/// (about 8 bytes per addition), `_start` being the first: costly to compile, instant to run.
fn heavy_module(funcs: u32, ops: u32) -> Vec<u8> {
    fn leb(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn section(id: u8, body: Vec<u8>, out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len() as u64, out);
        out.extend(body);
    }
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    section(1, vec![1, 0x60, 0, 0], &mut m); // one type: () -> ()
    let mut f = Vec::new();
    leb(funcs as u64, &mut f);
    f.extend(std::iter::repeat_n(0u8, funcs as usize));
    section(3, f, &mut m);
    section(5, vec![1, 0, 1], &mut m); // one memory of one page (WASI wants one)
    let mut e = vec![2];
    e.extend([6, b'_', b's', b't', b'a', b'r', b't', 0, 0]);
    e.extend([6, b'm', b'e', b'm', b'o', b'r', b'y', 2, 0]);
    section(7, e, &mut m);
    let mut body = vec![1, 2, 0x7f]; // two i32 locals
    for _ in 0..ops {
        // local.get 0, local.get 1, i32.add, local.set 1
        body.extend([0x20, 0, 0x20, 1, 0x6a, 0x21, 1]);
    }
    body.push(0x0b);
    let mut code = Vec::new();
    leb(funcs as u64, &mut code);
    for _ in 0..funcs {
        leb(body.len() as u64, &mut code);
        code.extend(&body);
    }
    section(10, code, &mut m);
    m
}

#[test]
fn compiling_a_user_module_is_bounded_by_the_exec_deadline_and_cached() {
    let module = heavy_module(1500, 600); // ~6 MB
    assert!(module.len() > 6_000_000, "{}", module.len());
    let mut sb = backend().create(&spec()).unwrap();
    let mut req = wasm_req(module.clone(), &[]);
    req.timeout_ms = Some(50);
    let o = exec_in(sb.as_mut(), &req);
    assert_eq!(o.termination, Termination::Timeout, "{o:#?}");
    assert!(
        o.warnings.iter().any(|w| w.contains("compiling")),
        "{:?}",
        o.warnings
    );
    // The same bytes again, with time: the compile that went on in the background (or the
    // cache) serves it.
    req.timeout_ms = Some(120_000);
    let o = exec_in(sb.as_mut(), &req);
    assert_eq!(o.termination, Termination::Exited, "{o:#?}");
    assert_eq!(o.exit_code, Some(0), "{o:#?}");
    // A function too large to compile cheaply is refused before compiling.
    let huge = heavy_module(1, 100_000);
    let e = sb
        .exec(
            &wasm_req(huge, &[]),
            &mut |_: cordon_core::OutputStream, _: &[u8]| {},
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("function body"), "{e}");
    sb.destroy().unwrap();
}

#[test]
fn file_api_and_archives_in_the_scratch_dir() {
    use cordon_core::{FileKind, FileOp, FileReply};
    use cordon_testkit::files::{TarEntry, read_tar, tarball};
    let mut s = spec();
    s.limits.disk_bytes = 4 << 20;
    let mut sb = backend().create(&s).unwrap();
    sb.file_op(&FileOp::Mkdir {
        path: "/work/d/e".into(),
        parents: true,
    })
    .unwrap();
    sb.put_file("/work/d/e/f.txt", b"hello", 0o640).unwrap();
    sb.file_op(&FileOp::Rename {
        from: "/work/d/e/f.txt".into(),
        to: "/work/d/g.txt".into(),
    })
    .unwrap();
    let FileReply::Entries { entries, .. } = sb
        .file_op(&FileOp::List {
            path: "/work/d".into(),
        })
        .unwrap()
    else {
        panic!("not a listing")
    };
    let got: Vec<(&str, FileKind, u64)> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        got,
        vec![("e", FileKind::Dir, got[0].2), ("g.txt", FileKind::File, 5)]
    );
    // The guest sees what the API did.
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, "print(open('/work/d/g.txt').read())"),
    );
    assert_eq!(out(&o), "hello\n", "{o:#?}");
    let mut tar = Vec::new();
    sb.get_archive("/work/d", 1 << 20, &mut tar).unwrap();
    let paths: Vec<String> = read_tar(&tar).into_iter().map(|f| f.path).collect();
    assert_eq!(paths, vec!["e/", "g.txt"]);
    let r = sb.put_archive("/work/copy", &mut &tar[..]).unwrap();
    assert_eq!((r.files, r.dirs, r.bytes), (1, 1, 5));
    assert_eq!(sb.get_file("/work/copy/g.txt", 10).unwrap(), b"hello");
    // Hostile entries: refused or neutralised, as on every tier.
    for bad in ["../x", "/abs"] {
        assert!(matches!(
            sb.put_archive("/work/up", &mut &tarball(&[TarEntry::file(bad, b"x")])[..]),
            Err(Error::PathRefused { .. })
        ));
    }
    let r = sb
        .put_archive(
            "/work/up",
            &mut &tarball(&[
                TarEntry::link("ln", b'2', "/etc"),
                TarEntry::file("ln/passwd", b"mine"),
            ])[..],
        )
        .unwrap();
    assert_eq!(r.skipped.len(), 1, "{r:?}");
    assert_eq!(sb.get_file("/work/up/ln/passwd", 10).unwrap(), b"mine");
    // Past the disk limit, counting what is there already.
    let big = vec![1u8; 4 << 20];
    let e = sb
        .put_archive(
            "/work/up",
            &mut &tarball(&[TarEntry::file("big", &big)])[..],
        )
        .unwrap_err();
    assert!(e.to_string().contains("disk limit"), "{e}");
    sb.file_op(&FileOp::Remove {
        path: "/work/d".into(),
        recursive: true,
    })
    .unwrap();
    assert!(
        sb.file_op(&FileOp::Stat {
            path: "/work/d".into()
        })
        .is_err()
    );
}

/// A backend of its own (its standby count is this test's alone).
fn own_backend(pool: cordon_wasm::PoolSize) -> WasmBackend {
    backend(); // the guests are there
    let b = WasmBackend::with_config(WasmConfig {
        pool,
        ..WasmConfig::default()
    });
    b.warm(Guest::Python).unwrap();
    b
}

/// What an agent does between two execs: reads the answer. A sandbox makes standby
/// instances only for execs that come after such a pause.
fn agent_pause() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}

/// Polls (bounded) until the backend holds `n` standby instances.
fn standby_settles(b: &WasmBackend, n: u32) -> u32 {
    for _ in 0..200 {
        if b.standby_held() == n {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    b.standby_held()
}

#[test]
fn a_standby_instance_runs_each_exec_with_that_execs_own_inputs() {
    let b = own_backend(cordon_wasm::PoolSize::default());
    let mut sb = b.create(&spec()).unwrap();
    let src = "import os, sys\nprint(sys.argv[1], os.environ.get('ROUND'), sys.stdin.read(), \
               open('/work/round.txt').read(), os.environ.get('LEFT', 'none'))";
    for round in 0..6 {
        sb.put_file("round.txt", format!("file{round}").as_bytes(), 0o644)
            .unwrap();
        let mut req = ExecRequest::new(cordon_core::Command::Code {
            language: Language::Python,
            source: src.into(),
            args: vec![format!("arg{round}")],
        });
        req.env.insert("ROUND".into(), round.to_string());
        if round == 1 {
            // Only this exec gets it; the instance made during it must not.
            req.env.insert("LEFT".into(), "leaked".into());
        }
        req.stdin = Some(format!("in{round}").into_bytes());
        agent_pause();
        let o = exec_in(sb.as_mut(), &req);
        let left = if round == 1 { "leaked" } else { "none" };
        assert_eq!(
            out(&o),
            format!("arg{round} {round} in{round} file{round} {left}\n"),
            "round {round}: {o:#?}"
        );
        if round >= 1 {
            // From the second exec on (each after a pause), the next exec's instance is
            // made ahead.
            assert_eq!(standby_settles(&b, 1), 1, "round {round}");
        } else {
            assert_eq!(b.standby_held(), 0, "a single exec gets no standby");
        }
    }
    // A JavaScript exec between Python ones neither uses nor spoils it.
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Javascript, "console.log(7)"),
    );
    assert_eq!(out(&o), "7\n", "{o:#?}");
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, "print(8)"),
    );
    assert_eq!(out(&o), "8\n", "{o:#?}");
    sb.destroy().unwrap();
    assert_eq!(standby_settles(&b, 0), 0, "destroy gives the standby back");
}

#[test]
fn standby_instances_are_bounded_and_never_take_a_running_execs_place() {
    // One running exec at a time; two standbys for the backend, one per tenant.
    let b = own_backend(cordon_wasm::PoolSize {
        concurrent_execs: 1,
        per_owner: 1,
        standby_instances: 2,
    });
    let spec_for = |owner: &str| {
        let mut s = spec();
        s.owner = Some(owner.to_string());
        s
    };
    let mut held = Vec::new();
    for (owner, expect) in [("a", 1), ("a", 1), ("b", 2), ("c", 2)] {
        let mut sb = b.create(&spec_for(owner)).unwrap();
        for i in 0..3 {
            agent_pause();
            let o = exec_in(
                sb.as_mut(),
                &ExecRequest::code(Language::Python, "print('ok')"),
            );
            assert_eq!(out(&o), "ok\n", "tenant {owner}, exec {i}: {o:#?}");
        }
        assert_eq!(standby_settles(&b, expect), expect, "after tenant {owner}");
        held.push(sb);
    }
    // Every sandbox still runs, standby or not.
    for sb in &mut held {
        let o = exec_in(
            sb.as_mut(),
            &ExecRequest::code(Language::Python, "print(2)"),
        );
        assert_eq!(out(&o), "2\n", "{o:#?}");
    }
    for mut sb in held {
        sb.destroy().unwrap();
    }
    assert_eq!(standby_settles(&b, 0), 0);
}

/// A module whose `start` function (run at instantiation) writes to stdout, then burns
/// `start_loops` iterations; its `_start` burns `run_loops`.
fn start_section_module(start_loops: u32, run_loops: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "from start\n")
  (func $burn (param $n i32)
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again))))
  (func $init
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 11))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $burn (i32.const {start_loops})))
  (start $init)
  (func (export "_start") (call $burn (i32.const {run_loops}))))
"#
    ))
    .unwrap()
}

#[test]
fn a_user_modules_start_function_runs_inside_the_execs_context_and_fuel() {
    let mut s = spec();
    s.limits.fuel = Some(12_000_000);
    let mut sb = backend().create(&s).unwrap();
    // What the start function writes is the exec's output, captured like the rest.
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(start_section_module(0, 1_000_000), &[]),
    );
    assert!(o.success(), "{o:#?}");
    assert_eq!(out(&o), "from start\n");
    // The fuel covers instantiation and run together: each half fits, both do not.
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(start_section_module(1_000_000, 0), &[]),
    );
    assert!(o.success(), "{o:#?}");
    let o = exec_in(
        sb.as_mut(),
        &wasm_req(start_section_module(1_000_000, 1_000_000), &[]),
    );
    assert_eq!(o.termination, Termination::Timeout, "{o:#?}");
    assert!(o.warnings.iter().any(|w| w.contains("fuel")), "{o:#?}");
}

#[test]
fn an_exec_marked_last_leaves_no_standby_behind() {
    let b = own_backend(cordon_wasm::PoolSize::default());
    let mut sb = b.create(&spec()).unwrap();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, "print(1)"),
    );
    assert_eq!(out(&o), "1\n");
    let mut req = ExecRequest::code(Language::Python, "print(2)");
    req.last = true;
    agent_pause();
    let o = exec_in(sb.as_mut(), &req);
    assert_eq!(out(&o), "2\n");
    assert_eq!(
        b.standby_held(),
        0,
        "nothing is made for an exec that never comes"
    );
    // Without the mark, the second exec makes one.
    let mut sb2 = b.create(&spec()).unwrap();
    for i in 0..2 {
        agent_pause();
        let o = exec_in(
            sb2.as_mut(),
            &ExecRequest::code(Language::Python, "print(3)"),
        );
        assert_eq!(out(&o), "3\n", "exec {i}");
    }
    assert_eq!(standby_settles(&b, 1), 1);
}

#[test]
fn back_to_back_execs_reset_their_own_slot_and_make_nothing_ahead() {
    // A caller that sends its next exec as soon as the last one answers gains nothing from
    // a standby (it would wait for it) and would share the cores with the worker making it.
    // Whether an exec is back-to-back is decided from the gap since its sandbox's last exec
    // ended, against the backend's standby pause (5 ms by default). On a loaded machine
    // (the suites run side by side) this process can be kept off the CPU for longer than
    // that between two execs, and such a gap rightly earns a standby; so here the pause is
    // an hour, which no gap between these execs comes near, and none of them may make one.
    backend(); // the guests are there
    let b = WasmBackend::with_config(WasmConfig {
        standby_pause: std::time::Duration::from_secs(3600),
        ..WasmConfig::default()
    });
    b.warm(Guest::Python).unwrap();
    let mut sb = b.create(&spec()).unwrap();
    for i in 0..5 {
        let o = exec_in(
            sb.as_mut(),
            &ExecRequest::code(Language::Python, "print(4)"),
        );
        assert_eq!(out(&o), "4\n", "exec {i}");
        assert_eq!(b.standby_held(), 0, "back-to-back exec {i} made a standby");
    }
    sb.destroy().unwrap();
    // With the default pause (shorter than `agent_pause`), a sandbox that ran back-to-back
    // execs and is then paced by a reader gets one.
    let b = own_backend(cordon_wasm::PoolSize::default());
    let mut sb = b.create(&spec()).unwrap();
    for i in 0..2 {
        let o = exec_in(
            sb.as_mut(),
            &ExecRequest::code(Language::Python, "print(4)"),
        );
        assert_eq!(out(&o), "4\n", "exec {i}");
    }
    // The same sandbox paced by a reader gets one.
    agent_pause();
    let o = exec_in(
        sb.as_mut(),
        &ExecRequest::code(Language::Python, "print(5)"),
    );
    assert_eq!(out(&o), "5\n");
    assert_eq!(standby_settles(&b, 1), 1);
}
