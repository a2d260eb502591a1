//! The tier a container runs on: which tiers this node can run (probed when a bundle asks
//! for one), making the sandbox on the tier the gate chose, and a process's start on it.
//!
//! The container tier takes the caller's descriptors into the sandbox as they are
//! ([`Started::Passed`]). The gvisor and microvm tiers cannot take a host descriptor: a
//! process there is a background exec whose output the agent holds until the monitor has
//! read it (never dropped: the program waits on its pipe instead), and the monitor copies
//! between it and the caller's descriptors ([`Relay`]). A terminal there is the tier's own
//! (the agent's pseudo-terminal in the sandbox), bridged to a pair the monitor makes, whose
//! master goes to the engine and whose slave, in raw mode, the monitor copies to and from.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use cordon_core::{ExecRequest, ProcUser, PtySize, Sandbox, SandboxSpec, Terminal, Tier};
use cordon_host::cgroup::place::Placement;
use cordon_tiers::{Own, Tiers};

use crate::{OciError, Result};

/// The largest root filesystem a bundle may have on the microvm tier: its disk is made
/// from it once per container, under [`DISKS`].
pub const MAX_ROOT_DISK: u64 = 4 << 30;

/// Where microvm containers' disks are made: on the node's disk. A container's state may
/// be on a tmpfs (podman's is under /run), where a disk of up to [`MAX_ROOT_DISK`] would
/// be the node's memory, counted nowhere.
pub const DISKS: &str = "/var/lib/cordon/oci/disks";

/// The directory of container `id`'s microvm disk (`check_id` keeps `id` one name).
fn disk_dir(id: &str) -> PathBuf {
    Path::new(DISKS).join(id)
}

/// Removes container `id`'s microvm disk, if one is left (its VM holds it by descriptor
/// once started, so only a monitor killed while it made the disk leaves one).
pub fn sweep_disk(id: &str) {
    let _ = std::fs::remove_dir_all(disk_dir(id));
}

/// The cgroup the bundle names (`linux.cgroupsPath`: a kubelet's pod cgroup and the
/// container's id below it), checked, with the calling monitor moved into it; the tier makes
/// the sandbox's own cgroup below it. `None`: the bundle names none (or the systemd form),
/// and the sandbox's cgroup is Cordon's own.
pub fn placement(spec: &oci_spec::runtime::Spec, id: &str) -> Result<Option<Placement>> {
    let Some(path) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) else {
        return Ok(None);
    };
    let refused = |e: cordon_host::HostError| OciError::Invalid(e.to_string());
    let Some(place) = Placement::from_oci(&path.to_string_lossy(), id).map_err(refused)? else {
        return Ok(None);
    };
    place.enter().map_err(refused)?;
    Ok(Some(place))
}

/// Removes the cgroup the bundle at `bundle` names for container `id`, once its monitor
/// failed to create it (nothing of the container is left in it).
pub fn unplace(bundle: &Path, id: &str) {
    let path = crate::bundle::load(bundle)
        .ok()
        .and_then(|s| s.linux().as_ref().and_then(|l| l.cgroups_path().clone()));
    if let Some(Ok(Some(place))) = path.map(|p| Placement::from_oci(&p.to_string_lossy(), id)) {
        place.remove(std::time::Duration::from_secs(5));
    }
}

/// The placement a record keeps (checked when it was made).
pub fn placed(rel: &str) -> Option<Placement> {
    let id = rel.rsplit('/').next()?;
    Placement::from_oci(&format!("/{rel}"), id).ok().flatten()
}

/// A container's part of its pod's network (`crate::podnet`).
#[derive(Debug, Clone, Default)]
pub struct Net {
    /// The pod's namespace (walled by this monitor, or joined), kept in the record.
    pub netns: Option<PathBuf>,
    /// The sandbox joins `netns`.
    pub join: bool,
    /// The egress forwarder's port on the pod's loopback.
    pub proxy_port: Option<u16>,
}

