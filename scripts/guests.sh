#!/usr/bin/env bash
# The guest artifacts the tiers run: the wasm guests and the microVM image
# (scripts/guests.d/NN-*.sh, each idempotent and content-addressed: a second run with the same
# inputs takes seconds; they run side by side). scripts/setup.sh runs this last.
#
#   scripts/guests.sh [--bin-dir DIR]
#
# --bin-dir names a build of this workspace (`make test` passes target/debug after its one
# build) whose cordon-full and examples/wizen are used instead of compiling them again with
# another feature set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CORDON_REPO=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
if [ "${1:-}" = --bin-dir ]; then
  [ -n "${2:-}" ] || { log "guests: --bin-dir needs a directory"; exit 2; }
  CORDON_BIN_DIR=$(cd "$2" && pwd)
  export CORDON_BIN_DIR
fi
# The steps share nothing but the cargo lock: side by side, one's downloads overlap the
# other's compiling.
run_steps_side_by_side "$here/guests.d" guests
