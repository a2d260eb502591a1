//! One exec: a fresh store with its own WASI context, limits and captured stdio; the
//! program runs to an outcome under the epoch deadline and an outer wall-clock timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cordon_core::{Evidence, ExitReport, Limits, Termination};
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, InstancePre, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::engine::MAX_TABLE_ELEMENTS;
use crate::host::{Capture, DiskLedger, DiskQuota, Flags, Limiter, Stop};
use crate::quota::{HasP1Ctx, HasQuota};

/// Store state of a preview 2 component.
pub(crate) struct P2State {
    ctx: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    quota: Arc<DiskQuota>,
}

impl WasiView for P2State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

impl HasQuota for P2State {
    fn quota(&self) -> &Arc<DiskQuota> {
        &self.quota
    }
}

/// Store state of a preview 1 module.
pub(crate) struct P1State {
    ctx: WasiP1Ctx,
    limiter: Limiter,
    quota: Arc<DiskQuota>,
}

impl HasQuota for P1State {
    fn quota(&self) -> &Arc<DiskQuota> {
        &self.quota
    }
}

impl HasP1Ctx for P1State {
    fn p1(&mut self) -> &mut WasiP1Ctx {
        &mut self.ctx
    }
}

/// The linkers of one engine: WASI preview 2 and preview 1, with the disk-quota shadows.
pub(crate) struct Linkers {
    pub p2: wasmtime::component::Linker<P2State>,
    pub p1: wasmtime::Linker<P1State>,
}

impl Linkers {
    pub fn new(engine: &Engine) -> wasmtime::Result<Self> {
        let mut p2 = wasmtime::component::Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut p2)?;
        crate::quota::shadow_p2(&mut p2)?;
        let mut p1 = wasmtime::Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut p1, |s: &mut P1State| &mut s.ctx)?;
        crate::quota::shadow_p1(&mut p1)?;
        Ok(Linkers { p2, p1 })
    }
}

/// A program ready to instantiate.
#[derive(Clone)]
pub(crate) enum Program {
    Component(CommandPre<P2State>),
    Module(InstancePre<P1State>),
}

/// WASI resources (open files and directories, their streams, pollables) an exec may hold
/// at once beyond `Limits.open_files`: each open file or directory holds one host
/// descriptor, so this bounds the host descriptors one sandbox can take.
pub(crate) const RESOURCE_SLACK: u64 = 64;

pub(crate) fn resource_cap(limits: &Limits) -> usize {
    usize::try_from(limits.open_files.saturating_add(RESOURCE_SLACK)).unwrap_or(usize::MAX)
}

/// How one exec ended, before it is put in the core's outcome shape.
pub(crate) struct Raw {
    pub termination: Termination,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub peak_memory: u64,
    pub warnings: Vec<String>,
}

/// Grace after the deadline for a guest blocked inside a host call (sleeping, polling):
/// the outer timeout drops the whole call.
const GRACE: Duration = Duration::from_millis(50);

/// What an instance is made with before its exec is known: the sandbox's own setup.
pub(crate) struct Setup {
    pub scratch: PathBuf,
    pub limits: Limits,
    /// The sandbox's disk count, shared by its execs and file puts.
    pub disk: Arc<DiskLedger>,
}

