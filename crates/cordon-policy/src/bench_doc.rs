//! The document `cordon bench` stores (`<data dir>/bench/last.json`, [`SCHEMA`]) as types:
//! written by the bench, merged with what a partial bench did not measure, read by the tier
//! policy (`--tier auto` ranks by its figures) and by `cordon cost` (throughput and memory).
//! Every reader goes through these types; a field an older bench did not write reads as
//! absent.

use std::time::Duration;

use cordon_core::{Language, Tier};
use serde::{Deserialize, Serialize};

/// The schema name every stored document carries.
pub const SCHEMA: &str = "cordon-bench/1";

/// One stored bench: the run's headline figures, each tier's and peer's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDoc {
    pub schema: String,
    #[serde(default)]
    pub cordon_version: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub cores: Option<u64>,
    #[serde(default)]
    pub memory_total_bytes: Option<u64>,
    /// When the run was made (Unix seconds; 0 where a hand-written document leaves it out).
    #[serde(default)]
    pub created_unix: u64,
    #[serde(default)]
    pub plan: Option<PlanRecord>,
    #[serde(default)]
    pub iterations: Option<usize>,
    #[serde(default)]
    pub figures: Vec<Figure>,
    #[serde(default)]
    pub tiers: Vec<TierReport>,
    #[serde(default)]
    pub peers: Vec<PeerReport>,
    /// `cordon run`'s figure over bwrap's, worked out from the merged figures.
    #[serde(default)]
    pub ratio_cordon_run_to_bwrap: Option<f64>,
}

impl BenchDoc {
    /// Reads a stored document; the error says what to do.
    pub fn parse(text: &str) -> Result<BenchDoc, String> {
        serde_json::from_str(text).map_err(|e| {
            format!("the bench JSON does not parse ({e}): run `cordon bench` again to rewrite it")
        })
    }

    /// The headline figure of `subject`, if measured.
    pub fn figure(&self, subject: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.subject == subject)
    }
}

/// The counts a run used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    pub quick: bool,
    pub samples: SampleBudget,
    pub snippets: usize,
    pub agent_runs: usize,
    pub live_sandboxes_for_memory: usize,
    pub throughput_window_s: f64,
    pub concurrency: usize,
}

/// Most and fewest samples per measurement, and the seconds after which the fewest do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleBudget {
    pub max: usize,
    pub min: usize,
    /// Seconds.
    pub budget: f64,
}

/// Whether a report's figures were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Measured,
    /// Cannot run here (the reason says why and the fix).
    Skipped,
    /// Errors are listed.
    Failed,
}

/// What a headline figure is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FigureKind {
    /// A tier in-process: create + trivial exec + destroy.
    Tier,
    /// A whole CLI process on a tier.
    Cli,
    /// Another tool doing the same kind of work.
    Peer,
}

impl FigureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FigureKind::Tier => "tier",
            FigureKind::Cli => "cli",
            FigureKind::Peer => "peer",
        }
    }
}

/// A summary of timed samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub median_us: u64,
    pub p90_us: u64,
    pub min_us: u64,
    pub max_us: u64,
    pub samples: usize,
}

impl Stats {
    /// Summarizes samples; `None` for none.
    pub fn of(samples: &[Duration]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut s: Vec<u64> = samples.iter().map(|d| d.as_micros() as u64).collect();
        s.sort_unstable();
        let pick = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize];
        Some(Stats {
            median_us: pick(0.5),
            p90_us: pick(0.9),
            min_us: s[0],
            max_us: s[s.len() - 1],
            samples: s.len(),
        })
    }
}

/// One row of `figures`: the headline start-up figure of a subject (for a tier: create +
/// trivial exec + destroy, what `--tier auto` ranks by).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub subject: String,
    pub kind: FigureKind,
    /// For a `cli` row: the tier the whole-process run uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    #[serde(default)]
    pub what: String,
    pub median_us: u64,
    #[serde(default)]
    pub p90_us: u64,
    #[serde(default)]
    pub min_us: u64,
    #[serde(default)]
    pub samples: usize,
    /// When it was measured (Unix seconds): a partial bench keeps older rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_unix: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    pub snippets: usize,
    /// The snippets' execs alone, in one live sandbox.
    pub execs_total: Stats,
    /// Create + the snippets + destroy: what one agent run costs.
    pub per_run: Stats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryFigure {
    pub per_sandbox_bytes: u64,
    pub live_sandboxes: usize,
    #[serde(default)]
    pub method: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub starts_per_sec: f64,
    pub concurrency: usize,
    pub window_s: f64,
    pub completed: usize,
}

/// How a tier's cold start compares with a peer's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRatio {
    pub peer: String,
    /// `counterpart` (the peer that does this tier's kind of work) or `closest` (no
    /// counterpart was measured: the peer whose median is nearest on a log scale).
    pub basis: String,
    /// The tier's cold start median over the peer's median.
    pub ratio: f64,
}

/// One language a tier runs, measured on its own (the wasm tier's JavaScript and Python).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LanguageFigures {
    pub language: Language,
    pub snippet: String,
    /// Create + the snippet + destroy, in this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start: Option<Stats>,
    /// The snippet in a sandbox that is already live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Stats>,
    /// `run_snippets` execs of the snippet back to back in one live sandbox (the shape of
    /// an agent run), each sample the total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Stats>,
    #[serde(default)]
    pub run_snippets: usize,
    /// The snippet in a live sandbox after a pause of `pause_ms` since its last answer (an
    /// agent reading the answer before its next snippet): what background work between execs
    /// (the wasm tier's standby instance, ADR 0019) saves shows here, not in `exec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_after_pause: Option<Stats>,
    #[serde(default)]
    pub pause_ms: u64,
}

/// What one fork and exec of a program costs inside a live sandbox, with no Cordon on the
/// way: a shell in the sandbox runs `program` `execs` times in a loop. Each sample is the
/// difference between that loop and an empty one, per exec, so the exec's round trip through
/// the tier cancels out. The floor below the tier's `exec` figure: it follows the host's
/// speed as the exec does, so `exec` minus the floor is the part Cordon adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecFloor {
    pub program: String,
    pub execs: usize,
    pub per_exec: Stats,
}

/// Everything measured of one tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierReport {
    pub tier: Tier,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trivial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start: Option<Stats>,
    /// Create + trivial exec + destroy without the state the tier prepares ahead (the
    /// microvm tier: a full boot instead of a restore from its snapshot); absent for tiers
    /// that prepare nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unprepared_start: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Stats>,
    /// The fork+exec floor inside the sandbox, for tiers whose trivial snippet is a
    /// program (absent for language-only tiers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_floor: Option<ExecFloor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_run: Option<AgentRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryFigure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Throughput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerRatio>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub languages: Vec<LanguageFigures>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_unix: Option<u64>,
}

impl TierReport {
    /// A report about to be filled in.
    pub fn new(tier: Tier) -> Self {
        TierReport {
            tier,
            status: Status::Measured,
            reason: None,
            trivial: None,
            cold_start: None,
            unprepared_start: None,
            warm_start: None,
            exec: None,
            exec_floor: None,
            agent_run: None,
            memory: None,
            throughput: None,
            peer: None,
            languages: Vec::new(),
            errors: Vec::new(),
            measured_unix: None,
        }
    }
}

/// What was measured of one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    pub peer: String,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub what: String,
    #[serde(default)]
    pub counterpart_of: Vec<Tier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_unix: Option<u64>,
}