/// Makes the sandbox for `spec` on the tier the gate chose (`spec.tier`) for container
/// `id` (the microvm tier's disk is named by it). `ids`: the pool the
/// container tier takes the sandbox's host ids from, when they must be those a writable
/// root was made for (`rootfs::pool`).
pub fn create(
    spec: &SandboxSpec,
    id: &str,
    ids: Option<cordon_host::idpool::IdPool>,
    placement: Option<&Placement>,
    net: &Net,
) -> Result<Box<dyn Sandbox>> {
    let mut own = Own {
        ids,
        root_disk: None,
        cgroup_parent: placement.map(|p| p.rel().to_string()),
        netns: net.join.then(|| net.netns.clone()).flatten(),
        proxy_port: net.proxy_port,
    };
    let disk = spec.tier.features().root_disk;
    if disk {
        if let Some(t) = &spec.resolved_template {
            bounded_size(&t.root, MAX_ROOT_DISK)?;
        }
        // Made fresh: a disk a killed monitor left under the same id is not this image.
        sweep_disk(id);
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(DISKS)
                .map_err(|e| OciError::io("making the microvm disks' directory", e))?;
        }
        own.root_disk = Some(disk_dir(id).join("root.ext4"));
    }
    let backend = (spec.tier.features().oci)
        .then(|| Tiers.backend_for(spec.tier, &own))
        .flatten()
        .ok_or_else(|| {
            OciError::Invalid(format!(
                "cordon-oci does not run the {} tier; set cordon.tier to container, gvisor or microvm",
                spec.tier
            ))
        })?;
    let made = backend.create(spec);
    if disk {
        // QEMU reads the disk by the descriptor it was given: the file goes now, so
        // nothing of it outlives the VM, a crash or a reboot included.
        sweep_disk(id);
    }
    Ok(made?)
}

/// The bundle's root (bound at `root`, read-only) as the gvisor tier takes a template's:
/// with the mount points the tiers bind their own files on (those a template import makes,
/// [`cordon_template::MOUNT_POINTS`]) where the image lacks them. They are made in a small
/// tmpfs of the monitor's own, layered over the image by a read-only overlay: the image is
/// never written. `binds`: the targets of the sandbox's host binds, whose mount points are
/// made the same way. Returns where the overlay is, in the monitor's mount namespace.
pub fn with_mount_points(root: &Path, binds: &[&str]) -> Result<PathBuf> {
    use nix::mount::{MsFlags, mount};
    use std::os::unix::fs::DirBuilderExt;
    let base = root
        .parent()
        .ok_or_else(|| OciError::Invalid("the root's mount point has no parent".into()))?;
    let m = |what: &'static str| move |e: nix::Error| OciError::io(what, e.into());
    let skel = base.join("skel");
    let at = base.join("tier-root");
    for d in [&skel, &at] {
        std::fs::create_dir(d)
            .map_err(|e| OciError::io("making the tier root's mount points", e))?;
    }
    mount(
        Some("tmpfs"),
        &skel,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=1m,mode=0755"),
    )
    .map_err(m("mounting the tier root's mount points"))?;
    let extra = binds.iter().map(|t| (t.trim_start_matches('/'), true));
    for (rel, dir) in cordon_template::MOUNT_POINTS.into_iter().chain(extra) {
        let rel = Path::new(rel);
        // Where the image has it, or a link on the way to it, the image's holds.
        let mut walked = PathBuf::new();
        let mut linked = false;
        for c in rel.components() {
            walked.push(c);
            match root.join(&walked).symlink_metadata() {
                Ok(meta) if meta.file_type().is_symlink() => {
                    linked = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if linked || root.join(rel).symlink_metadata().is_ok() {
            continue;
        }
        let made = skel.join(rel);
        let parents = made.parent().map_or(Ok(()), |p| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(p)
        });
        let done = parents.and_then(|()| {
            if dir {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&made)
            } else {
                std::fs::File::create(&made).map(drop)
            }
        });
        done.map_err(|e| OciError::io("making a mount point of the tier's root", e))?;
    }
    let lower = format!("lowerdir={}:{}", skel.display(), root.display());
    mount(
        Some("overlay"),
        &at,
        Some("overlay"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(lower.as_str()),
    )
    .map_err(m(
        "layering the tier root's mount points over the image (overlayfs)",
    ))?;
    Ok(at)
}

/// Refuses a root filesystem larger than `max` bytes (counted until it is passed, never
/// following a symbolic link).
fn bounded_size(root: &Path, max: u64) -> Result<()> {
    let mut total = 0u64;
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| OciError::io("reading the bundle's root filesystem", e))?;
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                total = total.saturating_add(meta.len());
            }
            if total > max {
                return Err(OciError::Refused {
                    what: format!(
                        "its root filesystem is larger than the microvm tier's {} MiB disk",
                        max >> 20
                    ),
                    fix: "use a smaller image, or the container or gvisor tier".into(),
                });
            }
        }
    }
    Ok(())
}

