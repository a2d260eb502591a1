//! Files in and out of the guest's workspace through the agent.

use cordon_core::{Error, Result};
use cordon_guest::proto::{self, Reply, Request};
use cordon_host::agent::HEADER_ROOM;
use cordon_host::egress as shared_egress;

use super::state::{MicrovmSandbox, sandbox_msg};

impl MicrovmSandbox {
    /// `Sandbox::put_file`.
    pub(super) fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        cordon_core::classify_sandbox_path(path, false)?;
        let req = Request::PutFile {
            path: path.to_string(),
            mode,
        };
        let f = self.call(&req, data, self.file_timeout, HEADER_ROOM, "writing a file")?;
        match f.header {
            Reply::Ok => Ok(()),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(sandbox_msg(
                "unexpected reply to a file write",
                format!("{other:?}"),
            )),
        }
    }

    /// `Sandbox::get_file`.
    pub(super) fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        cordon_core::classify_sandbox_path(path, false)?;
        let req = Request::GetFile {
            path: path.to_string(),
            max: max_bytes,
        };
        // The reply may carry at most `max_bytes`: a longer frame is refused from its length,
        // before its body is read, whatever the guest claims.
        let max_frame = usize::try_from(max_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(HEADER_ROOM)
            .min(proto::MAX_FRAME);
        let f = self.call(&req, b"", self.file_timeout, max_frame, "reading a file")?;
        match f.header {
            Reply::File { truncated: false } if f.body.len() as u64 <= max_bytes => {
                let (clean, found) =
                    shared_egress::scan_file(self.egress.as_ref().map(|e| &e.link), path, &f.body);
                self.file_findings.extend(found);
                Ok(clean)
            }
            Reply::File { .. } => Err(Error::File {
                path: path.to_string(),
                reason: format!(
                    "larger than the {max_bytes}-byte limit for files out; raise it or write less"
                ),
            }),
            Reply::Error { code, message } => {
                Err(cordon_host::agent::file_error(path, code, message))
            }
            other => Err(sandbox_msg(
                "unexpected reply to a file read",
                format!("{other:?}"),
            )),
        }
    }
}