/// What one exec gets besides its sandbox's setup.
pub(crate) struct Params {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

/// An instance made ahead of its exec (a standby), in its own new store, whose WASI context
/// gives the guest nothing (no arguments, environment, stdio or directory) until
/// [`Ready::bind`] gives it one exec's. Never shared: it serves exactly one exec.
pub(crate) struct Ready {
    flags: Arc<Flags>,
    made: Made,
    /// CPU time the making took, on the thread that made it.
    cpu_ns: u64,
}

/// An instance with its exec's context, its deadline and fuel set: ready to run.
pub(crate) struct Bound {
    flags: Arc<Flags>,
    made: Made,
    stdout: Capture,
    stderr: Capture,
}

enum Made {
    Component {
        store: Store<P2State>,
        cmd: wasmtime_wasi::p2::bindings::Command,
    },
    Module {
        store: Store<P1State>,
        inst: wasmtime::Instance,
    },
}

/// An instance whose exec has ended. Dropping it resets its pool slot (copying back the
/// pages the guest wrote), which the caller may leave to another thread.
pub(crate) struct Spent(#[allow(dead_code)] Made);

/// The result of making an instance for an exec: one ready to run, or how the exec ended
/// without one (the memory limit refused its memories, the pool was full, the deadline
/// passed, a start function trapped).
pub(crate) enum Instantiated {
    Ready(Bound),
    Ended(Box<Raw>),
}

/// One exec's WASI context: its arguments, environment, stdin, captured and capped stdout
/// and stderr, the sandbox's scratch dir as `/work`, no network.
fn exec_ctx(
    setup: &Setup,
    p: Params,
    flags: &Arc<Flags>,
) -> Result<(WasiCtxBuilder, Capture, Capture), cordon_core::Error> {
    let stdout = Capture::new(setup.limits.stdout_bytes, flags.clone());
    let stderr = Capture::new(setup.limits.stderr_bytes, flags.clone());
    let mut b = WasiCtxBuilder::new();
    b.args(&p.args)
        .envs(&p.env)
        .stdin(MemoryInputPipe::new(p.stdin))
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        // Filesystem calls run on this thread, not handed to tokio's blocking pool and back
        // (two thread switches per call, over 0.1 ms of every Python exec). They only reach the
        // sandbox's own scratch dir, bounded by the disk quota, where nothing can block for
        // long (no FIFOs or devices can appear there); the deadline is checked on return.
        .allow_blocking_current_thread(true);
    b.preopened_dir(&setup.scratch, "/work", FsPerms::ReadWrite)
        .map_err(|e| cordon_core::Error::Failed {
            what: "could not open the scratch dir".into(),
            source: e.into(),
        })?;
    Ok((b, stdout, stderr))
}

/// A WASI context that grants nothing, for an instance whose exec is not known yet.
fn empty_ctx() -> WasiCtxBuilder {
    let mut b = WasiCtxBuilder::new();
    b.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    b
}

/// The time left before `deadline` plus [`GRACE`]: the whole exec, instantiation and run,
/// ends by `deadline + GRACE` at the latest.
fn outer(deadline: Instant) -> Duration {
    (deadline + GRACE).saturating_duration_since(Instant::now())
}

/// A new store for `program` with the sandbox's memory, table and instance limits, fuel and
/// deadline, and the WASI context `ctx`, and an instance in it; or why there is none, with
/// the memory its store reached.
fn make(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    program: &Program,
    setup: &Setup,
    mut ctx: WasiCtxBuilder,
    flags: &Arc<Flags>,
    deadline: Instant,
) -> Result<Result<Made, NotMade>, cordon_core::Error> {
    let quota = Arc::new(DiskQuota::new(
        setup.scratch.clone(),
        setup.limits.disk_bytes,
        setup.disk.clone(),
        flags.clone(),
    ));
    let limiter = Limiter {
        memory_bytes: usize::try_from(setup.limits.memory_bytes).unwrap_or(usize::MAX),
        table_elements: MAX_TABLE_ELEMENTS,
        flags: flags.clone(),
        total_memory: 0,
        peak_memory: 0,
    };
    let arming = (deadline, flags, setup.limits.fuel);
    Ok(match program {
        Program::Component(pre) => {
            let mut table = ResourceTable::new();
            table.set_max_capacity(resource_cap(&setup.limits));
            let state = P2State {
                ctx: ctx.build(),
                table,
                limiter,
                quota,
            };
            instantiated(rt, engine, state, arming, async |s| {
                pre.instantiate_async(s).await
            })?
            .map(|(store, cmd)| Made::Component { store, cmd })
        }
        Program::Module(pre) => {
            let mut p1 = ctx.build_p1();
            p1.ctx().table.set_max_capacity(resource_cap(&setup.limits));
            let state = P1State {
                ctx: p1,
                limiter,
                quota,
            };
            instantiated(rt, engine, state, arming, async |s| {
                pre.instantiate_async(s).await
            })?
            .map(|(store, inst)| Made::Module { store, inst })
        }
    })
}

/// Why no instance was made: the instantiation's error (`None`: the deadline passed), with
/// the memory its store reached.
type NotMade = (Option<wasmtime::Error>, usize);

/// A store state that carries the sandbox's [`Limiter`].
trait Limited: Send + 'static {
    fn limiter(&mut self) -> &mut Limiter;
    fn peak_memory(&self) -> usize;
}

impl Limited for P2State {
    fn limiter(&mut self) -> &mut Limiter {
        &mut self.limiter
    }
    fn peak_memory(&self) -> usize {
        self.limiter.peak_memory
    }
}

impl Limited for P1State {
    fn limiter(&mut self) -> &mut Limiter {
        &mut self.limiter
    }
    fn peak_memory(&self) -> usize {
        self.limiter.peak_memory
    }
}

/// A store of `state` with its limiter, its fuel and its deadline (`arming`), and
/// `instantiate` run in it by that deadline: the store and what it made, or why not (`None`:
/// the deadline passed) with the memory the store reached.
fn instantiated<S: Limited, T>(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    state: S,
    (deadline, flags, fuel): (Instant, &Arc<Flags>, Option<u64>),
    instantiate: impl AsyncFnOnce(&mut Store<S>) -> wasmtime::Result<T>,
) -> Result<Result<(Store<S>, T), NotMade>, cordon_core::Error> {
    let mut store = Store::new(engine, state);
    store.limiter(|s| s.limiter());
    arm(&mut store, deadline, flags.clone(), fuel)?;
    let r =
        rt.block_on(async { tokio::time::timeout(outer(deadline), instantiate(&mut store)).await });
    Ok(match r {
        Ok(Ok(made)) => Ok((store, made)),
        Ok(Err(e)) => Err((Some(e), store.data().peak_memory())),
        Err(_elapsed) => Err((None, store.data().peak_memory())),
    })
}

/// Makes a fresh instance of `program` for the exec `p` of the sandbox set up as `setup`,
/// within `deadline`. Any start function of the program runs inside that exec's context, and
/// the exec's fuel covers instantiation and run together.
pub(crate) fn instantiate(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    program: &Program,
    setup: &Setup,
    p: Params,
    deadline: Instant,
) -> Result<Instantiated, cordon_core::Error> {
    let flags = Arc::new(Flags::default());
    let (ctx, stdout, stderr) = exec_ctx(setup, p, &flags)?;
    Ok(
        match make(rt, engine, program, setup, ctx, &flags, deadline)? {
            Ok(made) => Instantiated::Ready(Bound {
                flags,
                made,
                stdout,
                stderr,
            }),
            Err((e, peak)) => Instantiated::Ended(Box::new(conclude(
                e.map_or(Err(()), |e| Ok(Err(e))),
                &flags,
                stdout.take(),
                stderr.take(),
                peak,
                setup.limits.open_files,
            ))),
        },
    )
}

/// Makes an instance of `program` ahead of an exec not known yet, for the sandbox set up as
/// `setup` (only for Cordon's own guests, which run no code of a user's at instantiation).
/// `None` when it could not be made: the exec then makes its own and reports why.
pub(crate) fn instantiate_ahead(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    program: &Program,
    setup: &Setup,
    deadline: Instant,
) -> Result<Option<Ready>, cordon_core::Error> {
    let cpu0 = crate::sys::thread_cpu_ns();
    let flags = Arc::new(Flags::default());
    let made = make(rt, engine, program, setup, empty_ctx(), &flags, deadline)?;
    Ok(made.ok().map(|made| Ready {
        flags,
        made,
        cpu_ns: crate::sys::thread_cpu_ns().saturating_sub(cpu0),
    }))
}

impl Ready {
    /// CPU time making this instance took (counted in the exec's usage, since another thread
    /// made it).
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns
    }

