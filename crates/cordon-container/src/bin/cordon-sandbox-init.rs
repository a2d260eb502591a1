//! The container tier's sandbox init. Started by the host with the agent socket as stdin;
//! not meant to be run by hand.

fn main() {
    if std::env::args_os().len() > 1 {
        eprintln!(
            "cordon-sandbox-init is started by Cordon's container tier, not by hand; use `cordon run`"
        );
        std::process::exit(2);
    }
    cordon_container::init::main()
}
