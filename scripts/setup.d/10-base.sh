#!/usr/bin/env bash
# Base packages: the container tier runs the host's /usr, so Python 3 and bash must be
# there; bubblewrap and crun are peers `cordon bench` compares against.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install python3 bash coreutils bubblewrap crun iproute2 curl ca-certificates
