use super::*;
use crate::model::{Autonomy as A, Shape as S, Trust as T};

fn rules() -> Rules {
    match Rules::default_rules() {
        Ok(r) => r,
        Err(e) => panic!("default rules do not load: {e}"),
    }
}

fn pat(entry: &str) -> cordon_core::Pattern {
    entry.parse().unwrap_or_else(|e| panic!("{e}"))
}

fn req(trust: T, autonomy: A) -> Request {
    Request::new(trust, autonomy)
}

#[test]
fn default_rules_load_and_every_rule_has_examples() {
    // Loading evaluates every rule's examples; this is the test of all of them.
    let r = rules();
    assert_eq!(r.id().version, 1);
    assert_eq!(r.id().sha256.len(), 64);
    let names = r.rule_names();
    for want in [
        "untrusted-needs-kernel-boundary",
        "runtime-only-for-trusted-compute",
        "wasm-is-pure-computation",
        "trusted-may-use-container",
        "network-needs-allow-list",
        "no-ambient-credentials",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for rule in &r.rules {
        assert!(!rule.examples.is_empty(), "{} has no examples", rule.name);
    }
}

#[test]
fn a_wrong_example_fails_the_load_naming_the_rule() {
    let bad = DEFAULT_RULES.replacen(
        "allowed = [\"gvisor\", \"microvm\"]\n  minimum = \"gvisor\"",
        "allowed = [\"container\", \"gvisor\", \"microvm\"]\n  minimum = \"gvisor\"",
        1,
    );
    assert_ne!(bad, DEFAULT_RULES);
    let err = Rules::from_toml(&bad).err().map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(err.contains("untrusted-needs-kernel-boundary"), "{err}");
    assert!(err.contains("example 1"), "{err}");

    let bad = DEFAULT_RULES.replacen(
        "refused_by = \"network-needs-allow-list\"",
        "chosen = \"container\"",
        1,
    );
    let err = Rules::from_toml(&bad)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("network-needs-allow-list"), "{err}");
    assert!(err.contains("refuse"), "{err}");
}

#[test]
fn a_rule_cannot_grant_credentials_or_anything_unknown() {
    let bad = DEFAULT_RULES.replacen(
        "require_allow_list = true",
        "require_allow_list = true\nambient_credentials = true",
        1,
    );
    let err = Rules::from_toml(&bad)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("ambient_credentials"), "{err}");
    // And every decision says so.
    let d = rules().decide(&req(T::Trusted, A::Compute), &Host::all_available());
    assert!(d.is_ok_and(|d| !d.ambient_credentials));
}

#[test]
fn bad_files_are_refused() {
    let e = Rules::from_toml("version = 2\nrevision='x'\nstrength=[]\n[auto]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("version 2"), "{e}");
    let missing = DEFAULT_RULES.replacen(
        "strength = [\"runtime\", \"container\", \"wasm\", \"gvisor\", \"microvm\"]",
        "strength = [\"runtime\", \"container\", \"wasm\", \"gvisor\"]",
        1,
    );
    let e = Rules::from_toml(&missing)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("missing: microvm"), "{e}");
    // A second rule of the same name; a file rule named like one of the decider's own
    // (it would be read back as that one).
    for (name, refused) in [
        ("no-ambient-credentials", "two rules"),
        ("tier-available", "the decider's own"),
        ("policy", "the decider's own"),
    ] {
        let text = format!(
            "{DEFAULT_RULES}\n[[rules]]\nname = {name:?}\nwhy = \"x\"\nfix = \"y\"\n[[rules.examples]]\ntrust = \"trusted\"\nautonomy = \"compute\"\n"
        );
        let e = Rules::from_toml(&text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(refused), "{name}: {e}");
    }
    assert!(matches!(
        Rules::from_toml("not toml ["),
        Err(LoadError::Parse(_))
    ));
}

