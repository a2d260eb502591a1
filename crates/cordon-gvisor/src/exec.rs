//! What an exec sends the agent, and one call on a background exec.

use std::time::Duration;

use cordon_core::{Error, ExecRequest, Result, Tier};
use cordon_guest::proto::ProcLimits;

use crate::GvisorSandbox;

impl GvisorSandbox {
    /// The argv, environment, working directory and per-process limits of an exec.
    pub(crate) fn exec_parts(&self, req: &ExecRequest) -> Result<cordon_host::agent::ExecParts> {
        let tier_env = self.egress.iter().flat_map(|e| e.env());
        let env = cordon_core::sandbox_env(&self.spec, tier_env, req);
        let l = &self.spec.limits;
        let limits = ProcLimits {
            open_files: l.open_files,
            file_size: l.disk_bytes,
            address_space: 0,
            // gVisor's kernel enforces RLIMIT_NPROC per user: the sandbox's programs
            // share one uid, so this bounds all of them at once.
            processes: u64::from(l.pids),
        };
        // The root is the host's read-only /usr, Node.js with it (as in the container tier).
        cordon_host::agent::ExecParts::new(req, &self.spec, (Tier::Gvisor, true), env, limits)
    }

    /// The workspace or a writable volume is full, as the host sees it (the evidence of an
    /// exec's end, foreground and background alike; the sentry's view is not the host's).
    pub(crate) fn disk_full(&self) -> bool {
        crate::workspace::full(&self.work)
            || self
                .volumes
                .iter()
                .any(|(bind, _, ro)| !ro && crate::workspace::volume_full(bind))
    }

    /// One call on a background exec over the running sandbox's agent channel; a channel
    /// that fails stops the sandbox (the next exec starts it again, without them).
    pub(crate) fn bg_call<T>(
        &mut self,
        f: impl FnOnce(&mut dyn cordon_host::files::FrameIo) -> cordon_host::files::Answer<T>,
    ) -> Result<T> {
        let live = self.running_live(|| {
            "the sandbox is not running, so neither are its background execs; start them again"
                .into()
        })?;
        let mut io = cordon_host::files::ConnIo {
            conn: &mut live.conn,
            timeout: BG_CALL_TIMEOUT,
        };
        match f(&mut io) {
            Ok(answer) => answer,
            Err(e) => {
                let detail = self.stop_live();
                tracing::warn!(sandbox = %self.id, "gvisor: {e}; runsc said: {detail}");
                Err(Error::failed(
                    "the sandbox agent failed (the next exec starts the sandbox again)",
                    e,
                ))
            }
        }
    }
}

/// How long one call on a background exec may take over the agent channel.
pub(crate) const BG_CALL_TIMEOUT: Duration = Duration::from_secs(10);
