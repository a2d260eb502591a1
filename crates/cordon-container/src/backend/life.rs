//! A container sandbox's life: its start, its agent channel and its teardown.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use cordon_core::{Error, ExecRequest, Result, Sandbox};
use cordon_guest::proto::{self, PROTOCOL_VERSION, Reply, Request};
use cordon_host::agent::{self, AgentConn, Filled};
use cordon_host::files::{Answer, ConnIo};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::init::InitJoin;

use super::{ContainerConfig, ContainerSandbox, unexpected_reply};

impl ContainerSandbox {
    /// Sends the init its join and waits for the agent's hello.
    pub(super) fn start(&mut self, cfg: &ContainerConfig, join: &InitJoin) -> Result<()> {
        let Some(host) = self.init_sock.take() else {
            return Err(Error::Sandbox("the sandbox init was not started".into()));
        };
        let mut host = host;
        proto::write_frame(&mut host, join, b"")
            .map_err(|e| Error::failed("sending the join", e))?;
        if join.end.is_some() {
            // The init ends the sandbox once this process is gone, holding its ids until
            // then: it gets the lease's descriptor right after the join.
            let lease = self
                .ids
                .as_ref()
                .ok_or_else(|| Error::Sandbox("the sandbox has no host ids".into()))?
                .lock_holder()
                .map_err(|e| Error::io("sharing the id lease", e))?;
            crate::init::send_fds(&host, &[lease])
                .map_err(|e| Error::io("sending the id lease", e))?;
        }
        host.set_read_timeout(Some(cfg.start_timeout))
            .map_err(|e| Error::io("agent socket", e))?;
        let hello = proto::read_frame::<Reply>(&mut host);
        host.set_read_timeout(None)
            .map_err(|e| Error::io("agent socket", e))?;
        match hello {
            Ok(f) => match f.header {
                Reply::Hello { version, .. } if version == PROTOCOL_VERSION => {}
                // A mismatch and the init's own words: messages, with no error to keep.
                Reply::Hello { version, .. } => {
                    return Err(Error::Sandbox(format!(
                        "sandbox init speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild both from one source tree"
                    )));
                }
                Reply::Error { message, .. } => {
                    return Err(Error::Sandbox(format!(
                        "the sandbox could not be built: {message}"
                    )));
                }
                other => {
                    return Err(unexpected_reply(
                        "unexpected first message from the sandbox",
                        &other,
                    ));
                }
            },
            // The read timed out: the init is alive but the host did not get it through its
            // setup in time (it is overloaded). Retryable, and said so, not a bare EAGAIN.
            Err(proto::ProtoError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Busy {
                    what: format!(
                        "the sandbox did not come up within {:.0} s: this host is too busy to \
                         start one now; retry later, or destroy idle sandboxes",
                        cfg.start_timeout.as_secs_f64()
                    ),
                    retry_after_secs: 5,
                });
            }
            Err(e) => return Err(Error::failed("the sandbox did not come up", e)),
        }
        self.ctrl = Some(AgentConn::new(host).map_err(|e| Error::io("agent socket", e))?);
        Ok(())
    }

    /// Why the sandbox can no longer be used.
    pub(super) fn gone_error(&self) -> Error {
        Error::Gone {
            id: self.id.to_string(),
            reason: self.gone.clone().unwrap_or_else(|| "destroyed".into()),
        }
    }

    pub(super) fn ctrl(&mut self) -> Result<&mut AgentConn> {
        if self.gone.is_some() || self.ctrl.is_none() {
            return Err(self.gone_error());
        }
        self.ctrl
            .as_mut()
            .ok_or_else(|| Error::Sandbox("no agent channel".into()))
    }

    /// Sends one request and waits for its single reply (file operations), all of the call
    /// bounded by one deadline. An agent that misses it (stuck, or stopped) leaves the
    /// sandbox failed: it is torn down, and every later call says so.
    pub(super) fn call(
        &mut self,
        req: &Request,
        body: &[u8],
        max_reply: usize,
    ) -> Result<proto::Frame<Reply>> {
        let limit = self.call_timeout;
        let deadline = Instant::now() + limit;
        let ctrl = self.ctrl()?;
        let reply = ctrl
            .send(req, body, deadline)
            .and_then(|()| ctrl.recv(deadline, max_reply.saturating_add(agent::HEADER_ROOM)));
        reply.map_err(|e| self.channel_failed(e))
    }

    /// The workspace's size limit (what a snapshot of it may hold at most).
    pub(crate) fn disk_limit(&self) -> u64 {
        self.spec.limits.disk_bytes
    }

    /// Its processes are frozen (its agent too: no file call is answered until a resume).
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// One file call of several frames (directory operations, archives), each frame sent
    /// or received within the call deadline; a channel failure ends the sandbox as in
    /// [`Self::call`].
    pub(crate) fn file_call<T>(
        &mut self,
        f: impl FnOnce(&mut ConnIo<'_>) -> Answer<T>,
    ) -> Result<T> {
        let timeout = self.call_timeout;
        let conn = self.ctrl()?;
        match f(&mut ConnIo { conn, timeout }) {
            Ok(answer) => answer,
            Err(e) => Err(self.channel_failed(e)),
        }
    }

    /// The agent missed a deadline or its channel broke: the sandbox is torn down and
    /// every later call says why.
    pub(super) fn channel_failed(&mut self, e: agent::CallError) -> Error {
        if matches!(e, agent::CallError::Timeout) {
            let secs = self.call_timeout.as_secs_f64();
            self.gone = Some(format!(
                "its agent did not answer a file call within {secs:.0} s"
            ));
            self.teardown();
            // The deadline is this process's own decision: the message says all of it.
            return Error::Sandbox(format!(
                "the sandbox did not answer within {secs:.0} s and was stopped; create a new sandbox"
            ));
        }
        self.gone = Some(format!("the sandbox agent stopped ({e})"));
        self.teardown();
        Error::failed("the sandbox agent stopped", e)
    }

    pub(super) fn env_for(&self, req: &ExecRequest) -> BTreeMap<String, String> {
        let tier_env = self.egress.iter().flat_map(|l| l.env());
        cordon_core::sandbox_env(&self.spec, tier_env, req)
    }

    /// Kills everything and removes what the sandbox left on the host.
    pub(super) fn teardown(&mut self) {
        tracing::debug!("teardown: begin");
        // Every process of the sandbox is in its cgroup: kill them all at once rather than
        // waiting for parent-death signals to travel down the chain. The outer init is not
        // in it and is killed last: it is the parent of the sandbox's PID-1 agent and reaps
        // it at once, and the kernel reaps the rest of the PID namespace with it. Killed
        // first, the outer init would orphan the agent to the host's init, which reaps when
        // it gets to it.
        let had_cgroup = self.cgroup.is_some();
        let (killed, mut dying) = self.kill_every_process();
        // Once they have exited the cgroup is empty and can go, while the outer init reaps
        // the agent and unmounts the sandbox's filesystems (it holds their namespace for
        // that): the two run side by side.
        let deadline = Instant::now() + Duration::from_millis(500);
        while !dying.is_empty() && Instant::now() < deadline {
            let mut fds: Vec<PollFd> = dying
                .iter()
                .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).max(1);
            if poll(&mut fds, PollTimeout::from(ms)).is_err() {
                break;
            }
            let exited: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(true)).collect();
            dying = dying
                .into_iter()
                .zip(exited)
                .filter_map(|(fd, gone)| (!gone).then_some(fd))
                .collect();
        }
        if let Some(cg) = self.cgroup.take()
            && !cg.kill_and_remove(Duration::from_secs(5))
        {
            tracing::warn!(sandbox = %self.id, "cgroup could not be removed; the next `cordon serve` start reaps it");
        }
        if let Some(mut outer) = self.outer.take() {
            // The outer init exits once it has reaped the agent; a few ms at most.
            if killed > 0
                && let Ok(pidfd) =
                    cordon_guest::sys::pidfd_open(nix::unistd::Pid::from_raw(outer.id() as i32))
            {
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(500u16));
            }
            let _ = outer.kill();
            let _ = outer.wait();
        }
        self.init_sock = None;
        if let Some(mut ctrl) = self.ctrl.take()
            && !had_cgroup
        {
            // Without a cgroup to watch, the agent's end of the socket closing is the sign
            // that it is gone.
            let deadline = Instant::now() + Duration::from_secs(2);
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match ctrl.fill(left) {
                    Ok(Filled::Data) => ctrl.discard(),
                    Ok(Filled::Nothing) => {}
                    Ok(Filled::Eof) | Err(_) => break,
                }
            }
        }
        tracing::debug!("teardown: processes killed");
        // The proxy (and with it every placeholder) ends with the sandbox.
        self.egress = None;
        // Every process of the sandbox is gone: its host ids may serve another.
        self.ids = None;
        tracing::debug!("teardown: done");
    }
}

