//! Cordon's `wasm` tier: wasmtime 48 + WASI, deny by default.
//!
//! A sandbox gets nothing it is not given: no environment but what the spec and request
//! pass (plus `HOME=/work`, `LANG=C.UTF-8`), no sockets (TCP, UDP and name lookup are off),
//! no directory but its own scratch dir preopened as `/work` (size-limited by a quota that
//! every WASI write goes through), stdin from the request, stdout/stderr captured and capped.
//!
//! It runs three kinds of program: Python (CPython 3.13 built to `wasm32-wasi`), JavaScript
//! (QuickJS built to `wasm32-wasip1`), both pre-initialized WASI modules, and a user's own
//! WASI preview 1 command module or preview 2 command component. The two guests are built
//! by `scripts/setup.sh` into `<data dir>/guests/` (see [`data_dir`]), verified by content
//! hash, precompiled once per engine configuration into a verified cache and instantiated
//! from `InstancePre` (a user's component from `CommandPre`) with the pooling allocator and
//! copy-on-write memory images.
//!
//! Limits: memory (a `ResourceLimiter` on all linear memories), wall clock (epoch deadline
//! plus an outer timeout for a guest blocked in a host call), optional fuel, table elements
//! and instance/table/memory counts, wasm stack, output caps and the disk quota.

mod artifacts;
mod compile;
mod engine;
mod error;
mod files;
mod host;
mod quota;
mod run;
mod snapshot;
mod standby;
mod sys;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Command, Error, ExecOutcome, ExecRequest, Language, Limits, OutputSink,
    OutputStream, Probe, Result, Sandbox, SandboxId, SandboxSpec, Tier, Timings, Usage,
};
use wasmtime::Engine;
use wasmtime_wasi::p2::bindings::CommandPre;

pub use artifacts::{Guest, data_dir};
pub use engine::PoolSize;
pub use error::WasmError;

use run::{Instantiated, Linkers, Program};

/// Where the backend finds guests and puts scratch dirs.
#[derive(Debug, Clone)]
pub struct WasmConfig {
    /// Data dir holding `guests/` (default: [`data_dir`]).
    pub data_dir: PathBuf,
    /// Parent of each sandbox's scratch dir (default: the system temp dir).
    pub scratch_root: PathBuf,
    pub pool: PoolSize,
    /// Host descriptors the backend's execs may hold at once, all owners together (each exec
    /// reserves its `open_files` + 64 before it runs; see [`FdBudget`]). `None`: the process's
    /// descriptor limit, raised to its hard limit at start, less a quarter (at least 1024)
    /// kept for the rest of the process.
    pub descriptors: Option<u64>,
    /// How long after its sandbox's previous exec ended an exec must come to count as paced
    /// by a caller that reads each answer, so that a standby instance is made after it
    /// (default [`STANDBY_PAUSE`]; ADR 0019, ADR 0020). Execs that come sooner are
    /// back-to-back: they reset their own slot and make nothing ahead.
    pub standby_pause: Duration,
}

/// The default [`WasmConfig::standby_pause`].
pub const STANDBY_PAUSE: Duration = standby::PAUSE;

impl Default for WasmConfig {
    /// `CORDON_WASM_STANDBY=0` in the environment turns standby instances off (ADR 0019).
    fn default() -> Self {
        let mut pool = PoolSize::default();
        if std::env::var_os("CORDON_WASM_STANDBY").is_some_and(|v| v == "0") {
            pool.standby_instances = 0;
        }
        WasmConfig {
            data_dir: data_dir(),
            scratch_root: std::env::temp_dir(),
            pool,
            descriptors: None,
            standby_pause: STANDBY_PAUSE,
        }
    }
}

