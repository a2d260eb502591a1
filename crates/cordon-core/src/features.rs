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
    /// Files outside the workspace (`/tmp`, the image's files) in and out, listed, made and
    /// removed, as the sandbox's user by the agent inside the sandbox (ADR 0031).
    pub files_outside: bool,
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
    /// That kernel is a Linux kernel in a virtual machine: what needs no privilege in there
    /// is the guest's business (the escape battery checks only what would need the host).
    pub guest_linux: bool,
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
    /// An OCI bundle's process run as a container's (cordon-oci): a root of the bundle's
    /// own and a process on the caller's I/O, passed ([`Features::attached`]) or relayed
    /// ([`Features::held`]).
    pub oci: bool,
    /// Host directories bound into the sandbox at any path (a node's `[allow] host_path`,
    /// the kubelet's pod volumes). Not the microvm tier's: its guest reaches no host
    /// directory but its own disks.
    pub host_paths: bool,
    /// Host devices bound into the sandbox's `/dev` (a node's `[allow] device`).
    pub host_devices: bool,
    /// A writable root: the image's root, its writes in a layer of the sandbox's own.
    pub writable_root: bool,
    /// A root that must hold the mount points the tier binds its own files on (a
    /// template's root has them; an OCI bundle's gets them layered over the image).
    pub root_mount_points: bool,
    /// A root that is a disk made from the image (bounded in size), not a directory.
    pub root_disk: bool,
    /// Connections from outside to a port a program serves on the sandbox's own loopback
    /// (E2B's `get_host`, the native port route).
    pub ports: bool,
    /// Watching a workspace directory for changes (E2B's `watch_dir`): inotify where the
    /// workspace is (the agent's, or the host's own directory). Not the microvm tier's
    /// until its guest image carries an agent that watches.
    pub watch: bool,
    /// User metadata on workspace files (E2B's upload `metadata`): extended attributes in
    /// the `user.e2b.` namespace, read and set by the tier's own file calls, on a workspace
    /// filesystem that keeps them. Not the microvm tier's until its guest image carries an
    /// agent that sets them.
    pub file_metadata: bool,
    /// Its memory is a heap inside the serving process (the runtime tier's isolates): capped
    /// by the ceiling's runtime heap, and a request naming no memory gets that cap rather
    /// than the server's default.
    pub memory_in_server: bool,
    /// Descriptors of the serving process that one live sandbox holds between execs, measured
    /// by counting `/proc/<server>/fd` before and after creates (the SDK test
    /// `test_the_descriptor_constants_are_what_a_sandbox_holds` checks each against that
    /// count): container 1 (the agent's socket, read and written on one descriptor), gvisor
    /// 8 (the runsc processes' pipes, the sentry's log), microvm 3 (its socket, two memfds).
    /// No cgroup file is held (they are opened for each reading), nor a lock for the host ids
    /// (every lease of a pool is a byte range of its one lease file: ADR 0038). The wasm tier's sandboxes hold none between execs (its execs reserve
    /// theirs in the tier's own budget); the runtime tier's run in the server's process.
    pub server_descriptors: u64,
    /// The `cordon` front (the small static binary every `cordon run` execs) runs it
    /// itself, without `cordon-full`: the container tier, whose backend the front carries.
    pub front_runs: bool,
    /// A kubelet's pod network (cordon-oci, ADR 0029): the sandbox joins the pod's network
    /// namespace (made by CNI, walled by the pod's sandbox monitor), so the pod's address,
    /// probes, Services and sidecars on localhost reach it. The microvm tier's guest keeps a
    /// network of its own.
    pub pod_network: bool,
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
    FilesOutside,
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
    Oci,
    HostPaths,
    HostDevices,
    WritableRoot,
    RootMountPoints,
    RootDisk,
    Ports,
    Watch,
    FileMetadata,
}

impl Feature {
    pub const ALL: [Feature; 25] = [
        Feature::Network,
        Feature::Files,
        Feature::FilesOutside,
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
        Feature::Oci,
        Feature::HostPaths,
        Feature::HostDevices,
        Feature::WritableRoot,
        Feature::RootMountPoints,
        Feature::RootDisk,
        Feature::Ports,
        Feature::Watch,
        Feature::FileMetadata,
    ];

