//! The template store with real files: imports of image files the tests write (hostile
//! entries included), digests, limits, removal and collection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_core::Language;
use cordon_template::{DropReason, ImageFormat, ImportLimits, Store, TemplateError};
use cordon_testkit::image::{Image, LayerBuilder, busybox_layer, hostile_image};

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, data).unwrap();
    p
}

fn store() -> (tempfile::TempDir, Store) {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path()).unwrap();
    (t, s)
}

fn root_of(s: &Store, name: &str) -> PathBuf {
    s.resolve(name).unwrap().root
}

#[test]
fn an_oci_import_neutralises_every_hostile_entry() {
    let (t, s) = store();
    let file = write(
        t.path(),
        "image.oci.tar",
        &hostile_image(None).oci_tar(false),
    );
    let report = s
        .import(&file, "hostile", &ImportLimits::default())
        .unwrap();
    let m = &report.manifest;
    assert_eq!(m.name, "hostile");
    assert!(
        m.digest.starts_with("sha256:") && m.digest.len() == 71,
        "{}",
        m.digest
    );
    assert_eq!(m.layers.len(), 2);
    assert_eq!(
        m.built_from,
        cordon_template::BuiltFrom::Import {
            format: ImageFormat::OciLayout,
            file: "image.oci.tar".into()
        }
    );
    assert_eq!(m.image.env["GREETING"], "from-the-image");
    assert_eq!(m.image.working_dir.as_deref(), Some("/work"));
    assert_eq!(m.image.cmd, vec!["sh".to_string()]);
    let dropped = |path: &str| {
        report
            .dropped
            .iter()
            .find(|d| d.path == path)
            .map(|d| d.reason.clone())
    };
    assert_eq!(dropped("dev/evil-mem"), Some(DropReason::DeviceNode));
    assert_eq!(dropped("pipe"), Some(DropReason::Fifo));
    assert_eq!(dropped("../outside.txt"), Some(DropReason::EscapesRoot));
    assert_eq!(
        dropped("escape/cordon-pwned"),
        Some(DropReason::ThroughSymlink)
    );
    assert_eq!(dropped("passwd-link"), Some(DropReason::HardlinkOutside));
    assert_eq!(report.setid_cleared, 2);

    let root = root_of(&s, "hostile");
    // Nothing reached the host: not through the link, not beside the store.
    assert!(!Path::new("/etc/cordon-pwned").exists());
    assert!(!root.parent().unwrap().join("outside.txt").exists());
    assert!(!t.path().join("outside.txt").exists());
    // The hostile entries are not in the root.
    assert!(!root.join("dev/evil-mem").exists());
    assert!(fs::symlink_metadata(root.join("pipe")).is_err());
    assert!(fs::symlink_metadata(root.join("passwd-link")).is_err());
    // The link out of the root is kept as a link (it resolves in the sandbox's own root).
    let link = fs::read_link(root.join("escape")).unwrap();
    assert_eq!(link, Path::new("../../../../../../../etc"));
    // Set-id bits and write bits for others are gone.
    for f in ["suid", "sgid"] {
        let mode = fs::metadata(root.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "{f}: {mode:o}");
    }
    let ww = fs::metadata(root.join("world-writable")).unwrap().mode();
    assert_eq!(ww & 0o777, 0o644);
    // Whiteouts: a file hidden, a directory made opaque.
    assert!(!root.join("gone.txt").exists());
    assert!(!root.join("opq/old.txt").exists());
    assert_eq!(fs::read(root.join("opq/new.txt")).unwrap(), b"upper\n");
    assert!(!root.join("opq/.wh..wh..opq").exists());
    // The hard link inside the root is a hard link.
    let a = fs::metadata(root.join("etc/os-release")).unwrap();
    let b = fs::metadata(root.join("os-release-link")).unwrap();
    assert_eq!((a.ino(), a.dev()), (b.ino(), b.dev()));
    assert_eq!(
        fs::read(root.join("greeting.txt")).unwrap(),
        b"hello from layer 1\n"
    );
    // Owned by root, whatever the image said.
    assert_eq!(fs::metadata(root.join("greeting.txt")).unwrap().uid(), 0);
    assert_eq!(m.files, report.manifest.files);
    assert!(m.size_bytes > 0 && m.files >= 8, "{m:?}");
}

