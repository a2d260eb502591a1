//! The service end to end over loopback HTTP: a fake backend (fast, no root) under the
//! container tier's name and the real runtime tier. Container-tier behaviour with real
//! walls is tested by `sdk/python/tests` against a real `cordon serve`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_core::{
    Backend, Capability, Command, ExecOutcome, ExecRequest, OutputSink, OutputStream, Probe,
    Result as CoreResult, Sandbox, SandboxId, SandboxSpec, Termination, Tier,
};
use cordon_server::config::Dur;
use cordon_server::{Backends, Config, Keys, Server, Service, Tenant};
use serde_json::{Value, json};

// ---- a fake tier -------------------------------------------------------------------------

#[derive(Default)]
struct Counters {
    created: AtomicUsize,
    destroyed: AtomicUsize,
    execs: AtomicUsize,
    /// How long each destroy takes, to hold a teardown open.
    destroy_delay_ms: AtomicU64,
    /// The orphans `recover` was given.
    recovered: Mutex<Vec<String>>,
}

struct FakeBackend(Arc<Counters>);

struct FakeSandbox {
    id: SandboxId,
    /// The grants' secret values, so `leak` can print them as a hostile program would.
    secrets: Vec<Vec<u8>>,
    /// Minted grants' minters, so `mint` can stand in for the egress proxy.
    minters: Vec<Arc<dyn cordon_core::TokenMinter>>,
    files: HashMap<String, Vec<u8>>,
    /// The workspace of the directory calls (list, archives, ...): the guest's own code on
    /// a temporary directory.
    work: tempfile::TempDir,
    disk_bytes: u64,
    memory_bytes: u64,
    /// Bytes "saved" by a pause to disk (nothing is written: the service's accounting of
    /// them is what the tests look at).
    on_disk: Option<u64>,
    counters: Arc<Counters>,
    destroyed: bool,
    used: bool,
    /// The spec it was made with (all but its owner, which a take from a pool sets), as
    /// `spec` prints it.
    made: String,
}

impl FakeSandbox {
    fn workspace(&self) -> cordon_guest::files::Workspace {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        cordon_guest::files::Workspace::open(self.work.path(), uid, gid).unwrap()
    }
}

fn ws_error(path: &str) -> impl Fn(cordon_guest::files::FileError) -> cordon_core::Error + '_ {
    move |(code, reason)| match code {
        cordon_guest::proto::ErrorCode::PathRefused => cordon_core::Error::PathRefused {
            path: path.into(),
            reason,
        },
        _ => cordon_core::Error::File {
            path: path.into(),
            reason,
        },
    }
}

impl Backend for FakeBackend {
    fn create_unprepared(
        &self,
        _spec: &SandboxSpec,
    ) -> Option<cordon_core::Result<Box<dyn Sandbox>>> {
        None
    }

    fn tier(&self) -> Tier {
        Tier::Container
    }
    fn probe(&self) -> Probe {
        Probe::from_capabilities(
            Tier::Container,
            vec![Capability::ok("fake", "test")],
            vec![],
        )
    }
    fn recover(&self, orphans: &[String]) -> Vec<String> {
        self.0.recovered.lock().unwrap().extend_from_slice(orphans);
        orphans.iter().map(|id| format!("fake: {id}")).collect()
    }
    fn create(&self, spec: &SandboxSpec) -> CoreResult<Box<dyn Sandbox>> {
        spec.validate()?;
        self.0.created.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(FakeSandbox {
            id: SandboxId::random()?,
            secrets: spec
                .grants
                .iter()
                .filter_map(|g| match &g.secret {
                    cordon_core::GrantSecret::Value(v) => Some(v.expose().to_vec()),
                    cordon_core::GrantSecret::Minted(_) => None,
                })
                .collect(),
            minters: spec
                .grants
                .iter()
                .filter_map(|g| match &g.secret {
                    cordon_core::GrantSecret::Minted(m) => Some(m.clone()),
                    cordon_core::GrantSecret::Value(_) => None,
                })
                .collect(),
            files: HashMap::new(),
            work: tempfile::tempdir().unwrap(),
            disk_bytes: spec.limits.disk_bytes,
            memory_bytes: spec.limits.memory_bytes,
            on_disk: None,
            counters: self.0.clone(),
            destroyed: false,
            used: false,
            made: format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {}",
                spec.tier,
                spec.limits,
                spec.egress,
                spec.env,
                spec.allow_weaker,
                spec.template,
                spec.grants.len()
            ),
        }))
    }
}

