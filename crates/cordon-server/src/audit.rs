//! The audit store and its events live in the engine (`cordon_engine::audit`), shared with
//! the CLI; this path keeps the server's modules and its users where they were.

pub use cordon_engine::audit::*;