#[test]
fn a_docker_archive_imports_to_the_same_digest_and_shares_its_root() {
    let (t, s) = store();
    let image = hostile_image(None);
    let oci = write(t.path(), "a.oci.tar", &image.oci_tar(false));
    let docker = write(t.path(), "a.docker.tar", &image.docker_tar());
    let a = s
        .import(&oci, "from-oci", &ImportLimits::default())
        .unwrap();
    let b = s
        .import(&docker, "from-docker", &ImportLimits::default())
        .unwrap();
    assert_eq!(a.manifest.digest, b.manifest.digest);
    assert!(!a.reused_root);
    assert!(b.reused_root);
    assert!(matches!(
        b.manifest.built_from,
        cordon_template::BuiltFrom::Import {
            format: ImageFormat::DockerArchive,
            ..
        }
    ));
    assert_eq!(root_of(&s, "from-oci"), root_of(&s, "from-docker"));
    let names: Vec<String> = s.list().unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["from-docker", "from-oci"]);
    // Templates are immutable: the same name again is refused.
    let again = s.import(&oci, "from-oci", &ImportLimits::default());
    assert!(matches!(again, Err(TemplateError::Exists(_))), "{again:?}");
}

#[test]
fn a_tampered_blob_is_refused_and_leaves_nothing_behind() {
    let (t, s) = store();
    let file = write(t.path(), "bad.tar", &hostile_image(None).oci_tar(true));
    let err = s
        .import(&file, "bad", &ImportLimits::default())
        .unwrap_err();
    assert!(matches!(err, TemplateError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("export the image again"), "{err}");
    assert!(matches!(s.get("bad"), Err(TemplateError::NotFound(_))));
    assert_eq!(fs::read_dir(s.dir().join("staging")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(s.dir().join("roots")).unwrap().count(), 0);
}

#[test]
fn a_layer_whose_content_does_not_match_its_diff_id_is_refused() {
    let (t, s) = store();
    let mut image = hostile_image(None);
    // A docker archive names layers by path only: the config's diff ids are the check.
    let config = image.config();
    image.layers[1].0 = LayerBuilder::new().file("other", 0o644, b"x").finish();
    let mixed = image.docker_tar_with_config(config);
    let file = write(t.path(), "mixed.tar", &mixed);
    let err = s
        .import(&file, "mixed", &ImportLimits::default())
        .unwrap_err();
    assert!(matches!(err, TemplateError::DigestMismatch { .. }), "{err}");
}

#[test]
fn limits_refuse_an_image_too_large_or_with_too_many_files() {
    let (t, s) = store();
    let file = write(t.path(), "i.tar", &hostile_image(None).oci_tar(false));
    let few = ImportLimits {
        files: 5,
        ..ImportLimits::default()
    };
    let err = s.import(&file, "few", &few).unwrap_err();
    assert!(
        matches!(
            err,
            TemplateError::Limit {
                what: "entries",
                ..
            }
        ),
        "{err}"
    );
    let small = ImportLimits {
        unpacked_bytes: 64,
        ..ImportLimits::default()
    };
    let err = s.import(&file, "small", &small).unwrap_err();
    assert!(matches!(err, TemplateError::Limit { .. }), "{err}");
    let tiny = ImportLimits {
        archive_bytes: 100,
        ..ImportLimits::default()
    };
    let err = s.import(&file, "tiny", &tiny).unwrap_err();
    assert!(matches!(err, TemplateError::Limit { .. }), "{err}");
    assert!(s.list().unwrap().is_empty());
}

#[test]
fn not_an_image_is_refused_with_what_to_give() {
    let (t, s) = store();
    let file = write(t.path(), "x.tar", b"this is not a tar at all");
    let err = s.import(&file, "x", &ImportLimits::default()).unwrap_err();
    assert!(err.to_string().contains("OCI image layout"), "{err}");
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("hello.txt").unwrap();
    h.set_size(2);
    h.set_cksum();
    b.append(&h, &b"hi"[..]).unwrap();
    let file = write(t.path(), "y.tar", &b.into_inner().unwrap());
    let err = s.import(&file, "y", &ImportLimits::default()).unwrap_err();
    assert!(matches!(err, TemplateError::UnknownFormat(_)), "{err}");
    // A message a tenant may see never says where the store lives.
    let err = s.resolve("nope").unwrap_err().to_string();
    assert!(!err.contains(&t.path().display().to_string()), "{err}");
    assert!(err.contains("cordon template ls"), "{err}");
}

#[test]
fn rm_and_gc_free_what_no_template_or_live_sandbox_uses() {
    let (t, s) = store();
    let a = hostile_image(None);
    let mut b = hostile_image(None);
    // b shares a's bottom layer and has a top layer of its own.
    b.layers[1].0 = LayerBuilder::new().file("b.txt", 0o644, b"b").finish();
    let fa = write(t.path(), "a.tar", &a.oci_tar(false));
    let fb = write(t.path(), "b.tar", &b.oci_tar(false));
    s.import(&fa, "a", &ImportLimits::default()).unwrap();
    s.import(&fb, "b", &ImportLimits::default()).unwrap();
    let count = |d: &str| fs::read_dir(s.dir().join(d)).unwrap().count();
    assert_eq!(count("layers"), 3, "the shared layer is stored once");
    assert_eq!(count("roots"), 2);
    // A live sandbox of "a" holds its root.
    let held = s.resolve("a").unwrap();
    let gc = s.remove("a").unwrap();
    assert_eq!(gc.layers_removed, 1);
    assert_eq!(gc.roots_removed, 0);
    assert_eq!(gc.roots_in_use, 1);
    assert!(held.root.join("greeting.txt").exists());
    assert!(matches!(s.resolve("a"), Err(TemplateError::NotFound(_))));
    drop(held);
    let gc = s.gc().unwrap();
    assert_eq!((gc.roots_removed, gc.roots_in_use), (1, 0));
    assert_eq!(count("roots"), 1);
    s.remove("b").unwrap();
    assert_eq!(count("layers"), 0);
    assert_eq!(count("roots"), 0);
    assert!(matches!(s.remove("b"), Err(TemplateError::NotFound(_))));
}

#[test]
fn resolve_finds_the_interpreters_on_the_images_path() {
    let Some(bb) = busybox_layer() else {
        assert!(
            std::env::var_os("CORDON_REQUIRE_ALL").is_none(),
            "CORDON_REQUIRE_ALL is set and /bin/busybox is missing (apt-get install busybox-static)"
        );
        eprintln!("SKIPPING: no /bin/busybox (apt-get install busybox-static)");
        return;
    };
    let (t, s) = store();
    let image = Image {
        layers: vec![(bb, true)],
        env: vec!["PATH=/bin".into()],
    };
    let f = write(t.path(), "bb.tar", &image.oci_tar(false));
    s.import(&f, "bb", &ImportLimits::default()).unwrap();
    let r = s.resolve("bb").unwrap();
    assert!(r.languages.contains(&Language::Sh));
    assert!(!r.languages.contains(&Language::Python));
    let err = r.check_language(Language::Python).unwrap_err().to_string();
    assert!(
        err.contains("no python interpreter") && err.contains("--template bb"),
        "{err}"
    );
    assert!(!err.contains(&t.path().display().to_string()), "{err}");
    r.check_language(Language::Sh).unwrap();
}

/// An image of one layer per builder, uncompressed unless `gz`.
fn image_of(layers: Vec<(Vec<u8>, bool)>) -> Image {
    Image {
        layers,
        env: vec!["PATH=/bin".into()],
    }
}

/// Bytes that do not compress and are not zeros; each seed gives its own (the state is odd,
/// never 0: `seed | 1` made seeds 10 and 11 the same bytes).
fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut x = (u32::from(seed) << 1) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as u8 | 1
        })
        .collect()
}

