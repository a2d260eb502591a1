#!/usr/bin/env bash
# The SDKs' tests against the workspace's build: the Python SDK's (pytest; arguments go to
# pytest) and the TypeScript SDK's (node's test runner). Both find the `cordon` binary under
# $CARGO_TARGET_DIR or target/ (or $CORDON_BIN). pytest's "no tests collected" (exit 5) is a
# failure here: a suite that silently vanished must not pass. Both suites always run; the
# exit status is a failure when either failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rc=0
(cd "$root/sdk/python" && python3 -m pytest -q "$@") || rc=$?
if [ "$rc" -eq 5 ]; then
  echo 'sdk/python: pytest collected no tests' >&2
  rc=1
fi
ts=0
(cd "$root/sdk/typescript" && node --test tests/) || ts=$?
if [ "$ts" -ne 0 ]; then
  echo "sdk/typescript: node --test failed ($ts)" >&2
fi
[ "$rc" -eq 0 ] && [ "$ts" -eq 0 ]
