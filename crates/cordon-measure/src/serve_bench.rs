//! `cordon serve --bench`: API round trips on loopback, warm (from the pool) against cold,
//! per tier, with the server in this process and a plain keep-alive HTTP/1.1 client. Each
//! tier gets a server of its own whose only pool is that tier's, so no other tier's idle
//! sandboxes (a VM, a user-space kernel) run beside the one measured.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cordon_core::Tier;
use cordon_server::{Config, Server};

use crate::Tiers;

pub(crate) struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    key: String,
    addr: std::net::SocketAddr,
    /// The last answer said `Connection: close` (a refusal of a request with a body does):
    /// the next request goes on a new connection.
    closed: bool,
}

impl Client {
    pub(crate) fn connect(addr: std::net::SocketAddr, key: &str) -> Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
            key: key.to_string(),
            addr,
            closed: false,
        })
    }

    pub(crate) fn post(&mut self, path: &str, body: &str) -> Result<(u16, String)> {
        self.send("POST", path, body)
    }

    pub(crate) fn send(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        // One write per request, as a real client sends it (no Nagle: each write would be
        // a packet of its own).
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            self.key,
            body.len()
        );
        if self.closed {
            *self = Client::connect(self.addr, &self.key)?;
        }
        self.writer.write_all(request.as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("bad status line")?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse()?;
            } else if let Some(v) = lower.strip_prefix("connection:") {
                self.closed = v.trim() == "close";
            }
        }
        let mut buf = vec![0u8; len];
        self.reader.read_exact(&mut buf)?;
        Ok((status, String::from_utf8_lossy(&buf).into_owned()))
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// What `true` is in each tier.
fn trivial(tier: Tier) -> &'static str {
    if tier.features().programs {
        r#""argv":["true"]"#
    } else {
        r#""lang":"javascript","code":"0""#
    }
}

/// `cordon serve --bench`: `iterations` round trips of each kind per tier of `tiers` (only
/// those in `only`, when it names any).
pub fn bench(iterations: usize, only: &[Tier], tiers: &Tiers) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "API round trips on loopback ({iterations} iterations each, at most 10 for gvisor and microvm; medians; server in this process, one per tier)"
    );
    println!(
        "{:<10} {:>14} {:>14} {:>8} {:>16} {:>16}",
        "tier", "run warm", "run cold", "cold/warm", "exec in sandbox", "of it, the exec"
    );
    let mut measured = Vec::new();
    for tier in Tier::ALL {
        if !only.is_empty() && !only.contains(&tier) {
            continue;
        }
        match bench_tier(&rt, tiers, tier, iterations)? {
            Some(m) => {
                println!(
                    "{:<10} {:>14} {:>14} {:>7.1}x {:>16} {:>16}",
                    tier.as_str(),
                    ms(m.warm),
                    ms(m.cold),
                    ratio(m.cold, m.warm),
                    ms(m.exec),
                    ms(m.exec_inside)
                );
                measured.push((tier, m));
            }
            None => println!(
                "{:<10} unavailable here (see `cordon doctor`)",
                tier.as_str()
            ),
        }
    }
    println!(
        "run warm = POST /v1/run served from the warm pool (take + exec; the destroy runs after the response); run cold = \
         the same with a spec the pool does not hold; exec in sandbox = POST /v1/sandboxes/ID/exec, back to back; \
         of it, the exec = the backend's own exec time in those calls (the outcome's timings.run_us), the rest being the API"
    );
    // Where a warm run goes, for the tiers whose sandbox measures its program's own time.
    let split: Vec<_> = measured
        .iter()
        .filter(|(_, m)| !m.warm_program.is_zero())
        .collect();
    if !split.is_empty() {
        println!();
        println!(
            "{:<10} {:>10} {:>14} {:>12} {:>14} {:>22}",
            "tier", "run warm", "backend exec", "program", "create (cold)", "cold/warm if only the"
        );
        println!("{:>87}", "program cost anything");
        for (tier, m) in split {
            println!(
                "{:<10} {:>10} {:>14} {:>12} {:>14} {:>21.1}x",
                tier.as_str(),
                ms(m.warm),
                ms(m.warm_backend),
                ms(m.warm_program),
                ms(m.cold_create),
                ratio(m.cold_create + m.warm_program, m.warm_program)
            );
        }
        println!(
            "medians of the warm runs' timings.run_us and timings.program_us (the program's own time, from its hand-off \
             to its exit, measured in the sandbox) and the cold runs' timings.start_us; the last column is the ratio a \
             warm run would reach if HTTP, audit and every hop of the exec cost nothing"
        );
    }
    Ok(0)
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

/// Medians of one tier's round trips.
struct Medians {
    warm: Duration,
    cold: Duration,
    exec: Duration,
    /// The backend's own time in the exec calls, as their outcomes report it.
    exec_inside: Duration,
    /// The warm runs' backend exec time and, of it, the program's own.
    warm_backend: Duration,
    warm_program: Duration,
    /// The cold runs' create time.
    cold_create: Duration,
}

/// One of the outcome's `timings` in a response body.
fn timing(body: &str, which: fn(&cordon_core::Timings) -> u64) -> Result<Duration> {
    let outcome: cordon_core::ExecOutcome = serde_json::from_str(body)
        .with_context(|| format!("the response is not an exec outcome: {body}"))?;
    Ok(Duration::from_micros(which(&outcome.timings)))
}

