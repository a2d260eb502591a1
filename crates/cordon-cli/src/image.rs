//! `cordon image build`: the microvm tier's guest kernel, root filesystem and initramfs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use cordon_microvm::image::{self, BuildOptions, Progress};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCmd,
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Build (or check) the microvm guest image: Debian cloud kernel, debootstrap minbase
    /// root with Python 3 (read-only ext4), initramfs with the cordon-guest agent.
    /// Idempotent: parts whose inputs did not change are kept.
    Build(BuildArgs),
}

#[derive(Args)]
struct BuildArgs {
    /// The static cordon-guest agent (default: built next to this binary, or
    /// target/x86_64-unknown-linux-musl/release/cordon-guest).
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
    /// Debian mirror for debootstrap (default: the one apt uses).
    #[arg(long)]
    mirror: Option<String>,
    /// Cordon's data directory (default: $CORDON_HOME, /var/lib/cordon as root).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Rebuild every part even when its inputs did not change.
    #[arg(long)]
    force: bool,
}

fn default_agent() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let dir = exe
        .as_ref()
        .and_then(|e| e.parent().map(|p| p.to_path_buf()));
    let mut candidates = Vec::new();
    if let Some(d) = &dir {
        candidates.push(d.join("cordon-guest-static"));
        if let Some(target) = d.parent() {
            candidates.push(target.join("x86_64-unknown-linux-musl/release/cordon-guest"));
        }
    }
    candidates.push(PathBuf::from(
        "target/x86_64-unknown-linux-musl/release/cordon-guest",
    ));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| candidates[candidates.len() - 1].clone())
}

pub fn image(args: ImageArgs) -> Result<i32> {
    match args.command {
        ImageCmd::Build(b) => build(b),
    }
}

fn build(args: BuildArgs) -> Result<i32> {
    let opts = BuildOptions {
        data_dir: args.data_dir.unwrap_or_else(image::default_data_dir),
        agent: args.agent.unwrap_or_else(default_agent),
        mirror: args.mirror,
        force: args.force,
    };
    let bar = ProgressBar::new(3);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:20} {pos}/{len} {msg}")
            .context("progress bar template")?,
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let mut cb = |p: Progress| match p {
        Progress::Step(n, total, what) => {
            bar.set_length(total as u64);
            bar.set_position(n as u64 - 1);
            bar.set_message(what);
        }
        Progress::Detail(d) => bar.set_message(d),
        Progress::Cached(what) => bar.println(format!("  up to date: {what}")),
    };
    let report = image::build(&opts, &mut cb);
    bar.finish_and_clear();
    let report = report.context("building the microvm guest image")?;
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    if report.built.is_empty() {
        eprintln!(
            "microvm image up to date in {} ({:.1}s)",
            image::image_dir(&opts.data_dir).display(),
            report.seconds
        );
    } else {
        eprintln!(
            "microvm image built ({}) in {:.1}s",
            report.built.join(", "),
            report.seconds
        );
    }
    eprintln!(
        "  kernel {} ({:.1} MiB), initrd {:.1} MiB, rootfs {:.1} MiB",
        report.manifest.kernel_package,
        mb(report.sizes.get("kernel").copied().unwrap_or(0)),
        mb(report.sizes.get("initrd").copied().unwrap_or(0)),
        mb(report.sizes.get("rootfs").copied().unwrap_or(0)),
    );
    Ok(0)
}
