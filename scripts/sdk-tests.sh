#!/usr/bin/env bash
# The SDKs' tests against the workspace's build: the Python SDK's (pytest; arguments go to
# pytest), the TypeScript SDK's (node's test runner) and E2B's JavaScript SDKs against the
# E2B listener (sdk/e2b-js). Both find the `cordon` binary under
# $CARGO_TARGET_DIR or target/ (or $CORDON_BIN). pytest's "no tests collected" (exit 5) is a
# failure here: a suite that silently vanished must not pass. Both suites always run; the
# exit status is a failure when either failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rc=0
# The Python suite's files on $CORDON_SDK_WORKERS workers (pytest-xdist, 2 by default; 0
# runs them in this process): each file whole on one worker, with its own server, as its
# module fixtures expect. One after another they took 970 s of a CI's 1,001 s of tests; on
# two workers beside CI's other jobs 824 s, on three alone 412 s
# (docs/adr/0012-tests-side-by-side.md).
workers=${CORDON_SDK_WORKERS:-2}
xdist=()
if [ "$workers" != 0 ]; then
  xdist=(-n "$workers" --dist loadfile)
fi
(cd "$root/sdk/python" && python3 -m pytest -q "${xdist[@]}" "$@") || rc=$?
if [ "$rc" -eq 5 ]; then
  echo 'sdk/python: pytest collected no tests' >&2
  rc=1
fi
ts=0
(cd "$root/sdk/typescript" && node --test tests/) || ts=$?
if [ "$ts" -ne 0 ]; then
  echo "sdk/typescript: node --test failed ($ts)" >&2
fi
# E2B's own JavaScript SDKs against the E2B listener (docs/e2b.md).
e2b=0
(cd "$root/sdk/e2b-js" && node --test test.mjs) || e2b=$?
if [ "$e2b" -ne 0 ]; then
  echo "sdk/e2b-js: node --test failed ($e2b)" >&2
fi
[ "$rc" -eq 0 ] && [ "$ts" -eq 0 ] && [ "$e2b" -eq 0 ]
