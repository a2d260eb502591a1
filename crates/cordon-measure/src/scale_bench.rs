//! `cordon serve --bench --scale 10,1000,N`: what a create, an exec and a destroy cost with
//! that many sandboxes of one tier live on a server in this process (issue 49), what a live
//! sandbox costs the host's memory, the server's RSS, and that destroying them all leaves
//! nothing behind (processes, cgroups, mounts, id ranges, files).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cordon_core::Tier;
use cordon_server::Server;

use crate::Tiers;
use crate::serve_bench::Client;

/// Each level's sampled create, exec and destroy round trips.
const SAMPLES: usize = 40;
/// The memory limit of every sandbox (as in the issue's figures).
const MEMORY: u64 = 16 << 20;
/// Clients filling the server at once.
const FILLERS: usize = 4;

/// Measures `tier` at each live count of `levels` (ascending), then destroys every sandbox
/// and checks what is left. Exits 1 when something is left behind.
pub fn bench(levels: &[usize], tier: Tier, tiers: &Tiers) -> Result<i32> {
    let most = levels.iter().copied().max().unwrap_or(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = std::env::temp_dir().join(format!("cordon-scale-bench-{}", std::process::id()));
    let (mut cfg, key) = crate::serve_bench::bench_config(&dir)?;
    // Set, so a descriptor limit that cannot hold them refuses at start and says why.
    cfg.sessions.max_sandboxes = most + FILLERS + 1;
    cfg.sessions.max_sandboxes_set = true;
    cfg.sessions.max_sandboxes_per_tenant = most + FILLERS + 1;
    // Idle sandboxes use a fraction of their limit: the operator's overcommit, said below.
    cfg.budgets.max_memory = Some(cordon_core::units::Size(MEMORY * (most as u64 + 16)));
    let backends = tiers.server_backends(&dir);
    let server = rt
        .block_on(Server::start(cfg, backends, None))
        .context("starting the server (a descriptor limit too low says here what it holds)")?;
    let before = Leftovers::now(&dir);
    println!(
        "{tier} sandboxes of {} MiB, {SAMPLES} sampled create/exec/destroy round trips per level, server in this process",
        MEMORY >> 20
    );
    println!("{}", server.service().capacity());
    println!(
        "{:>7} {:>17} {:>17} {:>17} {:>13} {:>11}",
        "live", "create p50/p99", "exec p50/p99", "destroy p50/p99", "mem/sandbox", "server RSS"
    );
    let result = run_levels(&server, levels, tier, &key, before.mem_available);
    let mut c = Client::connect(server.addr(), &key)?;
    let ids = list(&mut c)?;
    let t = Instant::now();
    destroy_all(server.addr(), &key, &ids)?;
    let took = t.elapsed();
    // Destroys answer before the last of their teardown ends; what is left is counted
    // once none is under way.
    let settle = Instant::now() + Duration::from_secs(120);
    while server.service().destroys_in_flight() > 0 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = Leftovers::now(&dir).minus(&before);
    rt.block_on(server.shutdown());
    println!(
        "destroyed {} live sandboxes in {:.1} s ({:.2} ms each)",
        ids.len(),
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / ids.len().max(1) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!("left behind: {left}");
    result?;
    Ok(if left.is_empty() { 0 } else { 1 })
}

fn run_levels(
    server: &Server,
    levels: &[usize],
    tier: Tier,
    key: &str,
    mem_before: u64,
) -> Result<()> {
    let create = create_body(tier);
    let mut c = Client::connect(server.addr(), key)?;
    let mut live = list(&mut c)?.len();
    for &level in levels {
        if level > live {
            let busy = fill(server.addr(), key, &create, level - live)?;
            live = level;
            if busy > 0 {
                println!(
                    "(filling to {level}: {busy} creates refused as busy, each tried again after 1 s)"
                );
            }
            // A connection idle through a long fill may have been closed by the server.
            c = Client::connect(server.addr(), key)?;
        }
        let ids = list(&mut c)?;
        if let Some(id) = ids.first()
            && !cgroup_dirs().iter().any(|d| d.contains(id.as_str()))
        {
            println!(
                "(no cgroup is named by sandbox {id}: the check of what is left cannot see cgroups)"
            );
        }
        let (mut creates, mut execs, mut destroys) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..SAMPLES {
            let t = Instant::now();
            let id = create_one(&mut c, &create)?;
            creates.push(t.elapsed());
            // An exec in a sandbox that was live before (spread over them), and one in
            // the new one when none was.
            let target = if ids.is_empty() {
                id.clone()
            } else {
                ids[(i * 7919) % ids.len()].clone()
            };
            let t = Instant::now();
            let (s, b) = c.post(
                &format!("/v1/sandboxes/{target}/exec"),
                r#"{"argv":["true"]}"#,
            )?;
            execs.push(t.elapsed());
            if s != 200 {
                bail!("exec failed at {level} live ({s}): {b}");
            }
            let t = Instant::now();
            destroy(&mut c, &id)?;
            destroys.push(t.elapsed());
        }
        let mem = mem_before.saturating_sub(mem_available()) / level.max(1) as u64;
        println!(
            "{level:>7} {:>17} {:>17} {:>17} {:>9.1} MiB {:>7.0} MiB",
            p50_p99(&mut creates),
            p50_p99(&mut execs),
            p50_p99(&mut destroys),
            mem as f64 / (1 << 20) as f64,
            rss() as f64 / (1 << 20) as f64
        );
    }
    println!(
        "mem/sandbox = the host's MemAvailable before the first create less now, over the live count; \
         server RSS = this process's (the server and these clients)"
    );
    Ok(())
}

fn create_body(tier: Tier) -> String {
    format!(
        r#"{{"tier":"{tier}","ttl":"1h","idle_timeout":"1h","limits":{{"memory_bytes":{MEMORY}}}}}"#
    )
}

/// Every sandbox this run created: what is left behind is looked for by these names.
static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The most times one create of a fill is tried again after a busy refusal.
const BUSY_TRIES: usize = 10;

/// A create of a fill: a busy refusal (429 or 503, with the server's reason) is tried again
/// after a pause, as a client told to retry does, at most [`BUSY_TRIES`] times. Returns how
/// many refusals there were.
fn create_retrying(c: &mut Client, body: &str) -> Result<usize> {
    for busy in 0..BUSY_TRIES {
        match create_one(c, body) {
            Err(e) if e.downcast_ref::<Busy>().is_some() => {
                std::thread::sleep(Duration::from_secs(1));
            }
            other => return other.map(|_| busy),
        }
    }
    create_one(c, body).map(|_| BUSY_TRIES)
}

/// A create refused as busy: the server asked to try again later.
#[derive(Debug, thiserror::Error)]
#[error("create refused as busy ({0}): {1}")]
struct Busy(u16, String);

fn create_one(c: &mut Client, body: &str) -> Result<String> {
    let (s, b) = c.post("/v1/sandboxes", body)?;
    if s == 429 || s == 503 {
        return Err(Busy(s, b).into());
    }
    if s != 201 {
        bail!("create failed ({s}): {b}");
    }
    let id = serde_json::from_str::<Created>(&b)
        .with_context(|| format!("the create response has no id: {b}"))?
        .id;
    CREATED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(id.clone());
    Ok(id)
}

fn destroy(c: &mut Client, id: &str) -> Result<()> {
    let (s, b) = c.send("DELETE", &format!("/v1/sandboxes/{id}"), "")?;
    if !(200..300).contains(&s) {
        bail!("destroy of {id} failed ({s}): {b}");
    }
    Ok(())
}

/// Creates `n` sandboxes with [`FILLERS`] clients at once; returns how many creates were
/// refused as busy and tried again.
fn fill(addr: std::net::SocketAddr, key: &str, body: &str, n: usize) -> Result<usize> {
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..FILLERS)
            .map(|w| {
                let share = n / FILLERS + usize::from(w < n % FILLERS);
                s.spawn(move || -> Result<usize> {
                    let mut c = Client::connect(addr, key)?;
                    (0..share).try_fold(0, |busy, _| Ok(busy + create_retrying(&mut c, body)?))
                })
            })
            .collect();
        workers.into_iter().try_fold(0, |busy, w| {
            Ok(busy
                + w.join()
                    .map_err(|_| anyhow::anyhow!("a filling client panicked"))??)
        })
    })
}

