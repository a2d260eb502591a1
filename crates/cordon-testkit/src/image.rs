//! Image files written by tests: OCI image layouts and docker archives made of layers the
//! test builds entry by entry, hostile entries included (tar's own builder refuses to write
//! a `..` path, so those are written into the header by hand).

use std::io::Write;

use sha2::{Digest, Sha256};

/// A layer being built: a tar stream.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

/// Writes `path` into the header's name field as is (even `..` or absolute paths).
fn raw_name(h: &mut tar::Header, path: &str) {
    let name = &mut h.as_old_mut().name;
    name.fill(0);
    let b = path.as_bytes();
    assert!(b.len() < name.len(), "test paths stay short");
    name[..b.len()].copy_from_slice(b);
}

impl LayerBuilder {
    pub fn new() -> Self {
        LayerBuilder {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    fn append(&mut self, mut h: tar::Header, path: &str, data: &[u8]) -> std::io::Result<()> {
        raw_name(&mut h, path);
        h.set_cksum();
        self.tar.append(&h, data)
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        let h = header(tar::EntryType::Directory, mode, 0);
        self.append(h, path, b"").expect("in-memory tar");
        self
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> &mut Self {
        let h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.append(h, path, data).expect("in-memory tar");
        self
    }

    fn link(&mut self, kind: tar::EntryType, path: &str, target: &str) -> &mut Self {
        let mut h = header(kind, 0o777, 0);
        let name = &mut h.as_old_mut().linkname;
        name.fill(0);
        name[..target.len()].copy_from_slice(target.as_bytes());
        self.append(h, path, b"").expect("in-memory tar");
        self
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(tar::EntryType::Symlink, path, target)
    }

    pub fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(tar::EntryType::Link, path, target)
    }

    /// A file at a path of any length (tar's long-name extension; no hostile paths).
    pub fn long_file(&mut self, path: &str, mode: u32, data: &[u8]) -> &mut Self {
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.tar
            .append_data(&mut h, path, data)
            .expect("in-memory tar");
        self
    }

    /// A symbolic link at a path of any length.
    pub fn long_symlink(&mut self, path: &str, target: &str) -> &mut Self {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut h, path, target)
            .expect("in-memory tar");
        self
    }

    /// A device node (character device `major:minor`).
    pub fn char_device(&mut self, path: &str, major: u32, minor: u32) -> &mut Self {
        let mut h = header(tar::EntryType::Char, 0o666, 0);
        h.set_device_major(major).expect("gnu header");
        h.set_device_minor(minor).expect("gnu header");
        self.append(h, path, b"").expect("in-memory tar");
        self
    }

    pub fn fifo(&mut self, path: &str) -> &mut Self {
        let h = header(tar::EntryType::Fifo, 0o644, 0);
        self.append(h, path, b"").expect("in-memory tar");
        self
    }

    /// The layer's uncompressed tar.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.tar, tar::Builder::new(Vec::new()))
            .into_inner()
            .expect("in-memory tar")
    }
}

/// A layer that makes a runnable root from the host's static busybox: `/bin/busybox` and
/// links for the applets a test uses. `None` when the host has no static busybox.
pub fn busybox_layer() -> Option<Vec<u8>> {
    let bb = std::fs::read("/bin/busybox").ok()?;
    let mut l = LayerBuilder::new();
    l.dir("bin", 0o755).file("bin/busybox", 0o755, &bb);
    for applet in [
        "sh", "cat", "echo", "ls", "id", "touch", "env", "stat", "sleep", "rm",
    ] {
        l.symlink(&format!("bin/{applet}"), "busybox");
    }
    Some(l.finish())
}

fn put_file(out: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
    let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
    h.set_path(path).expect("plain path");
    h.set_cksum();
    out.append(&h, data).expect("in-memory tar");
}

/// `sha256:<hex>`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("in-memory gzip");
    e.finish().expect("in-memory gzip")
}

/// An image: layers (uncompressed tars, bottom first; each stored gzip-compressed or not)
/// and the config's environment.
pub struct Image {
    pub layers: Vec<(Vec<u8>, bool)>,
    pub env: Vec<String>,
}

impl Image {
    /// The image config (its diff ids are those of `layers`).
    pub fn config(&self) -> Vec<u8> {
        let diff_ids: Vec<String> = self.layers.iter().map(|(l, _)| sha256(l)).collect();
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": self.env, "WorkingDir": "/work", "Cmd": ["sh"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("json")
    }

    fn blobs(&self) -> Vec<Vec<u8>> {
        self.layers
            .iter()
            .map(|(l, gz)| if *gz { gzip(l) } else { l.clone() })
            .collect()
    }