impl Sandbox for FakeSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }
    fn pause(&mut self) -> CoreResult<()> {
        Ok(())
    }
    fn pause_to_disk(&mut self) -> CoreResult<u64> {
        let bytes = self.memory_bytes / 2;
        self.on_disk = Some(bytes);
        Ok(bytes)
    }
    fn on_disk_bytes(&self) -> Option<u64> {
        self.on_disk
    }
    fn resume(&mut self) -> CoreResult<()> {
        self.on_disk = None;
        Ok(())
    }
    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> CoreResult<ExecOutcome> {
        let was_used = self.used;
        self.used = true;
        self.counters.execs.fetch_add(1, Ordering::SeqCst);
        let mut o = ExecOutcome::new(Tier::Container, Termination::Exited);
        o.exit_code = Some(0);
        let out: Vec<u8> = match &req.command {
            Command::Argv(v) if v[0] == "echo" => format!("{}\n", v[1..].join(" ")).into_bytes(),
            Command::Argv(v) if v[0] == "cat" => self.files.get(&v[1]).cloned().unwrap_or_default(),
            Command::Argv(v) if v[0] == "used" => format!("{was_used}\n").into_bytes(),
            Command::Argv(v) if v[0] == "spec" => format!("{}\n", self.made).into_bytes(),
            // Mints a token as the egress proxy would for a request to the grant's host (the
            // real proxy never shows it to the sandbox; this fake prints it for the test).
            Command::Argv(v) if v[0] == "mint" => {
                let t = self.minters[0].mint(self.id.as_str()).unwrap();
                t.value.expose().to_vec()
            }
            // Prints each grant's secret in two chunks split mid-value, and reports a use of
            // the grant as the egress proxy would.
            Command::Argv(v) if v[0] == "leak" => {
                for secret in &self.secrets {
                    let (a, b) = secret.split_at(secret.len() / 2);
                    sink.output(OutputStream::Stdout, b"token=");
                    sink.output(OutputStream::Stdout, a);
                    sink.output(OutputStream::Stdout, b);
                    sink.output(OutputStream::Stdout, b"\n");
                }
                let mut ev = cordon_core::EgressEvent::new(
                    1,
                    cordon_core::EgressKind::Https,
                    cordon_core::EgressDecision::Allow,
                );
                ev.grant = Some(cordon_core::GrantNames::one("github"));
                ev.host = Some("api.github.test".into());
                ev.port = Some(443);
                ev.method = Some("GET".into());
                ev.path = Some("/repos/acme/x".into());
                ev.status = Some(200);
                o.extra.egress.push(ev);
                Vec::new()
            }
            // Reports an egress flood as a hostile program looping connections would make
            // the proxy record: `flood SAME DISTINCT EXFIL` identical denials, denials to
            // distinct hosts, and exfiltration attempts to distinct hosts.
            Command::Argv(v) if v[0] == "flood" => {
                let n: Vec<u64> = v[1..4].iter().map(|x| x.parse().unwrap()).collect();
                let mut fold = cordon_core::EgressFold::default();
                let event = |i: u64, decision, host: String| {
                    let mut e = cordon_core::EgressEvent::new(
                        i,
                        cordon_core::EgressKind::Connect,
                        decision,
                    );
                    e.rule = Some("default-deny".into());
                    e.host = Some(host);
                    e.port = Some(443);
                    e
                };
                for i in 0..n[0] {
                    fold.push(event(
                        i,
                        cordon_core::EgressDecision::Deny,
                        "same.test".into(),
                    ));
                }
                for i in 0..n[1] {
                    fold.push(event(
                        i,
                        cordon_core::EgressDecision::Deny,
                        format!("h{i}.test"),
                    ));
                }
                for i in 0..n[2] {
                    let mut e = event(
                        i,
                        cordon_core::EgressDecision::Exfiltration,
                        format!("x{i}.test"),
                    );
                    e.grant = Some(cordon_core::GrantNames::one("github"));
                    fold.push(e);
                }
                o.extra.egress = fold.take();
                Vec::new()
            }
            Command::Argv(v) if v[0] == "sleep" => {
                std::thread::sleep(Duration::from_millis(v[1].parse().unwrap()));
                Vec::new()
            }
            Command::Code { source, .. } => {
                for part in source.split('|') {
                    sink.output(OutputStream::Stdout, part.as_bytes());
                    o.stdout.extend_from_slice(part.as_bytes());
                }
                return Ok(o);
            }
            _ => {
                o.exit_code = Some(127);
                Vec::new()
            }
        };
        sink.output(OutputStream::Stdout, &out);
        o.stdout = out;
        Ok(o)
    }
    fn put_file(&mut self, path: &str, data: &[u8], _mode: u32) -> CoreResult<()> {
        // A put the agent is slow to finish (a FIFO a sandbox planted, before the fix).
        if path.ends_with("/slow") {
            std::thread::sleep(Duration::from_millis(800));
        }
        self.files.insert(path.to_string(), data.to_vec());
        Ok(())
    }
    fn get_file(&mut self, path: &str, _max: u64) -> CoreResult<Vec<u8>> {
        self.files
            .get(path)
            .cloned()
            .ok_or(cordon_core::Error::File {
                path: path.into(),
                reason: "no such file".into(),
            })
    }
    fn file_op(&mut self, op: &cordon_core::FileOp) -> CoreResult<cordon_core::FileReply> {
        self.workspace().op(op).map_err(ws_error(op.path()))
    }
    fn put_archive(
        &mut self,
        dir: &str,
        tar: &mut dyn Read,
    ) -> CoreResult<cordon_core::ArchiveReport> {
        self.workspace()
            .unpack(dir, tar, self.disk_bytes)
            .map_err(ws_error(dir))
    }
    fn get_archive(
        &mut self,
        dir: &str,
        max: u64,
        out: &mut dyn Write,
    ) -> CoreResult<cordon_core::ArchiveReport> {
        self.workspace().pack(dir, max, out).map_err(ws_error(dir))
    }
    fn start_us(&self) -> u64 {
        1
    }
    fn destroy(&mut self) -> CoreResult<()> {
        if !self.destroyed {
            let delay = self.counters.destroy_delay_ms.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(delay));
            self.destroyed = true;
            self.counters.destroyed.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// One sandbox flooding egress (what a loop of refused connections makes the proxy record)
/// cannot flood the audit store: identical decisions are one row with a count, ordinary rows
/// are capped per exec and per tenant a minute with an explicit `truncated` row, and every
/// exfiltration attempt is still counted. Old code wrote one row per event (25,300 here).
#[tokio::test(flavor = "multi_thread")]
async fn an_egress_flood_is_folded_capped_and_keeps_every_exfiltration() {
    let env = start_with(|c| {
        c.audit.max_egress_rows_per_exec = 100;
        c.audit.max_egress_rows_per_minute = 150;
    })
    .await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let mut after = 0i64;
    for (round, ordinary_budget) in [(0, 100), (1, 50)] {
        let (s, v) = env
            .exec(
                ALICE,
                &id,
                json!({"argv": ["flood", "20000", "5000", "300"]}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        let reported = v["extra"]["egress"].as_array().unwrap();
        assert!(
            reported.len() <= 100 + 1 + 201,
            "round {round}: {}",
            reported.len()
        );
        let (s, rows) = env
            .call(
                M::GET,
                &format!("/v1/audit?sandbox={id}&kind=egress&limit=1000&after_id={after}"),
                ALICE,
                None,
            )
            .await;
        assert_eq!(s, 200);
        let rows = rows["events"].as_array().unwrap().clone();
        after = rows.last().unwrap()["id"].as_i64().unwrap();
        let count = |pred: &dyn Fn(&Value) -> bool| -> u64 {
            rows.iter()
                .filter(|r| pred(r))
                .map(|r| r["detail"]["count"].as_u64().unwrap_or(1))
                .sum()
        };
        assert_eq!(
            count(&|r| r["decision"] == "exfiltration"),
            300,
            "round {round}: every exfiltration attempt is counted"
        );
        assert_eq!(
            count(&|r| r["decision"] == "deny" || r["decision"] == "truncated"),
            25_000,
            "round {round}: every denial is counted, itemised or not"
        );
        let ordinary = rows.iter().filter(|r| r["decision"] == "deny").count();
        assert!(
            ordinary <= ordinary_budget,
            "round {round}: {ordinary} ordinary rows past the caps"
        );
        let truncated: Vec<&Value> = rows
            .iter()
            .filter(|r| r["decision"] == "truncated")
            .collect();
        assert_eq!(truncated.len(), 1, "round {round}: one truncated row");
        assert!(
            rows.len() <= ordinary_budget + 1 + 201,
            "round {round}: {} rows",
            rows.len()
        );
        // The identical denials are one row with their count.
        assert!(
            rows.iter()
                .any(|r| r["detail"]["host"] == "same.test" && r["detail"]["count"] == 20_000),
            "round {round}: the identical denials are not one row"
        );
    }
    env.server.shutdown().await;
}

/// While the data dir's file system has less free space than `audit.min_free_disk`, new
/// sandboxes are refused with 503 storage_low (naming no host path); running ones go on.
#[tokio::test(flavor = "multi_thread")]
async fn new_sandboxes_are_refused_while_the_disk_is_nearly_full() {
    let env = start_with(|c| {
        c.pools.clear();
        c.audit.min_free_disk = cordon_server::config::Size(u64::MAX);
    })
    .await;
    let (s, v) = env
        .call(
            M::POST,
            "/v1/sandboxes",
            ALICE,
            Some(json!({"tier": "container"})),
        )
        .await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["code"], "storage_low");
    let text = v.to_string();
    assert!(
        !text.contains(env._dir.path().to_str().unwrap()) && !text.contains("/tmp"),
        "{text}"
    );
    let (s, v) = env
        .call(
            M::POST,
            "/v1/run",
            ALICE,
            Some(json!({"tier": "runtime", "lang": "js", "code": "1"})),
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (503, Some("storage_low")), "{v}");
    env.server.shutdown().await;
}

// ---- helpers -----------------------------------------------------------------------------

/// The tenants' API keys (at least `edge.min_key_len` long).
const ALICE: &str = "key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0";
const BOB: &str = "key-bob-00112233445566778899aabbccddeeff";
/// The operator's own tenant (`edge.dashboard_operators`): it reads `/metrics`.
const OPS: &str = "key-ops-ffeeddccbbaa99887766554433221100";

struct Env {
    server: Server,
    counters: Arc<Counters>,
    http: reqwest::Client,
    base: String,
    _dir: tempfile::TempDir,
}

fn backends(counters: &Arc<Counters>) -> Backends {
    let mut b: Backends = BTreeMap::new();
    b.insert(Tier::Container, Arc::new(FakeBackend(counters.clone())));
    b.insert(
        Tier::Runtime,
        Arc::new(cordon_runtime::RuntimeBackend::new()),
    );
    b
}

fn config(dir: &std::path::Path) -> Config {
    let mut cfg = Config::with_data_dir(dir);
    cfg.bind = "127.0.0.1:0".parse().unwrap();
    cfg.keys = vec![
        cordon_server::config::KeyEntry {
            tenant: "alice".into(),
            key: Some(ALICE.into()),
            sha256: None,
        },
        cordon_server::config::KeyEntry {
            tenant: "bob".into(),
            key: None,
            sha256: Some(cordon_server::keys::hash_key(BOB)),
        },
        cordon_server::config::KeyEntry {
            tenant: "ops".into(),
            key: Some(OPS.into()),
            sha256: None,
        },
    ];
    cfg.edge.dashboard_operators = vec!["ops".into()];
    cfg.sessions.reap_interval = Dur(Duration::from_millis(50));
    cfg.http.max_body_bytes = 64 << 10;
    cfg.http.max_file_bytes = 256 << 10;
    cfg.pools.insert(Tier::Container, 2);
    // These tests exercise the service with a fake container tier and the runtime tier:
    // the operator trusts both tenants with every tier. The gate's own tests use the
    // default ceiling (`ceiling_refuses_*` below).
    cfg.tenant_defaults = cordon_engine::TenantRules {
        trust: Some(cordon_policy::Trust::Trusted),
        tiers: Some(Tier::ALL.to_vec()),
        ..Default::default()
    };
    cfg
}

async fn start_with(f: impl FnOnce(&mut Config)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    f(&mut cfg);
    let counters = Arc::new(Counters::default());
    let server = Server::start(cfg, backends(&counters), None).await.unwrap();
    let base = format!("http://{}", server.addr());
    Env {
        server,
        counters,
        http: reqwest::Client::new(),
        base,
        _dir: dir,
    }
}

async fn start() -> Env {
    start_with(|_| {}).await
}

impl Env {
    fn req(&self, m: reqwest::Method, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.http
            .request(m, format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    async fn call(
        &self,
        m: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self.req(m, path, key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self, key: &str, body: Value) -> String {
        let (s, v) = self
            .call(reqwest::Method::POST, "/v1/sandboxes", key, Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// The Prometheus text of `/metrics` (an operator's key is needed).
    async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(OPS)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn wait_pool(&self, n: usize) {
        for _ in 0..200 {
            if self.server.service().pools().ready(Tier::Container) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the warm pool never filled");
    }

    /// An exec (whole result) in sandbox `id`.
    async fn exec(&self, key: &str, id: &str, body: Value) -> (u16, Value) {
        self.call(
            M::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            key,
            Some(body),
        )
        .await
    }

    /// `a` to `b` of each object in the array `list` of a GET on `path`.
    async fn pairs(
        &self,
        key: &str,
        path: &str,
        list: &str,
        a: &str,
        b: &str,
    ) -> BTreeMap<String, String> {
        let (_, v) = self.call(M::GET, path, key, None).await;
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[a].as_str().unwrap().into(), e[b].as_str().unwrap().into()))
            .collect()
    }

    /// `(sandbox, decision)` of the tenant's destroy rows.
    async fn destroy_reasons(&self, key: &str) -> BTreeMap<String, String> {
        self.pairs(
            key,
            "/v1/audit?kind=destroy",
            "events",
            "sandbox",
            "decision",
        )
        .await
    }

    /// `(id, state)` of the tenant's listed sandboxes.
    async fn listed(&self, key: &str) -> BTreeMap<String, String> {
        self.pairs(key, "/v1/sandboxes", "sandboxes", "id", "state")
            .await
    }
}

use reqwest::Method as M;

/// Sends raw bytes (for requests a well-behaved client will not make) and returns the
/// status code.
fn raw(base: &str, request: String) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap();
    (code, out)
}

// ---- tests -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_files_exec_stream_and_audit() {
    let env = start().await;
    env.wait_pool(2).await;
    let (s, v) = env
        .call(
            M::POST,
            "/v1/sandboxes",
            ALICE,
            Some(json!({"tier": "container", "ttl": "10m"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["source"], "pool");
    let id = v["id"].as_str().unwrap().to_string();

    // Files.
    let r = env
        .req(
            M::PUT,
            &format!("/v1/sandboxes/{id}/files/work/a.csv"),
            ALICE,
        )
        .body("x\n1\n2\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = env
        .req(
            M::GET,
            &format!("/v1/sandboxes/{id}/files/work/a.csv"),
            ALICE,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"x\n1\n2\n");

    // Whole result.
    let (s, o) = env
        .exec(ALICE, &id, json!({"argv": ["cat", "/work/a.csv"]}))
        .await;
    assert_eq!(s, 200, "{o}");
    assert_eq!(o["stdout"], "x\n1\n2\n");
    assert_eq!(o["termination"], "exited");

    // NDJSON stream: chunks then the outcome; a multi-byte character split across chunks
    // arrives whole.
    let r = env
        .req(M::POST, &format!("/v1/sandboxes/{id}/exec"), ALICE)
        .header("accept", "application/x-ndjson")
        .json(&json!({"lang": "sh", "code": "one|two|three"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let data: String = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["data"].as_str().unwrap())
        .collect();
    assert_eq!(data, "onetwothree");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "outcome");
    assert_eq!(last["outcome"]["stdout"], "onetwothree");

    // SSE.
    let r = env
        .req(M::POST, &format!("/v1/sandboxes/{id}/exec"), ALICE)
        .header("accept", "text/event-stream")
        .json(&json!({"argv": ["echo", "sse"]}))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(
        text.contains("event: stdout\ndata: {\"data\":\"sse\\n\"}"),
        "{text}"
    );
    assert!(text.contains("event: outcome"), "{text}");

    // List and info.
    let (_, l) = env.call(M::GET, "/v1/sandboxes", ALICE, None).await;
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 1);
    let (_, l) = env.call(M::GET, "/v1/sandboxes", BOB, None).await;
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 0);

    // Another tenant gets 404 on everything of alice's.
    for (m, path, body) in [
        (M::GET, format!("/v1/sandboxes/{id}"), None),
        (
            M::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"argv": ["echo"]})),
        ),
        (M::GET, format!("/v1/sandboxes/{id}/files/work/a.csv"), None),
        (M::DELETE, format!("/v1/sandboxes/{id}"), None),
    ] {
        let (s, v) = env.call(m, &path, BOB, body).await;
        assert_eq!(s, 404, "{path}: {v}");
        assert_eq!(v["code"], "not_found");
    }
    let (s, v) = env
        .call(M::GET, &format!("/v1/audit?sandbox={id}"), BOB, None)
        .await;
    assert_eq!(s, 200);
    assert!(v["events"].as_array().unwrap().is_empty(), "{v}");

    // Destroy is idempotent.
    let (s, v) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
        .await;
    assert_eq!((s, v["already"].clone()), (200, json!(false)));
    let (s, v) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
        .await;
    assert_eq!((s, v["already"].clone()), (200, json!(true)));
    let (s, _) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), BOB, None)
        .await;
    assert_eq!(s, 404);
    let (s, v) = env.exec(ALICE, &id, json!({"argv": ["echo"]})).await;
    assert_eq!(s, 404, "{v}");

    // Every step is in alice's audit, in order, with the hash of what ran.
    let (_, v) = env
        .call(
            M::GET,
            &format!("/v1/audit?sandbox={id}&limit=1000"),
            ALICE,
            None,
        )
        .await;
    let kinds: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "create", "file_put", "file_get", "exec", "exec", "exec", "destroy"
        ]
    );
    let exec = &v["events"][3];
    assert_eq!(exec["detail"]["command_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(exec["decision"], "exited");
    let (_, v) = env.call(M::GET, "/v1/audit?kind=policy", ALICE, None).await;
    assert_eq!(v["events"][0]["decision"], "allow");

    // Metrics.
    let m = env.metrics().await;
    assert!(
        m.contains("cordon_pool_hits_total{tier=\"container\"} 1"),
        "{m}"
    );
    assert!(m.contains("cordon_exec_terminations_total"), "{m}");
    env.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_4xx_and_harmless() {
    let env = start().await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let post = |path: &str, body: &str, ctype: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let cases: Vec<(String, u16, &str)> = vec![
        (post("/v1/sandboxes", "{\"tier\":", "application/json"), 400, "invalid_request"),
        (post("/v1/sandboxes", "{\"tier\":\"container\",\"privileged\":true}", "application/json"), 400, "invalid_request"),
        (post("/v1/sandboxes", "{\"tier\":\"mainframe\"}", "application/json"), 400, "invalid_request"),
        (post("/v1/sandboxes", "{}", "text/plain"), 415, "unsupported_media_type"),
        (post(&format!("/v1/sandboxes/{id}/exec"), "{\"lang\":\"cobol\",\"code\":\"x\"}", "application/json"), 400, "invalid_request"),
        (post(&format!("/v1/sandboxes/{id}/exec"), "{\"argv\":[]}", "application/json"), 400, "invalid_request"),
        (post(&format!("/v1/sandboxes/{id}/exec"), "{\"code\":\"x\"}", "application/json"), 400, "invalid_request"),
        (post("/v1/sandboxes", &format!("{{\"env\":{{\"A\":\"{}\"}}}}", "x".repeat(100 << 10)), "application/json"), 413, "payload_too_large"),
        (post("/v1/sandboxes", "{\"limits\":{\"memory_bytes\":999999999999}}", "application/json"), 403, "policy_denied"),
        (post("/v1/sandboxes", "{\"tier\":\"runtime\",\"allow_hosts\":[\"example.test\"]}", "application/json"), 403, "policy_denied"),
        (post("/v1/sandboxes", "{\"tier\":\"microvm\"}", "application/json"), 422, "tier_unavailable"),
        (format!("GET /v1/sandboxes/{id}/files/work/../etc/passwd HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n"), 400, "path_refused"),
        (format!("GET /v1/sandboxes/{id}/files/work/%2e%2e/etc/passwd HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n"), 400, "path_refused"),
        (format!("GET /v1/sandboxes/{id}/files/proc/self/environ HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n"), 400, "path_refused"),
        (format!("PUT /v1/sandboxes/{id}/files/work/big HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}", 300 << 10, "x".repeat(300 << 10)), 413, "payload_too_large"),
        ("GET /v1/sandboxes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer wrong\r\nconnection: close\r\n\r\n".to_string(), 401, "unauthorized"),
        ("GET /v1/sandboxes HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_string(), 401, "unauthorized"),
        ("GET /v1/sandboxes/sb-00000000000000000000000000000000 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n".to_string(), 404, "not_found"),
        ("GET /v1/sandboxes/../../etc HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n".to_string(), 404, ""),
        ("GET /v1/nothing HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_string(), 404, "no_such_route"),
        ("PATCH /v1/sandboxes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n".to_string(), 405, "method_not_allowed"),
        ("GET /v1/audit?bogus=1 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-alice-0f1e2d3c4b5a69788796a5b4c3d2e1f0\r\nconnection: close\r\n\r\n".to_string(), 400, "invalid_request"),
    ];
    for (req, want, code) in cases {
        let base = env.base.clone();
        let (got, text) = tokio::task::spawn_blocking(move || raw(&base, req))
            .await
            .unwrap();
        assert_eq!(got, want, "{text}");
        assert!(
            code.is_empty() || text.contains(&format!("\"code\":\"{code}\"")),
            "{text}"
        );
        assert!(text.contains("\"fix\""), "{text}");
    }
    // Unharmed: the sandbox and the server still work.
    let (s, o) = env.exec(ALICE, &id, json!({"argv": ["echo", "ok"]})).await;
    assert_eq!((s, o["stdout"].as_str()), (200, Some("ok\n")));
    let rows = policy_rows(&env, ALICE).await;
    assert!(
        rows.iter().any(|e| e["decision"] == "deny"),
        "policy denials are audited: {rows:?}"
    );
    env.server.shutdown().await;
}

/// A request refused before its body was read: a client still writing that body finishes
/// and reads the refusal (not a broken pipe: the server reads what is left, bounded, before
/// it answers and closes). The failure of CI's E2B metadata test, made certain by writing
/// the body only after the server has had time to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_writing_a_refused_body_reads_the_refusal() {
    let env = start().await;
    let addr = env.base.trim_start_matches("http://").to_string();
    let (wrote, code, text) = tokio::task::spawn_blocking(move || {
        let body = vec![b'x'; 512 << 10];
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = format!(
            "PUT /v1/sandboxes/sb-00000000000000000000000000000000/files/work/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer wrong\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // In pieces, as an SDK streams a multipart body: a server that closed with the body
        // unread resets the connection after the first, and the next fails.
        let wrote = body
            .chunks(64 << 10)
            .try_for_each(|c| {
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(c)
            })
            .map_err(|e| e.to_string());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out).to_string();
        let code: u16 = out.split_whitespace().nth(1).unwrap_or("0").parse().unwrap_or(0);
        (wrote, code, out)
    })
    .await
    .unwrap();
    assert_eq!(wrote, Ok(()), "the body could not be written: {text}");
    assert_eq!(code, 401, "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    env.server.shutdown().await;
}

/// The policy rows a key's tenant sees (up to 1000).
async fn policy_rows(env: &Env, key: &str) -> Vec<Value> {
    let (_, v) = env
        .call(M::GET, "/v1/audit?kind=policy&limit=1000", key, None)
        .await;
    v["events"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limits_answer_429_with_retry_after() {
    let env = start_with(|c| {
        c.sessions.max_sandboxes_per_tenant = 2;
        c.sessions.max_sandboxes = 3;
    })
    .await;
    let a1 = env.create(ALICE, json!({})).await;
    let _a2 = env.create(ALICE, json!({})).await;
    let r = env
        .req(M::POST, "/v1/sandboxes", ALICE)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "too_many_sandboxes");
    // A one-shot run counts too.
    let (s, _) = env
        .call(M::POST, "/v1/run", ALICE, Some(json!({"argv": ["echo"]})))
        .await;
    assert_eq!(s, 429);
    // Its policy decision is on record although no sandbox carried it to an exec.
    let rows = policy_rows(&env, ALICE).await;
    assert!(
        rows.iter().any(|e| e["detail"]["request"] == "run"),
        "the refused run's policy row is missing: {rows:?}"
    );
    let _b1 = env.create(BOB, json!({})).await;
    let (s, _) = env
        .call(M::POST, "/v1/sandboxes", BOB, Some(json!({})))
        .await;
    assert_eq!(s, 429, "the global limit holds");
    env.call(M::DELETE, &format!("/v1/sandboxes/{a1}"), ALICE, None)
        .await;
    env.create(ALICE, json!({})).await;
    env.server.shutdown().await;
    let c = &env.counters;
    assert_eq!(
        c.created.load(Ordering::SeqCst),
        c.destroyed.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_ends_sandboxes_past_ttl_or_idle() {
    let env = start().await;
    // A slow teardown: a sandbox must not leave the list before its destroy is on record.
    env.counters.destroy_delay_ms.store(200, Ordering::SeqCst);
    let ttl = env.create(ALICE, json!({"ttl": "150ms"})).await;
    let idle = env.create(ALICE, json!({"idle_timeout": "150ms"})).await;
    let keep = env.create(ALICE, json!({})).await;
    let mut left = BTreeMap::new();
    for _ in 0..100 {
        left = env.listed(ALICE).await;
        let reasons = env.destroy_reasons(ALICE).await;
        for id in [&ttl, &idle] {
            if !left.contains_key(id) {
                assert!(
                    reasons.contains_key(id),
                    "{id} left the list before its destroy row was written: {reasons:?}"
                );
            }
        }
        if left.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left.keys().collect::<Vec<_>>(), vec![&keep]);
    let reasons = env.destroy_reasons(ALICE).await;
    assert_eq!(reasons.get(&ttl).map(String::as_str), Some("ttl"));
    assert_eq!(reasons.get(&idle).map(String::as_str), Some("idle"));
    assert!(!reasons.contains_key(&keep));
    env.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_being_reaped_is_listed_as_destroying_and_refuses_work() {
    let env = start().await;
    env.counters.destroy_delay_ms.store(1500, Ordering::SeqCst);
    let id = env.create(ALICE, json!({"ttl": "100ms"})).await;
    let mut state = String::new();
    for _ in 0..100 {
        state = env.listed(ALICE).await[&id].clone();
        if state == "destroying" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, "destroying");
    let (s, v) = env
        .exec(ALICE, &id, json!({"argv": ["echo", "late"]}))
        .await;
    assert_eq!(s, 410, "{v}");
    assert_eq!(v["code"], "sandbox_gone", "{v}");
    assert_eq!(env.counters.execs.load(Ordering::SeqCst), 0);
    // Another tenant still cannot see or touch it.
    let (s, _) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), BOB, None)
        .await;
    assert_eq!(s, 404);
    // The owner's destroy waits for the reaper's and reports it done.
    let (s, v) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["already"], true, "{v}");
    assert!(!env.listed(ALICE).await.contains_key(&id));
    let reasons = env.destroy_reasons(ALICE).await;
    assert_eq!(reasons.get(&id).map(String::as_str), Some("ttl"));
    assert_eq!(env.counters.destroyed.load(Ordering::SeqCst), 1);
    env.counters.destroy_delay_ms.store(0, Ordering::SeqCst);
    env.server.shutdown().await;
}

/// A client that gives up on its DELETE mid-teardown does not leave the sandbox stuck: the
/// destroy finishes, is audited, and a second DELETE answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_whose_client_went_away_still_finishes() {
    let env = start().await;
    let id = env.create(ALICE, json!({})).await;
    env.counters.destroy_delay_ms.store(600, Ordering::SeqCst);
    let gave_up = env
        .req(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE)
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(
        gave_up.is_err(),
        "the DELETE was meant to time out: {gave_up:?}"
    );
    let mut listed = true;
    for _ in 0..100 {
        listed = env.listed(ALICE).await.contains_key(&id);
        if !listed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!listed, "the abandoned destroy never finished");
    let reasons = env.destroy_reasons(ALICE).await;
    assert_eq!(reasons.get(&id).map(String::as_str), Some("client"));
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        env.call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None),
    )
    .await
    .expect("a second DELETE hung");
    assert_eq!(again.0, 200, "{}", again.1);
    assert_eq!(again.1["already"], true, "{}", again.1);
    env.counters.destroy_delay_ms.store(0, Ordering::SeqCst);
    env.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_sandboxes_are_fresh_and_never_reused() {
    let env = start().await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        env.wait_pool(1).await;
        let id = env.create(ALICE, json!({})).await;
        let (_, o) = env.exec(ALICE, &id, json!({"argv": ["used"]})).await;
        assert_eq!(
            o["stdout"], "false\n",
            "a pooled sandbox was handed out used"
        );
        env.call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
            .await;
        assert!(seen.insert(id), "a sandbox id was handed out twice");
    }
    // A spec other than the pool's starts cold.
    let (_, v) = env
        .call(
            M::POST,
            "/v1/sandboxes",
            ALICE,
            Some(json!({"limits": {"pids": 16}})),
        )
        .await;
    assert_eq!(v["source"], "cold");
    env.server.shutdown().await;
    let c = &env.counters;
    assert_eq!(
        c.created.load(Ordering::SeqCst),
        c.destroyed.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_run_on_the_real_runtime_tier() {
    let env = start().await;
    let (s, o) = env
        .call(
            M::POST,
            "/v1/run",
            ALICE,
            Some(json!({"tier": "runtime", "lang": "js", "code": "console.log(6*7)"})),
        )
        .await;
    assert_eq!(s, 200, "{o}");
    assert_eq!(o["stdout"], "42\n");
    assert_eq!(o["tier"], "runtime");
    let (s, o) = env
        .call(M::POST, "/v1/run", ALICE, Some(json!({"tier": "runtime", "lang": "js", "code": "while(true){}", "timeout": "200ms"})))
        .await;
    assert_eq!(
        (s, o["termination"].as_str()),
        (200, Some("timeout")),
        "{o}"
    );
    let (s, o) = env
        .call(M::POST, "/v1/run", ALICE, Some(json!({"files": [{"path": "/work/x", "content": "hi"}], "argv": ["cat", "/work/x"]})))
        .await;
    assert_eq!((s, o["stdout"].as_str()), (200, Some("hi")), "{o}");
    assert_eq!(env.server.service().sessions().count(), 0);
    env.server.shutdown().await;
}

/// The dashboard's event stream of `key` until `done` holds for the events read so far
/// (or 10 s pass): each event's name and data.
async fn dashboard_events(
    env: &Env,
    key: &str,
    done: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let mut resp = env
        .req(M::GET, "/v1/events", key)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(&events) {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("the events came in 10 s")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let mut name = String::new();
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            if !data.is_empty() {
                events.push((name, serde_json::from_str(&data).unwrap()));
            }
        }
    }
    events
}

/// The ids of the live sandboxes in the last snapshot, and every audit row's sandbox.
fn seen_ids(events: &[(String, Value)]) -> (Vec<String>, Vec<String>) {
    let live = events
        .iter()
        .rev()
        .find(|(n, _)| n == "stats")
        .map(|(_, v)| {
            v["sandboxes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    let rows = events
        .iter()
        .filter(|(n, _)| n == "audit")
        .filter_map(|(_, v)| v["sandbox"].as_str().map(str::to_string))
        .collect();
    (live, rows)
}

/// A tenant's dashboard stream carries its own sandboxes and audit rows only; a tenant the
/// operator names in `edge.dashboard_operators` sees every tenant's; no key, no stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_events_are_the_tenants_own_unless_an_operators() {
    let env = start_with(|c| c.edge.dashboard_operators = vec!["bob".into()]).await;
    let a = env.create(ALICE, json!({"tier": "container"})).await;
    let b = env.create(BOB, json!({"tier": "container"})).await;
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{b}/exec"),
            BOB,
            Some(json!({"argv": ["echo", "bob's"]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    let has = |id: &str| {
        let id = id.to_string();
        move |ev: &[(String, Value)]| {
            let (live, rows) = seen_ids(ev);
            live.contains(&id) && rows.contains(&id)
        }
    };
    let alice = dashboard_events(&env, ALICE, has(&a)).await;
    let (live, rows) = seen_ids(&alice);
    assert!(
        !live.contains(&b) && !rows.contains(&b),
        "alice sees bob's: {alice:?}"
    );
    let stats = &alice.iter().find(|(n, _)| n == "stats").unwrap().1;
    assert_eq!(stats["scope"], "tenant");
    assert_eq!(
        stats["live"],
        json!([{"tier": "container", "tenant": "alice", "count": 1}])
    );
    assert!(
        alice
            .iter()
            .all(|(n, v)| n != "audit" || v["tenant"] == "alice"),
        "{alice:?}"
    );

    let bob = dashboard_events(&env, BOB, |ev| has(&a)(ev) && has(&b)(ev)).await;
    let stats = &bob.iter().find(|(n, _)| n == "stats").unwrap().1;
    assert_eq!(stats["scope"], "all");
    assert_eq!(stats["pools"][0]["tier"], "container");

    let r = env
        .http
        .get(format!("{}/v1/events", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // The page is served to anyone (it holds no data), with a policy that keeps it to
    // itself.
    let r = env
        .http
        .get(format!("{}/dashboard", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    env.server.shutdown().await;
}

/// docs/openapi.json is the document generated from the router's own operations and the
/// wire types (regenerate it with `CORDON_UPDATE_OPENAPI=1 cargo test -p cordon-server
/// --test api openapi`), and every operation it documents is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_is_generated_from_the_router() {
    let env = start().await;
    let (_, ops) = cordon_server::api::documented(env.server.service().clone());
    let doc = cordon_server::openapi::document(&ops);
    let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    if std::env::var_os("CORDON_UPDATE_OPENAPI").is_some() {
        std::fs::write(file, &text).unwrap();
    }
    let checked_in = std::fs::read_to_string(file).unwrap();
    assert!(
        checked_in == text,
        "docs/openapi.json is not the generated document; regenerate it with \
         `CORDON_UPDATE_OPENAPI=1 cargo test -p cordon-server --test api openapi` (make openapi) \
         and commit it"
    );
    // Each operation: a unique operationId, a tag, a summary; errors by status.
    let mut ids: Vec<&str> = ops.iter().map(|o| o.id).collect();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "operationIds repeat");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            assert!(
                op["tags"][0].is_string() && op["summary"].as_str().unwrap().len() > 10,
                "{m} {path}"
            );
            assert!(
                op["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .any(|s| s.starts_with('2')),
                "{m} {path}"
            );
        }
    }
    // Required fields and enums come from the types.
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["VolumeCreate"]["required"], json!(["name", "size"]));
    let tiers = serde_json::to_string(&schemas["TierChoice"]).unwrap();
    assert!(
        tiers.contains("\"auto\"") && tiers.contains("\"microvm\""),
        "{tiers}"
    );
    let codes = serde_json::to_string(&schemas["Code"]).unwrap();
    assert!(
        codes.contains("\"policy_denied\"") && codes.contains("\"sandbox_gone\""),
        "{codes}"
    );
    let create = &doc["paths"]["/v1/sandboxes"]["post"];
    assert_eq!(
        create["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/SandboxRequest"
    );
    assert!(
        create["responses"]["403"]["description"]
            .as_str()
            .unwrap()
            .contains("policy_denied")
    );
    let routes: Vec<(String, String)> = ops
        .iter()
        .map(|o| (o.method.as_str().to_lowercase(), o.path.replace("{*", "{")))
        .collect();
    // Every documented operation is served (not the fallback).
    for (m, p) in &routes {
        let path = p
            .replace("{id}", "sb-00000000000000000000000000000000")
            .replace("{path}", "work/x");
        let method = M::from_bytes(m.to_uppercase().as_bytes()).unwrap();
        let r = env
            .req(method, &path, ALICE)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let stream = r
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
        if stream {
            // The dashboard's event stream: served, and it runs until the server stops.
            continue;
        }
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("no_such_route") && !text.contains("method_not_allowed"),
            "{m} {p} is documented but not served: {text}"
        );
    }
    env.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_destroys_everything_and_restart_recovers_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let counters = Arc::new(Counters::default());
    let mut cfg = config(dir.path());
    cfg.pools.clear();
    let server = Server::start(cfg.clone(), backends(&counters), None)
        .await
        .unwrap();
    let svc = server.service().clone();
    let alice = Tenant("alice".into());
    for _ in 0..3 {
        svc.sessions()
            .create(&alice, Default::default())
            .await
            .unwrap();
    }
    server.shutdown().await;
    assert_eq!(counters.created.load(Ordering::SeqCst), 3);
    assert_eq!(counters.destroyed.load(Ordering::SeqCst), 3);
    drop(svc);

    // Pretend a server died holding two sandboxes and a scratch dir.
    {
        let audit = cordon_server::audit::Audit::open(&dir.path().join("audit.db")).unwrap();
        audit
            .sandbox_started("sb-dead1", Some("alice"), Tier::Container, "live")
            .unwrap();
        audit
            .sandbox_started("sb-dead2", None, Tier::Container, "pooled")
            .unwrap();
    }
    let scratch = cordon_server::scratch_dir(dir.path(), Tier::Wasm).join("cordon-wasm-left");
    std::fs::create_dir_all(scratch.join("sub")).unwrap();
    // A template build killed mid-way: its staging dir, locked by nobody (issue 35 item 5;
    // the scratch mount a real one leaves is covered by the CLI's
    // gc_frees_what_a_killed_build_left_mounted_and_staged, the same sweep).
    let staged = dir.path().join("templates/staging/0123456789abcdef");
    std::fs::create_dir_all(staged.join("fs/work")).unwrap();
    std::fs::write(staged.join("disk.img"), b"left").unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let hook: cordon_server::RecoveryHook = {
        let seen = seen.clone();
        Arc::new(move |rows| {
            let mut s = seen.lock().unwrap();
            s.extend(rows.iter().map(|r| r.id.clone()));
            rows.iter()
                .map(|r| format!("cgroup cordon/{}", r.id))
                .collect()
        })
    };
    let svc = Service::start(cfg, Keys::default(), backends(&counters), Some(hook))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), ["sb-dead1", "sb-dead2"]);
    // The tier's own recovery (Backend::recover) got the orphans of its tier.
    assert_eq!(
        *counters.recovered.lock().unwrap(),
        ["sb-dead1", "sb-dead2"]
    );
    assert!(!scratch.exists());
    assert!(
        !staged.exists(),
        "a dead build's staging dir survived the restart"
    );
    let rows = svc
        .audit()
        .query(
            None,
            &cordon_server::audit::Query {
                kind: Some("recovery".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(rows.len(), 1);
    let removed: Vec<&str> = rows[0].detail["removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        removed,
        [
            "fake: sb-dead1",
            "fake: sb-dead2",
            "cgroup cordon/sb-dead1",
            "cgroup cordon/sb-dead2",
            "template staging: 1 dirs of dead builds or imports"
        ]
    );
    assert!(svc.audit().unfinished().unwrap().is_empty());
    // Earlier rows are intact.
    let creates = svc
        .audit()
        .query(
            Some("alice"),
            &cordon_server::audit::Query {
                kind: Some("create".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(creates.len(), 3);
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_dir_is_refused() {
    let env = start().await;
    let cfg = env.server.service().config().clone();
    let r = Service::start(cfg, Keys::default(), BTreeMap::new(), None).await;
    assert!(matches!(r, Err(cordon_server::ServerError::Locked(_))));
    env.server.shutdown().await;
}

// ---- MCP ---------------------------------------------------------------------------------

mod mcp {
    use super::*;
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;

    fn args(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    async fn tool<S>(
        client: &rmcp::service::RunningService<rmcp::RoleClient, S>,
        name: &'static str,
        a: Value,
    ) -> (bool, String)
    where
        S: rmcp::service::Service<rmcp::RoleClient>,
    {
        let r = client
            .call_tool(CallToolRequestParams::new(name).with_arguments(args(a)))
            .await
            .unwrap();
        let text = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<String>();
        (r.is_error != Some(true), text)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_session_over_a_stream_with_the_rmcp_client() {
        let dir = tempfile::tempdir().unwrap();
        let counters = Arc::new(Counters::default());
        let cfg = config(dir.path());
        let svc = Service::start(cfg, Keys::default(), backends(&counters), None)
            .await
            .unwrap();
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (sr, sw) = tokio::io::split(server_io);
        let s2 = svc.clone();
        let server = tokio::spawn(async move {
            cordon_server::mcp::serve_io(s2, Tenant("local".into()), (sr, sw)).await
        });
        let client = ().serve(client_io).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "audit",
                "create_context",
                "create_sandbox",
                "create_snapshot",
                "create_volume",
                "delete_context",
                "delete_snapshot",
                "delete_volume",
                "destroy",
                "exec",
                "fork_sandbox",
                "get_sandbox",
                "kill_exec",
                "list_contexts",
                "list_execs",
                "list_files",
                "list_sandboxes",
                "list_snapshots",
                "list_volumes",
                "make_dir",
                "pause_sandbox",
                "read_exec",
                "read_file",
                "remove_path",
                "rename_path",
                "resize_exec",
                "restart_context",
                "resume_sandbox",
                "run",
                "run_code",
                "start_background",
                "start_from_snapshot",
                "stat_file",
                "update_sandbox",
                "write_file"
            ]
        );
        // Every tool: a title, the three hints, and an object output schema.
        for t in &tools {
            assert!(t.title.is_some(), "{} has no title", t.name);
            let a = t.annotations.as_ref().expect("annotations");
            assert!(
                a.read_only_hint.is_some()
                    && a.destructive_hint.is_some()
                    && a.idempotent_hint.is_some(),
                "{} lacks a hint: {a:?}",
                t.name
            );
            let out = t.output_schema.as_ref().expect("an output schema");
            assert_eq!(out.get("type"), Some(&json!("object")), "{}", t.name);
        }
        // Enums in the input schemas: the create tool's tier, trust and autonomy.
        let create = tools.iter().find(|t| t.name == "create_sandbox").unwrap();
        let schema = serde_json::to_string(&create.input_schema).unwrap();
        for v in [
            "\"gvisor\"",
            "\"auto\"",
            "\"untrusted\"",
            "\"install-packages\"",
        ] {
            assert!(schema.contains(v), "{v} not in {schema}");
        }

        let (ok, out) = tool(
            &client,
            "run",
            json!({"code": "console.log(6*7)", "lang": "javascript", "tier": "runtime"}),
        )
        .await;
        assert!(ok, "{out}");
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap()["stdout"],
            "42\n",
            "{out}"
        );

        let (ok, out) = tool(
            &client,
            "create_sandbox",
            json!({"tier": "container", "ttl": "5m"}),
        )
        .await;
        assert!(ok, "{out}");
        let id = serde_json::from_str::<Value>(&out).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let (ok, out) = tool(
            &client,
            "write_file",
            json!({"sandbox": id, "path": "/work/n.txt", "content": "hello"}),
        )
        .await;
        assert!(ok, "{out}");
        let (ok, out) = tool(
            &client,
            "read_file",
            json!({"sandbox": id, "path": "/work/n.txt"}),
        )
        .await;
        assert!(ok, "{out}");
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap()["text"],
            "hello"
        );
        let (ok, out) = tool(
            &client,
            "exec",
            json!({"sandbox": id, "argv": ["cat", "/work/n.txt"]}),
        )
        .await;
        assert!(ok, "{out}");
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap()["stdout"],
            "hello"
        );
        let (ok, out) = tool(
            &client,
            "read_file",
            json!({"sandbox": id, "path": "/proc/self/environ"}),
        )
        .await;
        assert!(!ok && out.contains("path_refused"), "{out}");
        // Directories: make, list, stat, rename, remove.
        let (ok, out) = tool(
            &client,
            "make_dir",
            json!({"sandbox": id, "path": "/work/d/e", "parents": true}),
        )
        .await;
        assert!(ok, "{out}");
        let (ok, out) = tool(&client, "list_files", json!({"sandbox": id})).await;
        let v: Value = serde_json::from_str(&out).unwrap();
        let names: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(ok && names == ["d"], "{out}");
        let (ok, out) = tool(
            &client,
            "stat_file",
            json!({"sandbox": id, "path": "/work/d/e"}),
        )
        .await;
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(ok && v["kind"] == "dir" && v["name"] == "e", "{out}");
        let (ok, out) = tool(
            &client,
            "rename_path",
            json!({"sandbox": id, "from": "/work/d/e", "to": "/work/f"}),
        )
        .await;
        assert!(ok, "{out}");
        let (ok, out) = tool(
            &client,
            "remove_path",
            json!({"sandbox": id, "path": "/work/d", "recursive": true}),
        )
        .await;
        assert!(ok, "{out}");
        let (ok, out) = tool(
            &client,
            "list_files",
            json!({"sandbox": id, "path": "/work"}),
        )
        .await;
        let v: Value = serde_json::from_str(&out).unwrap();
        let names: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(ok && names == ["f"], "{out}");
        let (ok, out) = tool(
            &client,
            "stat_file",
            json!({"sandbox": id, "path": "/proc/self/environ"}),
        )
        .await;
        assert!(!ok && out.contains("path_refused"), "{out}");
        let (ok, out) = tool(&client, "destroy", json!({"sandbox": id})).await;
        assert!(ok, "{out}");
        let (ok, out) = tool(&client, "exec", json!({"sandbox": id, "argv": ["echo"]})).await;
        assert!(!ok && out.contains("not_found"), "{out}");
        client.cancel().await.unwrap();
        let _ = server.await;
        // The session's calls are audited under the stdio tenant.
        let rows = svc
            .audit()
            .query(Some("local"), &cordon_server::audit::Query::default())
            .unwrap();
        assert!(rows.iter().any(|e| e.kind == "exec"));
        svc.shutdown().await;
    }

    /// One JSON-RPC message over `/mcp` with `key` and, if given, a session id.
    async fn rpc(
        env: &Env,
        method: M,
        key: &str,
        session: Option<&str>,
        body: Value,
    ) -> (u16, Option<String>, String) {
        let mut r = env
            .req(method, "/mcp", key)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        let resp = r.body(body.to_string()).send().await.unwrap();
        let status = resp.status().as_u16();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_string());
        (status, sid, resp.text().await.unwrap_or_default())
    }

    /// An MCP session belongs to the tenant that opened it: another key holder gets 404 for
    /// it (use and DELETE alike) and the owner's session keeps working; each tenant holds at
    /// most its ceiling's number of sessions. Before, any key could drive or end any session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mcp_sessions_are_bound_to_their_tenant_and_capped() {
        let env = start_with(|cfg| {
            cfg.tenants.insert(
                "bob".into(),
                cordon_engine::TenantRules {
                    max_mcp_sessions: Some(1),
                    ..Default::default()
                },
            );
        })
        .await;
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let (s, sid, _) = rpc(&env, M::POST, ALICE, None, init.clone()).await;
        assert_eq!(s, 200);
        let sid = sid.unwrap();
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        rpc(&env, M::POST, ALICE, Some(&sid), note.clone()).await;
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        let (s, _, body) = rpc(&env, M::POST, BOB, Some(&sid), list.clone()).await;
        assert_eq!(s, 404, "bob used alice's session: {body}");
        let (s, _, _) = rpc(&env, M::DELETE, BOB, Some(&sid), json!({})).await;
        assert_eq!(s, 404, "bob ended alice's session");
        let (s, _, body) = rpc(&env, M::POST, ALICE, Some(&sid), list).await;
        assert_eq!(s, 200, "{body}");
        assert!(body.contains("create_sandbox"), "{body}");
        // Bob's cap of one session.
        let (s, bob_sid, _) = rpc(&env, M::POST, BOB, None, init.clone()).await;
        assert_eq!(s, 200);
        let (s, _, body) = rpc(&env, M::POST, BOB, None, init.clone()).await;
        assert_eq!(s, 429, "{body}");
        let (s, _, _) = rpc(&env, M::DELETE, BOB, Some(&bob_sid.unwrap()), json!({})).await;
        assert!(s < 300, "{s}");
        let (s, _, _) = rpc(&env, M::POST, BOB, None, init).await;
        assert_eq!(s, 200, "a closed session frees its place");
        env.server.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streamable_http_needs_a_key_and_acts_for_its_tenant() {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let env = start().await;
        let r = env
            .http
            .post(format!("{}/mcp", env.base))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", env.base))
                .auth_header(BOB),
        );
        let client = ().serve(transport).await.unwrap();
        let (ok, out) = tool(&client, "create_sandbox", json!({})).await;
        assert!(ok, "{out}");
        let id = serde_json::from_str::<Value>(&out).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let (ok, out) = tool(
            &client,
            "exec",
            json!({"sandbox": id, "argv": ["echo", "via", "mcp"]}),
        )
        .await;
        assert!(ok && out.contains("via mcp"), "{out}");
        // The sandbox is bob's: visible to bob over REST, not to alice.
        let (_, l) = env.call(M::GET, "/v1/sandboxes", BOB, None).await;
        assert_eq!(l["sandboxes"][0]["id"], id.as_str());
        let (s, _) = env
            .call(M::GET, &format!("/v1/sandboxes/{id}"), ALICE, None)
            .await;
        assert_eq!(s, 404);
        client.cancel().await.unwrap();
        env.server.shutdown().await;
    }
}

/// The attacks of a tenant holding one valid key, replayed against a server whose ceiling is
/// the default (bob) or opens one grant and trust (alice): each is a clear 4xx naming the
/// rule and the fix, nothing is read from where the request points, and the audit row
/// carries the whole decision. Fails on the code before the gate: a secret file was read,
/// loopback was allowed, the runtime tier was open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_refuses_a_tenants_attacks_by_default() {
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("github");
    std::fs::write(&secret_file, "ghp_REALsecretVALUE0123456789\n").unwrap();
    let canary = secret_dir.path().join("root-only");
    std::fs::write(&canary, "CANARY-host-file-0123456789").unwrap();
    let env = start_with(|cfg| {
        cfg.tenant_defaults = Default::default();
        cfg.tenants.insert(
            "alice".into(),
            cordon_engine::TenantRules {
                trust: Some(cordon_policy::Trust::Trusted),
                ..Default::default()
            },
        );
        cfg.grants = vec![cordon_engine::GrantEntry {
            name: "github".into(),
            env_var: None,
            secret: cordon_engine::ceiling::SecretSource::File(secret_file.clone()),
            load: Default::default(),
            hosts: cordon_core::egress::parse_patterns(&["api.github.test"]).unwrap(),
            header: "authorization".into(),
            methods: vec![],
            path_prefixes: vec![],
            max_lifetime: None,
            tenants: vec!["alice".into()],
        }];
    })
    .await;
    let file = canary.display().to_string();
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        // a secret source in the body: refused before anything is read, nothing echoed
        (
            BOB,
            json!({"tier": "gvisor", "grants": [{"name": "x", "env_var": "X", "secret": {"file": file}, "hosts": ["evil.test"]}]}),
            400,
            "invalid_request",
            "",
        ),
        (
            BOB,
            json!({"grants": [{"secret": {"env": "PATH"}}]}),
            400,
            "invalid_request",
            "",
        ),
        // the host's own network
        (
            BOB,
            json!({"allow_hosts": ["127.0.0.1/32:7070"]}),
            403,
            "policy_denied",
            "ceiling.egress",
        ),
        (
            BOB,
            json!({"allow_hosts": ["169.254.169.254/32:80"]}),
            403,
            "policy_denied",
            "ceiling.egress",
        ),
        (
            BOB,
            json!({"allow_hosts": ["10.0.0.0/8:*"]}),
            403,
            "policy_denied",
            "ceiling.egress",
        ),
        (
            BOB,
            json!({"allow_hosts": ["0.0.0.0/0:*"]}),
            403,
            "policy_denied",
            "ceiling.egress",
        ),
        // the tier
        (
            BOB,
            json!({"tier": "runtime"}),
            403,
            "policy_denied",
            "ceiling.tiers",
        ),
        (
            BOB,
            json!({"tier": "container"}),
            403,
            "policy_denied",
            "untrusted-needs-kernel-boundary",
        ),
        (
            BOB,
            json!({"tier": "container", "trust": "trusted"}),
            403,
            "policy_denied",
            "ceiling.trust",
        ),
        // another tenant's grant
        (
            BOB,
            json!({"tier": "gvisor", "grants": ["github"]}),
            403,
            "policy_denied",
            "ceiling.grants",
        ),
        (
            ALICE,
            json!({"grants": ["nonexistent"]}),
            403,
            "policy_denied",
            "ceiling.grants",
        ),
    ];
    for (key, body, status, code, rule) in &cases {
        let (s, e) = env
            .call(M::POST, "/v1/sandboxes", key, Some(body.clone()))
            .await;
        assert_eq!(
            (s, e["code"].as_str()),
            (*status, Some(*code)),
            "{body}: {e}"
        );
        if !rule.is_empty() {
            assert_eq!(e["rule"], *rule, "{body}: {e}");
        }
        assert!(!e["fix"].as_str().unwrap_or("").is_empty(), "{e}");
        let text = e.to_string();
        for leak in ["CANARY", "root-only", "ghp_REAL", "/usr/bin"] {
            assert!(
                !text.contains(leak),
                "{body}: the error tells {leak}: {text}"
            );
        }
    }
    assert_eq!(
        env.counters.created.load(Ordering::SeqCst),
        2,
        "only the warm pool"
    );
    // The denial rows carry the whole decision.
    let (_, rows) = env
        .call(M::GET, "/v1/audit?kind=policy&limit=100", BOB, None)
        .await;
    let rows = rows["events"].as_array().unwrap().clone();
    let egress = rows
        .iter()
        .find(|r| r["detail"]["rule"] == "ceiling.egress")
        .expect("an egress refusal row");
    assert_eq!(egress["decision"], "deny");
    assert_eq!(egress["detail"]["principal"], "bob");
    assert_eq!(egress["detail"]["trust_ceiling"], "untrusted");
    assert_eq!(egress["detail"]["egress_ceiling"], json!(["*"]));
    assert!(!rows.iter().any(|r| r.to_string().contains("CANARY")));
    // Alice's catalogue grant: the sandbox gets a placeholder, a program printing the real
    // secret has it masked in the streamed chunks and the whole outcome, and the use is a
    // grant_use row naming grant, host, method and path (never the value).
    let id = env
        .create(ALICE, json!({"grants": ["github"], "tier": "container"}))
        .await;
    let r = env
        .req(M::POST, &format!("/v1/sandboxes/{id}/exec"), ALICE)
        .header("accept", "application/x-ndjson")
        .json(&json!({"argv": ["leak"]}))
        .send()
        .await
        .unwrap();
    let streamed = r.text().await.unwrap();
    assert!(!streamed.contains("ghp_REAL"), "{streamed}");
    assert!(!streamed.contains("secretVALUE"), "{streamed}");
    assert!(streamed.contains("token=*****"), "{streamed}");
    let (_, rows) = env
        .call(
            M::GET,
            &format!("/v1/audit?kind=grant_use&sandbox={id}"),
            ALICE,
            None,
        )
        .await;
    let uses = rows["events"].as_array().unwrap();
    assert_eq!(uses.len(), 1, "{rows}");
    assert_eq!(uses[0]["detail"]["grant"], "github");
    assert_eq!(uses[0]["detail"]["host"], "api.github.test");
    assert_eq!(uses[0]["detail"]["method"], "GET");
    assert_eq!(uses[0]["detail"]["path"], "/repos/acme/x");
    assert!(!rows.to_string().contains("ghp_REAL"));
    env.server.shutdown().await;
}

/// A minted grant end to end through the API: the token's issuer is this server, its
/// subject the sandbox, its key in the published JWKS; introspection says active while the
/// sandbox lives and inactive once it is destroyed; the discovery document points at both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minted_tokens_are_published_introspected_and_die_with_the_sandbox() {
    let env = start_with(|cfg| {
        cfg.grants = vec![cordon_engine::GrantEntry {
            name: "cloud".into(),
            env_var: None,
            secret: cordon_engine::ceiling::SecretSource::Mint(cordon_engine::ceiling::MintSpec {
                audience: "sts.example.test".into(),
                lifetime: Dur(Duration::from_secs(300)),
                scope: None,
            }),
            load: Default::default(),
            hosts: cordon_core::egress::parse_patterns(&["sts.example.test"]).unwrap(),
            header: "authorization".into(),
            methods: vec![],
            path_prefixes: vec![],
            max_lifetime: None,
            tenants: vec!["alice".into()],
        }];
    })
    .await;
    let get = |path: &str| {
        let url = format!("{}{path}", env.base);
        let http = env.http.clone();
        async move {
            http.get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let d = get("/.well-known/openid-configuration").await;
    let issuer = d["issuer"].as_str().unwrap().to_string();
    assert_eq!(d["jwks_uri"], format!("{issuer}/.well-known/jwks.json"));
    let jwks = get("/.well-known/jwks.json").await;
    assert_eq!(jwks["keys"][0]["alg"], "ES256", "{jwks}");
    let id = env
        .create(
            ALICE,
            json!({"tier": "container", "grants": ["cloud"], "ttl": "2m"}),
        )
        .await;
    let (s, o) = env.exec(ALICE, &id, json!({"argv": ["mint"]})).await;
    assert_eq!(s, 200, "{o}");
    let token = o["stdout"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3, "{token}");
    // The token's kid is one of the published keys.
    use base64::Engine as _;
    let header: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert!(
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["kid"] == header["kid"]),
        "{header} not in {jwks}"
    );
    let introspect = |t: String| {
        let url = format!("{}/v1/tokens/introspect", env.base);
        let http = env.http.clone();
        async move {
            http.post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("token={t}"))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let v = introspect(token.clone()).await;
    assert_eq!(v["active"], true, "{v}");
    assert_eq!(v["sub"], id.as_str());
    assert_eq!(v["iss"], issuer.as_str());
    assert_eq!(v["aud"], "sts.example.test");
    assert_eq!(v["tenant"], "alice");
    let exp = v["exp"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        exp <= now + 120,
        "never beyond the sandbox's 2 min ttl: {v}"
    );
    let v = introspect(format!("{token}x")).await;
    assert_eq!(v, json!({"active": false}));
    let (s, _) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
        .await;
    assert_eq!(s, 200);
    let v = introspect(token).await;
    assert_eq!(v, json!({"active": false}), "a destroyed sandbox's token");
    env.server.shutdown().await;
}

/// With `[tls]` the API is served over rustls: a client trusting the certificate gets the
/// health answer over TLS; a plain-HTTP request on the same port gets no HTTP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_tls_when_configured() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (certs.path().join("c.pem"), certs.path().join("k.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let env = start_with(|cfg| {
        cfg.tls = Some(cordon_server::config::TlsConfig {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
        });
    })
    .await;
    assert!(env.server.tls());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(env.server.addr())
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /v1/health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    let _ = tls.read_to_string(&mut out).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"status\":\"ok\""), "{out}");
    // Plain HTTP on the TLS port is not served.
    let (code, _) = tokio::task::spawn_blocking({
        let base = env.base.clone();
        move || {
            raw(
                &base,
                "GET /v1/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".into(),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "a plain request got an HTTP answer");
    env.server.shutdown().await;
}

/// A file call whose client gives up keeps its sandbox busy until the blocking work has
/// ended: before, `busy` was cleared as soon as the client left while the sandbox's lock
/// was still held, so the next request queued behind it instead of getting 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_call_keeps_its_sandbox_busy_until_the_work_ends() {
    let env = start().await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let r = env
        .req(
            M::PUT,
            &format!("/v1/sandboxes/{id}/files/work/slow"),
            ALICE,
        )
        .timeout(Duration::from_millis(150))
        .body("x")
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    let (s, info) = env
        .call(M::GET, &format!("/v1/sandboxes/{id}"), ALICE, None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(info["busy"], true, "{info}");
    let (s, e) = env.exec(ALICE, &id, json!({"argv": ["echo", "x"]})).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("sandbox_busy")), "{e}");
    // Once the put has ended, the sandbox is free again.
    for _ in 0..100 {
        let (_, info) = env
            .call(M::GET, &format!("/v1/sandboxes/{id}"), ALICE, None)
            .await;
        if info["busy"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, o) = env.exec(ALICE, &id, json!({"argv": ["echo", "x"]})).await;
    assert_eq!(s, 200, "{o}");
    env.server.shutdown().await;
}

/// The API's edge: /metrics and the detailed health need a key; repeated bad keys from one
/// address are answered 429 without being checked; short keys stop the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_guards_metrics_health_and_key_guessing() {
    let env = start().await;
    let r = env
        .http
        .get(format!("{}/metrics", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = env
        .http
        .get(format!("{}/v1/health", env.base))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"status": "ok"}), "no detail without a key");
    let (_, v) = env.call(M::GET, "/v1/health", ALICE, None).await;
    assert!(
        v["tiers"].is_object() && v["live_sandboxes"].is_number(),
        "{v}"
    );
    // Issue 44: /metrics and the detailed health showed server-wide and other tenants'
    // figures to any tenant's key. A tenant's key sees its own sandboxes, no pools, and
    // is refused /metrics; the operator's key sees the server.
    env.create(BOB, json!({"tier": "container"})).await;
    env.create(BOB, json!({"tier": "container"})).await;
    env.create(ALICE, json!({"tier": "container"})).await;
    let (_, v) = env.call(M::GET, "/v1/health", ALICE, None).await;
    assert_eq!(v["live_sandboxes"], 1, "alice sees others' sandboxes: {v}");
    assert!(v.get("pools").is_none(), "alice sees the pools: {v}");
    let (_, v) = env.call(M::GET, "/v1/health", OPS, None).await;
    assert_eq!(v["live_sandboxes"], 3, "{v}");
    assert!(v["pools"].is_object(), "{v}");
    let (s, e) = env.call(M::GET, "/metrics", ALICE, None).await;
    assert_eq!((s, e["code"].as_str()), (403, Some("policy_denied")), "{e}");
    assert!(
        e["fix"].as_str().unwrap().contains("dashboard_operators"),
        "{e}"
    );
    let m = env.metrics().await;
    assert!(m.contains("cordon_"), "{m}");
    // Guessing keys: after 5 failures this address is refused without a check.
    let mut codes = Vec::new();
    for i in 0..8 {
        let (s, _) = env
            .call(M::GET, "/v1/sandboxes", &format!("guess-{i}"), None)
            .await;
        codes.push(s);
    }
    assert_eq!(&codes[..5], &[401; 5], "{codes:?}");
    assert!(codes[5..].iter().all(|c| *c == 429), "{codes:?}");
    // Issue 44: the back-off refused valid keys too, so a keyless client sharing the
    // address (loopback, the TLS proxy) locked every tenant out. A valid key is never
    // slowed down, on the native API and MCP alike; the failing attempts still are.
    let (s, e) = env.call(M::GET, "/v1/sandboxes", ALICE, None).await;
    assert_eq!(s, 200, "a valid key was slowed down: {e}");
    let (s, e) = env.call(M::GET, "/v1/sandboxes", BOB, None).await;
    assert_eq!(s, 200, "a valid key was slowed down: {e}");
    let (s, e) = env.call(M::GET, "/v1/sandboxes", "guess-9", None).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (429, Some("too_many_failures")),
        "{e}"
    );
    env.server.shutdown().await;
    // A short key in clear stops the start, naming the tenant.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.keys[0].key = Some("short".into());
    let counters = Arc::new(Counters::default());
    let e = Server::start(cfg, backends(&counters), None)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("\"alice\"") && e.contains("--new-key"), "{e}");
    // So does a bind beyond loopback without TLS.
    let mut cfg = config(dir.path());
    cfg.bind = "0.0.0.0:0".parse().unwrap();
    assert!(cfg.validate().unwrap_err().to_string().contains("[tls]"));
}

/// Requests with `trust` and `autonomy` go through the tier policy: `auto` picks an allowed,
/// available tier; a tier below the minimum, or none allowed being available, is a 403
/// naming the rule and the fix; every decision is an audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_policy_picks_refuses_and_audits() {
    let env = start().await;
    // Trusted compute: the policy picks among runtime and container (both available here).
    let (s, o) = env
        .call(
            M::POST,
            "/v1/run",
            ALICE,
            Some(
                json!({"trust": "trusted", "autonomy": "compute", "tier": "auto",
                        "lang": "js", "code": "console.log(6*7)"}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{o}");
    assert!(
        matches!(o["tier"].as_str(), Some("runtime" | "container")),
        "{o}"
    );
    // Untrusted work may not run in a container: below the minimum.
    let (s, e) = env
        .call(
            M::POST,
            "/v1/sandboxes",
            ALICE,
            Some(json!({"trust": "untrusted", "autonomy": "compute", "tier": "container"})),
        )
        .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("policy_denied")), "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("untrusted-needs-kernel-boundary"), "{msg}");
    assert!(e["fix"].as_str().unwrap().contains("gvisor"), "{e}");
    // With auto, no allowed tier (wasm, gvisor, microvm) is available on this server.
    let (s, e) = env
        .call(
            M::POST,
            "/v1/run",
            ALICE,
            Some(json!({"trust": "untrusted", "autonomy": "compute", "argv": ["true"]})),
        )
        .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("policy_denied")), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("tier-available"),
        "{e}"
    );
    // A tenant's request is always decided by the policy, with the trust the operator
    // gives it: half the inputs, or auto alone, are decided, not refused as malformed; a
    // request that lowers its trust gets the untrusted rules.
    for (body, allowed) in [
        (json!({"autonomy": "compute", "ttl": "1m"}), true),
        (json!({"tier": "auto", "ttl": "1m"}), true),
        (json!({"trust": "untrusted", "tier": "container"}), false),
    ] {
        let (s, e) = env
            .call(M::POST, "/v1/sandboxes", ALICE, Some(body.clone()))
            .await;
        if allowed {
            assert_eq!(s, 201, "{body} {e}");
            let id = e["id"].as_str().unwrap();
            env.call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
                .await;
        } else {
            assert_eq!(
                (s, e["code"].as_str()),
                (403, Some("policy_denied")),
                "{body} {e}"
            );
            assert_eq!(e["rule"], "untrusted-needs-kernel-boundary", "{e}");
        }
    }
    assert_eq!(env.server.service().sessions().count(), 0);
    // Every decision above is in the audit: one allow, two denials naming their rules.
    let (s, rows) = env
        .call(M::GET, "/v1/audit?kind=policy&limit=100", ALICE, None)
        .await;
    assert_eq!(s, 200, "{rows}");
    let text = rows.to_string();
    assert!(text.contains("untrusted-needs-kernel-boundary"), "{text}");
    assert!(text.contains("tier-available"), "{text}");
    assert!(text.contains("\"chosen\""), "{text}");
    env.server.shutdown().await;
}