/// Removes what a container whose monitor is gone may have left on `tier` where the tier
/// has a kernel of its own (its runsc sandbox, a VM's directory and cgroup): the tier's
/// own sweep of sandboxes whose owning process is gone. A tier without one leaves only the
/// sandbox's cgroup and proxy files, which the monitor's sweep removes. Returns one line
/// per thing removed.
pub fn sweep(tier: Tier, sandbox: &str) -> Vec<String> {
    match Tiers.backend(tier) {
        Some(b) if tier.features().own_kernel => b.recover(&[sandbox.to_string()]),
        _ => Vec::new(),
    }
}

/// How a process of the container was started.
pub enum Started {
    /// The caller's descriptors are the process's own (the container tier).
    Passed(u64),
    /// The process's I/O is copied by the monitor ([`Relay`]).
    Relayed(u64),
}

/// Whether a process's I/O on `tier` is copied by the monitor rather than passed.
pub fn relays(tier: Tier) -> bool {
    !tier.features().attached
}

/// Starts `req` in `sandbox` (on `tier`) with `stdio` as its stdin, stdout and stderr
/// (`terminal`: one terminal, of the sandbox's devpts where the tier passes descriptors,
/// else the monitor's), as `user`.
pub fn start(
    sandbox: &mut dyn Sandbox,
    tier: Tier,
    req: &ExecRequest,
    stdio: [BorrowedFd<'_>; 3],
    terminal: bool,
    user: Option<ProcUser>,
) -> Result<Started> {
    if !relays(tier) {
        return Ok(Started::Passed(
            sandbox.start_attached(req, stdio, terminal, user)?,
        ));
    }
    // On a terminal: the tier's own, of the size the engine gave the monitor's.
    let mut req = req.clone();
    if terminal {
        req.pty = Some(window_size(stdio[1]).unwrap_or(DEFAULT_SIZE));
    }
    Ok(Started::Relayed(sandbox.start_relayed(&req, user)?))
}

/// A terminal for a process: where the tier passes descriptors, one of the sandbox's
/// devpts; elsewhere a pair of the monitor's own, its slave in raw mode, which the monitor
/// bridges to the tier's own terminal in the sandbox ([`Relay`]).
pub fn open_terminal(sandbox: &mut dyn Sandbox, tier: Tier, size: PtySize) -> Result<Terminal> {
    if relays(tier) {
        host_terminal(size)
    } else {
        Ok(sandbox.open_terminal(size)?)
    }
}

/// The size a terminal gets when nothing says one.
const DEFAULT_SIZE: PtySize = PtySize { rows: 24, cols: 80 };

/// A pseudo-terminal pair of the monitor's own of `size`: the master for the engine, the
/// slave in raw mode (the sandbox's terminal does the line discipline; this one only
/// carries bytes and the engine's window size).
fn host_terminal(size: PtySize) -> Result<Terminal> {
    use rustix::pty::OpenptFlags;
    let fail = |what: &str| {
        let what = format!("making the process's terminal ({what}); run it without one");
        move |e: rustix::io::Errno| OciError::io(what, e.into())
    };
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).map_err(fail("openpt"))?;
    rustix::pty::grantpt(&master).map_err(fail("grantpt"))?;
    rustix::pty::unlockpt(&master).map_err(fail("unlockpt"))?;
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).map_err(fail("its slave"))?;
    let name = rustix::pty::ptsname(&master, Vec::new())
        .map_err(fail("its name"))?
        .to_string_lossy()
        .into_owned();
    let mut mode = rustix::termios::tcgetattr(&slave).map_err(fail("its mode"))?;
    mode.make_raw();
    rustix::termios::tcsetattr(&slave, rustix::termios::OptionalActions::Now, &mode)
        .map_err(fail("raw mode"))?;
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(fail("its size"))?;
    Ok(Terminal {
        master,
        slave,
        name,
    })
}