/// An engine with its linkers and lazily loaded guests. One without fuel serves every
/// spec that sets no fuel; one with fuel metering is made on first use.
struct EngineSet {
    engine: Engine,
    linkers: Linkers,
    /// Users' programs: compile slot (shared fairly between owners) and cache by content.
    compiler: compile::Compiler,
    python: OnceLock<std::result::Result<Program, Arc<WasmError>>>,
    javascript: OnceLock<std::result::Result<Program, Arc<WasmError>>>,
}

impl EngineSet {
    fn new(fuel: bool, pool: PoolSize) -> std::result::Result<Self, WasmError> {
        let engine = engine::new_engine(fuel, pool)?;
        let linkers = Linkers::new(&engine).map_err(|e| WasmError::Engine(format!("{e:#}")))?;
        Ok(EngineSet {
            engine,
            linkers,
            compiler: compile::Compiler::default(),
            python: OnceLock::new(),
            javascript: OnceLock::new(),
        })
    }

    fn guest(&self, data_dir: &Path, guest: Guest) -> Result<Program> {
        let cell = match guest {
            Guest::Python => &self.python,
            Guest::Javascript => &self.javascript,
        };
        cell.get_or_init(|| self.load(data_dir, guest).map_err(Arc::new))
            .clone()
            .map_err(|e| Error::Unavailable {
                tier: Tier::Wasm,
                reason: e.to_string(),
                fix: format!("run `{}`", Tier::Wasm.setup_command()),
            })
    }

    fn load(&self, data_dir: &Path, guest: Guest) -> std::result::Result<Program, WasmError> {
        let source = artifacts::locate(data_dir, guest)?;
        let load_err = |e: wasmtime::Error| WasmError::Load {
            guest: guest.as_str(),
            reason: format!("{e:#}"),
        };
        let engine = &self.engine;
        // Both guests are pre-initialized WASI preview 1 modules (ADR 0020).
        let m = artifacts::load(
            engine,
            data_dir,
            guest,
            &source,
            |f| sys::module_file(engine, f),
            |b| sys::module(engine, b),
        )?;
        let pre = self.linkers.p1.instantiate_pre(&m).map_err(load_err)?;
        Ok(Program::Module(pre))
    }

    /// Compiles (bounded, see [`compile`]) and links a user's module or component; errors say
    /// what is wrong with it. `None` when the deadline passed while it compiled.
    fn user_program(
        &self,
        owner: &str,
        bytes: &[u8],
        deadline: Instant,
    ) -> Result<Option<Program>> {
        let invalid = |what: &str, source: cordon_core::BoxError| Error::Malformed {
            what: what.to_string(),
            fix: "the wasm tier runs WASI preview 1 command modules and preview 2 command \
                  components"
                .to_string(),
            source,
        };
        let causes = |e: wasmtime::Error| -> cordon_core::BoxError { Box::new(Causes(e)) };
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(Error::Invalid(
                "not a WebAssembly binary (no \\0asm header); give a .wasm file built for WASI"
                    .into(),
            ));
        }
        // The version field after the magic: 1 for a core module, 0x0d + layer 1 for a
        // component.
        let is_component = bytes[4..8] == [0x0d, 0x00, 0x01, 0x00];
        let uncompiled = if is_component {
            "the component does not compile"
        } else {
            "the module does not compile"
        };
        let compiled =
            match self
                .compiler
                .compile(&self.engine, owner, bytes, is_component, deadline)
            {
                Ok(c) => c,
                Err(compile::CompileError::Timeout) => return Ok(None),
                Err(compile::CompileError::Busy { mine, all }) => {
                    let what = if mine {
                        format!(
                            "this tenant already has {} WebAssembly programs waiting to be \
                         compiled, its share of the server's compile queue; wait for them to \
                         finish, then send this one again",
                            compile::MAX_WAITING_PER_OWNER
                        )
                    } else {
                        format!(
                            "the server's compile queue is full ({all} programs of several \
                         tenants wait); send this one again in a moment"
                        )
                    };
                    return Err(Error::Busy {
                        what,
                        retry_after_secs: 1,
                    });
                }
                Err(compile::CompileError::Malformed(e)) => {
                    return Err(invalid(uncompiled, Box::new(e)));
                }
                Err(compile::CompileError::TooLarge(e)) => {
                    return Err(invalid(uncompiled, Box::new(e)));
                }
                Err(compile::CompileError::Rejected(e)) => {
                    return Err(invalid(uncompiled, causes(e)));
                }
            };
        let m = match compiled {
            compile::Compiled::Module(m) => m,
            compile::Compiled::Component(c) => {
                let pre = self.linkers.p2.instantiate_pre(&c).map_err(|e| {
                    invalid(
                        "the component imports something the sandbox does not provide",
                        causes(e),
                    )
                })?;
                let cmd = CommandPre::new(pre).map_err(|e| {
                    invalid("the component does not export wasi:cli/run", causes(e))
                })?;
                return Ok(Some(Program::Component(cmd)));
            }
        };
        if m.get_export("_start").is_none() {
            return Err(Error::Invalid(
                "the module exports no _start function; the wasm tier runs WASI command \
                 modules (built as executables, not libraries)"
                    .into(),
            ));
        }
        let pre = self.linkers.p1.instantiate_pre(&m).map_err(|e| {
            invalid(
                "the module imports something the sandbox does not provide",
                causes(e),
            )
        })?;
        Ok(Some(Program::Module(pre)))
    }
}

