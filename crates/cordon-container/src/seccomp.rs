//! The container tier's seccomp policy: data in `policy/seccomp.json`, compiled with
//! seccompiler, checked against its own examples when loaded.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, TargetArch};
use serde::Deserialize;

use crate::ContainerError;

/// The policy shipped with Cordon.
pub const DEFAULT_POLICY: &str = include_str!("../policy/seccomp.json");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    version: u32,
    #[allow(dead_code)]
    about: String,
    filters: BTreeMap<String, serde_json::Value>,
    examples: Examples,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Examples {
    refused: Vec<String>,
    allowed: Vec<String>,
}

/// Compiled filters, installed in order in each program's process before exec.
#[derive(Debug, Clone)]
pub struct SeccompPolicy {
    pub programs: Vec<BpfProgram>,
}

fn arch() -> Result<TargetArch, ContainerError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        ContainerError::Seccomp(format!(
            "no seccomp support for {}: {e}",
            std::env::consts::ARCH
        ))
    })
}

impl SeccompPolicy {
    /// Loads and compiles a policy file, then checks its examples: every syscall listed as
    /// refused must appear in some filter and every one listed as allowed must not be
    /// refused unconditionally.
    pub fn load(text: &str) -> Result<Self, ContainerError> {
        let file: PolicyFile = serde_json::from_str(text)
            .map_err(|e| ContainerError::Seccomp(format!("policy is not valid: {e}")))?;
        if file.version != 1 {
            return Err(ContainerError::Seccomp(format!(
                "policy version {} is not supported (expected 1)",
                file.version
            )));
        }
        let mut refused_uncond = Vec::new();
        let mut mentioned = Vec::new();
        for filter in file.filters.values() {
            for rule in filter["filter"].as_array().into_iter().flatten() {
                let name = rule["syscall"].as_str().unwrap_or_default().to_string();
                if rule.get("args").is_none() {
                    refused_uncond.push(name.clone());
                }
                mentioned.push(name);
            }
        }
        for s in &file.examples.refused {
            if !mentioned.contains(s) {
                return Err(ContainerError::Seccomp(format!(
                    "policy example says {s} is refused, but no filter names it"
                )));
            }
        }
        for s in &file.examples.allowed {
            if refused_uncond.contains(s) {
                return Err(ContainerError::Seccomp(format!(
                    "policy example says {s} is allowed, but a filter refuses it outright"
                )));
            }
        }
        let arch = arch()?;
        let mut programs = Vec::new();
        for (name, filter) in &file.filters {
            let one = serde_json::json!({ name: filter }).to_string();
            let mut map = seccompiler::compile_from_json(one.as_bytes(), arch)
                .map_err(|e| ContainerError::Seccomp(format!("filter {name}: {e}")))?;
            let prog = map.remove(name).ok_or_else(|| {
                ContainerError::Seccomp(format!("filter {name} compiled to nothing"))
            })?;
            programs.push(prog);
        }
        Ok(SeccompPolicy { programs })
    }

    /// The shipped policy, compiled at build time (see build.rs); equal to
    /// `load(DEFAULT_POLICY)`, which the unit tests check.
    pub fn default_policy() -> Result<Self, ContainerError> {
        let bin: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp.bin"));
        let word = |at: usize, n: usize| -> Result<u64, ContainerError> {
            bin.get(at..at + n)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a[..n].copy_from_slice(b);
                    u64::from_le_bytes(a)
                })
                .ok_or_else(|| ContainerError::Seccomp("built-in policy is truncated".into()))
        };
        let count = word(0, 4)? as usize;
        let mut at = 4;
        let mut wire = Vec::with_capacity(count);
        for _ in 0..count {
            let len = word(at, 4)? as usize;
            at += 4;
            let mut prog = Vec::with_capacity(len);
            for _ in 0..len {
                prog.push(word(at, 8)?);
                at += 8;
            }
            wire.push(prog);
        }
        Ok(Self::from_wire(&wire))
    }

    /// Installs every filter on the calling thread. Needs `no_new_privs` set first.
    pub fn apply(&self) -> std::io::Result<()> {
        for p in &self.programs {
            seccompiler::apply_filter(p).map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(())
    }

    /// Flattens the programs for sending to the init process.
    pub fn to_wire(&self) -> Vec<Vec<u64>> {
        self.programs
            .iter()
            .map(|p| {
                p.iter()
                    .map(|f| {
                        (f.code as u64)
                            | ((f.jt as u64) << 16)
                            | ((f.jf as u64) << 24)
                            | ((f.k as u64) << 32)
                    })
                    .collect()
            })
            .collect()
    }

    pub fn from_wire(wire: &[Vec<u64>]) -> Self {
        let programs = wire
            .iter()
            .map(|p| {
                p.iter()
                    .map(|&w| seccompiler::sock_filter {
                        code: (w & 0xffff) as u16,
                        jt: ((w >> 16) & 0xff) as u8,
                        jf: ((w >> 24) & 0xff) as u8,
                        k: (w >> 32) as u32,
                    })
                    .collect()
            })
            .collect();
        SeccompPolicy { programs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_policy_equals_the_policy_file() {
        let built = SeccompPolicy::default_policy().unwrap();
        let loaded = SeccompPolicy::load(DEFAULT_POLICY).unwrap();
        assert_eq!(built.to_wire(), loaded.to_wire());
    }

    #[test]
    fn default_policy_compiles_and_roundtrips() {
        let p = SeccompPolicy::default_policy().unwrap();
        assert_eq!(p.programs.len(), 2);
        assert!(p.programs.iter().all(|f| f.len() > 4));
        let back = SeccompPolicy::from_wire(&p.to_wire());
        assert_eq!(back.to_wire(), p.to_wire());
    }

    #[test]
    fn examples_are_checked() {
        let bad = DEFAULT_POLICY.replace("\"refused\": [", "\"refused\": [\"not_a_listed_call\", ");
        assert!(SeccompPolicy::load(&bad).is_err());
        let bad = DEFAULT_POLICY.replace("\"allowed\": [", "\"allowed\": [\"ptrace\", ");
        assert!(SeccompPolicy::load(&bad).is_err());
        assert!(SeccompPolicy::load("{}").is_err());
    }
}
