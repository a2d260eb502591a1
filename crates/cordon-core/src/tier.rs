//! The isolation tiers: their names, the command that readies each, and where each one's
//! wall is. What each tier can do is in [`crate::Features`]; this module depends on nothing
//! else of the crate, so every other module (errors included) can name a tier.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An isolation tier. Walls and costs differ; see the README's tier table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// In-process language runtime (QuickJS): the weakest wall, trusted static snippets only.
    Runtime,
    /// wasmtime + WASI: capability-based, nothing ambient; pure computation.
    Wasm,
    /// Namespaces + cgroups + seccomp + Landlock on the shared host kernel.
    Container,
    /// gVisor's user-space kernel (runsc) between the code and the host kernel.
    Gvisor,
    /// Its own guest kernel behind a virtual machine monitor.
    Microvm,
}

impl Tier {
    pub const ALL: [Tier; 5] = [
        Tier::Runtime,
        Tier::Wasm,
        Tier::Container,
        Tier::Gvisor,
        Tier::Microvm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Runtime => "runtime",
            Tier::Wasm => "wasm",
            Tier::Container => "container",
            Tier::Gvisor => "gvisor",
            Tier::Microvm => "microvm",
        }
    }

    /// The command that makes this tier ready on a host (its packages, its build, its guest
    /// artifacts: scripts/setup-tier.sh): the fix every "this tier's parts are missing"
    /// error names, so no request ever waits on a build.
    pub fn setup_command(self) -> String {
        format!("cordon setup {}", self.as_str())
    }

    /// One line on where this tier's wall is.
    pub fn wall(self) -> &'static str {
        match self {
            Tier::Runtime => {
                "in-process interpreter: process-level only, historically leaky; trusted static snippets only"
            }
            Tier::Wasm => "capability-based WebAssembly sandbox: nothing ambient, pure computation",
            Tier::Container => {
                "namespaces + cgroups + seccomp + Landlock: one shared kernel, good hygiene but not a boundary against an adversary"
            }
            Tier::Gvisor => "syscall-interposed user-space kernel (gVisor runsc)",
            Tier::Microvm => "its own guest kernel behind a virtual machine monitor",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown tier {s:?}; choose one of runtime, wasm, container, gvisor, microvm"
                )
            })
    }
}
