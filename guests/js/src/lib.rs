//! Cordon's JavaScript guest: QuickJS (rquickjs) built to `wasm32-wasip1`.
//!
//! Arguments: `js SOURCE [ARGS...]`. The source runs as a global script; `console.*` writes to
//! stdout/stderr; the value of the last expression is printed when it is not `undefined`
//! (as a REPL does); pending promise jobs run to completion. An uncaught exception prints
//! `Uncaught ...` to stderr and exits with status 1. There is no other I/O: no `std`/`os`
//! modules, no module loader, no filesystem, no network. The wasm host enforces every limit.
//!
//! A WASI reactor with two exports. `cordon_init` builds everything that does not depend on
//! the snippet (runtime, context with its intrinsics, the console prelude) and is run once at
//! setup time by Wizer, which snapshots the resulting memory into a new module; `cordon_run`
//! (exported as `_start` in that module) then only refreshes what must differ per run and
//! evaluates the snippet. Nothing of the setup machine may leak into the snapshot: during
//! `cordon_init` every WASI import traps except the clock, which reads a constant. So what
//! QuickJS seeds from the clock when a context is created is fixed in the snapshot and
//! refreshed by `cordon_run`: `Math.random` is ours (xorshift128+ seeded from WASI
//! `random_get` in every run) and `performance` is re-created with the run's time origin.

use std::io::Write;

use std::cell::{Cell, RefCell};

use rquickjs::{Array, Context, Ctx, Function, Runtime, Value};

const PRELUDE: &str = include_str!("prelude.js");

fn write_fd(fd: i32, text: rquickjs::String<'_>) -> rquickjs::Result<()> {
    let s = text.to_string()?;
    let ok = if fd == 2 {
        std::io::stderr().write_all(s.as_bytes())
    } else {
        std::io::stdout().write_all(s.as_bytes())
    };
    // A failed write means the host stopped us (output limit); there is nothing to recover.
    if ok.is_err() {
        std::process::exit(1);
    }
    Ok(())
}

fn report<'js>(ctx: &Ctx<'js>, inspect: &Function<'js>, err: rquickjs::Error) {
    let text = match err {
        rquickjs::Error::Exception => {
            let exc: Value = ctx.catch();
            inspect
                .call::<_, String>((exc,))
                .unwrap_or_else(|_| "exception (could not be printed)".to_string())
        }
        other => other.to_string(),
    };
    let _ = writeln!(std::io::stderr(), "Uncaught {text}");
}