/// A `[[pool]]` spec (limits and an allow-list) keeps its own warm sandboxes: a create that
/// asks for exactly it takes one, the default spec takes from the tier's default pool, and
/// any other spec starts cold. The pools' gauge counts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_another_spec_serves_exactly_that_spec() {
    let env = start_with(|cfg| {
        cfg.spec_pools.push(cordon_server::config::SpecPool {
            size: 1,
            spec: cordon_server::model::CreateRequest {
                tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
                limits: cordon_server::model::LimitsPatch {
                    memory_bytes: Some(256 << 20),
                    ..Default::default()
                },
                allow_hosts: vec!["pypi.example.test".into()],
                ..Default::default()
            },
        });
    })
    .await;
    env.wait_pool(3).await;
    let create = |body: Value| env.call(M::POST, "/v1/sandboxes", ALICE, Some(body));
    let (s, v) = create(json!({
        "tier": "container",
        "allow_hosts": ["pypi.example.test"],
        "limits": {"memory_bytes": 256 << 20},
    }))
    .await;
    assert_eq!((s, v["source"].as_str()), (201, Some("pool")), "{v}");
    let (s, v) = create(json!({"tier": "container", "allow_hosts": ["other.example.test"]})).await;
    assert_eq!((s, v["source"].as_str()), (201, Some("cold")), "{v}");
    let (s, v) = create(json!({"tier": "container", "allow_hosts": ["pypi.example.test"]})).await;
    assert_eq!(
        (s, v["source"].as_str()),
        (201, Some("cold")),
        "limits differ: {v}"
    );
    let (s, v) = create(json!({"tier": "container"})).await;
    assert_eq!((s, v["source"].as_str()), (201, Some("pool")), "{v}");
    let metrics = env.metrics().await;
    assert!(
        metrics.contains("cordon_pool_hits_total{tier=\"container\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cordon_pool_misses_total{tier=\"container\"} 2"),
        "{metrics}"
    );
    env.server.shutdown().await;
}

