//! Where the guests built by setup live, and the precompiled cache next to them.
//!
//! Layout under the data dir (`$CORDON_HOME`, else `/var/lib/cordon` for root, else
//! `$XDG_DATA_HOME/cordon` or `~/.local/share/cordon`, exactly as `scripts/lib.sh` decides):
//!
//! ```text
//! guests/manifest.json                 {"python": "python-<sha256>.wasm", "javascript": ...}
//! guests/python-<sha256>.wasm          CPython wasm32-wasi module (content-addressed)
//! guests/js-<sha256>.wasm              QuickJS wasm32-wasip1 module (content-addressed)
//! guests/cache/<name>-<src>-<engine>.cwasm         precompiled for this engine
//! guests/cache/<name>-<src>-<engine>.cwasm.sha256  hash of the .cwasm, written with it
//! guests/cache/<name>-<src>-<engine>.cwasm.id      the .cwasm's identity as written
//! ```
//!
//! A source artifact whose bytes do not hash to its name is refused (rebuild with setup).
//!
//! A precompiled entry is mapped from its file, lazily (only the pages a run touches are
//! read), when it is provably the file this engine wrote: `.id` records the identity of the
//! file as written (device, inode, size, mtime and ctime to the nanosecond), and the entry,
//! opened once, must still have that identity and, like its sidecars, be owned by this user
//! or root and writable by no one else. Anything else (no `.id`, a file copied, restored,
//! replaced or rewritten) is read from that same open file and hashed in full against
//! `.sha256` before use; a mismatch, or bytes that do not deserialize, remove the entry and
//! compile it again, and a good hash records the identity so the next process maps it.
//! Nothing this engine did not write and verify is ever executed. ADR 0003 gives the figures.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::WasmError;

/// The guests setup builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// CPython 3.13 as a pre-initialized `wasm32-wasi` module (guests/python, ADR 0020).
    Python,
    /// QuickJS as a `wasm32-wasip1` command module.
    Javascript,
}

impl Guest {
    pub const ALL: [Guest; 2] = [Guest::Python, Guest::Javascript];

    pub fn as_str(self) -> &'static str {
        match self {
            Guest::Python => "python",
            Guest::Javascript => "javascript",
        }
    }
}

/// The data dir Cordon keeps guest artifacts in; see the module docs for the order.
pub fn data_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CORDON_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    if is_root() {
        return PathBuf::from("/var/lib/cordon");
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("cordon");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    PathBuf::from(home).join(".local/share/cordon")
}

fn is_root() -> bool {
    euid() == Some(0)
}

/// The effective uid: the owner of /proc/self (no unsafe geteuid needed).
fn euid() -> Option<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid()).ok()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The source artifact of a guest named in the manifest, verified against its name.
pub(crate) struct Source {
    pub path: PathBuf,
    pub sha256: String,
}

pub(crate) fn manifest_path(data_dir: &Path) -> PathBuf {
    data_dir.join("guests/manifest.json")
}

/// Finds a guest's source artifact through the manifest (without hashing it).
pub(crate) fn locate(data_dir: &Path, guest: Guest) -> Result<Source, WasmError> {
    let mpath = manifest_path(data_dir);
    let text = std::fs::read_to_string(&mpath).map_err(|_| WasmError::MissingGuest {
        guest: guest.as_str(),
        path: mpath.clone(),
    })?;
    let manifest: BTreeMap<String, String> =
        serde_json::from_str(&text).map_err(|e| WasmError::Manifest {
            path: mpath.clone(),
            reason: e.to_string(),
        })?;
    let file = manifest
        .get(guest.as_str())
        .ok_or_else(|| WasmError::MissingGuest {
            guest: guest.as_str(),
            path: mpath.clone(),
        })?;
    let sha = file
        .strip_suffix(".wasm")
        .and_then(|s| s.rsplit_once('-'))
        .map(|(_, h)| h)
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .filter(|_| !file.contains('/'))
        .ok_or_else(|| WasmError::Manifest {
            path: mpath.clone(),
            reason: format!("entry {file:?} is not a content-addressed file name"),
        })?;
    let path = data_dir.join("guests").join(file);
    if !path.is_file() {
        return Err(WasmError::MissingGuest {
            guest: guest.as_str(),
            path,
        });
    }
    Ok(Source {
        path,
        sha256: sha.to_ascii_lowercase(),
    })
}

