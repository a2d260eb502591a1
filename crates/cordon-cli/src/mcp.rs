//! `cordon mcp`: an MCP server over stdio for a local agent (tenant `local`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use cordon_server::{Config, Keys, Service, Tenant};

#[derive(Args)]
pub struct McpArgs {
    /// A configuration file (TOML); its limits, pools and data dir are used, not its keys
    /// or bind address.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data dir for the audit store (default: <cordon data dir>/mcp).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

pub fn mcp(args: McpArgs) -> Result<i32> {
    let mut cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::with_data_dir(crate::data_dir().join("mcp")),
    };
    if let Some(d) = args.data_dir {
        cfg.data_dir = d;
    }
    // The local agent acts for the operator who started it: trusted, every tier, unless
    // the config gives tenant `local` a ceiling of its own. Egress keeps the default
    // ceiling (public names and addresses only).
    cfg.tenants
        .entry("local".into())
        .or_insert_with(|| cordon_engine::TenantRules {
            trust: Some(cordon_policy::Trust::Trusted),
            tiers: Some(cordon_core::Tier::ALL.to_vec()),
            ..Default::default()
        });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        cfg.policy
            .bench_file
            .get_or_insert_with(|| cordon_policy::bench_file(&crate::data_dir()));
        let backends = cordon_tiers::Tiers.server_backends(&cfg.data_dir);
        let svc = Service::start(cfg, Keys::default(), backends, None).await?;
        let io = (tokio::io::stdin(), tokio::io::stdout());
        let served = cordon_server::mcp::serve_io(svc.clone(), Tenant("local".into()), io).await;
        svc.shutdown().await;
        served?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(0)
}