#[test]
fn minimum_and_allowed_for_every_trust_and_autonomy() {
    let r = rules();
    let host = Host::all_available();
    let cases = [
        (T::Trusted, A::Compute, Tier::Runtime, 5),
        (T::Trusted, A::ReadFiles, Tier::Container, 3),
        (T::Trusted, A::WriteFiles, Tier::Container, 3),
        (T::Untrusted, A::Compute, Tier::Wasm, 3),
        (T::Untrusted, A::ReadFiles, Tier::Gvisor, 2),
        (T::Untrusted, A::WriteFiles, Tier::Gvisor, 2),
    ];
    for (t, a, min, n) in cases {
        let d = r.decide(&req(t, a), &host);
        let d = d.unwrap_or_else(|e| panic!("{t} {a}: {e}"));
        assert_eq!(d.minimum, min, "{t} {a}");
        assert_eq!(d.allowed.len(), n, "{t} {a}: {:?}", d.allowed);
        assert!(
            d.reasons
                .iter()
                .any(|x| x.rule.as_str() == "no-ambient-credentials")
        );
    }
    for t in [T::Trusted, T::Untrusted] {
        for a in [A::InstallPackages, A::Internet] {
            let mut q = req(t, a);
            q.allow_hosts = vec![pat("pypi.org")];
            let d = r
                .decide(&q, &host)
                .unwrap_or_else(|e| panic!("{t} {a}: {e}"));
            assert!(!d.allowed.contains(&Tier::Wasm) && !d.allowed.contains(&Tier::Runtime));
            assert_eq!(d.allowed.contains(&Tier::Container), t == T::Trusted);
            assert_eq!(d.egress_allow, vec![pat("pypi.org")]);
        }
    }
}

#[test]
fn below_the_minimum_is_refused_naming_rule_and_fix() {
    let r = rules();
    let host = Host::all_available();
    let mut q = req(T::Untrusted, A::WriteFiles);
    q.tier = TierChoice::Tier(Tier::Container);
    let e = r
        .decide(&q, &host)
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(
        e.rule,
        RuleId::Named("untrusted-needs-kernel-boundary".into())
    );
    assert!(
        e.message.contains("below the minimum gvisor"),
        "{}",
        e.message
    );
    assert!(e.fix.contains("--tier gvisor"), "{}", e.fix);
    assert!(e.fix.contains("allowed here: gvisor, microvm"), "{}", e.fix);
    assert!(e.to_string().contains("untrusted-needs-kernel-boundary"));

    q.tier = TierChoice::Tier(Tier::Runtime);
    let e = r
        .decide(&q, &host)
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(
        e.rule,
        RuleId::Named("untrusted-needs-kernel-boundary".into())
    );

    let mut q = req(T::Trusted, A::WriteFiles);
    q.tier = TierChoice::Tier(Tier::Runtime);
    let e = r
        .decide(&q, &host)
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(
        e.rule,
        RuleId::Named("runtime-only-for-trusted-compute".into())
    );
    assert!(e.message.contains("below the minimum container"));

    // Above the minimum but not fitting: wasm for file work.
    q.tier = TierChoice::Tier(Tier::Wasm);
    let e = r
        .decide(&q, &host)
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(e.rule, RuleId::Named("wasm-is-pure-computation".into()));
    assert!(e.message.contains("not allowed"), "{}", e.message);

    // At or above the minimum: fine.
    q.tier = TierChoice::Tier(Tier::Microvm);
    assert_eq!(
        r.decide(&q, &host).map(|d| d.chosen).ok(),
        Some(Tier::Microvm)
    );
}

#[test]
fn network_without_allow_list_is_refused() {
    let r = rules();
    let mut q = req(T::Trusted, A::Internet);
    q.tier = TierChoice::Tier(Tier::Container);
    let e = r.decide(&q, &Host::all_available()).err();
    let e = e.unwrap_or_else(|| panic!("allowed"));
    assert_eq!(e.rule, RuleId::Named("network-needs-allow-list".into()));
    assert!(e.fix.contains("--allow-host"));
    q.allow_hosts = vec![pat("*:443")];
    assert!(r.decide(&q, &Host::all_available()).is_err());
    q.allow_hosts = vec![pat("api.example.test")];
    assert!(r.decide(&q, &Host::all_available()).is_ok());
}

#[test]
fn auto_picks_differently_when_availability_differs() {
    let r = rules();
    let q = req(T::Untrusted, A::Compute);
    let pick = |avail: &[Tier]| {
        r.decide(&q, &Host::with_available(avail.iter().copied()))
            .map(|d| d.chosen)
            .map_err(|e| e.rule.clone())
    };
    assert_eq!(pick(&Tier::ALL), Ok(Tier::Wasm));
    assert_eq!(
        pick(&[Tier::Container, Tier::Gvisor, Tier::Microvm]),
        Ok(Tier::Gvisor)
    );
    assert_eq!(pick(&[Tier::Container, Tier::Microvm]), Ok(Tier::Microvm));
    // Only tiers the policy rules out: refused, naming the fix.
    let e = r
        .decide(&q, &Host::with_available([Tier::Runtime, Tier::Container]))
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(e.rule, RuleId::TierAvailable);
    assert!(e.message.contains("wasm, gvisor, microvm"), "{}", e.message);
    assert!(e.fix.contains("cordon doctor"));

    // Trusted file work on a host with only container vs only microvm.
    let q = req(T::Trusted, A::WriteFiles);
    let d = r.decide(&q, &Host::with_available([Tier::Container]));
    assert_eq!(d.map(|d| d.chosen).ok(), Some(Tier::Container));
    let d = r.decide(&q, &Host::with_available([Tier::Microvm, Tier::Gvisor]));
    assert_eq!(d.map(|d| d.chosen).ok(), Some(Tier::Gvisor));
}

