//! The backend: what this host can run (`probe`) and making a sandbox (`create`).

use std::os::unix::fs::DirBuilderExt;
use std::time::Instant;

use cordon_core::{
    Backend, Capability, Error, Probe, Result, Sandbox, SandboxSpec, Tier, Weakening,
};
use cordon_host::cgroup;

use crate::{AGENT_BINARY, GvisorBackend, GvisorSandbox};

impl Backend for GvisorBackend {
    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

    fn tier(&self) -> Tier {
        Tier::Gvisor
    }

    /// Every gvisor sandbox whose owning process is gone (records or not): runsc state,
    /// cgroups, bundles, mounts.
    fn recover(&self, _orphans: &[String]) -> Vec<String> {
        self.reap_orphans()
            .into_iter()
            .map(|what| format!("gvisor: {what}"))
            .collect()
    }

    fn probe(&self) -> Probe {
        let runsc_ok = self.config.runsc.is_file();
        let root = nix::unistd::geteuid().is_root();
        let memory = self.memory_controller();
        let agent_ok = self.config.agent.is_file();
        Probe::from_capabilities(
            Tier::Gvisor,
            vec![
                Capability {
                    name: "runsc".into(),
                    ok: runsc_ok,
                    detail: self.config.runsc.display().to_string(),
                    fix: Some(format!("run `{}`", Tier::Gvisor.setup_command())),
                    required: true,
                },
                Capability {
                    name: "root".into(),
                    ok: root,
                    detail: if root { "running as root" } else { "not root" }.into(),
                    fix: Some("run cordon as root (runsc needs it for its sandbox)".into()),
                    required: true,
                },
                Capability {
                    name: "memory-cgroup".into(),
                    ok: memory.is_some(),
                    detail: match memory {
                        Some((cgroup::Version::V2, p)) => format!("cgroup v2 at {}", p.display()),
                        Some((cgroup::Version::V1, p)) => {
                            format!("cgroup v1 memory controller at {}", p.display())
                        }
                        None => "no memory controller mounted".into(),
                    },
                    fix: Some(
                        "mount the cgroup memory controller; without it the memory limit is \
                         not enforced (--allow-weaker cgroups)"
                            .into(),
                    ),
                    required: false,
                },
                Capability {
                    name: "agent".into(),
                    ok: agent_ok,
                    detail: self.config.agent.display().to_string(),
                    fix: Some(format!(
                        "run `{}` (it builds {AGENT_BINARY} next to cordon), or set \
                         CORDON_GVISOR_AGENT",
                        Tier::Gvisor.setup_command()
                    )),
                    required: true,
                },
            ],
            vec![format!(
                "platform {}; processes bounded by RLIMIT_NPROC (a pids cgroup crashes runsc)",
                self.config.platform
            )],
        )
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.create_sandbox(spec)?))
    }

    fn start_from_snapshot(
        &self,
        image: &cordon_core::SnapshotImage,
        dir: &cordon_core::SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(match image.mode {
            cordon_core::SnapshotMode::Full => self.start_from_full(image, dir, spec)?,
            cordon_core::SnapshotMode::Filesystem => self.start_from_files(image, dir, spec)?,
        }))
    }
}

impl GvisorBackend {
    /// [`Backend::create`], typed: a caller that needs the tier's own calls on the sandbox
    /// (cordon-oci) keeps it as it is.
    pub fn create_sandbox(&self, spec: &SandboxSpec) -> Result<GvisorSandbox> {
        let t = Instant::now();
        let walls = self.preflight(spec)?;
        let swept_us = t.elapsed().as_micros() as u64;
        let ids = self
            .config
            .ids
            .allocate()
            .map_err(cordon_host::idpool::IdPoolError::into_core)?;
        let egress = !spec.egress.allow.is_empty() || !spec.grants.is_empty();
        let mut sb = self.new_sandbox(spec, ids, walls)?;
        let built = sb.build(egress);
        let built_us = t.elapsed().as_micros() as u64;
        if let Err(e) = built.and_then(|()| sb.start_live()) {
            let _ = sb.destroy();
            return Err(e);
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, swept_us, built_us, ready_us = sb.start_us, "gvisor: created");
        Ok(sb)
    }