/// A wasmtime error shown with its whole chain of causes, as the source of a refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
struct Causes(wasmtime::Error);

struct Inner {
    config: WasmConfig,
    /// Host descriptors execs may reserve, all owners together and each owner.
    fds: FdBudget,
    /// Execs running, per owner (their share of the engines' instance slots) and per engine.
    running: std::sync::Mutex<Running>,
    plain: OnceLock<std::result::Result<EngineSet, Arc<WasmError>>>,
    fuel: OnceLock<std::result::Result<EngineSet, Arc<WasmError>>>,
    /// Make Python instances ahead of their execs and reset spent ones after.
    workers: standby::Workers,
}

#[derive(Default)]
struct Running {
    /// Per owner: execs running, host descriptors they reserved.
    per_owner: std::collections::HashMap<String, (u32, u64)>,
    /// Per engine: without fuel, with fuel (each has a pool of its own).
    per_engine: [u32; 2],
    /// Host descriptors every running exec reserved together.
    fds: u64,
}

/// The host descriptors the tier's execs may hold at once. Each open WASI file or directory
/// is a host descriptor of the server's process, so without a bound shared by all execs one
/// tenant's concurrent execs (each within its own `open_files`) could take the whole
/// process's table, and every other tenant's request would fail with EMFILE. Each exec
/// reserves its cap (`open_files` + 64) before it runs; `share` bounds one owner's
/// reservations (the same fraction of the total as its share of instance slots), so the
/// others keep theirs.
#[derive(Debug, Clone, Copy)]
struct FdBudget {
    total: u64,
    share: u64,
}

impl FdBudget {
    fn new(config: &WasmConfig) -> Self {
        let total = config.descriptors.unwrap_or_else(|| {
            let limit = sys::raise_nofile_limit();
            limit.saturating_sub((limit / 4).max(1024))
        });
        let pool = config.pool;
        let share = total.saturating_mul(u64::from(pool.per_owner.max(1)))
            / u64::from(pool.concurrent_execs.max(1));
        FdBudget {
            total,
            share: share.min(total),
        }
    }
}

/// One running exec's hold on its owner's share, its engine's slots and its descriptors;
/// released when dropped.
struct OwnerSlot {
    inner: Arc<Inner>,
    owner: String,
    fuel: bool,
    fds: u64,
}

