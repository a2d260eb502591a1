//! Compiles the seccomp policy (policy/seccomp.json) to BPF at build time, so starting a
//! sandbox does not parse and compile JSON. The runtime still checks the policy's examples in
//! its unit tests, and `SeccompPolicy::load` compiles custom policies at run time.

use std::error::Error;
use std::io::Write;

#[allow(dead_code)]
#[path = "src/seccomp_tree.rs"]
mod seccomp_tree;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=policy/seccomp.json");
    println!("cargo:rerun-if-changed=src/seccomp_tree.rs");
    let text = std::fs::read_to_string("policy/seccomp.json")?;
    let policy: serde_json::Value = serde_json::from_str(&text)?;
    let arch_name = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let arch = seccompiler::TargetArch::try_from(arch_name.as_str())
        .map_err(|e| format!("no seccomp support for {arch_name}: {e:?}"))?;
    let filters = policy["filters"]
        .as_object()
        .ok_or("policy/seccomp.json has no filters object")?;
    let mut out = Vec::new();
    out.extend_from_slice(&(filters.len() as u32).to_le_bytes());
    // serde_json's map is ordered by key, as SeccompPolicy::load's BTreeMap is.
    for (name, filter) in filters {
        let one = serde_json::json!({ name: filter }).to_string();
        let mut map = seccompiler::compile_from_json(one.as_bytes(), arch)
            .map_err(|e| format!("seccomp filter {name}: {e}"))?;
        let prog = map.remove(name).ok_or("filter compiled to nothing")?;
        let prog = seccomp_tree::with_dispatch(&prog).unwrap_or(prog);
        out.extend_from_slice(&(prog.len() as u32).to_le_bytes());
        for f in prog {
            let word = (f.code as u64)
                | ((f.jt as u64) << 16)
                | ((f.jf as u64) << 24)
                | ((f.k as u64) << 32);
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    let dest = std::path::Path::new(&std::env::var("OUT_DIR")?).join("seccomp.bin");
    std::fs::File::create(dest)?.write_all(&out)?;
    Ok(())
}
