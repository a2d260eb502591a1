//! Cordon's `runtime` tier: an in-process QuickJS (rquickjs, native) for trusted, static
//! JavaScript snippets.
//!
//! **This is the weakest wall Cordon has.** The snippet runs inside the Cordon process; the
//! only thing between it and the host is the QuickJS interpreter itself (a C program). There
//! are no I/O objects at all: no `std`/`os` modules, no module loader, no filesystem, no
//! network, no timers; only pure computation on the snippet's own values, with `console.*`
//! captured as output (capped). Limits: a memory limit on the QuickJS heap, an interrupt
//! handler that stops the snippet at the wall-clock deadline (or when output passes its cap),
//! and a stack limit. Each exec gets a fresh runtime on its own thread. Never use this tier
//! for anything downstream of untrusted text: use `wasm` or stronger.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cordon_core::{
    Backend, Capability, Command, Error, Evidence, ExecOutcome, ExecRequest, ExitReport, Language,
    Limits, OutputSink, OutputStream, Probe, Result, Sandbox, SandboxId, SandboxSpec, Termination,
    Tier, Timings, Usage,
};
use rquickjs::{Array, Context, Ctx, Function, Runtime, Value};

/// The console shared with the wasm tier's JavaScript guest, so both print alike.
const PRELUDE: &str = include_str!("../../../guests/js/src/prelude.js");

/// Native stack of the thread an exec runs on, and the part QuickJS may use.
const THREAD_STACK: usize = 16 << 20;
const JS_STACK: usize = 8 << 20;

/// The in-process QuickJS tier.
#[derive(Debug, Clone, Default)]
pub struct RuntimeBackend;

impl RuntimeBackend {
    pub fn new() -> Self {
        RuntimeBackend
    }
}

/// What `doctor` and the probe say about this tier's wall.
pub const WALL_NOTE: &str = "runtime tier: in-process QuickJS, the weakest wall - the snippet \
    shares the Cordon process and only the interpreter stands between it and the host; no I/O \
    objects at all; for trusted, static snippets only, never for anything downstream of \
    untrusted text";

impl Backend for RuntimeBackend {
    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

    /// Nothing: a runtime sandbox lives only in the process that made it.
    fn recover(&self, _orphans: &[String]) -> Vec<String> {
        Vec::new()
    }

    fn tier(&self) -> Tier {
        Tier::Runtime
    }

    fn probe(&self) -> Probe {
        Probe::from_capabilities(
            Tier::Runtime,
            vec![Capability::ok(
                "quickjs",
                "rquickjs 0.14 (QuickJS-ng), built into cordon",
            )],
            vec![WALL_NOTE.to_string()],
        )
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        let started = Instant::now();
        spec.validate()?;
        if !spec.egress.is_closed() || !spec.grants.is_empty() {
            // No I/O at all: the refusal of the feature, naming the tiers that have it.
            return Err(cordon_core::Feature::Network
                .unsupported(Tier::Runtime, "egress allow-lists and grants"));
        }
        Ok(Box::new(RuntimeSandbox {
            id: SandboxId::random()?,
            limits: spec.limits.clone(),
            start_us: started.elapsed().as_micros() as u64,
            destroyed: false,
        }))
    }
}

/// A runtime-tier sandbox: only limits; every exec gets a fresh interpreter.
pub struct RuntimeSandbox {
    id: SandboxId,
    limits: Limits,
    start_us: u64,
    destroyed: bool,
}

struct Capture {
    data: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: u64) -> Self {
        Capture {
            data: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            truncated: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) -> bool {
        let room = self.cap.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.data.extend_from_slice(&bytes[..room]);
            self.truncated = true;
            return false;
        }
        self.data.extend_from_slice(bytes);
        true
    }
}

struct Raw {
    termination: Termination,
    exit_code: Option<i32>,
    stdout: Capture,
    stderr: Capture,
    memory: u64,
    cpu_ns: u64,
}

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// QuickJS's own refusal of an allocation past the runtime's memory limit: it throws an
/// `InternalError` whose message is exactly "out of memory". (A script could throw one of
/// its own; it would only misreport its own end, which it can cause for real anyway.)
fn is_memory_refusal(exc: &Value) -> bool {
    exc.as_object().is_some_and(|o| {
        o.get::<_, String>("name")
            .is_ok_and(|n| n == "InternalError")
            && o.get::<_, String>("message")
                .is_ok_and(|m| m == "out of memory")
    })
}

fn describe<'js>(
    ctx: &Ctx<'js>,
    inspect: &Function<'js>,
    err: rquickjs::Error,
    memory_refused: &mut bool,
) -> String {
    match err {
        rquickjs::Error::Exception => {
            let exc: Value = ctx.catch();
            *memory_refused = is_memory_refusal(&exc);
            inspect
                .call::<_, String>((exc,))
                .unwrap_or_else(|_| "exception (could not be printed)".to_string())
        }
        other => other.to_string(),
    }
}

/// A script's output, shared with the `write` callback it prints through.
type Output = Rc<RefCell<(Capture, Capture)>>;

