#!/usr/bin/env bash
# The microvm tier's guest: the static (musl) guest agent, then `cordon image build` (itself
# idempotent and content-addressed under $(cordon_data_dir)/microvm/: it checks its inputs'
# hashes first and returns in well under a second when everything is in place).
# Run by scripts/guests.sh; $CORDON_BIN_DIR, when set, holds a build of the workspace whose
# cordon-full is used instead of building one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
repo=${CORDON_REPO:-$(cd "$here/../.." && pwd)}
cd "$repo"
# The agent is built with the front and the init: one build, shared dependencies once.
build_musl_set
full=""
if [ -n "${CORDON_BIN_DIR:-}" ] && [ -x "$CORDON_BIN_DIR/cordon-full" ]; then
  full="$CORDON_BIN_DIR/cordon-full"
else
  # `image build` is a command of the full binary (the `cordon` front only runs sandboxes).
  flock /tmp/cordon-cargo.lock cargo build -q -p cordon-cli --bin cordon-full
  full="$(cargo_target_dir)/debug/cordon-full"
fi
"$full" image build --agent "$(cargo_target_dir)/$MUSL/release/cordon-guest"
