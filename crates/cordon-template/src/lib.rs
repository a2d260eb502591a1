//! Cordon templates: immutable root filesystems, content-addressed and stored once under
//! the data dir, that a sandbox's root is made from (docs/templates.md).
//!
//! A [`Store`] holds them; [`Store::resolve`] gives a tier what it needs for one sandbox
//! (the root on the host, the digest, the image's environment, the interpreters found, and
//! a lease that keeps the root while the sandbox lives). Importing OCI image layouts and
//! docker archives (feature `import`) treats the image as hostile input.

#[cfg(feature = "import")]
mod build;
mod error;
#[cfg(feature = "import")]
mod import;
mod manifest;
mod plan;
mod store;

#[cfg(feature = "import")]
pub use build::{BuildInputs, BuildRoot};
pub use error::{Result, TemplateError};
#[cfg(feature = "import")]
pub use import::{
    DEFAULT_STORE_BYTES, DropReason, Dropped, ImportLimits, ImportReport, MOUNT_POINTS, Stage,
    human,
};
pub use manifest::{BuiltFrom, Compression, ImageDefaults, ImageFormat, Layer, Manifest};
pub use plan::{BuildPlan, BuildResult, PlanStep, StartCommand};
pub use store::{GcReport, Lease, Store, disk_image_path, find_program, resolve_in_root};
