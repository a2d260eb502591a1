//! Cordon's tier policy: trust × autonomy × shape → the tiers allowed, the minimum, and the
//! one chosen, each reason named.
//!
//! The rules are data ([`DEFAULT_RULES`], a versioned TOML file, replaceable by any other);
//! every rule carries examples that are evaluated when the rules load, and a load fails,
//! naming the rule, when an example disagrees. This crate does no I/O: the caller reads files,
//! probes the host and hands in which tiers are available and the last bench's figures.

pub mod bench_doc;
mod model;
mod rule_id;
mod rules;

pub use model::{Autonomy, Request, Shape, TierChoice, Trust};
pub use rule_id::RuleId;
pub use rules::{
    BenchFigures, DEFAULT_RULES, Decision, Host, LoadError, PolicyId, RankedBy, Ranking, Reason,
    Refusal, Rules, bench_file,
};
