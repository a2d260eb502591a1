use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Language, Result, Tier};

/// Entries of the host's `/etc` that a sandbox root made of the host's `/usr` shows,
/// read-only: package data that `/usr` points into through symlinks (Debian's
/// alternatives, through which numpy finds `libblas.so.3`; matplotlib's defaults), and the
/// dynamic linker's index of the libraries under that same `/usr` (`ld.so.cache`, which
/// `ldconfig` makes from it). Without the index every dynamically linked program searches
/// each library through a dozen directories that do not exist, a failed `openat` and
/// `stat` at a time, which under gVisor's ptrace platform is a trap into the sentry each.
/// No other host `/etc` entry is ever visible, and none of these holds a secret.
/// Where a server keeps a tier's scratch dirs under its data dir (the tier makes them there,
/// the server's crash recovery removes what a dead server left).
pub fn scratch_dir(data_dir: &std::path::Path, tier: crate::Tier) -> std::path::PathBuf {
    data_dir.join("scratch").join(tier.as_str())
}

pub const HOST_ETC: [&str; 3] = ["alternatives", "matplotlibrc", "ld.so.cache"];

/// Resource limits. Every one is enforced, not advisory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock limit of one exec, in milliseconds.
    pub timeout_ms: u64,
    /// Memory limit of the whole sandbox (swap off), in bytes.
    pub memory_bytes: u64,
    /// Most processes and threads alive at once in the sandbox.
    pub pids: u32,
    /// Size of the writable workspace `/work`, in bytes.
    pub disk_bytes: u64,
    /// Size of `/tmp`, in bytes.
    pub tmp_bytes: u64,
    /// CPU quota, in CPUs (1.0 = one full core).
    pub cpus: f64,
    /// Bytes of stdout kept; more ends the exec with the output-limit reason.
    pub stdout_bytes: u64,
    /// Bytes of stderr kept; more ends the exec with the output-limit reason.
    pub stderr_bytes: u64,
    /// Open file descriptors per process.
    pub open_files: u64,
    /// Optional deterministic CPU bound (wasm fuel units); tiers without fuel ignore it.
    pub fuel: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 30_000,
            memory_bytes: 512 << 20,
            pids: 128,
            disk_bytes: 256 << 20,
            tmp_bytes: 64 << 20,
            cpus: 1.0,
            stdout_bytes: 1 << 20,
            stderr_bytes: 1 << 20,
            open_files: 1024,
            fuel: None,
        }
    }
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks that every limit is usable; a zero limit would make the sandbox useless.
    pub fn validate(&self) -> Result<()> {
        let bad = |what, fix| Err(crate::Rejected::Limit { what, fix }.into());
        if self.timeout_ms == 0 {
            return bad("timeout is zero", "give a timeout like 5s");
        }
        if self.memory_bytes < 8 << 20 {
            return bad("memory limit is below 8 MiB", "give at least 8M");
        }
        if self.pids < 2 {
            return bad("process limit is below 2", "give at least 2");
        }
        if self.disk_bytes < 64 << 10 || self.tmp_bytes < 64 << 10 {
            return bad("disk or tmp size is below 64 KiB", "give at least 64k");
        }
        if !(self.cpus.is_finite() && self.cpus >= 0.01) {
            return bad("cpus must be at least 0.01", "give e.g. 0.5 or 2");
        }
        if self.open_files < 16 {
            return bad("open-files limit is below 16", "give at least 16");
        }
        Ok(())
    }
}

/// A secret value held by the host. Zeroed on drop; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(zeroize::Zeroizing<Vec<u8>>);

impl SecretValue {
    pub fn new(value: impl Into<Vec<u8>>) -> Self {
        SecretValue(zeroize::Zeroizing::new(value.into()))
    }

    /// The bytes. Handle with care: never log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret([{} bytes])", self.0.len())
    }
}

/// A token minted for one sandbox: its value and when it stops being valid.
#[derive(Debug, Clone)]
pub struct MintedToken {
    pub value: SecretValue,
    pub expires_at: std::time::SystemTime,
}

