//! `cordon run`: one execution in a fresh sandbox.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use cordon_core::units::{format_duration, format_size, parse_duration, parse_size};
use cordon_core::{
    Command, ExecOutcome, ExecRequest, FileIn, Grant, GrantSecret, Language, OutputStream, Tier,
    Weakening, exit_code_for, run_once,
};
use cordon_engine::{
    Admission, Gate, GateSettings, LimitsPatch, Principal, RulesSource, SandboxRequest,
};

/// The tiers of the binary `cordon run` runs in: the front carries the container tier alone
/// (and hands runs that need more to `cordon-full` before they get here); `cordon-full`
/// carries every tier and the policy step's audit (crate `cordon-tiers`, a feature per tier).
pub use cordon_tiers::Tiers;

#[derive(Args, Debug)]
#[command(after_help = "\
EXIT STATUS
  The program's own exit status; 128+N when a signal N ended it; otherwise one code per
  reason: timeout 124, out-of-memory 137, process-limit 122, output-limit 121,
  disk-limit 120, killed 143, sandbox-failure 125. Cordon's own errors (bad flags, a tier
  that is unavailable, a wall that cannot be applied) also exit 125.

EXAMPLES
  cordon run --lang python -c 'print(2+2)'
  cordon run --lang bash --timeout 5s --memory 256M --pids 64 --disk 64M \\
             --file data.csv:/work/data.csv --out /work/result.json:./result.json \\
             -- 'wc -l data.csv > result.json'
  cordon run --json -- ls -la /")]
pub struct RunArgs {
    /// Isolation tier, or auto (default: container, wasm with --wasm; with --trust and
    /// --autonomy the policy decides, auto by default).
    #[arg(long)]
    tier: Option<cordon_policy::TierChoice>,
    /// Trust, autonomy and shape of the work: the policy picks the tier or refuses.
    #[command(flatten)]
    policy: crate::PolicyInput,
    /// Language of the code (python, bash, sh, javascript). Without it, the arguments after
    /// `--` are a program and its arguments, run without a shell.
    #[arg(long)]
    lang: Option<Language>,
    /// The code to run (with --lang).
    #[arg(short = 'c', long = "code", value_name = "CODE")]
    code: Option<String>,
    /// Read the code from a host file (with --lang).
    #[arg(long, value_name = "FILE", conflicts_with = "code")]
    script: Option<PathBuf>,
    /// Run a WebAssembly program (a WASI preview 1 command module or preview 2 command
    /// component) in the wasm tier; the arguments after `--` are its arguments.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["code", "script", "lang"])]
    wasm: Option<PathBuf>,
    /// Wall-clock limit, e.g. 5s, 250ms, 2m.
    #[arg(long, value_parser = parse_duration_arg)]
    timeout: Option<std::time::Duration>,
    /// Memory limit of the whole sandbox, e.g. 256M.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Most processes and threads at once.
    #[arg(long)]
    pids: Option<u32>,
    /// Size of the writable workspace /work, e.g. 64M.
    #[arg(long, value_parser = parse_size)]
    disk: Option<u64>,
    /// Size of /tmp, e.g. 64M.
    #[arg(long, value_parser = parse_size)]
    tmp: Option<u64>,
    /// CPU quota in CPUs, e.g. 0.5 or 2.
    #[arg(long)]
    cpus: Option<f64>,
    /// Most bytes kept of stdout and of stderr; more stops the program (output-limit).
    #[arg(long, value_parser = parse_size)]
    output_limit: Option<u64>,
    /// Environment for the program, KEY=VALUE (repeatable). Nothing else of the host's
    /// environment enters the sandbox.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Copy a host file in: HOST_PATH:SANDBOX_PATH (under /work; repeatable).
    #[arg(long = "file", value_name = "HOST:SANDBOX")]
    files: Vec<String>,
    /// Mount a volume (`cordon volume create`) at a path under /work: NAME:/work/PATH,
    /// read-write (this run's alone), or NAME:/work/PATH:ro (read-only; many may). Repeatable.
    #[arg(long = "volume", value_name = "NAME:/work/PATH[:ro]")]
    volumes: Vec<String>,
    /// Copy a file out after the run: SANDBOX_PATH:HOST_PATH (repeatable). Paths outside
    /// /work and symlinks are refused.
    #[arg(long = "out", value_name = "SANDBOX:HOST")]
    outs: Vec<String>,
    /// Largest file taken out, e.g. 16M.
    #[arg(long, value_parser = parse_size, default_value = "16M")]
    max_out_file: u64,
    /// Feed this host file to the program's stdin ('-' for Cordon's own stdin).
    #[arg(long, value_name = "FILE")]
    stdin: Option<String>,
    /// Let the sandbox reach this host through Cordon's egress proxy: `host`, `*.suffix`,
    /// optionally `:port` (default ports 80 and 443; `:*` for any). Repeatable. Without any,
    /// the sandbox reaches nothing.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_hosts: Vec<String>,
    /// Refuse this host even if an allow entry matches (deny wins). Repeatable.
    #[arg(long = "deny-host", value_name = "PATTERN")]
    deny_hosts: Vec<String>,
    /// A scoped credential: NAME=HOST[,HOST...][@ENV_VAR]. The sandbox's NAME_TOKEN (upper
    /// case) holds a placeholder; the egress proxy puts the real secret, read from the host's
    /// ENV_VAR (default NAME_TOKEN), into the Authorization header of HTTPS requests to those
    /// hosts only. The real secret never enters the sandbox. Repeatable.
    #[arg(long = "grant", value_name = "NAME=HOSTS")]
    grants: Vec<String>,
    /// Run even if this wall cannot be applied (landlock, seccomp, cgroups); the result is
    /// marked weaker. Repeatable.
    #[arg(long = "allow-weaker", value_name = "LAYER")]
    allow_weaker: Vec<Weakening>,
    /// Make the sandbox's root from this template (`cordon template ls`): its files, its
    /// image's environment; read-only, with /work and /tmp writable as always.
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// Print one JSON object (exit, signal, termination, stdout, stderr, usage, timings)
    /// instead of streaming output.
    #[arg(long)]
    json: bool,
    /// The code (with --lang and no -c) followed by its arguments, or a program and its
    /// arguments.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s)
}

