#!/usr/bin/env bash
# Base packages: the container tier runs the host's /usr, so Python 3 and bash must be
# there (and python3-matplotlib: code contexts return its figures as PNG, and the SDK
# tests check that); bubblewrap and crun are peers `cordon bench` compares against; musl-tools builds
# the static helpers (scripts/build-static.sh) and the guest agent; busybox-static is the
# static shell the template tests and the tiers' escape battery build their images from.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install python3 python3-matplotlib bash coreutils bubblewrap crun iproute2 curl ca-certificates musl-tools busybox-static