/// Mints short-lived credentials for a grant (e.g. a signed JWT whose subject is the
/// sandbox). The egress proxy asks for a token when it needs one and again before the last
/// one expires; the sandbox never sees any of them.
pub trait TokenMinter: Send + Sync {
    /// A fresh token for the sandbox `sandbox`, or why none can be had (no secret in it).
    fn mint(&self, sandbox: &str) -> std::result::Result<MintedToken, String>;
}

/// A grant's secret, already in the host's hands. Requests never carry one: the operator's
/// grant catalogue (or the local operator's `cordon run --grant`) resolves it, and it is
/// never serialized.
#[derive(Clone)]
pub enum GrantSecret {
    /// A value the host read from the operator's source, forwarded as is.
    Value(SecretValue),
    /// A token minted per sandbox instead of a forwarded secret.
    Minted(Arc<dyn TokenMinter>),
}

impl GrantSecret {
    /// A value secret (tests and the local operator).
    pub fn value(v: impl Into<Vec<u8>>) -> Self {
        GrantSecret::Value(SecretValue::new(v))
    }
}

impl fmt::Debug for GrantSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrantSecret::Value(v) => write!(f, "Value({v:?})"),
            GrantSecret::Minted(_) => f.write_str("Minted"),
        }
    }
}

impl PartialEq for GrantSecret {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (GrantSecret::Value(a), GrantSecret::Value(b)) => a == b,
            (GrantSecret::Minted(a), GrantSecret::Minted(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A scoped credential: the sandbox sees a placeholder in `env_var`; the egress proxy swaps
/// it for the real secret only on requests to `hosts` (and matching methods and paths).
/// Serialized without its secret (for audit and reports); never deserialized, so no request
/// can carry one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    /// Short name, e.g. `github`.
    pub name: String,
    /// Environment variable the placeholder is put in, e.g. `GITHUB_TOKEN`.
    pub env_var: String,
    #[serde(skip)]
    pub secret: GrantSecret,
    /// Host patterns (exact or `*.suffix`) the secret may be sent to.
    pub hosts: Vec<crate::Pattern>,
    /// Header the secret goes in.
    pub header: String,
    /// Methods allowed with the secret; empty means any.
    pub methods: Vec<String>,
    /// Path prefixes allowed with the secret; empty means any.
    pub path_prefixes: Vec<String>,
}

/// The header a grant's secret goes in unless it names another.
pub fn default_grant_header() -> String {
    "authorization".to_string()
}

/// Egress: denied unless a host is allowed. The proxy enforces it; see `cordon-egress`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressPolicy {
    /// Allowed host patterns: `host`, `*.suffix`, optionally `:port`; CIDRs only when explicit.
    pub allow: Vec<crate::Pattern>,
    /// Denied host patterns; a deny always wins over an allow.
    pub deny: Vec<crate::Pattern>,
}

impl EgressPolicy {
    /// True when the sandbox may reach nothing at all.
    pub fn is_closed(&self) -> bool {
        self.allow.is_empty()
    }
}

/// A wall the caller explicitly agreed to run without. The result is marked weaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Weakening {
    Landlock,
    Seccomp,
    Cgroups,
}

impl FromStr for Weakening {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "landlock" => Ok(Weakening::Landlock),
            "seccomp" => Ok(Weakening::Seccomp),
            "cgroups" | "cgroup" => Ok(Weakening::Cgroups),
            _ => Err(format!(
                "unknown layer {s:?}; layers that may be weakened: landlock, seccomp, cgroups"
            )),
        }
    }
}

impl fmt::Display for Weakening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Weakening::Landlock => "landlock",
            Weakening::Seccomp => "seccomp",
            Weakening::Cgroups => "cgroups",
        })
    }
}