impl Inner {
    /// Takes one of `owner`'s instance slots on the engine with or without `fuel` and `fds`
    /// host descriptors, or says why not.
    fn take_slot(self: &Arc<Self>, owner: &str, fuel: bool, fds: u64) -> Result<OwnerSlot> {
        let share = self
            .config
            .pool
            .per_owner
            .clamp(1, self.config.pool.concurrent_execs.max(1));
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let all = self.config.pool.concurrent_execs.max(1);
        if running.per_engine[usize::from(fuel)] >= all {
            return Err(Error::Busy {
                what: format!(
                    "this server already runs {all} wasm execs at once; retry in a moment, or \
                     ask the operator for a larger pool"
                ),
                retry_after_secs: 1,
            });
        }
        let budget = self.fds;
        let (n, held) = running.per_owner.get(owner).copied().unwrap_or_default();
        if n >= share {
            return Err(Error::Busy {
                what: format!(
                    "this tenant already runs {share} wasm execs at once, its share of the \
                     {} this server runs; wait for one to end, or ask the operator for a \
                     larger share",
                    self.config.pool.concurrent_execs
                ),
                retry_after_secs: 1,
            });
        }
        if fds > budget.total {
            return Err(Error::Invalid(format!(
                "an exec that may open {fds} files and directories is more than this server's \
                 wasm tier holds at once ({}); ask for a lower open_files",
                budget.total
            )));
        }
        if held.saturating_add(fds) > budget.share {
            return Err(Error::Busy {
                what: format!(
                    "this tenant's running wasm execs hold {held} of its {} host descriptors \
                     (each exec reserves its open_files plus {}, here {fds}); wait for one to \
                     end, or ask for a lower open_files",
                    budget.share,
                    run::RESOURCE_SLACK
                ),
                retry_after_secs: 1,
            });
        }
        if running.fds.saturating_add(fds) > budget.total {
            return Err(Error::Busy {
                what: format!(
                    "the wasm execs running on this server hold {} of its {} host \
                     descriptors; retry in a moment, or ask for a lower open_files",
                    running.fds, budget.total
                ),
                retry_after_secs: 1,
            });
        }
        running
            .per_owner
            .insert(owner.to_string(), (n + 1, held + fds));
        running.per_engine[usize::from(fuel)] += 1;
        running.fds += fds;
        Ok(OwnerSlot {
            inner: self.clone(),
            owner: owner.to_string(),
            fuel,
            fds,
        })
    }

    fn engines(&self, fuel: bool) -> Result<&EngineSet> {
        let cell = if fuel { &self.fuel } else { &self.plain };
        cell.get_or_init(|| EngineSet::new(fuel, self.config.pool).map_err(Arc::new))
            .as_ref()
            .map_err(|e| Error::failed("setting up the wasm tier", e.clone()))
    }
}

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        let mut running = self
            .inner
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = &mut running.per_engine[usize::from(self.fuel)];
        *e = e.saturating_sub(1);
        running.fds = running.fds.saturating_sub(self.fds);
        if let Some((n, fds)) = running.per_owner.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            *fds = fds.saturating_sub(self.fds);
            if *n == 0 {
                running.per_owner.remove(&self.owner);
            }
        }
    }
}

/// The wasm tier. Cheap to create; engines and guests load on first use (or [`Self::warm`]).
#[derive(Clone)]
pub struct WasmBackend {
    inner: Arc<Inner>,
}

impl WasmBackend {
    /// A backend with the default config: guests from [`data_dir`] (which honours
    /// `CORDON_HOME`), scratch dirs in the system temp dir.
    pub fn new() -> Self {
        Self::with_config(WasmConfig::default())
    }

    pub fn with_config(config: WasmConfig) -> Self {
        WasmBackend {
            inner: Arc::new(Inner {
                fds: FdBudget::new(&config),
                workers: standby::Workers::new(
                    config.pool.standby_instances,
                    config.pool.per_owner,
                ),
                config,
                running: Default::default(),
                plain: OnceLock::new(),
                fuel: OnceLock::new(),
            }),
        }
    }

