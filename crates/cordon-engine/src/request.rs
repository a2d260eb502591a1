//! The one request type every front door builds: `cordon run`'s flags, the HTTP API's create
//! and run bodies, and MCP's tool arguments all become a [`SandboxRequest`].

use std::collections::{BTreeMap, BTreeSet};

use cordon_core::units::Dur;
use cordon_core::{Grant, Limits, Weakening};
use cordon_policy::{Autonomy, Shape, TierChoice, Trust};
use serde::{Deserialize, Deserializer, Serialize};

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// The local operator (`cordon run` on the host): the operator's own ceiling.
    Operator,
    /// An API tenant: the ceiling `cordon.toml` gives it.
    Tenant(String),
}

impl Principal {
    pub fn name(&self) -> &str {
        match self {
            Principal::Operator => "operator",
            Principal::Tenant(t) => t,
        }
    }
}

/// Limits a request may give; any left out come from the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct LimitsPatch {
    pub timeout_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    pub disk_bytes: Option<u64>,
    pub tmp_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub stdout_bytes: Option<u64>,
    pub stderr_bytes: Option<u64>,
    pub open_files: Option<u64>,
    pub fuel: Option<u64>,
}

impl LimitsPatch {
    pub fn is_empty(&self) -> bool {
        *self == LimitsPatch::default()
    }

    pub fn apply(&self, base: &Limits) -> Limits {
        let mut l = base.clone();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { l.$f = v; } )* };
        }
        set!(
            timeout_ms,
            memory_bytes,
            pids,
            disk_bytes,
            tmp_bytes,
            cpus,
            stdout_bytes,
            stderr_bytes,
            open_files
        );
        if self.fuel.is_some() {
            l.fuel = self.fuel;
        }
        l
    }
}

/// A grant named by a request: the name of an operator's catalogue entry, nothing else.
/// An object (a whole grant with a `secret` source, as older clients sent) is refused with
/// a message that says so and echoes nothing of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transparent))]
pub struct GrantName(pub String);

