//! Snapshots and forks on the wasm tier (issue 46): a wasm sandbox's lasting state is its
//! workspace, so a snapshot of either mode carries what its Python wrote, and each sandbox
//! started from it has its own copy.

use cordon_core::{
    Backend, Error, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, SnapshotDir,
    SnapshotImage, SnapshotMode, Tier,
};

use super::backend;

fn spec(disk: u64) -> SandboxSpec {
    let mut s = SandboxSpec::new(Tier::Wasm);
    s.limits.timeout_ms = 20_000;
    s.limits.memory_bytes = 256 << 20;
    s.limits.disk_bytes = disk;
    s
}

/// Python's stdout (it must succeed).
fn py(sb: &mut dyn Sandbox, src: &str) -> String {
    let o = sb
        .exec(
            &ExecRequest::code(Language::Python, src),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    assert!(
        o.success(),
        "{src}: {} {:?}",
        String::from_utf8_lossy(&o.stderr),
        o.termination
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Python state kept the only way a wasm sandbox keeps any: a pickled dict in `/work`.
const SAVE: &str = "import pickle, os\nos.makedirs('/work/d', exist_ok=True)\n\
    pickle.dump({'x': 41, 'seed': os.urandom(8).hex()}, open('/work/d/state.pkl', 'wb'))\n\
    open('/work/f.txt', 'w').write('before')\nprint('saved')";
const READ: &str = "import pickle\ns = pickle.load(open('/work/d/state.pkl', 'rb'))\n\
    print(s['x'] + 1, s['seed'], open('/work/f.txt').read())";

#[test]
fn three_forks_have_the_files_and_each_its_own() {
    for mode in [SnapshotMode::Full, SnapshotMode::Filesystem] {
        let b = backend();
        let mut src = b.create(&spec(64 << 20)).unwrap();
        assert_eq!(py(src.as_mut(), SAVE), "saved\n");
        let before = py(src.as_mut(), READ);
        let dir = tempfile::tempdir().unwrap();
        let image_dir = SnapshotDir::new(dir.path());
        let image = src.snapshot(mode, &image_dir).unwrap();
        assert_eq!(
            (image.tier, image.mode, image.format),
            (Tier::Wasm, mode, 1)
        );
        assert!(image.bytes > 0, "{image:?}");
        // The source goes on after the snapshot; what it changes is in no fork.
        py(
            src.as_mut(),
            "open('/work/f.txt', 'w').write('source-after')",
        );
        let mut forks: Vec<Box<dyn Sandbox>> = std::thread::scope(|s| {
            let started: Vec<_> = (0..3)
                .map(|_| s.spawn(|| b.start_from_snapshot(&image, &image_dir, &spec(64 << 20))))
                .collect();
            started
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        // The image may go while its forks live: each has its own copy.
        drop(dir);
        let ids: std::collections::HashSet<String> =
            forks.iter().map(|f| f.id().to_string()).collect();
        assert_eq!(ids.len(), 3);
        assert!(!ids.contains(&src.id().to_string()));
        for f in forks.iter_mut() {
            assert_eq!(py(f.as_mut(), READ), before, "{mode}");
        }
        py(
            forks[0].as_mut(),
            "open('/work/f.txt', 'w').write('fork-0')\nopen('/work/only-0', 'w').write('x')",
        );
        let seen: Vec<String> = forks
            .iter_mut()
            .map(|f| py(f.as_mut(), "print(open('/work/f.txt').read())"))
            .collect();
        assert_eq!(seen, ["fork-0\n", "before\n", "before\n"]);
        for f in forks[1..].iter_mut() {
            assert_eq!(
                py(
                    f.as_mut(),
                    "import os\nprint(os.path.exists('/work/only-0'))"
                ),
                "False\n"
            );
        }
        assert_eq!(
            py(src.as_mut(), "print(open('/work/f.txt').read())"),
            "source-after\n"
        );
        for mut f in forks {
            f.destroy().unwrap();
        }
        src.destroy().unwrap();
    }
}

#[test]
fn a_fork_keeps_its_own_disk_limit() {
    let b = backend();
    let mut src = b.create(&spec(64 << 20)).unwrap();
    src.put_file("/work/big", &vec![7u8; 8 << 20], 0o644)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let image_dir = SnapshotDir::new(dir.path());
    let image = src.snapshot(SnapshotMode::Full, &image_dir).unwrap();
    assert!(image.bytes >= 8 << 20, "{image:?}");
    // A fork whose disk limit the files do not fit is refused, and leaves no sandbox.
    let e = b
        .start_from_snapshot(&image, &image_dir, &spec(1 << 20))
        .err()
        .expect("an image larger than the fork's disk limit started a sandbox");
    assert!(
        e.to_string().contains("disk") || e.to_string().contains("limit"),
        "{e}"
    );
    // One that fits has the file, and its own limit: it cannot grow past it.
    let mut f = b
        .start_from_snapshot(&image, &image_dir, &spec(12 << 20))
        .unwrap();
    assert_eq!(f.get_file("/work/big", 16 << 20).unwrap().len(), 8 << 20);
    assert!(
        f.put_file("/work/more", &vec![1u8; 8 << 20], 0o644)
            .is_err()
    );
    f.destroy().unwrap();
    src.destroy().unwrap();
}

#[test]
fn an_image_of_another_tier_or_format_or_gone_is_refused() {
    let b = backend();
    let mut src = b.create(&spec(16 << 20)).unwrap();
    py(src.as_mut(), "open('/work/a', 'w').write('a')");
    let dir = tempfile::tempdir().unwrap();
    let image_dir = SnapshotDir::new(dir.path());
    let image = src.snapshot(SnapshotMode::Filesystem, &image_dir).unwrap();
    let other_tier = SnapshotImage {
        tier: Tier::Container,
        ..image.clone()
    };
    let newer = SnapshotImage {
        format: 2,
        ..image.clone()
    };
    for (bad, says) in [
        (&other_tier, "own tier"),
        (&newer, "take the snapshot again"),
    ] {
        match b.start_from_snapshot(bad, &image_dir, &spec(16 << 20)) {
            Err(e @ Error::Snapshot(_)) => assert!(e.to_string().contains(says), "{e}"),
            other => panic!("{:?}", other.map(|s| s.id().to_string())),
        }
    }
    drop(dir);
    let e = b
        .start_from_snapshot(&image, &image_dir, &spec(16 << 20))
        .err()
        .expect("a deleted image started a sandbox");
    assert!(e.to_string().contains("take it again"), "{e}");
    // A destroyed sandbox has nothing to snapshot.
    src.destroy().unwrap();
    let again = tempfile::tempdir().unwrap();
    assert!(matches!(
        src.snapshot(SnapshotMode::Full, &SnapshotDir::new(again.path())),
        Err(Error::Gone { .. })
    ));
}
