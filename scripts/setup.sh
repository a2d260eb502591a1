#!/usr/bin/env bash
# One idempotent setup for Cordon: apt packages, rustup targets, then the guest artifacts.
#
#   scripts/setup.sh            every step: what `make test` and `make build` need (CI)
#   scripts/setup.sh PART...    only the steps of those parts, and of `base`
#
# Parts (each step's `# part:` line): base (the container tier: what `make demo` needs), wasm,
# gvisor, microvm, oci, test (the test suites' tools). `cordon setup TIER` (scripts/setup-tier.sh)
# runs the base and its tier's part. A second run does nothing and takes seconds.
# Each piece lives in scripts/setup.d/NN-name.sh and must itself be idempotent: check first,
# install only what is missing. The guest artifacts (scripts/guests.sh) are built last, after
# a full setup; CORDON_SETUP_GUESTS=later leaves them to the caller, which `make test` and
# `make build` do so the guests are made with the workspace build they run anyway
# (docs/adr/0009). A partial setup never builds guests (its caller builds the ones it needs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CORDON_REPO=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
parts=" base wasm gvisor microvm oci test "
for part in "$@"; do
  if [[ $parts != *" $part "* ]]; then
    log "setup: no part '$part' (parts:$parts)"
    exit 2
  fi
done
run_steps "$here/setup.d" setup "$@"
if [ $# -gt 0 ]; then
  # What the steps that ran install is now on this machine (the rest of the tree may use
  # what another part installs).
  steps=$(select_steps "$here/setup.d" "$@" | xargs -n1 basename | sed 's/\.sh$//' | paste -sd, -)
  python3 "$here/check-setup.py" --steps "$steps"
  exit 0
fi
# Everything any build or test uses is named by a step above and is now on this machine; a
# piece that is not fails here, by name, rather than a build later (scripts/check-setup.py).
python3 "$here/check-setup.py"
if [ "${CORDON_SETUP_GUESTS:-}" != later ]; then
  bash "$here/guests.sh"
fi