    /// Gives the instance the exec `p`'s own context in place of the empty one, and sets its
    /// deadline and fuel afresh.
    pub fn bind(
        self,
        setup: &Setup,
        p: Params,
        deadline: Instant,
    ) -> Result<Bound, cordon_core::Error> {
        let Ready { flags, made, .. } = self;
        let (mut ctx, stdout, stderr) = exec_ctx(setup, p, &flags)?;
        let made = match made {
            Made::Component { mut store, cmd } => {
                store.data_mut().ctx = ctx.build();
                arm(&mut store, deadline, flags.clone(), setup.limits.fuel)?;
                Made::Component { store, cmd }
            }
            Made::Module { mut store, inst } => {
                let mut p1 = ctx.build_p1();
                p1.ctx().table.set_max_capacity(resource_cap(&setup.limits));
                store.data_mut().ctx = p1;
                arm(&mut store, deadline, flags.clone(), setup.limits.fuel)?;
                Made::Module { store, inst }
            }
        };
        Ok(Bound {
            flags,
            made,
            stdout,
            stderr,
        })
    }
}

/// Runs one exec in `bound`, an instance made for this sandbox and given the exec's context.
pub(crate) fn run(
    rt: &tokio::runtime::Runtime,
    bound: Bound,
    setup: &Setup,
    deadline: Instant,
) -> Result<(Raw, Spent), cordon_core::Error> {
    let Bound {
        flags,
        made,
        stdout,
        stderr,
    } = bound;
    let (result, peak, spent) = match made {
        Made::Component { mut store, cmd } => {
            let r = rt.block_on(async {
                tokio::time::timeout(outer(deadline), async {
                    let r = cmd.wasi_cli_run().call_run(&mut store).await?;
                    Ok::<i32, wasmtime::Error>(if r.is_ok() { 0 } else { 1 })
                })
                .await
            });
            let peak = store.data().limiter.peak_memory;
            (r, peak, Made::Component { store, cmd })
        }
        Made::Module { mut store, inst } => {
            let r = rt.block_on(async {
                tokio::time::timeout(outer(deadline), async {
                    let start = inst.get_typed_func::<(), ()>(&mut store, "_start")?;
                    start.call_async(&mut store, ()).await?;
                    Ok::<i32, wasmtime::Error>(0)
                })
                .await
            });
            let peak = store.data().limiter.peak_memory;
            (r, peak, Made::Module { store, inst })
        }
    };
    let raw = conclude(
        result.map_err(|_| ()),
        &flags,
        stdout.take(),
        stderr.take(),
        peak,
        setup.limits.open_files,
    );
    Ok((raw, Spent(spent)))
}