/// Everything needed to create a sandbox. Deny by default: a sandbox gets nothing it is not
/// given here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    pub tier: Tier,
    #[serde(default)]
    pub limits: Limits,
    /// Environment passed to every exec (besides PATH, HOME and LANG).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub egress: EgressPolicy,
    /// Scoped credentials, resolved by the host from the operator's catalogue. Never read
    /// from a serialized spec: a `grants` key in one is refused as unknown.
    #[serde(skip)]
    pub grants: Vec<Grant>,
    /// Walls the caller agreed to run without if the host cannot apply them.
    #[serde(default)]
    pub allow_weaker: BTreeSet<Weakening>,
    /// Who the sandbox is for (the authenticated tenant). Set by the server, never read from
    /// a request body: backends share per-owner resources by it (the wasm tier's instance
    /// pool). `None` counts as one owner of its own.
    #[serde(skip)]
    pub owner: Option<String>,
    /// The name of a template (an immutable root filesystem, `cordon template ls`) the
    /// sandbox's root is made from; none means the host's `/usr` (or the tier's own root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The template resolved by the host before the tier runs (its root on the host, its
    /// digest and default environment). Never read from a request.
    #[serde(skip)]
    pub resolved_template: Option<ResolvedTemplate>,
    /// Volumes mounted under `/work` (docs/service.md#volumes); each one's host side is
    /// filled in by whoever leased it before the tier runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::VolumeMount>,
    /// Host device nodes bound into the sandbox's `/dev` at the same path, as names under
    /// `/dev` (`fuse`, `net/tun`): only what a node's operator allowed by name (cordon-oci's
    /// `[[allow.device]]`), checked by whoever sets it. Never read from a request; the
    /// container tier gives them.
    #[serde(skip)]
    pub devices: Vec<String>,
    /// Host directories bound into the sandbox ([`crate::HostBind`]): only what a node's
    /// operator allowed, checked and opened by whoever sets it. Never read from a request;
    /// the tiers with [`crate::Feature::HostPaths`] give them.
    #[serde(skip)]
    pub host_binds: Vec<crate::HostBind>,
    /// The id the sandbox takes, where it starts again under the id it had (a sandbox
    /// paused to its files and resumed: the server's session keeps its id, its tokens and
    /// its grants). Set by the server after the old sandbox is destroyed, never read from a
    /// request; `None` is a fresh random id. Tiers without [`crate::Feature::SnapshotFiles`]
    /// ignore it.
    #[serde(skip)]
    pub id: Option<crate::SandboxId>,
}

/// A template the host resolved for one sandbox: what a tier needs to use it. The lease
/// keeps the template's root from being collected while the sandbox (any clone of its
/// spec) lives.
#[derive(Clone)]
pub struct ResolvedTemplate {
    pub name: String,
    /// `sha256:<hex>`: the template's identity.
    pub digest: String,
    /// The template's read-only root directory on the host. Never shown to a tenant.
    pub root: std::path::PathBuf,
    /// The image's default environment (below Cordon's own variables, see
    /// [`crate::sandbox_env`]).
    pub env: BTreeMap<String, String>,
    /// Interpreters found on the template's `PATH`: `--lang` runs only these.
    pub languages: BTreeSet<Language>,
    /// Held for as long as the sandbox lives (a shared lock on the template's lease file).
    pub lease: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Set only by `cordon template build`: `root` is the build's own working copy on the
    /// host (never a template of the store), and the container tier mounts it writable as
    /// the sandbox's root so a build step can install into it. Every other sandbox's
    /// template root is read-only.
    pub writable: bool,
}

impl ResolvedTemplate {
    /// Refuses source code in a language whose interpreter the template lacks, saying what
    /// to do (never where the template lives on the host).
    pub fn check_language(&self, language: Language) -> Result<()> {
        if self.languages.contains(&language) {
            return Ok(());
        }
        Err(crate::Rejected::NoInterpreter {
            template: self.name.clone(),
            language,
        }
        .into())
    }
}

impl fmt::Debug for ResolvedTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedTemplate")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("languages", &self.languages)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ResolvedTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.digest == other.digest && self.root == other.root
    }
}

impl SandboxSpec {
    pub fn new(tier: Tier) -> Self {
        SandboxSpec {
            tier,
            limits: Limits::default(),
            env: BTreeMap::new(),
            egress: EgressPolicy::default(),
            grants: Vec::new(),
            allow_weaker: BTreeSet::new(),
            owner: None,
            template: None,
            resolved_template: None,
            volumes: Vec::new(),
            devices: Vec::new(),
            host_binds: Vec::new(),
            id: None,
        }
    }

