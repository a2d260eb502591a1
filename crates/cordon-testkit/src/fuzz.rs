//! Generators shared by the fuzz harnesses of the API's request bodies (docs/fuzzing.md):
//! JSON objects with a body's own field names and any values (the right kind, the wrong
//! kind, the edges), and the bounded case count every harness uses.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use serde_json::{Value, json};

/// `cases` by default, from a fixed seed, so that the bounded run in `make test` is the
/// same on every machine; `CORDON_FUZZ_CASES=N` runs a longer campaign that draws new
/// inputs every time. Failures are not persisted to files: a finding becomes a plain
/// regression test.
pub fn config(cases: u32) -> ProptestConfig {
    let long: Option<u32> = std::env::var("CORDON_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig {
        cases: long.unwrap_or(cases),
        rng_seed: match long {
            Some(_) => RngSeed::Random,
            None => RngSeed::Fixed(0x636f_72646f6e),
        },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings that mean something to some field of a request body.
const WORDS: &[&str] = &[
    "auto",
    "runtime",
    "wasm",
    "container",
    "gvisor",
    "microvm",
    "trusted",
    "untrusted",
    "compute",
    "internet",
    "write-files",
    "many-short",
    "one-long",
    "10m",
    "0s",
    "1ms",
    "99999999999h",
    "1e308s",
    "-1s",
    "NaN",
    "github",
    "bobs",
    "seccomp",
    "landlock",
    "cgroups",
    "*",
    "*.ok.test",
    "a.ok.test:443",
    "10.1.2.3",
    "10.0.0.0/8:*",
    "127.0.0.1",
    "[::1]:443",
    "169.254.169.254/32:80",
    "BAD NAME",
    "PATH",
    "",
    "python",
    "bash",
    "sh",
    "javascript",
    "/work/a.txt",
    "../etc/passwd",
    "aGVsbG8=",
    "!!",
    "644",
];

/// The fields of a create body (`cordon_engine::SandboxRequest`), and two it must refuse.
pub const CREATE_FIELDS: &[&str] = &[
    "tier",
    "trust",
    "autonomy",
    "shape",
    "limits",
    "env",
    "allow_hosts",
    "deny_hosts",
    "grants",
    "allow_weaker",
    "ttl",
    "idle_timeout",
    "inline_grants",
    "workload",
];
/// The fields of an exec body (`cordon_server::model::ExecBody`).
pub const EXEC_FIELDS: &[&str] = &[
    "lang",
    "code",
    "argv",
    "wasm_base64",
    "args",
    "env",
    "cwd",
    "stdin",
    "stdin_base64",
    "timeout",
    "stream",
];
/// The fields of a body's `limits`.
pub const LIMIT_FIELDS: &[&str] = &[
    "timeout_ms",
    "memory_bytes",
    "pids",
    "disk_bytes",
    "tmp_bytes",
    "cpus",
    "stdout_bytes",
    "stderr_bytes",
    "open_files",
    "fuel",
];

/// One JSON scalar.
pub fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1e300)),
        prop::sample::select(WORDS).prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ]
}

/// Any JSON value, two levels deep at most.
pub fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[A-Za-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body's bytes: mostly an object of `fields` (and `nested`'s object of `nested.1`
/// fields), sometimes any JSON, sometimes not JSON at all.
pub fn body(
    fields: Vec<&'static str>,
    nested: (&'static str, &'static [&'static str]),
) -> impl Strategy<Value = Vec<u8>> {
    let inner = prop::collection::btree_map(prop::sample::select(nested.1), scalar(), 0..4);
    let object = (
        prop::collection::btree_map(prop::sample::select(fields), value(), 0..7),
        proptest::option::of(inner),
    )
        .prop_map(move |(m, sub)| {
            let mut o: serde_json::Map<String, Value> =
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            if let Some(sub) = sub {
                o.insert(nested.0.to_string(), json!(sub));
            }
            serde_json::to_vec(&o).unwrap_or_default()
        });
    prop_oneof![
        6 => object,
        1 => value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}
