//! The container tier's seccomp policy: data in `policy/seccomp.json`, compiled with
//! seccompiler, checked against its own examples when loaded.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, TargetArch};
use serde::Deserialize;

use crate::InitError;

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

fn arch() -> Result<TargetArch, InitError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        InitError::Seccomp(format!(
            "no seccomp support for {}: {e}",
            std::env::consts::ARCH
        ))
    })
}

impl SeccompPolicy {
    /// Loads and compiles a policy file, then checks its examples: every syscall listed as
    /// refused must appear in some filter and every one listed as allowed must not be
    /// refused unconditionally.
    pub fn load(text: &str) -> Result<Self, InitError> {
        let file: PolicyFile = serde_json::from_str(text)
            .map_err(|e| InitError::Seccomp(format!("policy is not valid: {e}")))?;
        if file.version != 1 {
            return Err(InitError::Seccomp(format!(
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
                return Err(InitError::Seccomp(format!(
                    "policy example says {s} is refused, but no filter names it"
                )));
            }
        }
        for s in &file.examples.allowed {
            if refused_uncond.contains(s) {
                return Err(InitError::Seccomp(format!(
                    "policy example says {s} is allowed, but a filter refuses it outright"
                )));
            }
        }
        let arch = arch()?;
        let mut programs = Vec::new();
        for (name, filter) in &file.filters {
            let one = serde_json::json!({ name: filter }).to_string();
            let mut map = seccompiler::compile_from_json(one.as_bytes(), arch)
                .map_err(|e| InitError::Seccomp(format!("filter {name}: {e}")))?;
            let prog = map
                .remove(name)
                .ok_or_else(|| InitError::Seccomp(format!("filter {name} compiled to nothing")))?;
            // Laid out for the kernel's action cache (see seccomp_tree); as it is if that
            // does not apply.
            programs.push(crate::seccomp_tree::with_dispatch(&prog).unwrap_or(prog));
        }
        Ok(SeccompPolicy { programs })
    }

    /// The shipped policy, compiled at build time (see build.rs); equal to
    /// `load(DEFAULT_POLICY)`, which the unit tests check.
    pub fn default_policy() -> Result<Self, InitError> {
        let bin: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp.bin"));
        let word = |at: usize, n: usize| -> Result<u64, InitError> {
            bin.get(at..at + n)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a[..n].copy_from_slice(b);
                    u64::from_le_bytes(a)
                })
                .ok_or_else(|| InitError::Seccomp("built-in policy is truncated".into()))
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

    /// seccompiler's own programs for the shipped policy, without the dispatch prefix.
    fn undispatched() -> Vec<BpfProgram> {
        let file: serde_json::Value = serde_json::from_str(DEFAULT_POLICY).unwrap();
        let mut out = Vec::new();
        for (name, filter) in file["filters"].as_object().unwrap() {
            let one = serde_json::json!({ name: filter }).to_string();
            let mut map = seccompiler::compile_from_json(one.as_bytes(), arch().unwrap()).unwrap();
            out.push(map.remove(name).unwrap());
        }
        out
    }

    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;

    /// Argument values that cross every rule's comparisons: each single bit, small numbers
    /// (socket domains and types), the refused ioctls, types with flags, all ones.
    fn arg_values() -> Vec<u64> {
        let mut v: Vec<u64> = (0..64).map(|b| 1u64 << b).collect();
        v.extend(0..48);
        v.extend([
            0x5412,
            0x541c,
            3 | 0x80000,
            3 | 0x800,
            10 | 0x80000,
            0xffff_ffff,
        ]);
        v.extend([u64::MAX, 0x7c02_0000, 0x1_0000_0003]);
        v
    }

    #[test]
    fn the_dispatch_prefix_decides_every_call_as_seccompilers_filter_does() {
        use crate::seccomp_tree::{Call, run};
        let shipped = SeccompPolicy::default_policy().unwrap();
        let originals = undispatched();
        assert_eq!(shipped.programs.len(), originals.len());
        let values = arg_values();
        for (fast, slow) in shipped.programs.iter().zip(&originals) {
            let fast: &[seccompiler::sock_filter] = fast;
            assert!(fast.len() > slow.len(), "the shipped filter has its prefix");
            let mut named = 0;
            for arch in [AUDIT_ARCH_X86_64, AUDIT_ARCH_I386] {
                for nr in 0..1100u32 {
                    let mut calls = vec![Call {
                        nr,
                        arch,
                        ip: 0,
                        args: [0; 6],
                    }];
                    // Arguments matter only for the calls a rule names: try many there.
                    let base = run(slow, &calls[0]);
                    let depends = values.iter().any(|&v| {
                        run(
                            slow,
                            &Call {
                                args: [v; 6],
                                ..calls[0]
                            },
                        ) != base
                    });
                    if depends
                        || base
                            != run(
                                slow,
                                &Call {
                                    nr: 5000,
                                    ..calls[0]
                                },
                            )
                    {
                        named += 1;
                        for &v in &values {
                            for i in 0..6 {
                                let mut args = [0; 6];
                                args[i] = v;
                                calls.push(Call {
                                    nr,
                                    arch,
                                    ip: 0,
                                    args,
                                });
                            }
                            calls.push(Call {
                                nr,
                                arch,
                                ip: 0,
                                args: [v; 6],
                            });
                        }
                    }
                    for c in &calls {
                        let want = run(slow, c);
                        assert!(want.is_some(), "seccompiler's program runs for {c:?}");
                        assert_eq!(run(fast, c), want, "decision differs for {c:?}");
                    }
                }
            }
            assert!(named > 0, "some calls are named by each filter");
        }
    }

    /// The interpreter the prefix is built with agrees with the policy's intent, checked
    /// against the kernel's own syscall numbers: what the policy refuses outright is refused
    /// (so it was routed to seccompiler's code, not to the default), everyday calls pass.
    #[test]
    fn the_shipped_filter_refuses_what_the_policy_names_and_allows_everyday_calls() {
        use crate::seccomp_tree::{Call, run};
        let shipped = SeccompPolicy::default_policy().unwrap();
        let deny = &shipped.programs[1];
        const EPERM: u32 = 0x0005_0000 | 1;
        const ALLOW: u32 = 0x7fff_0000;
        let call = |nr: libc::c_long| Call {
            nr: nr as u32,
            arch: AUDIT_ARCH_X86_64,
            ip: 0,
            args: [0; 6],
        };
        let refused = [
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_move_mount,
            libc::SYS_open_tree,
            libc::SYS_fsopen,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_reboot,
            libc::SYS_swapon,
            libc::SYS_open_by_handle_at,
            libc::SYS_iopl,
            libc::SYS_ioperm,
        ];
        for nr in refused {
            assert_eq!(run(deny, &call(nr)), Some(EPERM), "syscall {nr} is refused");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_mmap,
            libc::SYS_execve,
            libc::SYS_exit_group,
            libc::SYS_futex,
            libc::SYS_clone,
        ] {
            assert_eq!(run(deny, &call(nr)), Some(ALLOW), "syscall {nr} is allowed");
        }
        // Arguments still matter where a rule looks at them: a new user namespace is refused.
        let ns_clone = Call {
            args: [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
            ..call(libc::SYS_clone)
        };
        assert_eq!(run(deny, &ns_clone), Some(EPERM));
        let raw = Call {
            args: [libc::AF_PACKET as u64, libc::SOCK_RAW as u64, 0, 0, 0, 0],
            ..call(libc::SYS_socket)
        };
        assert_eq!(run(deny, &raw), Some(EPERM));
        // socketpair follows socket's family rule, narrowed to unix: any other family
        // reaches the kernel's socket creation (and module autoload) before it can fail.
        let pair = |family: i32| Call {
            args: [family as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            ..call(libc::SYS_socketpair)
        };
        for family in [
            libc::AF_TIPC,
            libc::AF_NETLINK,
            libc::AF_INET,
            libc::AF_PACKET,
            libc::AF_VSOCK,
            libc::AF_UNSPEC,
        ] {
            assert_eq!(run(deny, &pair(family)), Some(EPERM), "family {family}");
        }
        assert_eq!(run(deny, &pair(libc::AF_UNIX)), Some(ALLOW));
    }

    #[test]
    fn x32_calls_are_refused_where_the_plain_row_let_them_through() {
        use crate::seccomp_tree::{Call, run};
        let shipped = SeccompPolicy::default_policy().unwrap();
        let deny = &shipped.programs[1];
        let row = &undispatched()[1];
        const X32: u32 = 0x4000_0000;
        const PTRACE: u32 = 101;
        const ENOSYS: u32 = 0x0005_0000 | 38;
        const ALLOW: u32 = 0x7fff_0000;
        let call = |nr| Call {
            nr,
            arch: AUDIT_ARCH_X86_64,
            ip: 0,
            args: [0; 6],
        };
        assert_ne!(run(deny, &call(PTRACE)), Some(ALLOW), "ptrace is refused");
        assert_eq!(
            run(row, &call(X32 | PTRACE)),
            Some(ALLOW),
            "the row alone misses x32"
        );
        for nr in [X32, X32 | PTRACE, X32 | 1, u32::MAX] {
            assert_eq!(run(deny, &call(nr)), Some(ENOSYS), "x32 number {nr:#x}");
        }
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
