//! What each tier can do, as one typed value: every check of "can this tier do X" (the gate,
//! the service, the front's `--tier auto`) and every "unsupported" message derives from it.
//!
//! [`Tier::features`] matches every tier exhaustively, so a new `Tier` variant does not
//! compile until its features are written down here; a backend reports the same value
//! through [`crate::Backend::features`].

use serde::Serialize;

use crate::{Error, Language, Tier};

/// A tier's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Features {
    /// Egress through Cordon's proxy: `allow_hosts` and grants can apply.
    pub network: bool,
    /// A workspace with files: puts, gets, listing, archives in and out.
    pub files: bool,
    /// Volumes mounted into the sandbox.
    pub volumes: bool,
    /// Background execs (started, read, written, signalled later).
    pub background: bool,
    /// A terminal for a background exec.
    pub pty: bool,
    /// Pause and resume in memory.
    pub pause: bool,
    /// Pause to disk, surviving the server.
    pub pause_to_disk: bool,
    /// Code contexts (long-lived interpreters whose state persists between cells).
    pub contexts: bool,
    /// Programs from its root by argv (not only code in a language).
    pub programs: bool,
    /// The languages it runs code in (where the root has the interpreter, for the program
    /// tiers).
    pub languages: &'static [Language],
    /// A user's own WebAssembly module or component.
    pub wasm_modules: bool,
    /// A kernel of its own between the code and the host's (a user-space kernel or a
    /// virtual machine): a boundary against an adversary, not only hygiene.
    pub own_kernel: bool,
    /// A process on the caller's own descriptors, passed into the sandbox as they are
    /// (and a terminal of the sandbox's own for it).
    pub attached: bool,
    /// A background process whose output is held in the sandbox until read.
    pub held: bool,
    /// A snapshot of memory, processes and files ([`crate::SnapshotMode::Full`]) and
    /// sandboxes started from it.
    pub snapshot_full: bool,
    /// A snapshot of the files ([`crate::SnapshotMode::Filesystem`]) and sandboxes started
    /// from it.
    pub snapshot_files: bool,
}

const ALL_LANGUAGES: &[Language] = &[
    Language::Python,
    Language::Bash,
    Language::Sh,
    Language::Javascript,
];

/// One capability of [`Features`], to ask for it by name and to say who has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    Network,
    Files,
    Volumes,
    Background,
    Pty,
    Pause,
    PauseToDisk,
    Contexts,
    Programs,
    WasmModules,
    OwnKernel,
    Attached,
    Held,
    SnapshotFull,
    SnapshotFiles,
}

impl Feature {
    pub const ALL: [Feature; 15] = [
        Feature::Network,
        Feature::Files,
        Feature::Volumes,
        Feature::Background,
        Feature::Pty,
        Feature::Pause,
        Feature::PauseToDisk,
        Feature::Contexts,
        Feature::Programs,
        Feature::WasmModules,
        Feature::OwnKernel,
        Feature::Attached,
        Feature::Held,
        Feature::SnapshotFull,
        Feature::SnapshotFiles,
    ];

    /// What it is, as an error message names it.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::Network => "a network (allow_hosts and grants)",
            Feature::Files => "a workspace with files",
            Feature::Volumes => "volumes",
            Feature::Background => "background processes",
            Feature::Pty => "a terminal for a background process",
            Feature::Pause => "pause and resume",
            Feature::PauseToDisk => "pausing to disk",
            Feature::Contexts => "code contexts",
            Feature::Programs => "programs run by their argv",
            Feature::WasmModules => "WebAssembly programs of your own",
            Feature::OwnKernel => "a kernel of its own",
            Feature::Attached => "processes on the caller's own descriptors",
            Feature::Held => "background processes whose output is held until read",
            Feature::SnapshotFull => {
                "full snapshots (memory, processes and files) and forks from them"
            }
            Feature::SnapshotFiles => "filesystem snapshots and forks from them",
        }
    }

    /// The tiers that have it, in [`Tier::ALL`] order.
    pub fn tiers(self) -> Vec<Tier> {
        Tier::ALL
            .into_iter()
            .filter(|t| t.features().has(self))
            .collect()
    }

    /// "use the container, gvisor or microvm tier for background processes".
    pub fn fix(self) -> String {
        let tiers: Vec<&str> = self.tiers().into_iter().map(Tier::as_str).collect();
        let named = match tiers.as_slice() {
            [] => return format!("no tier of this build has {}", self.describe()),
            [one] => (*one).to_string(),
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
        };
        format!(
            "use the {named} tier{} for {}",
            if tiers.len() > 1 { "s" } else { "" },
            self.describe()
        )
    }

    /// The error for asking a sandbox whose tier does not have it (the default of the
    /// `Sandbox` methods a tier does not implement).
    pub fn unsupported_here(self, what: impl Into<String>) -> Error {
        Error::Unsupported {
            what: format!("{} on this tier", what.into()),
            fix: self.fix(),
        }
    }

    /// The error for asking `tier` for it: what was asked and which tiers can.
    pub fn unsupported(self, tier: Tier, what: impl Into<String>) -> Error {
        Error::Unsupported {
            what: format!("{} on the {tier} tier", what.into()),
            fix: self.fix(),
        }
    }
}

