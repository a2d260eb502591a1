#!/usr/bin/env bash
# The microvm tier: QEMU 10 (bookworm-backports, added by reusing the mirror URI of the
# existing Debian sources; no host is hard-coded), debootstrap and erofs-utils for the image
# build, and the musl target for the static guest agent. The image itself is built by
# scripts/guests.d/microvm.sh (setup.sh runs it last; `make test` after its build).
# part: microvm
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

# 1. bookworm-backports, with the URI the host's Debian sources already use (lib.sh).
add_bookworm_backports

# 2. QEMU (from backports where the suite exists), image tools.
if ! dpkg-query -W -f='${Status}' qemu-system-x86 2>/dev/null | grep -q "install ok installed"; then
  apt_update_once
  target=()
  policy=$(apt-cache policy qemu-system-x86 2>/dev/null || true)
  if grep -q bookworm-backports <<<"$policy"; then
    target=(-t bookworm-backports)
  fi
  log "installing qemu-system-x86 ${target[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    "${target[@]}" qemu-system-x86 >/dev/null
fi
apt_install debootstrap erofs-utils cpio zstd xz-utils

# 3. The static guest agent's target.
rustup_target_add "$MUSL"
