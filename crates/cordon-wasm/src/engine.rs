//! The wasmtime engine: pooling allocator, copy-on-write memory images (reset in place with
//! `PAGEMAP_SCAN` where the kernel has it), epoch interruption driven by one ticker thread,
//! optional fuel.

use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::error::WasmError;

/// How often the epoch advances; the wall-clock limit is checked at this granularity.
pub(crate) const TICK: Duration = Duration::from_millis(2);

/// Largest linear memory any guest may have (the memory limit is usually far lower).
pub(crate) const MAX_MEMORY: u64 = 4 << 30;
/// Most table elements (function pointers); CPython's table is about 10-20 thousand.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 100_000;
/// With Linux's `PAGEMAP_SCAN`, how much of a linear memory / table a slot resets in place
/// (copying back only the pages the guest wrote) instead of handing it back to the kernel.
/// The pages stay mapped, so the next exec in the slot takes no page faults on them; the
/// guest still starts from the pristine image every time. Python's heap writes a few MiB.
const KEEP_RESIDENT_MEMORY: usize = 32 << 20;
const KEEP_RESIDENT_TABLE: usize = 1 << 20;
/// WebAssembly stack per exec; deeper recursion traps with "call stack exhausted".
pub(crate) const WASM_STACK: usize = 1 << 20;

/// Engine sizing: how many execs may run at once in one backend, and how many of those one
/// owner (`SandboxSpec.owner`, the tenant) may hold, so that one tenant's sleeping execs
/// cannot take every instance slot.
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    pub concurrent_execs: u32,
    pub per_owner: u32,
    /// Python instances made ahead of their execs (one per sandbox at most, `per_owner` per
    /// owner at most); each holds a pool slot of its own beside `concurrent_execs`. 0 turns
    /// them off (ADR 0019).
    pub standby_instances: u32,
}

impl Default for PoolSize {
    fn default() -> Self {
        PoolSize {
            concurrent_execs: 16,
            per_owner: 8,
            standby_instances: 16,
        }
    }
}

/// Spent stores waiting for a worker beyond which an exec resets its own slot again (the
/// engine's pool has slots for them beside the standby instances).
pub(crate) const MAX_PENDING_DISPOSALS: u32 = 8;

pub(crate) fn new_engine(fuel: bool, pool: PoolSize) -> Result<Engine, WasmError> {
    // Standby instances, and spent ones waiting for their reset, have pool slots of their
    // own, so running execs keep theirs (the backend counts those itself).
    let spare = if pool.standby_instances > 0 {
        pool.standby_instances + MAX_PENDING_DISPOSALS
    } else {
        0
    };
    let n = pool.concurrent_execs.max(1) + spare;
    let mut p = PoolingAllocationConfig::default();
    p.total_component_instances(n)
        .total_core_instances(n * 32)
        .total_memories(n * 2)
        .total_tables(n * 32)
        .total_stacks(n)
        .max_core_instances_per_component(48)
        .max_memories_per_component(4)
        .max_tables_per_component(48)
        .max_memories_per_module(1)
        .max_tables_per_module(8)
        .table_elements(MAX_TABLE_ELEMENTS)
        .max_memory_size(MAX_MEMORY as usize)
        .max_core_instance_size(4 << 20)
        .max_component_instance_size(4 << 20);
    // Without the scan, keeping memory resident means resetting the first bytes of every
    // memory whether touched or not (a 32 MiB memcpy per exec): only with it.
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        p.pagemap_scan(Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
            .table_keep_resident(KEEP_RESIDENT_TABLE);
    }
    let mut c = Config::new();
    c.epoch_interruption(true)
        .consume_fuel(fuel)
        .wasm_component_model(true)
        .memory_init_cow(true)
        .max_wasm_stack(WASM_STACK)
        .async_stack_size(WASM_STACK + (1 << 20))
        .allocation_strategy(InstanceAllocationStrategy::Pooling(p));
    let engine = Engine::new(&c).map_err(|e| WasmError::Engine(format!("{e:#}")))?;
    start_ticker(&engine)?;
    Ok(engine)
}

/// Advances the engine's epoch every [`TICK`] until the engine is dropped.
fn start_ticker(engine: &Engine) -> Result<(), WasmError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("cordon-wasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map(|_| ())
        .map_err(|e| WasmError::Engine(format!("could not start the epoch thread: {e}")))
}
