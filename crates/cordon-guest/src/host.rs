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