/// A `[[pool]]` with a template keeps warm sandboxes of that template: a create naming it
/// takes one, the same create without it starts cold; a pool naming a template the store
/// lacks stops the server's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_a_template_serves_creates_naming_it() {
    let pool = |template: &str| cordon_server::config::SpecPool {
        size: 1,
        spec: cordon_server::model::CreateRequest {
            tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
            template: Some(template.into()),
            ..Default::default()
        },
    };
    let env = start_with(|cfg| {
        let store = cordon_template::Store::open(&cfg.data_dir).unwrap();
        let file = cfg.data_dir.join("i.oci.tar");
        std::fs::write(
            &file,
            cordon_testkit::image::hostile_image(None).oci_tar(false),
        )
        .unwrap();
        store
            .import(&file, "tools", &cordon_template::ImportLimits::default())
            .unwrap();
        cfg.spec_pools.push(pool("tools"));
    })
    .await;
    env.wait_pool(3).await;
    let create = |body: Value| env.call(M::POST, "/v1/sandboxes", ALICE, Some(body));
    let (s, v) = create(json!({"tier": "container", "template": "tools"})).await;
    assert_eq!((s, v["source"].as_str()), (201, Some("pool")), "{v}");
    let (s, v) = create(json!({
        "tier": "container",
        "template": "tools",
        "limits": {"memory_bytes": 256 << 20},
    }))
    .await;
    assert_eq!((s, v["source"].as_str()), (201, Some("cold")), "{v}");
    env.server.shutdown().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.spec_pools.push(pool("missing"));
    let err = refused_start(cfg).await;
    assert!(err.contains("no template named \"missing\""), "{err}");
}

