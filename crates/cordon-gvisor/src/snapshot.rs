//! Full snapshots and the sandboxes started from one (ADR 0027): `runsc checkpoint` of the
//! live runsc sandbox (its sentry's whole memory: every process, the agent with its
//! background execs, `/tmp`, a template's in-memory overlay) beside a copy of `/work`, and
//! `runsc restore` of that image into a new bundle of its own, any number of times.
//!
//! The source is paused (`runsc pause`) for the checkpoint and the copy of `/work`, so the
//! two agree, and goes on where it was (`--leave-running`: the same sentry, the same agent
//! channel). A restored sandbox gets its own bundle, cgroup, `/work` tmpfs (a copy of the
//! image's), egress proxy and socket (the forwarder in it dials the socket path afresh for
//! each connection), and the agent channel of its own `runsc restore`'s pipes.
//!
//! What cannot be new: the ids its processes run as are in the image's memory, so it runs
//! as the host uid its source leased, and shares that lease ([`IdPool::lease_exact`]):
//! never another sandbox's. `/tmp`'s size is the source's (a tmpfs of the sentry).
//!
//! [`IdPool::lease_exact`]: cordon_host::idpool::IdPool::lease_exact

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use cordon_core::{Error, Result, SandboxSpec, SnapshotDir, SnapshotImage, SnapshotMode, Tier};
use serde::{Deserialize, Serialize};

use crate::{GvisorBackend, GvisorSandbox};

/// The layout of an image this build writes and reads.
pub const FORMAT: u32 = 1;
/// runsc's checkpoint (`checkpoint.img` inside).
const STATE: &str = "state";
/// The copy of `/work`.
const WORK: &str = "work";
const MANIFEST: &str = "gvisor.json";

/// What a restore needs beside runsc's image.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    /// The host uid (and gid) the image's processes run as.
    uid: u32,
    /// The source had an egress path: its agent runs the forwarder, and its bundle the
    /// socket's mount (a restore needs the same mounts).
    egress: bool,
    /// The source's template, by name (its root is the restore's too).
    template: Option<String>,
    /// `runsc --version` of the runsc that wrote it: another may not read it.
    runsc: String,
}

fn invalid(why: &str) -> Error {
    Error::Snapshot(cordon_core::SnapshotRefusal::Unusable {
        tier: cordon_core::Tier::Gvisor,
        why: why.to_string(),
    })
}

/// Refuses an image that is not this tier's, of `mode`, in this build's format.
fn check_image(image: &SnapshotImage, mode: SnapshotMode) -> Result<()> {
    if image.tier != Tier::Gvisor || image.mode != mode {
        return Err(invalid(&format!(
            "it is not a {mode} snapshot of the gvisor tier"
        )));
    }
    if image.format != FORMAT {
        return Err(invalid("it was written by another version of cordon"));
    }
    Ok(())
}

/// Whether `spec` asks for an egress path (the create's own test).
fn has_egress(spec: &SandboxSpec) -> bool {
    !spec.egress.allow.is_empty() || !spec.grants.is_empty()
}

/// `runsc --version`'s first line.
fn runsc_version(runsc: &Path) -> Result<String> {
    let out = Command::new(runsc)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io("running runsc --version", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}

/// Copies the tree `from` into the existing directory `to` (`cp -a`: owners, modes, times
/// and links as they are, which runsc's restore checks against the files it had open).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let st = Command::new("cp")
        .args(["-a", "--no-dereference", "--"])
        .arg(from.join("."))
        .arg(to)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Error::io("copying the workspace", e))?;
    if st.status.success() {
        return Ok(());
    }
    tracing::warn!(
        "gvisor: copying a workspace failed: {}",
        String::from_utf8_lossy(&st.stderr).trim()
    );
    Err(Error::Sandbox(
        "copying the workspace failed (is the new sandbox's disk limit at least the \
         source's use?); the server log says why"
            .into(),
    ))
}

