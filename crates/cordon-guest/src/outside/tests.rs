//! Attacks on the file calls outside the workspace (ADR 0031), each on a root made in a
//! temporary directory standing for the sandbox's `/`. A path resolved by the kernel from
//! that root (the naive way: `root.join(path)`) follows each of these out of it.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use cordon_core::{FileOp, FileReply};

use super::*;

/// A sandbox root with a world-writable sticky `/tmp` and a read-only `/etc/motd`.
fn sandbox_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(root.path().join("tmp")).unwrap();
    std::fs::set_permissions(
        root.path().join("tmp"),
        std::fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    std::fs::create_dir(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/motd"), b"image").unwrap();
    root
}

/// The calls as this process's own user, in this process (no fork).
fn here(root: &Path) -> Workspace {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    Workspace::open_outside(root, uid, gid).unwrap()
}

fn refused<T: std::fmt::Debug>(r: Result<T, FileError>) -> String {
    match r {
        Err((ErrorCode::PathRefused, m)) => m,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn tmp_and_the_image_are_reached_by_absolute_paths() {
    let root = sandbox_root();
    let ws = here(root.path());
    ws.put("/tmp/test-git/repo/README.md", 0o644, b"hello\n")
        .unwrap();
    assert_eq!(
        std::fs::read(root.path().join("tmp/test-git/repo/README.md")).unwrap(),
        b"hello\n"
    );
    assert_eq!(
        ws.get("/tmp/test-git/repo/README.md", 100).unwrap(),
        (b"hello\n".to_vec(), false)
    );
    assert_eq!(ws.get("/etc/motd", 100).unwrap().0, b"image");
    let FileReply::Entries { entries, .. } = ws.list("/tmp").unwrap() else {
        panic!("not a listing")
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "test-git");
    assert_eq!(ws.stat("/").unwrap().name, "/");
    ws.op(&FileOp::Rename {
        from: "/tmp/test-git/repo/README.md".into(),
        to: "/tmp/moved".into(),
    })
    .unwrap();
    ws.remove("/tmp/test-git", true).unwrap();
    assert!(!root.path().join("tmp/test-git").exists());
    assert!(root.path().join("tmp/moved").exists());
}

#[test]
fn a_symlink_in_tmp_to_proc_1_root_or_the_host_is_refused() {
    let root = sandbox_root();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret"), b"host's").unwrap();
    symlink("/proc/1/root", root.path().join("tmp/init")).unwrap();
    symlink(host.path(), root.path().join("tmp/host")).unwrap();
    symlink(host.path().join("secret"), root.path().join("tmp/secret")).unwrap();
    let ws = here(root.path());
    refused(ws.get("/tmp/init/etc/hostname", 100));
    refused(ws.put("/tmp/init/tmp/planted", 0o644, b"x"));
    refused(ws.get("/tmp/host/secret", 100));
    refused(ws.get("/tmp/secret", 100));
    refused(ws.put("/tmp/host/planted", 0o644, b"x"));
    // Writing over the link replaces nothing through it.
    refused(ws.put("/tmp/secret", 0o644, b"x"));
    refused(ws.list("/tmp/host/"));
    refused(ws.mkdir("/tmp/host/made", true));
    assert!(!host.path().join("planted").exists());
    assert!(!host.path().join("made").exists());
    assert_eq!(
        std::fs::read(host.path().join("secret")).unwrap(),
        b"host's"
    );
    // A link is reported as one, and removed itself, never its target.
    assert_eq!(
        ws.stat("/tmp/host").unwrap().kind,
        cordon_core::FileKind::Symlink
    );
    ws.remove("/tmp/host", true).unwrap();
    assert!(host.path().join("secret").exists());
}

#[test]
fn dot_dot_proc_sys_dev_and_the_agents_own_are_refused() {
    let root = sandbox_root();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret"), b"host's").unwrap();
    // From the root, `..` enough times names the host's directory.
    let up = "/..".repeat(root.path().components().count() + 1);
    let climb = format!("/tmp{up}{}/secret", host.path().display());
    let ws = here(root.path());
    refused(ws.get(&climb, 100));
    refused(ws.put("/tmp/../etc/motd", 0o644, b"x"));
    for path in [
        "/proc/self/environ",
        "/proc/1/root/etc/hostname",
        "/proc",
        "/sys/kernel/notes",
        "/dev/mem",
        "/run/cordon/egress.sock",
        "/.cordon/agent",
        "/",
    ] {
        refused(ws.get(path, 100));
    }
    refused(ws.list("/proc/self/fd"));
    refused(ws.list("/dev"));
    assert_eq!(
        std::fs::read(root.path().join("etc/motd")).unwrap(),
        b"image"
    );
}

#[test]
fn a_kernel_filesystem_is_refused_under_any_name() {
    for dir in ["/proc", "/sys"] {
        let fd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty());
        assert!(crate::files::kernel_fs(&fd.unwrap()).unwrap(), "{dir}");
    }
    let root = sandbox_root();
    let fd = nix::fcntl::open(root.path(), OFlag::O_PATH, Mode::empty()).unwrap();
    assert!(!crate::files::kernel_fs(&fd).unwrap());
    // A kernel filesystem reached by a name the lexical check passes: walked from /sys as
    // if it were a root, the first step lands on sysfs and stops there.
    let ws = here(Path::new("/sys"));
    let m = refused(ws.get("/kernel/notes", 100));
    assert!(m.contains("another filesystem"), "{m}");
    refused(ws.list("/kernel"));
}

/// Forked (in a child process of its own, where it is the only thread): the call takes the
/// sandbox user's ids first, so what that user may not read by
/// an exec (a root-only file) is refused, and what it writes is its own.
#[test]
fn a_forked_call_has_the_sandbox_users_rights_only() {
    if !cordon_testkit::root_or_skip("a_forked_call_has_the_sandbox_users_rights_only") {
        return;
    }
    // Forked as the agent forks: from a process with no other thread (this binary's other
    // tests run on threads of their own, whose locks a fork would copy held).
    let alone = "outside::tests::a_forked_call_has_the_sandbox_users_rights_only";
    if cordon_testkit::in_child_with_env(alone, "CORDON_TEST_ALONE").is_none() {
        return;
    }
    let root = sandbox_root();
    std::fs::write(root.path().join("etc/shadow"), b"root's").unwrap();
    std::fs::set_permissions(
        root.path().join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (uid, gid) = (65534, 65534);
    let prepare = move || -> io::Result<()> {
        let g = nix::unistd::Gid::from_raw(gid);
        nix::unistd::setgroups(&[g])?;
        nix::unistd::setresgid(g, g, g)?;
        let u = nix::unistd::Uid::from_raw(uid);
        nix::unistd::setresuid(u, u, u)?;
        Ok(())
    };
    let outside = Outside {
        root: root.path(),
        uid,
        gid,
        prepare: &prepare,
    };
    let put = outside.call(|ws| ws.put("/tmp/mine", 0o644, b"x").map(|()| ((), Vec::new())));
    assert_eq!(put, Ok(((), Vec::new())));
    let st = nix::sys::stat::stat(&root.path().join("tmp/mine")).unwrap();
    assert_eq!((st.st_uid, st.st_gid), (uid, gid));
    let read = outside.call(|ws| ws.get("/etc/shadow", 100).map(|(d, t)| (t, d)));
    assert_eq!(read.unwrap_err().0, ErrorCode::Io);
    let wrote = outside.call(|ws| ws.put("/etc/motd", 0o644, b"x").map(|()| ((), Vec::new())));
    assert_eq!(wrote.unwrap_err().0, ErrorCode::Io);
    assert_eq!(
        std::fs::read(root.path().join("etc/motd")).unwrap(),
        b"image"
    );
    // Bytes and a listing come back whole through the pipe.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.path().join("tmp/big"), &big).unwrap();
    let (truncated, data) = outside
        .call(|ws| ws.get("/tmp/big", 1 << 20).map(|(d, t)| (t, d)))
        .unwrap();
    assert_eq!((truncated, data.len()), (false, big.len()));
    assert_eq!(data, big);
    // A refusal inside the child comes back as itself.
    let e = outside.call(|ws| ws.get("/proc/self/environ", 10).map(|(d, t)| (t, d)));
    assert_eq!(e.unwrap_err().0, ErrorCode::PathRefused);
}

use nix::sys::stat::Mode;
