//! Reading the image: the outer archive unpacked, an OCI layout or a docker archive
//! parsed, every blob checked against its digest.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use oci_spec::image::{
    Arch, Descriptor, DigestAlgorithm, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Result, TemplateError};
use crate::manifest::{Compression, ImageDefaults, ImageFormat};

use super::stage::ImportLimits;

/// Opens a (possibly gzip-compressed) tar stream.
pub(super) fn open_maybe_gzip(path: &Path) -> Result<(Compression, Box<dyn Read>)> {
    let f = fs::File::open(path).map_err(TemplateError::io("opening the image"))?;
    let mut r = BufReader::with_capacity(1 << 16, f);
    let head = r
        .fill_buf()
        .map_err(TemplateError::io("reading the image"))?;
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(TemplateError::Malformed(
            "a zstd-compressed layer; export the image with gzip or uncompressed layers".into(),
        ));
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok((Compression::Gzip, Box::new(flate2::read::GzDecoder::new(r))))
    } else {
        Ok((Compression::None, Box::new(r)))
    }
}

pub(super) fn open_layer(path: &Path) -> Result<(Compression, Box<dyn Read>)> {
    open_maybe_gzip(path)
}

/// Unpacks the image file's regular files into `dest` (links and devices of the outer
/// archive are ignored: no OCI layout or docker archive needs them).
pub(super) fn unpack_outer(archive: &Path, dest: &Path, limits: &ImportLimits) -> Result<()> {
    let (_, r) = open_maybe_gzip(archive)?;
    let mut ar = tar::Archive::new(r);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(TemplateError::io("creating a staging dir"))?;
    let bad = |e: io::Error| TemplateError::UnknownFormat(format!("the file is not a tar ({e})"));
    let (mut bytes, mut count) = (0u64, 0u64);
    for entry in ar.entries().map_err(bad)? {
        let mut e = entry.map_err(bad)?;
        limits.count_entry(&mut count)?;
        if !e.header().entry_type().is_file() {
            continue;
        }
        let path = e.path().map_err(bad)?.into_owned();
        let Some(rel) = clean(&path).filter(|_| !path.is_absolute()) else {
            return Err(TemplateError::Malformed(format!(
                "the file's entry {} leaves the archive",
                path.display()
            )));
        };
        limits.count_archive(&mut bytes, e.size())?;
        let to = dest.join(&rel);
        if let Some(parent) = to.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(TemplateError::io("unpacking the image"))?;
        }
        let mut out = create_new(&to).map_err(|e| {
            TemplateError::Malformed(format!("the file's entry {} ({e})", rel.display()))
        })?;
        io::copy(&mut e, &mut out).map_err(TemplateError::io("unpacking the image"))?;
    }
    Ok(())
}

/// Hex sha256 and size of a file.
pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = fs::File::open(path).map_err(TemplateError::io("reading a blob"))?;
    let mut h = HashingReader::new(&mut f, u64::MAX);
    io::copy(&mut h, &mut io::sink()).map_err(TemplateError::io("reading a blob"))?;
    let n = h.count;
    Ok((h.finish(), n))
}

pub(super) fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The blob a descriptor names, checked against its digest and size.
pub(super) fn verified_blob(dir: &Path, d: &Descriptor, what: &str) -> Result<(PathBuf, String)> {
    if *d.digest().algorithm() != DigestAlgorithm::Sha256 || !is_hex64(d.digest().digest()) {
        return Err(TemplateError::Malformed(format!(
            "the {what} is named by a digest that is not sha256 ({})",
            d.digest()
        )));
    }
    let hex = d.digest().digest().to_string();
    let path = dir.join("blobs/sha256").join(&hex);
    if !path.is_file() {
        return Err(TemplateError::Malformed(format!(
            "the {what} blob {} is missing",
            d.digest()
        )));
    }
    let (got, size) = sha256_file(&path)?;
    if got != hex || size != d.size() {
        return Err(TemplateError::DigestMismatch {
            what: what.to_string(),
            expected: d.digest().to_string(),
        });
    }
    Ok((path, hex))
}

pub(super) fn malformed(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> TemplateError {
    move |e| TemplateError::Malformed(format!("{what}: {e}"))
}

/// The manifest for this machine among an index's, else the first.
pub(super) fn pick(manifests: &[Descriptor]) -> Result<Descriptor> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => Arch::Other(other.to_string()),
    };
    manifests
        .iter()
        .find(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == arch)
        })
        .or_else(|| manifests.first())
        .cloned()
        .ok_or_else(|| TemplateError::Malformed("the index lists no image".into()))
}

