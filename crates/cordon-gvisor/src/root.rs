//! A sandbox's root and bundle: its `/etc`, the volumes' binds, the bundle directory and
//! the OCI config each start of runsc gets.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_core::{Error, Result};
use cordon_host::cgroup::SandboxCgroup;
use cordon_host::egress::{EgressLink, SANDBOX_PROXY_PORT, SOCKET_INSIDE};

use crate::bundle::{self, AGENT_INSIDE};
use crate::{GvisorSandbox, reap, workspace};

/// The bundle's directory of port sockets (a sandbox without egress).
const PORTS: &str = "ports";

/// Regular files under `dir`, recursively.
pub(crate) fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                todo.push(e.path());
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    Ok(out)
}

/// Files of the sandbox's `/etc` (the rest of the host's `/etc` is never visible).
pub(crate) fn etc_files(uid: u32) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!("root:x:0:0::/:/bin/sh\nsandbox:x:{uid}:{uid}::/work:/bin/sh\n"),
        ),
        ("group", format!("root:x:0:\nsandbox:x:{uid}:\n")),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n".into()),
        ("hostname", "cordon\n".into()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".into(),
        ),
    ]
}

impl GvisorSandbox {
    /// Binds each leased volume into the bundle, idmapped so the sandbox's host uid writes
    /// files stored as the volumes' canonical owner, and makes its mount point in the fresh
    /// /work (nothing has run there yet, so no symlink can be in the way).
    pub(crate) fn bind_volumes(&mut self) -> Result<()> {
        for (i, v) in self.spec.volumes.iter().enumerate() {
            let Some(src) = &v.source else {
                return Err(Error::NotPrepared(cordon_core::Unprepared::Volume(
                    v.name.clone(),
                )));
            };
            let mut at = self.work.clone();
            for c in v.path.split('/') {
                at.push(c);
                match std::fs::create_dir(&at) {
                    Ok(()) => nix::unistd::chown(
                        &at,
                        Some(nix::unistd::Uid::from_raw(self.uid)),
                        Some(nix::unistd::Gid::from_raw(self.uid)),
                    )
                    .map_err(|e| Error::io("making a volume's mount point", e.into()))?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::io("making a volume's mount point", e)),
                }
            }
            let bind = self.bundle.join(format!("volume-{i}"));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&bind)
                .map_err(|e| Error::io("making a volume's bind", e))?;
            cordon_host::volume::bind_mapped(&src.host_dir, &bind, self.uid, v.read_only)?;
            self.volumes.push((bind, v.inside(), v.read_only));
        }
        // The host directories the node allowed, anywhere the target says: runsc makes
        // their mount points in the sandbox's own root, never through a link of the host's.
        let first = self.volumes.len();
        for (i, b) in self.spec.host_binds.iter().enumerate() {
            cordon_core::validate_bind_target(&b.target)?;
            let bind = self.bundle.join(format!("volume-{}", first + i));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&bind)
                .map_err(|e| Error::io("making a host path's bind", e))?;
            cordon_host::volume::bind_mapped(&b.source, &bind, self.uid, b.read_only)?;
            self.volumes.push((bind, b.target.clone(), b.read_only));
        }
        Ok(())
    }

    /// The host directory of the sockets port connections come through: the egress
    /// socket's when the sandbox has egress (bound at the same place inside), else the
    /// bundle's own.
    pub(crate) fn ports_dir(&self) -> Result<PathBuf> {
        match &self.egress {
            Some(link) => link
                .socket()
                .parent()
                .map(Path::to_path_buf)
                .ok_or_else(|| Error::Sandbox("the egress socket has no directory".into())),
            None => Ok(self.bundle.join(PORTS)),
        }
    }

    /// Lays out the bundle: owner record, root skeleton, /etc, the /work tmpfs, egress.
    pub(crate) fn build(&mut self, egress: bool) -> Result<()> {
        let bundle = self.bundle.clone();
        let sid = self.id.to_string();
        let io = |what: &str, e| Error::io(format!("{what} in the bundle of {sid}"), e);
        // First, so that a Cordon killed from here on leaves something the sweep can judge.
        reap::write_owner(&bundle).map_err(|e| io("writing the owner record", e))?;
        // And host-wide, before any runsc container or cgroup of it exists: sweeps from
        // other data dirs see those and not this bundle.
        reap::register(&self.config.state_root, &sid)
            .map_err(|e| io("writing the host-wide owner record", e))?;
        // The port sockets' directory of a sandbox without egress (root's alone; the agent
        // reaches it as the sandbox's root, its programs do not).
        std::fs::create_dir(bundle.join(PORTS))
            .and_then(|()| {
                std::fs::set_permissions(bundle.join(PORTS), std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| io("creating the ports directory", e))?;
        let rootfs = bundle.join("rootfs");
        self.make_rootfs(&rootfs)?;
        std::fs::create_dir_all(&self.work).map_err(|e| io("creating /work", e))?;
        workspace::mount(&self.work, self.spec.limits.disk_bytes, self.uid).map_err(|e| {
            Error::LayerUnavailable {
                layer: "workspace".into(),
                reason: e.to_string(),
            }
        })?;
        self.workspace = Some(
            cordon_guest::confined::ConfinedWorkspace::new(&self.work, self.uid, self.uid)
                .map_err(|e| io("opening /work", e))?,
        );
        self.bind_volumes()?;
        if egress {
            // gVisor checks the sandbox user's permission on the socket itself (uids are
            // not remapped), so the socket and its 0700 directory belong to that uid.
            let port = self.config.proxy_port.unwrap_or(SANDBOX_PROXY_PORT);
            let link = EgressLink::start_with(self.id.as_str(), &self.spec, self.uid, |c| {
                c.sandbox_proxy_port = port
            })?;
            std::fs::write(
                bundle.join(reap::EGRESS_FILE),
                link.socket().display().to_string(),
            )
            .map_err(|e| io("recording the egress socket", e))?;
            for (path, content) in link.files() {
                let rel = path.trim_start_matches('/');
                let dest = rootfs.join(rel);
                if let Some(d) = dest.parent() {
                    std::fs::create_dir_all(d).map_err(|e| io("creating /etc dirs", e))?;
                }
                std::fs::write(&dest, content).map_err(|e| io("writing the CA files", e))?;
            }
            for (from, path) in link.copies() {
                let dest = rootfs.join(path.trim_start_matches('/'));
                if let Some(d) = dest.parent() {
                    std::fs::create_dir_all(d).map_err(|e| io("creating /etc dirs", e))?;
                }
                std::fs::copy(&from, &dest)
                    .and_then(|_| {
                        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o644))
                    })
                    .map_err(|e| io("copying the CA bundle", e))?;
            }
            self.egress = Some(link);
        }
        Ok(())
    }

    /// The root's skeleton under `rootfs`: the mount points, the links into /usr, the
    /// agent's mount point, the host /etc entries' mount points (without a template) and
    /// Cordon's own /etc files.
    fn make_rootfs(&self, rootfs: &Path) -> Result<()> {
        let sid = self.id.to_string();
        let io = |what: &str, e| Error::io(format!("{what} in the bundle of {sid}"), e);
        for d in [
            "usr",
            "proc",
            "dev",
            "tmp",
            "work",
            "etc",
            "home/user",
            "run/cordon",
            ".cordon",
        ] {
            std::fs::create_dir_all(rootfs.join(d)).map_err(|e| io("creating the root", e))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(to, rootfs.join(link)).map_err(|e| io("linking", e))?;
        }
        std::fs::write(rootfs.join(AGENT_INSIDE.trim_start_matches('/')), b"")
            .map_err(|e| io("making the agent's mount point", e))?;
        // Mount points of the host /etc entries a root of the host's /usr shows (see
        // `config_json`); a template has its own /etc.
        let host_etc = if self.spec.resolved_template.is_none() {
            &cordon_core::HOST_ETC[..]
        } else {
            &[]
        };
        for name in host_etc {
            let host = Path::new("/etc").join(name);
            let inside = rootfs.join("etc").join(name);
            if host.is_dir() {
                std::fs::create_dir(&inside).map_err(|e| io("making /etc's mount points", e))?;
            } else if host.is_file() {
                std::fs::write(&inside, b"").map_err(|e| io("making /etc's mount points", e))?;
            }
        }
        for (name, content) in etc_files(self.uid) {
            std::fs::write(rootfs.join("etc").join(name), content)
                .map_err(|e| io("writing /etc", e))?;
        }
        Ok(())
    }

    /// The OCI bundle's config for one start (crate::bundle has every field and why).
    pub(crate) fn config(&self, cgroup: Option<&SandboxCgroup>) -> Result<oci_spec::runtime::Spec> {
        let template = self.spec.resolved_template.as_ref();
        let egress = match &self.egress {
            Some(link) => Some(bundle::Egress {
                host_dir: link
                    .socket()
                    .parent()
                    .ok_or_else(|| Error::Sandbox("the egress socket has no directory".into()))?,
                inside_dir: Path::new(SOCKET_INSIDE)
                    .parent()
                    .ok_or_else(|| Error::Sandbox("bad egress socket path".into()))?,
                socket_inside: SOCKET_INSIDE,
                port: self.config.proxy_port.unwrap_or(SANDBOX_PROXY_PORT),
            }),
            None => None,
        };
        // Without a template: the few host /etc entries that /usr points into, read-only
        // (made in `build`). With one: Cordon's /etc files (and the egress CA) over the
        // template's own.
        let (host_etc, etc_overlays) = match template {
            None => (
                cordon_core::HOST_ETC
                    .iter()
                    .map(|name| Path::new("/etc").join(name))
                    .filter(|p| p.exists())
                    .collect(),
                Vec::new(),
            ),
            Some(_) => {
                let etc = self.bundle.join("rootfs/etc");
                let files =
                    files_under(&etc).map_err(|e| Error::io("listing the bundle's /etc", e))?;
                let overlays = files
                    .into_iter()
                    .map(|file| {
                        let rel = file.strip_prefix(&etc).unwrap_or(&file);
                        (Path::new("/etc").join(rel), file.clone())
                    })
                    .collect();
                (Vec::new(), overlays)
            }
        };
        let ports = self.ports_dir()?;
        let spec = bundle::config(&bundle::Inputs {
            uid: self.uid,
            limits: &self.spec.limits,
            work: &self.work,
            agent: &self.config.agent,
            volumes: &self.volumes,
            ports: &ports,
            egress,
            template_root: template.map(|t| t.root.as_path()),
            host_etc,
            etc_overlays,
            cgroups_path: cgroup.map(SandboxCgroup::oci_path),
            netns: self.config.netns.as_deref().filter(|_| self.joins_pod()),
        })?;
        if let Some(t) = template {
            // runsc makes a missing bind destination in the root it is given: every one must
            // be in the template already (import makes them), or the template would change.
            for dest in bundle::bind_destinations(&spec) {
                let dest = dest.to_string_lossy();
                if cordon_template::resolve_in_root(&t.root, &dest).is_none_or(|p| !p.exists()) {
                    return Err(Error::Invalid(format!(
                        "template {:?} lacks the mount point {dest} the gvisor tier needs; \
                         import it again with this version of cordon (cordon template rm, then \
                         cordon template import)",
                        t.name
                    )));
                }
            }
        }
        Ok(spec)
    }
}
