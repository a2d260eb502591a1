#!/usr/bin/env bash
# E2B's own SDK test suites, Python (pytest) and JavaScript (vitest), against a real
# `cordon serve` (docs/e2b.md, "E2B's own test suites"): give checkouts of e2b-dev/E2B and/or
# e2b-dev/code-interpreter; prints each test file's passes, then each suite's totals. The
# suites stay outside this repository.
#   scripts/e2b-suites.sh [--tier container|gvisor] [--lang python|js|all] [--filter TEXT]
#       [--verbose] [--json OUT] DIR...
# Needs `cargo build --workspace --bins` (or CORDON_BIN), setup's E2B SDKs and pytest-asyncio
# (scripts/setup.d/46-e2b-sdks.sh) and the JavaScript suites' npm packages
# (scripts/setup.d/47-e2b-suites-js.sh).
set -euo pipefail
exec python3 "$(dirname "$0")/e2b-suites/run.py" "$@"