/// The window size of the terminal `fd` (`None`: not a terminal, or no valid size).
fn window_size(fd: BorrowedFd<'_>) -> Option<PtySize> {
    let w = rustix::termios::tcgetwinsize(fd).ok()?;
    let size = PtySize {
        rows: w.ws_row,
        cols: w.ws_col,
    };
    size.validate().ok().map(|()| size)
}

/// Most bytes of each stream one read of a relayed process takes.
const READ_MAX: u64 = cordon_core::BACKGROUND_KEEP;

/// Most bytes one look takes from the caller's stdin for a relayed process (what the
/// agent queues for it at once).
const STDIN_CHUNK: usize = 64 * 1024;

/// The copy between a relayed process and the caller's descriptors: its output, read from
/// the agent from where the last read ended (which lets go of what was read), written to
/// the caller's stdout and stderr as they take it, never blocking the monitor (while the
/// caller has not taken one read, the next waits in the agent, and so does the program);
/// the caller's stdin passed on until it ends.
pub struct Relay {
    from: [u64; 2],
    out: [OwnedFd; 2],
    /// Output read from the agent that the caller has not taken yet, and how much of it
    /// it took, per stream.
    unwritten: [(Vec<u8>, usize); 2],
    /// The process's end, read with its last output, told once that is written.
    ended: Option<cordon_core::ProcExit>,
    stdin: Option<OwnedFd>,
    /// Stdin read but not yet taken by the agent; an empty one is its end.
    pending: Option<Vec<u8>>,
    /// On a terminal: the window size the sandbox's terminal was last given.
    size: Option<PtySize>,
}

/// What one pass of a [`Relay`] saw.
#[derive(Debug, Default)]
pub struct Pass {
    /// Output arrived or stdin moved: look again soon.
    pub moved: bool,
    /// How the process ended, once every byte of its output was copied.
    pub exit: Option<cordon_core::ProcExit>,
}

