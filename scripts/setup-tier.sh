#!/usr/bin/env bash
# `cordon setup [TIER...]`: makes tiers ready before they are first asked for, so no request
# ever waits on a build (a request for a tier whose parts are missing fails at once, naming
# this command).
#
#   scripts/setup-tier.sh [TIER...]    TIER: container wasm gvisor microvm all (no TIER: all)
#
# For each tier: its setup part (scripts/setup.sh PART: packages, rust targets), the release
# build of what runs it (`cordon-full`, which has every command and tier beside the front; the
# gvisor tier's agent), and its guest artifacts (the wasm guests, the microVM image). `all` is
# `make build`. Every step is idempotent: what is in place is kept, and a second run takes
# seconds. Each step prints what it does, how far it is and its time (scripts/phase.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export CORDON_REPO=$repo
. "$here/lib.sh"
cd "$repo"
[ $# -gt 0 ] || set -- all
tiers=()
names=" container wasm gvisor microvm "
for t in "$@"; do
  if [ "$t" = all ]; then
    exec make -C "$repo" build
  elif [[ $names == *" $t "* ]]; then
    tiers+=("$t")
  else
    log "cordon setup: no tier '$t' (tiers:${names}or all)"
    exit 2
  fi
done
parts=(base)
for t in "${tiers[@]}"; do
  [ "$t" = container ] || parts+=("$t")
done
t=$(cargo_target_dir)
export CORDON_PHASE_LOG=${CORDON_PHASE_LOG:-$t/setup-phases.tsv}
phase() { bash "$here/phase.sh" "$@"; }
phase --begin
phase setup -- bash "$here/setup.sh" "${parts[@]}"
phase front -- bash "$here/build-front.sh"
bins=(-p cordon-cli --bin cordon-full)
for x in "${tiers[@]}"; do
  [ "$x" = gvisor ] && bins+=(-p cordon-gvisor --bin cordon-gvisor-agent)
done
phase build -- bash -c '. "$1/lib.sh"; shift; cargo_progress "cordon-full (every command and tier)" build --release "$@"' \
  _ "$here" "${bins[@]}"
for x in "${tiers[@]}"; do
  if [ "$x" = wasm ]; then
    phase guests-wasm -- env CORDON_BIN_DIR="$t/release" bash "$here/guests.d/30-wasm.sh"
  elif [ "$x" = microvm ]; then
    phase guests-microvm -- env CORDON_BIN_DIR="$t/release" bash "$here/guests.d/50-microvm.sh"
  fi
done
phase --report
log "ready: ${tiers[*]} (try \`$t/release/cordon run --tier ${tiers[0]} --lang python -c 'print(1)'\`; \`cordon doctor\` lists every tier)"