    /// Loads (verifying, precompiling on a cache miss) a guest now instead of on first exec.
    pub fn warm(&self, guest: Guest) -> Result<()> {
        self.inner
            .engines(false)?
            .guest(&self.inner.config.data_dir, guest)
            .map(|_| ())
    }

    /// Python instances made ahead of their execs that this backend holds now (ADR 0019).
    pub fn standby_held(&self) -> u32 {
        self.inner.workers.held()
    }

    /// The data dir this backend reads guests from.
    pub fn data_dir(&self) -> &Path {
        &self.inner.config.data_dir
    }
}

impl Default for WasmBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for WasmBackend {
    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

    /// Nothing: a wasm sandbox's scratch lives under the server's data dir, which the server
    /// clears itself at start.
    fn recover(&self, _orphans: &[String]) -> Vec<String> {
        Vec::new()
    }

    fn tier(&self) -> Tier {
        Tier::Wasm
    }

    fn probe(&self) -> Probe {
        let dir = &self.inner.config.data_dir;
        let mut caps = Vec::new();
        match self.inner.engines(false) {
            Ok(_) => caps.push(Capability::ok(
                "wasmtime engine",
                "wasmtime 48, pooling allocator, epoch interruption",
            )),
            Err(e) => caps.push(Capability::missing(
                "wasmtime engine",
                e.to_string(),
                "check that the host allows large virtual memory reservations (ulimit -v)",
            )),
        }
        for guest in Guest::ALL {
            let name = format!("{} guest", guest.as_str());
            match artifacts::locate(dir, guest) {
                Ok(src) => caps.push(Capability::ok(name, src.path.display().to_string())),
                Err(e) => {
                    let mut c = Capability::missing(
                        name,
                        e.to_string(),
                        format!("run `{}`", Tier::Wasm.setup_command()),
                    );
                    c.required = false;
                    caps.push(c);
                }
            }
        }
        Probe::from_capabilities(
            Tier::Wasm,
            caps,
            vec![
                "capability-based WebAssembly sandbox: no network, no subprocesses, no host \
                 files; only its own size-limited /work"
                    .into(),
                "Python here is CPython 3.13 with a preloaded part of the standard library \
                 only; third-party packages need the container tier"
                    .into(),
            ],
        )
    }

    fn start_from_snapshot(
        &self,
        image: &cordon_core::SnapshotImage,
        dir: &cordon_core::SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Sandbox>> {
        snapshot::start(self, image, dir, spec)
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        let started = Instant::now();
        spec.validate()?;
        if !spec.egress.is_closed() || !spec.grants.is_empty() {
            // No network at all: the refusal of the feature, naming the tiers that have it.
            return Err(cordon_core::Feature::Network
                .unsupported(Tier::Wasm, "egress allow-lists and grants"));
        }
        let engines = self.inner.engines(spec.limits.fuel.is_some())?;
        let _ = engines;
        let scratch = tempfile::Builder::new()
            .prefix("cordon-wasm-")
            .tempdir_in(&self.inner.config.scratch_root)
            .map_err(|e| Error::io("creating the sandbox's scratch dir", e))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| Error::io("starting the sandbox's event loop", e))?;
        let disk = Arc::new(host::DiskLedger::default());
        Ok(Box::new(WasmSandbox {
            id: SandboxId::random()?,
            inner: self.inner.clone(),
            limits: spec.limits.clone(),
            env: spec.env.clone(),
            owner: spec.owner.clone().unwrap_or_default(),
            setup: Arc::new(run::Setup {
                scratch: scratch.path().to_path_buf(),
                limits: spec.limits.clone(),
                disk: disk.clone(),
            }),
            scratch: Some(scratch),
            disk,
            standby: standby::Standby::default(),
            last_end: None,
            rt,
            start_us: started.elapsed().as_micros() as u64,
        }))
    }
}

