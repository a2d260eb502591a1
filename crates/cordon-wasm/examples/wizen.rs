//! Pre-initializes the JavaScript guest (a setup-time tool, run by `scripts/setup.d/30-wasm.sh`):
//! `wizen IN.wasm OUT.wasm`.
//!
//! The guest (`guests/js`, a WASI reactor) exports `cordon_init`, which builds the QuickJS
//! runtime, context and console, and `cordon_run`, which evaluates the snippet. Wizer runs
//! `cordon_init` once and snapshots the instance's memory and globals into a new module whose
//! `_start` is `cordon_run`; every exec of the wasm tier then starts from that state instead
//! of building the interpreter again.
//!
//! Nothing of this machine may end up in the snapshot: during `cordon_init` every WASI import
//! traps except two, which return constants: `clock_time_get` reads time 0 (QuickJS seeds
//! `Math.random`, its hash seed and `performance.timeOrigin` from the clock when a context is
//! created; the guest replaces `Math.random` and re-creates `performance` in every run) and
//! `random_get` gives zero bytes (Rust's std seeds the keys of its `HashMap`s, which rquickjs
//! uses for internal maps keyed by type ids, never by a snippet's data). So the output
//! depends only on the input bytes.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use wasmtime::{Config, Engine, Extern, Instance, Linker, Module, Store, Val};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

/// The guest's exports.
const INIT: &str = "cordon_init";
const RUN: &str = "cordon_run";

fn main() -> Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: wizen IN.wasm OUT.wasm (the JavaScript guest built from guests/js)");
    };
    let wasm = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let out = preinitialize(&wasm)?;
    let tmp = output.with_extension("tmp");
    std::fs::write(&tmp, &out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, output).with_context(|| format!("writing {}", output.display()))?;
    Ok(())
}

fn preinitialize(wasm: &[u8]) -> Result<Vec<u8>> {
    let mut wizer = Wizer::new();
    wizer.init_func(INIT).func_rename("_start", RUN);
    let (cx, instrumented) = wizer
        .instrument(wasm)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("the guest cannot be pre-initialized")?;

    let engine = Engine::new(&Config::new()).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let module = Module::new(&engine, &instrumented)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("compiling the instrumented guest")?;
    let mut linker: Linker<()> = Linker::new(&engine);
    for import in module.imports() {
        let Some(ty) = import.ty().func().cloned() else {
            bail!(
                "the guest imports {}::{}, which is not a function",
                import.module(),
                import.name()
            );
        };
        let (m, name) = (import.module().to_string(), import.name().to_string());
        let wasi = m == "wasi_snapshot_preview1";
        // Where the constant goes: (argument holding the pointer, argument holding the length).
        let out: Option<(usize, Option<usize>)> = match name.as_str() {
            // clock_time_get(id, precision, *timestamp) -> errno
            "clock_time_get" if wasi => Some((2, None)),
            // random_get(*buf, len) -> errno
            "random_get" if wasi => Some((0, Some(1))),
            _ => None,
        };
        linker
            .func_new(
                &m.clone(),
                &name.clone(),
                ty,
                move |mut caller, params, results| {
                    let Some((ptr_arg, len_arg)) = out else {
                        wasmtime::bail!(
                            "the guest called {m}::{name} while pre-initializing; only the clock \
                         and randomness may be read then, as constants (anything else would \
                         bake this machine's state into every sandbox)"
                        );
                    };
                    let arg = |i: usize| match params.get(i) {
                        Some(Val::I32(p)) => Ok(u32::from_ne_bytes(p.to_ne_bytes()) as usize),
                        _ => Err(wasmtime::format_err!(
                            "{name} called with unexpected arguments"
                        )),
                    };
                    let ptr = arg(ptr_arg)?;
                    let len = match len_arg {
                        Some(i) => arg(i)?,
                        None => 8,
                    };
                    let Some(Extern::Memory(mem)) = caller.get_export("memory") else {
                        wasmtime::bail!("the guest exports no memory");
                    };
                    mem.write(&mut caller, ptr, &vec![0u8; len])?;
                    if let Some(r) = results.first_mut() {
                        *r = Val::I32(0);
                    }
                    Ok(())
                },
            )
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    }
    let mut store = Store::new(&engine, ());
    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("instantiating the guest")?;
    let init = instance
        .get_typed_func::<(), ()>(&mut store, INIT)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| format!("the guest has no `{INIT}` export"))?;
    init.call(&mut store, ())
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| format!("the guest's `{INIT}` failed"))?;

    let mut state = Snapshot {
        store: &mut store,
        instance,
        missing: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let out = rt
        .block_on(wizer.snapshot(&cx, &mut state))
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("snapshotting the initialized guest")?;
    if !state.missing.is_empty() {
        bail!("the snapshot lacks {}", state.missing.join(", "));
    }
    Ok(out)
}

/// What Wizer reads from the initialized instance: its globals and memories.
struct Snapshot<'a> {
    store: &'a mut Store<()>,
    instance: Instance,
    /// Exports Wizer asked for that were not there (reported after the snapshot).
    missing: Vec<String>,
}

impl InstanceState for Snapshot<'_> {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let value = self
            .instance
            .get_global(&mut *self.store, name)
            .map(|g| g.get(&mut *self.store));
        match value {
            Some(Val::I32(x)) => SnapshotVal::I32(x),
            Some(Val::I64(x)) => SnapshotVal::I64(x),
            Some(Val::F32(x)) => SnapshotVal::F32(x),
            Some(Val::F64(x)) => SnapshotVal::F64(x),
            Some(Val::V128(x)) => SnapshotVal::V128(x.as_u128()),
            _ => {
                self.missing.push(format!("global {name}"));
                SnapshotVal::I32(0)
            }
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        match self.instance.get_memory(&mut *self.store, name) {
            Some(m) => contents(m.data(&*self.store)),
            None => {
                self.missing.push(format!("memory {name}"));
                contents(&[]);
            }
        }
    }
}
