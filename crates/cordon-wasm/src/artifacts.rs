//! Where the guests built by setup live, and the precompiled cache next to them.
//!
//! Layout under the data dir (`$CORDON_HOME`, else `/var/lib/cordon` for root, else
//! `$XDG_DATA_HOME/cordon` or `~/.local/share/cordon`, exactly as `scripts/lib.sh` decides):
//!
//! ```text
//! guests/manifest.json                 {"python": "python-<sha256>.wasm", "javascript": ...}
//! guests/python-<sha256>.wasm          componentize-py component (content-addressed)
//! guests/js-<sha256>.wasm              QuickJS wasm32-wasip1 module (content-addressed)
//! guests/cache/<name>-<src>-<engine>.cwasm         precompiled for this engine
//! guests/cache/<name>-<src>-<engine>.cwasm.sha256  hash of the .cwasm, written with it
//! ```
//!
//! A source artifact whose bytes do not hash to its name is refused (rebuild with setup). A
//! precompiled entry is read into memory, hashed and compared with its sidecar before it is
//! deserialized from those same bytes; a mismatch or a failed deserialization removes the
//! entry and compiles it again. Nothing unverified is ever executed.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::WasmError;

/// The guests setup builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// CPython 3.14 as a `wasi:cli/command` component (componentize-py).
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
    // The owner of /proc/self is the effective uid; no unsafe geteuid needed.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
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

/// What kind of code a cache entry holds.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Module,
    Component,
}

/// Returns verified precompiled bytes for `source`, compiling (and caching) them when the
/// cache has no valid entry. The returned bytes were produced by this engine's
/// `precompile_*` or hashed against the sidecar written with them.
pub(crate) fn precompiled(
    engine: &wasmtime::Engine,
    data_dir: &Path,
    guest: Guest,
    source: &Source,
    kind: Kind,
) -> Result<Vec<u8>, WasmError> {
    let cache_dir = data_dir.join("guests/cache");
    let stem = format!(
        "{}-{}-{}",
        guest.as_str(),
        &source.sha256[..16],
        engine_fingerprint(engine)
    );
    let cwasm = cache_dir.join(format!("{stem}.cwasm"));
    let sidecar = cache_dir.join(format!("{stem}.cwasm.sha256"));
    if let (Ok(bytes), Ok(want)) = (std::fs::read(&cwasm), std::fs::read_to_string(&sidecar)) {
        if sha256_hex(&bytes) == want.trim() {
            return Ok(bytes);
        }
        // Stale or tampered: never used; removed and rebuilt below.
        let _ = std::fs::remove_file(&cwasm);
        let _ = std::fs::remove_file(&sidecar);
    }
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
    let compiled = match kind {
        Kind::Module => engine.precompile_module(&wasm),
        Kind::Component => engine.precompile_component(&wasm),
    }
    .map_err(|e| WasmError::Load {
        guest: guest.as_str(),
        reason: format!("{e:#}"),
    })?;
    // Best effort: a read-only data dir still runs, it just compiles every process.
    let _ = write_atomic(&cache_dir, &cwasm, &compiled)
        .and_then(|_| write_atomic(&cache_dir, &sidecar, sha256_hex(&compiled).as_bytes()));
    Ok(compiled)
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