/// A `[[pool]]` spec the server's policy would refuse, or two pools of one spec, stop the
/// server at its start with a message that names the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_specs_the_policy_refuses_stop_the_start() {
    let pool = |memory: u64| cordon_server::config::SpecPool {
        size: 1,
        spec: cordon_server::model::CreateRequest {
            tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
            limits: cordon_server::model::LimitsPatch {
                memory_bytes: Some(memory),
                ..Default::default()
            },
            ..Default::default()
        },
    };
    for (pools, want) in [
        (vec![pool(64 << 30)], "limits.memory_bytes is above"),
        (vec![pool(256 << 20), pool(256 << 20)], "same spec"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.spec_pools = pools;
        let e = refused_start(cfg).await;
        assert!(e.contains("warm pool") && e.contains(want), "{e}");
    }
}

/// A part of the service that cannot start stops the server with the error that stopped
/// it kept as its source (here the volume store, whose directory is a file), not only its
/// text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_keeps_the_cause_as_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::write(dir.path().join("volumes"), b"not a directory").unwrap();
    let counters = Arc::new(Counters::default());
    let e = Server::start(cfg, backends(&counters), None)
        .await
        .err()
        .expect("the server started without its volume store");
    assert!(e.to_string().contains("the volume store"), "{e}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "the cause was flattened into text: {e:?}"
    );
}

