//! `cordon template build NAME --from BASE --run CMD ...`: each step runs in a
//! container-tier sandbox whose root is a writable working copy of the base, kept on the
//! host outside the sandbox's reach, with only the build's egress allow-list; the result
//! is sealed into a template as an import is (docs/templates.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::shown::short;
use clap::Args;
use cordon_container::{ContainerBackend, ContainerConfig, ContainerSandbox};
use cordon_core::{
    ExecRequest, Language, OutputStream, ResolvedTemplate, Sandbox, Termination, Tier,
};
use cordon_engine::audit::{Audit, AuditEvent, NewEvent, TemplateBuilt};
use cordon_host::idpool::{IdPool, IdRange};
use cordon_template::{
    BuildInputs, BuildPlan, BuildResult, BuildRoot, ImageDefaults, ImportLimits, Manifest,
    PlanStep, Store, TemplateError,
};

/// The exit status of a run that ended at its disk limit (as `cordon run`'s).
pub(crate) const DISK_LIMIT_EXIT: i32 = 120;

#[derive(Args)]
pub struct BuildArgs {
    /// The new template's name (a-z, 0-9, '.', '_', '-').
    name: String,
    /// The base: a template (name or digest), `debian` or `debian-base` (the Debian root
    /// debootstrap made for the microvm tier, `cordon image build`), or `host`.
    #[arg(long, value_name = "BASE")]
    from: String,
    /// A step: a shell command run in the build's sandbox (`sh -c`), in order.
    #[arg(
        long = "run",
        value_name = "CMD",
        required_unless_present = "plan",
        conflicts_with = "plan"
    )]
    run: Vec<String>,
    /// The steps as a JSON plan (copies of archives, working directories, variables, a
    /// start command): what the server writes for a build asked through E2B's template
    /// API (docs/e2b.md).
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// Also write how the build ended to FILE (JSON: ok, digest, cached, the failed step
    /// and why), for a program that started it.
    #[arg(long, value_name = "FILE")]
    result: Option<PathBuf>,
    /// A host the steps may reach through the egress proxy (`host`, `*.suffix`, `:port`).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_host: Vec<String>,
    /// An address range the steps may reach (`10.0.0.0/8:443`); needed for private and
    /// loopback addresses, which the egress guard refuses otherwise.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    allow_cidr: Vec<String>,
    /// An environment variable of the steps and of every sandbox on the template.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Wall-clock limit of each step.
    #[arg(long, default_value = "30m", value_parser = cordon_core::units::parse_duration)]
    timeout: Duration,
    /// Memory limit of the build's sandbox.
    #[arg(long, default_value = "2G", value_parser = cordon_core::units::parse_size)]
    memory: u64,
    /// Disk limit of the build: the base's copy and everything the steps write to the root
    /// live in a file system of this size (sparse: it takes the host's disk only as it is
    /// written); past it, writes fail with "No space left on device".
    #[arg(long, default_value = "16G", value_parser = cordon_core::units::parse_size)]
    disk: u64,
    /// Largest root the build may seal (bytes of regular files), e.g. 8G.
    #[arg(long, default_value = "16G", value_parser = cordon_core::units::parse_size)]
    max_unpacked_bytes: u64,
    /// Most entries the build may seal.
    #[arg(long, default_value_t = 1_000_000)]
    max_files: u64,
    /// Print the manifest as JSON when done.
    #[arg(long)]
    json: bool,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{k:?} is not a variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

pub fn build(store: &Store, data: &Path, a: BuildArgs, store_bytes: u64) -> Result<i32> {
    let result_file = a.result.clone();
    let mut ended = BuildResult {
        ok: false,
        digest: None,
        cached: false,
        step: None,
        message: String::new(),
        unknown_user: None,
    };
    let code = build_plan(store, data, a, store_bytes, &mut ended);
    if let Some(path) = result_file {
        if let Err(e) = &code {
            ended.message = format!("{e:#}");
        }
        ended.ok = matches!(code, Ok(0));
        let text = serde_json::to_vec(&ended).context("writing the build's result")?;
        std::fs::write(&path, text)
            .with_context(|| format!("writing the build's result to {}", path.display()))?;
    }
    code
}

