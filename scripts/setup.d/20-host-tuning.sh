#!/usr/bin/env bash
# Host tuning the container tier measured a reason for (docs/adr/0001-container-tier.md):
# moving a process into a cgroup takes a global lock that, by default, waits for an RCU grace
# period on every migration (~15-20 ms here, most of a cold start). The cgroup v2 mount
# option `favordynmods` keeps that lock in its slow-reader mode instead, making migrations
# cheap at a small cost to fork/exit. Applied to the v2 mount (the root on v2 hosts, the
# empty `unified` mount on hybrid ones); harmless where it is already set or unsupported.
# part: base
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" -eq 0 ] || { log "not root: skipping cgroup tuning"; exit 0; }
for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  if [ "$(stat -f -c %T "$m" 2>/dev/null)" = "cgroup2fs" ]; then
    if grep -qE "^cgroup2 $m cgroup2 [^ ]*favordynmods" /proc/mounts; then
      exit 0
    fi
    if mount -o remount,favordynmods "$m" 2>/dev/null; then
      log "cgroup2 mount $m: favordynmods on (fast cgroup migrations)"
    else
      log "cgroup2 mount $m: could not set favordynmods; cold starts will be slower"
    fi
    exit 0
  fi
done
