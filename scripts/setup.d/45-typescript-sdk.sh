#!/usr/bin/env bash
# The TypeScript SDK's one dev dependency, typescript (the exact version sdk/typescript's
# package.json pins), into sdk/typescript/node_modules: its tests compare the checked-in
# dist/ with a fresh tsc build and type-check the README's example. node and npm come with
# the machine. Idempotent: installs only when the installed version is not the pinned one.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
dir=$(cd "$(dirname "$0")/../../sdk/typescript" && pwd)
want=$(node -p "require(process.argv[1]).devDependencies.typescript" "$dir/package.json")
have=$(node -p "try { require(process.argv[1]).version } catch { '' }" \
  "$dir/node_modules/typescript/package.json")
if [ "$have" != "$want" ]; then
  log "installing typescript $want for sdk/typescript (npm)"
  (cd "$dir" && npm install --no-audit --no-fund --no-package-lock)
fi