/// The outcome of an exec whose program did not finish compiling by its deadline.
fn compile_timeout(started: Instant, start_us: u64) -> ExecOutcome {
    let wall = started.elapsed().as_micros() as u64;
    let mut o = ExecOutcome::new(Tier::Wasm, cordon_core::Termination::Timeout);
    o.warnings.push(
        "the WebAssembly program was still compiling at the exec's timeout; it keeps compiling \
         in the background and a retry with the same bytes uses the result, or give a longer \
         --timeout"
            .into(),
    );
    o.usage.wall_time_us = wall;
    o.timings = Timings {
        start_us,
        run_us: wall,
        destroy_us: 0,
        program_us: 0,
    };
    o
}

/// One wasm sandbox: a scratch dir and its limits. Every exec gets a fresh store.
pub struct WasmSandbox {
    id: SandboxId,
    inner: Arc<Inner>,
    limits: Limits,
    env: std::collections::BTreeMap<String, String>,
    /// Whose share of the instance slots its execs take.
    owner: String,
    scratch: Option<tempfile::TempDir>,
    /// What its scratch dir holds, counted at every write (execs and file puts).
    disk: Arc<host::DiskLedger>,
    /// What every exec's instance is made with.
    setup: Arc<run::Setup>,
    /// The next Python exec's instance, made ahead (after an exec that followed a pause).
    standby: standby::Standby,
    /// When the last exec ended.
    last_end: Option<Instant>,
    rt: tokio::runtime::Runtime,
    start_us: u64,
}

impl WasmSandbox {
    fn scratch(&self) -> Result<&Path> {
        self.scratch
            .as_ref()
            .map(|d| d.path())
            .ok_or_else(|| Error::Gone {
                id: self.id.to_string(),
                reason: "destroyed".into(),
            })
    }

    /// The program an exec's command runs, and its arguments: a guest for Python and
    /// JavaScript, the user's own module (compiled within `deadline`: `None` when it was
    /// still compiling then) for WebAssembly; anything else is refused.
    fn launch_for(
        &self,
        engines: &EngineSet,
        command: &Command,
        deadline: Instant,
    ) -> Result<Option<Launch>> {
        let data_dir = &self.inner.config.data_dir;
        let with = |first: &[&str], args: &[String]| -> Vec<String> {
            first
                .iter()
                .map(|s| s.to_string())
                .chain(args.iter().cloned())
                .collect()
        };
        Ok(Some(match command {
            Command::Code {
                language: Language::Python,
                source,
                args,
            } => Launch {
                program: engines.guest(data_dir, Guest::Python)?,
                args: with(&["python", "-c", source], args),
                python: true,
            },
            Command::Code {
                language: Language::Javascript,
                source,
                args,
            } => Launch {
                program: engines.guest(data_dir, Guest::Javascript)?,
                args: with(&["js", source], args),
                python: false,
            },
            Command::Code { language, .. } => {
                return Err(cordon_core::Rejected::TierLanguage {
                    tier: Tier::Wasm,
                    language: *language,
                    fix: "it runs python and javascript; use --tier container for other languages",
                }
                .into());
            }
            Command::Argv(_) => {
                return Err(cordon_core::Feature::Programs.unsupported(
                    Tier::Wasm,
                    "a host program (give source code with --lang, or a WebAssembly program with \
                     --wasm)",
                ));
            }
            Command::Wasm { module, args } => {
                // Compiling counts against the exec's own deadline.
                let Some(program) = engines.user_program(&self.owner, module, deadline)? else {
                    return Ok(None);
                };
                Launch {
                    program,
                    args: with(&["main.wasm"], args),
                    python: false,
                }
            }
        }))
    }

