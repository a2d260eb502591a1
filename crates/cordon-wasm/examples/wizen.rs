//! Pre-initializes the wasm tier's guests (a setup-time tool, run by
//! `scripts/guests.d/30-wasm.sh`): `wizen IN.wasm OUT.wasm` for the JavaScript guest,
//! `wizen --preopen HOST_DIR=GUEST_DIR IN.wasm OUT.wasm` for the Python guest.
//!
//! A guest is a WASI reactor exporting `cordon_init`, which builds the interpreter (QuickJS's
//! runtime, context and console; CPython with its preloaded modules), and `cordon_run`, which
//! runs one snippet. Wizer runs `cordon_init` once and snapshots the instance's memory and
//! globals into a new module whose `_start` is `cordon_run`; every exec of the wasm tier then
//! starts from that state instead of building the interpreter again.
//!
//! Nothing of this machine may end up in the snapshot.
//!
//! With `--preopen` (Python) the guest gets a real WASI context that grants exactly one
//! directory, read only: the standard library CPython imports its modules from. It has no
//! arguments, no environment, no stdin, stdout discarded, stderr inherited (so a failed import
//! is reported), both clocks read 0 and randomness is a constant. The guest itself forgets the
//! directory and the environment in every run (guests/python/main.c), and the standard library
//! is not in the sandbox then.
//!
//! Without it (JavaScript) every WASI import
//! traps except two, which return constants: `clock_time_get` reads time 0 (QuickJS seeds
//! `Math.random`, its hash seed and `performance.timeOrigin` from the clock when a context is
//! created; the guest replaces `Math.random` and re-creates `performance` in every run) and
//! `random_get` gives zero bytes (Rust's std seeds the keys of its `HashMap`s, which rquickjs
//! uses for internal maps keyed by type ids, never by a snippet's data). So the output
//! depends only on the input bytes.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use std::time::Duration;

use wasmtime::{Config, Engine, Extern, Instance, Linker, Module, Store, Val};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, HostMonotonicClock, HostWallClock, WasiCtxBuilder};
use wasmtime_wizer::{InstanceState, ModuleContext, SnapshotVal, ValType, Wizer};

/// The guest's exports.
const INIT: &str = "cordon_init";
const RUN: &str = "cordon_run";

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let preopen = match args.first().map(String::as_str) {
        Some("--preopen") if args.len() > 1 => {
            let spec = args.remove(1);
            args.remove(0);
            let Some((host, guest)) = spec.split_once('=') else {
                bail!("--preopen takes HOST_DIR=GUEST_DIR, not {spec:?}");
            };
            Some((PathBuf::from(host), guest.to_string()))
        }
        _ => None,
    };
    let [input, output] = args.as_slice() else {
        bail!(
            "usage: wizen [--preopen HOST_DIR=GUEST_DIR] IN.wasm OUT.wasm (a guest built from \
             guests/js or guests/python)"
        );
    };
    let (input, output) = (PathBuf::from(input), PathBuf::from(output));
    let wasm = std::fs::read(&input).with_context(|| format!("reading {}", input.display()))?;
    let out = match preopen {
        Some((host, guest)) => preinitialize_with_wasi(&wasm, &host, &guest)?,
        None => preinitialize(&wasm)?,
    };
    let tmp = output.with_extension("tmp");
    std::fs::write(&tmp, &out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &output).with_context(|| format!("writing {}", output.display()))?;
    Ok(())
}

/// Wizer set up for the guests' exports, its view of the guest, and the instrumented guest
/// compiled by a new engine.
fn instrument(wasm: &[u8]) -> Result<(Wizer, ModuleContext<'_>, Engine, Module)> {
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
    Ok((wizer, cx, engine, module))
}

/// Runs the guest's init on an instance.
fn run_init<T: 'static>(store: &mut Store<T>, instance: Instance) -> Result<()> {
    let init = instance
        .get_typed_func::<(), ()>(&mut *store, INIT)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| format!("the guest has no `{INIT}` export"))?;
    init.call(&mut *store, ())
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| format!("the guest's `{INIT}` failed"))
}

fn preinitialize(wasm: &[u8]) -> Result<Vec<u8>> {
    let (wizer, cx, engine, module) = instrument(wasm)?;
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
    run_init(&mut store, instance)?;
    snapshot(&wizer, &cx, &mut store, instance)
}

/// Clocks that read 0 while a guest is pre-initialized.
struct Epoch;

impl HostWallClock for Epoch {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for Epoch {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Runs `cordon_init` with a WASI context that grants `host` read only at `guest` and nothing
/// else of this machine (see the module's documentation), then snapshots the instance.
fn preinitialize_with_wasi(wasm: &[u8], host: &std::path::Path, guest: &str) -> Result<Vec<u8>> {
    let (wizer, cx, engine, module) = instrument(wasm)?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s| s)
        .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let mut b = WasiCtxBuilder::new();
    b.inherit_stderr()
        .wall_clock(Epoch)
        .monotonic_clock(Epoch)
        .secure_random(wasmtime_wasi::Deterministic::new(vec![0x5a]))
        .insecure_random(wasmtime_wasi::Deterministic::new(vec![0xa5]))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    b.preopened_dir(host, guest, FsPerms::ReadOnly)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| format!("opening {}", host.display()))?;
    let mut store = Store::new(&engine, b.build_p1());
    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("instantiating the guest")?;
    // A reactor's constructors (the C library's) run before its init.
    if let Ok(initialize) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
        initialize
            .call(&mut store, ())
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .context("the guest's `_initialize` failed")?;
    }
    run_init(&mut store, instance)?;
    snapshot(&wizer, &cx, &mut store, instance)
}

/// Snapshots an initialized instance into the new module.
fn snapshot<T: Send + 'static>(
    wizer: &Wizer,
    cx: &ModuleContext<'_>,
    store: &mut Store<T>,
    instance: Instance,
) -> Result<Vec<u8>> {
    let mut state = Snapshot {
        store,
        instance,
        missing: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let out = rt
        .block_on(wizer.snapshot(cx, &mut state))
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("snapshotting the initialized guest")?;
    if !state.missing.is_empty() {
        bail!("the snapshot lacks {}", state.missing.join(", "));
    }
    Ok(out)
}

/// What Wizer reads from the initialized instance: its globals and memories.
struct Snapshot<'a, T: 'static> {
    store: &'a mut Store<T>,
    instance: Instance,
    /// Exports Wizer asked for that were not there (reported after the snapshot).
    missing: Vec<String>,
}

impl<T: Send> InstanceState for Snapshot<'_, T> {
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