impl Relay {
    /// A relay to (copies of) `stdio` (`terminal`: one terminal of the monitor's, whose
    /// window size is passed on as the engine changes it).
    pub fn new(stdio: [BorrowedFd<'_>; 3], terminal: bool) -> Result<Self> {
        let dup = |fd: BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|e| OciError::io("keeping the process's stdio", e))
        };
        Ok(Relay {
            from: [0, 0],
            out: [dup(stdio[1])?, dup(stdio[2])?],
            unwritten: Default::default(),
            ended: None,
            stdin: Some(dup(stdio[0])?),
            pending: None,
            size: terminal.then(|| window_size(stdio[1]).unwrap_or(DEFAULT_SIZE)),
        })
    }

    /// The caller's stdin while there is more of it to pass on (the monitor polls it).
    pub fn stdin(&self) -> Option<BorrowedFd<'_>> {
        self.stdin
            .as_ref()
            .filter(|_| self.pending.is_none())
            .map(|f| f.as_fd())
    }

    /// The caller's stdout and stderr while output waits for them (the monitor polls them
    /// for room).
    pub fn out_waiting(&self) -> Vec<BorrowedFd<'_>> {
        (0..2)
            .filter(|k| self.waits(*k))
            .map(|k| self.out[k].as_fd())
            .collect()
    }

    fn waits(&self, k: usize) -> bool {
        self.unwritten[k].1 < self.unwritten[k].0.len()
    }

    /// Writes what waits, as much as each descriptor takes without blocking: a piece of at
    /// most `PIPE_BUF` bytes whenever it polls writable (a pipe takes that much whole).
    /// A caller that went away takes no more: what it would have had is dropped, and the
    /// process runs on. Returns whether anything was written.
    fn flush(&mut self) -> bool {
        use nix::errno::Errno;
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut wrote = false;
        for k in 0..2 {
            while self.waits(k) {
                let fd = self.out[k].as_fd();
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
                    break;
                }
                let gone = fds[0].revents().is_some_and(|r| {
                    r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
                });
                let (data, at) = &self.unwritten[k];
                let piece = &data[*at..data.len().min(*at + libc::PIPE_BUF)];
                match (gone, nix::unistd::write(fd, piece)) {
                    (false, Ok(n)) => {
                        self.unwritten[k].1 += n;
                        wrote = true;
                    }
                    (false, Err(Errno::EINTR | Errno::EAGAIN)) => break,
                    _ => self.unwritten[k] = Default::default(),
                }
            }
            if !self.waits(k) {
                self.unwritten[k] = Default::default();
            }
        }
        wrote
    }

    /// Copies what process `id` wrote since the last pass (every byte of it: the agent
    /// holds what was not read) and, with `stdin_ready`, what the caller's stdin holds.
    pub fn pass(
        &mut self,
        sandbox: &mut dyn Sandbox,
        id: u64,
        stdin_ready: bool,
    ) -> cordon_core::Result<Pass> {
        let mut pass = Pass::default();
        // The engine resized its terminal: so is the sandbox's.
        if let Some(last) = self.size
            && let Some(now) = window_size(self.out[0].as_fd())
            && now != last
            && sandbox.resize_background(id, now).is_ok()
        {
            self.size = Some(now);
        }
        if stdin_ready && self.pending.is_none() {
            self.read_stdin();
        }
        if let Some(data) = &self.pending {
            // The agent may take none now (its buffer for the process is full, or the
            // process closed its stdin): tried again on the next pass, dropped at its end.
            if sandbox.write_background(id, data).is_ok() || data.is_empty() {
                self.pending = None;
                pass.moved = true;
            }
        }
        pass.moved |= self.flush();
        // What the caller has not taken yet holds the rest in the agent.
        if self.waits(0) || self.waits(1) {
            return Ok(pass);
        }
        if let Some(exit) = self.ended.take() {
            pass.exit = Some(exit);
            return Ok(pass);
        }
        // A few reads in a row while output keeps coming and the caller takes it; the
        // monitor's other work waits no longer than that.
        for _ in 0..8 {
            let cordon_core::ProcOutput {
                stdout_from,
                stdout,
                stderr_from,
                stderr,
                exit,
            } = sandbox.read_background(id, self.from, READ_MAX)?;
            let got = !stdout.is_empty() || !stderr.is_empty();
            for (k, (at, data)) in [(stdout_from, stdout), (stderr_from, stderr)]
                .into_iter()
                .enumerate()
            {
                // A held stream starts where the last read ended.
                self.from[k] = at + data.len() as u64;
                self.unwritten[k] = (data, 0);
            }
            self.flush();
            let waiting = self.waits(0) || self.waits(1);
            if exit.is_some() {
                if waiting {
                    self.ended = exit;
                } else {
                    pass.exit = exit;
                }
                return Ok(pass);
            }
            if !got {
                break;
            }
            pass.moved = true;
            if waiting {
                break;
            }
        }
        Ok(pass)
    }

    /// Reads what the caller's stdin holds now; its end closes the process's stdin.
    fn read_stdin(&mut self) {
        let Some(fd) = &self.stdin else { return };
        let mut buf = vec![0u8; STDIN_CHUNK];
        match nix::unistd::read(fd, &mut buf) {
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Ok(0) | Err(_) => {
                self.stdin = None;
                self.pending = Some(Vec::new());
            }
            Ok(n) => {
                buf.truncate(n);
                self.pending = Some(buf);
            }
        }
    }
}