/// How an exec ended, from the guest's result (`Err` for the outer timeout) and the flags it
/// raised: the evidence is gathered here and [`cordon_core::classify`] draws the conclusion.
fn conclude(
    result: std::result::Result<wasmtime::Result<i32>, ()>,
    flags: &Flags,
    (out, out_trunc): (Vec<u8>, bool),
    (err, err_trunc): (Vec<u8>, bool),
    peak: usize,
    open_files: u64,
) -> Raw {
    let mut warnings = Vec::new();
    let end = match result {
        Err(()) => GuestEnd::Stopped(Termination::Timeout),
        Ok(Ok(code)) => GuestEnd::Exited(code),
        Ok(Err(e)) => read_error(&e, &mut warnings, open_files),
    };
    let evidence = end.evidence(flags);
    let termination = cordon_core::classify(&evidence);
    let report = evidence.reported.unwrap_or_default();
    Raw {
        termination,
        exit_code: report.code.filter(|_| termination == Termination::Exited),
        signal: report
            .signal
            .filter(|_| termination == Termination::Signalled),
        stdout: out,
        stderr: err,
        stdout_truncated: out_trunc,
        stderr_truncated: err_trunc,
        peak_memory: peak as u64,
        warnings,
    }
}

/// What the guest's end was, as the host saw it: facts, not yet a termination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuestEnd {
    /// It exited (returned from its entry point, or called `proc_exit`) with this code.
    Exited(i32),
    /// It trapped; the trap as the signal a native program would have died of.
    Trapped(i32),
    /// Cordon stopped it: the deadline, fuel, the output cap.
    Stopped(Termination),
    /// Its resource table was full (the tier's process limit: too many open files and
    /// WASI resources at once).
    TableFull,
    /// The host failed under it.
    HostFailed,
}

