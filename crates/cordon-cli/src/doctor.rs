//! `cordon doctor`: what each tier needs, what this host has, and the fix.

use anyhow::Result;
use clap::Args;
use cordon_core::{Probe, Tier, TierStatus};

#[derive(Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn doctor(args: DoctorArgs) -> Result<i32> {
    let report: Vec<Probe> = Tier::ALL
        .iter()
        .map(|&tier| cordon_tiers::Tiers.probe(tier))
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    for probe in &report {
        let mark = match probe.status {
            TierStatus::Available => "available",
            TierStatus::Degraded => "degraded",
            TierStatus::Unavailable => "UNAVAILABLE",
        };
        println!(
            "{:<10} {mark}   — {}",
            probe.tier.as_str(),
            probe.tier.wall()
        );
        for cap in &probe.capabilities {
            println!(
                "    {} {}: {}",
                if cap.ok { "ok " } else { "NO " },
                cap.name,
                cap.detail
            );
            if let Some(fix) = cap.fix.as_deref().filter(|_| !cap.ok) {
                println!("        fix: {fix}");
            }
        }
        for note in &probe.notes {
            println!("    note: {note}");
        }
    }
    Ok(0)
}
