//! The container tier's egress path: a per-sandbox proxy (cordon-egress) listening on a unix
//! socket on the host, bind-mounted into the sandbox, where a forwarder on
//! `127.0.0.1:<port>` relays connections to it. The sandbox has no other route: its network
//! namespace holds only loopback, and Landlock lets programs connect to that one port.

use cordon_core::{Details, Finding};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cordon_core::{Error, Result, SandboxSpec};
use cordon_egress::{EgressProxy, ProxyConfig, ProxyHandle};

/// Where the forwarder listens inside the sandbox.
pub const SANDBOX_PROXY_PORT: u16 = cordon_egress::DEFAULT_SANDBOX_PROXY_PORT;

/// Refuses a connection from outside to a port of the sandbox that is not a program's:
/// port 0, or the egress proxy's forwarder (a client outside would reach the proxy, and the
/// grants it injects, as the sandbox).
pub fn check_own_port(port: u16) -> cordon_core::Result<()> {
    if port == 0 || port == SANDBOX_PROXY_PORT {
        return Err(cordon_core::Rejected::NotAProgramPort {
            port,
            proxy: SANDBOX_PROXY_PORT,
        }
        .into());
    }
    Ok(())
}
/// Where the proxy's socket appears inside the sandbox.
pub const SOCKET_INSIDE: &str = cordon_guest::proto::EGRESS_SOCKET_INSIDE;

/// True when a spec asks for any network path.
pub fn wanted(spec: &SandboxSpec) -> bool {
    !spec.egress.allow.is_empty() || !spec.grants.is_empty()
}

/// Where the proxies' per-sandbox socket directories live.
pub fn socket_dir() -> PathBuf {
    let run = Path::new("/run");
    if run.is_dir() {
        run.join("cordon").join("egress")
    } else {
        std::env::temp_dir().join("cordon-egress")
    }
}

/// Where the CA bundles the sandboxes trust wait for their inits to copy them in: beside
/// the socket directories, not in them (the gvisor tier mounts a socket directory whole).
fn bundle_dir() -> PathBuf {
    let mut d = socket_dir();
    d.set_file_name("egress-ca");
    d
}

/// Whether a process listens on the unix socket at `path`: a non-blocking connect, closed
/// at once, is answered. A path socket is reached across network namespaces, so this holds
/// for a proxy of any of them (a Kubernetes node's, a server's in a namespace of its own),
/// where `/proc/net/unix` lists only the reader's namespace: a sweep reading that took a
/// live proxy in another namespace for a dead one and removed its socket (the pod then
/// met a reset on its next request). A full backlog (`EAGAIN`) is a listener too.
fn someone_listens(path: &Path) -> bool {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let Ok(addr) = UnixAddr::new(path) else {
        return false;
    };
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        // Out of descriptors: say it listens, so nothing is removed on a guess.
        return true;
    };
    match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => true,
        Err(e) => !matches!(
            e,
            nix::errno::Errno::ECONNREFUSED
                | nix::errno::Errno::ENOENT
                | nix::errno::Errno::ENOTSOCK
        ),
    }
}