/// Cordon's stops of a script: its output past the cap (set by the `write` callback) and the
/// deadline (set by the interrupt handler).
#[derive(Clone, Default)]
struct Stops {
    timed_out: Arc<AtomicBool>,
    flooded: Arc<AtomicBool>,
}

impl Stops {
    fn stopped(&self) -> Option<Termination> {
        if self.flooded.load(Ordering::Relaxed) {
            Some(Termination::OutputLimit)
        } else if self.timed_out.load(Ordering::Relaxed) {
            Some(Termination::Timeout)
        } else {
            None
        }
    }
}

/// How a script ended: its status (an error where QuickJS itself failed), and whether it
/// ended on the engine's refusal of memory past the limit.
struct Ended {
    status: rquickjs::Result<i32>,
    memory_refused: bool,
}

fn eval(source: &str, args: &[String], limits: &Limits, timeout: Duration) -> Raw {
    let cpu0 = thread_cpu_ns();
    let out: Output = Rc::new(RefCell::new((
        Capture::new(limits.stdout_bytes),
        Capture::new(limits.stderr_bytes),
    )));
    let stops = Stops::default();
    let (rt, ctx) = match start_quickjs(limits, timeout, &stops) {
        Ok(started) => started,
        Err(e) => return not_started(e),
    };
    let ended = run_script(&ctx, source, args, &out, &stops);
    let usage = rt.memory_usage();
    let memory = u64::try_from(usage.malloc_size.max(0)).unwrap_or(0);
    drop(ctx);
    drop(rt);
    let (stdout, stderr) = take_output(out);
    let mut raw = conclude(ended, &stops, stdout, stderr);
    raw.memory = memory;
    raw.cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    raw
}

/// A QuickJS runtime within the memory and stack limits, stopped by `stops` (the output
/// cap, or `timeout` from now), and its context.
fn start_quickjs(
    limits: &Limits,
    timeout: Duration,
    stops: &Stops,
) -> rquickjs::Result<(Runtime, Context)> {
    let rt = Runtime::new()?;
    let memory_limit = usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX);
    rt.set_memory_limit(memory_limit);
    rt.set_max_stack_size(JS_STACK);
    let deadline = Instant::now() + timeout;
    let stops = stops.clone();
    rt.set_interrupt_handler(Some(Box::new(move || {
        if stops.flooded.load(Ordering::Relaxed) {
            return true;
        }
        if Instant::now() >= deadline {
            stops.timed_out.store(true, Ordering::Relaxed);
            return true;
        }
        false
    })));
    let ctx = Context::full(&rt)?;
    Ok((rt, ctx))
}

/// The end of a script QuickJS could not start: no end of the script to report, so the
/// classification's lost agent.
fn not_started(e: rquickjs::Error) -> Raw {
    let mut stderr = Capture::new(u64::MAX);
    stderr.push(format!("could not start QuickJS: {e}\n").as_bytes());
    Raw {
        termination: cordon_core::classify(&Evidence::default()),
        exit_code: None,
        stdout: Capture::new(0),
        stderr,
        memory: 0,
        cpu_ns: 0,
    }
}

/// Runs `source` with `scriptArgs` set to `args`, printing through the console to `out`;
/// its value (when not undefined) is printed, an uncaught exception (of the script or of a
/// pending job) goes to stderr and makes the status 1.
fn run_script(ctx: &Context, source: &str, args: &[String], out: &Output, stops: &Stops) -> Ended {
    // The memory limit's evidence: the engine refused an allocation past it and the program
    // ended on that refusal (set where the uncaught exception is read, not from the text
    // the program wrote).
    let mut memory_refused = false;
    let status = ctx.with(|ctx| {
        let out = out.clone();
        let flooded = stops.flooded.clone();
        let write = move |fd: i32, text: rquickjs::String<'_>| -> rquickjs::Result<()> {
            let s = text.to_string()?;
            let mut o = out.borrow_mut();
            let c = if fd == 2 { &mut o.1 } else { &mut o.0 };
            if !c.push(s.as_bytes()) {
                flooded.store(true, Ordering::Relaxed);
            }
            Ok(())
        };
        let setup: Function = ctx.eval(PRELUDE)?;
        let write_fn = Function::new(ctx.clone(), write)?;
        let inspect: Function = setup.call((write_fn.clone(),))?;
        let argv = Array::new(ctx.clone())?;
        for (i, a) in args.iter().enumerate() {
            argv.set(i, a.as_str())?;
        }
        ctx.globals().set("scriptArgs", argv)?;
        let mut status = match ctx.eval::<Value, _>(source) {
            Ok(v) if v.is_undefined() => 0,
            Ok(v) => {
                let text: String = inspect.call((v,)).unwrap_or_default();
                let _ = write_fn.call::<_, ()>((1, text + "\n"));
                0
            }
            Err(e) => {
                let text = describe(&ctx, &inspect, e, &mut memory_refused);
                let _ = write_fn.call::<_, ()>((2, format!("Uncaught {text}\n")));
                1
            }
        };
        while ctx.execute_pending_job() {}
        if ctx.has_exception() {
            let exc: Value = ctx.catch();
            memory_refused = is_memory_refusal(&exc);
            let text: String = inspect.call((exc,)).unwrap_or_default();
            let _ = write_fn.call::<_, ()>((2, format!("Uncaught {text}\n")));
            status = 1;
        }
        Ok(status)
    });
    Ended {
        status,
        memory_refused,
    }
}

