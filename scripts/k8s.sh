#!/usr/bin/env bash
# A one-node Kubernetes for trying cordon-oci as a kubelet drives it (docs/kubernetes.md,
# issue 45), from the programs setup built from their Go modules (scripts/setup.d/80-k8s.sh).
#
#   scripts/k8s.sh up [--cordon-oci PATH]   certificates, etcd, the control plane, containerd
#                                           (runc, cordon, cordon-gvisor, cordon-microvm), the
#                                           node, its RuntimeClasses, the local images and
#                                           agent-sandbox's CRDs and controller
#   scripts/k8s.sh down                     stops it all and leaves nothing behind
#   scripts/k8s.sh kubectl ARGS...          the cluster's kubectl, in its namespace
#   scripts/k8s.sh crictl ARGS...           crictl against the node's containerd
#   scripts/k8s.sh exec CMD ARGS...         CMD in the node's namespace, with the cluster's
#                                           kubectl and ctr on PATH and their configuration
#   scripts/k8s.sh status                   says whether the cluster is up
#   scripts/k8s.sh crash|restart kubelet|containerd
#                                           SIGKILL it as a crash would; start it again
#
# The whole node lives in a network namespace of its own (cordon-k8s): its only links are a
# port-less bridge holding the node's address and the pods' bridge, so no pod or Service
# address is ever routed off the machine. Every process runs in the host's mount namespace
# (nsenter --net, not `ip netns exec`, which would give each its own mounts), so the kubelet's
# volume mounts are the ones containerd and the runtime see. Run as root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

NETNS=cordon-k8s
NODE=cordon-node
NODE_IP=10.255.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
API_SERVICE_IP=10.96.0.1
BIN=$(go_bin_dir)
STATE=$(cordon_data_dir)/k8s/cluster
# The node-side upstream a pod may reach through Cordon's egress proxy (tests start it).
EGRESS_TEST_PORT=19180
RUN=/run/cordon-k8s
PKI=$STATE/pki
LOGS=$STATE/logs
CGROUP_ROOT=cordon-k8s
KUBECONFIG_ADMIN=$STATE/admin.kubeconfig
CONTAINERD_SOCK=$RUN/containerd/containerd.sock
IMAGES=(cordon.local/pause:1 cordon.local/busybox:1)

in_netns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    log "k8s.sh: the node's processes, mounts and cgroups need root; run it as root"
    exit 1
  fi
}

need_binaries() {
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl \
    crictl bridge host-local loopback portmap pause agent-sandbox-controller; do
    if [ ! -x "$BIN/$b" ]; then
      log "k8s.sh: $BIN/$b is missing; fix: \`make setup\` (scripts/setup.d/80-k8s.sh builds it)"
      exit 1
    fi
  done
  export PATH="$BIN:$PATH"
}

is_up() { [ -e "/run/netns/$NETNS" ] && [ -s "$RUN/kube-apiserver.pid" ]; }

# start NAME CMD...: runs CMD in the node's network namespace, in a session of its own, its
# output in $LOGS/NAME.log and its pid in $RUN/NAME.pid.
start() {
  local name=$1
  shift
  setsid nsenter --net="/run/netns/$NETNS" -- "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds; fails naming WHAT and its log.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for i in $(seq "$((secs * 5))"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if [ -s "$RUN/$what.pid" ] && ! kill -0 "$(cat "$RUN/$what.pid")" 2>/dev/null; then
      log "k8s.sh: $what exited; its log: $LOGS/$what.log (last lines below)"
      tail -n 20 "$LOGS/$what.log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
  log "k8s.sh: $what did not come up in ${secs}s; its log: $LOGS/$what.log (last lines below)"
  tail -n 20 "$LOGS/$what.log" >&2 || true
  return 1
}