fn split_pair<'a>(s: &'a str, what: &str) -> Result<(&'a str, &'a str)> {
    s.split_once(':')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .ok_or_else(|| anyhow!("{what} {s:?} must look like FROM:TO"))
}

fn build_request(args: &RunArgs) -> Result<ExecRequest> {
    if let Some(p) = &args.wasm {
        let module =
            std::fs::read(p).with_context(|| format!("reading the module {}", p.display()))?;
        return stdin_for(args, ExecRequest::wasm(module, args.args.clone()));
    }
    let command = match args.lang {
        Some(language) => {
            let (source, rest) = if let Some(c) = &args.code {
                (c.clone(), args.args.clone())
            } else if let Some(p) = &args.script {
                let src = std::fs::read_to_string(p)
                    .with_context(|| format!("reading the script {}", p.display()))?;
                (src, args.args.clone())
            } else if let Some((first, rest)) = args.args.split_first() {
                (first.clone(), rest.to_vec())
            } else {
                bail!("no code given: pass -c CODE, --script FILE, or the code after --");
            };
            Command::Code {
                language,
                source,
                args: rest,
            }
        }
        None => {
            if args.code.is_some() || args.script.is_some() {
                bail!("-c and --script need --lang (python, bash, sh or javascript)");
            }
            if args.args.is_empty() {
                bail!("nothing to run: give --lang and code, or a program after --");
            }
            Command::Argv(args.args.clone())
        }
    };
    stdin_for(args, ExecRequest::new(command))
}

