//! `cordon template import|build|ls|rm|gc`: the template store under the data dir
//! (docs/templates.md).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use cordon_template::human;
use cordon_template::{ImportLimits, Manifest, Store};

use crate::shown::short;

#[derive(Args)]
pub struct TemplateArgs {
    /// Cordon's data directory (default: $CORDON_HOME, /var/lib/cordon as root).
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// The template store's budget on the host's disk: every root, kept layer and microvm
    /// disk together. An import or build whose root would take the store past it ends as
    /// DiskLimit and leaves nothing (default 64G).
    #[arg(
        long,
        value_name = "SIZE",
        global = true,
        env = "CORDON_TEMPLATE_STORE_BYTES",
        value_parser = parse_size
    )]
    max_store_bytes: Option<u64>,
    #[command(subcommand)]
    command: TemplateCmd,
}

#[derive(Subcommand)]
enum TemplateCmd {
    /// Import an image file as a template: a tar of an OCI image layout, or a docker
    /// archive (`docker save`). The image is untrusted input: digests are checked, device
    /// nodes, FIFOs and set-id bits dropped, paths leaving the root refused.
    Import(ImportArgs),
    /// Build a template: steps run in a container-tier sandbox over a base (a template,
    /// `debian`), with only the egress allow-list given, then sealed. Cached by the digest
    /// of its inputs.
    Build(Box<crate::template_build::BuildArgs>),
    /// List the templates: name, digest, size, files, tiers, where each came from.
    Ls(LsArgs),
    /// Remove a template; layers and roots no template or live sandbox uses go with it.
    Rm { name: String },
    /// Remove layers and roots no template uses (and no live sandbox holds).
    Gc,
}

#[derive(Args)]
struct ImportArgs {
    /// The image file.
    file: PathBuf,
    /// The template's name (a-z, 0-9, '.', '_', '-').
    #[arg(long)]
    name: String,
    /// Largest image file content accepted, e.g. 16G.
    #[arg(long, value_parser = parse_size)]
    max_archive_bytes: Option<u64>,
    /// Largest total of uncompressed layers accepted, e.g. 16G.
    #[arg(long, value_parser = parse_size)]
    max_unpacked_bytes: Option<u64>,
    /// Most entries (files, directories, links) accepted.
    #[arg(long)]
    max_files: Option<u64>,
    /// Print the manifest as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LsArgs {
    /// Print the manifests as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    cordon_core::units::parse_size(s).map_err(|e| e.to_string())
}

pub fn template(args: TemplateArgs) -> Result<i32> {
    let data = args.data_dir.unwrap_or_else(crate::data_dir);
    let store = Store::open(&data).context("opening the template store")?;
    let store_bytes = args
        .max_store_bytes
        .unwrap_or(cordon_template::DEFAULT_STORE_BYTES);
    match args.command {
        TemplateCmd::Import(a) => import(&store, a, store_bytes),
        TemplateCmd::Ls(a) => ls(&store, a),
        TemplateCmd::Build(a) => crate::template_build::build(&store, &data, *a, store_bytes),
        TemplateCmd::Rm { name } => {
            let gc = store.remove(&name)?;
            println!(
                "removed template {name}: {} layers and {} roots freed{}",
                gc.layers_removed,
                gc.roots_removed,
                in_use(gc.roots_in_use)
            );
            Ok(0)
        }
        TemplateCmd::Gc => {
            let gc = store.gc()?;
            println!(
                "{} layers, {} roots and {} staging dirs of dead builds or imports freed{}",
                gc.layers_removed,
                gc.roots_removed,
                gc.staging_removed,
                in_use(gc.roots_in_use)
            );
            Ok(0)
        }
    }
}

fn in_use(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("; {n} roots still used by live sandboxes (run `cordon template gc` later)")
    }
}

fn import(store: &Store, a: ImportArgs, store_bytes: u64) -> Result<i32> {
    let mut limits = ImportLimits {
        store_bytes,
        ..ImportLimits::default()
    };
    if let Some(v) = a.max_archive_bytes {
        limits.archive_bytes = v;
    }
    if let Some(v) = a.max_unpacked_bytes {
        limits.unpacked_bytes = v;
    }
    if let Some(v) = a.max_files {
        limits.files = v;
    }
    let t0 = Instant::now();
    let report = match store.import(&a.file, &a.name, &limits) {
        Ok(r) => r,
        Err(e @ cordon_template::TemplateError::DiskLimit { .. }) => {
            eprintln!(
                "cordon: importing {} ended as DiskLimit: {e}",
                a.file.display()
            );
            return Ok(crate::template_build::DISK_LIMIT_EXIT);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("importing {}", a.file.display())));
        }
    };
    let took = t0.elapsed();
    for d in &report.dropped {
        eprintln!(
            "cordon: dropped layer {} entry {:?}: {}",
            d.layer, d.path, d.reason
        );
    }
    if report.setid_cleared > 0 {
        eprintln!(
            "cordon: cleared the setuid/setgid bit of {} files",
            report.setid_cleared
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.manifest)?);
    } else {
        let m = &report.manifest;
        println!(
            "imported {} {} ({}, {} files, {} layers){} in {:.2} s",
            m.name,
            short(&m.digest),
            human(m.size_bytes),
            m.files,
            m.layers.len(),
            if report.reused_root {
                ", root shared with a template of the same digest"
            } else {
                ""
            },
            took.as_secs_f64()
        );
    }
    Ok(0)
}

fn ls(store: &Store, a: LsArgs) -> Result<i32> {
    let all = store.list()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(0);
    }
    println!(
        "{:<20} {:<19} {:>9} {:>7}  {:<16} BUILT FROM",
        "NAME", "DIGEST", "SIZE", "FILES", "TIERS"
    );
    for m in &all {
        println!("{}", row(m));
    }
    Ok(0)
}

fn row(m: &Manifest) -> String {
    let tiers: Vec<&str> = m.tiers.iter().map(|t| t.as_str()).collect();
    format!(
        "{:<20} {:<19} {:>9} {:>7}  {:<16} {}",
        m.name,
        short(&m.digest),
        human(m.size_bytes),
        m.files,
        tiers.join(","),
        m.built_from
    )
}
