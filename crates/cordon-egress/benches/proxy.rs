//! Added latency per request and throughput, proxy versus direct, on loopback, in one run:
//! plain HTTP (forward proxy) and TLS terminated by the proxy (granted host, placeholder
//! swapped, response scanned). Prints a summary table, then runs criterion groups.
//!
//! `cargo bench -p cordon-egress --bench proxy` (add `-- --quick-summary` for the table only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_core::{EgressPolicy, Grant, GrantSecret};
use cordon_egress::{
    EgressLimits, EgressProxy, ProxyConfig, ProxyHandle, StaticResolver, UpstreamRoots,
};
use criterion::{Criterion, Throughput};
use support::*;

const PLAIN_HOST: &str = "plain.bench.test";
const TLS_HOST: &str = "tls.bench.test";

struct Bench {
    _proxy: ProxyHandle,
    proxy: SocketAddr,
    plain: SocketAddr,
    tls: SocketAddr,
    test_ca: String,
    proxy_ca: String,
    bearer: String,
    _dir: tempfile::TempDir,
}

async fn setup() -> Bench {
    let ca = TestCa::new();
    let plain = http_upstream().await;
    let tls = https_upstream(&ca, &[TLS_HOST]).await;
    let resolver = StaticResolver::new();
    resolver.set(PLAIN_HOST, &["127.0.0.1".parse().unwrap()]);
    resolver.set(TLS_HOST, &["127.0.0.1".parse().unwrap()]);
    let mut cfg = ProxyConfig::new("bench");
    cfg.policy = EgressPolicy {
        allow: cordon_core::egress::parse_patterns(&[
            format!("{PLAIN_HOST}:{}", plain.addr.port()),
            format!("{TLS_HOST}:{}", tls.addr.port()),
            "127.0.0.1/32:*".into(),
        ])
        .unwrap(),
        deny: vec![],
    };
    cfg.grants = vec![Grant {
        name: "bench".into(),
        env_var: "BENCH_TOKEN".into(),
        secret: GrantSecret::value("bench-real-secret-value"),
        hosts: vec![TLS_HOST.parse().unwrap()],
        header: "authorization".into(),
        methods: vec![],
        path_prefixes: vec![],
    }];
    cfg.limits = EgressLimits {
        max_bytes_up: u64::MAX,
        max_bytes_down: u64::MAX,
        requests_per_second: 1e12,
        request_burst: u32::MAX,
        ..Default::default()
    };
    cfg.tcp_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.resolver = Some(Arc::new(resolver));
    cfg.upstream_roots = UpstreamRoots {
        system: false,
        extra_pem: vec![ca.pem.clone()],
    };
    let proxy = EgressProxy::start(cfg, &tokio::runtime::Handle::current()).unwrap();
    let bearer = format!("Bearer {}", proxy.placeholders()[0].1);
    Bench {
        proxy: proxy.tcp_addr().unwrap(),
        proxy_ca: proxy.ca_cert_pem().to_string(),
        _proxy: proxy,
        plain: plain.addr,
        tls: tls.addr,
        test_ca: ca.pem.clone(),
        bearer,
        _dir: tempfile::tempdir().unwrap(),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    DirectHttp,
    ProxyHttp,
    DirectTls,
    ProxyTls,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::DirectHttp => "direct http",
            Path::ProxyHttp => "proxy http",
            Path::DirectTls => "direct https",
            Path::ProxyTls => "proxy https (terminated, swapped)",
        }
    }
}

/// A keep-alive client for one path, and the request target + headers it sends.
async fn client(b: &Bench, p: Path) -> (TlsSender, String, Vec<(String, String)>) {
    let plain_auth = format!("{PLAIN_HOST}:{}", b.plain.port());
    let tls_auth = format!("{TLS_HOST}:{}", b.tls.port());
    match p {
        Path::DirectHttp => (
            direct_client(b.plain).await,
            String::new(),
            vec![("host".into(), plain_auth)],
        ),
        Path::ProxyHttp => (
            proxy_client(b.proxy).await,
            format!("http://{plain_auth}"),
            vec![],
        ),
        Path::DirectTls => (
            direct_tls_client(b.tls, TLS_HOST, &b.test_ca).await,
            String::new(),
            vec![("host".into(), tls_auth)],
        ),
        Path::ProxyTls => (
            https_client(b.proxy, &tls_auth, TLS_HOST, &b.proxy_ca)
                .await
                .unwrap(),
            String::new(),
            vec![
                ("host".into(), tls_auth),
                ("authorization".into(), b.bearer.clone()),
            ],
        ),
    }
}

