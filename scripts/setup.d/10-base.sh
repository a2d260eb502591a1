#!/usr/bin/env bash
# Base packages: the container tier runs the host's /usr, so Python 3 and bash must be
# there; bubblewrap and crun are peers `cordon bench` compares against; musl-tools builds
# the static helpers (scripts/build-static.sh) and the guest agent.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install python3 bash coreutils bubblewrap crun iproute2 curl ca-certificates musl-tools
