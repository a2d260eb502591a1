//! `cordon-full`: every `cordon` command (the `cordon` front hands it all but the fast path).

fn main() {
    cordon_cli::full_main()
}
