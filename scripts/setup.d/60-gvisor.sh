#!/usr/bin/env bash
# The gvisor tier: Debian's runsc (gVisor). Idempotent: installs only when missing.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
if ! command -v runsc >/dev/null 2>&1; then
  apt_install runsc
fi