fn stdin_for(args: &RunArgs, mut req: ExecRequest) -> Result<ExecRequest> {
    if let Some(s) = &args.stdin {
        let mut data = Vec::new();
        if s == "-" {
            std::io::stdin()
                .read_to_end(&mut data)
                .context("reading stdin")?;
        } else {
            data = std::fs::read(s).with_context(|| format!("reading {s} for stdin"))?;
        }
        req.stdin = Some(data);
    }
    Ok(req)
}

fn parse_grant(s: &str) -> Result<Grant> {
    let (name, rest) = s
        .split_once('=')
        .filter(|(n, r)| !n.is_empty() && !r.is_empty())
        .ok_or_else(|| anyhow!("--grant {s:?} must look like NAME=HOST[,HOST...][@ENV_VAR]"))?;
    let var = format!("{}_TOKEN", name.to_ascii_uppercase().replace('-', "_"));
    let (hosts, secret_var) = match rest.split_once('@') {
        Some((h, v)) => (h, v.to_string()),
        None => (rest, var.clone()),
    };
    // The local user is the operator: the secret comes from this process's environment,
    // which the operator controls; the sandbox gets a placeholder only.
    let value = std::env::var_os(&secret_var).ok_or_else(|| {
        anyhow!(
            "--grant {name}: the host environment variable {secret_var} is not set; export it before `cordon run`"
        )
    })?;
    Ok(Grant {
        name: name.to_string(),
        env_var: var,
        secret: GrantSecret::value(value.into_encoded_bytes()),
        hosts: (hosts.split(',').filter(|h| !h.is_empty()))
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("--grant {name}: {e}"))?,
        header: "authorization".to_string(),
        methods: Vec::new(),
        path_prefixes: Vec::new(),
    })
}

fn tier_of(args: &RunArgs) -> Tier {
    match args.tier {
        Some(cordon_policy::TierChoice::Tier(t)) => t,
        _ if args.wasm.is_some() => Tier::Wasm,
        _ => Tier::Container,
    }
}

/// Whether a tier can run this kind of request at all (its features: a module, code in
/// the language, or a program), so `auto` never picks one that cannot.
fn tier_fits(args: &RunArgs, tier: Tier) -> bool {
    let f = tier.features();
    match (&args.wasm, args.lang) {
        (Some(_), _) => f.wasm_modules,
        (None, Some(lang)) => f.runs(lang),
        (None, None) => f.programs,
    }
}

/// The one request `cordon run`'s flags make: the same type the HTTP API and MCP build.
fn sandbox_request(args: &RunArgs, exec: &ExecRequest) -> Result<SandboxRequest> {
    let mut limits = LimitsPatch {
        timeout_ms: args.timeout.map(|t| t.as_millis().max(1) as u64),
        memory_bytes: args.memory,
        pids: args.pids,
        disk_bytes: args.disk,
        tmp_bytes: args.tmp,
        cpus: args.cpus,
        ..LimitsPatch::default()
    };
    if let Some(v) = args.output_limit {
        limits.stdout_bytes = Some(v);
        limits.stderr_bytes = Some(v);
    }
    let mut env = std::collections::BTreeMap::new();
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv:?} must look like KEY=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    let mut inline_grants = Vec::new();
    for g in &args.grants {
        inline_grants.push(parse_grant(g)?);
    }
    let tier = match args.tier {
        None if args.wasm.is_some() => Some(cordon_policy::TierChoice::Tier(Tier::Wasm)),
        t => t,
    };
    Ok(SandboxRequest {
        tier,
        trust: args.policy.trust,
        autonomy: args.policy.autonomy,
        shape: args.policy.shape,
        limits,
        env,
        allow_hosts: args.allow_hosts.clone(),
        deny_hosts: args.deny_hosts.clone(),
        grants: Vec::new(),
        allow_weaker: args.allow_weaker.iter().copied().collect(),
        template: args.template.clone(),
        ttl: None,
        idle_timeout: None,
        on_timeout: Default::default(),
        labels: Default::default(),
        volumes: args
            .volumes
            .iter()
            .map(|v| {
                cordon_core::VolumeMount::parse_flag(v).map(|m| cordon_engine::VolumeRequest {
                    path: m.inside(),
                    name: m.name,
                    read_only: m.read_only,
                })
            })
            .collect::<cordon_core::Result<_>>()?,
        inline_grants,
        workload: cordon_engine::workload_of(
            &exec.command,
            !args.files.is_empty() || !args.outs.is_empty(),
        ),
    })
}

