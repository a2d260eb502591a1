//! `cordon`: the front. It runs `cordon run` on the container tier itself and hands every
//! other command (and every other tier) to `cordon-full` beside it, by exec: the same
//! process, arguments, environment and descriptors. Keeping wasmtime, the server and the
//! other tiers out of this binary keeps the loader's work, and with it every `cordon run`,
//! short.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: cordon_guest::sys::BumpArena<{ 1 << 20 }> = cordon_guest::sys::BumpArena::new();

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "run")
        && let Some(code) = cordon_front::run::fast(&args)
    {
        std::process::exit(code);
    }
    // `cordon setup` is the front's: it is how `cordon-full` comes to be.
    if args.get(1).is_some_and(|a| a == "setup") {
        std::process::exit(cordon_front::setup::run(&args[2..]));
    }
    let full = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(cordon_front::FULL_BINARY)))
        .filter(|p| p.is_file());
    let Some(full) = full else {
        eprintln!("{}", cordon_front::setup::not_built_message(&args));
        std::process::exit(125);
    };
    let err = std::process::Command::new(&full)
        .arg0("cordon")
        .args(args.iter().skip(1))
        .exec();
    eprintln!("cordon: error: cannot start {}: {err}", full.display());
    std::process::exit(125);
}
