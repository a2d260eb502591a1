//! The container tier's sandbox init. Started by the host with the agent socket as stdin;
//! not meant to be run by hand.

#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: cordon_guest::sys::BumpArena<{ 1 << 20 }> = cordon_guest::sys::BumpArena::new();

fn main() {
    if std::env::args_os().len() > 1 {
        eprintln!(
            "cordon-sandbox-init is started by Cordon's container tier, not by hand; use `cordon run`"
        );
        std::process::exit(2);
    }
    cordon_sandbox_init::init::main()
}