/// The local operator's gate: every tier, trust as the flags say, the same checks as the
/// server's (limits, egress entries, the tier policy when --trust and --autonomy are given).
fn local_gate(args: &RunArgs, req: &SandboxRequest, tiers: &Tiers) -> Result<Gate> {
    let rules = match &args.policy.policy {
        Some(p) => RulesSource::Text(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the policy file {}", p.display()))?,
        ),
        None => RulesSource::Shipped,
    };
    let policy_step = req.trust.is_some() || req.autonomy.is_some();
    let fits: Vec<Tier> = Tier::ALL
        .into_iter()
        .filter(|t| tier_fits(args, *t))
        .collect();
    let settings = GateSettings {
        default_tier: tier_of(args),
        ..GateSettings::default()
    };
    // The store is opened only when a template is named: a plain run touches no more of
    // the data dir than before.
    let templates = match &args.template {
        Some(_) => Some(
            cordon_template::Store::open(&crate::data_dir())
                .context("opening the template store")?,
        ),
        None => None,
    };
    let gate = |available: std::collections::BTreeSet<Tier>, bench| {
        let g = Gate::new(
            settings.clone(),
            cordon_engine::CeilingConfig::default(),
            std::sync::Arc::new(cordon_engine::Catalogue::empty()),
            rules.clone(),
            bench,
        )
        .with_tiers(available, Vec::new());
        match &templates {
            Some(t) => g.with_templates(t.clone()),
            None => g,
        }
    };
    if !policy_step {
        // No policy step: the tier asked for (or the default) is taken; its backend says
        // at create whether it can run here.
        return Ok(gate(Tier::ALL.into_iter().collect(), None));
    }
    // Decide as if every fitting tier were here first: a refusal by a rule needs no probe.
    let first = gate(fits.iter().copied().collect(), None);
    if let Err(d) = first.admit(&Principal::Operator, req, "cordon run")
        && d.rule != cordon_engine::GateRule::TIER_AVAILABLE
    {
        return Ok(first);
    }
    let host = tiers.probe_host(None, &fits, &crate::data_dir());
    Ok(gate(host.available, host.bench))
}

/// Prints a refusal on stderr (and as JSON on stdout with `json`); the exit status is 125.
fn report_denial(d: &cordon_engine::Denial, json: bool) -> Result<i32> {
    eprintln!("cordon: refused ({}): {}", d.rule, d.message);
    eprintln!("cordon: fix: {}", d.fix);
    if json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({
                "refused": {
                    "code": d.code,
                    "rule": d.rule,
                    "message": d.message,
                    "fix": d.fix,
                    "decision": d.record,
                }
            }))?
        );
    }
    Ok(125)
}

/// Passes a request through the local gate: the admitted spec and the policy's decision,
/// or the exit status of a refusal (printed).
fn admit(
    args: &RunArgs,
    tiers: &Tiers,
) -> Result<std::result::Result<(Admission, ExecRequest), i32>> {
    let exec = build_request(args)?;
    let req = sandbox_request(args, &exec)?;
    let gate = local_gate(args, &req, tiers)?;
    let decided = gate.admit(&Principal::Operator, &req, "cordon run");
    let policy_step = req.trust.is_some() || req.autonomy.is_some();
    if policy_step {
        tiers.audit(&decided, &crate::data_dir())?;
    }
    match decided {
        Ok(adm) => Ok(Ok((adm, exec))),
        Err(d) => Ok(Err(report_denial(&d, args.json)?)),
    }
}

