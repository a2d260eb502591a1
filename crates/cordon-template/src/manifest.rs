//! The typed record of one template, as stored in `names/<name>.json`.

use std::collections::BTreeMap;
use std::fmt;

use cordon_core::Tier;
use serde::{Deserialize, Serialize};

/// One template: an immutable root filesystem made of layers, identified by its digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    /// `sha256:<hex>` over Cordon's flattening version and the layers' uncompressed
    /// digests, in order: two templates with the same digest share one root.
    pub digest: String,
    /// The layers, bottom first, each stored once by its digest.
    pub layers: Vec<Layer>,
    /// Bytes of regular files in the flattened root.
    pub size_bytes: u64,
    /// Entries (files, directories, links) in the flattened root.
    pub files: u64,
    /// Bytes the flattened root takes on the host's disk (blocks allocated, each hard-linked
    /// file once, holes of sparse files not counted): what it spends of the store's budget.
    /// 0 in manifests written before it was recorded (`size_bytes` counts then).
    #[serde(default)]
    pub stored_bytes: u64,
    /// The tiers that can run a sandbox on this template.
    pub tiers: Vec<Tier>,
    pub built_from: BuiltFrom,
    /// When the template was made, in seconds since the Unix epoch.
    pub created_unix: u64,
    /// The image's defaults: its environment is the sandbox's default environment.
    #[serde(default)]
    pub image: ImageDefaults,
}

/// One layer as stored: its blob (as imported) and the digest of its uncompressed tar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// `sha256:<hex>` of the blob as stored (compressed or not).
    pub digest: String,
    /// `sha256:<hex>` of the uncompressed tar (the image config's diff id).
    pub diff_id: String,
    pub size_bytes: u64,
    pub compression: Compression,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
}

/// Where a template came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BuiltFrom {
    /// Imported from a local image file (its file name only, never a host path).
    Import { format: ImageFormat, file: String },
    /// Built by `cordon template build`: steps run over a base, sealed.
    Build {
        /// The base: `host`, `debian`, or `template NAME`.
        base: String,
        /// The base's identity (a template's digest, the Debian root's hash).
        base_digest: String,
        /// `sha256:<hex>` of the build's inputs (base, steps, env, allow-list): a build
        /// with the same inputs is the same template.
        inputs_digest: String,
        /// The steps, in order.
        steps: Vec<String>,
        /// The egress allow-list the steps ran with.
        allow: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageFormat {
    OciLayout,
    DockerArchive,
}

impl fmt::Display for BuiltFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuiltFrom::Import { format, file } => {
                let format = match format {
                    ImageFormat::OciLayout => "oci-layout",
                    ImageFormat::DockerArchive => "docker-archive",
                };
                write!(f, "import {format} {file}")
            }
            BuiltFrom::Build {
                base,
                inputs_digest,
                ..
            } => {
                let short = &inputs_digest[..inputs_digest.len().min(19)];
                write!(f, "build from {base}, inputs {short}")
            }
        }
    }
}

/// The image config's process defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageDefaults {
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

impl Manifest {
    /// The digest's hex part: the name of the template's root and lease in the store.
    pub fn digest_hex(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or(&self.digest)
    }
}
