#!/usr/bin/env bash
# cargo-deny, which `make test` runs to check the dependency tree's licenses, bans and
# sources against deny.toml. Built from the crates registry once (several minutes on two
# cores), pinned so every machine checks with the same rules; skipped when that version is
# already installed.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

CARGO_DENY_VERSION=0.20.2

have=$(cargo deny --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" = "$CARGO_DENY_VERSION" ]; then
  exit 0
fi
log "installing cargo-deny $CARGO_DENY_VERSION (was: ${have:-none})"
# Its manifest's release profile is fat LTO in one codegen unit at opt-level 3, which on two
# cores costs minutes for a tool that runs for seconds: no cross-crate LTO, parallel codegen
# and no optimisation instead. Measured here (clean install, CPU shared with other builds):
# opt-level 3 230 s wall / 420 s CPU, opt-level 1 180 s / 328 s, opt-level 0 100 s / 166 s;
# `cargo deny check licenses bans sources` on this workspace then takes 2.6 s, 2.6 s and
# 7-9 s (docs/adr/0012-tests-side-by-side.md).
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=0 \
  flock /tmp/cordon-cargo.lock cargo install --locked --quiet --version "$CARGO_DENY_VERSION" cargo-deny
