//! The languages whose source Cordon runs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A language whose source Cordon knows how to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Bash,
    Sh,
    Javascript,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Sh => "sh",
            Language::Javascript => "javascript",
        }
    }

    /// The program that runs this language's source in a Linux userland.
    pub fn program(self) -> &'static str {
        match self {
            Language::Python => "python3",
            Language::Bash => "bash",
            Language::Sh => "sh",
            Language::Javascript => "node",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Language {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "python" | "python3" | "py" => Ok(Language::Python),
            "bash" => Ok(Language::Bash),
            "sh" | "shell" => Ok(Language::Sh),
            "javascript" | "js" | "node" => Ok(Language::Javascript),
            _ => Err(format!(
                "unknown language {s:?}; choose python, bash, sh or javascript"
            )),
        }
    }
}
