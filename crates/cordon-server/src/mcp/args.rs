//! The tools' arguments: what each MCP tool takes beside the API's own bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use cordon_core::Language;
use cordon_core::units::Dur;

/// The arguments of a tool that runs a program in a sandbox, declared once for `exec` and
/// `start_background`: the sandbox, the program (code in its language, or an argv) and its
/// environment, then the tool's own fields. A macro, not a flattened struct: serde does
/// not refuse unknown fields through `flatten`, and every tool's arguments refuse them.
macro_rules! program_args {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Debug, Deserialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// The sandbox's id from create_sandbox.
            pub sandbox: String,
            /// Source code (its language in lang, default python), or leave out and give argv.
            #[serde(default)]
            pub code: Option<String>,
            #[serde(default)]
            pub lang: Option<Language>,
            /// A program and its arguments, run without a shell.
            #[serde(default)]
            pub argv: Option<Vec<String>>,
            /// Environment variables of this exec.
            #[serde(default)]
            pub env: BTreeMap<String, String>,
            $($(#[$fm])* pub $f: $t,)*
        }
    };
}

/// One sandbox, by the id create_sandbox answered.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox's id (sb-...) from create_sandbox or list_sandboxes.
    pub sandbox: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {
    /// Only sandboxes carrying every one of these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

program_args! {
    // exec: a program run to its end.
    pub struct ExecArgs {
        /// Arguments after the code.
        #[serde(default)]
        pub args: Vec<String>,
        /// Its working directory, under /work.
        #[serde(default)]
        pub cwd: Option<String>,
        /// Past this the exec's whole process tree is killed (at most the sandbox's timeout).
        #[serde(default)]
        pub timeout: Option<Dur>,
        /// Standard input as text.
        #[serde(default)]
        pub stdin: Option<String>,
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    pub sandbox: String,
    /// A path under /work.
    pub path: String,
    pub content: String,
    /// True when content is base64 (binary files).
    #[serde(default)]
    pub base64: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileArgs {
    pub sandbox: String,
    /// A path under /work.
    pub path: String,
}

/// A file read out of a sandbox: `text` when it is UTF-8, else `base64`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FileContent {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    pub sandbox: String,
    /// A directory: /work (the default) or beneath it.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveArgs {
    pub sandbox: String,
    /// A path under /work (not /work itself).
    pub path: String,
    /// Remove a directory that is not empty, and everything beneath it.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameArgs {
    pub sandbox: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirArgs {
    pub sandbox: String,
    pub path: String,
    /// Make missing parents too; an existing directory is not an error.
    #[serde(default)]
    pub parents: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseArgs {
    pub sandbox: String,
    /// Save the whole sandbox to disk and free its memory (microvm only); it survives a
    /// server restart.
    #[serde(default)]
    pub to_disk: bool,
    /// Keep its files only (container, gvisor): its processes end and its memory is let
    /// go; a resume starts it again from its files, as a machine boots again.
    #[serde(default)]
    pub files_only: bool,
}

program_args! {
    // start_background: a program started in the background.
    pub struct StartArgs {
        /// Run it on a pseudo-terminal of this size (an interactive program: a REPL, an
        /// editor, a TUI); its output is all stdout. resize_exec changes the size.
        #[serde(default)]
        pub pty: Option<cordon_core::PtySize>,
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeArgs {
    pub sandbox: String,
    /// The background exec's id (ex-<n>), started with pty.
    pub exec: String,
    /// Rows, 1 to 1000.
    pub rows: u16,
    /// Columns, 1 to 1000.
    pub cols: u16,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecIdArgs {
    pub sandbox: String,
    /// The background exec's id (ex-<n>) from start_background or list_execs.
    pub exec: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillArgs {
    pub sandbox: String,
    pub exec: String,
    /// SIGKILL at once instead of SIGTERM then SIGKILL after the server's grace.
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The sandbox's id from create_sandbox.
    pub sandbox: String,
    /// One cell of code; the value of its last expression comes back as `text`.
    pub code: String,
    /// A context id (ctx-<n>) from create_context; left out: the sandbox's default context
    /// of `lang`, made at its first use.
    #[serde(default)]
    pub context: Option<String>,
    /// python (default), javascript or typescript; only without `context`.
    #[serde(default)]
    pub lang: Option<ContextLang>,
    /// The cell's timeout; past it the cell is interrupted and the context keeps its state.
    #[serde(default)]
    pub timeout: Option<Dur>,
}

/// The languages of code contexts.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextLang {
    Python,
    Javascript,
    Typescript,
}

impl ContextLang {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ContextLang::Python => "python",
            ContextLang::Javascript => "javascript",
            ContextLang::Typescript => "typescript",
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextArgs {
    pub sandbox: String,
    pub lang: ContextLang,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextIdArgs {
    pub sandbox: String,
    /// The context's id (ctx-<n>) from create_context or list_contexts.
    pub context: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateArgs {
    pub sandbox: String,
    /// A new lifetime from its creation (paused time is not counted).
    #[serde(default)]
    pub ttl: Option<Dur>,
    /// A new idle timeout.
    #[serde(default)]
    pub idle_timeout: Option<Dur>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeNameArgs {
    /// The volume's name.
    pub name: String,
}
