#!/usr/bin/env bash
# cargo-deny, which `make test` runs to check the dependency tree's licenses, bans and
# sources against deny.toml. Built from the crates registry once (several minutes on two
# cores), pinned so every machine checks with the same rules; skipped when that version is
# already installed.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

CARGO_DENY_VERSION=0.20.2

have=$(cargo deny --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" = "$CARGO_DENY_VERSION" ]; then
  exit 0
fi
log "installing cargo-deny $CARGO_DENY_VERSION (was: ${have:-none})"
# Its manifest's release profile is fat LTO in one codegen unit, which on two cores costs
# minutes for a tool that runs for seconds: thin-local LTO and parallel codegen instead
# (docs/adr/0009-one-build-in-make-test.md has the figures).
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  flock /tmp/cordon-cargo.lock cargo install --locked --quiet --version "$CARGO_DENY_VERSION" cargo-deny
