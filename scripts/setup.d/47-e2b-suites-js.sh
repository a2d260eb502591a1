#!/usr/bin/env bash
# What E2B's own JavaScript test suites need to run from their sources (scripts/e2b-suites.sh,
# docs/e2b.md): the npm packages and vitest at the versions the pinned commits' lockfiles
# resolve, pinned by scripts/e2b-suites/js/{e2b,code-interpreter}/package-lock.json.
# Install scripts are not run (nothing there needs one). Idempotent: `npm ci` only when the
# lockfile differs from the one last installed.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
js="$(cd "$(dirname "$0")/../e2b-suites/js" && pwd)"
for suite in e2b code-interpreter; do
  d="$js/$suite"
  if [ ! -f "$d/node_modules/vitest/package.json" ] ||
     ! cmp -s "$d/package-lock.json" "$d/node_modules/.cordon-installed-lock"; then
    log "installing the $suite JavaScript suite's packages (npm ci in scripts/e2b-suites/js/$suite)"
    (cd "$d" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error &&
       cp package-lock.json node_modules/.cordon-installed-lock)
  fi
done