/// Removes what the proxy of sandbox `sandbox_id` left when the process that ran it was
/// killed: its socket directory (when nothing listens on its socket) and the CA bundle its
/// init copies. Returns whether anything was removed. For an owner that knows its
/// sandbox is gone (cordon-oci's `delete` after a killed monitor), at once, with no grace.
pub fn remove_left(sandbox_id: &str) -> bool {
    // A name, never a path: ids are `sb-` and hex.
    if sandbox_id.is_empty() || sandbox_id.contains('/') || sandbox_id.starts_with('.') {
        return false;
    }
    let dir = socket_dir().join(sandbox_id);
    let socket = dir.join("egress.sock");
    // The process that ran the proxy was killed a moment ago: its listening socket goes
    // when it has finished exiting, which a SIGKILL does not wait for. Bounded: a socket
    // still listening after that belongs to a live proxy and is kept.
    let mut waited = 0;
    while someone_listens(&socket) {
        if waited >= 100 {
            return false;
        }
        waited += 1;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut removed = false;
    if dir.exists() {
        let _ = std::fs::remove_file(&socket);
        removed |= std::fs::remove_dir(&dir).is_ok();
    }
    removed |= std::fs::remove_file(bundle_dir().join(format!("{sandbox_id}.pem"))).is_ok();
    removed
}

/// Removes the socket directories of proxies that are gone: what a killed Cordon process
/// left (its proxies died with it). A directory is stale when its socket file exists and
/// nothing listens on it, or when it has had no socket for longer than a proxy takes to
/// start ([`SOCKETLESS_GRACE`]); one whose proxy is being set up or running is kept.
/// Returns the sandbox ids whose directories were removed.
pub fn reap_stale() -> Vec<String> {
    let sockets = socket_dir();
    let Ok(entries) = std::fs::read_dir(&sockets) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        let socket = dir.join("egress.sock");
        if someone_listens(&socket) {
            continue;
        }
        if !socket.exists() {
            let young = std::fs::symlink_metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < SOCKETLESS_GRACE);
            if young {
                continue;
            }
        }
        let _ = std::fs::remove_file(&socket);
        if std::fs::remove_dir(&dir).is_ok() {
            removed.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    // A bundle outlives its proxy only when its process was killed: its socket directory,
    // made before it and removed after it, is gone (or was reaped just now).
    if let Ok(entries) = std::fs::read_dir(bundle_dir()) {
        for e in entries.flatten() {
            let path = e.path();
            let Some(id) = path.file_stem() else { continue };
            if !sockets.join(id).exists() {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    removed
}

/// A socket directory being set up: removed on drop unless taken over.
struct MadeDir(Option<PathBuf>);

impl Drop for MadeDir {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// How long a socket directory may stay without its socket before the sweep takes it: a
/// proxy binds within milliseconds of its directory being made.
const SOCKETLESS_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// A running proxy for one sandbox.
pub struct EgressLink {
    handle: Option<ProxyHandle>,
    socket: PathBuf,
    /// The bundle the sandbox trusts (readable by the sandbox's root alone), for the
    /// sandbox's init to copy in.
    bundle: PathBuf,
}

impl EgressLink {
    /// Starts the proxy. `owner` is the host uid of the sandbox's root, which alone (with
    /// host root) may reach the socket: it sits in a per-sandbox directory of mode 0700 owned
    /// by that uid, under a parent other host users cannot list.
    pub fn start(sandbox_id: &str, spec: &SandboxSpec, owner: u32) -> Result<Self> {
        Self::start_with(sandbox_id, spec, owner, |_| {})
    }

    /// [`Self::start`] with a last say over the proxy's configuration (another tier's CA
    /// paths inside the sandbox, a resolver or upstream roots of its own).
    pub fn start_with(
        sandbox_id: &str,
        spec: &SandboxSpec,
        owner: u32,
        tune: impl FnOnce(&mut ProxyConfig),
    ) -> Result<Self> {
        let parent = socket_dir();
        std::fs::create_dir_all(&parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| Error::io(format!("securing {}", parent.display()), e))?;
        let dir = parent.join(sandbox_id);
        let socket = dir.join("egress.sock");
        let mut cfg = ProxyConfig::for_spec(sandbox_id, spec);
        cfg.unix_socket = Some(socket.clone());
        cfg.sandbox_proxy_port = SANDBOX_PROXY_PORT;
        tune(&mut cfg);
        // A sandbox started again under its id (from its files) may find what its first
        // start's proxy left if that one's end was cut short: it is that sandbox's own.
        if spec.id.is_some() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => tracing::warn!(sandbox = sandbox_id, "removed a stale egress directory"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::io(
                        "removing a stale egress directory".to_string(),
                        e,
                    ));
                }
            }
        }
        // The directory goes with this start if anything below fails: a tenant looping
        // requests whose proxy cannot start must not fill /run with empty directories.
        std::fs::create_dir(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let mut made = MadeDir(Some(dir.clone()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("securing {}", dir.display()), e))?;
        std::os::unix::fs::chown(&dir, Some(owner), Some(owner))
            .map_err(|e| Error::io(format!("handing {} to the sandbox", dir.display()), e))?;
        let handle = EgressProxy::start_owned(cfg).map_err(|e| Error::Malformed {
            what: "egress".into(),
            fix: "fix the sandbox's egress entries and grants".into(),
            source: Box::new(e),
        })?;
        // From here the link's drop removes the socket and the directory.
        made.0 = None;
        let link = EgressLink {
            handle: Some(handle),
            socket,
            bundle: bundle_dir().join(format!("{sandbox_id}.pem")),
        };
        // The sandbox's root is an unprivileged host uid: it must be able to connect.
        let socket = &link.socket;
        std::os::unix::fs::chown(socket, Some(owner), Some(owner))
            .and_then(|_| std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)))
            .map_err(|e| Error::io(format!("handing {} to the sandbox", socket.display()), e))?;
        // The bundle (the host's roots and this sandbox's CA, a few hundred KB) goes in as a
        // file the init copies, not through the init's JSON, which would encode, decode and
        // write it twice on every start.
        let bundles = bundle_dir();
        std::fs::create_dir_all(&bundles)
            .and_then(|_| {
                std::fs::set_permissions(&bundles, std::fs::Permissions::from_mode(0o711))
            })
            .map_err(|e| Error::io(format!("creating {}", bundles.display()), e))?;
        if let Some(h) = link.handle() {
            std::fs::write(&link.bundle, h.ca_bundle_pem())
                .and_then(|_| std::os::unix::fs::chown(&link.bundle, Some(owner), Some(owner)))
                .and_then(|_| {
                    std::fs::set_permissions(&link.bundle, std::fs::Permissions::from_mode(0o600))
                })
                .map_err(|e| Error::io(format!("writing {}", link.bundle.display()), e))?;
        }
        Ok(link)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn handle(&self) -> Option<&ProxyHandle> {
        self.handle.as_ref()
    }

    /// Environment every exec gets: proxy variables, CA paths, grant placeholders.
    pub fn env(&self) -> Vec<(String, String)> {
        self.handle().map(|h| h.sandbox_env()).unwrap_or_default()
    }

    /// Files the sandbox's /etc gets with their text: the per-sandbox CA.
    pub fn files(&self) -> Vec<(String, String)> {
        let Some(h) = self.handle() else {
            return Vec::new();
        };
        vec![(
            cordon_egress::DEFAULT_CA_CERT_PATH.to_string(),
            h.ca_cert_pem().to_string(),
        )]
    }

    /// Host files the sandbox's /etc gets copies of: the bundle it trusts, at Cordon's path
    /// and where OpenSSL, Python and curl look by default.
    pub fn copies(&self) -> Vec<(PathBuf, String)> {
        if self.handle().is_none() {
            return Vec::new();
        }
        [
            cordon_egress::DEFAULT_CA_BUNDLE_PATH,
            "/etc/ssl/certs/ca-certificates.crt",
        ]
        .into_iter()
        .map(|inside| (self.bundle.clone(), inside.to_string()))
        .collect()
    }

    /// The per-sandbox CA certificate and the bundle the sandbox trusts (that CA plus the
    /// host's roots), for tiers that place them themselves.
    pub fn ca_pems(&self) -> Option<(String, String)> {
        self.handle()
            .map(|h| (h.ca_cert_pem().to_string(), h.ca_bundle_pem()))
    }

    /// Audit events since the last call, folded and bounded (see
    /// [`cordon_egress::ProxyHandle::take_events`]).
    pub fn new_events(&mut self) -> Vec<cordon_core::EgressEvent> {
        self.handle().map(|h| h.take_events()).unwrap_or_default()
    }

    /// Scans bytes leaving the sandbox: real secrets redacted, credential formats flagged.
    pub fn scan(&self, bytes: &[u8]) -> (Vec<u8>, Vec<Finding>) {
        match self.handle() {
            Some(h) => {
                let out = h.scan_output(bytes);
                (out.bytes, out.findings)
            }
            None => (bytes.to_vec(), Vec::new()),
        }
    }
}

impl Drop for EgressLink {
    fn drop(&mut self) {
        // Placeholders die with the proxy.
        drop(self.handle.take());
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.bundle);
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Scans output with no proxy: flags credential formats, redacts nothing known.
pub fn scan_plain(bytes: &[u8]) -> Vec<Finding> {
    cordon_egress::scan(bytes, &[]).findings
}

/// Scans bytes leaving a sandbox with its proxy's secrets when it has one, plainly otherwise.
pub fn scan_maybe(link: Option<&EgressLink>, bytes: &[u8]) -> (Vec<u8>, Vec<Finding>) {
    match link {
        Some(l) => l.scan(bytes),
        None => (bytes.to_vec(), scan_plain(bytes)),
    }
}

/// Scans a file taken out of a sandbox: the findings name the file.
pub fn scan_file(link: Option<&EgressLink>, path: &str, bytes: &[u8]) -> (Vec<u8>, Vec<Finding>) {
    let (clean, mut found) = scan_maybe(link, bytes);
    for f in &mut found {
        f.file = Some(path.to_string());
    }
    (clean, found)
}

/// Scans an exec's stdout and stderr, and puts the findings (each naming its stream) and
/// the egress decisions since the last call into the outcome's details.
pub fn scan_outcome(o: &mut cordon_core::ExecOutcome, link: Option<&mut EgressLink>) {
    for (name, stream) in [("stdout", &mut o.stdout), ("stderr", &mut o.stderr)] {
        let (clean, found) = scan_maybe(link.as_deref(), stream);
        *stream = clean;
        o.extra.findings.extend(found.into_iter().map(|mut f| {
            f.stream = Some(name.to_string());
            f
        }));
    }
    if let Some(l) = link {
        o.extra.egress.extend(l.new_events());
    }
}

/// A sandbox's `report()`: the findings of files taken out (drained) and the egress
/// decisions since the last call.
pub fn report(file_findings: &mut Vec<Finding>, link: Option<&mut EgressLink>) -> Details {
    Details {
        findings: std::mem::take(file_findings),
        egress: link.map(|l| l.new_events()).unwrap_or_default(),
        ..Details::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy whose socket was made in another network namespace (a Kubernetes node's,
    /// beside a server in the host's) is live, and the sweep keeps it; once nothing listens,
    /// it is stale. Before, the sweep judged by `/proc/net/unix`, which lists only the
    /// reader's namespace, and removed the live proxy's socket: CI's k8s egress test of a
    /// gvisor pod met a reset while another job's container backend started.
    #[test]
    fn a_proxy_listening_in_another_network_namespace_is_not_reaped() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(
                std::env::var("CORDON_REQUIRE_ALL").as_deref(),
                Ok("1"),
                "this test needs root (a network namespace)"
            );
            eprintln!("SKIPPED: needs root for a network namespace");
            return;
        }
        let name = format!("sb-othernet-{}", std::process::id());
        let dir = socket_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("egress.sock");
        let (bound_tx, bound) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let at = socket.clone();
        let owner = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = std::os::unix::net::UnixListener::bind(&at).unwrap();
            bound_tx.send(()).unwrap();
            let _ = stopped.recv();
            drop(l);
        });
        bound.recv().unwrap();
        let listed = std::fs::read_to_string("/proc/net/unix").unwrap();
        assert!(
            !listed.contains(socket.to_str().unwrap()),
            "the socket should be in another namespace's list"
        );
        let removed = reap_stale();
        let kept = socket.exists();
        stop.send(()).unwrap();
        owner.join().unwrap();
        assert!(!removed.contains(&name), "a live proxy was reaped");
        assert!(kept, "a live proxy's socket was removed");
        // Its listener closed: now it is stale.
        let removed = reap_stale();
        assert!(removed.contains(&name), "{removed:?}");
        assert!(!dir.exists());
    }
}
