//! Cordon's JavaScript guest: QuickJS (rquickjs) built to `wasm32-wasip1`.
//!
//! Arguments: `js SOURCE [ARGS...]`. The source runs as a global script; `console.*` writes to
//! stdout/stderr; the value of the last expression is printed when it is not `undefined`
//! (as a REPL does); pending promise jobs run to completion. An uncaught exception prints
//! `Uncaught ...` to stderr and exits with status 1. There is no other I/O: no `std`/`os`
//! modules, no module loader, no filesystem, no network. The wasm host enforces every limit.

use std::io::Write;
use std::process::ExitCode;

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

fn run(source: String, script_args: Vec<String>) -> rquickjs::Result<u8> {
    let rt = Runtime::new()?;
    let ctx = Context::full(&rt)?;
    let status = ctx.with(|ctx| -> rquickjs::Result<u8> {
        let setup: Function = ctx.eval(PRELUDE)?;
        let inspect: Function = setup.call((Function::new(ctx.clone(), write_fd)?,))?;
        let argv = Array::new(ctx.clone())?;
        for (i, a) in script_args.into_iter().enumerate() {
            argv.set(i, a)?;
        }
        ctx.globals().set("scriptArgs", argv)?;
        // Kept for reporting exceptions thrown by promise jobs after the script ran.
        ctx.globals().set("__cordonInspect", inspect.clone())?;
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
    Ok(status)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let source = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let code = match run(source, rest) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "cordon js guest: {e}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    ExitCode::from(code)
}
