#!/bin/bash
# What the kernel holds per namespace and per cgroup on this host (ADR 0026, "At 10,000
# live"): 400 of each made at once, unreclaimable slab (SUnreclaim) and kmalloc-1k objects
# per one. Needs root; makes and removes its own cgroups and namespaces, nothing else.
#   scripts/kernel-costs.sh
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "kernel-costs.sh: needs root (namespaces and cgroups)"; exit 1; }
N=400
k1() { awk '$1=="kmalloc-1k"{print $2}' /proc/slabinfo; }
su() { awk '/^SUnreclaim/{print $2}' /proc/meminfo; }
echo "per namespace ($N sleepers, each in a new namespace of one kind; a plain sleeper is ~13 kB):"
for kind in net mount pid ipc uts user cgroup; do
  a=$(k1); b=$(su); pids=()
  for _ in $(seq $N); do
    if [ $kind = user ]; then unshare --user --map-root-user sleep 30 & else unshare --$kind sleep 30 & fi
    pids+=($!)
  done
  sleep 2
  echo "  $kind: kmalloc-1k +$(( ($(k1) - a) / N )), SUnreclaim +$(( ($(su) - b) / N )) kB"
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
done
echo "per cgroup ($N made with mkdir in one v1 hierarchy):"
for ctl in memory pids freezer cpuset; do
  [ -d /sys/fs/cgroup/$ctl ] || { echo "  $ctl: no such hierarchy"; continue; }
  base=/sys/fs/cgroup/$ctl/cordon-kernel-costs-$$
  a=$(k1); b=$(su); mkdir "$base"
  for i in $(seq $N); do mkdir "$base/g$i"; done
  echo "  $ctl: kmalloc-1k +$(( ($(k1) - a) / N )), SUnreclaim +$(( ($(su) - b) / N )) kB"
  for i in $(seq $N); do rmdir "$base/g$i"; done
  rmdir "$base"
done