/// Issue 35 item 6: whiteouts and opaque markers written `./dir/.wh.x` or `/.wh.x` (as tar
/// writes paths of `tar -C dir .`) hide what lower layers made, as `dir/.wh.x` does.
#[test]
fn whiteouts_with_dot_and_slash_paths_hide_what_lower_layers_made() {
    let (t, s) = store();
    let lower = LayerBuilder::new()
        .dir("dir", 0o755)
        .file("dir/a", 0o644, b"a")
        .file("dir/kept", 0o644, b"k")
        .file("gone", 0o644, b"g")
        .dir("opq", 0o755)
        .file("opq/old", 0o644, b"o")
        .finish();
    let upper = LayerBuilder::new()
        .file("./dir/.wh.a", 0o644, b"")
        .file("/.wh.gone", 0o644, b"")
        .file("./opq/.wh..wh..opq", 0o644, b"")
        .file("./opq/new", 0o644, b"n")
        .finish();
    let file = write(
        t.path(),
        "wh.tar",
        &image_of(vec![(lower, false), (upper, true)]).oci_tar(false),
    );
    s.import(&file, "wh", &ImportLimits::default()).unwrap();
    let root = root_of(&s, "wh");
    assert!(
        fs::symlink_metadata(root.join("dir/a")).is_err(),
        "dir/a stayed"
    );
    assert!(
        fs::symlink_metadata(root.join("gone")).is_err(),
        "gone stayed"
    );
    assert!(
        fs::symlink_metadata(root.join("opq/old")).is_err(),
        "opq/old stayed"
    );
    assert_eq!(fs::read(root.join("dir/kept")).unwrap(), b"k");
    assert_eq!(fs::read(root.join("opq/new")).unwrap(), b"n");
    assert!(fs::symlink_metadata(root.join("opq/.wh..wh..opq")).is_err());
}