#[test]
fn requested_but_unavailable_tier_is_refused() {
    let r = rules();
    let mut q = req(T::Untrusted, A::WriteFiles);
    q.tier = TierChoice::Tier(Tier::Microvm);
    let e = r
        .decide(&q, &Host::with_available([Tier::Gvisor]))
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    assert_eq!(e.rule, RuleId::TierAvailable);
    assert!(e.fix.contains("available here: gvisor"), "{}", e.fix);
}

#[test]
fn bench_figures_reorder_auto_and_shape_changes_static_order() {
    let r = rules();
    let q = req(T::Untrusted, A::WriteFiles);
    let mut host = Host::with_available([Tier::Gvisor, Tier::Microvm]);
    let d = r.decide(&q, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((d.chosen, d.ranking.by), (Tier::Gvisor, RankedBy::Static));
    let mut long = q.clone();
    long.shape = S::OneLong;
    let d = r.decide(&long, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.chosen, Tier::Microvm);

    let json = r#"{"schema":"cordon-bench/1","created_unix":1,"figures":[
        {"subject":"host","kind":"peer","median_us":1000},
        {"subject":"gvisor","kind":"tier","median_us":150000},
        {"subject":"microvm","kind":"tier","median_us":40000},
        {"subject":"microvm","kind":"tier","median_us":45000}]}"#;
    host.bench = BenchFigures::from_bench_json(json).ok();
    assert_eq!(
        host.bench
            .as_ref()
            .map(|b| b.median_us.get(&Tier::Microvm).copied()),
        Some(Some(40000))
    );
    let d = r.decide(&q, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((d.chosen, d.ranking.by), (Tier::Microvm, RankedBy::Bench));
    assert_eq!(d.ranking.order, vec![Tier::Microvm, Tier::Gvisor]);
    // A measured tier outranks an unmeasured one; unmeasured ones follow the static order.
    host.bench =
        BenchFigures::from_bench_json(r#"{"schema":"cordon-bench/1","created_unix":1,"figures":[{"subject":"microvm","kind":"tier","median_us":9}]}"#).ok();
    let d = r.decide(&q, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.ranking.order, vec![Tier::Microvm, Tier::Gvisor]);
    assert!(BenchFigures::from_bench_json("{}").is_err());
    // A tier's own row stands for it even when a whole-CLI row of it measured faster (a
    // loaded host): before, the fastest row of any kind won. Without an own row, the
    // fastest other row of the tier counts.
    let json = r#"{"schema":"cordon-bench/1","created_unix":1,"figures":[
        {"subject":"cordon-run","kind":"cli","tier":"container","median_us":80000},
        {"subject":"container","kind":"tier","tier":"container","median_us":300000},
        {"subject":"cordon-run-gvisor","kind":"cli","tier":"gvisor","median_us":200000},
        {"subject":"cordon-run-gvisor-2","kind":"cli","tier":"gvisor","median_us":150000}]}"#;
    let b = BenchFigures::from_bench_json(json).unwrap();
    assert_eq!(b.median_us.get(&Tier::Container), Some(&300000));
    assert_eq!(b.median_us.get(&Tier::Gvisor), Some(&150000));
}

#[test]
fn each_figure_keeps_its_own_date_and_explain_shows_its_age() {
    let r = rules();
    let q = req(T::Untrusted, A::WriteFiles);
    let now = cordon_core::units::unix_now();
    // gvisor measured by this bench run; microvm kept from a run three days before (a row
    // with its own date), and a row without one takes the document's date.
    let json = format!(
        r#"{{"schema":"cordon-bench/1","created_unix":{now},"figures":[
            {{"subject":"gvisor","kind":"tier","median_us":150000}},
            {{"subject":"microvm","kind":"tier","median_us":40000,"measured_unix":{}}}]}}"#,
        now - 3 * 86_400
    );
    let host = Host {
        available: [Tier::Gvisor, Tier::Microvm].into_iter().collect(),
        bench: BenchFigures::from_bench_json(&json).ok(),
    };
    let d = r.decide(&q, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.chosen, Tier::Microvm);
    assert_eq!(
        d.ranking.measured_unix,
        [(Tier::Gvisor, now), (Tier::Microvm, now - 3 * 86_400)]
            .into_iter()
            .collect()
    );
    let text = d.to_string();
    assert!(
        text.contains("microvm 40.0 ms measured 3 d ago < gvisor 150.0 ms measured just now"),
        "{text}"
    );
    // Decisions from before dates were kept still read back.
    let mut old = serde_json::to_value(&d).unwrap_or_default();
    old["ranking"]
        .as_object_mut()
        .map(|r| r.remove("measured_unix"));
    let back: Decision = serde_json::from_value(old).unwrap_or_else(|e| panic!("{e}"));
    assert!(back.ranking.measured_unix.is_empty());
}

