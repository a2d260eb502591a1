#!/usr/bin/env bash
# Base packages: the container tier runs the host's /usr, so Python 3 and bash must be
# there (and python3-matplotlib and python3-pandas: code contexts return figures as PNG and
# chart data, a DataFrame as data, and the SDK tests check that); bubblewrap and crun are peers `cordon bench` compares against; musl-tools builds
# the static helpers (scripts/build-static.sh) and the guest agent; busybox-static is the
# static shell the template tests and the tiers' escape battery build their images from;
# runc is the OCI peer beside crun; make, file and procps are used by the build and tests
# (most images have them; scripts/check-setup.py asks that every package a script or test
# uses is named by a setup step, whether or not the image happens to carry it).
# part: base
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install python3 python3-matplotlib python3-pandas bash coreutils bubblewrap crun runc iproute2 curl \
  ca-certificates musl-tools busybox-static make file procps
# The static front and init (`make demo` builds them for this target; scripts/build-front.sh).
rustup_target_add "$MUSL"