    /// An exec's environment: the sandbox's, then the request's, over `HOME` and `LANG`.
    fn exec_env(&self, req: &ExecRequest) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), "/work".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        let mut merged = self.env.clone();
        merged.extend(req.env.clone());
        env.retain(|(k, _)| !merged.contains_key(k));
        env.extend(merged);
        env
    }

    /// Runs `launch` in an instance (the Python standby's, made ahead, where one is ready)
    /// holding `slot`; with `stand_by`, a worker then makes the next exec's instance.
    fn run_launch(
        &self,
        engines: &EngineSet,
        launch: &Launch,
        params: run::Params,
        deadline: Instant,
        slot: OwnerSlot,
        stand_by: bool,
    ) -> Result<Ran> {
        // CPU time spent for this exec on another thread (its standby's making).
        let mut elsewhere_ns = 0;
        let made = match launch.python.then(|| self.standby.take(deadline)).flatten() {
            Some(ready) => {
                elsewhere_ns = ready.cpu_ns();
                Instantiated::Ready(ready.bind(&self.setup, params, deadline)?)
            }
            None => run::instantiate(
                &self.rt,
                &engines.engine,
                &launch.program,
                &self.setup,
                params,
                deadline,
            )?,
        };
        let raw = match made {
            Instantiated::Ended(raw) => *raw,
            Instantiated::Ready(bound) => {
                let (raw, spent) = run::run(&self.rt, bound, &self.setup, deadline)?;
                // When this exec came after a pause, the next one is expected to as well: a
                // worker resets this one's pool slot and makes the next exec's instance (the
                // engine has spare slots for that) while the answer is read. Back to back,
                // the slot is reset here before the exec's place is given back: sharing the
                // two cores with a worker would cost the next exec more than the reset.
                if stand_by {
                    // The spent store first: the worker drops it before it makes the next
                    // instance, which then gets the slot just reset, with the pages it
                    // keeps resident.
                    self.inner.workers.dispose(Box::new(spent));
                    self.standby.request(
                        &self.inner.workers,
                        &self.owner,
                        standby::Job {
                            engine: engines.engine.clone(),
                            program: launch.program.clone(),
                            setup: self.setup.clone(),
                        },
                    );
                } else {
                    drop(spent);
                }
                raw
            }
        };
        drop(slot);
        Ok(Ran { raw, elsewhere_ns })
    }
}

/// What an exec runs: the program and its arguments (`python` for the Python guest, whose
/// instances can be made ahead).
struct Launch {
    program: Program,
    args: Vec<String>,
    python: bool,
}

/// An exec's run: what it ended with, and the CPU time spent for it on another thread.
struct Ran {
    raw: run::Raw,
    elsewhere_ns: u64,
}

/// The wasm tier runs in `/work` only.
fn check_cwd(req: &ExecRequest) -> Result<()> {
    if let Some(cwd) = &req.cwd
        && cwd.trim_end_matches('/') != cordon_core::WORKDIR
    {
        return Err(Error::Invalid(format!(
            "the wasm tier runs in /work only, not {cwd:?}"
        )));
    }
    Ok(())
}

/// An exec's outcome from what it ended with, the CPU time it took and its wall time.
fn outcome(raw: run::Raw, cpu_ns: u64, wall_us: u64, start_us: u64) -> ExecOutcome {
    let mut o = ExecOutcome::new(Tier::Wasm, raw.termination);
    o.exit_code = raw.exit_code;
    o.signal = raw.signal;
    o.stdout = raw.stdout;
    o.stderr = raw.stderr;
    o.stdout_truncated = raw.stdout_truncated;
    o.stderr_truncated = raw.stderr_truncated;
    o.warnings = raw.warnings;
    o.usage = Usage {
        cpu_time_us: cpu_ns / 1000,
        peak_memory_bytes: raw.peak_memory,
        wall_time_us: wall_us,
    };
    o.timings = Timings {
        start_us,
        run_us: wall_us,
        destroy_us: 0,
        program_us: 0,
    };
    o
}

