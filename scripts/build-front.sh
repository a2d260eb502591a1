#!/usr/bin/env bash
# `make demo`'s build: only what the demo runs, the front (`cordon`, which runs `cordon run` on
# the container tier itself) and the container tier's init (`cordon-sandbox-init`), as static
# musl executables in target/release (scripts/build-static.sh), or cargo's glibc builds where
# the musl target cannot be used. No wasmtime, server or other tier is compiled: `cordon setup
# TIER` builds those when a tier is first wanted (scripts/setup-tier.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
t=$(cargo_target_dir)
if [ "$(uname -m)" = x86_64 ] && command -v musl-gcc >/dev/null \
  && rustup target list --installed 2>/dev/null | grep -qx "$MUSL"; then
  bash scripts/build-static.sh
fi
if [ ! -x "$t/release/cordon" ] || [ ! -x "$t/release/cordon-sandbox-init" ]; then
  cargo_progress "front and init" build --release -p cordon --bin cordon \
    -p cordon-sandbox-init --bin cordon-sandbox-init
fi
log "built: $t/release/cordon and cordon-sandbox-init (the container tier); other tiers: \`cordon setup wasm|gvisor|microvm|all\`"
