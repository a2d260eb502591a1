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
cargo install --locked --quiet --version "$CARGO_DENY_VERSION" cargo-deny
