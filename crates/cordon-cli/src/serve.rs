//! `cordon serve`: the HTTP API, MCP over streamable HTTP, warm pools and the audit store.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use cordon_server::{Config, Server, keys};

#[derive(Args)]
#[command(after_help = "\
EXAMPLES
  cordon serve --new-key alice >> keys.txt      # a key for tenant alice (give it to alice)
  cordon serve --new-key alice --e2b >> keys.txt  # a key in E2B's form (e2b_ + 40 hex) for E2B's SDKs
  cordon serve --config cordon.toml             # binds 127.0.0.1:7070 unless `bind` says otherwise

See docs/service.md for the configuration file and docs/openapi.json for the API.")]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["new_key", "bench"])]
    config: Option<PathBuf>,
    /// Listen here instead of the config's `bind` (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    bind: Option<std::net::SocketAddr>,
    /// Print a new random API key for TENANT as a key-file line (`tenant:key`) and the
    /// hashed form to put in a config, then exit.
    #[arg(long, value_name = "TENANT")]
    new_key: Option<String>,
    /// With --new-key: a key in E2B's form (`e2b_` and 40 hex digits), which every E2B SDK
    /// version accepts (docs/e2b.md).
    #[arg(long, requires = "new_key")]
    e2b: bool,
    /// Measure API round trips on loopback per tier (warm pool against cold start) with a
    /// server in this process, print medians and exit.
    #[arg(long)]
    bench: bool,
    /// Iterations per figure with --bench.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// With --bench: only these tiers (comma-separated; default every tier this build has).
    #[arg(long, value_delimiter = ',', requires = "bench")]
    tiers: Vec<cordon_core::Tier>,
    /// With --bench: create, exec and destroy p50/p99 with this many sandboxes live
    /// (comma-separated, ascending: 10,1000,2000) of the one tier --tiers names (default
    /// container), then destroys them all and says what is left.
    #[arg(long, value_delimiter = ',', requires = "bench")]
    scale: Vec<usize>,
}

pub fn serve(args: ServeArgs) -> Result<i32> {
    if args.bench && !args.scale.is_empty() {
        let tier = args
            .tiers
            .first()
            .copied()
            .unwrap_or(cordon_core::Tier::Container);
        return cordon_measure::scale_bench::bench(&args.scale, tier, &cordon_tiers::Tiers);
    }
    if args.bench {
        return cordon_measure::serve_bench::bench(
            args.iterations.max(1),
            &args.tiers,
            &cordon_tiers::Tiers,
        );
    }
    if let Some(tenant) = args.new_key {
        let key = if args.e2b {
            keys::generate_e2b_key()?
        } else {
            keys::generate_key()?
        };
        println!("{tenant}:{key}");
        eprintln!(
            "hashed form for a config or key file: {tenant}:sha256:{}",
            keys::hash_key(&key)
        );
        return Ok(0);
    }
    let path = args.config.context("--config is required")?;
    let mut cfg = Config::load(&path)?;
    // `tier: "auto"` ranks by this host's last `cordon bench` unless the config says where.
    cfg.policy
        .bench_file
        .get_or_insert_with(|| cordon_policy::bench_file(&crate::data_dir()));
    if let Some(b) = args.bind {
        cfg.bind = b;
    }
    // The bind may have moved beyond loopback: the same checks as the file's own.
    cfg.validate()?;
    if !cfg.bind.ip().is_loopback() && cfg.tls.is_none() {
        eprintln!(
            "cordon: WARNING: serving plain HTTP on {} (edge.allow_plaintext_remote): API keys cross the network in clear unless a TLS proxy is in front",
            cfg.bind
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cordon-serve")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let backends = cordon_tiers::Tiers.server_backends(&cfg.data_dir);
        cordon_server::abort_on_panics_outside_requests();
        let server = Server::start(cfg, backends, None).await?;
        // One write of every start-up line: a caller that reads the first line (the address)
        // and closes the pipe must never make a later line's write fail (EPIPE) and so end
        // the server; a stdout that is gone is no reason to stop serving.
        let mut lines = format!(
            "cordon: listening on {}://{}\n",
            if server.tls() { "https" } else { "http" },
            server.addr()
        );
        if let Some(addr) = server.e2b_addr() {
            lines.push_str(&format!("cordon: e2b listening on http://{addr}\n"));
        }
        if let Some(addr) = server.e2b_https_addr() {
            lines.push_str(&format!("cordon: e2b sandbox hosts on https://{addr}\n"));
        }
        lines.push_str(&format!("cordon: {}\n", server.service().capacity()));
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(lines.as_bytes()).and_then(|()| out.flush());
        drop(out);
        wait_for_signal().await;
        eprintln!("cordon: shutting down: destroying every sandbox");
        server.shutdown().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(0)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
