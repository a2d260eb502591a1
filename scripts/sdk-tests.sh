#!/usr/bin/env bash
# The Python SDK's tests against the workspace's build (sdk/python/tests/conftest.py finds
# the `cordon` binary under $CARGO_TARGET_DIR or target/). pytest's "no tests collected"
# (exit 5) is a failure here: a suite that silently vanished must not pass.
set -euo pipefail
cd "$(dirname "$0")/../sdk/python"
rc=0
python3 -m pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo 'sdk/python: pytest collected no tests' >&2
  exit 1
fi
exit "$rc"
