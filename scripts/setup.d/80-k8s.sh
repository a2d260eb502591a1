#!/usr/bin/env bash
# The one-node Kubernetes that cordon-oci is tried under (scripts/k8s.sh, docs/kubernetes.md):
# every program built from its Go modules, pinned by the wrapper modules in scripts/k8s/modules
# (versions and reasons: docs/adr/0024-kubernetes-from-go-modules.md), once per version, under
# the data dir (go_build in scripts/lib.sh; a second run builds nothing). Go 1.26 and its
# module proxy come with this kind of machine. containerd, runc, iptables and the rest of the
# node's programs are Debian's; this step installs the ones the cluster adds.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

# conntrack: kube-proxy clears a Service's stale entries with it; openssl: the cluster's
# certificates (the test images' busybox is 10-base's busybox-static).
apt_install conntrack openssl

k8s=v1.35.4
GO_BUILD_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$k8s \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$k8s" \
go_build kubernetes "$k8s" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
  kubelet=k8s.io/kubernetes/cmd/kubelet \
  kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
  kubectl=k8s.io/kubernetes/cmd/kubectl
go_build etcd v3.6.17 etcd=go.etcd.io/etcd/server/v3
go_build cni v1.9.1 \
  bridge=github.com/containernetworking/plugins/plugins/main/bridge \
  host-local=github.com/containernetworking/plugins/plugins/ipam/host-local \
  loopback=github.com/containernetworking/plugins/plugins/main/loopback \
  portmap=github.com/containernetworking/plugins/plugins/meta/portmap
go_build crictl v1.34.0 crictl=sigs.k8s.io/cri-tools/cmd/crictl
go_build agent-sandbox v0.5.6 agent-sandbox-controller=sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
go_build pause v1 pause=cordon.local/k8s/pause

# agent-sandbox's CRDs, from the same module as its controller.
crds="$(cordon_data_dir)/k8s/crds/agent-sandbox-v0.5.6"
if [ ! -s "$crds/agents.x-k8s.io_sandboxes.yaml" ]; then
  mod=$(cd "$(dirname "$0")/../k8s/modules/agent-sandbox" &&
    GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/agent-sandbox)
  mkdir -p "$crds"
  cp "$mod"/k8s/crds/*.yaml "$crds/"
  chmod 644 "$crds"/*.yaml
  log "agent-sandbox's CRDs in $crds"
fi
ln -sfn "$(basename "$crds")" "$(dirname "$crds")/agent-sandbox"
