//! `cordon-full`: every `cordon` command, wired to the crates that do the work.
//!
//! The `cordon` front (crate `cordon-front`) runs the common `cordon run` on the container
//! tier itself (its start-up is a few hundred microseconds shorter than a binary that also
//! carries wasmtime, the server and every other tier) and hands everything else to this
//! binary. This crate is command wiring and the tiers of this build (`backends`, `tiers`);
//! the measuring tools (`cordon bench`, `cordon cost`, `cordon serve --bench`) are
//! `cordon-measure`'s, which gets the tiers through its `Tiers` trait.

mod audit;
mod doctor;
mod image;
mod mcp;
mod policy;
mod serve;
mod shown;
mod snapshot;
mod template;
mod template_build;
mod volume;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cordon",
    version,
    about = "Run code an AI agent wrote behind a real wall",
    long_about = "Cordon runs untrusted code on isolation tiers (runtime, wasm, container, gvisor, microvm) \
                  with no ambient secrets, egress denied by default and enforced limits."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run code once in a fresh sandbox, then destroy it.
    Run(Box<cordon_front::run::RunArgs>),
    /// Show every tier: available or not, why, and the fix.
    Doctor(doctor::DoctorArgs),
    /// Measure start-up cost of the tiers beside their peers on this host.
    Bench(cordon_measure::bench::BenchArgs),
    /// Hosted sandboxes or self-hosted Cordon: monthly cost at your volume and the
    /// crossover, from your prices and this host's last bench.
    Cost(Box<cordon_measure::cost::CostArgs>),
    /// Templates: read-only root filesystems a sandbox's root is made from
    /// (`cordon run --template NAME`): import, list, remove.
    Template(template::TemplateArgs),
    /// Volumes: named file systems with a size quota that outlive sandboxes
    /// (`cordon run --volume NAME:/work/PATH[:ro]`): create, list, remove.
    Volume(volume::VolumeArgs),
    /// Snapshots of a running server's sandboxes (with a tenant's key): take, list,
    /// delete, start sandboxes from one, fork a sandbox.
    Snapshot(snapshot::SnapshotArgs),
    /// Build guest images (the microvm tier's kernel, root filesystem and agent).
    Image(image::ImageArgs),
    /// Serve the HTTP API (and MCP over HTTP) with sessions, warm pools and an audit store.
    Serve(serve::ServeArgs),
    /// Serve MCP over stdio for a local agent.
    Mcp(mcp::McpArgs),
    /// Query the audit store.
    Audit(audit::AuditArgs),
    /// Which tier a request may use and why: `cordon policy explain --trust T --autonomy A`.
    Policy(policy::PolicyArgs),
    /// Make tiers ready before they are asked for: their packages, build and guest artifacts
    /// (container, wasm, gvisor, microvm, or all; from Cordon's source tree).
    Setup {
        /// Tiers to make ready (no TIER: all).
        tiers: Vec<std::ffi::OsString>,
    },
}

#[cfg(not(test))]
pub use cordon_front::data_dir;
pub use cordon_front::{FULL_BINARY, init_logging};

/// In unit tests the data dir is never the host's: a test passes a temp dir of its own.
#[cfg(test)]
pub fn data_dir() -> std::path::PathBuf {
    panic!("a unit test reached the host's data dir: pass it a temp dir of its own")
}

/// `cordon-full`'s main: every command. Never returns.
pub fn full_main() -> ! {
    let cli = Cli::parse();
    init_logging();
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cordon: error: {e:#}");
            125
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> Result<i32> {
    match cli.command {
        Cmd::Run(args) => cordon_front::run::run(*args, &cordon_tiers::Tiers),
        Cmd::Doctor(args) => doctor::doctor(args),
        Cmd::Bench(args) => cordon_measure::bench::bench(args, &cordon_tiers::Tiers, &data_dir()),
        Cmd::Cost(args) => cordon_measure::cost::cost(*args, &data_dir()),
        Cmd::Image(args) => image::image(args),
        Cmd::Template(args) => template::template(args),
        Cmd::Volume(args) => volume::volume(args),
        Cmd::Snapshot(args) => snapshot::snapshot(args),
        Cmd::Serve(args) => serve::serve(args),
        Cmd::Mcp(args) => mcp::mcp(args),
        Cmd::Audit(args) => audit::audit(args),
        Cmd::Policy(args) => policy::policy(args),
        Cmd::Setup { tiers } => Ok(cordon_front::setup::run(&tiers)),
    }
}