    /// The image as a tar of an OCI image layout. `tamper` flips a byte of the last layer
    /// blob after its digest was taken.
    pub fn oci_tar(&self, tamper: bool) -> Vec<u8> {
        let config = self.config();
        let blobs = self.blobs();
        let layers: Vec<serde_json::Value> = blobs
            .iter()
            .zip(&self.layers)
            .map(|(b, (_, gz))| {
                let media = if *gz {
                    "application/vnd.oci.image.layer.v1.tar+gzip"
                } else {
                    "application/vnd.oci.image.layer.v1.tar"
                };
                serde_json::json!({"mediaType": media, "digest": sha256(b), "size": b.len()})
            })
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": sha256(&config), "size": config.len()},
            "layers": layers,
        }))
        .expect("json");
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": sha256(&manifest), "size": manifest.len(),
                           "platform": {"architecture": "amd64", "os": "linux"}}],
        }))
        .expect("json");
        let mut out = tar::Builder::new(Vec::new());
        let mut put = |path: &str, data: &[u8]| put_file(&mut out, path, data);
        put("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
        put("index.json", &index);
        let blob_path = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
        put(&blob_path(&sha256(&manifest)), &manifest);
        put(&blob_path(&sha256(&config)), &config);
        let n = blobs.len();
        for (i, b) in blobs.iter().enumerate() {
            let mut data = b.clone();
            if tamper && i + 1 == n {
                let mid = data.len() / 2;
                data[mid] ^= 0xff;
            }
            put(&blob_path(&sha256(b)), &data);
        }
        out.into_inner().expect("in-memory tar")
    }

    /// The image as a docker archive (`docker save`'s classic layout).
    pub fn docker_tar(&self) -> Vec<u8> {
        self.docker_tar_with_config(self.config())
    }

    /// A docker archive of these layers with another image's config (whose diff ids do
    /// not match them).
    pub fn docker_tar_with_config(&self, config: Vec<u8>) -> Vec<u8> {
        let chex = sha256(&config).trim_start_matches("sha256:").to_string();
        let blobs = self.blobs();
        let names: Vec<String> = (0..blobs.len())
            .map(|i| format!("l{i}/layer.tar"))
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!([
            {"Config": format!("{chex}.json"), "RepoTags": ["test:latest"], "Layers": names}
        ]))
        .expect("json");
        let mut out = tar::Builder::new(Vec::new());
        let mut put = |path: &str, data: &[u8]| put_file(&mut out, path, data);
        put("manifest.json", &manifest);
        put(&format!("{chex}.json"), &config);
        for (name, b) in names.iter().zip(&blobs) {
            put(name, b);
        }
        out.into_inner().expect("in-memory tar")
    }
}

/// The hostile two-layer image the template tests import: a runnable busybox root (when
/// the host has one) with a whiteout, an opaque directory, a symlink out of the root and
/// an entry through it, a setuid file, a device node, a FIFO, a `..` path and a hard link
/// out of the root.
pub fn hostile_image(busybox: Option<Vec<u8>>) -> Image {
    let mut l0 = LayerBuilder::new();
    l0.dir("etc", 0o755)
        .file("etc/os-release", 0o644, b"ID=cordon-test\n")
        .file("gone.txt", 0o644, b"hidden by layer 1\n")
        .dir("opq", 0o755)
        .file("opq/old.txt", 0o644, b"lower\n")
        .symlink("escape", "../../../../../../../etc")
        .file("suid", 0o4755, b"#!/bin/sh\necho suid\n")
        .file("sgid", 0o2755, b"#!/bin/sh\necho sgid\n")
        .dir("dev", 0o755)
        .char_device("dev/evil-mem", 1, 1)
        .fifo("pipe")
        .file("../outside.txt", 0o644, b"escaped\n")
        .file("world-writable", 0o666, b"w\n");
    let mut l1 = LayerBuilder::new();
    l1.file(".wh.gone.txt", 0o644, b"")
        .file("opq/.wh..wh..opq", 0o644, b"")
        .file("opq/new.txt", 0o644, b"upper\n")
        .file("escape/cordon-pwned", 0o644, b"pwned\n")
        .hardlink("passwd-link", "../../../../etc/passwd")
        .hardlink("os-release-link", "etc/os-release")
        .file("greeting.txt", 0o644, b"hello from layer 1\n");
    let mut layers = Vec::new();
    if let Some(bb) = busybox {
        layers.push((bb, true));
    }
    layers.push((l0.finish(), true));
    layers.push((l1.finish(), false));
    Image {
        layers,
        env: vec![
            "PATH=/bin:/usr/bin".to_string(),
            "GREETING=from-the-image".to_string(),
        ],
    }
}

