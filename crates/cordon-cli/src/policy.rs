//! `cordon policy explain`, and the policy step of `cordon run`: load the rules (the shipped
//! default, or a file), probe which tiers this host has, read the last bench's figures, and
//! decide.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use cordon_core::Tier;
use cordon_policy::{Decision, Host, Refusal, Request, RuleId, Rules, Shape, TierChoice};

#[derive(Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCmd,
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Show which tiers a request may use, the minimum, the one chosen, and every rule's
    /// reason; or the refusal, with the rule and the fix.
    Explain(ExplainArgs),
    /// Print the rules in force (the shipped default or --policy FILE).
    Show(ShowArgs),
}

pub use cordon_front::PolicyInput;

#[derive(Args)]
struct ExplainArgs {
    #[command(flatten)]
    input: PolicyInput,
    /// The tier asked for: auto (default) or a tier name.
    #[arg(long, default_value = "auto")]
    tier: TierChoice,
    /// A host the work may reach (as `cordon run --allow-host`). Repeatable.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_hosts: Vec<cordon_core::Pattern>,
    /// Decide as if only these tiers were available (comma-separated), instead of probing.
    #[arg(long, value_delimiter = ',', value_name = "TIERS")]
    available: Option<Vec<Tier>>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ShowArgs {
    /// A rules file replacing the shipped default (also $CORDON_POLICY).
    #[arg(long, value_name = "FILE", env = "CORDON_POLICY")]
    policy: Option<PathBuf>,
}

/// The rules in force: the file given, or the shipped default.
pub fn load_rules(path: Option<&Path>) -> Result<(Rules, String)> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the policy file {}", p.display()))?;
            let rules = Rules::from_toml(&text)
                .with_context(|| format!("loading the policy file {}", p.display()))?;
            Ok((rules, text))
        }
        None => Ok((
            Rules::default_rules().context("loading the shipped default policy")?,
            cordon_policy::DEFAULT_RULES.to_string(),
        )),
    }
}

/// Decides a request; `None` when no --trust/--autonomy were given. `only` replaces the
/// probe (what-if); `fits` are the tiers that can run the request at all; the bench figures
/// come from `data_dir`.
pub fn decide(
    input: &PolicyInput,
    tier: TierChoice,
    allow_hosts: &[cordon_core::Pattern],
    only: Option<&[Tier]>,
    fits: &[Tier],
    data_dir: &Path,
) -> Result<Option<Result<Decision, Box<Refusal>>>> {
    let (trust, autonomy) = match (input.trust, input.autonomy) {
        (Some(t), Some(a)) => (t, a),
        (None, None) => return Ok(None),
        _ => anyhow::bail!(
            "--trust and --autonomy go together: give both (e.g. --trust untrusted --autonomy compute)"
        ),
    };
    let (rules, _) = load_rules(input.policy.as_deref())?;
    let req = Request {
        trust,
        autonomy,
        shape: input.shape.unwrap_or(Shape::ManyShort),
        allow_hosts: allow_hosts.to_vec(),
        tier,
    };
    // Decide as if every tier were here first: a refusal by a rule needs no probe.
    if let Err(r) = rules.decide(&req, &Host::with_available(fits.iter().copied()))
        && r.rule != RuleId::TierAvailable
    {
        return Ok(Some(Err(r)));
    }
    Ok(Some(rules.decide(
        &req,
        &cordon_tiers::Tiers.probe_host(only, fits, data_dir),
    )))
}

/// Prints a refusal on stderr (and as JSON on stdout with `json`); the exit status is 125.
pub fn report_refusal(r: &Refusal, json: bool) -> Result<i32> {
    eprintln!("cordon: refused by policy rule {}: {}", r.rule, r.message);
    eprintln!("cordon: fix: {}", r.fix);
    if json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "refused": r }))?
        );
    }
    Ok(125)
}