/// Gives the tree under `dir` (itself included, links not followed) to `uid`.
fn own_tree(dir: &Path, uid: u32) -> Result<()> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        std::os::unix::fs::lchown(&d, Some(uid), Some(uid))
            .map_err(|e| Error::io("giving the workspace to the sandbox's user", e))?;
        if !d.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let entries =
            std::fs::read_dir(&d).map_err(|e| Error::io("reading the copied workspace", e))?;
        todo.extend(entries.flatten().map(|e| e.path()));
    }
    Ok(())
}

/// Bytes the tree under `dir` holds on disk (blocks actually used).
pub(crate) fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(md.blocks() * 512);
            if md.is_dir() {
                todo.push(e.path());
            }
        }
    }
    total
}

impl GvisorSandbox {
    /// A full snapshot into `dir`: see the module's documentation.
    pub fn snapshot_full(&mut self, dir: &SnapshotDir) -> Result<SnapshotImage> {
        if !self.volumes.is_empty() {
            return Err(Error::Invalid(
                "a full snapshot of a gvisor sandbox with volumes is not supported (a volume \
                 is shared storage a fork cannot have a copy of); take a filesystem snapshot \
                 or detach the volumes"
                    .into(),
            ));
        }
        let t = Instant::now();
        // A sandbox whose runsc was lost is started again first, as an exec would.
        if self.running_live(String::new).is_err() {
            self.stop_live();
            self.start_live()?;
        }
        let was_paused = self.live.as_ref().is_some_and(|l| l.paused);
        if !was_paused {
            self.runsc_on_live("pause")?;
        }
        let paused_at = t.elapsed();
        let taken = self.checkpoint_paused(dir.path());
        if !was_paused && let Err(e) = self.runsc_on_live("resume") {
            // A source left paused would be a sandbox that silently stopped.
            tracing::error!(sandbox = %self.id, "gvisor: resuming after a snapshot: {e}");
            return Err(e);
        }
        tracing::debug!(sandbox = %self.id, pause_us = paused_at.as_micros() as u64,
            paused_us = (t.elapsed() - paused_at).as_micros() as u64, "gvisor: full snapshot");
        taken?;
        Ok(SnapshotImage {
            tier: Tier::Gvisor,
            mode: SnapshotMode::Full,
            bytes: disk_bytes(dir.path()),
            format: FORMAT,
        })
    }

    /// A filesystem snapshot into `dir`: `/work` copied while the sandbox is paused (no
    /// program writes during the copy); no memory, no process.
    pub fn snapshot_files(&mut self, dir: &SnapshotDir) -> Result<SnapshotImage> {
        let pause =
            self.running_live(String::new).is_ok() && self.live.as_ref().is_some_and(|l| !l.paused);
        if pause {
            self.runsc_on_live("pause")?;
        }
        let work = dir.path().join(WORK);
        let copied = std::fs::create_dir(&work)
            .map_err(|e| Error::io("making the image's workspace", e))
            .and_then(|()| copy_tree(&self.work, &work));
        if pause {
            self.runsc_on_live("resume")?;
        }
        copied?;
        Ok(SnapshotImage {
            tier: Tier::Gvisor,
            mode: SnapshotMode::Filesystem,
            bytes: disk_bytes(dir.path()),
            format: FORMAT,
        })
    }

    /// The checkpoint, the copy of `/work` and the manifest, while paused.
    fn checkpoint_paused(&mut self, dir: &Path) -> Result<()> {
        let manifest = Manifest {
            format: FORMAT,
            uid: self.uid,
            egress: self.egress.is_some(),
            template: self.spec.resolved_template.as_ref().map(|t| t.name.clone()),
            runsc: runsc_version(&self.config.runsc)?,
        };
        let Some(live) = self.live.as_ref() else {
            return Err(Error::Sandbox("the gvisor sandbox is not running".into()));
        };
        let mut cmd = self.runsc_flags(live.cgroup.is_some());
        // Uncompressed: the source's pause is 2 to 5 times shorter, and so is each restore,
        // for images a few MiB larger when idle (ADR 0027).
        cmd.args([
            "checkpoint",
            "--leave-running",
            "--compression=none",
            "--image-path",
        ])
        .arg(dir.join(STATE))
        .arg(&live.cid)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let out = cmd
            .output()
            .map_err(|e| Error::io("running runsc checkpoint", e))?;
        if !out.status.success() {
            tracing::warn!(sandbox = %self.id, "gvisor: runsc checkpoint: {}", String::from_utf8_lossy(&out.stderr).trim());
            return Err(Error::Sandbox(format!(
                "runsc checkpoint failed ({}); the server log says why",
                out.status
            )));
        }
        let work = dir.join(WORK);
        std::fs::create_dir(&work).map_err(|e| Error::io("making the image's workspace", e))?;
        copy_tree(&self.work, &work)?;
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::failed("encoding the snapshot's manifest", e))?;
        crate::live::write_private(&dir.join(MANIFEST), &json)
            .map_err(|e| Error::io("writing the snapshot's manifest", e))
    }
}