/// Destroys `ids` with [`FILLERS`] clients at once.
fn destroy_all(addr: std::net::SocketAddr, key: &str, ids: &[String]) -> Result<()> {
    std::thread::scope(|s| {
        let workers: Vec<_> = ids
            .chunks(ids.len().div_ceil(FILLERS).max(1))
            .map(|chunk| {
                s.spawn(move || -> Result<()> {
                    let mut c = Client::connect(addr, key)?;
                    chunk.iter().try_for_each(|id| destroy(&mut c, id))
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .map_err(|_| anyhow::anyhow!("a destroying client panicked"))?
        })
    })
}

#[derive(serde::Deserialize)]
struct Created {
    id: String,
}

#[derive(serde::Deserialize)]
struct Listed {
    sandboxes: Vec<Created>,
}

fn list(c: &mut Client) -> Result<Vec<String>> {
    let (s, b) = c.send("GET", "/v1/sandboxes", "")?;
    if s != 200 {
        bail!("list failed ({s}): {b}");
    }
    let listed: Listed =
        serde_json::from_str(&b).with_context(|| format!("the list is not a list: {b}"))?;
    Ok(listed.sandboxes.into_iter().map(|c| c.id).collect())
}

fn p50_p99(v: &mut [Duration]) -> String {
    v.sort();
    let at = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    format!("{:.1} / {:.1} ms", at(0.5), at(0.99))
}

/// A `/proc/meminfo` or `/proc/self/status` figure in bytes (its lines say kB).
fn kb_line(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mem_available() -> u64 {
    kb_line("/proc/meminfo", "MemAvailable:")
}

fn rss() -> u64 {
    kb_line("/proc/self/status", "VmRSS:")
}

/// What a live sandbox holds on the host, where it would be left: each a set of names, so
/// what is left is what appeared since the first snapshot (another program's sandboxes on
/// the same host show up by name, not as a bare count).
#[derive(Debug, Clone, Default)]
struct Leftovers {
    /// This process's descendants (pids).
    processes: BTreeSet<String>,
    /// Directories under each cgroup hierarchy's `cordon/`.
    cgroups: BTreeSet<String>,
    /// Mount points of the host's mount table (Cordon's and the data dir's: other
    /// programs mount and unmount meanwhile).
    mounts: BTreeSet<String>,
    /// This process's descriptors on files under /run/cordon (id-range leases).
    leases: BTreeSet<String>,
    /// Entries under the data dir's scratch and under /run/cordon (but the id pools'
    /// files, which stay to be leased again: `ids`, `oci-ids`, `qemu-uids`, ...).
    files: BTreeSet<String>,
    mem_available: u64,
}

impl Leftovers {
    fn now(data_dir: &Path) -> Self {
        let mut files = entries(&data_dir.join("scratch"), 2);
        files.extend(
            entries(Path::new("/run/cordon"), 2)
                .into_iter()
                .filter(|p| !is_id_pool(p)),
        );
        Leftovers {
            processes: descendants(std::process::id()),
            cgroups: cgroup_dirs(),
            mounts: std::fs::read_to_string("/proc/1/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
                .filter(|m| m.contains("cordon") || m.starts_with(&*data_dir.to_string_lossy()))
                .collect(),
            leases: std::fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| std::fs::read_link(e.path()).ok())
                        .map(|p| p.display().to_string())
                        .filter(|p| p.starts_with("/run/cordon/"))
                        .collect()
                })
                .unwrap_or_default(),
            files,
            mem_available: mem_available(),
        }
    }

    /// What appeared since `before`: processes of this one, the rest naming a sandbox this
    /// run created (another program's sandboxes and mounts come and go meanwhile).
    fn minus(&self, before: &Leftovers) -> Leftovers {
        let ours = CREATED.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let new = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> BTreeSet<String> {
            a.difference(b)
                .filter(|p| ours.iter().any(|id| p.contains(id.as_str())))
                .cloned()
                .collect()
        };
        Leftovers {
            processes: self
                .processes
                .difference(&before.processes)
                .cloned()
                .collect(),
            cgroups: new(&self.cgroups, &before.cgroups),
            mounts: new(&self.mounts, &before.mounts),
            leases: self.leases.difference(&before.leases).cloned().collect(),
            files: new(&self.files, &before.files),
            mem_available: self.mem_available,
        }
    }

    fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.cgroups.is_empty()
            && self.mounts.is_empty()
            && self.leases.is_empty()
            && self.files.is_empty()
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let some = |s: &BTreeSet<String>| s.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        write!(
            f,
            "{} processes, {} cgroups, {} mounts, {} id-range leases, {} files",
            self.processes.len(),
            self.cgroups.len(),
            self.mounts.len(),
            self.leases.len(),
            self.files.len()
        )?;
        for (what, set) in [
            ("processes", &self.processes),
            ("cgroups", &self.cgroups),
            ("mounts", &self.mounts),
            ("leases", &self.leases),
            ("files", &self.files),
        ] {
            if !set.is_empty() {
                write!(f, "; {what}: {}", some(set))?;
            }
        }
        Ok(())
    }
}