/// The interpreter `cordon_init` builds and `cordon_run` uses (once: a run ends the instance).
struct Engine {
    rt: Runtime,
    ctx: Context,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
    /// State of `Math.random`: xorshift128+, seeded from WASI `random_get` by `cordon_run`.
    static RANDOM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn random() -> f64 {
    RANDOM.with(|r| {
        let (mut s1, s0) = r.get();
        s1 ^= s1 << 23;
        s1 ^= s1 >> 17;
        s1 ^= s0 ^ (s0 >> 26);
        r.set((s0, s1));
        // The top 53 bits of the sum, scaled to [0, 1).
        (s0.wrapping_add(s1) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    })
}

fn init() -> rquickjs::Result<Engine> {
    let rt = Runtime::new()?;
    let ctx = Context::full(&rt)?;
    ctx.with(|ctx| -> rquickjs::Result<()> {
        let setup: Function = ctx.eval(PRELUDE)?;
        let inspect: Function = setup.call((Function::new(ctx.clone(), write_fd)?,))?;
        // Kept for printing values and for reporting exceptions thrown by promise jobs.
        ctx.globals().set("__cordonInspect", inspect)?;
        let math: rquickjs::Object = ctx.globals().get("Math")?;
        math.set(
            "random",
            Function::new(ctx.clone(), random)?.with_name("random")?,
        )?;
        Ok(())
    })?;
    Ok(Engine { rt, ctx })
}

/// Pre-initialization, run once by Wizer at setup time: builds the interpreter.
#[unsafe(no_mangle)]
pub extern "C" fn cordon_init() {
    match init() {
        Ok(e) => ENGINE.with(|slot| *slot.borrow_mut() = Some(e)),
        // Wizer reports the trap; the setup step fails.
        Err(e) => panic!("cordon js guest: could not initialize QuickJS: {e}"),
    }
}

/// The program (`_start` of the pre-initialized module).
#[unsafe(no_mangle)]
pub extern "C" fn cordon_run() {
    let mut args = std::env::args().skip(1);
    let source = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let code = match ENGINE.with(|slot| slot.borrow_mut().take()) {
        Some(engine) => run(engine, source, rest).unwrap_or_else(|e| {
            let _ = writeln!(std::io::stderr(), "cordon js guest: {e}");
            1
        }),
        None => {
            let _ = writeln!(
                std::io::stderr(),
                "cordon js guest: not pre-initialized (run scripts/setup.sh)"
            );
            1
        }
    };
    let _ = std::io::stdout().flush();
    if code != 0 {
        std::process::exit(i32::from(code));
    }
}

fn run(engine: Engine, source: String, script_args: Vec<String>) -> rquickjs::Result<u8> {
    let Engine { rt, ctx } = engine;
    RANDOM.with(|r| r.set(sys::random_seed()));
    let status = ctx.with(|ctx| -> rquickjs::Result<u8> {
        sys::refresh(&ctx);
        let inspect: Function = ctx.globals().get("__cordonInspect")?;
        let argv = Array::new(ctx.clone())?;
        for (i, a) in script_args.into_iter().enumerate() {
            argv.set(i, a)?;
        }
        ctx.globals().set("scriptArgs", argv)?;
        match ctx.eval::<Value, _>(source) {
            Ok(v) => {
                if !v.is_undefined() {
                    let text: String = inspect.call((v,))?;
                    write_fd(1, rquickjs::String::from_str(ctx.clone(), &(text + "\n"))?)?;
                }
                Ok(0)
            }
            Err(e) => {
                report(&ctx, &inspect, e);
                Ok(1)
            }
        }
    })?;
    let mut status = status;
    loop {
        match rt.execute_pending_job() {
            Ok(true) => continue,
            Ok(false) => break,
            Err(job) => {
                job.0.with(|ctx| {
                    let exc: Value = ctx.catch();
                    let text = ctx
                        .globals()
                        .get::<_, Function>("__cordonInspect")
                        .and_then(|f| f.call::<_, String>((exc,)))
                        .unwrap_or_else(|_| "exception (could not be printed)".to_string());
                    let _ = writeln!(std::io::stderr(), "Uncaught {text}");
                });
                status = 1;
            }
        }
    }
    // The instance is discarded after the run: tearing the heap down would only cost time.
    std::mem::forget(ctx);
    std::mem::forget(rt);
    Ok(status)
}

mod sys {
    //! The guest's only unsafe code: the WASI randomness import and two QuickJS calls that
    //! rquickjs does not wrap.

    use rquickjs::{Ctx, qjs};

    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    unsafe extern "C" {
        /// WASI preview 1 `random_get(buf, len) -> errno`.
        fn random_get(buf: *mut u8, len: usize) -> i32;
    }

    /// A fresh, non-zero xorshift128+ state from the host's randomness.
    pub fn random_seed() -> (u64, u64) {
        let mut buf = [0u8; 16];
        // SAFETY: `buf` is a live, writable buffer of exactly `buf.len()` bytes.
        let errno = unsafe { random_get(buf.as_mut_ptr(), buf.len()) };
        if errno != 0 {
            // Without randomness Math.random would be predictable: refuse to run.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"cordon js guest: the host gave no randomness\n",
            );
            std::process::exit(1);
        }
        let (a, b) = buf.split_at(8);
        let a = u64::from_le_bytes(a.try_into().unwrap_or([1; 8]));
        let b = u64::from_le_bytes(b.try_into().unwrap_or([1; 8]));
        if a | b == 0 { (1, 0) } else { (a, b) }
    }

    /// What QuickJS captured when the snapshot was made and must be current in a run: the
    /// stack top (the run's frames, not the initializer's) and `performance` with its time
    /// origin (re-created; the snapshot's was read from a constant clock).
    pub fn refresh(ctx: &Ctx<'_>) {
        let raw = ctx.as_raw().as_ptr();
        // SAFETY: `raw` is the live context `ctx` wraps, used on this thread while its lock
        // is held (inside `Context::with`); both calls only update the context's runtime
        // fields and define one global property.
        unsafe {
            qjs::JS_UpdateStackTop(qjs::JS_GetRuntime(raw));
            qjs::JS_AddPerformance(raw);
        }
    }
}