/// The steps of `--plan FILE`, or of each `--run` (a plan of `sh -c` steps in `/`).
fn plan_of(a: &BuildArgs) -> Result<BuildPlan> {
    match &a.plan {
        Some(p) => {
            let text =
                std::fs::read(p).with_context(|| format!("reading the plan {}", p.display()))?;
            serde_json::from_slice(&text)
                .with_context(|| format!("{} is no build plan", p.display()))
        }
        None => Ok(BuildPlan {
            steps: a
                .run
                .iter()
                .map(|cmd| PlanStep::Run {
                    cmd: cmd.clone(),
                    user: None,
                })
                .collect(),
            ..BuildPlan::default()
        }),
    }
}

/// A plan's steps as its inputs name them: a `--run` build's are its commands, as they
/// always were (so its cache still matches).
fn step_inputs(plan: &BuildPlan) -> Vec<String> {
    let mut steps: Vec<String> = Vec::new();
    if let Some(w) = &plan.workdir {
        steps.push(format!("START-IN {w}"));
    }
    steps.extend(plan.steps.iter().map(PlanStep::input));
    if let Some(s) = &plan.start {
        steps.push(format!(
            "START {} READY {}",
            s.start,
            s.ready.as_deref().unwrap_or("")
        ));
    }
    steps
}