impl<'de> Deserialize<'de> for GrantName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = GrantName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("the name of a grant in the operator's catalogue")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<GrantName, E> {
                Ok(GrantName(s.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<GrantName, A::Error> {
                Err(serde::de::Error::custom(
                    "a grant is named, not described: give the name of a grant in the server's \
                     catalogue (e.g. \"grants\": [\"github\"]); a request can never carry a secret \
                     or say where one is read from",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// What to create: a sandbox spec's inputs and its lifetime. `POST /v1/sandboxes`'s body,
/// the creating half of `POST /v1/run`, MCP's create tool and `cordon run`'s flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    /// A tier, or `auto` (the policy picks). Left out: the server's default tier where the
    /// policy allows it for the request's trust and autonomy, else the policy's choice.
    #[serde(default)]
    pub tier: Option<TierChoice>,
    /// Where the code's input came from. A tenant may lower the trust the operator gives
    /// it, never raise it.
    #[serde(default)]
    pub trust: Option<Trust>,
    /// What the code may do. Left out: derived from the request (network when it allows
    /// hosts or names grants).
    #[serde(default)]
    pub autonomy: Option<Autonomy>,
    /// `many-short` (default) or `one-long`.
    #[serde(default)]
    pub shape: Option<Shape>,
    #[serde(default)]
    pub limits: LimitsPatch,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Hosts the sandbox may reach (egress allow-list), within the tenant's egress ceiling.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Hosts always refused.
    #[serde(default)]
    pub deny_hosts: Vec<String>,
    /// Grants of the operator's catalogue, by name.
    #[serde(default)]
    pub grants: Vec<GrantName>,
    #[serde(default)]
    pub allow_weaker: BTreeSet<Weakening>,
    /// A template (`cordon template ls`) the sandbox's root is made from; left out, the
    /// tier's own root.
    #[serde(default)]
    pub template: Option<String>,
    /// Destroyed this long after creation (`"10m"` or seconds).
    #[serde(default)]
    pub ttl: Option<Dur>,
    /// Destroyed after this long without a request.
    #[serde(default)]
    pub idle_timeout: Option<Dur>,
    /// What its TTL or idle timeout does: `destroy` (default) or `pause` (kept paused,
    /// under `sessions.paused_ttl`, until resumed with a TTL of the same length again).
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// The client's own labels (`GET /v1/sandboxes?label=k=v` filters by them); the service
    /// bounds their number and sizes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Volumes of the tenant's to mount (`POST /v1/volumes` makes them), each at a path
    /// under `/work`; read-write for one sandbox at a time, read-only for many.
    #[serde(default)]
    pub volumes: Vec<VolumeRequest>,
    /// Grants the local operator gives inline (`cordon run --grant`); never from a body,
    /// and refused for any principal but the operator.
    #[serde(skip)]
    pub inline_grants: Vec<Grant>,
    /// What the request will run, where the front door knows (a one-shot run): lets the
    /// gate tell pure computation from work that needs a shell.
    #[serde(skip)]
    pub workload: Workload,
}

impl SandboxRequest {
    /// The fields that set a sandbox's life rather than what it is made of. A one-shot run
    /// (whose sandbox lives for its exec) and a warm pool (whose sandboxes' lives are the
    /// creates' that take them) flatten this type and refuse these; a new field of that
    /// kind belongs here too.
    pub const LIFE_FIELDS: [&'static str; 5] =
        ["ttl", "idle_timeout", "on_timeout", "labels", "volumes"];

    /// Those of [`Self::LIFE_FIELDS`] this request gives, in that order. Every field is
    /// named here, so a new one does not compile until it is sorted into one kind or the
    /// other.
    pub fn life_fields_given(&self) -> Vec<&'static str> {
        let SandboxRequest {
            // What the sandbox is made of: a run and a pool take these.
            tier: _,
            trust: _,
            autonomy: _,
            shape: _,
            limits: _,
            env: _,
            allow_hosts: _,
            deny_hosts: _,
            grants: _,
            allow_weaker: _,
            template: _,
            inline_grants: _,
            workload: _,
            // Its life.
            ttl,
            idle_timeout,
            on_timeout,
            labels,
            volumes,
        } = self;
        let given = [
            ttl.is_some(),
            idle_timeout.is_some(),
            !on_timeout.is_destroy(),
            !labels.is_empty(),
            !volumes.is_empty(),
        ];
        Self::LIFE_FIELDS
            .into_iter()
            .zip(given)
            .filter_map(|(f, g)| g.then_some(f))
            .collect()
    }
}

/// What a sandbox's TTL or idle timeout does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// It is destroyed.
    #[default]
    Destroy,
    /// It is paused (to disk where its tier pauses to disk), and destroyed only once it has
    /// stayed paused for `sessions.paused_ttl`; a resume gives it its TTL again from then.
    /// Tiers that pause only (container, gvisor, microvm).
    Pause,
    /// It is paused keeping its files only (E2B's `autoPauseMemory: false`): its processes
    /// end and its memory is let go; a resume starts it again from its files under the same
    /// id. Tiers with filesystem snapshots (container, gvisor).
    #[serde(rename = "pause_files")]
    PauseFiles,
}

impl OnTimeout {
    pub fn is_destroy(&self) -> bool {
        *self == OnTimeout::Destroy
    }
}

/// One volume a create asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct VolumeRequest {
    /// The volume's name.
    pub name: String,
    /// Its mount point: an absolute path under `/work` (`/work/data`), not `/work` itself.
    pub path: String,
    /// Read-only (many sandboxes may mount it so at once); default read-write (one).
    #[serde(default)]
    pub read_only: bool,
}

/// What a request runs, as far as the tier decision cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workload {
    /// A sandbox that will take any exec and file call (a create).
    #[default]
    Session,
    /// One snippet of Python or JavaScript with no files in or out.
    PureCode,
    /// Anything else run once: a shell, a program, files.
    Program,
}

/// The name of a template built for one tenant (through E2B's template API): `t-`, 12 hex
/// digits of the tenant's name's SHA-256, `-`, then `rest`. The gate lets only that tenant
/// (and the local operator) name it.
pub fn tenant_template_name(tenant: &str, rest: &str) -> String {
    format!("t-{}-{rest}", tenant_tag(tenant))
}

fn tenant_tag(tenant: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_bytes());
    hex::encode(&digest[..6])
}

/// Whether `principal` may name template `name`: one built for a tenant is that tenant's
/// alone; every other template is every tenant's.
pub fn may_use_template(principal: &Principal, name: &str) -> bool {
    let Some(tag) = name
        .strip_prefix("t-")
        .and_then(|r| r.get(..12))
        .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
    else {
        return true;
    };
    match principal {
        Principal::Operator => true,
        Principal::Tenant(t) => tenant_tag(t) == tag,
    }
}

#[cfg(test)]
mod template_owner_tests {
    use super::*;

    #[test]
    fn a_tenants_built_template_is_its_own_and_the_operators() {
        let name = tenant_template_name("alice", "3f2c");
        assert!(name.starts_with("t-") && name.ends_with("-3f2c"), "{name}");
        assert!(may_use_template(&Principal::Tenant("alice".into()), &name));
        assert!(may_use_template(&Principal::Operator, &name));
        assert!(!may_use_template(&Principal::Tenant("bob".into()), &name));
        // Every other template is every tenant's.
        assert!(may_use_template(&Principal::Tenant("bob".into()), "py"));
        assert!(may_use_template(
            &Principal::Tenant("bob".into()),
            "t-short"
        ));
    }
}