    /// What every new sandbox checks first (runsc, root, the agent, the template, the memory
    /// controller, root-only state directories), then the orphan sweep: the walls it gets.
    pub(crate) fn preflight(&self, spec: &SandboxSpec) -> Result<Walls> {
        if !self.config.runsc.is_file() || !nix::unistd::geteuid().is_root() {
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: "runsc is missing or cordon is not root".into(),
                fix: format!(
                    "run `{}` and run cordon as root; see `cordon doctor`",
                    Tier::Gvisor.setup_command()
                ),
            });
        }
        if !self.config.agent.is_file() {
            tracing::error!(agent = %self.config.agent.display(), "gvisor: the agent binary is missing");
            return Err(Error::Unavailable {
                tier: Tier::Gvisor,
                reason: format!("its in-sandbox agent ({AGENT_BINARY}) is not installed"),
                fix: format!(
                    "run `{}` (it builds {AGENT_BINARY} next to cordon), or set \
                     CORDON_GVISOR_AGENT",
                    Tier::Gvisor.setup_command()
                ),
            });
        }
        if let (Some(name), None) = (&spec.template, &spec.resolved_template) {
            return Err(Error::NotPrepared(cordon_core::Unprepared::Template(
                name.clone(),
            )));
        }
        let mut weakened = Vec::new();
        let mut warnings = Vec::new();
        let cgroups = match self.memory_controller() {
            Some(_) => true,
            None if spec.allow_weaker.contains(&Weakening::Cgroups) => {
                weakened.push(Weakening::Cgroups);
                warnings.push(
                    "running without a memory cgroup: the memory limit is not enforced".into(),
                );
                false
            }
            None => {
                return Err(Error::LayerUnavailable {
                    layer: "cgroups".into(),
                    reason: "no cgroup memory controller is mounted".into(),
                });
            }
        };
        // Bundles and runsc's state are root's alone: a directory another user made first
        // (to swap a bundle before runsc reads it) is refused, not adopted.
        for dir in [&self.config.scratch_root, &self.config.state_root] {
            cordon_host::idpool::private_dir(dir).map_err(|detail| {
                tracing::error!("gvisor: {detail}");
                Error::Unavailable {
                    tier: Tier::Gvisor,
                    reason:
                        "a gvisor state directory is not root's alone (the operator's log names it)"
                            .into(),
                    fix: "remove that directory; Cordon makes it again, root's alone (0700)".into(),
                }
            })?;
        }
        self.reap_orphans();
        Ok(Walls {
            cgroups,
            weakened,
            warnings,
        })
    }

    /// A sandbox of `spec` running as `ids`, with its (empty, root-only) bundle directory
    /// made; nothing built or started yet.
    pub(crate) fn new_sandbox(
        &self,
        spec: &SandboxSpec,
        ids: cordon_host::idpool::IdRange,
        walls: Walls,
    ) -> Result<GvisorSandbox> {
        let Walls {
            cgroups,
            weakened,
            warnings,
        } = walls;
        let id = spec.sandbox_id()?;
        let bundle = self.config.scratch_root.join(id.as_str());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&bundle)
            .map_err(|e| Error::io(format!("creating the bundle of {id}"), e))?;
        Ok(GvisorSandbox {
            id,
            uid: ids.base(),
            ids: Some(ids),
            workspace: None,
            config: self.config.clone(),
            spec: spec.clone(),
            work: bundle.join("work"),
            bundle,
            cgroups,
            egress: None,
            live: None,
            starts: 0,
            next_exec: 1,
            start_us: 0,
            destroyed: false,
            weakened,
            warnings,
            file_findings: Vec::new(),
            volumes: Vec::new(),
            watches: None,
        })
    }
}

/// What [`GvisorBackend::preflight`] found a new sandbox gets: a memory cgroup or not (and
/// the weakening and warning that says so).
pub(crate) struct Walls {
    cgroups: bool,
    weakened: Vec<Weakening>,
    warnings: Vec<String>,
}
