//! The Cordon agent: runs inside a sandbox (as the container tier's init, or as the microVM
//! guest's agent) and serves the host over a length-prefixed, versioned protocol ([`proto`]).
//! Everything the host sends is checked; malformed frames are rejected.

pub mod agent;
pub mod archive;
pub mod confined;
pub(crate) mod fdpass;
pub mod files;
pub mod forwarder;
mod metadata;
pub mod outside;
pub mod ports;
pub mod proto;
pub mod sys;
pub mod tunnel;
pub mod watch;

pub use agent::{Agent, AgentConfig, ConfigureHook, Confine, STANDBY_IDLE, Settings};
