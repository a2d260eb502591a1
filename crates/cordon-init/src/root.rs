//! Building the sandbox's root: the host's directories or a template bound read-only,
//! Cordon's own files, devices, volumes, and the pivot into it.

use std::fs;
use std::io::{self};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::frames::{DEVICES, InitJoin, InitSetup, check_device_name};
use crate::volumes::{make_bind_points, mount_volumes};

/// Directories from the host bound read-only into the sandbox (or recreated as the same
/// symlinks where the host has merged /usr).
const HOST_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Where the sandbox root is built (a tmpfs over the host's /tmp path, in the sandbox's
/// private mount namespace) before it becomes `/`.
const ROOT_BUILT_AT: &str = "/tmp";

/// Mount flags a bind mount must keep (locked by the kernel in a user namespace).
fn locked_flags(src: &Path) -> MsFlags {
    let mut f = MsFlags::empty();
    if let Ok(st) = nix::sys::statvfs::statvfs(src) {
        use nix::sys::statvfs::FsFlags;
        let fl = st.flags();
        if fl.contains(FsFlags::ST_NOSUID) {
            f |= MsFlags::MS_NOSUID;
        }
        if fl.contains(FsFlags::ST_NODEV) {
            f |= MsFlags::MS_NODEV;
        }
        if fl.contains(FsFlags::ST_NOEXEC) {
            f |= MsFlags::MS_NOEXEC;
        }
        if fl.contains(FsFlags::ST_NOATIME) {
            f |= MsFlags::MS_NOATIME;
        }
        if fl.contains(FsFlags::ST_NODIRATIME) {
            f |= MsFlags::MS_NODIRATIME;
        }
        // ST_RELATIME (Linux's value; musl's headers and so nix's FsFlags lack the name).
        const ST_RELATIME: libc::c_ulong = 0x1000;
        if fl.bits() & ST_RELATIME != 0 {
            f |= MsFlags::MS_RELATIME;
        }
    }
    f
}

fn bind_ro(src: &Path, dst: &Path, extra: MsFlags) -> Result<(), String> {
    let e = |what: &str| {
        let what = format!("{what} {} on {}", src.display(), dst.display());
        move |err: nix::errno::Errno| format!("{what}: {err}")
    };
    cordon_guest::sys::bind_recursive(src, dst).map_err(e("binding"))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | extra
        | locked_flags(src);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>).map_err(e("read-only remount of"))
}

/// Binds `src` on `dst` writable, without set-id programs or device nodes.
fn bind_rw(src: &Path, dst: &Path) -> Result<(), String> {
    let e = |what: &'static str| move |err: nix::errno::Errno| format!("{what}: {err}");
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(e("binding"))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(src);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>).map_err(e("remounting"))
}

/// A build's writable root: every file of Cordon's generated layer `gen` bound over the
/// same path of `root` (made, empty, where the root lacks it; never through a symbolic
/// link of the root), `gen`'s `/dev` over the root's, and the mount points made. The
/// root's own files stay as they are under the binds, so none of Cordon's files is
/// sealed into the template.
fn cover_build_root(layer: &Path, root: &Path) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    // The path `rel` under `root`, its directories made, refusing links on the way.
    let make = |rel: &Path, dir: bool| -> Result<PathBuf, String> {
        let mut at = root.to_path_buf();
        let n = rel.components().count();
        for (i, c) in rel.components().enumerate() {
            at.push(c);
            let last = i + 1 == n;
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!(
                        "the build's root has a symbolic link at /{}, where Cordon puts its own \
                         files; build from a base without it",
                        rel.display()
                    ));
                }
                Ok(m) if !last && !m.is_dir() => {
                    return Err(format!(
                        "the build's root has a file at /{}, where Cordon needs a directory",
                        rel.display()
                    ));
                }
                Ok(_) => {}
                Err(_) if !last || dir => {
                    fs::create_dir(&at).map_err(io(format!("creating /{}", rel.display())))?
                }
                Err(_) => {
                    fs::write(&at, b"").map_err(io(format!("creating /{}", rel.display())))?
                }
            }
        }
        Ok(at)
    };
    let bind = |from: &Path, to: &Path| -> Result<(), String> {
        mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| {
            format!(
                "binding Cordon's {} in the build's root: {e}",
                from.display()
            )
        })
    };
    for d in ["proc", "tmp", "work"] {
        make(Path::new(d), true)?;
    }
    let dev = make(Path::new("dev"), true)?;
    bind(&layer.join("dev"), &dev)?;
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = layer.join(&rel);
        for entry in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
            let entry = entry.map_err(io(format!("listing {}", dir.display())))?;
            let sub = rel.join(entry.file_name());
            if rel.as_os_str().is_empty()
                && ["dev", "proc", "tmp", "work"]
                    .contains(&entry.file_name().to_str().unwrap_or(""))
            {
                continue;
            }
            let ft = entry
                .file_type()
                .map_err(io(format!("reading {}", sub.display())))?;
            if ft.is_dir() {
                make(&sub, true)?;
                todo.push(sub);
            } else if ft.is_file() {
                let to = make(&sub, false)?;
                bind(&entry.path(), &to)?;
            }
        }
    }
    Ok(())
}