impl ContainerSandbox {
    /// The end of a sandbox whose init ends it ([`super::ContainerConfig::end_in_init`]):
    /// every process of the sandbox is killed (its PID 1 first, as in a teardown) and this
    /// returns at once. The init, their parent, reaps them, removes the cgroup and holds
    /// the ids until all of it is gone; this process only lets go of what is its own (the
    /// channel, the egress proxy). A destroy of a `cordon run` saves the wait for the
    /// kernel's teardown of the namespaces and the cgroup's removal, as bubblewrap leaves
    /// its own to the kernel after it returns (ADR 0044).
    pub(super) fn end_in_init(&mut self) {
        // Their pidfds are not waited on: the init reaps them.
        let _ = self.kill_every_process();
        // The init removes the directories; nothing here may.
        self.cgroup = None;
        if let Some(outer) = self.outer.take() {
            // Without a cgroup the agent is killed through its parent's end: a SIGTERM
            // the init takes as the order to end the sandbox.
            if let Ok(pid) = i32::try_from(outer.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            // Not waited for: this process ends next, and the host's init reaps it then.
        }
        self.init_sock = None;
        self.ctrl = None;
        self.egress = None;
        // The init holds the lease's open file until the sandbox is gone; unlocked here,
        // the range would be free at once.
        if let Some(ids) = self.ids.take() {
            ids.keep_past_exit();
        }
    }
}

impl ContainerSandbox {
    /// Sends SIGKILL to every process in the sandbox's cgroup (thawed first if paused),
    /// its PID 1 first ([`kill_order`]), through a pidfd where the kernel has them, so a pid
    /// reused since the list was read is never hit. A process forked while the list was
    /// read is in the next read: a few rounds until none is new (the agent's death ends its
    /// PID namespace anyway). How many were killed, and the pidfds of those killed through
    /// one (each readable once its process has exited). Nothing without a cgroup.
    fn kill_every_process(&mut self) -> (usize, Vec<std::os::fd::OwnedFd>) {
        let mut dying = Vec::new();
        let Some(cg) = &self.cgroup else {
            return (0, dying);
        };
        if self.paused {
            // Frozen processes take no signal until thawed (cgroup v1).
            let _ = cg.thaw();
            self.paused = false;
        }
        let agent = self.outer.as_ref().and_then(|o| sandbox_init_of(o.id()));
        let mut killed = std::collections::HashSet::new();
        for _ in 0..4 {
            let new: Vec<i32> = kill_order(cg.pids(), agent)
                .into_iter()
                .filter(|pid| killed.insert(*pid))
                .collect();
            if new.is_empty() {
                break;
            }
            for pid in new {
                match crate::sys::kill_by_pidfd(pid) {
                    Ok(Some(pidfd)) => dying.push(pidfd),
                    Ok(None) => {}
                    Err(_) => crate::sys::kill_pid(pid),
                }
            }
        }
        (killed.len(), dying)
    }
}

/// The sandbox's PID 1 (its agent): the one child of the outer init `outer`.
pub(super) fn sandbox_init_of(outer: u32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The order a teardown kills a sandbox's processes in: its PID 1 (the agent) first. Its
/// death takes every process of its PID namespace with it, and once it is dead nothing
/// reports to the host. Killed one by one in the cgroup's order instead (ascending pids,
/// which wrap at `pid_max`), an exec's program could be killed before the shell waiting on
/// it, which then saw its child die and reported an ordinary exit (`Killed`, 137) through
/// the agent while the destroy was still under way.
pub(super) fn kill_order(mut pids: Vec<i32>, agent: Option<i32>) -> Vec<i32> {
    pids.sort_by_key(|p| Some(*p) != agent);
    pids
}

impl Drop for ContainerSandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_teardown_kills_the_sandbox_init_first_even_after_pids_wrapped() {
        // After pids wrapped, the exec's processes have lower pids than the agent.
        assert_eq!(
            kill_order(vec![301, 302, 30000, 30001], Some(30000)),
            vec![30000, 301, 302, 30001]
        );
        assert_eq!(kill_order(vec![5, 6], None), vec![5, 6]);
        assert_eq!(kill_order(vec![5, 6], Some(9)), vec![5, 6]);
    }

    #[test]
    fn the_sandbox_init_is_the_outer_inits_child() {
        let mut outer = Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(outer.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let child: i32 = line.trim().parse().unwrap();
        assert_eq!(sandbox_init_of(outer.id()), Some(child));
        let _ = Command::new("kill").arg(child.to_string()).status();
        outer.wait().unwrap();
        assert_eq!(sandbox_init_of(outer.id()), None);
    }
}