fn build_plan(
    store: &Store,
    data: &Path,
    a: BuildArgs,
    store_bytes: u64,
    ended: &mut BuildResult,
) -> Result<i32> {
    let t0 = Instant::now();
    let plan = plan_of(&a)?;
    let (base_label, base) = resolve_base(store, data, &a.from, store_bytes)?;
    let mut env: BTreeMap<String, String> = a.env.iter().cloned().collect();
    let mut allow = a.allow_host.clone();
    allow.extend(a.allow_cidr.iter().cloned());
    let inputs = BuildInputs {
        base: base_label.clone(),
        base_digest: base.digest.clone(),
        steps: step_inputs(&plan),
        env: env.clone(),
        allow: allow.clone(),
    };
    let audit = BuildAudit {
        data,
        name: &a.name,
        inputs_digest: inputs.digest(),
        base: base_label,
        steps: plan.steps.len(),
        t0,
    };
    // The gate every `cordon run` and server create passes: the operator's ceiling (limits,
    // egress entries), the template, the tier. Its spec is the build's; a refusal ends the
    // build before anything runs, cached or not, and both are audit rows.
    let decided = build_gate(store).admit(
        &cordon_engine::Principal::Operator,
        &build_request(&a, &base.name, &env, &allow),
        "template build",
    );
    record_decision(data, &decided);
    let admitted = match decided {
        Ok(adm) => adm,
        Err(d) => {
            audit.record(None, "refused");
            eprintln!("cordon: refused ({}): {}", d.rule, d.message);
            eprintln!("cordon: fix: {}", d.fix);
            ended.message = format!("refused ({}): {}; {}", d.rule, d.message, d.fix);
            return Ok(REFUSED_EXIT);
        }
    };
    let cached = if plan.force {
        None
    } else {
        store.cached_build(&a.name, &audit.inputs_digest)?
    };
    if let Some(m) = cached {
        ended.digest = Some(m.digest.clone());
        ended.cached = true;
        audit.record(Some(&m.digest), "cached");
        print_cached(&m, &audit.inputs_digest, a.json)?;
        return Ok(0);
    }
    // The base's environment, then the build's: steps and sandboxes on the template see it.
    let mut tpl_env = base.env.clone();
    tpl_env.append(&mut env);
    let (mut sb, work, range) = start_build(store, &base, admitted.spec, &tpl_env, a.disk)?;
    let mut steps = Steps {
        sb: &mut sb,
        work: &work,
        disk: a.disk,
        timeout: a.timeout,
        t0,
        cwd: plan.workdir.clone().unwrap_or_else(|| "/".into()),
        env: BTreeMap::new(),
        user: None,
    };
    let ran = steps.run_all(&plan);
    let added_env = std::mem::take(&mut steps.env);
    let workdir = steps.cwd.clone();
    if let Err(failed) = ran {
        let _ = sb.destroy();
        audit.record(None, "failed");
        eprintln!(
            "cordon: [step {}/{}] failed after {:.1} s ({}); the build stopped, nothing \
             was sealed: fix the step and build again",
            failed.step,
            plan.steps.len(),
            failed.took.as_secs_f64(),
            failed.why,
        );
        ended.step = Some(failed.step);
        ended.message = failed.why.clone();
        ended.unknown_user = failed.unknown_user.clone();
        return Ok(if failed.code == 0 { 1 } else { failed.code });
    }
    sb.destroy().context("ending the build's sandbox")?;
    drop(sb);
    drop(range);
    eprintln!(
        "cordon: sealing {}  ({:.1} s)",
        a.name,
        t0.elapsed().as_secs_f64()
    );
    let base_manifest = store.get(&base.name).ok();
    tpl_env.extend(added_env);
    let mut defaults = ImageDefaults {
        env: tpl_env,
        ..base_manifest.map(|m| m.image).unwrap_or_default()
    };
    // A plan's last directory and start command are what its sandboxes start with.
    if a.plan.is_some() {
        defaults.working_dir = Some(workdir);
        if let Some(s) = &plan.start {
            defaults.entrypoint = Vec::new();
            defaults.cmd = vec!["/bin/sh".into(), "-c".into(), s.start.clone()];
        }
    }
    let limits = ImportLimits {
        unpacked_bytes: a.max_unpacked_bytes,
        files: a.max_files,
        store_bytes,
        ..ImportLimits::default()
    };
    let report = match store.seal_build(work, &a.name, &inputs, defaults, &limits) {
        Ok(r) => r,
        Err(e @ TemplateError::DiskLimit { .. }) => {
            audit.record(None, "failed");
            eprintln!("cordon: sealing {} ended as DiskLimit: {e}", a.name);
            ended.message = format!("sealing the template ended at its disk limit: {e}");
            return Ok(DISK_LIMIT_EXIT);
        }
        Err(e) => return Err(anyhow::Error::new(e).context("sealing the build")),
    };
    let m = &report.manifest;
    ended.digest = Some(m.digest.clone());
    audit.record(Some(&m.digest), "built");
    print_built(m, &audit, a.json)
}

/// The build's base, and how its audit row and inputs name it: `debian` (the microvm
/// tier's Debian root, imported once) or a template of the store; `host` is refused.
fn resolve_base(
    store: &Store,
    data: &Path,
    from: &str,
    store_bytes: u64,
) -> Result<(String, ResolvedTemplate)> {
    Ok(match from {
        "host" => bail!(
            "the `host` base is not supported by `cordon template build` yet: a template is a \
             whole root, and the host's /usr is too large to copy into one; build from \
             `debian` or from a template (`cordon template import`)"
        ),
        "debian" | "debian-base" => (
            "debian".to_string(),
            debian_base(
                store,
                data,
                &ImportLimits {
                    store_bytes,
                    ..ImportLimits::default()
                },
            )?,
        ),
        name => (
            format!("template {name}"),
            store
                .resolve_base(name)
                .with_context(|| format!("resolving the base {name:?}"))?,
        ),
    })
}

/// What the build's audit row says of it, whatever its end.
struct BuildAudit<'a> {
    data: &'a Path,
    name: &'a str,
    inputs_digest: String,
    base: String,
    steps: usize,
    t0: Instant,
}

impl BuildAudit<'_> {
    /// Writes the row: the template's digest where one was built or cached, and the result
    /// (`built`, `cached`, `refused`, `failed`).
    fn record(&self, digest: Option<&str>, result: &str) {
        record_audit(
            self.data,
            TemplateBuilt {
                name: self.name.to_string(),
                digest: digest.map(str::to_string),
                inputs_digest: self.inputs_digest.clone(),
                base: self.base.clone(),
                steps: self.steps,
                duration_ms: self.t0.elapsed().as_millis() as u64,
                result: result.to_string(),
            },
        )
    }
}

