#!/usr/bin/env bash
# The E2B compatibility tests (sdk/python/tests/test_e2b_compat.py, sdk/e2b-js/test.mjs) run
# E2B's own published SDKs, pinned, against a local `cordon serve` (docs/e2b.md).
# Idempotent: installs only what is missing or at another version.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
have_py() { local v; v=$(python3 -m pip show "$1" 2>/dev/null || true); [[ $v == *$'\nVersion: '"$2"$'\n'* ]]; }
if ! have_py e2b 2.63.0 || ! have_py e2b-code-interpreter 2.11.5; then
  log "installing e2b 2.63.0 and e2b-code-interpreter 2.11.5 (pip)"
  python3 -m pip install --quiet --disable-pip-version-check e2b==2.63.0 e2b-code-interpreter==2.11.5
fi
pip_install 'pytest>=7,<9'
# The JavaScript SDKs, pinned by sdk/e2b-js/package-lock.json (e2b 2.51.0,
# @e2b/code-interpreter 2.8.0).
js="$(cd "$(dirname "$0")/../../sdk/e2b-js" && pwd)"
if [ ! -f "$js/node_modules/e2b/package.json" ] ||
   [ ! -f "$js/node_modules/@e2b/code-interpreter/package.json" ] ||
   [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
  log "installing the E2B JavaScript SDKs (npm ci in sdk/e2b-js)"
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
fi
