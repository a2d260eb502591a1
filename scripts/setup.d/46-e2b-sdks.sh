#!/usr/bin/env bash
# The E2B compatibility tests (sdk/python/tests/test_e2b_compat.py, sdk/e2b-js/test.mjs) run
# E2B's own published SDKs, pinned, against a local `cordon serve` (docs/e2b.md).
# Idempotent: installs only what is missing or at another version.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
have_py() { local v; v=$(python3 -m pip show "$1" 2>/dev/null || true); [[ $v == *$'\nVersion: '"$2"$'\n'* ]]; }
if ! have_py e2b 2.63.0 || ! have_py e2b-code-interpreter 2.11.5; then
  log "installing e2b 2.63.0 and e2b-code-interpreter 2.11.5 (pip)"
  python3 -m pip install --quiet --disable-pip-version-check e2b==2.63.0 e2b-code-interpreter==2.11.5
fi
pip_install 'pytest>=7,<9'
# `python`, as E2B's base image has it: the container and gvisor tiers' root is this host's
# /usr, and E2B's tests (and code written for E2B) start `python -m http.server`.
apt_install python-is-python3
# E2B's own test suites (scripts/e2b-suites.sh) have async tests and fixtures.
pip_install 'pytest-asyncio>=1.1,<2'
# The JavaScript SDKs, pinned by sdk/e2b-js/package-lock.json (e2b 2.51.0,
# @e2b/code-interpreter 2.8.0).
js="$(cd "$(dirname "$0")/../../sdk/e2b-js" && pwd)"
if [ ! -f "$js/node_modules/e2b/package.json" ] ||
   [ ! -f "$js/node_modules/@e2b/code-interpreter/package.json" ] ||
   ! cmp -s "$js/package-lock.json" "$js/node_modules/.cordon-installed-lock"; then
  log "installing the E2B JavaScript SDKs (npm ci in sdk/e2b-js)"
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error &&
     cp package-lock.json node_modules/.cordon-installed-lock)
fi
# The wheels of the E2B base template for tiers whose root is Debian's (microvm): matplotlib,
# pandas and what they need, for Debian's Python 3.11, pinned. The test serves them from a loopback
# index to `cordon template build`: no sandbox reaches a public index.
wheels="$(cordon_data_dir)/e2b-wheels"
pins="matplotlib==3.9.2 numpy==2.4.6 pillow==13.0.0 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 packaging==26.4 pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6 pandas==2.2.3 pytz==2025.2 six==1.17.0"
if [ "$(cat "$wheels/.pins" 2>/dev/null)" != "$pins" ]; then
  log "downloading the E2B base template's wheels into $wheels (pip download)"
  mkdir -p "$wheels"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    -d "$wheels" $pins
  printf '%s' "$pins" > "$wheels/.pins"
fi