/// The captured stdout and stderr, once the script's runtime is gone.
fn take_output(out: Output) -> (Capture, Capture) {
    match Rc::try_unwrap(out) {
        Ok(cell) => cell.into_inner(),
        Err(rc) => {
            let mut o = rc.borrow_mut();
            (
                std::mem::replace(&mut o.0, Capture::new(0)),
                std::mem::replace(&mut o.1, Capture::new(0)),
            )
        }
    }
}

/// The one classification every tier uses, on this tier's evidence: Cordon's stops (the
/// output cap, the deadline), the script's end (an exit code, or none when QuickJS itself
/// failed) and the memory limit's refusal.
fn conclude(ended: Ended, stops: &Stops, stdout: Capture, mut stderr: Capture) -> Raw {
    let reported = match ended.status {
        Ok(code) => Some(ExitReport {
            code: Some(code),
            signal: None,
        }),
        Err(e) => {
            stderr.push(format!("cordon runtime: {e}\n").as_bytes());
            None
        }
    };
    let termination = cordon_core::classify(&Evidence {
        stopped: stops.stopped(),
        reported,
        oom_killed: ended.memory_refused && reported.is_some_and(|r| !r.clean()),
        ..Evidence::default()
    });
    let exit_code = match termination {
        Termination::Exited => reported.and_then(|r| r.code),
        _ => None,
    };
    Raw {
        termination,
        exit_code,
        stdout,
        stderr,
        memory: 0,
        cpu_ns: 0,
    }
}

impl Sandbox for RuntimeSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        if self.destroyed {
            return Err(Error::Gone {
                id: self.id.to_string(),
                reason: "destroyed".into(),
            });
        }
        let started = Instant::now();
        let (source, args) = match &req.command {
            Command::Code {
                language: Language::Javascript,
                source,
                args,
            } => (source.clone(), args.clone()),
            Command::Code { language, .. } => {
                return Err(cordon_core::Rejected::TierLanguage {
                    tier: Tier::Runtime,
                    language: *language,
                    fix: "it runs javascript only; use --tier wasm for python, or --tier container",
                }
                .into());
            }
            Command::Argv(_) => {
                return Err(cordon_core::Feature::Programs.unsupported(
                    Tier::Runtime,
                    "a program (it runs javascript source only, --lang javascript)",
                ));
            }
            Command::Wasm { .. } => {
                return Err(cordon_core::Feature::WasmModules.unsupported(
                    Tier::Runtime,
                    "a WebAssembly module (it runs javascript source only, --lang javascript)",
                ));
            }
        };
        let timeout = Duration::from_millis(req.timeout_ms.unwrap_or(self.limits.timeout_ms));
        let limits = self.limits.clone();
        let raw = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("cordon-runtime".into())
                .stack_size(THREAD_STACK)
                .spawn_scoped(s, || eval(&source, &args, &limits, timeout))
                .map_err(|e| Error::io("starting the runtime tier's thread", e))?
                .join()
                .map_err(|_| Error::Sandbox("the QuickJS thread panicked".into()))
        })?;
        if !raw.stdout.data.is_empty() {
            sink.output(OutputStream::Stdout, &raw.stdout.data);
        }
        if !raw.stderr.data.is_empty() {
            sink.output(OutputStream::Stderr, &raw.stderr.data);
        }
        let wall = started.elapsed().as_micros() as u64;
        let mut o = ExecOutcome::new(Tier::Runtime, raw.termination);
        o.exit_code = raw.exit_code;
        o.stdout_truncated = raw.stdout.truncated;
        o.stderr_truncated = raw.stderr.truncated;
        o.stdout = raw.stdout.data;
        o.stderr = raw.stderr.data;
        o.usage = Usage {
            cpu_time_us: raw.cpu_ns / 1000,
            peak_memory_bytes: raw.memory,
            wall_time_us: wall,
        };
        o.timings = Timings {
            start_us: self.start_us,
            run_us: wall,
            destroy_us: 0,
            program_us: 0,
        };
        o.warnings.push(WALL_NOTE.to_string());
        Ok(o)
    }

    fn put_file(&mut self, path: &str, _data: &[u8], _mode: u32) -> Result<()> {
        cordon_core::refuse_outside(Tier::Runtime, path)?;
        Err(cordon_core::Feature::Files.unsupported(Tier::Runtime, format!("putting {path:?}")))
    }

    fn get_file(&mut self, path: &str, _max_bytes: u64) -> Result<Vec<u8>> {
        cordon_core::refuse_outside(Tier::Runtime, path)?;
        Err(cordon_core::Feature::Files.unsupported(Tier::Runtime, format!("getting {path:?}")))
    }

    fn start_us(&self) -> u64 {
        self.start_us
    }

    fn destroy(&mut self) -> Result<()> {
        self.destroyed = true;
        Ok(())
    }
}