async fn one(c: &mut TlsSender, prefix: &str, headers: &[(String, String)], path: &str) -> usize {
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let got = send(c, "GET", &format!("{prefix}{path}"), &h, vec![])
        .await
        .unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    got.body.len()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((s.len() as f64 - 1.0) * p) as usize]
}

async fn latencies(b: &Bench, p: Path, n: usize) -> Vec<f64> {
    let (mut c, prefix, headers) = client(b, p).await;
    for _ in 0..50 {
        one(&mut c, &prefix, &headers, "/small").await;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        one(&mut c, &prefix, &headers, "/small").await;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

async fn throughput(b: &Bench, p: Path, bytes: usize, reps: usize) -> f64 {
    let (mut c, prefix, headers) = client(b, p).await;
    one(&mut c, &prefix, &headers, &format!("/big?n={bytes}")).await;
    let mut rates = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let n = one(&mut c, &prefix, &headers, &format!("/big?n={bytes}")).await;
        assert_eq!(n, bytes);
        rates.push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    median(&mut rates)
}

fn summary(rt: &tokio::runtime::Runtime, b: &Bench, quick: bool) {
    let (n, bytes, reps) = if quick {
        (200, 4 << 20, 3)
    } else {
        (3000, 64 << 20, 7)
    };
    println!(
        "\n== cordon-egress: proxy vs direct on loopback ({n} sequential keep-alive requests; {} MiB downloads x{reps}) ==",
        bytes >> 20
    );
    println!(
        "{:<36} {:>10} {:>10} {:>10}",
        "path", "p50 us", "p90 us", "p99 us"
    );
    let mut med = std::collections::HashMap::new();
    for p in [
        Path::DirectHttp,
        Path::ProxyHttp,
        Path::DirectTls,
        Path::ProxyTls,
    ] {
        let mut l = rt.block_on(latencies(b, p, n));
        let m = median(&mut l);
        println!(
            "{:<36} {:>10.1} {:>10.1} {:>10.1}",
            p.name(),
            m,
            pct(&l, 0.9),
            pct(&l, 0.99)
        );
        med.insert(p.name(), m);
    }
    let added_http = med["proxy http"] - med["direct http"];
    let added_tls = med["proxy https (terminated, swapped)"] - med["direct https"];
    println!(
        "added latency, median: plain HTTP {added_http:.1} us, TLS-terminated {added_tls:.1} us (target <= 1000 us)"
    );
    println!("{:<36} {:>10}", "download throughput", "MB/s");
    let mut tp = std::collections::HashMap::new();
    for p in [
        Path::DirectHttp,
        Path::ProxyHttp,
        Path::DirectTls,
        Path::ProxyTls,
    ] {
        let r = rt.block_on(throughput(b, p, bytes, reps));
        println!("{:<36} {:>10.0}", p.name(), r);
        tp.insert(p.name(), r);
    }
    println!(
        "proxy/direct throughput: plain HTTP {:.0}%, TLS-terminated {:.0}% (target >= 50%)\n",
        100.0 * tp["proxy http"] / tp["direct http"],
        100.0 * tp["proxy https (terminated, swapped)"] / tp["direct https"]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|a| a == "--bench");
    let quick = !bench_mode || args.iter().any(|a| a == "--quick-summary");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let b = rt.block_on(setup());
    summary(&rt, &b, quick);
    if quick {
        return;
    }
    let mut c = Criterion::default()
        .sample_size(50)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    let mut g = c.benchmark_group("request");
    for p in [
        Path::DirectHttp,
        Path::ProxyHttp,
        Path::DirectTls,
        Path::ProxyTls,
    ] {
        let (mut cl, prefix, headers) = rt.block_on(client(&b, p));
        g.bench_function(p.name(), |bch| {
            bch.iter(|| rt.block_on(one(&mut cl, &prefix, &headers, "/small")))
        });
    }
    g.finish();
    let size = 8usize << 20;
    let mut g = c.benchmark_group("download-8MiB");
    g.throughput(Throughput::Bytes(size as u64)).sample_size(10);
    for p in [
        Path::DirectHttp,
        Path::ProxyHttp,
        Path::DirectTls,
        Path::ProxyTls,
    ] {
        let (mut cl, prefix, headers) = rt.block_on(client(&b, p));
        let path = format!("/big?n={size}");
        g.bench_function(p.name(), |bch| {
            bch.iter(|| rt.block_on(one(&mut cl, &prefix, &headers, &path)))
        });
    }
    g.finish();
    c.final_summary();
}
