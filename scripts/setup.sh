#!/usr/bin/env bash
# One idempotent setup for Cordon: apt packages, rustup targets, guest artifacts.
# `make demo` and `make test` (and so CI) call it. A second run does nothing and takes seconds.
# Each piece lives in scripts/setup.d/NN-name.sh and must itself be idempotent: check first,
# install only what is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CORDON_REPO=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
for step in "$here"/setup.d/*.sh; do
  [ -e "$step" ] || continue
  name=$(basename "$step" .sh)
  start=$(date +%s)
  bash "$step"
  log "setup: $name done in $(( $(date +%s) - start ))s"
done
