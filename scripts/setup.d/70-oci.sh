#!/usr/bin/env bash
# OCI callers: cordon-oci (crates/cordon-oci) is tested as the runtime of the engines that
# call runc: podman (with runc, the baseline of the start-up comparison), containerd (ctr and
# its CRI plugin) and the docker.io daemon. The tests start each on a private socket and data
# directory; none is enabled as a service here. uidmap gives podman newuidmap; iptables is
# what docker.io's daemon calls (its tests run with bridge and iptables off);
# containernetworking-plugins gives the CRI test's pods their (loopback-only) CNI network;
# nftables gives cordon-oci `nft`, with which it walls a kubelet pod's network namespace
# (docs/adr/0029-oci-pod-cgroup-and-network.md).
# part: oci
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install podman containerd docker.io runc uidmap iptables containernetworking-plugins tar nftables
