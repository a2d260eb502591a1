use super::*;
use crate::ceiling::GrantEntry;
use crate::request::GrantName;

fn gate(ceiling: &str, grants: &str) -> Gate {
    #[derive(serde::Deserialize)]
    struct F {
        #[serde(default)]
        grant: Vec<GrantEntry>,
    }
    let ceiling: CeilingConfig = toml::from_str(ceiling).unwrap();
    let entries = toml::from_str::<F>(grants).unwrap().grant;
    Gate::new(
        GateSettings::default(),
        ceiling,
        Arc::new(Catalogue::load(&entries, None).unwrap()),
        RulesSource::Shipped,
        None,
    )
    .with_tiers(Tier::ALL.into_iter().collect(), Vec::new())
}

fn alice() -> Principal {
    Principal::Tenant("alice".into())
}

fn req(json: &str) -> SandboxRequest {
    serde_json::from_str(json).unwrap()
}

/// A request naming a template gets it resolved onto its spec, and the audit record
/// names it and its digest; a tier it does not serve, an unknown name and a server
/// without a store are refused with what to do.
#[test]
fn a_template_is_resolved_and_recorded() {
    let home = tempfile::tempdir().unwrap();
    let store = cordon_template::Store::open(home.path()).unwrap();
    let file = home.path().join("i.tar");
    std::fs::write(
        &file,
        cordon_testkit::image::hostile_image(None).oci_tar(false),
    )
    .unwrap();
    let m = store
        .import(&file, "tools", &cordon_template::ImportLimits::default())
        .unwrap()
        .manifest;
    let g = gate("", "").with_templates(store);
    let op = |tier: &str| {
        let body = format!(r#"{{"tier":"{tier}","template":"tools"}}"#);
        g.admit(&Principal::Operator, &req(&body), "create")
    };
    let adm = op("container").unwrap();
    let t = adm.spec.resolved_template.as_ref().unwrap();
    assert_eq!(t.digest, m.digest);
    assert_eq!(adm.spec.template.as_deref(), Some("tools"));
    let rec = serde_json::to_value(&adm.record).unwrap();
    assert_eq!(rec["template"]["name"], "tools");
    assert_eq!(rec["template"]["digest"], m.digest.as_str());
    let d = op("wasm").unwrap_err();
    assert_eq!(d.rule.as_str(), "template-tier");
    assert_eq!(d.record.template.as_ref().unwrap().digest, m.digest);
    let d = g
        .admit(&alice(), &req(r#"{"template":"nope"}"#), "create")
        .unwrap_err();
    assert!(d.message.contains("cordon template ls"), "{}", d.message);
    assert!(!d.message.contains(&home.path().display().to_string()));
    let d = g
        .admit(&alice(), &req(r#"{"template":"../x"}"#), "create")
        .unwrap_err();
    assert_eq!(d.code, DenyCode::InvalidRequest);
    let d = gate("", "")
        .admit(&alice(), &req(r#"{"template":"tools"}"#), "create")
        .unwrap_err();
    assert_eq!(d.rule.as_str(), "template");
}

const GRANTS: &str = r#"
        [[grant]]
        name = "github"
        secret = { env = "PATH" }
        hosts = ["api.github.test"]
        tenants = ["alice"]
        max_lifetime = "2m"
        [[grant]]
        name = "bobs"
        secret = { env = "PATH" }
        hosts = ["bob.test"]
        tenants = ["bob"]
    "#;

#[test]
fn requests_cannot_carry_secret_sources() {
    for body in [
        r#"{"grants": [{"name": "x", "env_var": "X", "secret": {"file": "/etc/shadow"}, "hosts": ["evil.test"]}]}"#,
        r#"{"grants": [{"secret": {"env": "AWS_SECRET_ACCESS_KEY"}}]}"#,
    ] {
        let e = serde_json::from_str::<SandboxRequest>(body)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a grant is named, not described"), "{e}");
        assert!(
            !e.contains("/etc/shadow") && !e.contains("AWS_SECRET"),
            "{e}"
        );
    }
}

#[test]
fn the_default_ceiling_refuses_every_attack_with_its_rule() {
    let g = gate("", GRANTS);
    let table: &[(&str, &str)] = &[
        (
            r#"{"tier": "container", "allow_hosts": ["127.0.0.1/32:7070"]}"#,
            "ceiling.egress",
        ),
        (
            r#"{"tier": "gvisor", "allow_hosts": ["169.254.169.254/32:80"]}"#,
            "ceiling.egress",
        ),
        (r#"{"allow_hosts": ["10.0.0.0/8:*"]}"#, "ceiling.egress"),
        (r#"{"allow_hosts": ["0.0.0.0/0:*"]}"#, "ceiling.egress"),
        (r#"{"tier": "runtime"}"#, "ceiling.tiers"),
        (
            r#"{"tier": "container"}"#,
            "untrusted-needs-kernel-boundary",
        ),
        (
            r#"{"tier": "container", "trust": "trusted"}"#,
            "ceiling.trust",
        ),
        (r#"{"grants": ["bobs"]}"#, "ceiling.grants"),
        (r#"{"grants": ["nope"]}"#, "ceiling.grants"),
        (
            r#"{"grants": ["github"], "ttl": "10m"}"#,
            "ceiling.grant_lifetime",
        ),
        (
            r#"{"limits": {"memory_bytes": 99999999999999}}"#,
            "ceiling.max_limits",
        ),
        (r#"{"allow_weaker": ["seccomp"]}"#, "ceiling.allow_weaker"),
    ];
    for (body, rule) in table {
        let d = g.admit(&alice(), &req(body), "create").unwrap_err();
        assert_eq!(d.rule.as_str(), *rule, "{body}: {}", d.message);
        assert_eq!(d.code, DenyCode::PolicyDenied, "{body}");
        assert!(!d.fix.is_empty());
        assert_eq!(d.record.rule.as_ref().map(GateRule::as_str), Some(*rule));
        assert_eq!(d.record.principal, "alice");
    }
}

#[test]
fn a_request_that_says_nothing_gets_a_kernel_boundary() {
    let g = gate("", GRANTS);
    let a = g.admit(&alice(), &req("{}"), "create").unwrap();
    assert!(a.spec.tier.features().own_kernel, "{:?}", a.spec.tier);
    assert_eq!(a.record.trust, Some(Trust::Untrusted));
    // Pure computation may run on wasm.
    let mut r = req("{}");
    r.workload = Workload::PureCode;
    let a = g.admit(&alice(), &r, "run").unwrap();
    assert_eq!(a.spec.tier, Tier::Wasm);
    // A trusted tenant keeps the server's default tier.
    let g = gate("[tenants.alice]\ntrust = \"trusted\"\n", GRANTS);
    let a = g.admit(&alice(), &req("{}"), "create").unwrap();
    assert_eq!(a.spec.tier, Tier::Container);
    let a = g
        .admit(&alice(), &req(r#"{"trust": "untrusted"}"#), "create")
        .unwrap();
    assert_ne!(
        a.spec.tier,
        Tier::Container,
        "lowering trust applies the rule"
    );
}

#[test]
fn catalogue_grants_resolve_and_count_as_egress() {
    let g = gate("", GRANTS);
    let a = g
        .admit(
            &alice(),
            &SandboxRequest {
                grants: vec![GrantName("github".into())],
                ..Default::default()
            },
            "create",
        )
        .unwrap();
    assert_eq!(a.spec.grants.len(), 1);
    assert_eq!(
        a.spec.grants[0].hosts,
        vec!["api.github.test".parse().unwrap()]
    );
    assert_eq!(a.ttl, Duration::from_secs(120), "capped by max_lifetime");
    assert_eq!(a.record.autonomy, Some(Autonomy::Internet));
    let d = a.decision.unwrap();
    assert!(
        d.egress_allow.contains(&"api.github.test".parse().unwrap()),
        "{d:?}"
    );
    assert_eq!(a.record.grants[0].name, "github");
    let json = serde_json::to_string(&a.record).unwrap();
    assert!(
        !json.contains("PATH") && !json.contains("/usr/bin"),
        "{json}"
    );
}

#[test]
fn the_operator_keeps_todays_defaults_with_the_same_checks() {
    let g = gate("", "");
    let op = Principal::Operator;
    let a = g.admit(&op, &req(r#"{"tier": "runtime"}"#), "run").unwrap();
    assert_eq!(a.spec.tier, Tier::Runtime);
    let a = g
        .admit(&op, &req(r#"{"allow_hosts": ["10.0.0.0/8:5432"]}"#), "run")
        .unwrap();
    assert_eq!(a.spec.tier, Tier::Container);
    let d = g
        .admit(
            &op,
            &req(r#"{"tier": "container", "trust": "untrusted", "autonomy": "compute"}"#),
            "run",
        )
        .unwrap_err();
    assert_eq!(d.rule.as_str(), "untrusted-needs-kernel-boundary");
    let d = g
        .admit(
            &op,
            &req(r#"{"tier": "wasm", "allow_hosts": ["x.test"]}"#),
            "run",
        )
        .unwrap_err();
    assert_eq!(d.rule.as_str(), "tier-network");
    let d = g
        .admit(&op, &req(r#"{"env": {"BAD NAME": "x"}}"#), "run")
        .unwrap_err();
    assert_eq!(d.code, DenyCode::InvalidRequest);
    // Inline grants are the operator's alone.
    let mut r = req("{}");
    r.inline_grants.push(cordon_core::Grant {
        name: "x".into(),
        env_var: "X_TOKEN".into(),
        secret: cordon_core::GrantSecret::value("0123456789"),
        hosts: vec!["x.test".parse().unwrap()],
        header: "authorization".into(),
        methods: vec![],
        path_prefixes: vec![],
    });
    assert_eq!(
        g.admit(&alice(), &r, "create").unwrap_err().rule,
        GateRule::CeilingGrants
    );
}

#[test]
fn a_ceiling_opens_exactly_what_it_names() {
    let g = gate(
        r#"
            [tenants.alice]
            trust = "trusted"
            tiers = ["runtime", "container"]
            egress = ["10.1.0.0/16:5432", "*"]
            "#,
        "",
    );
    g.admit(
        &alice(),
        &req(r#"{"allow_hosts": ["10.1.2.3:5432"]}"#),
        "create",
    )
    .unwrap();
    let d = g
        .admit(
            &alice(),
            &req(r#"{"allow_hosts": ["10.1.2.3:22"]}"#),
            "create",
        )
        .unwrap_err();
    assert_eq!(d.rule.as_str(), "ceiling.egress");
    let a = g
        .admit(
            &alice(),
            &req(r#"{"tier": "runtime", "autonomy": "compute"}"#),
            "create",
        )
        .unwrap();
    assert_eq!(a.spec.tier, Tier::Runtime);
    assert_eq!(
        a.spec.limits.memory_bytes,
        64 << 20,
        "the heap cap, not 512 MiB"
    );
    let d = g
            .admit(
                &alice(),
                &req(r#"{"tier": "runtime", "autonomy": "compute", "limits": {"memory_bytes": 268435456}}"#),
                "create",
            )
            .unwrap_err();
    assert_eq!(d.rule.as_str(), "ceiling.runtime_heap");
    let d = g
        .admit(&alice(), &req(r#"{"tier": "gvisor"}"#), "create")
        .unwrap_err();
    assert_eq!(d.rule.as_str(), "ceiling.tiers");
}

/// Found by the fuzz harness below: the operator's ttl is not capped, and one past
/// what `SystemTime` can hold panicked the gate.
#[test]
fn an_operator_ttl_past_the_clock_is_refused_not_a_panic() {
    let g = gate("", GRANTS);
    let d = g
        .admit(
            &Principal::Operator,
            &req(r#"{"ttl": 18446744073709551615}"#),
            "create",
        )
        .unwrap_err();
    assert_eq!(d.code, DenyCode::InvalidRequest);
    assert!(d.message.contains("ttl"), "{}", d.message);
}

/// Bounded fuzzing of request bodies through the gate (docs/fuzzing.md): arbitrary
/// JSON never panics parsing or admission, and what is admitted is within the ceiling.
mod fuzz {
    use super::*;
    use cordon_testkit::fuzz::{CREATE_FIELDS, LIMIT_FIELDS, body, config};
    use proptest::prelude::*;

    const CEILING: &str = r#"
            [tenants.alice]
            trust = "trusted"
            tiers = ["runtime", "wasm", "container", "gvisor"]
            egress = ["*.ok.test", "10.1.0.0/16:443"]
            allow_weaker = ["seccomp"]
            [tenants.carol]
            tiers = ["container"]
            egress = []
        "#;

    fn check_admitted(g: &Gate, who: &Principal, req: &SandboxRequest, a: &Admission) {
        let spec = &a.spec;
        assert!(spec.validate().is_ok(), "{req:?} admitted an invalid spec");
        let Principal::Tenant(t) = who else {
            return;
        };
        let rules = g.rules_for(who);
        assert!(
            rules.tiers.contains(&spec.tier),
            "{t}: tier {} outside the ceiling",
            spec.tier
        );
        assert!(
            g.check_max_limits(&spec.limits).is_ok(),
            "{t}: {:?}",
            spec.limits
        );
        let s = g.settings();
        assert!(
            !a.ttl.is_zero() && a.ttl <= s.max_ttl && !a.idle.is_zero(),
            "{t}: {a:?}"
        );
        for h in &spec.egress.allow {
            assert!(rules.egress.check(h).is_ok(), "{t}: {h} let through");
        }
        assert!(
            spec.allow_weaker
                .iter()
                .all(|w| rules.allow_weaker.contains(w)),
            "{t}: {spec:?}"
        );
        if rules.trust == Trust::Untrusted {
            assert_eq!(a.record.trust, Some(Trust::Untrusted), "{t}: trust raised");
        }
        if !spec.tier.features().network {
            assert!(
                spec.egress.allow.is_empty() && spec.grants.is_empty(),
                "{t}: {spec:?}"
            );
        }
        for gr in &spec.grants {
            assert!(
                g.catalogue().entry(&gr.name, t).is_some(),
                "{t}: grant {} is not theirs",
                gr.name
            );
        }
        assert_eq!(spec.owner.as_deref(), Some(t.as_str()));
    }

    proptest! {
        #![proptest_config(config(1024))]

        #[test]
        fn any_body_is_parsed_and_admitted_within_the_ceiling(body in body(CREATE_FIELDS.to_vec(), ("limits", LIMIT_FIELDS))) {
            let Ok(req) = serde_json::from_slice::<SandboxRequest>(&body) else {
                return Ok(());
            };
            let g = gate(CEILING, GRANTS);
            for who in [alice(), Principal::Tenant("bob".into()), Principal::Tenant("carol".into()), Principal::Operator] {
                if let Ok(a) = g.admit(&who, &req, "create") {
                    check_admitted(&g, &who, &req, &a);
                }
            }
        }
    }
}
