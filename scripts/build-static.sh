#!/usr/bin/env bash
# `make build`'s last step: the two binaries on every `cordon run`'s path, `cordon` (the
# front) and `cordon-sandbox-init`, rebuilt as static musl executables and put in place of
# cargo's glibc builds in target/release.
#
# Why: on this kind of machine (a VM), a dynamically linked glibc program spends ~0.6 ms
# before main, mostly in the CPUID instructions glibc and libgcc run at start-up (each traps
# to the hypervisor: 3.6 us here) and in reading /proc/self/maps; a static musl one, 0.2 ms.
# Both binaries are exec'd once per `cordon run`, the init once per container sandbox.
# Measured with `cordon bench --tiers container --peers host,bwrap` (see docs/adr/0001).
#
# cargo's own builds stay valid: if this step cannot run (no musl target), the glibc
# binaries are used as they are, only slower. The next `cargo build --release` that
# recompiles either binary puts the glibc build back; `make build` redoes this step.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ] || ! command -v musl-gcc >/dev/null \
  || ! rustup target list --installed 2>/dev/null | grep -qx "$MUSL"; then
  log "static helpers: skipped (needs x86_64, musl-gcc and the $MUSL rust target; \`make setup\` installs them)"
  exit 0
fi
if ! build_musl_set; then
  log "static helpers: the musl build failed (above); keeping cargo's glibc builds"
  exit 0
fi
t=$(cargo_target_dir)
mkdir -p "$t/release"
for b in cordon cordon-sandbox-init; do
  # A new file, renamed over the old: cargo's build is a hard link to its deps/ copy,
  # which must stay as cargo made it.
  cp "$(musl_dir)/$b" "$t/release/.$b.static"
  mv -f "$t/release/.$b.static" "$t/release/$b"
done
log "static helpers: target/release/cordon and cordon-sandbox-init are static (musl) builds"