/// The part of a created sandbox's description this bench needs.
#[derive(serde::Deserialize)]
struct Created {
    id: String,
}

/// A server on a free loopback port with data under `dir`, and the key of its one tenant,
/// `bench`, of this run's own, which may use every tier by name.
pub(crate) fn bench_config(dir: &std::path::Path) -> Result<(Config, String)> {
    let mut cfg = Config::with_data_dir(dir);
    cfg.bind = "127.0.0.1:0".parse()?;
    let key = cordon_server::keys::generate_key()?;
    cfg.keys = vec![cordon_server::config::KeyEntry {
        tenant: "bench".into(),
        key: Some(key.clone()),
        sha256: None,
    }];
    cfg.tenants.insert(
        "bench".into(),
        cordon_engine::TenantRules {
            trust: Some(cordon_policy::Trust::Trusted),
            tiers: Some(Tier::ALL.to_vec()),
            ..Default::default()
        },
    );
    Ok((cfg, key))
}

/// Medians of warm run, cold run and exec for one tier, with a server whose only pool is
/// this tier's; `None` when the tier is unavailable here.
fn bench_tier(
    rt: &tokio::runtime::Runtime,
    tiers: &Tiers,
    tier: Tier,
    iterations: usize,
) -> Result<Option<Medians>> {
    let dir =
        std::env::temp_dir().join(format!("cordon-serve-bench-{}-{tier}", std::process::id()));
    let (mut cfg, key) = bench_config(&dir)?;
    cfg.pools.insert(tier, 2);
    let backends = tiers.server_backends(&dir);
    let server = rt.block_on(Server::start(cfg, backends, None))?;
    let result = measure(&server, tier, iterations, &key);
    rt.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(server: &Server, tier: Tier, iterations: usize, key: &str) -> Result<Option<Medians>> {
    let svc = server.service().clone();
    if !svc.probes().get(&tier).is_some_and(|p| p.available()) {
        return Ok(None);
    }
    let mut c = Client::connect(server.addr(), key)?;
    let warm_body = format!(r#"{{"tier":"{tier}",{}}}"#, trivial(tier));
    // The pool's spec is the default one; any other limit makes the sandbox start cold.
    let cold_body = format!(
        r#"{{"tier":"{tier}","limits":{{"open_files":1000}},{}}}"#,
        trivial(tier)
    );
    let (s, b) = c.post("/v1/run", &warm_body)?;
    if s != 200 {
        bail!("{tier}: warm-up run failed ({s}): {b}");
    }
    // A kernel of its own costs a start of hundreds of milliseconds: fewer rounds.
    let rounds = if tier.features().own_kernel {
        iterations.min(10)
    } else {
        iterations
    };
    let (mut warm, mut cold, mut exec, mut inside) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut warm_backend, mut warm_program, mut cold_create) =
        (Vec::new(), Vec::new(), Vec::new());
    // Every measured request starts from the same state: the pool full, no teardown of an
    // earlier run's sandbox under way, and a short pause. Otherwise a cold run sent right
    // after a warm one would share the CPUs with that sandbox's teardown, and a warm run
    // sent the moment its pool is refilled would find the CPUs busy or just gone idle.
    let settle = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while (svc.pools().ready(tier) < 2 || svc.destroys_in_flight() > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    for _ in 0..rounds {
        settle();
        let t = Instant::now();
        let (s, b) = c.post("/v1/run", &warm_body)?;
        warm.push(t.elapsed());
        if s != 200 || !b.contains("\"source\"") && !b.contains("\"exited\"") {
            bail!("{tier}: warm run failed ({s}): {b}");
        }
        warm_backend.push(timing(&b, |t| t.run_us)?);
        warm_program.push(timing(&b, |t| t.program_us)?);
        settle();
        let t = Instant::now();
        let (s, b) = c.post("/v1/run", &cold_body)?;
        cold.push(t.elapsed());
        if s != 200 {
            bail!("{tier}: cold run failed ({s}): {b}");
        }
        cold_create.push(timing(&b, |t| t.start_us)?);
    }
    let (s, b) = c.post("/v1/sandboxes", &format!(r#"{{"tier":"{tier}"}}"#))?;
    if s != 201 {
        bail!("{tier}: create failed ({s}): {b}");
    }
    let id = serde_json::from_str::<Created>(&b)
        .with_context(|| format!("the create response has no id: {b}"))?
        .id;
    let exec_body = format!("{{{}}}", trivial(tier));
    for _ in 0..rounds {
        let t = Instant::now();
        let (s, b) = c.post(&format!("/v1/sandboxes/{id}/exec"), &exec_body)?;
        exec.push(t.elapsed());
        if s != 200 {
            bail!("{tier}: exec failed ({s}): {b}");
        }
        inside.push(timing(&b, |t| t.run_us)?);
    }
    Ok(Some(Medians {
        warm: median(warm),
        cold: median(cold),
        exec: median(exec),
        exec_inside: median(inside),
        warm_backend: median(warm_backend),
        warm_program: median(warm_program),
        cold_create: median(cold_create),
    }))
}