/// A stable fingerprint of everything that makes precompiled code valid for an engine.
pub(crate) fn engine_fingerprint(engine: &wasmtime::Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Verified precompiled code: the open cache file, to be mapped (its identity matched the
/// sidecar), or bytes hashed against the sidecar or just produced by this engine.
pub(crate) enum Precompiled {
    File(std::fs::File),
    Bytes(Vec<u8>),
}

/// What distinguishes the file written from any other, or from itself rewritten: device,
/// inode, size, mtime and ctime (the last cannot be set from user space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    fn to_line(self) -> String {
        format!(
            "dev={} ino={} size={} mtime={}.{} ctime={}.{}",
            self.dev, self.ino, self.size, self.mtime.0, self.mtime.1, self.ctime.0, self.ctime.1
        )
    }

    fn parse(line: &str) -> Option<Identity> {
        let mut f = std::collections::HashMap::new();
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            f.insert(k, v);
        }
        let time = |k: &str| -> Option<(i64, i64)> {
            let (s, ns) = f.get(k)?.split_once('.')?;
            Some((s.parse().ok()?, ns.parse().ok()?))
        };
        Some(Identity {
            dev: f.get("dev")?.parse().ok()?,
            ino: f.get("ino")?.parse().ok()?,
            size: f.get("size")?.parse().ok()?,
            mtime: time("mtime")?,
            ctime: time("ctime")?,
        })
    }
}

/// Opens a cache file that only this user or root can have written: owned by one of them,
/// writable by no group or other, a regular file reached without following a symlink.
fn open_trusted(path: &Path) -> Option<(std::fs::File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let m = file.metadata().ok()?;
    let owner_ok = m.uid() == 0 || Some(m.uid()) == euid();
    (m.is_file() && owner_ok && m.mode() & 0o022 == 0).then_some((file, m))
}

/// A cache entry that may be used, or `None` (it is then removed and rebuilt). With `map`
/// false the entry is hashed in full whatever its identity.
fn cached(paths: &CachePaths, map: bool) -> Option<Precompiled> {
    let read = |p: &Path| {
        let (mut f, _) = open_trusted(p)?;
        let mut text = String::new();
        f.read_to_string(&mut text).ok()?;
        Some(text)
    };
    let want = read(&paths.sha256)?;
    let (mut file, meta) = open_trusted(&paths.cwasm)?;
    let id = Identity::of(&meta);
    if map && read(&paths.identity).and_then(|t| Identity::parse(&t)) == Some(id) {
        return Some(Precompiled::File(file));
    }
    // Not the file as written (or no identity recorded): hash it in full, from the file
    // opened.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).ok()?;
    if sha256_hex(&bytes) != want.trim() {
        return None;
    }
    // Verified: the next process maps it (best effort; a read-only cache still works).
    let _ = write_atomic(&paths.dir, &paths.identity, id.to_line().as_bytes());
    Some(Precompiled::Bytes(bytes))
}

/// Loads a guest's precompiled code through `from_file` (a mapped cache entry) or
/// `from_bytes`. A mapped entry that does not load is read and hashed in full instead, and one
/// whose bytes do not load either is removed and compiled again.
pub(crate) fn load<T>(
    engine: &wasmtime::Engine,
    data_dir: &Path,
    guest: Guest,
    source: &Source,
    from_file: impl Fn(&std::fs::File) -> wasmtime::Result<T>,
    from_bytes: impl Fn(&[u8]) -> wasmtime::Result<T>,
) -> Result<T, WasmError> {
    let load_err = |e: wasmtime::Error| WasmError::Load {
        guest: guest.as_str(),
        reason: format!("{e:#}"),
    };
    // A mapped entry that fails is read and hashed instead (map = false); verified bytes that
    // fail are removed and compiled again, once.
    let mut map = true;
    let mut removed = false;
    loop {
        match precompiled(engine, data_dir, guest, source, map)? {
            Precompiled::File(f) => match from_file(&f) {
                Ok(t) => return Ok(t),
                Err(_) => map = false,
            },
            Precompiled::Bytes(b) => match from_bytes(&b) {
                Ok(t) => return Ok(t),
                Err(e) if removed => return Err(load_err(e)),
                Err(_) => {
                    cache_paths(engine, data_dir, guest, source).remove();
                    removed = true;
                    map = false;
                }
            },
        }
    }
}

/// Returns verified precompiled code for `source`, compiling (and caching) it when the cache
/// has no valid entry (see the module docs for what "verified" means); with `map` false,
/// never an unhashed file.
fn precompiled(
    engine: &wasmtime::Engine,
    data_dir: &Path,
    guest: Guest,
    source: &Source,
    map: bool,
) -> Result<Precompiled, WasmError> {
    let paths = cache_paths(engine, data_dir, guest, source);
    if let Some(c) = cached(&paths, map) {
        return Ok(c);
    }
    // Stale, tampered or missing: never used; removed and rebuilt below.
    paths.remove();
    let wasm = std::fs::read(&source.path).map_err(|e| WasmError::Io {
        what: "reading guest",
        path: source.path.clone(),
        source: e,
    })?;
    if sha256_hex(&wasm) != source.sha256 {
        return Err(WasmError::Tampered {
            path: source.path.clone(),
        });
    }
    let compiled = engine
        .precompile_module(&wasm)
        .map_err(|e| WasmError::Load {
            guest: guest.as_str(),
            reason: format!("{e:#}"),
        })?;
    // Best effort: a read-only data dir still runs, it just compiles every process.
    let CachePaths {
        dir,
        cwasm,
        sha256,
        identity,
    } = &paths;
    let _ = write_atomic(dir, cwasm, &compiled)
        .and_then(|_| write_atomic(dir, sha256, sha256_hex(&compiled).as_bytes()))
        .and_then(|_| std::fs::symlink_metadata(cwasm))
        .and_then(|m| write_atomic(dir, identity, Identity::of(&m).to_line().as_bytes()));
    Ok(Precompiled::Bytes(compiled))
}