/// A layer holding the host's Python 3 (interpreter, standard library without its tests
/// and GUI parts) and bash, the shared libraries they load, at the host's own paths (its
/// merged-/usr links included), and the static busybox's applets for the rest: enough for
/// the escape battery's probes. `None` when the host lacks python3, bash or busybox.
pub fn python_layer() -> Option<Vec<u8>> {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    let python = std::fs::canonicalize("/usr/bin/python3").ok()?;
    let version = python.file_name()?.to_str()?.to_string();
    let stdlib = PathBuf::from("/usr/lib").join(&version);
    if !stdlib.is_dir() || !Path::new("/bin/busybox").is_file() {
        return None;
    }
    const SKIP: [&str; 10] = [
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "dist-packages",
        "unittest",
    ];
    let bash = std::fs::canonicalize("/usr/bin/bash").ok()?;
    let mut files = vec![python.clone(), bash.clone(), PathBuf::from("/bin/busybox")];
    let mut todo = vec![stdlib.clone()];
    let mut objects = vec![python.clone(), bash];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type().ok()?;
            if ft.is_dir() {
                if !(dir == stdlib && SKIP.contains(&name.as_str())) {
                    todo.push(p);
                }
            } else if ft.is_file() {
                if name.ends_with(".so") {
                    objects.push(p.clone());
                }
                files.push(p);
            }
        }
    }
    // The shared libraries the interpreter and its extension modules load.
    let mut libs = BTreeSet::new();
    for o in &objects {
        let out = std::process::Command::new("ldd").arg(o).output().ok()?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                libs.insert(PathBuf::from(p));
            }
        }
    }
    files.extend(libs);
    let mut l = LayerBuilder::new();
    let mut seen = BTreeSet::new();
    for f in &files {
        add_host_path(&mut l, &mut seen, f)?;
    }
    let usr_bin = "usr/bin";
    l.long_symlink(&format!("{usr_bin}/python3"), &version);
    for applet in [
        "sh", "echo", "cat", "ls", "mkfifo", "tail", "cut", "tr", "sleep", "kill", "ps", "id",
        "env", "touch", "rm", "mkdir", "grep", "wc", "head", "true", "false", "stat", "mount",
        "unshare", "su", "test",
    ] {
        l.long_symlink(&format!("{usr_bin}/{applet}"), "busybox");
    }
    Some(l.finish())
}

/// Adds the host file `p` at its own path, every link on the way reproduced as the link it
/// is on the host (so `/lib64/ld-linux-x86-64.so.2` resolves the same way inside).
fn add_host_path(
    l: &mut LayerBuilder,
    seen: &mut std::collections::BTreeSet<std::path::PathBuf>,
    p: &std::path::Path,
) -> Option<()> {
    use std::path::{Component, PathBuf};
    let mut cur = PathBuf::from("/");
    let comps: Vec<Component> = p.components().skip(1).collect();
    for (i, c) in comps.iter().enumerate() {
        cur.push(c);
        let md = std::fs::symlink_metadata(&cur).ok()?;
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&cur).ok()?;
            if seen.insert(cur.clone()) {
                l.long_symlink(cur.strip_prefix("/").ok()?.to_str()?, target.to_str()?);
            }
            let mut next = cur.parent()?.join(&target);
            for rest in &comps[i + 1..] {
                next.push(rest);
            }
            let next = PathBuf::from("/").join(normalize(&next)?);
            return add_host_path(l, seen, &next);
        }
    }
    if seen.insert(cur.clone()) {
        let data = std::fs::read(&cur).ok()?;
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&cur).ok()?.permissions());
        l.long_file(cur.strip_prefix("/").ok()?.to_str()?, mode & 0o777, &data);
    }
    Some(())
}

/// `p` with `.` and `..` folded away (relative to `/`).
fn normalize(p: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    Some(out)
}

/// Writes [`hostile_image`] with the given busybox layer as an OCI layout tar,
/// `hostile.oci.tar` in `dir`, and returns its path.
/// The host's Python, bash and a static busybox ([`python_layer`]) as an OCI layout tar
/// `python.oci.tar` in `dir`, with `PATH=/usr/bin`: the image the tiers' escape battery runs
/// on as a template. `None` (after a loud SKIPPING line) when the host lacks one of them; a
/// panic then under `CORDON_REQUIRE_ALL=1`.
pub fn write_python_image(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let Some(layer) = python_layer() else {
        let msg =
            "no python3, bash or /bin/busybox on the host; the template escape battery cannot run";
        if std::env::var("CORDON_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{msg} (CORDON_REQUIRE_ALL=1)");
        }
        eprintln!("\n!!!!! SKIPPING: {msg} !!!!!\n");
        return None;
    };
    let file = dir.join("python.oci.tar");
    let image = Image {
        layers: vec![(layer, false)],
        env: vec!["PATH=/usr/bin".into()],
    };
    std::fs::write(&file, image.oci_tar(false)).expect("writing the image");
    Some(file)
}

pub fn write_hostile_image(dir: &std::path::Path, busybox: Vec<u8>) -> std::path::PathBuf {
    let file = dir.join("hostile.oci.tar");
    std::fs::write(&file, hostile_image(Some(busybox)).oci_tar(false)).expect("writing the image");
    file
}

/// A layer holding the host's pip (`/usr/lib/python3/dist-packages/pip`, pure Python with
/// its dependencies vendored), to go over [`python_layer`]. `None` when the host lacks it.
pub fn pip_layer() -> Option<Vec<u8>> {
    let top = std::path::Path::new("/usr/lib/python3/dist-packages/pip");
    if !top.is_dir() {
        return None;
    }
    let mut l = LayerBuilder::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            let p = e.path();
            let ft = e.file_type().ok()?;
            if ft.is_dir() {
                if e.file_name() != "__pycache__" {
                    todo.push(p);
                }
            } else if ft.is_file() {
                let data = std::fs::read(&p).ok()?;
                l.long_file(p.strip_prefix("/").ok()?.to_str()?, 0o644, &data);
            }
        }
    }
    Some(l.finish())
}
