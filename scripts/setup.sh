#!/usr/bin/env bash
# One idempotent setup for Cordon: apt packages, rustup targets, then the guest artifacts.
# `make demo` and `make test` (and so CI) call it. A second run does nothing and takes seconds.
# Each piece lives in scripts/setup.d/NN-name.sh and must itself be idempotent: check first,
# install only what is missing. The guest artifacts (scripts/guests.sh) are built last;
# CORDON_SETUP_GUESTS=later leaves them to the caller, which `make test` and `make build` do
# so the guests are made with the workspace build they run anyway (docs/adr/0009).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CORDON_REPO=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
run_steps "$here/setup.d" setup
# Everything any build or test uses is named by a step above and is now on this machine; a
# piece that is not fails here, by name, rather than a build later (scripts/check-setup.py).
python3 "$here/check-setup.py"
if [ "${CORDON_SETUP_GUESTS:-}" != later ]; then
  bash "$here/guests.sh"
fi