/// `/tmp` and `/dev/shm`: two directories, `tmp` and `shm`, made in `scratch` (a directory
/// of the stage tmpfs the root is built on, never reached from the sandbox: under the
/// root's own `proc` directory, which `/proc` covers, or beside a template's root), each
/// bound in place (`/dev/shm` also `noexec`). They share the sandbox's `/tmp` budget, which
/// [`size_stage`] gives the stage once the root is written. No superblock of their own:
/// every superblock takes a shrinker id, and every memory cgroup on the host keeps a map as
/// long as the most ids the host has had (about 1 MiB per memory cgroup at 10,000
/// sandboxes: ADR 0026, "At 10,000 live"); a sandbox's own are its root's (with these), its
/// devpts, /proc (one per PID namespace), /work and the IPC namespace's mqueue.
fn scratch_dirs(scratch: &Path, root: &Path) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    fs::create_dir_all(scratch).map_err(io("creating the scratch directories".into()))?;
    for (dir, at, extra) in [
        ("tmp", "tmp", MsFlags::empty()),
        ("shm", "dev/shm", MsFlags::MS_NOEXEC),
    ] {
        let src = scratch.join(dir);
        fs::create_dir(&src).map_err(io(format!("creating the scratch {dir}")))?;
        fs::set_permissions(&src, fs::Permissions::from_mode(0o1777))
            .map_err(io(format!("opening the scratch {dir} to all")))?;
        let dst = root.join(at);
        mount(
            Some(&src),
            &dst,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding /{at}: {e}"))?;
        mount(
            None::<&str>,
            &dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | nosuid_nodev | extra,
            None::<&str>,
        )
        .map_err(|e| format!("setting the flags of /{at}: {e}"))?;
    }
    Ok(())
}

/// Gives the stage tmpfs at [`ROOT_BUILT_AT`] the sandbox's `/tmp` budget on top of what
/// the root's own files already use, once they are all written: `/tmp` and `/dev/shm`
/// (its directories) can then hold `tmp_bytes` together, no more.
fn size_stage(tmp_bytes: u64) -> Result<(), String> {
    let st = nix::sys::statvfs::statvfs(ROOT_BUILT_AT)
        .map_err(|e| format!("reading the root's size: {e}"))?;
    let used = (st.blocks() - st.blocks_free()) as u64 * st.fragment_size() as u64;
    mount(
        None::<&str>,
        ROOT_BUILT_AT,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={},mode=0755", used + tmp_bytes).as_str()),
    )
    .map_err(|e| format!("sizing /tmp: {e}"))
}

fn tmpfs(dst: &Path, opts: &str, flags: MsFlags) -> Result<(), String> {
    mount(Some("tmpfs"), dst, Some("tmpfs"), flags, Some(opts))
        .map_err(|e| format!("mounting tmpfs on {}: {e}", dst.display()))
}

/// Where a template's pieces are staged, under the stage tmpfs at [`ROOT_BUILT_AT`]: the
/// template's root bound read-only, Cordon's generated files (the top layer), and the
/// read-only overlay of the two that becomes `/`. The overlay's options name only these
/// paths, never where the template lives on the host.
const TEMPLATE_LOWER: &str = "/tmp/tpl";
const TEMPLATE_GEN: &str = "/tmp/gen";
const TEMPLATE_ROOT: &str = "/tmp/root";
/// Where `/tmp`'s and `/dev/shm`'s directories are with a template (beside its root, so
/// gone from view with the host's tree at the pivot).
const TEMPLATE_SCRATCH: &str = "/tmp/scratch";