/// A guest's cache entry for one engine: the precompiled code, the SHA-256 of its bytes, and
/// the identity of the file as written (a file of its own, so that builds from before it
/// was kept read the same `.sha256` sidecar).
struct CachePaths {
    dir: PathBuf,
    cwasm: PathBuf,
    sha256: PathBuf,
    identity: PathBuf,
}

impl CachePaths {
    fn remove(&self) {
        for p in [&self.cwasm, &self.sha256, &self.identity] {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn cache_paths(
    engine: &wasmtime::Engine,
    data_dir: &Path,
    guest: Guest,
    source: &Source,
) -> CachePaths {
    let dir = data_dir.join("guests/cache");
    let stem = format!(
        "{}-{}-{}",
        guest.as_str(),
        &source.sha256[..16],
        engine_fingerprint(engine)
    );
    CachePaths {
        cwasm: dir.join(format!("{stem}.cwasm")),
        sha256: dir.join(format!("{stem}.cwasm.sha256")),
        identity: dir.join(format!("{stem}.cwasm.id")),
        dir,
    }
}

fn write_atomic(dir: &Path, dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dest).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A cache entry as `precompiled` writes one, with bytes of the test's choosing.
    fn entry(dir: &Path, bytes: &[u8]) -> CachePaths {
        let p = CachePaths {
            dir: dir.to_path_buf(),
            cwasm: dir.join("g.cwasm"),
            sha256: dir.join("g.cwasm.sha256"),
            identity: dir.join("g.cwasm.id"),
        };
        write_atomic(dir, &p.cwasm, bytes).unwrap();
        write_atomic(dir, &p.sha256, sha256_hex(bytes).as_bytes()).unwrap();
        let id = Identity::of(&std::fs::metadata(&p.cwasm).unwrap());
        write_atomic(dir, &p.identity, id.to_line().as_bytes()).unwrap();
        p
    }

    fn kind(c: Option<Precompiled>) -> &'static str {
        match c {
            Some(Precompiled::File(_)) => "mapped",
            Some(Precompiled::Bytes(_)) => "hashed",
            None => "refused",
        }
    }

    #[test]
    fn only_the_file_as_written_is_mapped_unhashed() {
        let dir = tempfile::tempdir().unwrap();
        let p = entry(dir.path(), b"precompiled code");
        assert_eq!(kind(cached(&p, true)), "mapped");
        assert_eq!(kind(cached(&p, false)), "hashed");
        // Rewritten in place with the same bytes: a new mtime/ctime, so hashed in full; the
        // good hash records the new identity and the next load maps it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p.cwasm, b"precompiled code").unwrap();
        assert_eq!(kind(cached(&p, true)), "hashed");
        assert_eq!(kind(cached(&p, true)), "mapped");
        // Other bytes (rewritten, or replaced by another file): refused.
        std::fs::write(&p.cwasm, b"precompiled codf").unwrap();
        assert_eq!(kind(cached(&p, true)), "refused");
        let p = entry(dir.path(), b"precompiled code");
        std::fs::remove_file(&p.cwasm).unwrap();
        std::fs::write(&p.cwasm, b"precompiled code").unwrap();
        assert_eq!(kind(cached(&p, true)), "hashed");
        // An entry, or a sidecar, that someone else could have written: refused.
        let p = entry(dir.path(), b"precompiled code");
        for f in [&p.cwasm, &p.sha256] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o620)).unwrap();
            assert_eq!(kind(cached(&p, true)), "refused", "{}", f.display());
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // A symlink in the entry's place is not followed; an identity that does not parse, or
        // none, means hashing in full.
        let p = entry(dir.path(), b"precompiled code");
        std::fs::write(&p.identity, b"dev=1 ino=x").unwrap();
        assert_eq!(kind(cached(&p, true)), "hashed");
        std::fs::remove_file(&p.identity).unwrap();
        assert_eq!(kind(cached(&p, true)), "hashed");
        let real = dir.path().join("real.cwasm");
        std::fs::rename(&p.cwasm, &real).unwrap();
        std::os::unix::fs::symlink(&real, &p.cwasm).unwrap();
        assert_eq!(kind(cached(&p, true)), "refused");
    }

    #[test]
    fn manifest_entries_must_be_content_addressed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("guests")).unwrap();
        std::fs::write(
            manifest_path(dir.path()),
            r#"{"python": "../../etc/passwd-0000000000000000000000000000000000000000000000000000000000000000.wasm"}"#,
        )
        .unwrap();
        assert!(matches!(
            locate(dir.path(), Guest::Python),
            Err(WasmError::Manifest { .. })
        ));
        assert!(matches!(
            locate(dir.path(), Guest::Javascript),
            Err(WasmError::MissingGuest { .. })
        ));
    }
}