pub fn policy(args: PolicyArgs) -> Result<i32> {
    match args.command {
        PolicyCmd::Show(a) => {
            let (rules, text) = load_rules(a.policy.as_deref())?;
            eprintln!(
                "# {} rules, revision {}, sha256 {}; every example checked",
                rules.rule_names().len(),
                rules.id().revision,
                rules.id().sha256
            );
            print!("{text}");
            Ok(0)
        }
        PolicyCmd::Explain(a) => {
            if a.input.trust.is_none() || a.input.autonomy.is_none() {
                anyhow::bail!(
                    "cordon policy explain needs --trust (trusted|untrusted) and --autonomy (compute|read-files|write-files|install-packages|internet)"
                );
            }
            let decided = decide(
                &a.input,
                a.tier,
                &a.allow_hosts,
                a.available.as_deref(),
                &Tier::ALL,
                &crate::data_dir(),
            )?;
            match decided {
                Some(Ok(d)) => {
                    if a.json {
                        println!("{}", serde_json::to_string_pretty(&d)?);
                    } else {
                        println!("{d}");
                    }
                    Ok(0)
                }
                Some(Err(r)) => report_refusal(&r, a.json),
                None => Ok(125),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::{Autonomy, Trust};

    fn input(trust: Trust, autonomy: Autonomy) -> PolicyInput {
        PolicyInput {
            trust: Some(trust),
            autonomy: Some(autonomy),
            shape: None,
            policy: None,
        }
    }

    /// A data dir of the test's own, empty: nothing of the host's is read.
    fn data() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    fn pick(i: &PolicyInput, only: &[Tier], data_dir: &Path) -> Result<Tier, RuleId> {
        match decide(i, TierChoice::Auto, &[], Some(only), &Tier::ALL, data_dir) {
            Ok(Some(Ok(d))) => Ok(d.chosen),
            Ok(Some(Err(r))) => Err(r.rule),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn what_if_availability_changes_the_choice() {
        let i = input(Trust::Untrusted, Autonomy::Compute);
        let d = data();
        assert_eq!(
            pick(&i, &[Tier::Wasm, Tier::Gvisor], d.path()),
            Ok(Tier::Wasm)
        );
        assert_eq!(
            pick(&i, &[Tier::Container, Tier::Gvisor], d.path()),
            Ok(Tier::Gvisor)
        );
        assert_eq!(
            pick(&i, &[Tier::Container], d.path()),
            Err(RuleId::TierAvailable)
        );
    }

    #[test]
    fn bench_figures_are_read_from_the_data_dir_given_and_no_other() {
        // A bench that found gvisor fastest, planted in one data dir: it steers the choice
        // there and nowhere else (the old code read the host's data dir in every test, so a
        // partial bench on the machine turned the test above).
        let i = input(Trust::Untrusted, Autonomy::Compute);
        let planted = data();
        std::fs::create_dir_all(planted.path().join("bench")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            cordon_policy::bench_file(planted.path()),
            r#"{"schema":"cordon-bench/1","created_unix":1,"figures":[{"subject":"gvisor","kind":"tier","median_us":1},{"subject":"wasm","kind":"tier","median_us":9000}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let only = [Tier::Wasm, Tier::Gvisor];
        assert_eq!(pick(&i, &only, planted.path()), Ok(Tier::Gvisor));
        assert_eq!(pick(&i, &only, data().path()), Ok(Tier::Wasm));
        // And a unit test that forgets to pass one fails loudly instead of reading the host's.
        assert!(std::panic::catch_unwind(crate::data_dir).is_err());
    }

    #[test]
    fn fit_restricts_auto() {
        // A bash program cannot run in wasm: auto goes past it.
        let i = input(Trust::Untrusted, Autonomy::Compute);
        let d = decide(
            &i,
            TierChoice::Auto,
            &[],
            Some(&Tier::ALL),
            &[Tier::Container, Tier::Gvisor, Tier::Microvm],
            data().path(),
        );
        let chosen = match d {
            Ok(Some(Ok(d))) => Some(d.chosen),
            _ => None,
        };
        assert_eq!(chosen, Some(Tier::Gvisor));
    }

    #[test]
    fn half_a_request_is_an_error_and_none_is_no_policy() {
        let d = data();
        let all = |i: &PolicyInput| {
            decide(
                i,
                TierChoice::Auto,
                &[],
                Some(&Tier::ALL),
                &Tier::ALL,
                d.path(),
            )
        };
        let mut i = input(Trust::Trusted, Autonomy::Compute);
        i.autonomy = None;
        assert!(all(&i).is_err());
        i.trust = None;
        assert!(matches!(all(&i), Ok(None)));
    }

    #[test]
    fn a_policy_file_replaces_the_default_and_bad_examples_fail_naming_the_rule() {
        let home = data();
        let dir = home.path();
        // A stricter house policy: everything in a microVM.
        let strict = format!(
            "{}\n[[rules]]\nname = \"house-microvm-only\"\nwhy = \"house rule\"\nfix = \"use microvm\"\nallow = [\"microvm\"]\n[[rules.examples]]\ntrust = \"trusted\"\nautonomy = \"compute\"\nallowed = [\"microvm\"]\n",
            cordon_policy::DEFAULT_RULES
                .replace("  chosen = \"container\"\n", "")
                .replace("  chosen = \"gvisor\"\n", "")
                .replace("  allowed = [\"runtime\", \"container\", \"wasm\", \"gvisor\", \"microvm\"]\n  minimum = \"runtime\"\n", "")
                .replace("  allowed = [\"container\", \"gvisor\", \"microvm\"]\n  minimum = \"container\"\n", "")
                .replace("  allowed = [\"wasm\", \"gvisor\", \"microvm\"]\n  minimum = \"wasm\"\n", "")
                .replace("  allowed = [\"gvisor\", \"microvm\"]\n  minimum = \"gvisor\"\n", "")
                .replace("  allowed = [\"gvisor\", \"microvm\"]\n", "")
                .replace("  allowed = [\"container\", \"gvisor\", \"microvm\"]\n", "")
        );
        let p = dir.join("strict.toml");
        std::fs::write(&p, &strict).unwrap_or_else(|e| panic!("{e}"));
        let mut i = input(Trust::Trusted, Autonomy::Compute);
        i.policy = Some(p.clone());
        let d = decide(&i, TierChoice::Auto, &[], Some(&Tier::ALL), &Tier::ALL, dir);
        let chosen = match &d {
            Ok(Some(Ok(d))) => Some((d.chosen, d.policy.revision.as_str())),
            _ => None,
        };
        assert_eq!(chosen, Some((Tier::Microvm, "default-2026-11")));

        let bad = strict.replace("allowed = [\"microvm\"]\n", "allowed = [\"gvisor\"]\n");
        std::fs::write(&p, bad).unwrap_or_else(|e| panic!("{e}"));
        let err = decide(&i, TierChoice::Auto, &[], Some(&Tier::ALL), &Tier::ALL, dir)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("house-microvm-only"), "{err}");
    }
}