/// The error of a server's start that must fail before it makes any sandbox.
async fn refused_start(cfg: Config) -> String {
    let counters = Arc::new(Counters::default());
    let e = Server::start(cfg, backends(&counters), None)
        .await
        .err()
        .expect("the server started with a configuration it must refuse")
        .to_string();
    assert_eq!(counters.created.load(Ordering::SeqCst), 0, "{e}");
    e
}

/// A warm pool's spec is the gate's admission of the create that takes from it: a pooled
/// sandbox is made exactly as that create would make it cold (the sandbox reports the spec
/// it was made with), and the runtime tier's pool, whose heap the gate caps below the
/// default memory, serves the plain create it could never match before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_is_what_a_cold_create_makes() {
    async fn made(env: &Env, tier: &str) -> Value {
        let (s, v) = env
            .call(
                M::POST,
                "/v1/sandboxes",
                ALICE,
                Some(json!({ "tier": tier })),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        v
    }
    let pooled = start_with(|c| {
        c.pools.insert(Tier::Runtime, 1);
    })
    .await;
    pooled.wait_pool(2).await;
    for _ in 0..200 {
        if pooled.server.service().pools().ready(Tier::Runtime) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cold = start_with(|c| c.pools.clear()).await;
    let mut reports = Vec::new();
    for env in [&pooled, &cold] {
        let v = made(env, "container").await;
        let id = v["id"].as_str().unwrap().to_string();
        let (s, out) = env.exec(ALICE, &id, json!({"argv": ["spec"]})).await;
        assert_eq!(s, 200, "{out}");
        reports.push((v["source"].clone(), out["stdout"].clone()));
    }
    assert_eq!(reports[0].0, "pool", "{reports:?}");
    assert_eq!(reports[1].0, "cold", "{reports:?}");
    assert_eq!(
        reports[0].1, reports[1].1,
        "the pooled sandbox was made with another spec than a cold create's"
    );
    let runtime: Vec<Value> = [made(&pooled, "runtime").await, made(&cold, "runtime").await].into();
    assert_eq!(runtime[0]["source"], "pool", "{runtime:?}");
    assert_eq!(runtime[1]["source"], "cold", "{runtime:?}");
    assert_eq!(runtime[0]["limits"], runtime[1]["limits"], "{runtime:?}");
    pooled.server.shutdown().await;
    cold.server.shutdown().await;
}

/// A warm pool the gate would refuse every tenant (an allow-list past the operator's egress
/// ceiling, a tier the ceiling does not open) stops the start with the gate's rule and
/// reason, before any sandbox is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_over_the_ceiling_is_refused_at_start_with_the_gates_reason() {
    let private = cordon_server::config::SpecPool {
        size: 1,
        spec: cordon_server::model::CreateRequest {
            tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
            allow_hosts: vec!["10.0.0.1".into()],
            ..Default::default()
        },
    };
    for case in ["egress", "tiers"] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        let rule = if case == "egress" {
            cfg.spec_pools.push(private.clone());
            "ceiling.egress"
        } else {
            cfg.tenant_defaults.tiers = Some(vec![Tier::Runtime, Tier::Wasm]);
            "ceiling.tiers"
        };
        let e = refused_start(cfg).await;
        assert!(e.contains("warm pool") && e.contains(rule), "{e}");
    }
}

/// Bounded fuzzing of the API's request bodies (docs/fuzzing.md): any bytes never panic
/// parsing or the conversions the handlers make, and a run body's sandbox half goes
/// through the gate like a create.
mod fuzz {
    use super::*;
    use cordon_engine::{Catalogue, CeilingConfig, Gate, GateSettings, Principal, RulesSource};
    use cordon_server::model::{CreateRequest, ExecBody, RunFile, RunRequest};
    use cordon_testkit::fuzz::{CREATE_FIELDS, EXEC_FIELDS, LIMIT_FIELDS, body, config};
    use proptest::prelude::*;

    const FILE: &[&str] = &["path", "content", "content_base64", "mode"];

    fn gate() -> Gate {
        let catalogue = Catalogue::load(&[], None).unwrap();
        Gate::new(
            GateSettings::default(),
            CeilingConfig::default(),
            Arc::new(catalogue),
            RulesSource::Shipped,
            None,
        )
        .with_tiers(Tier::ALL.into_iter().collect(), Vec::new())
    }

    fn exec_checks(e: &ExecBody) {
        if let Ok(r) = e.to_request() {
            if let Command::Argv(v) = &r.command {
                assert!(!v.is_empty(), "{e:?} made an empty argv");
            }
            assert!(!(e.stdin.is_some() && e.stdin_base64.is_some()), "{e:?}");
        }
    }

    proptest! {
        #![proptest_config(config(1024))]

        #[test]
        fn run_bodies_never_panic(b in body([CREATE_FIELDS, EXEC_FIELDS, &["files"]].concat(), ("limits", LIMIT_FIELDS))) {
            let Ok(run) = serde_json::from_slice::<RunRequest>(&b) else { return Ok(()) };
            let Ok((create, exec, files)) = run.split() else { return Ok(()) };
            exec_checks(&exec);
            for f in &files {
                let _ = f.bytes();
                let _ = cordon_core::validate_sandbox_path(&f.path);
            }
            let g = gate();
            if let Ok(a) = g.admit(&Principal::Tenant("alice".into()), &create, "run") {
                prop_assert!(a.spec.validate().is_ok());
                prop_assert!(g.check_max_limits(&a.spec.limits).is_ok());
            }
        }

        #[test]
        fn exec_and_file_bodies_never_panic(
            e in body(EXEC_FIELDS.to_vec(), ("env", &["PATH", "A", "BAD NAME"])),
            f in body(FILE.to_vec(), ("content", &["x"])),
            c in body(CREATE_FIELDS.to_vec(), ("limits", LIMIT_FIELDS)),
        ) {
            if let Ok(e) = serde_json::from_slice::<ExecBody>(&e) {
                exec_checks(&e);
            }
            if let Ok(f) = serde_json::from_slice::<RunFile>(&f) {
                let _ = f.bytes();
            }
            if let Ok(c) = serde_json::from_slice::<CreateRequest>(&c) {
                let _ = gate().admit(&Principal::Tenant("alice".into()), &c, "create");
            }
        }
    }
}

/// A directory goes in as a tar stream, is listed, statted, renamed and removed through its
/// routes, and comes out as a tar stream with the same bytes; archives are not bound by
/// the single-file limit but by their own; hostile entries and wrong types are refused;
/// every call has its audit row; another tenant gets 404 on every route.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_goes_in_and_out_as_a_tar_stream_and_other_tenants_get_404() {
    use cordon_testkit::files::{TarEntry, read_tar, tarball};
    use reqwest::Method as M;
    use sha2::Digest;
    let env = start_with(|c| c.http.max_archive_bytes = 1 << 20).await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{id}/files/mkdir"),
            ALICE,
            Some(json!({"path": "/work/src/pkg", "parents": true})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    // Larger than http.max_file_bytes (256 KiB here): archives have their own limit.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let tar = tarball(&[
        TarEntry::dir("lib/"),
        TarEntry::file("lib/x.bin", &big),
        TarEntry::file("top.txt", b"top"),
    ]);
    let up = |key: &'static str, body: Vec<u8>, ctype: &'static str, path: &str| {
        env.req(
            M::PUT,
            &format!("/v1/sandboxes/{id}/archive?path={path}"),
            key,
        )
        .header("content-type", ctype)
        .body(body)
        .send()
    };
    let r = up(ALICE, tar.clone(), "application/x-tar", "/work/src")
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rep: Value = r.json().await.unwrap();
    assert_eq!(
        (rep["files"].as_u64(), rep["dirs"].as_u64()),
        (Some(2), Some(1)),
        "{rep}"
    );
    assert_eq!(rep["bytes"], 300_003);
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/files?path=/work/src"),
            ALICE,
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let names: Vec<(&str, &str)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        vec![("lib", "dir"), ("pkg", "dir"), ("top.txt", "file")]
    );
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/files/stat?path=/work/src/lib/x.bin"),
            ALICE,
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["kind"].as_str(), v["size"].as_u64(), v["mode"].as_u64()),
        (Some("file"), Some(300_000), Some(0o644))
    );
    // Out again: the same bytes.
    let r = env
        .req(
            M::GET,
            &format!("/v1/sandboxes/{id}/archive?path=/work/src"),
            ALICE,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let got = r.bytes().await.unwrap();
    let found = read_tar(&got);
    let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, vec!["lib/", "lib/x.bin", "pkg/", "top.txt"]);
    assert_eq!(found[1].data, big);
    // Rename, remove.
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{id}/files/rename"),
            ALICE,
            Some(json!({"from": "/work/src/top.txt", "to": "/work/top.txt"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = env
        .call(
            M::DELETE,
            &format!("/v1/sandboxes/{id}/files?path=/work/src"),
            ALICE,
            None,
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (422, Some("file_error")), "{v}");
    let (s, v) = env
        .call(
            M::DELETE,
            &format!("/v1/sandboxes/{id}/files?path=/work/src&recursive=true"),
            ALICE,
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = env
        .call(M::GET, &format!("/v1/sandboxes/{id}/files"), ALICE, None)
        .await;
    assert_eq!(v["entries"][0]["name"], "top.txt", "{v}");
    assert_eq!(v["entries"].as_array().unwrap().len(), 1, "{v}");
    // Refusals.
    let r = up(
        ALICE,
        tarball(&[TarEntry::file("../x", b"x")]),
        "application/x-tar",
        "/work",
    )
    .await
    .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "path_refused", "{v}");
    let r = up(ALICE, tar.clone(), "application/json", "/work")
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = up(ALICE, tar.clone(), "application/x-tar", "/etc")
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Refused before its body was read: the client is told not to reuse the connection
    // (the next request on it would otherwise meet a closed socket).
    assert_eq!(
        r.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/files?path=/etc"),
            ALICE,
            None,
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (400, Some("path_refused")), "{v}");
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/archive?path=/work/none"),
            ALICE,
            None,
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (422, Some("file_error")), "{v}");
    // Past http.max_archive_bytes, while it streams in.
    let huge = vec![7u8; 1 << 20];
    let r = up(
        ALICE,
        tarball(&[TarEntry::file("huge", &huge)]),
        "application/x-tar",
        "/work",
    )
    .await
    .unwrap();
    let v: Value = r.json().await.unwrap();
    assert!(
        v["message"].as_str().unwrap().contains("max_archive_bytes"),
        "{v}"
    );
    // The audit rows: the upload's digest is the archive's.
    let (_, rows) = env
        .call(
            M::GET,
            &format!("/v1/audit?sandbox={id}&kind=archive_put"),
            ALICE,
            None,
        )
        .await;
    let sha = hex::encode(sha2::Sha256::digest(&tar));
    assert!(
        rows["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["detail"]["sha256"] == sha.as_str() && r["decision"] == "ok"),
        "{rows}"
    );
    let (_, rows) = env
        .call(
            M::GET,
            &format!("/v1/audit?sandbox={id}&kind=file_op"),
            ALICE,
            None,
        )
        .await;
    assert!(rows["events"].as_array().unwrap().len() >= 6, "{rows}");
    // Another tenant: 404 on every route, like an unknown id.
    let other: Vec<(M, String, Option<Value>)> = vec![
        (M::GET, format!("/v1/sandboxes/{id}/files?path=/work"), None),
        (
            M::GET,
            format!("/v1/sandboxes/{id}/files/stat?path=/work/top.txt"),
            None,
        ),
        (
            M::DELETE,
            format!("/v1/sandboxes/{id}/files?path=/work/top.txt"),
            None,
        ),
        (
            M::POST,
            format!("/v1/sandboxes/{id}/files/rename"),
            Some(json!({"from": "/work/top.txt", "to": "/work/b"})),
        ),
        (
            M::POST,
            format!("/v1/sandboxes/{id}/files/mkdir"),
            Some(json!({"path": "/work/b"})),
        ),
        (
            M::GET,
            format!("/v1/sandboxes/{id}/archive?path=/work"),
            None,
        ),
    ];
    for (m, path, body) in other {
        let (s, v) = env.call(m.clone(), &path, BOB, body).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (404, Some("not_found")),
            "{m} {path}: {v}"
        );
    }
    let r = up(BOB, tar.clone(), "application/x-tar", "/work")
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Alice's file is untouched by all that.
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/files/stat?path=/work/top.txt"),
            ALICE,
            None,
        )
        .await;
    assert_eq!((s, v["size"].as_u64()), (200, Some(3)), "{v}");
}

