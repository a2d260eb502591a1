//! `cordon`: the front. It runs `cordon run` on the container tier itself and hands every
//! other command (and every other tier, and any run with a policy step) to `cordon-full`
//! beside it, by exec. It is a crate of its own so that its dependency graph is the proof of
//! what it carries: the container tier, the gate and the egress proxy, and no wasmtime,
//! server, MCP, SQLite or charts (`cargo tree -p cordon -e normal`). `cordon-full` (crate
//! `cordon-cli`) uses the same `run` module with every tier ([`run::Tiers`]), so `cordon run`
//! has one definition of its flags.

pub mod outfile;
pub mod run;
pub mod setup;

use std::path::PathBuf;

use clap::Args;
use cordon_policy::{Autonomy, Shape, Trust};

/// Name of the binary with every command, looked up next to the running `cordon`.
pub const FULL_BINARY: &str = "cordon-full";

/// The request flags, shared with `cordon run`.
#[derive(Args, Debug, Clone)]
pub struct PolicyInput {
    /// Where the code's inputs come from: trusted (inputs you control) or untrusted
    /// (downstream of text an outsider could write).
    #[arg(long)]
    pub trust: Option<Trust>,
    /// What the code needs: compute, read-files, write-files, install-packages, internet.
    #[arg(long)]
    pub autonomy: Option<Autonomy>,
    /// Workload shape: many-short (default) or one-long.
    #[arg(long)]
    pub shape: Option<Shape>,
    /// A rules file replacing the shipped default (also $CORDON_POLICY).
    #[arg(long, value_name = "FILE", env = "CORDON_POLICY")]
    pub policy: Option<PathBuf>,
}

/// Cordon's data dir: `$CORDON_HOME`, else `/var/lib/cordon` for root, else
/// `$XDG_DATA_HOME/cordon` (or `~/.local/share/cordon`). Resolved once at each command's
/// entry and passed down; under `cfg(test)` it panics, so a unit test passes a temp dir.
#[cfg(not(test))]
pub fn data_dir() -> PathBuf {
    cordon_core::default_data_dir()
}

#[cfg(test)]
pub fn data_dir() -> PathBuf {
    panic!("a unit test reached the host's data dir: pass it a temp dir of its own")
}

/// Sets up logging: a directive filter only when `CORDON_LOG` asks for one (parsing one
/// costs start-up time every `cordon run` would otherwise pay).
pub fn init_logging() {
    use std::io::IsTerminal;
    // Colour codes only for a terminal: piped or captured stderr gets plain text.
    let ansi = std::io::stderr().is_terminal();
    match tracing_subscriber::EnvFilter::try_from_env("CORDON_LOG") {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .init(),
        Err(_) => tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .init(),
    }
}
