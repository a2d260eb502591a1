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
