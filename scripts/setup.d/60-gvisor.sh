#!/usr/bin/env bash
# The gvisor tier: Debian's runsc (gVisor), from bookworm-backports where that suite is
# configured (50-microvm.sh adds it for QEMU), else bookworm's. Idempotent.
#
# Why backports (docs/gvisor.md, measured on this kind of host): the 2024 build runs
# coreutils `ls` and `stat` (the 2022 build's statx refuses their flags), and an exec in a
# live sandbox is faster on it (ptrace platform).
# part: gvisor
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

have=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
policy=$(apt-cache policy runsc 2>/dev/null || true)
if ! grep -q bookworm-backports <<<"$policy" && [ -e /etc/apt/sources.list.d/cordon-backports.sources ] &&
   [ ! -e /tmp/.cordon-apt-updated ]; then
  $SUDO apt-get update -q >/dev/null
  touch /tmp/.cordon-apt-updated
  policy=$(apt-cache policy runsc 2>/dev/null || true)
fi
if grep -q bookworm-backports <<<"$policy"; then
  # The backports build is newer than bookworm's; install it when what is there is older.
  want=$(awk '/bookworm-backports/ { print prev; exit } NF >= 2 { prev = $(NF - 1) }' <<<"$policy")
  if [ -z "$have" ] || { [ -n "$want" ] && dpkg --compare-versions "$have" lt "$want"; }; then
    log "installing runsc from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
      -t bookworm-backports runsc >/dev/null
  fi
elif [ -z "$have" ]; then
  apt_install runsc
fi
