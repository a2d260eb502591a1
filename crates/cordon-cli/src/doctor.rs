//! `cordon doctor`: what each tier needs, what this host has, and the fix.

use anyhow::Result;
use clap::Args;
use cordon_core::{Backend, Tier, TierStatus};

use crate::backends::AnyBackend;

#[derive(Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn doctor(args: DoctorArgs) -> Result<i32> {
    let mut report = Vec::new();
    for tier in Tier::ALL {
        let entry = match AnyBackend::for_tier(tier) {
            Some(b) => serde_json::to_value(b.probe())?,
            None => serde_json::json!({
                "tier": tier,
                "status": "unavailable",
                "capabilities": [],
                "notes": [format!("the {tier} tier is not part of this build of cordon yet")],
            }),
        };
        report.push(entry);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    for (tier, entry) in Tier::ALL.iter().zip(&report) {
        let status: TierStatus = serde_json::from_value(entry["status"].clone())?;
        let mark = match status {
            TierStatus::Available => "available",
            TierStatus::Degraded => "degraded",
            TierStatus::Unavailable => "UNAVAILABLE",
        };
        println!("{tier:<10} {mark}   — {}", tier.wall());
        for cap in entry["capabilities"].as_array().into_iter().flatten() {
            let ok = cap["ok"].as_bool().unwrap_or(false);
            let name = cap["name"].as_str().unwrap_or_default();
            let detail = cap["detail"].as_str().unwrap_or_default();
            println!("    {} {name}: {detail}", if ok { "ok " } else { "NO " });
            if let Some(fix) = cap["fix"].as_str().filter(|_| !ok) {
                println!("        fix: {fix}");
            }
        }
        for note in entry["notes"].as_array().into_iter().flatten() {
            println!("    note: {}", note.as_str().unwrap_or_default());
        }
    }
    Ok(0)
}