/// Issue 35 item 12: a gzip layer is bounded while it inflates, in the whiteout pass too.
/// The layer holds a 4 MiB file and then bytes that are no tar header: read to its end
/// before any limit applies, the import fails as an unreadable tar; bounded as it streams,
/// it stops at the 1 MiB limit and says so.
#[test]
fn a_layer_is_bounded_while_it_inflates_not_after() {
    let (t, s) = store();
    let mut layer = LayerBuilder::new()
        .file("big", 0o644, &vec![0u8; 4 << 20])
        .finish();
    // Past the entry: a header block of garbage where the end of the archive would be.
    layer.truncate(512 + (4 << 20));
    layer.extend_from_slice(&[0xa5; 1024]);
    let file = write(
        t.path(),
        "bomb.tar",
        &image_of(vec![(layer, true)]).oci_tar(false),
    );
    let limits = ImportLimits {
        unpacked_bytes: 1 << 20,
        ..ImportLimits::default()
    };
    let err = s.import(&file, "bomb", &limits).unwrap_err();
    assert!(
        matches!(
            err,
            TemplateError::Limit {
                flag: "unpacked-bytes",
                ..
            }
        ),
        "{err}"
    );
    assert!(s.list().unwrap().is_empty());
    assert_eq!(fs::read_dir(s.dir().join("staging")).unwrap().count(), 0);
}

