//! The running runsc sandbox: starting it with the agent, stopping it, and reaching it
//! (its agent channel, runsc's verbs on it).

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cordon_core::{Error, Result};
use cordon_guest::proto::{PROTOCOL_VERSION, Reply, Request};
use cordon_host::agent::{AgentConn, CallError, HEADER_ROOM};
use cordon_host::cgroup::{Limits, SandboxCgroup};

use crate::nproc::{self, NprocWatch};
use crate::runsc::{force_delete, has_state, quiet, runsc_base};
use crate::{CGROUP_PARENT, GvisorSandbox, Live, STDERR_TAIL, reap, sys};

impl GvisorSandbox {
    /// Where each start's cgroup is made: the configured parent (a pod's), else Cordon's.
    fn cgroup_parent(&self) -> &str {
        self.config
            .cgroup_parent
            .as_deref()
            .unwrap_or(CGROUP_PARENT)
    }

    /// Starts the runsc sandbox with the agent and waits for its hello.
    pub(crate) fn start_live(&mut self) -> Result<()> {
        self.start_live_from(None)
    }

    /// As [`Self::start_live`], or, with `restore` (a `runsc checkpoint` image), restores
    /// the runsc sandbox from it: its agent is already past its hello, so a hello is sent
    /// to it instead and its answer awaited.
    pub(crate) fn start_live_from(&mut self, restore: Option<&Path>) -> Result<()> {
        self.starts += 1;
        let cid = format!("{}-{}", self.id.as_str(), self.starts);
        let cgroup = self.make_cgroup(&cid)?;
        let remove_cgroup = |cg: &Option<SandboxCgroup>| {
            if let Some(cg) = cg {
                cg.remove_everywhere(Duration::from_secs(2));
            }
        };
        let cfg = match self.config(cgroup.as_ref()).and_then(|c| {
            serde_json::to_vec(&c).map_err(|e| Error::failed("encoding config.json", e))
        }) {
            Ok(c) => c,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(e);
            }
        };
        if let Err(e) = write_private(&self.bundle.join("config.json"), &cfg) {
            remove_cgroup(&cgroup);
            return Err(Error::io("writing config.json", e));
        }
        let log = self.bundle.join(format!("sentry-{}.log", self.starts));
        let watch = match NprocWatch::start(&log) {
            Ok(w) => w,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(Error::failed("watching the sandbox's process limit", e));
            }
        };
        let mut cmd = self.runsc_flags(cgroup.is_some());
        cmd.arg(format!("--debug-log={}", log.display()))
            .args(["--debug-command=boot", "--strace"])
            .arg(format!("--strace-syscalls={}", nproc::TRACED));
        match restore {
            None => cmd.arg("run"),
            Some(image) => cmd.args(["restore", "--image-path"]).arg(image),
        };
        cmd.arg("--bundle")
            .arg(&self.bundle)
            .arg(&cid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        sys::die_with_parent(&mut cmd);
        // runsc outlives this call: it is tied to a thread that lives as long as the
        // process, not to the (possibly short-lived) thread that creates the sandbox.
        let mut runsc = match cordon_host::spawn_tied(cmd) {
            Ok(c) => c,
            Err(e) => {
                remove_cgroup(&cgroup);
                return Err(Error::io("starting runsc", e));
            }
        };
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = runsc.stderr.take() {
            keep_tail(err, stderr.clone());
        }
        let conn = match (runsc.stdout.take(), runsc.stdin.take()) {
            (Some(out), Some(inp)) => AgentConn::pipes(OwnedFd::from(out), OwnedFd::from(inp))
                .map_err(|e| Error::io("the agent's channel", e)),
            _ => Err(Error::Sandbox("runsc was started without its pipes".into())),
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                let _ = runsc.kill();
                let _ = runsc.wait();
                remove_cgroup(&cgroup);
                return Err(e);
            }
        };
        self.live = Some(Live {
            cid,
            runsc,
            conn,
            cgroup,
            watch,
            stderr,
            paused: false,
        });
        self.await_hello(restore.is_some())
    }

    /// The cgroup of one start (named `cid`): memory (swap off) and the CPU quota; none
    /// when the sandbox runs without cgroups.
    fn make_cgroup(&self, cid: &str) -> Result<Option<SandboxCgroup>> {
        let l = self.spec.limits.clone();
        // Memory (swap off) and the CPU quota; no pids controller: processes are bounded by
        // RLIMIT_NPROC inside (a pids cgroup crashes runsc).
        let limits = Limits {
            memory: l.memory_bytes,
            pids: None,
            cpus: l.cpus,
        };
        Ok(if self.cgroups {
            Some(
                SandboxCgroup::create_in(self.cgroup_parent(), cid, &limits).map_err(|e| {
                    Error::LayerUnavailable {
                        layer: "cgroups".into(),
                        reason: e.to_string(),
                    }
                })?,
            )
        } else {
            None
        })
    }

    /// Waits for the started agent's hello (a restored one is asked for it: it said hello
    /// to its source's host long ago); on anything else the sandbox is stopped and the
    /// error says why, runsc's own words going to the log only.
    fn await_hello(&mut self, restored: bool) -> Result<()> {
        let deadline = Instant::now() + self.config.start_timeout;
        let hello = match self.live.as_mut() {
            // A restored agent said hello to its source's host long ago: it answers one.
            Some(live) if restored => live
                .conn
                .send(
                    &Request::Hello {
                        version: PROTOCOL_VERSION,
                    },
                    b"",
                    deadline,
                )
                .and_then(|()| live.conn.recv(deadline, HEADER_ROOM)),
            Some(live) => live.conn.recv(deadline, HEADER_ROOM),
            None => Err(CallError::Closed),
        };
        let failed = match hello.map(|f| f.header) {
            Ok(Reply::Hello { version, .. }) if version == PROTOCOL_VERSION => return Ok(()),
            Ok(Reply::Ok) if restored => return Ok(()),
            Ok(Reply::Hello { version, .. }) => format!(
                "the sandbox agent speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild both from one source tree"
            ),
            Ok(other) => format!("an unexpected first message from the sandbox agent ({other:?})"),
            Err(CallError::Timeout) => format!(
                "runsc did not start the sandbox within {} s",
                self.config.start_timeout.as_secs()
            ),
            Err(e) => format!("the sandbox did not come up ({e})"),
        };
        let detail = self.stop_live();
        tracing::warn!(sandbox = %self.id, "gvisor: {failed}; runsc said: {detail}");
        // runsc's own words may name host paths: they go to the log, the tenant gets this
        // message (with no source to keep).
        Err(Error::Sandbox(format!(
            "{failed}; see `cordon doctor` (runsc's own message is in the server log)"
        )))
    }

    /// runsc's command line with the flags every call on this sandbox's container repeats
    /// (`runsc checkpoint --leave-running` needs those of its `run`).
    /// Whether the sandbox joins a pod's network namespace (`GvisorConfig::netns`).
    pub(crate) fn joins_pod(&self) -> bool {
        self.config.netns.is_some()
    }

    pub(crate) fn runsc_flags(&self, cgroup: bool) -> std::process::Command {
        let mut cmd = runsc_base(&self.config);
        if self.joins_pod() {
            // The last --network wins: the sentry on the pod's namespace's host network.
            cmd.arg("--network=host");
        }
        // Lets the gofer open host unix sockets the sandbox can see: only those in the one
        // directory bound read-only at /run/cordon (the egress proxy's, and those the host
        // listens on for a connection to a port of the sandbox).
        cmd.arg("--host-uds=open");
        if !cgroup {
            cmd.arg("--ignore-cgroups");
        }
        if self.spec.resolved_template.is_some() {
            // The template's root stays as it is on the host: the sandbox's writes to it go
            // to an overlay upper in the sentry's memory, charged to the sandbox's cgroup.
            cmd.arg("--overlay2=root:memory");
        }
        cmd
    }

    /// Ends the runsc sandbox (every process in it) and removes its runsc state and
    /// cgroup. Returns the tail of what runsc wrote on stderr.
    pub(crate) fn stop_live(&mut self) -> String {
        self.stop_live_with(false)
    }

    /// As [`Self::stop_live`]; `graceful` first asks a healthy agent to shut down, which
    /// ends the container and lets `runsc run` remove it itself (two fewer runsc starts
    /// than a kill and a forced delete).
    pub(crate) fn stop_live_with(&mut self, graceful: bool) -> String {
        let Some(live) = self.live.take() else {
            return String::new();
        };
        let Live {
            cid,
            mut runsc,
            mut conn,
            cgroup,
            watch,
            stderr,
            paused,
        } = live;
        if paused {
            // A paused sandbox is resumed first: its processes take the kill then.
            let mut p = runsc_base(&self.config);
            p.arg("resume").arg(&cid);
            let _ = quiet(p).status();
        }
        let t = Instant::now();
        if graceful && matches!(runsc.try_wait(), Ok(None)) {
            let by = Instant::now() + Duration::from_millis(500);
            if conn.send(&Request::Shutdown, b"", by).is_ok() {
                drop(conn);
                let until = Instant::now() + Duration::from_secs(2);
                while matches!(runsc.try_wait(), Ok(None)) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        let exited_us = t.elapsed().as_micros() as u64;
        let forced = matches!(runsc.try_wait(), Ok(None)) || has_state(&self.config, &cid);
        if forced {
            force_delete(&self.config, &cid);
        }
        let deleted_us = t.elapsed().as_micros() as u64;
        let _ = runsc.kill();
        let _ = runsc.wait();
        reap::remove_lock(&self.config.state_root, &cid);
        watch.finish();
        if let Some(cg) = &cgroup
            && !cg.remove_everywhere(Duration::from_secs(5))
        {
            tracing::warn!(cgroup = %cg.oci_path(), "could not remove a sandbox cgroup; the next create reaps it");
        }
        tracing::debug!(%cid, graceful, exited_us, forced, deleted_us, done_us = t.elapsed().as_micros() as u64, "gvisor: runsc sandbox stopped");
        let tail = stderr.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&tail).trim().to_string()
    }

    /// `/work`, whose file calls run confined to it.
    pub(crate) fn workspace(&self) -> Result<&cordon_guest::confined::ConfinedWorkspace> {
        match (&self.workspace, self.destroyed) {
            (Some(w), false) => Ok(w),
            _ => Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            }),
        }
    }
}