/// An upload whose body is still arriving holds the sandbox busy (an exec or another file
/// call gets 409), and ends with the whole stream extracted once the client finishes it.
#[tokio::test(flavor = "multi_thread")]
async fn an_archive_upload_in_flight_keeps_the_sandbox_busy() {
    use cordon_testkit::files::{TarEntry, tarball};
    use reqwest::Method as M;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = start().await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let tar = tarball(&[
        TarEntry::file("a.txt", b"first"),
        TarEntry::file("b.txt", b"second"),
    ]);
    let addr = env.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PUT /v1/sandboxes/{id}/archive?path=/work/up HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {ALICE}\r\nContent-Type: application/x-tar\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = tar.split_at(1024);
    conn.write_all(format!("{:x}\r\n", first.len()).as_bytes())
        .await
        .unwrap();
    conn.write_all(first).await.unwrap();
    conn.write_all(b"\r\n").await.unwrap();
    // The upload has claimed the sandbox while its body is still open.
    let mut busy = false;
    for _ in 0..250 {
        let (_, info) = env
            .call(M::GET, &format!("/v1/sandboxes/{id}"), ALICE, None)
            .await;
        if info["busy"] == true {
            busy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(busy, "the upload never claimed the sandbox");
    let (s, e) = env.exec(ALICE, &id, json!({"argv": ["echo", "x"]})).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("sandbox_busy")), "{e}");
    let (s, e) = env
        .call(M::GET, &format!("/v1/sandboxes/{id}/files"), ALICE, None)
        .await;
    assert_eq!((s, e["code"].as_str()), (409, Some("sandbox_busy")), "{e}");
    // The rest of the stream; the answer covers both files.
    conn.write_all(format!("{:x}\r\n", rest.len()).as_bytes())
        .await
        .unwrap();
    conn.write_all(rest).await.unwrap();
    conn.write_all(b"\r\n0\r\n\r\n").await.unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"files\":2"), "{resp}");
    let (s, v) = env
        .call(
            M::GET,
            &format!("/v1/sandboxes/{id}/files?path=/work/up"),
            ALICE,
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["entries"].as_array().unwrap().len(), 2, "{v}");
    let (s, o) = env.exec(ALICE, &id, json!({"argv": ["echo", "x"]})).await;
    assert_eq!(s, 200, "{o}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_routes_check_the_tenant_the_language_and_the_tier() {
    let env = start().await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let base = format!("/v1/sandboxes/{id}/contexts");
    // Another tenant: 404 on every context route, exactly like an unknown sandbox.
    for (m, p, body) in [
        (M::POST, base.clone(), Some(json!({"lang": "python"}))),
        (M::GET, base.clone(), None),
        (M::DELETE, format!("{base}/ctx-1"), None),
        (M::POST, format!("{base}/ctx-1/restart"), None),
        (
            M::POST,
            format!("{base}/ctx-1/run"),
            Some(json!({"code": "1"})),
        ),
    ] {
        let (s, v) = env.call(m.clone(), &p, BOB, body).await;
        assert_eq!(s, 404, "{m} {p}: {v}");
        assert_eq!(v["code"], "not_found");
    }
    // Unknown or malformed context ids are 404 for the owner too.
    for p in [format!("{base}/ctx-7/run"), format!("{base}/ex-1/run")] {
        let (s, _) = env
            .call(M::POST, &p, ALICE, Some(json!({"code": "1"})))
            .await;
        assert_eq!(s, 404, "{p}");
    }
    // Only Python, JavaScript and bash; unknown fields refused.
    let (s, v) = env
        .call(M::POST, &base, ALICE, Some(json!({"lang": "ruby"})))
        .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    let (s, _) = env
        .call(
            M::POST,
            &base,
            ALICE,
            Some(json!({"lang": "python", "x": 1})),
        )
        .await;
    assert_eq!(s, 400);
    // A tier without background execs (this fake one) refuses with the reason, and keeps
    // no half-made context.
    let (s, v) = env
        .call(M::POST, &base, ALICE, Some(json!({"lang": "python"})))
        .await;
    assert_eq!((s, v["code"].as_str()), (422, Some("unsupported")), "{v}");
    let (s, v) = env.call(M::GET, &base, ALICE, None).await;
    assert_eq!((s, v["contexts"].as_array().map(Vec::len)), (200, Some(0)));
    // The runtime tier has no contexts at all.
    let rt = env.create(ALICE, json!({"tier": "runtime"})).await;
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{rt}/contexts"),
            ALICE,
            Some(json!({"lang": "javascript"})),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    assert!(v["fix"].as_str().unwrap().contains("container"), "{v}");
    env.server.shutdown().await;
}

// ---- volumes ------------------------------------------------------------------------------

/// Volumes are loop-mounted ext4 file systems: the host side needs root.
use cordon_testkit::root_or_skip;

fn volume_config(c: &mut Config) {
    c.pools.clear();
    c.tenants.insert(
        "alice".into(),
        cordon_engine::TenantRules {
            trust: Some(cordon_policy::Trust::Trusted),
            tiers: Some(Tier::ALL.to_vec()),
            max_volume_bytes: Some(cordon_server::config::Size(64 << 20)),
            max_volumes: Some(3),
            ..Default::default()
        },
    );
}

/// The error code of a refused call, with its status.
async fn refused(env: &Env, m: M, path: &str, key: &str, body: Option<Value>) -> (u16, String) {
    let (s, v) = env.call(m, path, key, body).await;
    (s, v["code"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_a_tenants_own_exclusive_when_written_counted_and_kept_across_restarts() {
    if !root_or_skip("volumes") {
        return;
    }
    let env = start_with(volume_config).await;
    let mk = |name: &str, size: &str| json!({"name": name, "size": size});
    let (s, v) = env
        .call(M::POST, "/v1/volumes", ALICE, Some(mk("data", "32M")))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["size"], 32 << 20);
    assert!(v["used"].as_u64().unwrap() < 32 << 20, "sparse: {v}");
    assert_eq!(
        refused(&env, M::POST, "/v1/volumes", ALICE, Some(mk("data", "16M"))).await,
        (409, "volume_exists".into())
    );
    // The tenant's ceiling counts its volumes' sizes: 32 + 40 MiB > 64 MiB.
    let (s, v) = env
        .call(M::POST, "/v1/volumes", ALICE, Some(mk("big", "40M")))
        .await;
    assert_eq!(
        (s, v["code"].as_str().unwrap()),
        (403, "volume_quota"),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("ceiling"), "{v}");
    for bad in [
        mk("../x", "16M"),
        mk("Data", "16M"),
        mk("a.b", "16M"),
        mk("small", "1M"),
    ] {
        assert_eq!(
            refused(&env, M::POST, "/v1/volumes", ALICE, Some(bad))
                .await
                .0,
            400
        );
    }
    let (s, list) = env.call(M::GET, "/v1/volumes", ALICE, None).await;
    assert_eq!(s, 200);
    assert_eq!(list["used_bytes"], 32 << 20, "{list}");
    assert_eq!(list["quota_bytes"], 64 << 20, "{list}");
    assert_eq!(list["volumes"].as_array().unwrap().len(), 1);

    // Another tenant never sees nor mounts it: 404 everywhere, and its own names are its own.
    let (s, v) = env.call(M::GET, "/v1/volumes", BOB, None).await;
    assert_eq!((s, v["volumes"].as_array().unwrap().len()), (200, 0), "{v}");
    for m in [M::GET, M::DELETE] {
        assert_eq!(
            refused(&env, m, "/v1/volumes/data", BOB, None).await,
            (404, "not_found".into())
        );
    }
    let with = |name: &str, path: &str, ro: bool| json!({"tier": "container", "volumes": [{"name": name, "path": path, "read_only": ro}]});
    assert_eq!(
        refused(
            &env,
            M::POST,
            "/v1/sandboxes",
            BOB,
            Some(with("data", "/work/d", true))
        )
        .await,
        (404, "not_found".into())
    );
    let (s, _) = env
        .call(M::POST, "/v1/volumes", BOB, Some(mk("data", "16M")))
        .await;
    assert_eq!(s, 201);

    // Read-write is one sandbox's alone: no second mount of any kind, no delete meanwhile.
    let writer = env.create(ALICE, with("data", "/work/data", false)).await;
    let (_, v) = env.call(M::GET, "/v1/volumes/data", ALICE, None).await;
    assert_eq!(v["mounts"][0]["sandbox"], writer.as_str(), "{v}");
    assert_eq!(v["mounts"][0]["read_only"], false);
    for ro in [false, true] {
        assert_eq!(
            refused(
                &env,
                M::POST,
                "/v1/sandboxes",
                ALICE,
                Some(with("data", "/work/d", ro))
            )
            .await,
            (409, "volume_in_use".into())
        );
    }
    assert_eq!(
        refused(&env, M::DELETE, "/v1/volumes/data", ALICE, None).await,
        (409, "volume_in_use".into())
    );
    // Mount points stay under /work, plain, and apart; only tiers with a kernel wall.
    for path in [
        "/etc",
        "/work",
        "/work/../etc",
        "/work/a/../../x",
        "data",
        "/tmp/x",
    ] {
        assert_eq!(
            refused(
                &env,
                M::POST,
                "/v1/sandboxes",
                ALICE,
                Some(with("data", path, true))
            )
            .await
            .0,
            400,
            "{path}"
        );
    }
    let (s, _) = env
        .call(M::POST, "/v1/volumes", ALICE, Some(mk("other", "16M")))
        .await;
    assert_eq!(s, 201);
    let nested = json!({"tier": "container", "volumes": [
        {"name": "data", "path": "/work/a", "read_only": true},
        {"name": "other", "path": "/work/a/b", "read_only": true}]});
    assert_eq!(
        refused(&env, M::POST, "/v1/sandboxes", ALICE, Some(nested))
            .await
            .0,
        400
    );
    let on_runtime = json!({"tier": "runtime", "volumes": [{"name": "data", "path": "/work/d"}]});
    assert_eq!(
        refused(&env, M::POST, "/v1/sandboxes", ALICE, Some(on_runtime)).await,
        (403, "policy_denied".into())
    );
    env.call(M::DELETE, &format!("/v1/sandboxes/{writer}"), ALICE, None)
        .await;
    let (_, v) = env.call(M::GET, "/v1/volumes/data", ALICE, None).await;
    assert_eq!(v["mounts"], json!([]), "{v}");
    // Read-only is many sandboxes'; a writer waits for them all.
    let r1 = env.create(ALICE, with("data", "/work/data", true)).await;
    let r2 = env.create(ALICE, with("data", "/work/in/data", true)).await;
    let (_, v) = env.call(M::GET, "/v1/volumes/data", ALICE, None).await;
    assert_eq!(v["mounts"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(
        refused(
            &env,
            M::POST,
            "/v1/sandboxes",
            ALICE,
            Some(with("data", "/work/d", false))
        )
        .await,
        (409, "volume_in_use".into())
    );
    for id in [&r1, &r2] {
        env.call(M::DELETE, &format!("/v1/sandboxes/{id}"), ALICE, None)
            .await;
    }
    for (kind, other) in [("volume_create", "deny"), ("volume_mount", "error")] {
        let (_, rows) = env
            .call(
                M::GET,
                &format!("/v1/audit?kind={kind}&limit=100"),
                ALICE,
                None,
            )
            .await;
        let decisions: Vec<&str> = rows["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["decision"].as_str().unwrap())
            .collect();
        assert!(
            decisions.contains(&"ok") && decisions.contains(&other),
            "{kind}: {decisions:?}"
        );
    }

    // A server that died holding a mount: its mount row and the host mount it left are
    // cleaned at the next start; the volumes and their contents stay.
    let data_dir = env._dir.path().to_path_buf();
    let cfg = {
        let mut c = config(&data_dir);
        volume_config(&mut c);
        c
    };
    env.server.shutdown().await;
    {
        let audit = cordon_server::audit::Audit::open(&data_dir.join("audit.db")).unwrap();
        audit
            .volumes_mounted("alice", "sb-dead", &[("data".into(), false)], &[])
            .unwrap();
    }
    let image = data_dir
        .join("volumes/images")
        .join(hex::encode("alice"))
        .join("data.img");
    let stale = data_dir.join("volumes/mnt/stale");
    std::fs::create_dir_all(&stale).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&image)
        .arg(&stale)
        .status()
        .unwrap();
    assert!(st.success());
    let server = Server::start(cfg, backends(&env.counters), None)
        .await
        .unwrap();
    let base = format!("http://{}", server.addr());
    let env = Env {
        server,
        counters: env.counters,
        http: env.http,
        base,
        _dir: env._dir,
    };
    assert!(!stale.exists(), "the stale host mount was removed");
    let (_, list) = env.call(M::GET, "/v1/volumes", ALICE, None).await;
    let names: Vec<&str> = list["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data", "other"], "{list}");
    assert_eq!(list["volumes"][0]["mounts"], json!([]), "{list}");
    let writer = env.create(ALICE, with("data", "/work/data", false)).await;
    env.call(M::DELETE, &format!("/v1/sandboxes/{writer}"), ALICE, None)
        .await;
    let (s, v) = env.call(M::DELETE, "/v1/volumes/data", ALICE, None).await;
    assert_eq!(s, 200, "{v}");
    assert!(!image.exists());
    let (_, list) = env.call(M::GET, "/v1/volumes", ALICE, None).await;
    assert_eq!(list["used_bytes"], 16 << 20, "{list}");
    let (_, deletes) = env
        .call(M::GET, "/v1/audit?kind=volume_delete", ALICE, None)
        .await;
    let decisions: Vec<&str> = deletes["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions.iter().filter(|d| **d == "ok").count(),
        1,
        "{decisions:?}"
    );
    env.server.shutdown().await;
}

/// A download that has reached its client has let go of the sandbox: the next call, sent
/// the moment the body ended, is served and never refused as busy. (The worker used to
/// send the stream's end before it cleared the busy flag; a quick client then got 409.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_download_has_freed_the_sandbox() {
    use cordon_testkit::files::{TarEntry, tarball};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = start().await;
    let id = env.create(ALICE, json!({"tier": "container"})).await;
    let tar = tarball(&[TarEntry::file("a.txt", b"alpha")]);
    let r = env
        .req(
            M::PUT,
            &format!("/v1/sandboxes/{id}/archive?path=/work"),
            ALICE,
        )
        .header("content-type", "application/x-tar")
        .body(tar)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Threads that keep both cores busy make the scheduler preempt the server's worker
    // at any point, as a loaded host does; the window between the two steps then opens.
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    // The download and the next call are pipelined on one connection: the server reads
    // the second the moment it has written the first's last byte.
    let addr = env.base.trim_start_matches("http://").to_string();
    let mut refused = Vec::new();
    for round in 0..300 {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let two = format!(
            "GET /v1/sandboxes/{id}/archive?path=/work HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {ALICE}\r\n\r\n\
             GET /v1/sandboxes/{id}/files/stat?path=/work/a.txt HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {ALICE}\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(two.as_bytes()).await.unwrap();
        let mut resp = Vec::new();
        conn.read_to_end(&mut resp).await.unwrap();
        let text = String::from_utf8_lossy(&resp);
        let statuses: Vec<&str> = text
            .match_indices("HTTP/1.1 ")
            .map(|(i, _)| &text[i + 9..i + 12])
            .collect();
        if statuses != ["200", "200"] {
            refused.push(format!("round {round}: {statuses:?}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
    assert!(refused.is_empty(), "{refused:?}");
}

/// A tenant at its limit that runs one-shot runs one after another is never refused: a
/// run's sandbox is torn down after its answer, and the next run waits for that teardown
/// instead of answering 429 (a sequential client never holds two sandboxes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_one_shot_runs_at_the_limit_wait_for_the_last_teardown() {
    let env = start_with(|c| {
        c.sessions.max_sandboxes_per_tenant = 1;
    })
    .await;
    // A teardown as slow as a gVisor sandbox's stop.
    env.counters.destroy_delay_ms.store(150, Ordering::SeqCst);
    for round in 0..4 {
        let (s, v) = env
            .call(
                M::POST,
                "/v1/run",
                ALICE,
                Some(json!({"argv": ["echo", "x"]})),
            )
            .await;
        assert_eq!(s, 200, "round {round}: {v}");
    }
    // A sandbox the tenant holds is refused for: only teardowns are waited for.
    let held = env.create(ALICE, json!({})).await;
    let run = || async {
        env.call(
            M::POST,
            "/v1/run",
            ALICE,
            Some(json!({"argv": ["echo", "x"]})),
        )
        .await
    };
    let (s, v) = run().await;
    assert_eq!(
        (s, v["code"].as_str()),
        (429, Some("too_many_sandboxes")),
        "{v}"
    );
    // A delete answers once its teardown is done: the place is free at once.
    let (s, _) = env
        .call(M::DELETE, &format!("/v1/sandboxes/{held}"), ALICE, None)
        .await;
    assert_eq!(s, 200);
    let (s, v) = run().await;
    assert_eq!(s, 200, "{v}");
}

/// A run waiting for a teardown's place ends when the server begins to stop: it is
/// answered `shutting_down`, and no sandbox is made after the shutdown began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_a_teardown_ends_with_the_server() {
    let env = start_with(|c| {
        c.sessions.max_sandboxes_per_tenant = 1;
    })
    .await;
    env.counters.destroy_delay_ms.store(1500, Ordering::SeqCst);
    let run = json!({"argv": ["echo", "x"]});
    let (s, v) = env.call(M::POST, "/v1/run", ALICE, Some(run.clone())).await;
    assert_eq!(s, 200, "{v}");
    let waiting = env.req(M::POST, "/v1/run", ALICE).json(&run).send();
    let svc = env.server.service().clone();
    let stop = async {
        // The second run is waiting for the first's teardown by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        svc.shutdown().await;
    };
    let (r, ()) = tokio::join!(waiting, stop);
    let v: Value = r.unwrap().json().await.unwrap();
    assert_eq!(v["code"], "shutting_down", "{v}");
    // Whatever was made was torn down: nothing was made behind the shutdown's back.
    let c = &env.counters;
    assert_eq!(
        c.created.load(Ordering::SeqCst),
        c.destroyed.load(Ordering::SeqCst)
    );
}

/// A sandbox its TTL paused (`on_timeout: pause`) is live once a resume answers, with its
/// TTL whole again. The resume gave the TTL again only after its audit row was written, and
/// a reaper round in between paused it again with the old TTL: the next call met
/// `sandbox_paused` (the Python SDK's test did, on a slow CI machine). Here the audit store
/// is held by another writer while the resume writes its row, so the reaper runs several
/// rounds in that gap.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_after_a_timeouts_pause_is_not_paused_again_by_the_old_ttl() {
    let env = start_with(|c| c.pools.clear()).await;
    let id = env
        .create(
            ALICE,
            json!({"tier": "container", "ttl": "1s", "on_timeout": "pause"}),
        )
        .await;
    let get = format!("/v1/sandboxes/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while env.call(M::GET, &get, ALICE, None).await.1["state"] != "paused" {
        assert!(
            std::time::Instant::now() < deadline,
            "not paused at its TTL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let db = rusqlite::Connection::open(env._dir.path().join("audit.db")).unwrap();
    db.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let path = format!("/v1/sandboxes/{id}/resume");
    let resume = env.call(M::POST, &path, ALICE, None);
    let hold = async {
        // The reaper runs every 50 ms here.
        tokio::time::sleep(Duration::from_millis(400)).await;
        db.execute_batch("COMMIT").unwrap();
    };
    let ((s, v), ()) = tokio::join!(resume, hold);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "live", "{v}");
    let (s, v) = env.call(M::GET, &get, ALICE, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "live", "paused again behind the resume: {v}");
    env.server.shutdown().await;
}

/// Pausing to disk writes the sandbox's whole state into the server's data dir: it is held
/// to the tenant's `max_paused_bytes` (each pause counted at its memory and disk limits
/// until saved, then at what it took, other tenants unaffected) and to the room on disk.
/// Before, any number of a tenant's sandboxes could be paused to disk until the disk was
/// full.
#[tokio::test(flavor = "multi_thread")]
async fn pausing_to_disk_is_held_to_the_tenants_budget_and_the_room_on_disk() {
    let limits = json!({"memory_bytes": 64u64 << 20, "disk_bytes": 32u64 << 20});
    let env = start_with(|c| {
        c.pools.clear();
        c.tenant_defaults.max_paused_bytes = Some(cordon_server::config::Size(120 << 20));
    })
    .await;
    let mut ids = Vec::new();
    for key in [ALICE, ALICE, BOB] {
        let (s, v) = env
            .call(
                M::POST,
                "/v1/sandboxes",
                key,
                Some(json!({"tier": "container", "limits": limits})),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let path = |i: usize| format!("/v1/sandboxes/{}/pause", ids[i]);
    let (s, v) = env
        .call(M::POST, &path(0), ALICE, Some(json!({"to_disk": true})))
        .await;
    assert_eq!(s, 200, "{v}");
    // 32 MiB held + 96 MiB > 120 MiB.
    let (s, v) = env
        .call(M::POST, &path(1), ALICE, Some(json!({"to_disk": true})))
        .await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["code"], "paused_quota", "{v}");
    assert!(v["message"].as_str().unwrap().contains("32 MiB"), "{v}");
    // Another tenant's budget is its own.
    let (s, v) = env
        .call(M::POST, &path(2), BOB, Some(json!({"to_disk": true})))
        .await;
    assert_eq!(s, 200, "{v}");
    // Resuming the first gives its room back.
    let resume = format!("/v1/sandboxes/{}/resume", ids[0]);
    let (s, v) = env.call(M::POST, &resume, ALICE, None).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = env
        .call(M::POST, &path(1), ALICE, Some(json!({"to_disk": true})))
        .await;
    assert_eq!(s, 200, "{v}");
    env.server.shutdown().await;
}

/// A pause to disk whose state could not fit in the data dir's file system (keeping
/// `audit.min_free_disk` free) is refused up front with storage_low, naming no host path.
#[tokio::test(flavor = "multi_thread")]
async fn pausing_to_disk_needs_room_on_the_data_dirs_file_system() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("CORDON_REQUIRE_ALL").is_none_or(|v| v != "1"),
            "mounting a small file system needs root and CORDON_REQUIRE_ALL=1"
        );
        eprintln!("SKIPPING pausing_to_disk_needs_room_on_the_data_dirs_file_system: not root");
        return;
    }
    let small = tempfile::tempdir().unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        small.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m"),
    )
    .unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(small.path().to_path_buf());
    let data = small.path().join("data");
    let env = start_with(|c| {
        c.pools.clear();
        c.data_dir = data.clone();
        c.audit.min_free_disk = cordon_server::config::Size(1 << 20);
    })
    .await;
    let create = |mib: u64| {
        json!({"tier": "container",
               "limits": {"memory_bytes": mib << 20, "disk_bytes": 8u64 << 20}})
    };
    let (s, v) = env
        .call(M::POST, "/v1/sandboxes", ALICE, Some(create(128)))
        .await;
    assert_eq!(s, 201, "{v}");
    let big = v["id"].as_str().unwrap().to_string();
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{big}/pause"),
            ALICE,
            Some(json!({"to_disk": true})),
        )
        .await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["code"], "storage_low", "{v}");
    assert!(
        !v.to_string().contains(small.path().to_str().unwrap()),
        "{v}"
    );
    let (s, v) = env
        .call(M::POST, "/v1/sandboxes", ALICE, Some(create(16)))
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, v) = env
        .call(
            M::POST,
            &format!("/v1/sandboxes/{id}/pause"),
            ALICE,
            Some(json!({"to_disk": true})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    env.server.shutdown().await;
}

/// Issue 44: by default a tenant's memory share was the whole server budget, so one
/// tenant's idle sandboxes refused every other tenant's create. Without a budget of its
/// own a tenant stops at its default share (a quarter here) and the other still creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_sandboxes_leave_memory_for_the_others() {
    let env = start_with(|c| {
        c.budgets.max_memory = Some(cordon_server::config::Size(4 << 30));
        c.pools.clear();
    })
    .await;
    let mut held = 0;
    let refusal = loop {
        let (s, v) = env
            .call(
                M::POST,
                "/v1/sandboxes",
                ALICE,
                Some(json!({"tier": "container", "limits": {"memory_bytes": 256u64 << 20}})),
            )
            .await;
        if s != 201 {
            break v;
        }
        held += 1;
        assert!(held <= 16, "alice took {held} sandboxes");
    };
    println!("alice holds {held} sandboxes of 256 MiB: {refusal}");
    assert_eq!(refusal["code"], "too_many_sandboxes", "{refusal}");
    assert!(
        refusal["message"].as_str().unwrap().contains("your budget"),
        "{refusal}"
    );
    for _ in 0..3 {
        let (s, v) = env
            .call(
                M::POST,
                "/v1/sandboxes",
                BOB,
                Some(json!({"tier": "container", "limits": {"memory_bytes": 256u64 << 20}})),
            )
            .await;
        assert_eq!(s, 201, "bob was refused beside alice's sandboxes: {v}");
    }
    env.server.shutdown().await;
}

