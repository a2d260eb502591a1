//! Helpers for the host side of the protocol, shared by every tier that drives this agent
//! (container, microvm).

use cordon_core::{Command, Error, ExecRequest, Language, Result, Tier};

use crate::proto::ErrorCode;

/// The argv that runs a request inside a Linux userland: languages through their
/// interpreters, argv as given. `node` says whether this tier's userland has JavaScript.
pub fn argv_for(req: &ExecRequest, tier: Tier, node: bool) -> Result<Vec<String>> {
    Ok(match &req.command {
        Command::Argv(v) => {
            if v.is_empty() {
                return Err(Error::Invalid(
                    "empty command; give a program to run".into(),
                ));
            }
            v.clone()
        }
        Command::Code {
            language,
            source,
            args,
        } => {
            let mut v: Vec<String> = match language {
                Language::Python => vec!["python3".into(), "-c".into(), source.clone()],
                Language::Bash => vec!["bash".into(), "-c".into(), source.clone(), "bash".into()],
                Language::Sh => vec!["sh".into(), "-c".into(), source.clone(), "sh".into()],
                Language::Javascript if node => vec!["node".into(), "-e".into(), source.clone()],
                Language::Javascript => {
                    return Err(Error::Invalid(format!(
                        "the {tier} tier has no JavaScript runtime; use --tier wasm for JavaScript"
                    )));
                }
            };
            v.extend(args.iter().cloned());
            v
        }
        Command::Wasm { .. } => {
            return Err(Error::Invalid(format!(
                "the {tier} tier does not run WebAssembly modules; use --tier wasm"
            )));
        }
    })
}

/// Maps an agent's refusal of a file operation to the API error.
pub fn file_error(path: &str, code: ErrorCode, message: String) -> Error {
    match code {
        ErrorCode::PathRefused => Error::PathRefused {
            path: path.to_string(),
            reason: message,
        },
        _ => Error::File {
            path: path.to_string(),
            reason: message,
        },
    }
}

/// Spawns a child that is tied to this process's life by `PR_SET_PDEATHSIG` (set by the child
/// itself, or in a `pre_exec` hook) from a thread that lives as long as the process.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child exits,
/// not the process. A server that creates sandboxes on short-lived worker threads (tokio's
/// blocking pool retires idle threads after ten seconds) would otherwise see every such
/// sandbox killed a few seconds after the thread that made it went idle. On the main thread
/// (which lives as long as the process) the child is spawned directly.
pub fn spawn_tied(cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    use std::sync::mpsc;
    use std::sync::{Mutex, OnceLock};

    type Job = (
        std::process::Command,
        mpsc::SyncSender<std::io::Result<std::process::Child>>,
    );
    static SPAWNER: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();

    let mut cmd = cmd;
    if nix::unistd::gettid().as_raw() as u32 == std::process::id() {
        return cmd.spawn();
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("cordon-spawner".into())
            .spawn(move || {
                // Runs until the process exits: no sender is ever dropped (it is static).
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let child = cmd.spawn();
                    // The child's ends of any pipes or sockets given to it close here.
                    drop(cmd);
                    let _ = reply.send(child);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let Some(spawner) = spawner else {
        return Err(std::io::Error::other(
            "the process-lifetime spawner thread could not be started; check the thread limit (ulimit -u)",
        ));
    };
    let (reply_tx, reply_rx) = mpsc::sync_channel(1);
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("the process-lifetime spawner thread has stopped"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the process-lifetime spawner thread has stopped"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_map_to_interpreters_and_refusals_name_the_tier() {
        let mut req = ExecRequest::code(Language::Bash, "echo $1");
        if let Command::Code { args, .. } = &mut req.command {
            args.push("x".into());
        }
        assert_eq!(
            argv_for(&req, Tier::Container, true).unwrap(),
            ["bash", "-c", "echo $1", "bash", "x"]
        );
        let js = ExecRequest::code(Language::Javascript, "1");
        assert_eq!(argv_for(&js, Tier::Container, true).unwrap()[0], "node");
        let err = argv_for(&js, Tier::Microvm, false).unwrap_err().to_string();
        assert!(err.contains("microvm"), "{err}");
        assert!(
            argv_for(
                &ExecRequest::argv(Vec::<String>::new()),
                Tier::Container,
                true
            )
            .is_err()
        );
        let refused = file_error("/etc/x", ErrorCode::PathRefused, "no".into());
        assert!(matches!(refused, Error::PathRefused { .. }));
    }
}