pub(crate) fn build_root(setup: &InitSetup) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    cordon_guest::sys::make_mounts_private().map_err(|e| format!("making mounts private: {e}"))?;
    let new = Path::new(ROOT_BUILT_AT);
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // The template's root is opened before the stage tmpfs hides whatever the host has at
    // its path (a data dir under /tmp), then bound from that open directory. Errors say
    // what failed, never where the template lives.
    let template = match &setup.template_root {
        Some(t) => Some(
            nix::fcntl::open(
                t.as_path(),
                nix::fcntl::OFlag::O_PATH
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "opening the template's root: {e} (the data dir and its parents must be \
                     passable (o+x) by the sandbox's ids)"
                )
            })?,
        ),
        None => None,
    };
    tmpfs(new, "size=4m,mode=0755", nosuid_nodev)?;
    if let Some(fd) = template {
        // The template: its root bound read-only here; the generated files go to their own
        // directory, and the overlay of both is mounted once the join's files are in.
        let lower = Path::new(TEMPLATE_LOWER);
        for d in [TEMPLATE_LOWER, TEMPLATE_GEN, TEMPLATE_ROOT] {
            fs::create_dir(d).map_err(io(format!("creating {d}")))?;
        }
        let src = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        if setup.template_writable {
            // A build's working copy: bound writable where the root is made.
            bind_rw(&src, Path::new(TEMPLATE_ROOT)).map_err(|e| {
                let errno = e.rsplit(": ").next().unwrap_or("failed");
                format!("binding the build's root: {errno}")
            })?;
            drop(fd);
            return make_tree(Path::new(TEMPLATE_GEN), setup);
        }
        bind_ro(&src, lower, MsFlags::MS_NODEV).map_err(|e| {
            let errno = e.rsplit(": ").next().unwrap_or("failed");
            format!("binding the template's root read-only: {errno}")
        })?;
        drop(fd);
        return make_tree(Path::new(TEMPLATE_GEN), setup);
    }
    for name in HOST_DIRS {
        let host = Path::new("/").join(name);
        let inside = new.join(name);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target =
                    fs::read_link(&host).map_err(io(format!("reading {}", host.display())))?;
                symlink(&target, &inside).map_err(io(format!("linking {}", inside.display())))?;
            }
            Ok(m) if m.is_dir() => {
                fs::create_dir(&inside).map_err(io(format!("creating {}", inside.display())))?;
                bind_ro(&host, &inside, MsFlags::MS_NODEV)?;
            }
            _ => {}
        }
    }
    make_tree(new, setup)?;
    // The few host /etc entries that /usr points into, read-only.
    for name in cordon_core::HOST_ETC {
        let host = Path::new("/etc").join(name);
        let inside = new.join("etc").join(name);
        let made = match fs::metadata(&host) {
            Ok(m) if m.is_dir() => fs::create_dir(&inside),
            Ok(m) if m.is_file() => fs::write(&inside, b""),
            _ => continue,
        };
        made.map_err(io(format!("creating {}", inside.display())))?;
        bind_ro(&host, &inside, MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
    }
    // Under the root's `proc` directory: `/proc` is mounted over it next.
    mount_pieces(new, &new.join("proc").join("scratch"), setup)
}

/// Cordon's own files and mount points of the sandbox root, under `at`: a minimal /etc
/// (nothing of the host's), /dev's entries, /proc, /tmp and /work.
fn make_tree(at: &Path, setup: &InitSetup) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    let etc = at.join("etc");
    fs::create_dir(&etc).map_err(io("creating /etc".into()))?;
    let uid = setup.sandbox_uid;
    let files: [(&str, String); 4] = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1 localhost {h}\n::1 localhost {h}\n",
                h = setup.hostname
            ),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".to_string(),
        ),
    ];
    for (name, body) in files {
        fs::write(etc.join(name), body).map_err(io(format!("writing /etc/{name}")))?;
    }
    // /dev: a few device nodes bound from the host, nothing else. A directory of the root's
    // own tmpfs (read-only with it), not a filesystem of its own: each superblock costs a
    // mount at start and a teardown at the end of every run.
    let dev = at.join("dev");
    fs::create_dir(&dev).map_err(io("creating /dev".into()))?;
    for d in DEVICES {
        fs::write(dev.join(d), b"").map_err(io(format!("creating /dev/{d}")))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(link)).map_err(io(format!("linking /dev/{link}")))?;
    }
    // Pseudo-terminals come from the sandbox's own devpts instance (mounted on dev/pts);
    // ptmx is its multiplexer, never the host's.
    symlink("pts/ptmx", dev.join("ptmx")).map_err(io("linking /dev/ptmx".into()))?;
    for name in &setup.devices {
        check_device_name(name)?;
        let at = dev.join(name);
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating /dev/{name}")))?;
        }
        fs::write(&at, b"").map_err(io(format!("creating /dev/{name}")))?;
    }
    for d in ["dev/shm", "dev/pts", "proc", "tmp", "work", "home"] {
        fs::create_dir(at.join(d)).map_err(io(format!("creating /{d}")))?;
    }
    // The workspace's second mount point (`bind_home`); a build's root keeps its own /home.
    if !setup.template_writable {
        fs::create_dir(at.join("home/user")).map_err(io("creating /home/user".into()))?;
    }
    Ok(())
}