/// Whether `path` is in one of /run/cordon's id pools.
fn is_id_pool(path: &str) -> bool {
    path.strip_prefix("/run/cordon/")
        .and_then(|p| p.split('/').next())
        .is_some_and(|pool| pool.ends_with("ids"))
}

/// Paths under `dir`, `depth` levels down.
fn entries(dir: &Path, depth: usize) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if depth == 0 {
        return out;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.insert(e.path().display().to_string());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(entries(&e.path(), depth - 1));
        }
    }
    out
}

/// Sandbox cgroups: the directories under `cordon/` of every mounted hierarchy.
fn cgroup_dirs() -> BTreeSet<String> {
    let mut out = entries(Path::new("/sys/fs/cgroup/cordon"), 1);
    for root in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        out.extend(entries(&root.path().join("cordon"), 1));
    }
    out
}

/// The processes that descend from `pid` (from each process's parent in /proc/N/stat).
fn descendants(pid: u32) -> BTreeSet<String> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let child: u32 = e.file_name().to_str()?.parse().ok()?;
                    let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                    // The parent is the second field after the command's closing parenthesis.
                    let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
                    Some((child, ppid.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut i = 0;
    while let Some(&p) = found.get(i) {
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.iter().skip(1).map(u32::to_string).collect()
}