    /// What it is, as an error message names it.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::Network => "a network (allow_hosts and grants)",
            Feature::Files => "a workspace with files",
            Feature::FilesOutside => "files outside /work (such as /tmp)",
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
            Feature::Oci => "OCI bundles (cordon-oci)",
            Feature::HostPaths => "host directories (pod volumes)",
            Feature::HostDevices => "host devices",
            Feature::WritableRoot => "a writable root",
            Feature::RootMountPoints => "a root that must hold the tier's mount points",
            Feature::RootDisk => "a root that is a disk",
            Feature::Ports => "connections to a port served inside the sandbox",
            Feature::Watch => "watching a directory for changes",
            Feature::FileMetadata => "metadata on files (extended attributes)",
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

/// Refuses a file call's path outside the workspace on `tier` when it lacks
/// [`Feature::FilesOutside`] (the wasm tier's files are its workspace alone), saying which
/// tiers reach it; the workspace's paths pass (and are checked where they are served).
pub fn refuse_outside(tier: Tier, path: &str) -> crate::Result<()> {
    if tier.features().files_outside {
        return Ok(());
    }
    match crate::classify_sandbox_path(path, true) {
        Ok(crate::FileTarget::Outside(_)) => Err(Feature::FilesOutside.unsupported(
            tier,
            format!("{path:?} (outside /work; files under /work work here)"),
        )),
        _ => Ok(()),
    }
}

impl Features {
    pub fn has(&self, f: Feature) -> bool {
        match f {
            Feature::Network => self.network,
            Feature::Files => self.files,
            Feature::FilesOutside => self.files_outside,
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
            Feature::Oci => self.oci,
            Feature::HostPaths => self.host_paths,
            Feature::HostDevices => self.host_devices,
            Feature::WritableRoot => self.writable_root,
            Feature::RootMountPoints => self.root_mount_points,
            Feature::RootDisk => self.root_disk,
            Feature::Ports => self.ports,
            Feature::Watch => self.watch,
            Feature::FileMetadata => self.file_metadata,
        }
    }

    /// Whether it runs code in `lang`.
    pub fn runs(&self, lang: Language) -> bool {
        self.languages.contains(&lang)
    }
}

/// A tier that can do nothing: what each tier's [`Features`] start from.
const NONE: Features = Features {
    network: false,
    files: false,
    files_outside: false,
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
    guest_linux: false,
    attached: false,
    held: false,
    snapshot_full: false,
    snapshot_files: false,
    oci: false,
    host_paths: false,
    host_devices: false,
    writable_root: false,
    root_mount_points: false,
    root_disk: false,
    ports: false,
    watch: false,
    file_metadata: false,
    memory_in_server: false,
    server_descriptors: 0,
    front_runs: false,
    pod_network: false,
};

/// The three program tiers share the agent: files, background execs with a terminal,
/// pause, contexts and programs from their root, and run OCI bundles.
const PROGRAMS: Features = Features {
    oci: true,
    network: true,
    files: true,
    files_outside: true,
    background: true,
    pty: true,
    pause: true,
    contexts: true,
    programs: true,
    languages: ALL_LANGUAGES,
    ..NONE
};

impl Tier {
    /// What this tier can do (see the module docs).
    pub const fn features(self) -> Features {
        match self {
            Tier::Runtime => Features {
                languages: &[Language::Javascript],
                memory_in_server: true,
                ..NONE
            },
            // Wasm: each exec is a fresh instance, so its files are its whole lasting state
            // and a snapshot of either mode is its workspace (cordon-wasm's snapshot module).
            Tier::Wasm => Features {
                files: true,
                snapshot_full: true,
                snapshot_files: true,
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
                host_paths: true,
                host_devices: true,
                writable_root: true,
                ports: true,
                watch: true,
                file_metadata: true,
                server_descriptors: 1,
                front_runs: true,
                pod_network: true,
                ..PROGRAMS
            },
            // Gvisor: full snapshots (runsc checkpoint and restore, ADR 0027).
            Tier::Gvisor => Features {
                volumes: true,
                host_paths: true,
                own_kernel: true,
                held: true,
                root_mount_points: true,
                snapshot_full: true,
                snapshot_files: true,
                ports: true,
                watch: true,
                file_metadata: true,
                server_descriptors: 8,
                pod_network: true,
                ..PROGRAMS
            },
            // Microvm: full snapshots (one migration stream of the live VM, ADR 0027).
            Tier::Microvm => Features {
                root_disk: true,
                snapshot_full: true,
                pause_to_disk: true,
                own_kernel: true,
                guest_linux: true,
                held: true,
                server_descriptors: 3,
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

    /// A tier that runs OCI bundles runs a process on the caller's I/O, one way or the
    /// other; the root facts are each one tier's.
    #[test]
    fn oci_tiers_pass_or_relay_the_callers_io() {
        for t in Feature::Oci.tiers() {
            let f = t.features();
            assert!(f.attached != f.held, "{t}");
        }
        assert_eq!(
            Feature::Oci.fix(),
            "use the container, gvisor or microvm tiers for OCI bundles (cordon-oci)"
        );
        assert!(
            Feature::WritableRoot
                .tiers()
                .iter()
                .all(|t| !t.features().root_disk)
        );
    }
}
