//! Cordon's measuring tools, apart from the CLI that wires them to commands: `cordon bench`
//! (the tiers beside the peers this host already has, memory, the JSON `--tier auto` ranks
//! by), `cordon cost` (hosted or self-hosted, from the last bench), the SVG charts of both,
//! and `cordon serve --bench` (API round trips on loopback).
//!
//! The tiers measured are the caller's ([`Tiers`]): this crate names no tier's backend, so
//! a new tier needs no change here, and `cordon-full` (crate `cordon-cli`) passes every tier
//! it has. Paths under the data dir are the caller's too: it passes the data dir in.

pub mod bench;
mod chart;
pub mod cost;
pub mod serve_bench;
mod sys;

use std::path::Path;

use cordon_core::{Backend, Tier};

/// The tiers of the build being measured.
pub trait Tiers {
    /// The backend of a tier, or `None` when this build has no such tier.
    fn backend(&self, tier: Tier) -> Option<Box<dyn Backend>>;
    /// Every tier of this build for a server whose data dir is `data_dir` (`cordon serve
    /// --bench` starts one per tier measured).
    fn server_backends(&self, data_dir: &Path) -> cordon_server::Backends;
}