/// Issue 35 item 11: a digest prefix two templates' digests start with names neither: it
/// is refused, listing both with enough digits to tell them apart; a longer prefix or the
/// whole digest picks one.
#[test]
fn a_digest_prefix_two_templates_share_is_refused_with_both_listed() {
    let (t, s) = store();
    let file = write(
        t.path(),
        "a.tar",
        &image_of(vec![(
            LayerBuilder::new().file("a", 0o644, b"a").finish(),
            false,
        )])
        .oci_tar(false),
    );
    s.import(&file, "a", &ImportLimits::default()).unwrap();
    let a = s.get("a").unwrap();
    let hex_a = a.digest_hex().to_string();
    // A second template whose digest shares a's first 12 digits and differs at the 13th.
    let mut hex_b = hex_a.clone().into_bytes();
    hex_b[12] = if hex_b[12] == b'0' { b'1' } else { b'0' };
    let hex_b = String::from_utf8(hex_b).unwrap();
    let mut b: serde_json::Value =
        serde_json::from_slice(&fs::read(s.dir().join("names/a.json")).unwrap()).unwrap();
    b["name"] = "b".into();
    b["digest"] = format!("sha256:{hex_b}").into();
    fs::write(
        s.dir().join("names/b.json"),
        serde_json::to_vec(&b).unwrap(),
    )
    .unwrap();
    fs::create_dir(s.dir().join("roots").join(&hex_b)).unwrap();

    let err = s.resolve_base(&hex_a[..12]).unwrap_err();
    assert!(matches!(err, TemplateError::Ambiguous { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("sha256:{} (a)", &hex_a[..13]))
            && msg.contains(&format!("sha256:{} (b)", &hex_b[..13])),
        "{msg}"
    );
    assert!(msg.contains("give more of the digest"), "{msg}");
    assert!(!msg.contains(&t.path().display().to_string()), "{msg}");
    assert_eq!(s.resolve_base(&hex_a[..13]).unwrap().name, "a");
    assert_eq!(
        s.resolve_base(&format!("sha256:{hex_b}")).unwrap().name,
        "b"
    );
    // Too short a prefix names nothing.
    assert!(matches!(
        s.resolve_base(&hex_a[..8]),
        Err(TemplateError::NotFound(_))
    ));
}

/// Issue 35 item 8: a tree whose longest path fits under PATH_MAX in the staging dir but
/// not under `roots/<digest>` (41 bytes longer) is measured before it is moved: the import
/// ends with a named template, never with a root no manifest names.
#[test]
fn a_tree_too_deep_for_the_roots_path_never_leaves_an_unnamed_root() {
    let (t, s) = store();
    // <store>/staging/<16 hex>/root/<path>: keep the whole at 4090 bytes.
    let staged = s.dir().join("staging").display().to_string().len() + 1 + 16 + "/root/".len();
    let len = 4090 - staged;
    let mut path = String::new();
    while path.len() + 201 < len {
        path.push_str(&"d".repeat(200));
        path.push('/');
    }
    path.push_str(&"f".repeat(len - path.len()));
    assert_eq!(path.len(), len);
    let layer = LayerBuilder::new()
        .long_file(&path, 0o644, b"deep")
        .finish();
    let file = write(
        t.path(),
        "deep.tar",
        &image_of(vec![(layer, false)]).oci_tar(false),
    );
    let done = s.import(&file, "deep", &ImportLimits::default());
    let roots = fs::read_dir(s.dir().join("roots")).unwrap().count();
    match done {
        Ok(report) => {
            assert_eq!(roots, 1);
            assert_eq!(s.list().unwrap().len(), 1);
            assert!(report.manifest.files > 20, "{:?}", report.manifest);
        }
        Err(e) => panic!("the import failed ({e}) with {roots} roots left in the store"),
    }
    assert_eq!(fs::read_dir(s.dir().join("staging")).unwrap().count(), 0);
}

/// Issue 35 item 3, side by side: two imports that each fit the store's budget alone but
/// not together, started at once. Each used to take its share from the store as it stood
/// when it began, so both went in and the store ended past its budget; now at most one
/// does, the other ends as DiskLimit and leaves nothing, and the store stays within it.
/// The two images differ: the same image twice shares its root and blob, so its second name
/// rightly costs nothing, and one import ending before the other flattens (a loaded host)
/// let both go in when the noise of both layers was the same.
#[test]
fn imports_side_by_side_share_the_store_budget() {
    let (t, s) = store();
    let files: Vec<_> = (0..2u8)
        .map(|i| {
            let layer = LayerBuilder::new()
                .file("data", 0o644, &noise(24 << 20, 10 + i))
                .finish();
            write(
                t.path(),
                &format!("{i}.tar"),
                &image_of(vec![(layer, false)]).oci_tar(false),
            )
        })
        .collect();
    // Each import keeps its 24 MiB layer blob and writes a 24 MiB root: 48 MiB alone,
    // 96 MiB together, under a budget of 72 MiB.
    let limits = ImportLimits {
        store_bytes: 72 << 20,
        ..ImportLimits::default()
    };
    let start = std::sync::Barrier::new(2);
    let results: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (s, limits, start) = (&s, &limits, &start);
                scope.spawn(move || {
                    start.wait();
                    s.import(f, &format!("t{i}"), limits)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(ok <= 1, "both imports went in");
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, TemplateError::DiskLimit { .. }), "{e}");
            assert!(e.to_string().contains("template store's budget"), "{e}");
        }
    }
    let used = s.usage().unwrap();
    assert!(used <= limits.store_bytes, "the store holds {used} bytes");
    assert_eq!(fs::read_dir(s.dir().join("staging")).unwrap().count(), 0);
    // Alone, each fits: the one refused goes in once the other is removed.
    let mut first = None;
    if let Some(i) = results.iter().position(|r| r.is_ok()) {
        first = Some(s.get(&format!("t{i}")).unwrap().digest);
        s.remove(&format!("t{i}")).unwrap();
        s.gc().unwrap();
    }
    let j = results.iter().position(|r| r.is_err()).unwrap_or(0);
    let second = s.import(&files[j], &format!("t{j}"), &limits).unwrap();
    assert!(!second.reused_root);
    assert_ne!(
        first,
        Some(second.manifest.digest),
        "the two images are one"
    );
}