/// The filesystems of the sandbox root `root` (its tree made by [`make_tree`]); `/tmp`'s
/// and `/dev/shm`'s directories go in `scratch` ([`scratch_dirs`]).
fn mount_pieces(root: &Path, scratch: &Path, setup: &InitSetup) -> Result<(), String> {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for d in DEVICES {
        mount(
            Some(&Path::new("/dev").join(d)),
            &root.join("dev").join(d),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding /dev/{d}: {e}"))?;
    }
    // The devices the operator allowed by name: the host's nodes themselves (their
    // mount keeps the host's /dev's flags; the sandbox's ids open them as the node's mode
    // says).
    for name in &setup.devices {
        check_device_name(name)?;
        mount(
            Some(&Path::new("/dev").join(name)),
            &root.join("dev").join(name),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding /dev/{name}: {e}"))?;
    }
    // A private devpts instance (always new inside the sandbox's user namespace; said
    // anyway): only the sandbox's own terminals are in it, and anyone may open its ptmx.
    mount(
        Some("devpts"),
        &root.join("dev/pts"),
        Some("devpts"),
        // Not nodev: its nodes are the terminals.
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| format!("mounting devpts on /dev/pts: {e}"))?;
    scratch_dirs(scratch, root)?;
    // /proc of the sandbox's PID namespace; no /sys at all.
    mount(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("mounting /proc: {e}"))?;
    let uid = setup.sandbox_uid;
    tmpfs(
        &root.join("work"),
        &format!("size={},mode=0755,uid={uid},gid={uid}", setup.disk_bytes),
        nosuid_nodev,
    )?;
    Ok(())
}

/// The rest of the root, once the host's join has come: the egress proxy's files and
/// socket, then the root turns read-only and becomes `/`.
pub(crate) fn finish_root(
    join: &InitJoin,
    setup: &InitSetup,
    volumes: Vec<OwnedFd>,
) -> Result<(), String> {
    let template = setup.template_root.is_some();
    // Files go to the generated layer; with a template, mounts go to the overlay made next.
    let gen_at = Path::new(if template {
        TEMPLATE_GEN
    } else {
        ROOT_BUILT_AT
    });
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    write_extras(gen_at, join)?;
    // A build's root gets none: it would be left in the template.
    if setup.own_boot_id && !setup.template_writable {
        write_boot_id(gen_at)?;
    }
    let sock_inside = cordon_guest::proto::EGRESS_SOCKET_INSIDE.trim_start_matches('/');
    let new = gen_at;
    let new = if setup.template_writable {
        // A build's root: its own writable tree, Cordon's files bound over it.
        let root = Path::new(TEMPLATE_ROOT);
        make_bind_points(root, &join.volumes)?;
        cover_build_root(Path::new(TEMPLATE_GEN), root)?;
        mount_pieces(root, Path::new(TEMPLATE_SCRATCH), setup)?;
        root
    } else if template {
        // The root: Cordon's generated layer over the template's, read-only (an overlay
        // of lower layers only has no upper to write to). Writes go to /work and /tmp.
        make_bind_points(gen_at, &join.volumes)?;
        let root = Path::new(TEMPLATE_ROOT);
        mount(
            Some("overlay"),
            root,
            Some("overlay"),
            MsFlags::MS_RDONLY | nosuid_nodev,
            Some(format!("lowerdir={TEMPLATE_GEN}:{TEMPLATE_LOWER}").as_str()),
        )
        .map_err(|e| format!("mounting the template's root (overlayfs): {e}"))?;
        mount_pieces(root, Path::new(TEMPLATE_SCRATCH), setup)?;
        root
    } else {
        make_bind_points(new, &join.volumes)?;
        new
    };
    if let Some(sock) = &join.egress_socket {
        let inside = new.join(sock_inside);
        mount(
            Some(sock.as_path()),
            &inside,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("binding the egress socket: {e}"))?;
    }
    mount_volumes(new, setup.sandbox_uid, &join.volumes, volumes)?;
    if !setup.template_writable {
        crate::volumes::bind_home(new)?;
    }
    // The stage holds /tmp and /dev/shm too: its size becomes their budget.
    size_stage(setup.tmp_bytes)?;
    // The root itself becomes read-only (its mount: /tmp and /dev/shm, directories of the
    // same tmpfs, stay writable), then we pivot into it and drop the host's tree.
    if !template {
        mount(
            None::<&str>,
            new,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid_nodev,
            None::<&str>,
        )
        .map_err(|e| format!("making the root read-only: {e}"))?;
    }
    nix::unistd::chdir(new).map_err(|e| format!("entering the new root: {e}"))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detaching the host's root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Writes the join's extra files and copies under the new root's /etc (a file copied for
/// several paths is copied once and hard-linked), and the egress socket's mount point.
fn write_extras(gen_at: &Path, join: &InitJoin) -> Result<(), String> {
    let io = |what: String| move |e: io::Error| format!("{what}: {e}");
    let new = gen_at;
    // Where an extra file goes in the new root, its directories made.
    let place = |path: &str| -> Result<PathBuf, String> {
        let rel = path.trim_start_matches('/');
        if rel.split('/').any(|c| c == ".." || c.is_empty()) || !rel.starts_with("etc/") {
            return Err(format!(
                "extra file {path:?} must be a plain path under /etc"
            ));
        }
        let dst = new.join(rel);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        Ok(dst)
    };
    for (path, body) in &join.extra_files {
        fs::write(place(path)?, body).map_err(io(format!("writing {path}")))?;
    }
    let mut copied: Vec<(&Path, PathBuf)> = Vec::new();
    for (from, path) in &join.extra_copies {
        let dst = place(path)?;
        if let Some((_, first)) = copied.iter().find(|(f, _)| *f == from.as_path()) {
            fs::hard_link(first, &dst).map_err(io(format!("linking {path}")))?;
            continue;
        }
        // The copy is the kernel's (copy_file_range); the source's mode is not the sandbox's.
        fs::copy(from, &dst)
            .and_then(|_| fs::set_permissions(&dst, fs::Permissions::from_mode(0o644)))
            .map_err(io(format!("copying {} to {path}", from.display())))?;
        copied.push((from.as_path(), dst));
    }
    let sock_inside = cordon_guest::proto::EGRESS_SOCKET_INSIDE.trim_start_matches('/');
    if join.egress_socket.is_some() {
        let inside = gen_at.join(sock_inside);
        if let Some(parent) = inside.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        fs::write(&inside, b"").map_err(io("creating the egress socket mount point".into()))?;
    }
    Ok(())
}

/// The sandbox's own boot id ([`cordon_guest::proto::BOOT_ID_INSIDE`]), a random UUID
/// each exec's `/proc` shows instead of the host's: a sandbox cannot tell which host (or
/// which boot of it) it shares with another, and a sandbox started again from its files
/// has a new one, as a machine booted again does.
fn write_boot_id(gen_at: &Path) -> Result<(), String> {
    let rel = cordon_guest::proto::BOOT_ID_INSIDE.trim_start_matches('/');
    let at = gen_at.join(rel);
    if let Some(parent) = at.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("creating /{rel}'s directory: {e}"))?;
    }
    let id = cordon_core::SandboxId::random().map_err(|e| e.to_string())?;
    fs::write(
        &at,
        format!("{}\n", uuid_v4(id.as_str().trim_start_matches("sb-"))),
    )
    .and_then(|()| fs::set_permissions(&at, fs::Permissions::from_mode(0o444)))
    .map_err(|e| format!("writing the sandbox's boot id: {e}"))
}

/// A version-4 UUID of 32 random hex digits, as the kernel's `boot_id` is written.
fn uuid_v4(hex: &str) -> String {
    let h = hex.as_bytes();
    let variant = b"89ab"[usize::from(h[16] & 3)] as char;
    format!(
        "{}-{}-4{}-{variant}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}