#[test]
fn decisions_and_refusals_serialize_round_trip() {
    let r = rules();
    let mut q = req(T::Untrusted, A::Internet);
    q.allow_hosts = vec![pat("api.example.test")];
    let d = r
        .decide(&q, &Host::all_available())
        .unwrap_or_else(|e| panic!("{e}"));
    let s = serde_json::to_string(&d).unwrap_or_default();
    let back: Decision = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"));
    assert_eq!(back, d);
    let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
    assert_eq!(v["chosen"], "gvisor");
    assert_eq!(v["request"]["autonomy"], "internet");
    assert_eq!(v["request"]["tier"], "auto");
    let text = d.to_string();
    assert!(text.contains("minimum tier: gvisor"), "{text}");
    assert!(text.contains("network-needs-allow-list"), "{text}");

    q.allow_hosts.clear();
    let e = r
        .decide(&q, &Host::all_available())
        .err()
        .unwrap_or_else(|| panic!("allowed"));
    let s = serde_json::to_string(&e).unwrap_or_default();
    let back: Refusal = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"));
    assert_eq!(back, *e);
}

/// Bounded fuzzing of the rules loader and of decisions under rules it accepts
/// (docs/fuzzing.md); `CORDON_FUZZ_CASES` runs longer campaigns.
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::config;
    use proptest::prelude::*;

    fn tier_name() -> impl Strategy<Value = String> {
        prop_oneof![
            9 => prop::sample::select(Tier::ALL.to_vec()).prop_map(|t| t.as_str().to_string()),
            1 => "[a-z]{0,4}",
        ]
    }

    fn list(item: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
        prop::collection::vec(item, 0..6).prop_map(|v| {
            let q: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
            format!("[{}]", q.join(", "))
        })
    }

    /// A permutation of the tiers, sometimes with one missing or repeated.
    fn order() -> impl Strategy<Value = String> {
        let all: Vec<String> = Tier::ALL.iter().map(|t| t.as_str().to_string()).collect();
        (Just(all).prop_shuffle(), 0u8..24, tier_name()).prop_map(|(mut v, damage, extra)| {
            match damage {
                0 => {
                    v.pop();
                }
                1 => v.push(extra),
                _ => {}
            }
            let q: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
            format!("[{}]", q.join(", "))
        })
    }

    fn matcher() -> impl Strategy<Value = String> {
        let trust = prop::sample::select(Trust::ALL.to_vec()).prop_map(|t| t.as_str().to_string());
        let autonomy =
            prop::sample::select(Autonomy::ALL.to_vec()).prop_map(|a| a.as_str().to_string());
        let shape = prop::sample::select(Shape::ALL.to_vec()).prop_map(|s| s.as_str().to_string());
        (
            proptest::option::of(list(trust)),
            proptest::option::of(list(autonomy)),
            proptest::option::of(list(shape)),
        )
            .prop_map(|(t, a, s)| {
                let mut parts = Vec::new();
                if let Some(t) = t {
                    parts.push(format!("trust = {t}"));
                }
                if let Some(a) = a {
                    parts.push(format!("autonomy = {a}"));
                }
                if let Some(s) = s {
                    parts.push(format!("shape = {s}"));
                }
                format!("{{ {} }}", parts.join(", "))
            })
    }

    fn rule() -> impl Strategy<Value = String> {
        (
            "[a-z-]{0,6}",
            matcher(),
            proptest::option::of(matcher()),
            proptest::option::of(list(tier_name())),
            list(tier_name()),
            any::<bool>(),
            (any::<bool>(), any::<bool>(), prop_oneof![9 => Just(String::new()), 1 => "[a-z]{1,3}"]),
        )
            .prop_map(|(name, when, unless, allow, deny, require, (t, ex, junk))| {
                let mut r = format!(
                    "[[rules]]\nname = {name:?}\nwhy = \"w\"\nfix = \"f\"\nwhen = {when}\ndeny = {deny}\nrequire_allow_list = {require}\n"
                );
                if let Some(u) = unless {
                    r.push_str(&format!("unless = {u}\n"));
                }
                if let Some(a) = allow {
                    r.push_str(&format!("allow = {a}\n"));
                }
                if !junk.is_empty() {
                    r.push_str(&format!("{junk} = 1\n"));
                }
                if ex {
                    let trust = if t { "trusted" } else { "untrusted" };
                    r.push_str(&format!(
                        "[[rules.examples]]\ntrust = \"{trust}\"\nautonomy = \"compute\"\nallow_hosts = [\"a.test\"]\n"
                    ));
                }
                r
            })
    }

    /// A rules file: mostly well-formed, with the damage a hand edit may do.
    fn rules_file() -> impl Strategy<Value = String> {
        (0u32..8, order(), order(), order(), prop::collection::vec(rule(), 0..5)).prop_map(
            |(version, strength, many, one, rules)| {
                let version = if version == 0 { 2 } else { 1 };
                format!(
                    "version = {version}\nrevision = \"fuzz\"\nstrength = {strength}\n[auto]\nmany-short = {many}\none-long = {one}\n{}",
                    rules.join("\n")
                )
            },
        )
    }

    fn request() -> impl Strategy<Value = Request> {
        (
            prop::sample::select(Trust::ALL.to_vec()),
            prop::sample::select(Autonomy::ALL.to_vec()),
            prop::sample::select(Shape::ALL.to_vec()),
            prop::collection::vec(
                prop_oneof![Just("*"), Just("a.test"), Just("*.b.test:443")],
                0..3,
            ),
            proptest::option::of(prop::sample::select(Tier::ALL.to_vec())),
        )
            .prop_map(|(trust, autonomy, shape, hosts, tier)| Request {
                trust,
                autonomy,
                shape,
                allow_hosts: cordon_core::egress::parse_patterns(&hosts).unwrap_or_default(),
                tier: tier.map(TierChoice::Tier).unwrap_or_default(),
            })
    }

    fn host() -> impl Strategy<Value = Host> {
        (
            prop::sample::subsequence(Tier::ALL.to_vec(), 0..=Tier::ALL.len()),
            proptest::option::of(prop::collection::btree_map(
                prop::sample::select(Tier::ALL.to_vec()),
                any::<u64>(),
                0..5,
            )),
        )
            .prop_map(|(available, bench)| Host {
                available: available.into_iter().collect(),
                bench: bench.map(|median_us| BenchFigures {
                    median_us,
                    measured_unix: BTreeMap::new(),
                }),
            })
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn arbitrary_text_never_panics_the_loader(text in prop_oneof![
            any::<String>(),
            (any::<usize>(), any::<String>()).prop_map(|(at, junk)| {
                // The shipped file with text spliced in at a char boundary.
                let mut cut = at % (DEFAULT_RULES.len() + 1);
                while !DEFAULT_RULES.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("{}{junk}{}", &DEFAULT_RULES[..cut], &DEFAULT_RULES[cut..])
            }),
        ]) {
            let _ = Rules::from_toml(&text);
        }

        /// Whatever rules load, every decision keeps its own promises: the chosen tier is
        /// allowed and available, nothing an applied rule removed is allowed, and a rule that
        /// asks for an allow-list is never passed without one.
        #[test]
        fn decisions_under_any_loaded_rules_are_consistent(
            text in rules_file(),
            reqs in prop::collection::vec((request(), host()), 1..12),
        ) {
            let Ok(rules) = Rules::from_toml(&text) else {
                return Ok(());
            };
            for (req, host) in reqs {
                let applied: Vec<&Rule> = rules.rules.iter().filter(|r| r.applies(&req)).collect();
                let Ok(d) = rules.decide(&req, &host) else {
                    continue;
                };
                prop_assert!(d.allowed.contains(&d.chosen), "{text}\n{req:?}: {d:?}");
                prop_assert!(host.available.contains(&d.chosen), "{text}\n{req:?}: {d:?}");
                prop_assert_eq!(d.allowed.first(), Some(&d.minimum));
                prop_assert!(d.available.iter().all(|t| d.allowed.contains(t) && host.available.contains(t)));
                for r in &applied {
                    prop_assert!(d.allowed.iter().all(|t| !r.removes(*t)), "{} kept a tier it removes", r.name);
                    prop_assert!(!r.require_allow_list || req.has_explicit_allow_list());
                }
                if let TierChoice::Tier(t) = req.tier {
                    prop_assert_eq!(d.chosen, t);
                }
                prop_assert!(!d.ambient_credentials);
            }
        }
    }
}
