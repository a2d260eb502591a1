//! `cordon snapshot create|ls|rm|start|fork`: a running server's snapshots
//! (docs/snapshots.md), through its HTTP API with one of a tenant's keys, as any client.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Args)]
pub struct SnapshotArgs {
    /// The server's URL.
    #[arg(
        long,
        global = true,
        env = "CORDON_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    url: String,
    /// A tenant's API key.
    #[arg(long, global = true, env = "CORDON_API_KEY", hide_env_values = true)]
    key: Option<String>,
    /// Print the server's JSON answer.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: SnapshotCmd,
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Take a snapshot of a live sandbox (it runs on).
    Create {
        /// The sandbox's id (sb-...).
        sandbox: String,
        /// A name of your own for it.
        #[arg(long)]
        name: Option<String>,
        /// full (memory, processes, files) or filesystem (files); default: the most the
        /// sandbox's tier keeps.
        #[arg(long)]
        mode: Option<String>,
    },
    /// List your snapshots.
    Ls,
    /// Delete a snapshot (by id or name) and its image.
    Rm { snapshot: String },
    /// Start sandboxes from a snapshot (by id or name).
    Start {
        snapshot: String,
        /// How many, 1 to 20.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Their lifetime ("10m" or seconds).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// Fork a live sandbox: a snapshot of it now, sandboxes started from it, the snapshot
    /// then deleted.
    Fork {
        sandbox: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long)]
        ttl: Option<String>,
    },
}

struct Client {
    http: reqwest::blocking::Client,
    url: String,
    key: String,
}

impl Client {
    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url.trim_end_matches('/')))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .with_context(|| format!("reaching the server at {}", self.url))?;
        let status = resp.status();
        let v: Value = resp.json().unwrap_or(Value::Null);
        if !status.is_success() {
            let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            bail!(
                "{} ({}): {}; fix: {}",
                text("code"),
                status.as_u16(),
                text("message"),
                text("fix")
            );
        }
        Ok(v)
    }
}

fn some(pairs: &[(&str, Option<Value>)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| ((*k).to_string(), v)))
            .collect(),
    )
}

fn line(s: &Value) -> String {
    let f = |k: &str| {
        s.get(k)
            .map(|v| v.to_string().trim_matches('"').to_string())
    };
    format!(
        "{:<38} {:<16} {:<10} {:<10} {:>10}  {}",
        f("id").unwrap_or_default(),
        f("name").unwrap_or_else(|| "-".into()),
        f("tier").unwrap_or_default(),
        f("mode").unwrap_or_default(),
        s.get("bytes")
            .and_then(Value::as_u64)
            .map(cordon_core::units::format_size)
            .unwrap_or_default(),
        f("source").unwrap_or_default()
    )
}

fn started(v: &Value) {
    for sb in v["sandboxes"].as_array().into_iter().flatten() {
        println!("{}", sb["id"].as_str().unwrap_or_default());
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        eprintln!("not started: {}: {}", e["code"], e["message"]);
    }
}

/// An id or name as one path segment: ids and names are `a-z 0-9 . _ -` only.
fn seg(s: &str) -> Result<&str> {
    if s.is_empty()
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        bail!("{s:?} is not a sandbox or snapshot id or name (a-z, 0-9, '.', '_', '-')");
    }
    Ok(s)
}

pub fn snapshot(args: SnapshotArgs) -> Result<i32> {
    let Some(key) = args.key else {
        bail!("no API key: pass --key or set CORDON_API_KEY to one of your tenant's keys");
    };
    let c = Client {
        http: reqwest::blocking::Client::new(),
        url: args.url,
        key,
    };
    use reqwest::Method as M;
    let v = match &args.command {
        SnapshotCmd::Create {
            sandbox,
            name,
            mode,
        } => c.call(
            M::POST,
            &format!("/v1/sandboxes/{}/snapshots", seg(sandbox)?),
            Some(some(&[
                ("name", name.clone().map(Value::from)),
                ("mode", mode.clone().map(Value::from)),
            ])),
        )?,
        SnapshotCmd::Ls => c.call(M::GET, "/v1/snapshots", None)?,
        SnapshotCmd::Rm { snapshot } => c.call(
            M::DELETE,
            &format!("/v1/snapshots/{}", seg(snapshot)?),
            None,
        )?,
        SnapshotCmd::Start {
            snapshot,
            count,
            ttl,
        } => c.call(
            M::POST,
            &format!("/v1/snapshots/{}/sandboxes", seg(snapshot)?),
            Some(some(&[
                ("count", Some(json!(count))),
                ("ttl", ttl.clone().map(Value::from)),
            ])),
        )?,
        SnapshotCmd::Fork {
            sandbox,
            count,
            ttl,
        } => c.call(
            M::POST,
            &format!("/v1/sandboxes/{}/fork", seg(sandbox)?),
            Some(some(&[
                ("count", Some(json!(count))),
                ("ttl", ttl.clone().map(Value::from)),
            ])),
        )?,
    };
    if args.json {
        println!("{v}");
        return Ok(0);
    }
    match args.command {
        SnapshotCmd::Create { .. } => println!("{}", line(&v)),
        SnapshotCmd::Ls => {
            for s in v["snapshots"].as_array().into_iter().flatten() {
                println!("{}", line(s));
            }
        }
        SnapshotCmd::Rm { .. } => {
            println!("deleted snapshot {}", v["id"].as_str().unwrap_or_default())
        }
        SnapshotCmd::Start { .. } | SnapshotCmd::Fork { .. } => started(&v),
    }
    Ok(0)
}