fn print_cached(m: &Manifest, inputs_digest: &str, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(m)?);
    } else {
        println!(
            "template {} {} is cached: built before from the same inputs ({}); no step ran",
            m.name,
            short(&m.digest),
            short(inputs_digest)
        );
    }
    Ok(())
}

fn print_built(m: &Manifest, audit: &BuildAudit<'_>, json: bool) -> Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(m)?);
    } else {
        println!(
            "built {} {} ({}, {} files, inputs {}) in {:.2} s",
            m.name,
            short(&m.digest),
            cordon_template::human(m.size_bytes),
            m.files,
            short(&audit.inputs_digest),
            audit.t0.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

/// The steps' sandbox: the admitted spec with its root swapped for a writable working copy
/// of `base` (the gate resolved the base's read-only root), of `disk` bytes, owned by the
/// uid the sandbox's user maps to. Answers the sandbox, the working copy and the id range
/// leased for it (held until the sandbox is gone).
fn start_build(
    store: &Store,
    base: &ResolvedTemplate,
    mut spec: cordon_core::SandboxSpec,
    tpl_env: &BTreeMap<String, String>,
    disk: u64,
) -> Result<(ContainerSandbox, BuildRoot, IdRange)> {
    // The step sandbox's ids are leased here, so the working copy can be given to the
    // uid its user maps to before the sandbox starts.
    let system = IdPool::system();
    let range = system.allocate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut cfg = ContainerConfig::discover();
    cfg.ids = IdPool::new(
        system
            .dir
            .with_file_name("build-ids")
            .join(range.base().to_string()),
        range.base(),
        1,
        cordon_host::idpool::RANGE,
    );
    let owner = range.base() + cfg.sandbox_uid;
    let work = store
        .build_root(&base.root, owner, Some(disk))
        .context("preparing the build's root")?;
    spec.resolved_template = Some(ResolvedTemplate {
        name: base.name.clone(),
        digest: base.digest.clone(),
        root: work.root().to_path_buf(),
        env: tpl_env.clone(),
        languages: [Language::Sh].into_iter().collect(),
        lease: base.lease.clone(),
        writable: true,
    });
    let backend = ContainerBackend::new(cfg);
    let sb = backend
        .create_sandbox(&spec)
        .context("starting the build's sandbox")?;
    Ok((sb, work, range))
}

/// A step that failed: which (from 1), why, the exit status the build ends with, and how
/// long it ran.
struct StepFailed {
    step: usize,
    why: String,
    code: i32,
    took: Duration,
    unknown_user: Option<String>,
}

/// The users a step may ask for: the build's own (`user`, E2B's name for it, or the
/// sandbox's), and `root`, which runs as that same user: it owns the whole working copy,
/// so a step writes anywhere root's would. No program in a sandbox runs as uid 0.
const BUILD_USERS: [&str; 3] = ["user", "sandbox", "root"];

/// Unpacks a copy's archive (stdin) and puts what matches its source where it goes, as a
/// Dockerfile's COPY does: several matches, a directory, or a destination ending in `/`
/// go into the destination directory; one file otherwise becomes the destination. Runs
/// in the build's sandbox as its user: the host never writes into the working copy.
const COPY_SCRIPT: &str = r#"set -eu
src=$1; dest=$2; mode=$3; zip=$4
case "$dest" in /*) D=$dest ;; *) D=$PWD/$dest ;; esac
tmp=$(mktemp -d /tmp/.cordon-copy.XXXXXX)
if [ "$zip" = 1 ]; then tar -xzf - -C "$tmp"; else tar -xf - -C "$tmp"; fi
cd "$tmp"
IFS='
'
set -- $src
for m in "$@"; do
  [ -e "$m" ] || [ -L "$m" ] || { echo "no file matches $src" >&2; exit 1; }
done
put() { if [ -d "$1" ] && [ ! -L "$1" ]; then mkdir -p "$2"; cp -a "$1/." "$2/"; else cp -a "$1" "$2"; fi; }
into=0
[ $# -gt 1 ] && into=1
[ -d "$D" ] && into=1
case "$dest" in */) into=1 ;; esac
[ -d "$1" ] && [ ! -L "$1" ] && [ $# -eq 1 ] && into=0
if [ $into = 1 ]; then
  mkdir -p "$D"
  for m in "$@"; do
    t="$D/${m##*/}"; put "$m" "$t"
    [ -z "$mode" ] || chmod -R "$mode" "$t"
  done
else
  mkdir -p "$(dirname "$D")"; put "$1" "$D"
  [ -z "$mode" ] || chmod -R "$mode" "$D"
fi
cd /; rm -rf "$tmp"
"#;

/// Runs a plan's steps in the build's sandbox: where each starts, the variables the
/// plan's `Env` steps added, the user its `User` steps asked for.
struct Steps<'a> {
    sb: &'a mut ContainerSandbox,
    work: &'a BuildRoot,
    disk: u64,
    timeout: Duration,
    t0: Instant,
    cwd: String,
    env: BTreeMap<String, String>,
    user: Option<String>,
}

impl Steps<'_> {
    /// Every step in order (output to stderr with the progress), stopping at the first
    /// that does not exit 0; then the start command and its readiness check.
    fn run_all(&mut self, plan: &BuildPlan) -> std::result::Result<(), StepFailed> {
        let n = plan.steps.len();
        if plan.workdir.is_some() {
            let cwd = self.cwd.clone();
            self.exec_step(
                0,
                &["/bin/sh", "-c", "mkdir -p -- \"$1\"", "sh", &cwd],
                None,
                "/",
            )?;
        }
        for (i, step) in plan.steps.iter().enumerate() {
            eprintln!(
                "cordon: [step {}/{n}] {}  ({:.1} s)",
                i + 1,
                step.input(),
                self.t0.elapsed().as_secs_f64()
            );
            self.step(i + 1, step)?;
        }
        if let Some(s) = &plan.start {
            self.start(n + 1, s)?;
        }
        Ok(())
    }

    fn step(&mut self, at: usize, step: &PlanStep) -> std::result::Result<(), StepFailed> {
        let cwd = self.cwd.clone();
        match step {
            PlanStep::Run { cmd, user } => {
                self.check_user(at, user.as_deref(), cmd)?;
                self.exec_step(at, &["/bin/sh", "-c", cmd], None, &cwd)
            }
            PlanStep::Copy {
                archive,
                dest,
                gzip,
                mode,
                user,
                digest,
                src,
            } => {
                self.check_user(at, user.as_deref(), &format!("COPY {dest}"))?;
                let bytes = std::fs::read(archive).map_err(|e| StepFailed {
                    step: at,
                    why: format!("the files of the copy ({digest}) could not be read: {e}"),
                    code: 1,
                    took: Duration::ZERO,
                    unknown_user: None,
                })?;
                let zip = if *gzip { "1" } else { "0" };
                let mode = mode.as_deref().unwrap_or("");
                let argv = ["/bin/sh", "-c", COPY_SCRIPT, "sh", src, dest, mode, zip];
                self.exec_step(at, &argv, Some(bytes), &cwd)
            }
            PlanStep::Env { vars } => {
                self.env
                    .extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
                Ok(())
            }
            PlanStep::Workdir { dir } => {
                let dir = if dir.starts_with('/') {
                    dir.clone()
                } else {
                    format!("{}/{dir}", cwd.trim_end_matches('/'))
                };
                self.exec_step(
                    at,
                    &["/bin/sh", "-c", "mkdir -p -- \"$1\"", "sh", &dir],
                    None,
                    "/",
                )?;
                self.cwd = dir;
                Ok(())
            }
            PlanStep::User { name } => {
                self.check_user(at, Some(name), &format!("USER {name}"))?;
                self.user = Some(name.clone());
                Ok(())
            }
        }
    }

    /// A user the build does not have fails the step, as E2B's builder fails it.
    fn check_user(
        &self,
        at: usize,
        user: Option<&str>,
        what: &str,
    ) -> std::result::Result<(), StepFailed> {
        let user = user.or(self.user.as_deref()).unwrap_or("user");
        if user.is_empty() || BUILD_USERS.contains(&user) {
            return Ok(());
        }
        Err(StepFailed {
            step: at,
            why: format!(
                "{what}: invalid username: '{user}' (a build's steps run as `user`; `root` \
                 is taken as that user, who owns the whole root)"
            ),
            code: 1,
            took: Duration::ZERO,
            unknown_user: Some(user.to_string()),
        })
    }

    /// The start command in the background, then its readiness check until it exits 0
    /// (one second apart, within the build's step timeout).
    fn start(
        &mut self,
        at: usize,
        s: &cordon_template::StartCommand,
    ) -> std::result::Result<(), StepFailed> {
        let cwd = self.cwd.clone();
        eprintln!(
            "cordon: [start] {}  ({:.1} s)",
            s.start,
            self.t0.elapsed().as_secs_f64()
        );
        let bg = "nohup /bin/sh -c \"$1\" >/tmp/.cordon-start.log 2>&1 </dev/null &";
        self.exec_step(at, &["/bin/sh", "-c", bg, "sh", &s.start], None, &cwd)?;
        let Some(ready) = &s.ready else {
            return Ok(());
        };
        let until = Instant::now() + self.timeout;
        loop {
            eprintln!("cordon: [ready] {ready}");
            match self.exec_step(at, &["/bin/sh", "-c", ready], None, &cwd) {
                Ok(()) => return Ok(()),
                Err(f) if Instant::now() >= until => return Err(f),
                Err(_) => std::thread::sleep(Duration::from_secs(1)),
            }
        }
    }

    fn exec_step(
        &mut self,
        at: usize,
        argv: &[&str],
        stdin: Option<Vec<u8>>,
        cwd: &str,
    ) -> std::result::Result<(), StepFailed> {
        let mut req = ExecRequest::argv(argv.iter().copied());
        req.cwd = Some(cwd.into());
        req.env = self.env.clone();
        req.stdin = stdin;
        // The step's output streams to stderr with the progress; stdout has the result only.
        let mut sink = |_: OutputStream, data: &[u8]| {
            let _ = std::io::stderr().write_all(data);
        };
        let ts = Instant::now();
        let out = self.sb.exec(&req, &mut sink);
        let failed = match &out {
            Ok(o) if o.termination == Termination::Exited && o.exit_code == Some(0) => None,
            Ok(o) => Some((
                format!(
                    "{:?}, exit code {}",
                    o.termination,
                    o.exit_code.map_or("none".into(), |c| c.to_string())
                ),
                o.exit_code.unwrap_or(1),
            )),
            Err(e) => Some((e.to_string(), 125)),
        };
        let Some((why, code)) = failed else {
            return Ok(());
        };
        let hit_disk = matches!(&out, Ok(o) if o.termination == Termination::DiskLimit);
        let why = if hit_disk || self.work.disk_full() {
            format!(
                "{why}; the build's root is full: its disk limit is {} (give a larger --disk)",
                cordon_template::human(self.disk)
            )
        } else {
            why
        };
        Err(StepFailed {
            step: at,
            why,
            code,
            took: ts.elapsed(),
            unknown_user: None,
        })
    }
}