kubectl_admin() { in_netns kubectl --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# The cluster's certificates: one CA signs every server and client certificate; the service
# accounts' tokens are signed with their own key.
make_pki() {
  mkdir -p "$PKI"
  [ -s "$PKI/ca.crt" ] && return 0
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
      -subj "/CN=cordon-k8s-ca" 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # cert NAME SUBJECT [SANS]: a key and a certificate signed by the CA.
    cert() {
      local ext
      ext=$(mktemp)
      printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n' >"$ext"
      if [ -n "${3:-}" ]; then
        printf 'extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$3" >>"$ext"
      else
        printf 'extendedKeyUsage=clientAuth\n' >>"$ext"
      fi
      openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile "$ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$ext"
    }
    cert apiserver "/CN=kube-apiserver" \
      "IP:$NODE_IP,IP:$API_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    cert admin "/O=system:masters/CN=cordon-admin"
    cert controller-manager "/CN=system:kube-controller-manager"
    cert scheduler "/CN=system:kube-scheduler"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE"
    cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
    cert kube-proxy "/CN=system:kube-proxy"
    cert agent-sandbox "/O=system:masters/CN=agent-sandbox-controller"
    chmod 600 ./*.key
  )
}

# kubeconfig NAME: $STATE/NAME.kubeconfig with the client certificate NAME.
kubeconfig() {
  local f=$STATE/$1.kubeconfig
  kubectl config --kubeconfig "$f" set-cluster cordon --server "https://$NODE_IP:6443" \
    --certificate-authority "$PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$f" set-credentials "$1" --client-certificate "$PKI/$1.crt" \
    --client-key "$PKI/$1.key" --embed-certs >/dev/null
  kubectl config --kubeconfig "$f" set-context cordon --cluster cordon --user "$1" >/dev/null
  kubectl config --kubeconfig "$f" use-context cordon >/dev/null
  chmod 600 "$f"
}

make_netns() {
  if [ ! -e "/run/netns/$NETNS" ]; then
    ip netns add "$NETNS"
  fi
  ip -n "$NETNS" link set lo up
  if ! ip -n "$NETNS" link show cordon0 >/dev/null 2>&1; then
    # The node's address, on a bridge with no port (this kernel has no dummy links), and a
    # default route that drops what it is given: nothing leaves the namespace.
    ip -n "$NETNS" link add cordon0 type bridge
    ip -n "$NETNS" addr add "$NODE_IP/32" dev cordon0
    ip -n "$NETNS" link set cordon0 up
    ip -n "$NETNS" route add blackhole default
    # The Services' addresses are the node's to reach too (kube-proxy's output rules turn
    # them into a pod's address, reached on cni0), as a node's default route gives them.
    ip -n "$NETNS" route add "$SERVICE_CIDR" dev cordon0 src "$NODE_IP"
  fi
  # Per-namespace settings: the node routes between its pods and Services, and bridged pod
  # traffic passes kube-proxy's rules.
  in_netns sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 >/dev/null
}

write_configs() {
  local oci=$1 tier
  mkdir -p "$STATE/cni/net.d" "$STATE/containerd" "$RUN/containerd" "$STATE/kubelet" \
    "$STATE/pod-logs" "$STATE/oci"
  cat >"$STATE/cni/net.d/10-cordon.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cordon-k8s",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # One wrapper per Cordon handler: the shim runs its BinaryName with no arguments of ours, so
  # the tier is named by the node config the wrapper hands cordon-oci.
  for tier in container gvisor microvm; do
    # The node's audit store is the cluster's own, so down removes it with the rest.
    # The kubelet's root dir: a pod's volumes under its own directory there are bound.
    # The egress ceiling names one loopback port of the node's namespace: the upstream the
    # pod egress test starts there (no address is routed off the machine).
    printf 'tier = "%s"\naudit = "%s"\n[kubelet]\nroot_dir = "%s"\n[ceiling]\negress = ["127.0.0.1/32:%s"]\n' \
      "$tier" "$STATE/oci/audit.db" "$STATE/kubelet" "$EGRESS_TEST_PORT" >"$STATE/oci/$tier.toml"
    printf '#!/bin/sh\nexec %s --cordon-config %s "$@"\n' "$oci" "$STATE/oci/$tier.toml" \
      >"$STATE/oci/cordon-oci-$tier"
    chmod 755 "$STATE/oci/cordon-oci-$tier"
  done
  {
    cat <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[debug]
  address = "$RUN/containerd/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${IMAGES[0]}"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # This kind of machine runs its processes without CAP_SYS_RESOURCE, so none may lower an
  # OOM score below its own (the kubelet asks -998 for the pause container): clamp it there.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$BIN"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "$RUN/runc"
EOF
    for tier in container gvisor microvm; do
      local handler=cordon-$tier
      [ "$tier" = container ] && handler=cordon
      cat <<EOF
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$handler]
    runtime_type = "io.containerd.runc.v2"
    pod_annotations = ["cordon.*"]
    container_annotations = ["cordon.*"]
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$handler.options]
      BinaryName = "$STATE/oci/cordon-oci-$tier"
      SystemdCgroup = false
      Root = "$RUN/runc"
EOF
    done
  } >"$STATE/containerd/config.toml"

  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 30\n' \
    "$CONTAINERD_SOCK" "$CONTAINERD_SOCK" >"$STATE/crictl.yaml"

  cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
failSwapOn: false
resolvConf: $STATE/kubelet/resolv.conf
podLogsDir: $STATE/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
evictionPressureTransitionPeriod: 10s
serializeImagePulls: false
localStorageCapacityIsolation: true
EOF
  # The pods' resolv.conf: no DNS server is reachable from the node, and none is named.
  printf 'search default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' \
    >"$STATE/kubelet/resolv.conf"

  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: $POD_CIDR
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# The images the node runs, built from files on this machine and imported into containerd
# (no registry is reachable): the pod sandbox's pause, and a static busybox for tests.
import_images() {
  local dir=$STATE/images busybox=/bin/busybox have f
  mkdir -p "$dir"
  python3 "$here/k8s/image.py" "$dir/pause.tar" "${IMAGES[0]}" --entrypoint /pause \
    --file "pause=$BIN/pause"
  local links=()
  for f in $("$busybox" --list); do [ "$f" = busybox ] || links+=(--link "bin/$f=busybox"); done
  python3 "$here/k8s/image.py" "$dir/busybox.tar" "${IMAGES[1]}" --cmd sh \
    --file "bin/busybox=$busybox" "${links[@]}" --dir tmp --dir etc --dir work
  for f in "$dir/pause.tar" "$dir/busybox.tar"; do
    in_netns ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --no-unpack "$f" >/dev/null
  done
  have=$(in_netns ctr --address "$CONTAINERD_SOCK" -n k8s.io images ls -q)
  for f in "${IMAGES[@]}"; do
    grep -qx "$f" <<<"$have" || { log "k8s.sh: $f was not imported into containerd"; return 1; }
  done
}

up() {
  local oci=""
  while [ $# -gt 0 ]; do
    case $1 in
      --cordon-oci) oci=$2; shift 2 ;;
      *) log "k8s.sh up: unknown argument $1"; exit 2 ;;
    esac
  done
  if is_up; then
    log "the cluster is already up (scripts/k8s.sh down first to start it again)"
    return 0
  fi
  if [ -z "$oci" ]; then
    for oci in "$(cargo_target_dir)/release/cordon-oci" "$(cargo_target_dir)/debug/cordon-oci" ""; do
      [ -x "$oci" ] && break
    done
  fi
  if [ -z "$oci" ] || [ ! -x "$oci" ]; then
    log "k8s.sh up: no cordon-oci build found (looked in $(cargo_target_dir)/{release,debug});" \
      "fix: \`cargo build -p cordon-oci\` or pass --cordon-oci PATH (runc pods run without it)"
    oci=/bin/false
  fi
  if [ -e "/run/netns/$NETNS" ] || [ -e "$RUN" ] || [ -e "$STATE" ]; then
    log "k8s: a cluster that did not come up whole is left; taking it down first"
    down
  fi
  local t0
  t0=$(date +%s)
  mkdir -p "$STATE" "$RUN" "$LOGS"
  # The kubelet writes two places whatever its configuration says (its device plugins'
  # socket, and links to the containers' logs); down removes what it made there.
  for d in /var/lib/kubelet /var/lib/kubelet/device-plugins /var/log/containers; do
    [ -e "$d" ] || echo "$d" >>"$STATE/host-dirs-made"
  done
  make_netns
  make_pki
  for n in admin controller-manager scheduler kubelet kube-proxy agent-sandbox; do kubeconfig "$n"; done
  write_configs "$oci"
  log "k8s: starting etcd"
  start etcd etcd --name cordon --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster cordon=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
  wait_for etcd 60 in_netns curl -sf http://127.0.0.1:2381/health
  log "k8s: starting the control plane"
  start kube-apiserver kube-apiserver --etcd-servers http://127.0.0.1:2379 \
    --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port 6443 \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" \
    --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction --allow-privileged=false \
    --profiling=false --endpoint-reconciler-type lease
  wait_for kube-apiserver 120 kubectl_admin get --raw /readyz
  start kube-controller-manager kube-controller-manager \
    --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --use-service-account-credentials \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --controllers '*,-cloud-node-lifecycle' \
    --profiling=false
  start kube-scheduler kube-scheduler --kubeconfig "$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --profiling=false
  log "k8s: starting containerd"
  start_containerd
  import_images
  log "k8s: starting the node"
  make_cgroup_root
  start_kubelet
  start kube-proxy kube-proxy --config "$STATE/kube-proxy.yaml"
  wait_for kubelet 120 kubectl_admin wait --for=condition=Ready "node/$NODE" --timeout=1s
  # Each pod's sandbox (and its helpers: the monitor, runsc, QEMU) is in the pod's cgroup,
  # so what a tier costs beyond the workload is the pod's overhead, added to its limits and
  # requests (measured idle, docs/kubernetes.md "The pod's cgroup"): gVisor's sentry for
  # the pod's sandbox and each container; on microvm a guest for the pod's sandbox too.
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: cordon}
handler: cordon
overhead: {podFixed: {memory: 16Mi}}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: cordon-gvisor}
handler: cordon-gvisor
overhead: {podFixed: {memory: 96Mi}}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: cordon-microvm}
handler: cordon-microvm
overhead: {podFixed: {memory: 640Mi}}
EOF
  wait_for kube-controller-manager 60 kubectl_admin get serviceaccount default
  start_agent_sandbox
  log "k8s: node $NODE Ready in $(( $(date +%s) - t0 ))s (scripts/k8s.sh kubectl get pods -A; logs in $LOGS)"
}

# agent-sandbox's CRDs (setup's copy from its module) and its controller, on the node as a
# process with a kubeconfig of its own. Its webhook is off, so the CRDs' conversion is None:
# every object is written and read at the storage version (v1beta1).
start_agent_sandbox() {
  local crds crd
  crds=$(readlink -f "$(cordon_data_dir)/k8s/crds/agent-sandbox")
  if [ ! -s "$crds/agents.x-k8s.io_sandboxes.yaml" ]; then
    log "k8s.sh: agent-sandbox's CRDs are missing in $crds; fix: \`make setup\`"
    return 1
  fi
  log "k8s: agent-sandbox's CRDs and controller"
  kubectl_admin apply --server-side -f "$crds" >/dev/null
  for crd in $(kubectl_admin get crd -o name | grep 'agents\.x-k8s\.io$'); do
    kubectl_admin patch "$crd" --type=json \
      -p '[{"op":"replace","path":"/spec/conversion","value":{"strategy":"None"}}]' >/dev/null
  done
  kubectl_admin wait --for condition=established crd --all --timeout=60s >/dev/null
  start agent-sandbox-controller env KUBECONFIG="$STATE/agent-sandbox.kubeconfig" \
    agent-sandbox-controller --enable-webhook=false --manage-webhook-certs=false \
    --leader-elect=false --extensions --metrics-bind-address 127.0.0.1:18080 \
    --health-probe-bind-address 127.0.0.1:18081
  wait_for agent-sandbox-controller 60 in_netns curl -sf http://127.0.0.1:18081/readyz
}

start_containerd() {
  start containerd containerd --config "$STATE/containerd/config.toml"
  wait_for containerd 60 in_netns ctr --address "$CONTAINERD_SOCK" version
}

start_kubelet() {
  start kubelet kubelet --config "$STATE/kubelet/config.yaml" \
    --kubeconfig "$STATE/kubelet.kubeconfig" --root-dir "$STATE/kubelet" \
    --hostname-override "$NODE" --node-ip "$NODE_IP"
}

# crash NAME: SIGKILL to the kubelet or containerd, as a crash would end it (what it started,
# pods and shims, stays); restart NAME: starts it again as up did.
crash() {
  local f=$RUN/$1.pid
  case $1 in kubelet | containerd) ;; *) log "k8s.sh crash: kubelet or containerd, not $1"; exit 2 ;; esac
  [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true
  rm -f "$f"
}

restart() {
  case $1 in
    kubelet) [ -s "$RUN/kubelet.pid" ] || start_kubelet ;;
    containerd) [ -s "$RUN/containerd.pid" ] || start_containerd ;;
    *) log "k8s.sh restart: kubelet or containerd, not $1"; exit 2 ;;
  esac
}

# stop NAME: SIGTERM to the process $RUN/NAME.pid names, SIGKILL after 10 s.
# Whether process $1 still runs (a zombie, ended and waiting for its parent to reap it,
# does not).
running() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Sends process $1 KILL and waits (at most 10 s) until it has ended: a killed process takes
# a while to give its memory back under load, and `down` promises nothing is left.
kill_and_wait() {
  local i
  kill -KILL "$1" 2>/dev/null || return 0
  for i in $(seq 100); do running "$1" || return 0; sleep 0.1; done
}

stop() {
  local f=$RUN/$1.pid pid i
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if running "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do running "$pid" || break; sleep 0.2; done
    kill_and_wait "$pid"
  fi
  rm -f "$f"
}

# The kubelet's cgroup root, in every v1 hierarchy (it creates the pods' cgroups under it).
make_cgroup_root() {
  local hier
  for hier in /sys/fs/cgroup/*/; do
    [ "$hier" = /sys/fs/cgroup/unified/ ] && continue
    [ -e "${hier}cgroup.procs" ] || continue
    mkdir -p "$hier$CGROUP_ROOT"
    if [ -e "${hier}cpuset.cpus" ]; then
      cat "${hier}cpuset.cpus" >"$hier$CGROUP_ROOT/cpuset.cpus"
      cat "${hier}cpuset.mems" >"$hier$CGROUP_ROOT/cpuset.mems"
    fi
  done
}

# The cgroups the node made, deepest first, in every hierarchy (the kubelet's root, and the
# ones the runtimes made under it).
remove_cgroups() {
  local hier dir pid
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
    [ -d "$hier$CGROUP_ROOT" ] || continue
    find "$hier$CGROUP_ROOT" -depth -type d 2>/dev/null | while read -r dir; do
      if [ -r "$dir/cgroup.procs" ]; then
        while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$dir/cgroup.procs"
      fi
      rmdir "$dir" 2>/dev/null || true
    done
  done
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
    if [ -d "$hier$CGROUP_ROOT" ]; then
      sleep 0.5
      find "$hier$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    fi
  done
}

# What the kubelet made outside the node's directories (see up): the links to its containers'
# logs, its device plugins' socket, and those directories when up found them absent.
remove_kubelet_host_files() {
  local f d
  for f in /var/log/containers/*.log; do
    if [ -L "$f" ] && [[ "$(readlink "$f")" == "$STATE/"* ]]; then rm -f "$f"; fi
  done
  if [ -s "$STATE/host-dirs-made" ]; then
    rm -f /var/lib/kubelet/device-plugins/kubelet.sock
    sort -r "$STATE/host-dirs-made" | while read -r d; do rmdir "$d" 2>/dev/null || true; done
  fi
}

# Every mount under the node's directories, deepest first.
unmount_all() {
  local m
  for _ in 1 2 3; do
    awk -v s="$STATE" -v r="$RUN" '{ gsub(/\\040/, " ", $5); if (index($5, s) == 1 || index($5, r) == 1) print $5 }' \
      /proc/self/mountinfo | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
}

down() {
  local pid
  if [ -S "$CONTAINERD_SOCK" ] && [ -s "$RUN/containerd.pid" ]; then
    # The pods first, while the runtime and CNI can still tear them down.
    stop kubelet
    in_netns crictl --config "$STATE/crictl.yaml" rmp -fa >/dev/null 2>&1 || true
  fi
  for n in agent-sandbox-controller kube-proxy kubelet kube-scheduler kube-controller-manager \
    kube-apiserver containerd etcd; do
    stop "$n"
  done
  # What is left in the node's namespace (shims, a runtime's monitor) was started by it.
  if [ -e "/run/netns/$NETNS" ]; then
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do kill_and_wait "$pid"; done
  fi
  remove_cgroups
  # The pods' network namespaces are mounts under containerd's state ($RUN), as the rest.
  unmount_all
  if [ -e "/run/netns/$NETNS" ]; then ip netns delete "$NETNS"; fi
  remove_kubelet_host_files
  rm -rf "$STATE" "$RUN"
  log "k8s: down; nothing of the cluster is left (the Go builds stay in $BIN)"
}

status() {
  if is_up; then
    echo "up: node $NODE in network namespace $NETNS, state in $STATE"
  else
    echo down
    return 1
  fi
}

case "${1:-}" in
  up) shift; need_root; need_binaries; up "$@" ;;
  down) need_root; need_binaries; down ;;
  status) status ;;
  crash | restart)
    need_root; need_binaries
    is_up || { log "k8s.sh: the cluster is not up; fix: scripts/k8s.sh up"; exit 1; }
    "$1" "${2:-}" ;;
  kubectl)
    shift; need_binaries
    is_up || { log "k8s.sh: the cluster is not up; fix: scripts/k8s.sh up"; exit 1; }
    kubectl_admin "$@" ;;
  exec)
    shift; need_root; need_binaries
    is_up || { log "k8s.sh: the cluster is not up; fix: scripts/k8s.sh up"; exit 1; }
    in_netns env KUBECONFIG="$KUBECONFIG_ADMIN" CONTAINERD_ADDRESS="$CONTAINERD_SOCK" \
      CONTAINERD_NAMESPACE=k8s.io "$@" ;;
  crictl)
    shift; need_binaries
    is_up || { log "k8s.sh: the cluster is not up; fix: scripts/k8s.sh up"; exit 1; }
    in_netns crictl --config "$STATE/crictl.yaml" "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