/// Writes a file only root can read (config.json carries the environment and placeholders).
pub(crate) fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

/// Keeps the last [`STDERR_TAIL`] bytes of `r` (runsc's and the agent's stderr) on a
/// thread of its own, so the pipe never fills.
pub(crate) fn keep_tail(mut r: impl Read + Send + 'static, tail: Arc<Mutex<Vec<u8>>>) {
    let spawned = std::thread::Builder::new()
        .name("gvisor-stderr".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(PoisonError::into_inner);
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("gvisor: no thread to read runsc's stderr: {e}");
    }
}

impl GvisorSandbox {
    /// The live sandbox while its runsc runs; `Gone` once destroyed, and `idle`'s message
    /// when runsc is not running.
    pub(crate) fn running_live(&mut self, idle: impl FnOnce() -> String) -> Result<&mut Live> {
        if self.destroyed {
            return Err(Error::Gone {
                id: self.id.as_str().into(),
                reason: "destroyed".into(),
            });
        }
        let running = self
            .live
            .as_mut()
            .is_some_and(|l| matches!(l.runsc.try_wait(), Ok(None)));
        self.live
            .as_mut()
            .filter(|_| running)
            .ok_or_else(|| Error::Invalid(idle()))
    }

    /// `runsc pause` or `runsc resume` on the running sandbox.
    pub(crate) fn runsc_on_live(&mut self, verb: &str) -> Result<()> {
        let mut p = runsc_base(&self.config);
        let live =
            self.running_live(|| format!("the sandbox is not running; nothing to {verb}"))?;
        p.arg(verb).arg(&live.cid);
        match quiet(p).status() {
            Ok(st) if st.success() => {
                live.paused = verb == "pause";
                Ok(())
            }
            // An exit status is no error of its own (`ExitStatusError` is unstable).
            Ok(st) => Err(Error::Sandbox(format!(
                "runsc {verb} failed ({st}); see the server log"
            ))),
            Err(e) => Err(Error::io(format!("running runsc {verb}"), e)),
        }
    }
}