impl GuestEnd {
    /// The evidence for the one classification every tier uses: a stop of Cordon's, the
    /// guest's exit or trap (reported as a signal), a host error (no end reported: the
    /// sandbox failed), the resource table full (a refused fork), and a refused memory grow
    /// or disk write when the guest then failed.
    fn evidence(self, flags: &Flags) -> Evidence {
        let stopped = match self {
            GuestEnd::Stopped(t) => Some(t),
            GuestEnd::TableFull => None,
            _ if flags.output_limit.load(Ordering::Relaxed) => Some(Termination::OutputLimit),
            _ => None,
        };
        let reported = match self {
            GuestEnd::Exited(code) => Some(ExitReport {
                code: Some(code),
                signal: None,
            }),
            GuestEnd::Trapped(signal) => Some(ExitReport {
                code: None,
                signal: Some(signal),
            }),
            _ => None,
        };
        let failed = match self {
            GuestEnd::Exited(code) => code != 0,
            GuestEnd::Trapped(_) | GuestEnd::HostFailed => true,
            GuestEnd::Stopped(_) | GuestEnd::TableFull => false,
        };
        Evidence {
            stopped,
            reported,
            oom_killed: failed && flags.memory_refused.load(Ordering::Relaxed),
            forks_refused: self == GuestEnd::TableFull,
            disk_full: failed && flags.disk_refused.load(Ordering::Relaxed),
        }
    }
}

/// Sets the deadline, the output-limit check and fuel on a fresh store.
fn arm<T: 'static>(
    store: &mut Store<T>,
    deadline: Instant,
    flags: Arc<Flags>,
    fuel: Option<u64>,
) -> Result<(), cordon_core::Error> {
    if let Some(f) = fuel {
        store.set_fuel(f).map_err(|e| cordon_core::Error::Failed {
            what: "could not set fuel".into(),
            source: e.into(),
        })?;
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if flags.output_limit.load(Ordering::Relaxed) {
            return Err(wasmtime::Error::new(Stop(Termination::OutputLimit)));
        }
        if Instant::now() >= deadline {
            return Err(wasmtime::Error::new(Stop(Termination::Timeout)));
        }
        Ok(UpdateDeadline::Yield(1))
    });
    Ok(())
}

/// Reads an error out of the guest: how it ended as far as the error says (a stop, an exit,
/// a trap, the resource table full, or a host failure); [`conclude`] classifies.
fn read_error(e: &wasmtime::Error, warnings: &mut Vec<String>, open_files: u64) -> GuestEnd {
    for cause in e.chain() {
        if let Some(wasmtime::component::ResourceTableError::Full) =
            cause.downcast_ref::<wasmtime::component::ResourceTableError>()
        {
            warnings.push(format!(
                "the program held more open files and WASI resources at once than the \
                 sandbox allows (--open-files {open_files}, plus {RESOURCE_SLACK}); close \
                 files it no longer needs or raise --open-files"
            ));
            return GuestEnd::TableFull;
        }
        if let Some(exit) = cause.downcast_ref::<I32Exit>() {
            return GuestEnd::Exited(exit.0);
        }
        if let Some(Stop(t)) = cause.downcast_ref::<Stop>() {
            return GuestEnd::Stopped(*t);
        }
        if let Some(trap) = cause.downcast_ref::<Trap>() {
            let (end, what) = match *trap {
                Trap::Interrupt => (GuestEnd::Stopped(Termination::Timeout), None),
                Trap::OutOfFuel => (
                    GuestEnd::Stopped(Termination::Timeout),
                    Some("the fuel limit was reached (deterministic CPU bound)"),
                ),
                Trap::StackOverflow => (
                    GuestEnd::Trapped(11),
                    Some("wasm stack exhausted (deep recursion); reported as SIGSEGV"),
                ),
                Trap::UnreachableCodeReached => (
                    GuestEnd::Trapped(6),
                    Some("the guest aborted (wasm unreachable); reported as SIGABRT"),
                ),
                Trap::IntegerDivisionByZero
                | Trap::IntegerOverflow
                | Trap::BadConversionToInteger => (
                    GuestEnd::Trapped(8),
                    Some("arithmetic trap; reported as SIGFPE"),
                ),
                _ => (
                    GuestEnd::Trapped(11),
                    Some("memory or table fault; reported as SIGSEGV"),
                ),
            };
            if let Some(w) = what {
                warnings.push(format!("{w}: {trap}"));
            }
            return end;
        }
    }
    warnings.push(format!("wasm host error: {e:#}"));
    GuestEnd::HostFailed
}