    /// The id a sandbox made for this spec takes: [`SandboxSpec::id`] when the server set
    /// one, else a fresh random one.
    pub fn sandbox_id(&self) -> Result<crate::SandboxId> {
        match &self.id {
            Some(id) => Ok(id.clone()),
            None => crate::SandboxId::random(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.limits.validate()?;
        if let Some(name) = &self.template {
            validate_template_name(name)?;
        }
        for key in self.env.keys() {
            validate_env_name(key)?;
        }
        crate::volume::validate_mounts(&self.volumes)?;
        for g in &self.grants {
            validate_env_name(&g.env_var)?;
            if g.hosts.is_empty() {
                return Err(crate::Rejected::GrantWithoutHosts {
                    grant: g.name.clone(),
                }
                .into());
            }
        }
        Ok(())
    }
}

/// A template name: 1 to 64 of `a-z 0-9 . _ -`, starting with a letter or digit.
pub fn validate_template_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(name_rejected(crate::NameKind::Template, name))
    }
}

/// An environment variable name: letters, digits and `_`, not starting with a digit.
pub fn validate_env_name(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(name_rejected(crate::NameKind::EnvVar, key))
    }
}

fn name_rejected(kind: crate::NameKind, name: &str) -> Error {
    crate::Rejected::Name {
        kind,
        name: name.to_string(),
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate_sandbox_dir, validate_sandbox_path};

    #[test]
    fn sandbox_paths() {
        assert_eq!(validate_sandbox_path("/work/a.csv").unwrap(), "a.csv");
        assert_eq!(validate_sandbox_path("a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(validate_sandbox_path("/work//x/./y").unwrap(), "x/y");
        for bad in [
            "/etc/passwd",
            "/work/../etc/passwd",
            "../x",
            "a/../../b",
            "/workx/a",
            "/work",
            "/work/",
            "",
            "a\0b",
        ] {
            assert!(validate_sandbox_path(bad).is_err(), "{bad:?} was accepted");
        }
        for root in ["/work", "/work/", ".", "/work//"] {
            assert_eq!(validate_sandbox_dir(root).unwrap(), "", "{root:?}");
        }
        assert_eq!(validate_sandbox_dir("/work/a/").unwrap(), "a");
        for bad in ["/", "/etc", "/work/..", "..", "/workx"] {
            assert!(validate_sandbox_dir(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// Found by the fuzz harness below: a relative path of 4091..=4096 bytes was accepted
    /// while the same file named from /work was refused.
    #[test]
    fn a_relative_path_is_accepted_exactly_when_its_work_form_is() {
        for n in [4090, 4091, 4096] {
            let rel = "a".repeat(n);
            let abs = format!("/work/{rel}");
            assert_eq!(
                validate_sandbox_path(&rel).is_ok(),
                validate_sandbox_path(&abs).is_ok(),
                "{n} bytes"
            );
        }
        assert!(validate_sandbox_path(&"a".repeat(4090)).is_ok());
    }

    #[test]
    fn tiers_and_languages_parse() {
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().unwrap(), t);
        }
        assert!("vm".parse::<Tier>().is_err());
        assert_eq!("py".parse::<Language>().unwrap(), Language::Python);
        assert!("cobol".parse::<Language>().is_err());
    }

    #[test]
    fn spec_refuses_unknown_fields_and_bad_env() {
        let err = serde_json::from_str::<SandboxSpec>(r#"{"tier":"container","privileged":true}"#);
        assert!(err.is_err());
        let mut spec = SandboxSpec::new(Tier::Container);
        spec.env.insert("BAD NAME".into(), "x".into());
        assert!(spec.validate().is_err());
        let mut spec = SandboxSpec::new(Tier::Container);
        spec.limits.timeout_ms = 0;
        assert!(spec.validate().is_err());
    }

    #[test]
    fn template_field_is_optional_and_validated() {
        // A spec without a template serializes as before (no `template` key).
        let spec = SandboxSpec::new(Tier::Container);
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains("template"), "{json}");
        let back: SandboxSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.template, None);
        let with: SandboxSpec =
            serde_json::from_str(r#"{"tier":"container","template":"data-py"}"#).unwrap();
        assert_eq!(with.template.as_deref(), Some("data-py"));
        with.validate().unwrap();
        for bad in ["", "Data", "../x", "a/b", "-x", &"a".repeat(65)] {
            let mut s = SandboxSpec::new(Tier::Container);
            s.template = Some(bad.to_string());
            assert!(s.validate().is_err(), "{bad:?} was accepted");
        }
    }
}
