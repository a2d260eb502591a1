//! Full snapshots of a live microVM and the sandboxes started from one (ADR 0027).
//!
//! The guest's whole mutable state is its RAM and devices: the root disk is attached
//! read-only and `/work` and `/tmp` are tmpfs in guest RAM. So a snapshot is one QEMU
//! migration stream (every RAM page, `x-ignore-shared` off) written through a descriptor
//! Cordon created in the image directory, with the vCPUs stopped for its length, after which
//! the source continues (`cont`); no disk is copied, and a fork needs no disk of its own.
//!
//! A fork is a new confined QEMU (its own cgroup, uid, run directory and egress proxy) that
//! loads the stream, continues, and is then configured as a sandbox of its own: hostname
//! (its id), a fresh seed mixed into the guest's random pool and a forced reseed of its
//! generator, the clock, its own sizes and, with egress, its own forwarder and CA. The VM's
//! shape (vCPUs, RAM) is the source's: a fork's limits must fit in it.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use cordon_core::{
    Error, Result, SandboxId, SandboxSpec, SnapshotDir, SnapshotImage, SnapshotMode, Tier,
};
use serde_json::json;

use crate::paused;

use super::pause::await_migration;
use super::state::{MicrovmBackend, MicrovmSandbox};

/// The layout of an image this build writes and reads.
pub const FORMAT: u32 = 1;
const STATE: &str = "state";
const MANIFEST: &str = "manifest.json";

fn invalid(why: &str) -> Error {
    Error::Snapshot(cordon_core::SnapshotRefusal::Unusable {
        tier: cordon_core::Tier::Microvm,
        why: why.to_string(),
    })
}

/// Creates `name` in `dir`: new, root's alone, never through a link.
fn create_private(dir: &std::path::Path, name: &str) -> Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(dir.join(name))
        .map_err(|e| Error::io(format!("creating the snapshot's {name}"), e))
}

impl MicrovmSandbox {
    /// A full snapshot into `dir`: see the module's documentation.
    pub fn snapshot_full(&mut self, dir: &SnapshotDir) -> Result<SnapshotImage> {
        if self.on_disk.is_some() {
            return Err(Error::Invalid(
                "the sandbox is paused to disk; resume it, then take the snapshot".into(),
            ));
        }
        if self.egress.is_some() {
            return Err(Error::Unsupported {
                what: "a full snapshot of a microVM with egress".into(),
                fix: "take it of a sandbox without allow_hosts or grants (sandboxes started \
                      from it may have egress of their own), or take a filesystem snapshot"
                    .into(),
            });
        }
        if let Some(t) = &self.spec.resolved_template {
            return Err(Error::Unsupported {
                what: format!("a full snapshot of a microVM of template {:?}", t.name),
                fix: "take it of a sandbox without a template".into(),
            });
        }
        self.ctrl()?;
        let t = Instant::now();
        let state = create_private(dir.path(), STATE)?;
        let vm = self.vm.as_ref().ok_or_else(|| self.gone_err())?;
        let status = vm.qmp("query-status", json!({}))?;
        let running = status.get("status").and_then(|s| s.as_str()) == Some("running");
        let saved = (|| -> std::result::Result<(), crate::MicrovmError> {
            vm.qmp("stop", json!({}))?;
            vm.qmp_many(&[
                (
                    "migrate-set-capabilities",
                    json!({"capabilities": [{"capability": "x-ignore-shared", "state": false}]}),
                    None,
                ),
                ("getfd", json!({"fdname": "fork"}), Some(state.as_raw_fd())),
                ("migrate", json!({"uri": "fd:fork"}), None),
            ])?;
            await_migration(vm, Duration::from_secs(600))
        })();
        // The source goes on where it was (a sandbox its caller paused stays paused).
        let resumed = if running {
            vm.qmp("cont", json!({}))
        } else {
            Ok(json!({}))
        };
        let paused_us = t.elapsed().as_micros() as u64;
        saved.map_err(|e| Error::failed("saving the microVM's state for a snapshot", e))?;
        resumed.map_err(|e| Error::failed("continuing the microVM after a snapshot", e))?;
        state
            .sync_all()
            .map_err(|e| Error::io("writing the snapshot's state", e))?;
        let state_bytes = state
            .metadata()
            .map_err(|e| Error::io("writing the snapshot's state", e))?
            .len();
        let manifest = self.manifest(state_bytes);
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::failed("encoding the snapshot's manifest", e))?;
        create_private(dir.path(), MANIFEST)?
            .write_all(&text)
            .map_err(|e| Error::io("writing the snapshot's manifest", e))?;
        tracing::debug!(sandbox = %self.id, paused_us, state_bytes, "microvm: full snapshot");
        Ok(SnapshotImage {
            tier: Tier::Microvm,
            mode: SnapshotMode::Full,
            bytes: state_bytes + text.len() as u64,
            format: FORMAT,
        })
    }
}

impl MicrovmBackend {
    /// A new sandbox started from a full snapshot in `dir` (any number of times, from
    /// several threads at once): see the module's documentation.
    pub fn start_from_full(
        &self,
        image: &SnapshotImage,
        dir: &SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<MicrovmSandbox> {
        let t = Instant::now();
        if image.tier != Tier::Microvm || image.mode != SnapshotMode::Full {
            return Err(invalid("it is not a full snapshot of the microvm tier"));
        }
        if image.format != FORMAT {
            return Err(invalid("it was written by another version of cordon"));
        }
        spec.validate()?;
        if spec.resolved_template.is_some() || spec.template.is_some() {
            return Err(invalid("a sandbox started from it has no template"));
        }
        let raw = fs::read(dir.path().join(MANIFEST))
            .map_err(|e| Error::io("reading the snapshot's manifest", e))?;
        let mut m: paused::Manifest =
            serde_json::from_slice(&raw).map_err(|_| invalid("its manifest is unreadable"))?;
        if m.format != paused::FORMAT {
            return Err(invalid("it was written by another version of cordon"));
        }
        // The VM's shape is the source's: the fork's workspace, /tmp and programs must fit.
        let image_now = crate::image::load(&self.cfg.data_dir)?;
        let wanted = self.params(spec, image_now).ram_mib;
        if wanted > m.ram_mib {
            return Err(Error::Invalid(format!(
                "a sandbox started from this snapshot runs in its source's {} MiB VM; its \
                 memory, disk and tmp limits together need {wanted} MiB: lower them",
                m.ram_mib
            )));
        }
        let state = fs::File::open(dir.path().join(STATE))
            .map_err(|e| Error::io("opening the snapshot's state", e))?;
        let len = state
            .metadata()
            .map_err(|e| Error::io("opening the snapshot's state", e))?
            .len();
        if len != m.state_bytes {
            return Err(invalid("its state is not the size it was written with"));
        }
        let id = SandboxId::random()?;
        m.id = id.as_str().to_string();
        m.spec = spec.clone();
        let mut sb = self.sandbox_from(m)?;
        sb.on_disk = None;
        sb.params.egress = cordon_host::egress::wanted(spec);
        if let Err(e) = sb.start_from_state(&state) {
            sb.teardown();
            return Err(Error::failed(
                "starting a microVM from the snapshot failed",
                e,
            ));
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, ready_us = sb.start_us, "microvm: started from a snapshot");
        Ok(sb)
    }
}