/// Issue 35 item 3, the import side: an import whose root would take the store past its
/// budget ends as DiskLimit, naming the budget and the fix, and leaves nothing (no name,
/// root, layer or staging dir); a file of zeros is stored as a hole and costs nothing.
#[test]
fn an_import_past_the_store_budget_ends_as_disk_limit_and_leaves_nothing() {
    let (t, s) = store();
    let first = LayerBuilder::new()
        .file("a", 0o644, &noise(1 << 20, 1))
        .finish();
    let fa = write(
        t.path(),
        "a.tar",
        &image_of(vec![(first, true)]).oci_tar(false),
    );
    s.import(&fa, "a", &ImportLimits::default()).unwrap();
    let used = s.usage().unwrap();
    assert!(used >= 3 << 19, "a's root and its layer: {used}");
    let count = |d: &str| fs::read_dir(s.dir().join(d)).unwrap().count();
    let (roots, layers) = (count("roots"), count("layers"));

    // 64 MiB of zeros and 3 MiB of data, under a budget of what is used + 3.5 MiB of
    // which the layer blob (compressed) takes some: over it.
    let second = LayerBuilder::new()
        .file("zeros", 0o644, &vec![0u8; 64 << 20])
        .file("data", 0o644, &noise(3 << 20, 2))
        .finish();
    let fb = write(
        t.path(),
        "b.tar",
        &image_of(vec![(second.clone(), true)]).oci_tar(false),
    );
    let budget = ImportLimits {
        store_bytes: used + (3 << 20) + (1 << 19),
        ..ImportLimits::default()
    };
    let err = s.import(&fb, "b", &budget).unwrap_err();
    assert!(matches!(err, TemplateError::DiskLimit { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("template store's budget") && msg.contains("--max-store-bytes"),
        "{msg}"
    );
    assert!(!msg.contains(&t.path().display().to_string()), "{msg}");
    assert!(matches!(s.get("b"), Err(TemplateError::NotFound(_))));
    assert_eq!((count("roots"), count("layers")), (roots, layers));
    assert_eq!(count("staging"), 0);

    // With room for the data (and not for the zeros, were they written): stored, and the
    // 64 MiB of zeros is a hole.
    let room = ImportLimits {
        store_bytes: used + (12 << 20),
        ..ImportLimits::default()
    };
    let report = s.import(&fb, "b", &room).unwrap();
    let zeros = fs::metadata(root_of(&s, "b").join("zeros")).unwrap();
    assert_eq!(zeros.len(), 64 << 20);
    assert!(zeros.blocks() * 512 < 1 << 20, "{} blocks", zeros.blocks());
    assert!(
        report.manifest.stored_bytes < 5 << 20,
        "{}",
        report.manifest.stored_bytes
    );
    assert_eq!(report.manifest.size_bytes, (64 << 20) + (3 << 20));
}
