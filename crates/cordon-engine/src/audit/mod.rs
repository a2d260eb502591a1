//! The audit: what every decision writes ([`AuditEvent`], one variant per kind) and, with
//! the `store` feature, the SQLite store that keeps the rows (the server's and the CLI's).

pub mod event;
#[cfg(feature = "store")]
pub mod store;

pub use event::*;
#[cfg(feature = "store")]
pub use store::*;
// Re-exported here, not by `store` (which its snapshots module uses): no loop of modules.
#[cfg(feature = "store")]
pub use store::snapshots::{SnapshotRefusal, SnapshotRow};