/// Issue 44: 40 event streams of one tenant pushed another's run from 0.2 s to 12-20 s.
/// A tenant holds at most `audit.max_event_streams_per_tenant` streams (429 resource_busy
/// past it, a place given back when one closes), and the other tenant's stream opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_capped_per_tenant() {
    let env = start_with(|c| c.audit.max_event_streams_per_tenant = 2).await;
    let open = |key: &'static str| {
        env.req(M::GET, "/v1/events", key)
            .header("accept", "text/event-stream")
            .send()
    };
    let a1 = open(ALICE).await.unwrap();
    let a2 = open(ALICE).await.unwrap();
    assert_eq!((a1.status().as_u16(), a2.status().as_u16()), (200, 200));
    let a3 = open(ALICE).await.unwrap();
    assert_eq!(a3.status(), 429);
    let v: Value = a3.json().await.unwrap();
    assert_eq!(v["code"], "resource_busy", "{v}");
    let b = open(BOB).await.unwrap();
    assert_eq!(b.status(), 200, "bob's stream was refused");
    drop(a1);
    // The place comes back once the server sees the stream closed (bounded wait).
    let mut reopened = None;
    for _ in 0..100 {
        let r = open(ALICE).await.unwrap();
        if r.status() == 200 {
            reopened = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "a closed stream's place never came back"
    );
    drop((a2, b, reopened));
    env.server.shutdown().await;
}

/// Issue 44: audit queries walked the whole store on its one connection, so another
/// tenant's run waited behind them. With 200,000 rows of alice's, eight of her filtered
/// queries at once leave bob's runs served (each query reads only its rows, on a
/// connection of its own); a query past her cap of concurrent reads is 429 resource_busy.
/// The figures are printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_queries_of_one_tenant_do_not_hold_up_another() {
    let env = start_with(|c| c.pools.clear()).await;
    let audit = env.server.service().audit().clone();
    tokio::task::spawn_blocking(move || {
        for _ in 0..20 {
            let rows: Vec<cordon_server::audit::NewEvent<'_>> = (0..10_000)
                .map(|_| cordon_server::audit::NewEvent {
                    tenant: Some("alice"),
                    sandbox: None,
                    tier: None,
                    event: cordon_server::audit::AuditEvent::ResumeFailed {
                        error: "x".repeat(200),
                    },
                })
                .collect();
            audit.record_all(&rows).unwrap();
        }
    })
    .await
    .unwrap();
    let run = |key: &'static str| {
        env.call(
            M::POST,
            "/v1/run",
            key,
            Some(json!({"tier": "container", "argv": ["echo", "hi"]})),
        )
    };
    let mut base = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let (s, o) = run(BOB).await;
        assert_eq!(s, 200, "{o}");
        base.push(t.elapsed());
    }
    let queries: Vec<_> = (0..8)
        .map(|i| {
            let (http, base) = (env.http.clone(), env.base.clone());
            tokio::spawn(async move {
                let kind = if i % 2 == 0 { "exec" } else { "create" };
                let r = http
                    .get(format!("{base}/v1/audit?kind={kind}&since_ms=1&limit=1000"))
                    .bearer_auth(ALICE)
                    .send()
                    .await
                    .unwrap();
                r.status().as_u16()
            })
        })
        .collect();
    let mut loaded = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let (s, o) = run(BOB).await;
        assert_eq!(s, 200, "bob's run failed beside alice's queries: {o}");
        loaded.push(t.elapsed());
    }
    let mut codes = Vec::new();
    for q in queries {
        codes.push(q.await.unwrap());
    }
    println!(
        "bob's run: {base:?} alone, {loaded:?} beside 8 of alice's queries; their codes {codes:?}"
    );
    assert!(codes.iter().all(|c| *c == 200 || *c == 429), "{codes:?}");
    env.server.shutdown().await;
}

/// Issue 44: the E2B listener dropped a refused request's connection (its body unread)
/// without `Connection: close`, so an SDK's pool sent its next call on a dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_listener_says_close_on_a_refused_body() {
    let env = start_with(|c| {
        c.e2b = Some(cordon_server::config::E2bConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Default::default()
        })
    })
    .await;
    let at = env.server.e2b_addr().unwrap();
    let r = env
        .http
        .post(format!("http://{at}/sandboxes"))
        .header("x-api-key", "not-a-key")
        .json(&json!({"templateID": "base", "pad": "x".repeat(4096)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers().get("connection").and_then(|v| v.to_str().ok()),
        Some("close"),
        "{:?}",
        r.headers()
    );
    env.server.shutdown().await;
}

/// Issue 44: no listener capped connections or closed idle and slow ones: 20,000 idle
/// keyless connections took every descriptor. Past the cap from one address a new
/// connection closes an idle one of that address (one that never sent a request first);
/// a connection with nothing under way is closed after `edge.idle_timeout`, as is one
/// sending its head slowly; a client with a request to send always gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_capped_and_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = start_with(|c| {
        c.edge.max_connections_per_source = 16;
        c.edge.max_connections = 64;
        c.edge.idle_timeout = Dur(Duration::from_secs(1));
    })
    .await;
    let addr = env.server.addr();
    // 200 idle connections from loopback, more than the per-source and listener caps.
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // bob's calls still go through, from the same address.
    for _ in 0..5 {
        let (s, v) = env.call(M::GET, "/v1/sandboxes", BOB, None).await;
        assert_eq!(s, 200, "bob was shut out by idle connections: {v}");
    }
    // The server closed idle connections to make room: at most the cap stay open.
    let mut open = 0;
    for c in &mut idle {
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(20), c.read(&mut b)).await {
            Err(_) => open += 1,
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => panic!("an idle connection got bytes"),
        }
    }
    println!("{open} of 200 idle connections still open");
    assert!(
        open <= 16,
        "{open} idle connections from one address stay open"
    );
    // A slow head and an idle connection are closed past the idle timeout.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /v1/health HTTP/1.1\r\n")
        .await
        .unwrap();
    let quiet = tokio::net::TcpStream::connect(addr).await.unwrap();
    for (name, mut c) in [("slow", slow), ("idle", quiet)] {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                // The slow client sends a byte of its head every 200 ms.
                if name == "slow" {
                    let _ = c.write_all(b"X").await;
                }
                let mut b = [0u8; 512];
                match tokio::time::timeout(Duration::from_millis(200), c.read(&mut b)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return,
                    Ok(Ok(n)) => buf.extend_from_slice(&b[..n]),
                    Err(_) => {}
                }
            }
        })
        .await;
        assert!(r.is_ok(), "the {name} connection was never closed");
        println!("{name}: closed after {:?}", String::from_utf8_lossy(&buf));
    }
    drop(idle);
    env.server.shutdown().await;
}
