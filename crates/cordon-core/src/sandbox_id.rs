//! A sandbox's id.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Result;

/// An unguessable sandbox id: `sb-` and 128 random bits in hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SandboxId(String);

impl SandboxId {
    /// A fresh random id from the OS's random source.
    pub fn random() -> Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| crate::Error::failed("no randomness for a sandbox id", e))?;
        Ok(SandboxId(format!("sb-{}", hex::encode(bytes))))
    }

    /// Parses an id a client sent; only the exact shape `random` makes is accepted.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("sb-")?;
        (hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| SandboxId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short form for names with length limits (cgroup and socket names).
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(19)]
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_strict() {
        let a = SandboxId::random().unwrap();
        let b = SandboxId::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(SandboxId::parse(a.as_str()), Some(a.clone()));
        assert!(SandboxId::parse("sb-../../etc").is_none());
        assert!(SandboxId::parse("sb-ABCDEF0123456789ABCDEF0123456789").is_none());
        assert!(SandboxId::parse(&format!("{a}0")).is_none());
    }
}