impl GvisorBackend {
    /// A new sandbox of `spec` whose `/work` starts as the filesystem snapshot's in `dir`
    /// (given to its own uid); its processes start fresh.
    pub fn start_from_files(
        &self,
        image: &SnapshotImage,
        dir: &SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<GvisorSandbox> {
        let t = Instant::now();
        check_image(image, SnapshotMode::Filesystem)?;
        let walls = self.preflight(spec)?;
        let ids = self
            .config
            .ids
            .allocate()
            .map_err(cordon_host::idpool::IdPoolError::into_core)?;
        let mut sb = self.new_sandbox(spec, ids, walls)?;
        let started = sb
            .build(has_egress(spec))
            .and_then(|()| copy_tree(&dir.path().join(WORK), &sb.work))
            .and_then(|()| own_tree(&sb.work, sb.uid))
            .and_then(|()| sb.start_live());
        if let Err(e) = started {
            let _ = cordon_core::Sandbox::destroy(&mut sb);
            return Err(e);
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        Ok(sb)
    }

    /// A new sandbox restored from a full snapshot in `dir` (any number of times, from
    /// several threads at once): see the module's documentation.
    pub fn start_from_full(
        &self,
        image: &SnapshotImage,
        dir: &SnapshotDir,
        spec: &SandboxSpec,
    ) -> Result<GvisorSandbox> {
        let t = Instant::now();
        check_image(image, SnapshotMode::Full)?;
        let raw = std::fs::read(dir.path().join(MANIFEST))
            .map_err(|e| Error::io("reading the snapshot's manifest", e))?;
        let m: Manifest =
            serde_json::from_slice(&raw).map_err(|_| invalid("its manifest is unreadable"))?;
        if m.format != FORMAT {
            return Err(invalid("it was written by another version of cordon"));
        }
        if m.runsc != runsc_version(&self.config.runsc)? {
            return Err(invalid("it was written by another version of runsc"));
        }
        if m.egress != has_egress(spec) {
            return Err(Error::Invalid(
                "a sandbox started from a full gvisor snapshot has an egress path exactly when \
                 its source had one (its processes are the source's); start it with the \
                 source's egress policy, or take a filesystem snapshot"
                    .into(),
            ));
        }
        if m.template.as_deref() != spec.resolved_template.as_ref().map(|t| t.name.as_str()) {
            return Err(invalid("the new sandbox's template is not the source's"));
        }
        if !spec.volumes.is_empty() {
            return Err(Error::Invalid(
                "a sandbox started from a full gvisor snapshot cannot have volumes; start it \
                 without them"
                    .into(),
            ));
        }
        let walls = self.preflight(spec)?;
        let ids = self
            .config
            .ids
            .lease_exact(m.uid)
            .map_err(cordon_host::idpool::IdPoolError::into_core)?;
        let mut sb = self.new_sandbox(spec, ids, walls)?;
        let started = sb
            .build(m.egress)
            .and_then(|()| copy_tree(&dir.path().join(WORK), &sb.work))
            .and_then(|()| sb.start_live_from(Some(&dir.path().join(STATE))));
        if let Err(e) = started {
            let _ = cordon_core::Sandbox::destroy(&mut sb);
            return Err(e);
        }
        sb.start_us = t.elapsed().as_micros() as u64;
        tracing::debug!(sandbox = %sb.id, ready_us = sb.start_us, "gvisor: restored from a snapshot");
        Ok(sb)
    }
}
