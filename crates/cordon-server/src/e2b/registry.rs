//! The E2B template builds' records: each tenant's templates (aliases, tags, the builds
//! they name, kept across restarts in `<data dir>/e2b-templates.json`) and this run's
//! builds (status, log). The routes that change them are in `builds`.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::keys::Tenant;

pub(super) fn lock(m: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
/// The builds of every tenant, and the templates they made.
pub(crate) struct Builds {
    pub(super) state: Mutex<Registry>,
    /// Builds running at once, server-wide (`e2b.builds`).
    pub(super) slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Where the templates are kept across restarts (`<data dir>/e2b-templates.json`).
    pub(super) file: PathBuf,
}

#[derive(Default)]
pub(super) struct Registry {
    /// By template id (kept across restarts).
    pub(super) templates: BTreeMap<String, TemplateRec>,
    /// By build id (this run's: their status and logs).
    pub(super) builds: BTreeMap<String, BuildRec>,
    /// Upload links: token to (tenant, template, files hash) and when it stops being good.
    pub(super) links: BTreeMap<String, Link>,
    /// Builds asked so far (their order).
    pub(super) asked: u64,
}

/// The most finished builds' records (status, log) kept per tenant; older ones go.
pub(super) const FINISHED_KEPT: usize = 20;
/// The most tags one template may have.
pub(super) const MAX_TAGS: usize = 20;
/// The most log bytes one build keeps.
pub(super) const MAX_LOG_BYTES: usize = 1 << 20;

pub(super) struct Link {
    pub(super) tenant: Tenant,
    pub(super) template_id: String,
    pub(super) hash: String,
    pub(super) until: SystemTime,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TemplateRec {
    pub(super) tenant: String,
    pub(super) alias: String,
    /// Tag to the build it names.
    #[serde(default)]
    pub(super) tags: BTreeMap<String, Built>,
    /// The newest ready build: what the alias alone means when no `default` tag is.
    #[serde(default)]
    pub(super) latest: Option<Built>,
    /// Every Cordon template of its builds still in the store.
    #[serde(default)]
    pub(super) kept: std::collections::BTreeSet<String>,
}

/// A ready build as a tag names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Built {
    pub(super) build: String,
    /// Its Cordon template.
    pub(super) name: String,
    /// When the tag was given (ms since the epoch).
    pub(super) at_ms: i64,
}

impl TemplateRec {
    pub(super) fn of(&self, t: &Tenant) -> bool {
        self.tenant == t.0
    }

    /// The Cordon templates of its builds no tag (nor `latest`) names: they are removed.
    pub(super) fn unreferenced(&mut self) -> Vec<String> {
        let named: std::collections::BTreeSet<&String> = (self.tags.values())
            .chain(self.latest.iter())
            .map(|b| &b.name)
            .collect();
        let gone: Vec<String> = (self.kept.iter())
            .filter(|n| !named.contains(n))
            .cloned()
            .collect();
        for n in &gone {
            self.kept.remove(n);
        }
        gone
    }
}

pub(super) struct BuildRec {
    pub(super) tenant: Tenant,
    pub(super) template_id: String,
    /// Its place in the order builds were asked.
    pub(super) seq: u64,
    /// Bytes its log keeps.
    pub(super) log_bytes: usize,
    /// Whether its start was asked (once only).
    pub(super) started: bool,
    /// The Cordon template it makes (the tenant's alone).
    pub(super) name: String,
    /// Tags given when it was asked, assigned when it is ready.
    pub(super) tags: Vec<String>,
    pub(super) memory_mb: u64,
    pub(super) status: Status,
    pub(super) logs: Vec<LogLine>,
    /// Lines past [`MAX_LOG_LINES`], not kept.
    pub(super) dropped: usize,
    pub(super) reason: Option<Reason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct LogLine {
    pub(super) timestamp: String,
    pub(super) level: &'static str,
    pub(super) message: String,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Reason {
    pub(super) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) step: Option<String>,
}

impl Builds {
    /// The builds of a server whose data dir is `data_dir`, with the templates built before
    /// it last stopped.
    pub(crate) fn new(slots: usize, data_dir: &FsPath) -> Builds {
        let file = data_dir.join("e2b-templates.json");
        let templates = match std::fs::read(&file) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(
                    "{} is unreadable ({e}); its templates are not served",
                    file.display()
                );
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Builds {
            state: Mutex::new(Registry {
                templates,
                ..Registry::default()
            }),
            slots: (slots > 0).then(|| Arc::new(tokio::sync::Semaphore::new(slots))),
            file,
        }
    }

    /// Writes the templates for the next start (through a file renamed into place).
    pub(super) fn save(&self, st: &Registry) {
        let tmp = self.file.with_extension("json.tmp");
        let written = serde_json::to_vec(&st.templates)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&b)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &self.file));
        if let Err(e) = written {
            tracing::warn!("keeping the E2B templates in {}: {e}", self.file.display());
        }
    }

    /// The Cordon template an E2B name of one of `t`'s built templates means: `alias`,
    /// `alias:tag` or the template's id, at the tag given (`default` when none), else at
    /// its newest ready build. `None`: no template of `t`'s has that name.
    pub(crate) fn template_for(&self, t: &Tenant, name: &str) -> Option<String> {
        let st = lock(&self.state);
        let (alias, tag) = split_tag(name);
        let (_, rec) = st.find(t, alias)?;
        let built = match tag {
            Some(tag) => rec.tags.get(tag)?,
            None => rec.tags.get("default").or(rec.latest.as_ref())?,
        };
        Some(built.name.clone())
    }

    /// Whether `t` has a built template of that alias or id (`Template.exists`).
    pub(crate) fn template_id(&self, t: &Tenant, name: &str) -> Option<String> {
        let st = lock(&self.state);
        st.find(t, split_tag(name).0).map(|(id, _)| id.to_string())
    }
}

impl Registry {
    pub(super) fn find(&self, t: &Tenant, alias_or_id: &str) -> Option<(&str, &TemplateRec)> {
        self.templates
            .iter()
            .find(|(id, r)| r.of(t) && (r.alias == alias_or_id || id.as_str() == alias_or_id))
            .map(|(id, r)| (id.as_str(), r))
    }

    /// Forgets `t`'s oldest finished builds past [`FINISHED_KEPT`] (their status and log).
    pub(super) fn prune_finished(&mut self, t: &Tenant) {
        let mut done: Vec<(u64, String)> = (self.builds.iter())
            .filter(|(_, b)| b.tenant == *t && matches!(b.status, Status::Ready | Status::Error))
            .map(|(k, b)| (b.seq, k.clone()))
            .collect();
        if done.len() <= FINISHED_KEPT {
            return;
        }
        done.sort();
        for (_, k) in &done[..done.len() - FINISHED_KEPT] {
            self.builds.remove(k);
        }
    }
}

/// `alias:tag` to its parts (`team/alias` names the alias).
pub(super) fn split_tag(name: &str) -> (&str, Option<&str>) {
    let name = name.rsplit('/').next().unwrap_or(name);
    match name.split_once(':') {
        Some((a, t)) => (a, Some(t)),
        None => (name, None),
    }
}

/// An alias or a tag as E2B takes them: lowercase letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit, at most 63 bytes.
pub(super) fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