/// `cordon run` with every tier `tiers` has.
pub fn run(args: RunArgs, tiers: &Tiers) -> Result<i32> {
    let (adm, exec) = match admit(&args, tiers)? {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let tier = adm.spec.tier;
    // This process ends with its one sandbox (ADR 0044).
    let backend = tiers.one_shot(tier).ok_or_else(|| {
        anyhow!(
            "the {tier} tier is not part of this build of cordon yet; `cordon doctor` lists the tiers"
        )
    })?;
    run_on(&args, adm, exec, backend.as_ref())
}

/// The `cordon` front's share of `cordon run`: the container tier, asked for by name or by
/// default, with no policy step (no --trust, --autonomy, --shape or policy file). `None`
/// for everything else, including flags it cannot parse (`cordon-full` answers those with
/// the same messages).
pub fn fast(argv: &[std::ffi::OsString]) -> Option<i32> {
    use clap::Parser;
    // This process ends with its one sandbox: the sandbox init finishes its teardown after
    // the run has returned, holding its ids until then (ADR 0044).
    let backend = || {
        cordon_container::ContainerBackend::new(cordon_container::ContainerConfig {
            end_in_init: true,
            // One user's own run: no other tenant to hide the host's boot id from (ADR 0047).
            own_boot_id: false,
            ..cordon_container::ContainerConfig::discover()
        })
    };
    // The sandbox init starts before the arguments are parsed: it makes the namespaces (a
    // create's costliest step) meanwhile. A failure to start is reported by the create
    // below, which tries again; a request for another tier drops it unused.
    let early = container_likely(argv).then(|| {
        let b = backend();
        let _ = b.start_init_early();
        b
    });
    #[derive(clap::Parser)]
    #[command(name = "cordon")]
    struct Front {
        #[command(subcommand)]
        command: FrontCommand,
    }
    #[derive(clap::Subcommand)]
    enum FrontCommand {
        Run(Box<RunArgs>),
    }
    let Ok(Front {
        command: FrontCommand::Run(args),
    }) = Front::try_parse_from(argv)
    else {
        return None;
    };
    let p = &args.policy;
    let policy_step = p.trust.is_some() || p.autonomy.is_some() || p.shape.is_some();
    let container =
        args.tier != Some(cordon_policy::TierChoice::Auto) && tier_of(&args).features().front_runs;
    if policy_step || !container {
        return None;
    }
    crate::init_logging();
    let backend = early.unwrap_or_else(backend);
    let ran = admit(&args, &Tiers).and_then(|a| match a {
        Ok((adm, exec)) => run_on(&args, adm, exec, &backend),
        Err(code) => Ok(code),
    });
    Some(match ran {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cordon: error: {e:#}");
            125
        }
    })
}

/// Whether `cordon run`'s arguments, before any `--`, leave it on the container tier: no
/// other tier, no module, no policy step. A quick look for starting the init early; `fast`
/// parses the arguments properly.
fn container_likely(argv: &[std::ffi::OsString]) -> bool {
    let mut args = argv.iter().skip(2).map(|a| a.to_string_lossy());
    while let Some(a) = args.next() {
        if a == "--" {
            break;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.to_string(), None),
        };
        match flag.as_str() {
            "--wasm" | "--trust" | "--autonomy" | "--shape" | "--help" | "-h" => {
                return false;
            }
            "--tier" => {
                let value = inline.or_else(|| args.next().map(|v| v.to_string()));
                if value.as_deref() != Some("container") {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// Runs an admitted request on `backend` (its tier's).
fn run_on(
    args: &RunArgs,
    adm: Admission,
    req: ExecRequest,
    backend: &dyn cordon_core::Backend,
) -> Result<i32> {
    let Admission {
        mut spec, decision, ..
    } = adm;
    // Held until the sandbox is destroyed (run_once's end), then unmounted.
    let _leases = lease_volumes(&mut spec)?;
    let mut files_in = Vec::new();
    for f in &args.files {
        let (host, inside) = split_pair(f, "--file")?;
        let data = std::fs::read(host).with_context(|| format!("reading {host} for --file"))?;
        cordon_core::validate_sandbox_path(inside)?;
        files_in.push(FileIn {
            path: inside.to_string(),
            data,
            mode: 0o644,
        });
    }
    let mut outs = Vec::new();
    for o in &args.outs {
        let (inside, host) = split_pair(o, "--out")?;
        cordon_core::validate_sandbox_path(inside)?;
        outs.push((inside.to_string(), PathBuf::from(host)));
    }
    let json = args.json;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut write = |stream: OutputStream, data: &[u8]| {
        if json || data.is_empty() {
            return;
        }
        let _ = match stream {
            OutputStream::Stdout => stdout.write_all(data).and_then(|_| stdout.flush()),
            OutputStream::Stderr => stderr.write_all(data).and_then(|_| stderr.flush()),
        };
    };
    // Live output passes a streaming redactor that knows the grants' secrets, as every
    // other output sink does.
    let mut sink = cordon_egress::scan::RedactingSink::new(
        cordon_egress::scan::known_secrets_of(&spec.grants),
        &mut write,
    );
    let out_paths: Vec<String> = outs.iter().map(|(p, _)| p.clone()).collect();
    let ran = run_once(
        backend,
        &spec,
        &files_in,
        req,
        &out_paths,
        args.max_out_file,
        &mut sink,
    );
    sink.finish();
    drop(sink);
    let (outcome, fetched) = ran?;
    if let Some(d) = &decision
        && !json
    {
        eprintln!(
            "cordon: policy chose the {} tier (minimum {}; `cordon policy explain` says why)",
            d.chosen, d.minimum
        );
    }
    let mut file_errors = Vec::new();
    let mut written = Vec::new();
    for (f, (_, host)) in fetched.into_iter().zip(&outs) {
        match f.data {
            Ok(data) => match crate::outfile::write_atomically(host, &data) {
                Ok(()) => written.push((f.path, host.display().to_string(), data.len())),
                Err(e) => file_errors.push(format!("{} -> {}: {e:#}", f.path, host.display())),
            },
            Err(e) => file_errors.push(format!("{}: {e}", f.path)),
        }
    }
    if json {
        let mut v = serde_json::to_value(&outcome)?;
        v["exit_status"] = serde_json::json!(exit_code_for(&outcome));
        if let Some(d) = &decision {
            v["policy"] = serde_json::to_value(d)?;
        }
        v["files_out"] = serde_json::json!(
            written
                .iter()
                .map(|(p, h, n)| serde_json::json!({"path": p, "host_path": h, "bytes": n}))
                .collect::<Vec<_>>()
        );
        v["file_errors"] = serde_json::json!(file_errors);
        println!("{}", serde_json::to_string(&v)?);
    } else {
        print_summary(&outcome, &written, &file_errors);
    }
    if !file_errors.is_empty() && outcome.success() {
        return Ok(125);
    }
    Ok(exit_code_for(&outcome))
}

/// The local user's volumes (`cordon volume create`): owner [`LOCAL_VOLUME_OWNER`] in the
/// data dir's volume store.
pub fn volume_store() -> Result<cordon_host::volume::VolumeStore> {
    cordon_host::volume::VolumeStore::open(&crate::data_dir().join("volumes"))
        .context("opening the volume store (volumes need root: run cordon as root)")
}

/// Whose volumes `cordon run --volume` and `cordon volume` use.
pub const LOCAL_VOLUME_OWNER: &str = "local";

/// Leases and mounts each volume the spec names, filling in its host side.
fn lease_volumes(
    spec: &mut cordon_core::SandboxSpec,
) -> Result<Vec<cordon_host::volume::VolumeLease>> {
    if spec.volumes.is_empty() {
        return Ok(Vec::new());
    }
    let store = volume_store()?;
    let mut leases = Vec::new();
    for m in &mut spec.volumes {
        let lease = store
            .mount(LOCAL_VOLUME_OWNER, &m.name, m.read_only)
            .with_context(|| format!("--volume {}:{}", m.name, m.inside()))?;
        m.source = Some(cordon_core::VolumeSource {
            host_dir: lease.host_dir().to_path_buf(),
            lease: None,
        });
        leases.push(lease);
    }
    Ok(leases)
}

fn print_summary(o: &ExecOutcome, written: &[(String, String, usize)], errors: &[String]) {
    let us = |v: u64| format_duration(std::time::Duration::from_micros(v));
    let how = match o.termination {
        cordon_core::Termination::Exited => format!("exited {}", o.exit_code.unwrap_or(-1)),
        cordon_core::Termination::Signalled => {
            format!("killed by signal {}", o.signal.unwrap_or(0))
        }
        t => format!("stopped: {t}"),
    };
    let mut line = format!(
        "cordon: {how} · {} tier · start {} · run {} · cpu {} · peak memory {}",
        o.tier,
        us(o.timings.start_us),
        us(o.timings.run_us),
        us(o.usage.cpu_time_us),
        format_size(o.usage.peak_memory_bytes)
    );
    if o.stdout_truncated || o.stderr_truncated {
        line.push_str(" · output truncated");
    }
    eprintln!("{line}");
    if !o.weakened.is_empty() {
        let names: Vec<String> = o.weakened.iter().map(|w| w.to_string()).collect();
        eprintln!("cordon: WEAKER RUN: without {}", names.join(", "));
    }
    for w in &o.warnings {
        eprintln!("cordon: warning: {w}");
    }
    for f in &o.extra.findings {
        eprintln!(
            "cordon: scan: {}",
            serde_json::to_string(f).unwrap_or_default()
        );
    }
    for e in &o.extra.egress {
        let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        eprintln!(
            "cordon: egress {} {}:{} {} ({:?})",
            e.decision.as_str(),
            or_dash(&e.host),
            e.port.map(|p| p.to_string()).unwrap_or_default(),
            or_dash(&e.rule),
            e.kind
        );
    }
    for (p, h, n) in written {
        eprintln!("cordon: wrote {p} -> {h} ({})", format_size(*n as u64));
    }
    for e in errors {
        eprintln!("cordon: file out failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::container_likely;

    fn likely(args: &[&str]) -> bool {
        let argv: Vec<std::ffi::OsString> = ["cordon", "run"]
            .iter()
            .chain(args)
            .map(std::ffi::OsString::from)
            .collect();
        container_likely(&argv)
    }

    #[test]
    fn the_init_starts_early_only_for_what_stays_on_the_container_tier() {
        assert!(likely(&["--", "sh", "-c", "true"]));
        assert!(likely(&["--lang", "python", "-c", "print(1)"]));
        assert!(likely(&["--tier", "container", "--", "true"]));
        assert!(likely(&["--tier=container", "--", "true"]));
        // After `--` everything is the program's.
        assert!(likely(&["--", "prog", "--tier", "wasm", "--trust", "x"]));
        assert!(!likely(&["--tier", "wasm", "--", "true"]));
        assert!(!likely(&["--tier=gvisor", "--", "true"]));
        assert!(!likely(&["--tier", "auto", "--", "true"]));
        assert!(!likely(&["--tier"]));
        assert!(!likely(&["--wasm", "m.wasm"]));
        assert!(!likely(&[
            "--trust",
            "untrusted",
            "--autonomy",
            "compute",
            "--",
            "true"
        ]));
        assert!(!likely(&["--shape=one-long", "--", "true"]));
        assert!(!likely(&["--help"]));
    }
}
