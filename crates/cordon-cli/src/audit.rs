//! `cordon audit`: query the audit store from the command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use cordon_core::units::parse_duration;
use cordon_engine::audit::{Audit, Query, now_ms};
use cordon_server::Config;

#[derive(Args)]
#[command(after_help = "\
EXAMPLES
  cordon audit --config cordon.toml --since 1h
  cordon audit --config cordon.toml --tenant alice --kind exec --json
  cordon audit --data-dir /var/lib/cordon --sandbox sb-...")]
pub struct AuditArgs {
    /// The server's configuration file (its data dir holds audit.db).
    #[arg(long, value_name = "FILE", required_unless_present = "data_dir")]
    config: Option<PathBuf>,
    /// The data dir holding audit.db (instead of --config).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Only rows of this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Only rows about this sandbox.
    #[arg(long)]
    sandbox: Option<String>,
    /// Only rows of this kind (policy, create, exec, file_put, file_get, destroy, egress,
    /// grant_use, recovery, startup, shutdown).
    #[arg(long)]
    kind: Option<String>,
    /// Only rows newer than this, e.g. 1h, 30m.
    #[arg(long, value_parser = parse_duration)]
    since: Option<std::time::Duration>,
    /// Only rows with an id above this.
    #[arg(long)]
    after_id: Option<i64>,
    /// At most this many rows.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

pub fn audit(args: AuditArgs) -> Result<i32> {
    let dir = match (&args.data_dir, &args.config) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => Config::load(c)?.data_dir,
        (None, None) => anyhow::bail!("give --config or --data-dir"),
    };
    let path = dir.join("audit.db");
    anyhow::ensure!(
        path.is_file(),
        "no audit store at {}; give the data dir of a server that has run",
        path.display()
    );
    let store = Audit::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let q = Query {
        sandbox: args.sandbox,
        kind: args.kind,
        after_id: args.after_id,
        since_ms: args.since.map(|d| now_ms() - d.as_millis() as i64),
        limit: Some(args.limit),
    };
    let rows = store.query(args.tenant.as_deref(), &q)?;
    for e in rows {
        if args.json {
            println!("{}", serde_json::to_string(&e)?);
        } else {
            println!(
                "{:>6} {} {:<10} {:<9} {:<34} {:<14} {}",
                e.id,
                e.time_ms,
                e.tenant.as_deref().unwrap_or("-"),
                e.kind,
                e.sandbox.as_deref().unwrap_or("-"),
                e.decision.as_deref().unwrap_or("-"),
                e.detail
            );
        }
    }
    Ok(0)
}
