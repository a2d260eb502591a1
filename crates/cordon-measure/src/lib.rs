//! Cordon's measuring tools, apart from the CLI that wires them to commands: `cordon bench`
//! (the tiers beside the peers this host already has, memory, the JSON `--tier auto` ranks
//! by), `cordon cost` (hosted or self-hosted, from the last bench), the SVG charts of both,
//! `cordon serve --bench` (API round trips on loopback) and `cordon serve --bench --scale`
//! (create, exec and destroy with thousands of sandboxes live).
//!
//! The tiers measured are the build's ([`Tiers`], the `cordon-tiers` facade): this crate
//! names no tier's backend, so a new tier needs no change here. Paths under the data dir are the caller's too: it passes the data dir in.

pub mod bench;
mod chart;
pub mod cost;
pub mod scale_bench;
pub mod serve_bench;
mod sys;

/// The tiers of the build being measured (the binary's own, crate `cordon-tiers`).
pub use cordon_tiers::Tiers;