impl Features {
    pub fn has(&self, f: Feature) -> bool {
        match f {
            Feature::Network => self.network,
            Feature::Files => self.files,
            Feature::Volumes => self.volumes,
            Feature::Background => self.background,
            Feature::Pty => self.pty,
            Feature::Pause => self.pause,
            Feature::PauseToDisk => self.pause_to_disk,
            Feature::Contexts => self.contexts,
            Feature::Programs => self.programs,
            Feature::WasmModules => self.wasm_modules,
            Feature::OwnKernel => self.own_kernel,
            Feature::Attached => self.attached,
            Feature::Held => self.held,
            Feature::SnapshotFull => self.snapshot_full,
            Feature::SnapshotFiles => self.snapshot_files,
        }
    }

    /// Whether it runs code in `lang`.
    pub fn runs(&self, lang: Language) -> bool {
        self.languages.contains(&lang)
    }
}

impl Tier {
    /// What this tier can do (see the module docs).
    pub const fn features(self) -> Features {
        const NONE: Features = Features {
            network: false,
            files: false,
            volumes: false,
            background: false,
            pty: false,
            pause: false,
            pause_to_disk: false,
            contexts: false,
            programs: false,
            languages: &[],
            wasm_modules: false,
            own_kernel: false,
            attached: false,
            held: false,
            snapshot_full: false,
            snapshot_files: false,
        };
        // The three program tiers share the agent: files, background execs with a terminal,
        // pause, contexts and programs from their root.
        const PROGRAMS: Features = Features {
            network: true,
            files: true,
            background: true,
            pty: true,
            pause: true,
            contexts: true,
            programs: true,
            languages: ALL_LANGUAGES,
            ..NONE
        };
        match self {
            Tier::Runtime => Features {
                languages: &[Language::Javascript],
                ..NONE
            },
            Tier::Wasm => Features {
                files: true,
                languages: &[Language::Python, Language::Javascript],
                wasm_modules: true,
                ..NONE
            },
            // Container: files only; a full snapshot would need CRIU inside Cordon's walls
            // (see `cordon-container`'s snapshot module for why not).
            Tier::Container => Features {
                volumes: true,
                attached: true,
                snapshot_files: true,
                ..PROGRAMS
            },
            Tier::Gvisor => Features {
                volumes: true,
                own_kernel: true,
                held: true,
                ..PROGRAMS
            },
            Tier::Microvm => Features {
                pause_to_disk: true,
                own_kernel: true,
                held: true,
                ..PROGRAMS
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixes_name_exactly_the_tiers_that_have_the_feature() {
        assert_eq!(
            Feature::Background.fix(),
            "use the container, gvisor or microvm tiers for background processes"
        );
        assert_eq!(
            Feature::PauseToDisk.fix(),
            "use the microvm tier for pausing to disk"
        );
        assert_eq!(
            Feature::Volumes.fix(),
            "use the container or gvisor tiers for volumes"
        );
        let e = Feature::Contexts.unsupported(Tier::Wasm, "a code context");
        assert_eq!(
            e.to_string(),
            "a code context on the wasm tier is not supported here; fix: use the container, \
             gvisor or microvm tiers for code contexts"
        );
    }

    #[test]
    fn has_reads_the_field_of_each_feature() {
        for t in Tier::ALL {
            let f = t.features();
            for feature in Feature::ALL {
                assert_eq!(
                    f.has(feature),
                    feature.tiers().contains(&t),
                    "{t} {feature:?}"
                );
            }
        }
        assert!(Tier::Wasm.features().runs(Language::Python));
        assert!(!Tier::Runtime.features().runs(Language::Python));
        assert!(Tier::Gvisor.features().has(Feature::OwnKernel));
        assert!(!Tier::Container.features().has(Feature::OwnKernel));
    }
}