/// The Debian base: the root debootstrap made for the microvm tier's guest image
/// (`cordon image build`), kept in the store as the template `debian-<hash>`.
fn debian_base(store: &Store, data: &Path, limits: &ImportLimits) -> Result<ResolvedTemplate> {
    let image = cordon_microvm::image::load(data)
        .or_else(|_| cordon_microvm::image::load(&cordon_microvm::image::default_data_dir()))
        .context("the `debian` base is the microvm tier's Debian root")?;
    let hash = image
        .rootfs
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit('-').next())
        .unwrap_or("root")
        .to_string();
    let name = format!("debian-{hash}");
    if store.get(&name).is_err() {
        eprintln!("cordon: importing the Debian root of the microvm image as {name}");
        // A staging dir of the store's own (locked while it lives, so `template gc` leaves
        // it alone; removed however this ends).
        let stage = cordon_template::Stage::new(store)?;
        let tmp = stage.path().join("root");
        std::fs::create_dir(&tmp).context("making a staging dir")?;
        let out = std::process::Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump / {}", tmp.display()))
            .arg(&image.rootfs)
            .output()
            .context("running debugfs (e2fsprogs) to read the Debian root")?;
        if !out.status.success() {
            bail!(
                "debugfs could not read the Debian root: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The operator's own Debian root, read once: no step runs on it, no disk limit.
        let work = store.build_root(&tmp, 0, None)?;
        drop(stage);
        let inputs = BuildInputs {
            base: "debian".into(),
            base_digest: hash.clone(),
            steps: Vec::new(),
            env: BTreeMap::new(),
            allow: Vec::new(),
        };
        match store.seal_build(work, &name, &inputs, ImageDefaults::default(), limits) {
            Ok(_) => {}
            // Another build imported it meanwhile (two builds from `debian` at once): the
            // same root, read from the same image; theirs stands.
            Err(TemplateError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(store.resolve(&name)?)
}

/// The exit status of a build the gate refused (as `cordon run`'s refusal).
pub(crate) const REFUSED_EXIT: i32 = 125;

/// The local operator's gate for a build: the container tier only (a build's root is a
/// container-tier working copy), the template store, no catalogue, no policy step.
fn build_gate(store: &Store) -> cordon_engine::Gate {
    cordon_engine::Gate::new(
        cordon_engine::GateSettings::default(),
        cordon_engine::CeilingConfig::default(),
        std::sync::Arc::new(cordon_engine::Catalogue::empty()),
        cordon_engine::RulesSource::Shipped,
        None,
    )
    .with_tiers([Tier::Container].into_iter().collect(), Vec::new())
    .with_templates(store.clone())
}

/// What a build asks the gate for: its steps' sandbox, as `cordon run --tier container
/// --template BASE` with the build's limits, environment and egress entries would.
fn build_request(
    a: &BuildArgs,
    base: &str,
    env: &BTreeMap<String, String>,
    allow: &[String],
) -> cordon_engine::SandboxRequest {
    cordon_engine::SandboxRequest {
        tier: Some(cordon_policy::TierChoice::Tier(Tier::Container)),
        limits: cordon_engine::LimitsPatch {
            timeout_ms: Some(a.timeout.as_millis() as u64),
            memory_bytes: Some(a.memory),
            ..Default::default()
        },
        env: env.clone(),
        allow_hosts: allow.to_vec(),
        template: Some(base.to_string()),
        workload: cordon_engine::Workload::Program,
        ..Default::default()
    }
}

/// The gate's decision as a `policy` row beside the build's own row.
fn record_decision(data: &Path, decided: &Result<cordon_engine::Admission, cordon_engine::Denial>) {
    let (tier, event) = AuditEvent::of_decision(decided);
    record(data, tier, event);
}

fn record_audit(data: &Path, row: TemplateBuilt) {
    record(data, Some(Tier::Container), AuditEvent::TemplateBuild(row));
}

fn record(data: &Path, tier: Option<Tier>, event: AuditEvent) {
    let path = data.join("audit.db");
    match Audit::open(&path) {
        Ok(a) => {
            if let Err(e) = a.record(&NewEvent {
                tenant: None,
                sandbox: None,
                tier,
                event,
            }) {
                eprintln!("cordon: warning: the build's audit row was not written: {e}");
            }
        }
        Err(e) => eprintln!("cordon: warning: the audit store could not be opened: {e}"),
    }
}
