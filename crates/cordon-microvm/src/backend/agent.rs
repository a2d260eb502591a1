//! The connection to the guest agent: calls by a deadline, a call that fails part-way
//! stopping the VM, the agent's hello and its configuration (identity, limits, clock and
//! fresh randomness).

use std::time::{Duration, Instant, SystemTime};

use cordon_core::{Error, Result};
use cordon_guest::proto::{self, Frame, PROTOCOL_VERSION, Reply, Request};
use cordon_host::agent::{AgentConn, CallError, HEADER_ROOM};

use super::state::{MicrovmSandbox, sandbox_msg};

impl MicrovmSandbox {
    /// Writes raw bytes to the agent channel, bypassing the frame encoder (to test that the
    /// agent rejects malformed frames), and returns whether the agent is still answering.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        let deadline = Instant::now() + self.file_timeout;
        let r = self.ctrl()?.send_raw(bytes, deadline);
        self.check_call(r, "writing to the agent")
    }

    /// The result of a call on the agent channel. A call that failed part-way leaves the
    /// channel between frames: the VM is stopped (and the reason recorded).
    pub(super) fn check_call<T>(
        &mut self,
        r: std::result::Result<T, CallError>,
        what: &str,
    ) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(CallError::Timeout) => {
                self.gone = Some(format!("its agent did not finish {what} in time"));
                self.last_words = self.vm.as_ref().map(|v| v.diagnostics());
                self.teardown();
                // The deadline is this process's own: the message says all of it.
                Err(Error::Sandbox(format!(
                    "{what}: the guest agent did not take or answer it in time; the microVM was stopped, create a new sandbox"
                )))
            }
            Err(CallError::Proto(e)) => {
                self.failure = Some("agent-protocol".into());
                self.gone = Some(format!("its agent broke the protocol ({e})"));
                self.last_words = self.vm.as_ref().map(|v| v.diagnostics());
                self.teardown();
                Err(Error::Failed {
                    what: format!(
                        "{what}: the guest agent broke the protocol (the microVM was stopped, create a new sandbox)"
                    ),
                    source: Box::new(e),
                })
            }
            Err(e) => {
                let why = self.diagnose(&e.to_string());
                // The diagnosis (the guest's console, QEMU's end) says more than the
                // channel's error, which it repeats when it finds nothing better.
                Err(Error::Sandbox(format!("the guest agent stopped: {why}")))
            }
        }
    }

    /// One request and its reply, all by one deadline; a reply longer than `max_frame`
    /// bytes is refused from its length.
    pub(super) fn call(
        &mut self,
        req: &Request,
        body: &[u8],
        timeout: Duration,
        max_frame: usize,
        what: &str,
    ) -> Result<proto::Frame<Reply>> {
        let deadline = Instant::now() + timeout;
        let ctrl = self.ctrl()?;
        let r = ctrl
            .send(req, body, deadline)
            .and_then(|()| ctrl.recv(deadline, max_frame));
        self.check_call(r, what)
    }

    /// One file call on the agent channel, each frame by the file deadline; refused at
    /// once when the guest's agent predates file operations (it would stop at an unknown
    /// request).
    pub(super) fn file_call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut cordon_host::files::ConnIo<'_>) -> cordon_host::files::Answer<T>,
    ) -> Result<T> {
        if !self.files {
            return Err(cordon_host::files::agent_too_old(what));
        }
        let timeout = self.file_timeout;
        let conn = self.ctrl()?;
        let r = f(&mut cordon_host::files::ConnIo { conn, timeout });
        self.check_call(r, what)?
    }

    pub(super) fn ctrl(&mut self) -> Result<&mut AgentConn> {
        if self.gone.is_some() {
            return Err(self.gone_err());
        }
        match self.ctrl.as_mut() {
            Some(c) => Ok(c),
            None => Err(Error::Gone {
                id: self.id.to_string(),
                reason: "destroyed".into(),
            }),
        }
    }

    /// The agent's first frame (`r`, as received) must be its hello in this protocol.
    pub(super) fn check_hello(
        &mut self,
        r: std::result::Result<Frame<Reply>, CallError>,
    ) -> Result<()> {
        let f = self.check_call(r, "starting the guest")?;
        match f.header {
            Reply::Hello { version, .. } if version == PROTOCOL_VERSION => Ok(()),
            // A version mismatch: a message, with no error to keep.
            Reply::Hello { version, .. } => Err(Error::Sandbox(format!(
                "the guest agent speaks protocol {version}, this cordon {PROTOCOL_VERSION}; rebuild the image (`cordon image build`)"
            ))),
            other => Err(sandbox_msg(
                "unexpected first message from the guest",
                format!("{other:?}"),
            )),
        }
    }

    /// Gives the guest its identity, limits, clock and fresh randomness.
    pub(super) fn configure(&mut self, timeout: Duration) -> Result<()> {
        let mut seed = [0u8; 64];
        getrandom::fill(&mut seed).map_err(|e| Error::failed("no randomness", e))?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let l = &self.spec.limits;
        let req = Request::Configure {
            hostname: self.id.short().to_string(),
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            tmp_bytes: l.tmp_bytes,
            unix_time_ms: now,
            egress: match &self.egress {
                Some(e) => Some(e.setup()?),
                None => None,
            },
        };
        let f = self.call(&req, &seed, timeout, HEADER_ROOM, "configuring the guest")?;
        match f.header {
            // An agent built before agents listed features: no file operations.
            Reply::Ok => Ok(()),
            Reply::Configured { features } => {
                self.files = features.iter().any(|f| f == proto::FEATURE_FILES);
                Ok(())
            }
            Reply::Error { message, .. } => Err(sandbox_msg("configuring the guest", message)),
            other => Err(sandbox_msg(
                "unexpected reply to configure",
                format!("{other:?}"),
            )),
        }
    }
}
