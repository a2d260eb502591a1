//! `cordon volume create|ls|rm`: the local user's volumes (ADR 0011), mounted by
//! `cordon run --volume NAME:/work/PATH[:ro]`. Stored under the data dir's `volumes/`,
//! root's alone; the same store `cordon run` leases from.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use cordon_front::run::LOCAL_VOLUME_OWNER;
use cordon_host::volume::VolumeStore;

#[derive(Args)]
pub struct VolumeArgs {
    /// Cordon's data directory (default: $CORDON_HOME, /var/lib/cordon as root).
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: VolumeCmd,
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Create an empty volume whose size is its quota (writes past it are ENOSPC inside).
    Create {
        /// 1 to 63 of a-z, 0-9, '_' and '-'.
        name: String,
        /// Its size, e.g. 256M (at least 8M).
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// List the volumes: name, size (quota), bytes they hold on this disk.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and its contents (refused while a sandbox mounts it).
    Rm { name: String },
}

fn parse_size(s: &str) -> Result<u64, String> {
    cordon_core::units::parse_size(s)
}

pub fn volume(args: VolumeArgs) -> Result<i32> {
    let data = args.data_dir.unwrap_or_else(crate::data_dir);
    let store = VolumeStore::open(&data.join("volumes"))
        .context("opening the volume store (volumes need root: run cordon as root)")?;
    match args.command {
        VolumeCmd::Create { name, size } => {
            let v = store.create(LOCAL_VOLUME_OWNER, &name, size)?;
            println!(
                "created volume {} of {}; mount it with --volume {}:/work/{}",
                v.name,
                cordon_core::units::format_size(v.size),
                v.name,
                v.name
            );
        }
        VolumeCmd::Ls { json } => {
            let list = store.list(LOCAL_VOLUME_OWNER)?;
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!("{:<24} {:>10} {:>10}", "NAME", "SIZE", "USED");
                for v in list {
                    println!(
                        "{:<24} {:>10} {:>10}",
                        v.name,
                        cordon_core::units::format_size(v.size),
                        cordon_core::units::format_size(v.allocated)
                    );
                }
            }
        }
        VolumeCmd::Rm { name } => {
            store.delete(LOCAL_VOLUME_OWNER, &name)?;
            println!("deleted volume {name}");
        }
    }
    Ok(0)
}
