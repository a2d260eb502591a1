#!/usr/bin/env bash
# `make test`'s last step: builds the static (musl) front and sandbox init that `make build`
# installs (scripts/build-static.sh) and runs a sandbox with them, so a change that breaks
# the musl build or the static binaries fails the tests, not a user's `make demo`.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
  log "static smoke test: SKIPPING, the static helpers are built for x86_64 only"
  [ "${CORDON_REQUIRE_ALL:-}" = 1 ] && { log "CORDON_REQUIRE_ALL=1: failing"; exit 1; }
  exit 0
fi
# The same set the guest image step builds (scripts/lib.sh), so on `make test` this finds
# it built.
build_musl_set
dir=$(musl_dir)
for b in cordon cordon-sandbox-init; do
  if ! file "$dir/$b" | grep -q "static-pie linked"; then
    log "static smoke test: $dir/$b is not a static-pie executable: $(file "$dir/$b")"
    exit 1
  fi
done
# The front finds the init beside it; the run goes through every wall of the tier.
out=$("$dir/cordon" run --json -- sh -c 'echo static-ok; id -u; cat /proc/self/status | grep -E "^(Seccomp|NoNewPrivs):"')
python3 - "$out" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
lines = o["stdout"].splitlines()
assert o["exit_code"] == 0 and o["termination"] == "exited", o
assert lines[0] == "static-ok", lines
assert lines[1] != "0", "the program ran as root inside"
assert "Seccomp:\t2" in lines and "NoNewPrivs:\t1" in lines, lines
PY
log "static smoke test: the static front and init ran a sandbox (seccomp on, no_new_privs, unprivileged)"