impl Sandbox for WasmSandbox {
    fn set_owner(&mut self, owner: &str) {
        self.owner = owner.to_string();
    }

    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        let started = Instant::now();
        // Whether this exec came after a pause (an agent reading the last answer), which
        // predicts one after it too (ADR 0019, ADR 0020).
        let paced = self.last_end.is_some_and(|end| {
            started.saturating_duration_since(end) >= self.inner.config.standby_pause
        });
        let cpu0 = sys::thread_cpu_ns();
        self.scratch()?;
        check_cwd(req)?;
        let engines = self.inner.engines(self.limits.fuel.is_some())?;
        let timeout =
            std::time::Duration::from_millis(req.timeout_ms.unwrap_or(self.limits.timeout_ms));
        let deadline = started + timeout;
        let Some(mut launch) = self.launch_for(engines, &req.command, deadline)? else {
            return Ok(compile_timeout(started, self.start_us));
        };
        let env = self.exec_env(req);
        let slot = self.inner.take_slot(
            &self.owner,
            self.limits.fuel.is_some(),
            run::resource_cap(&self.limits) as u64,
        )?;
        let params = run::Params {
            args: std::mem::take(&mut launch.args),
            env,
            stdin: req.stdin.clone().unwrap_or_default(),
        };
        // Standing by for the next exec when this one came after a pause.
        let stand_by = launch.python && paced && !req.last && self.inner.workers.enabled();
        let ran = self.run_launch(engines, &launch, params, deadline, slot, stand_by)?;
        if !ran.raw.stdout.is_empty() {
            sink.output(OutputStream::Stdout, &ran.raw.stdout);
        }
        if !ran.raw.stderr.is_empty() {
            sink.output(OutputStream::Stderr, &ran.raw.stderr);
        }
        let wall = started.elapsed().as_micros() as u64;
        self.last_end = Some(Instant::now());
        let cpu_ns = sys::thread_cpu_ns()
            .saturating_sub(cpu0)
            .saturating_add(ran.elsewhere_ns);
        Ok(outcome(ran.raw, cpu_ns, wall, self.start_us))
    }

    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        cordon_core::refuse_outside(Tier::Wasm, path)?;
        let root = self.scratch()?.to_path_buf();
        files::put(&root, self.limits.disk_bytes, &self.disk, path, data, mode)
    }

    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        cordon_core::refuse_outside(Tier::Wasm, path)?;
        let root = self.scratch()?.to_path_buf();
        files::get(&root, path, max_bytes)
    }

    fn file_op(&mut self, op: &cordon_core::FileOp) -> Result<cordon_core::FileReply> {
        if matches!(op, cordon_core::FileOp::SetMetadata { .. }) {
            return Err(cordon_core::Feature::FileMetadata.unsupported_here("metadata on a file"));
        }
        for p in op.paths() {
            cordon_core::refuse_outside(Tier::Wasm, p)?;
        }
        let root = self.scratch()?.to_path_buf();
        files::op(&root, &self.disk, op)
    }

    fn put_archive(
        &mut self,
        dir: &str,
        tar: &mut dyn std::io::Read,
    ) -> Result<cordon_core::ArchiveReport> {
        let root = self.scratch()?.to_path_buf();
        files::unpack(&root, self.limits.disk_bytes, &self.disk, dir, tar)
    }

    fn get_archive(
        &mut self,
        dir: &str,
        max_bytes: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<cordon_core::ArchiveReport> {
        let root = self.scratch()?.to_path_buf();
        files::pack(&root, dir, max_bytes, out)
    }

    fn snapshot(
        &mut self,
        mode: cordon_core::SnapshotMode,
        dir: &cordon_core::SnapshotDir,
    ) -> Result<cordon_core::SnapshotImage> {
        let root = self.scratch()?.to_path_buf();
        snapshot::take(&root, self.limits.disk_bytes, mode, dir)
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn destroy(&mut self) -> Result<()> {
        self.standby.clear(&self.inner.workers);
        if let Some(dir) = self.scratch.take() {
            let path = dir.path().to_path_buf();
            dir.close()
                .map_err(|e| Error::io(format!("removing scratch dir {}", path.display()), e))?;
        }
        Ok(())
    }
}

impl Drop for WasmSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}