pub(super) fn read_oci(dir: &Path) -> Result<Parsed> {
    let index = ImageIndex::from_file(dir.join("index.json")).map_err(malformed("index.json"))?;
    let mut desc = pick(index.manifests())?;
    if *desc.media_type() == MediaType::ImageIndex {
        let (p, _) = verified_blob(dir, &desc, "nested index")?;
        let nested = ImageIndex::from_file(p).map_err(malformed("the nested index"))?;
        desc = pick(nested.manifests())?;
    }
    let (mpath, _) = verified_blob(dir, &desc, "manifest")?;
    let manifest = ImageManifest::from_file(mpath).map_err(malformed("the manifest"))?;
    let (cpath, _) = verified_blob(dir, manifest.config(), "config")?;
    let config = ImageConfiguration::from_file(cpath).map_err(malformed("the config"))?;
    let mut layers = Vec::new();
    for (i, l) in manifest.layers().iter().enumerate() {
        if matches!(
            l.media_type(),
            MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd
        ) {
            return Err(TemplateError::Malformed(format!(
                "layer {i} is zstd-compressed; export the image with gzip or uncompressed layers"
            )));
        }
        layers.push(verified_blob(dir, l, &format!("layer {i}"))?);
    }
    Ok(Parsed {
        format: ImageFormat::OciLayout,
        layers,
        diff_ids: config.rootfs().diff_ids().clone(),
        defaults: defaults(&config),
    })
}

/// One image of a docker archive's `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct DockerImage {
    config: String,
    layers: Vec<String>,
}

pub(super) fn read_docker(dir: &Path) -> Result<Parsed> {
    let body =
        fs::read(dir.join("manifest.json")).map_err(TemplateError::io("reading manifest.json"))?;
    let images: Vec<DockerImage> = serde_json::from_slice(&body)
        .map_err(|e| TemplateError::Malformed(format!("manifest.json: {e}")))?;
    let image = match images.as_slice() {
        [one] => one,
        [] => {
            return Err(TemplateError::Malformed(
                "manifest.json lists no image".into(),
            ));
        }
        _ => {
            return Err(TemplateError::Malformed(
                "manifest.json lists several images; save one image per file".into(),
            ));
        }
    };
    let inside = |p: &str| -> Result<PathBuf> {
        let rel = clean(Path::new(p))
            .filter(|_| !p.starts_with('/'))
            .ok_or_else(|| TemplateError::Malformed(format!("manifest.json names {p:?}")))?;
        let path = dir.join(rel);
        if !path.is_file() {
            return Err(TemplateError::Malformed(format!("{p:?} is missing")));
        }
        Ok(path)
    };
    let cpath = inside(&image.config)?;
    // A config named by its digest (every docker save names it so) is checked against it.
    let (chex, _) = sha256_file(&cpath)?;
    let named = Path::new(&image.config)
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_end_matches(".json"))
        .filter(|n| is_hex64(n));
    if let Some(n) = named
        && n != chex
    {
        return Err(TemplateError::DigestMismatch {
            what: "config".into(),
            expected: format!("sha256:{n}"),
        });
    }
    let config = ImageConfiguration::from_file(&cpath).map_err(malformed("the config"))?;
    let mut layers = Vec::new();
    for l in &image.layers {
        let p = inside(l)?;
        let (hex, _) = sha256_file(&p)?;
        layers.push((p, hex));
    }
    Ok(Parsed {
        format: ImageFormat::DockerArchive,
        layers,
        diff_ids: config.rootfs().diff_ids().clone(),
        defaults: defaults(&config),
    })
}

pub(super) fn defaults(config: &ImageConfiguration) -> ImageDefaults {
    let Some(c) = config.config() else {
        return ImageDefaults::default();
    };
    let env: BTreeMap<String, String> = c
        .env()
        .iter()
        .flatten()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| {
            !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ImageDefaults {
        env,
        working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
    }
}

/// A reader that hashes what passes and refuses more than `limit` bytes.
pub(super) struct HashingReader<R> {
    pub(super) inner: R,
    pub(super) hash: Sha256,
    pub(super) count: u64,
    pub(super) limit: u64,
}

impl<R: Read> HashingReader<R> {
    pub(super) fn new(inner: R, limit: u64) -> Self {
        HashingReader {
            inner,
            hash: Sha256::new(),
            count: 0,
            limit,
        }
    }

    pub(super) fn finish(self) -> String {
        hex::encode(self.hash.finalize())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                self.limit.to_string(),
            ));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// An image read from its file, its blobs checked.
pub(crate) struct Parsed {
    pub(crate) format: ImageFormat,
    /// Layer blobs in the staging dir, bottom first, with their blob digests (hex).
    pub(crate) layers: Vec<(PathBuf, String)>,
    /// The config's diff ids (`sha256:<hex>` of each uncompressed layer).
    pub(crate) diff_ids: Vec<String>,
    pub(crate) defaults: ImageDefaults,
}

/// A relative path made of normal components only; `None` if it has `..`, a root or
/// nothing at all.
pub(super) fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            // A leading `/` in a layer means the image's root (tar's own convention).
            Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Creates a file that must not exist yet, never through a link (mode 0600 until set).
pub(super) fn create_new(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}
