"""The one-node cluster of scripts/k8s.sh, brought up for real (issue 45; docs/kubernetes.md).

One job of `make test` (scripts/run-tests.py --also k8s=...): the cluster comes up once for
the module, the tests run against it in order, and the last one takes it down and checks that
nothing of it is left on the node. Needs root and the programs setup builds from their Go
modules (scripts/setup.d/80-k8s.sh); without them it SKIPS loudly, or fails under
CORDON_REQUIRE_ALL=1."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "scripts" / "k8s.sh"


def sh(*argv: str, check: bool = True, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["bash", str(K8S), *argv], input=stdin, capture_output=True, text=True,
                       check=False, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"scripts/k8s.sh {' '.join(argv)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def kubectl(*args: str, check: bool = True, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return sh("kubectl", *args, check=check, stdin=stdin, timeout=timeout)


def lib(expr: str) -> str:
    """A value scripts/lib.sh computes (the data dir, the Go programs' directory)."""
    return subprocess.run(["bash", "-c", f". {REPO}/scripts/lib.sh; {expr}"], capture_output=True,
                          text=True, check=True).stdout.strip()


def cordon_oci() -> Path:
    """The workspace's debug build of cordon-oci (make test's), which the node's Cordon
    handlers run (with cordon-sandbox-init and cordon-gvisor-agent beside it)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / "debug" / "cordon-oci"


def missing_capability() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    bin_dir = Path(lib("go_bin_dir"))
    for b in ("kube-apiserver", "kubelet", "etcd", "kubectl", "crictl", "pause"):
        if not os.access(bin_dir / b, os.X_OK):
            return f"{bin_dir / b} is not built (make setup)"
    for b in ("cordon-oci", "cordon-sandbox-init", "cordon-gvisor-agent"):
        if not os.access(cordon_oci().parent / b, os.X_OK):
            return f"{cordon_oci().parent / b} is not built (cargo build --workspace --bins)"
    return None


@pytest.fixture(scope="module")
def cluster():
    why = missing_capability()
    if why:
        if os.environ.get("CORDON_REQUIRE_ALL") == "1":
            pytest.fail(f"the cluster cannot run here: {why}")
        print(f"\nSKIPPING the cluster tests: {why}", flush=True)
        pytest.skip(why)
    if sh("status", check=False).returncode == 0:
        sh("down")
    try:
        sh("up", "--cordon-oci", str(cordon_oci()), timeout=600)
    except (AssertionError, subprocess.TimeoutExpired):
        sh("down", check=False)  # nothing of a cluster that did not come up whole is left
        raise
    yield
    # The last test takes it down and checks; this is for a run stopped before it.
    if sh("status", check=False).returncode == 0:
        sh("down", check=False)


def apply(manifest: str) -> None:
    kubectl("apply", "-f", "-", stdin=manifest)


def wait_ready(pod: str, seconds: int = 180) -> None:
    r = kubectl("wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={seconds}s", check=False,
                timeout=seconds + 30)
    if r.returncode != 0:
        describe = kubectl("describe", "pod", pod, check=False).stdout
        raise AssertionError(f"pod {pod} did not become Ready:\n{r.stderr}\n{describe}")


DEFAULT_POD = """
apiVersion: v1
kind: ConfigMap
metadata: {{name: {name}-config}}
data: {{greeting: "hello from a configMap"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  {runtime_class}
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: cordon.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "{script}"]
    ports: [{{containerPort: 8080}}]
    readinessProbe:
      {probe}
      periodSeconds: 1
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    - {{name: config, mountPath: /config, readOnly: true}}
  volumes:
  - name: scratch
    emptyDir: {{sizeLimit: 16Mi}}
  - name: config
    configMap: {{name: {name}-config}}
"""
# In /tmp: gVisor's root is its own overlay, which the sandbox's user cannot write.
WEB = "mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
HTTP_PROBE = "httpGet: {path: /index.html, port: 8080}"
# An exec probe, on a RuntimeClass whose workload is not in the pod's network namespace.
EXEC_PROBE = 'exec: {command: ["cat", "/config/greeting"]}'


def default_pod(name: str, runtime_class: str = "", script: str = WEB, probe: str = HTTP_PROBE) -> str:
    """The default pod: the service-account token, an emptyDir with a sizeLimit and a
    read-only configMap (all bound from the kubelet's own directory of the pod)."""
    rc = f"runtimeClassName: {runtime_class}" if runtime_class else ""
    return DEFAULT_POD.format(name=name, runtime_class=rc, script=script, probe=probe)


def test_the_node_is_ready_with_the_runtime_classes(cluster) -> None:
    nodes = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == ["cordon-node"]
    info = nodes[0]["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.35.4", info
    assert info["containerRuntimeVersion"].startswith("containerd://1.6"), info
    classes = kubectl("get", "runtimeclass", "-o", "jsonpath={.items[*].handler}").stdout.split()
    assert sorted(classes) == ["cordon", "cordon-gvisor", "cordon-microvm"]


def test_a_default_pod_is_ready_on_runc(cluster) -> None:
    apply(default_pod("default-runc"))
    wait_ready("default-runc")
    token = kubectl("exec", "default-runc", "--", "cat",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token").stdout
    assert token.count(".") == 2, f"not a service account token: {token[:80]!r}"
    assert kubectl("exec", "default-runc", "--", "cat", "/config/greeting").stdout == "hello from a configMap"
    kubectl("exec", "default-runc", "--", "sh", "-c", "echo x > /scratch/f && cat /scratch/f")
    ro = kubectl("exec", "default-runc", "--", "sh", "-c", "echo x > /config/new", check=False)
    assert ro.returncode != 0, "a readOnly configMap volume took a write"
    logs = kubectl("logs", "default-runc").stdout
    assert "error" not in logs.lower(), logs


def test_a_deployment_answers_through_its_service(cluster) -> None:
    apply("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: cordon.local/busybox:1
        imagePullPolicy: Never
        command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
""")
    kubectl("rollout", "status", "deployment/web", "--timeout=180s", timeout=210)
    ip = kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}").stdout
    assert ip.startswith("10.96."), ip
    names = set(kubectl("get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}").stdout.split())
    assert len(names) == 2
    # From the first pod of the default test, through the Service's address (kube-proxy's rules
    # in the node's namespace), until each replica has answered once.
    seen: set[str] = set()
    for _ in range(40):
        # busybox's nc: its static wget crashes on a non-loopback address (glibc's static NSS).
        r = kubectl("exec", "default-runc", "--", "sh", "-c",
                    f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 80", check=False)
        if r.returncode == 0 and r.stdout.startswith("HTTP/1.") and " 200 " in r.stdout.splitlines()[0]:
            seen.add(r.stdout.strip().splitlines()[-1])
        if seen == names:
            break
    assert seen == names, f"answers through the Service came from {seen}, not from every replica {names}"


# The RuntimeClasses whose workload is in the pod's network namespace (ADR 0029): an httpGet
# probe from the node reaches it.
POD_NETWORK = {"cordon", "cordon-gvisor"}


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor"])
def test_a_default_pod_is_ready_on_cordon(cluster, runtime_class: str) -> None:
    name = f"default-{runtime_class}"
    if runtime_class in POD_NETWORK:
        apply(default_pod(name, runtime_class))
    else:
        apply(default_pod(name, runtime_class, script="exec sleep 1000", probe=EXEC_PROBE))
    wait_ready(name)
    out = kubectl("exec", name, "--", "grep", "CapEff", "/proc/self/status").stdout.split()
    assert out == ["CapEff:", "0000000000000000"], out
    token = kubectl("exec", name, "--", "cat",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token").stdout
    assert token.count(".") == 2, f"not a service account token: {token[:80]!r}"
    assert kubectl("exec", name, "--", "cat", "/config/greeting").stdout == "hello from a configMap"
    kubectl("exec", name, "--", "sh", "-c", "echo x > /scratch/f && cat /scratch/f")
    ro = kubectl("exec", name, "--", "sh", "-c", "echo x > /config/new", check=False)
    assert ro.returncode != 0, "a readOnly configMap volume took a write"
    # The emptyDir's write is in the kubelet's directory of the pod.
    uid = kubectl("get", "pod", name, "-o", "jsonpath={.metadata.uid}").stdout
    state = Path(lib("cordon_data_dir")) / "k8s" / "cluster"
    scratch = state / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    assert (scratch / "f").read_text() == "x\n"
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def test_an_emptydir_past_its_size_limit_is_evicted_on_cordon(cluster) -> None:
    # The emptyDir is the kubelet's own directory, so its measure of the volume sees the
    # workload's writes, and it evicts the pod as it would on runc.
    name = "full-cordon"
    apply(default_pod(name, "cordon", script="dd if=/dev/zero of=/scratch/big bs=1M count=24; exec sleep 1000",
                      probe=EXEC_PROBE))
    reason = ""
    for _ in range(180):
        pod = json.loads(kubectl("get", "pod", name, "-o", "json").stdout)
        reason = pod["status"].get("reason", "")
        if reason == "Evicted":
            break
        time.sleep(1)
    assert reason == "Evicted", f"the pod past its emptyDir's sizeLimit was not evicted: {pod['status']}"
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def test_a_host_path_pod_is_refused_on_cordon(cluster) -> None:
    apply("""
apiVersion: v1
kind: Pod
metadata: {name: hostpath-cordon}
spec:
  runtimeClassName: cordon
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: task
    image: cordon.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "cat /host/passwd; exec sleep 1000"]
    volumeMounts: [{name: etc, mountPath: /host, readOnly: true}]
  volumes:
  - name: etc
    hostPath: {path: /etc}
""")
    message = ""
    for _ in range(90):
        pod = json.loads(kubectl("get", "pod", "hostpath-cordon", "-o", "json").stdout)
        for st in pod["status"].get("containerStatuses", []):
            message = st.get("state", {}).get("waiting", {}).get("message", "") or message
            assert "running" not in st.get("state", {}), "a hostPath pod ran on cordon"
        if "cordon-oci refuses this container" in message:
            break
        time.sleep(1)
    assert "cordon-oci refuses this container" in message and "host path" in message, message
    kubectl("delete", "pod", "hostpath-cordon", "--timeout=60s", timeout=90)


PLAIN_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  runtimeClassName: {runtime_class}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: task
    image: cordon.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo started on $(uname -s); exec sleep 1000"]
"""


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor", "cordon-microvm"])
def test_a_pod_without_volumes_runs_behind_cordons_walls(cluster, runtime_class: str) -> None:
    # The pod's sandbox (pause) and its container both on cordon-oci: no capability, the
    # sandbox's own user, on gvisor gVisor's kernel, on microvm the guest's (which refuses a
    # pod's volumes: its guest reaches no host directory).
    name = f"plain-{runtime_class}"
    apply(PLAIN_POD.format(name=name, runtime_class=runtime_class))
    wait_ready(name)
    status = kubectl("exec", name, "--", "sh", "-c", "grep CapEff /proc/self/status; id -u").stdout.split()
    assert status[:2] == ["CapEff:", "0000000000000000"], status
    # The container tier's workload is the sandbox's user 1000; gVisor's sandbox shows it
    # under the id range the monitor leased. Never root.
    assert status[2] != "0" and (status[2] == "1000" or runtime_class != "cordon"), status
    dmesg = kubectl("exec", name, "--", "dmesg", check=False).stdout
    assert ("gVisor" in dmesg) == (runtime_class == "cordon-gvisor"), dmesg[:200]
    # The container tier shares the node's kernel; the microVM's guest runs its own.
    kernel = kubectl("exec", name, "--", "uname", "-r").stdout.strip()
    if runtime_class == "cordon":
        assert kernel == os.uname().release, kernel
    if runtime_class == "cordon-microvm":
        assert kernel != os.uname().release, kernel
    assert kubectl("logs", name).stdout.startswith("started on Linux")
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def node_get(url: str) -> str:
    """The body of an HTTP GET from the node's namespace (no proxy), or the error."""
    code = ("import http.client, sys, urllib.parse\n"
            "u = urllib.parse.urlsplit(sys.argv[1])\n"
            "c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=5)\n"
            "c.request('GET', u.path or '/'); r = c.getresponse(); print(r.status, r.read().decode().strip())\n")
    r = sh("exec", "python3", "-c", code, url, check=False, timeout=30)
    return r.stdout.strip() or r.stderr.strip()


def node_process(*argv: str) -> subprocess.Popen[str]:
    """A process in the node's namespace, in a session of its own (ended by end_process);
    its first line of output has been read."""
    p = subprocess.Popen(["timeout", "300", "bash", str(K8S), "exec", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert p.stdout is not None
    first = p.stdout.readline()
    assert first, f"{argv} said nothing"
    p.first_line = first  # type: ignore[attr-defined]
    return p


def end_process(p: subprocess.Popen[str]) -> str:
    os.killpg(p.pid, 9)
    out, _ = p.communicate(timeout=30)
    return out


CORDON_WEB = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: cordon-web}
spec:
  replicas: 2
  selector: {matchLabels: {app: cordon-web}}
  template:
    metadata: {labels: {app: cordon-web}}
    spec:
      runtimeClassName: cordon
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: cordon.local/busybox:1
        imagePullPolicy: Never
        # The pod's name from the downward API (a Cordon sandbox's hostname is its own).
        env: [{name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        command: ["sh", "-c", "mkdir -p /www && echo $POD > /www/index.html && exec httpd -f -p 8080 -h /www"]
        readinessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: cordon-web}
spec:
  selector: {app: cordon-web}
  ports: [{port: 80, targetPort: 8080}]
"""


def test_a_deployment_on_cordon_answers_through_its_service(cluster) -> None:
    # Ready by httpGet probes from the kubelet; its Service's address answers from a pod (on
    # runc: a Cordon pod's own egress is walled) and from the node, every replica in turn.
    apply(CORDON_WEB)
    kubectl("rollout", "status", "deployment/cordon-web", "--timeout=180s", timeout=210)
    ip = kubectl("get", "service", "cordon-web", "-o", "jsonpath={.spec.clusterIP}").stdout
    names = set(kubectl("get", "pods", "-l", "app=cordon-web", "-o",
                        "jsonpath={.items[*].metadata.name}").stdout.split())
    assert len(names) == 2
    from_pod: set[str] = set()
    from_node: set[str] = set()
    for _ in range(40):
        r = kubectl("exec", "default-runc", "--", "sh", "-c",
                    f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 80", check=False)
        if r.returncode == 0 and " 200 " in (r.stdout.splitlines() or [""])[0]:
            from_pod.add(r.stdout.strip().splitlines()[-1])
        answer = node_get(f"http://{ip}/")
        if answer.startswith("200 "):
            from_node.add(answer.split()[1])
        if from_pod == names and from_node == names:
            break
    assert from_pod == names, f"from a pod the Service answered from {from_pod}, not {names}"
    assert from_node == names, f"from the node the Service answered from {from_node}, not {names}"


def test_port_forward_reaches_a_cordon_pod(cluster) -> None:
    # containerd dials the port on the pod's loopback, inside the pod's namespace.
    pod = kubectl("get", "pods", "-l", "app=cordon-web", "-o", "jsonpath={.items[0].metadata.name}").stdout
    forward = node_process("kubectl", "port-forward", f"pod/{pod}", "0:8080")
    try:
        line = forward.first_line  # type: ignore[attr-defined]
        assert line.startswith("Forwarding from 127.0.0.1:"), line
        port = int(line.split("127.0.0.1:")[1].split()[0])
        assert node_get(f"http://127.0.0.1:{port}/") == f"200 {pod}"
    finally:
        end_process(forward)
    kubectl("delete", "deployment", "cordon-web", "--timeout=60s", timeout=90)
    kubectl("delete", "service", "cordon-web", "--timeout=60s", timeout=90)


# What the pod egress test's node side listens on (0.0.0.0 of the node's namespace): one
# port, answered with a line the pod must never read.
NODE_LISTENER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 19181)); s.listen(16); print("listening", flush=True)
while True:
    c, a = s.accept(); print("GOT", a[0], flush=True); c.sendall(b"node-listener\\n"); c.close()
"""
EGRESS_PORT = 19180  # scripts/k8s.sh's EGRESS_TEST_PORT: the node's ceiling names it
METADATA = "169.254.169.254"


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor"])
def test_a_cordon_pods_egress_goes_only_through_the_proxy(cluster, runtime_class: str) -> None:
    # The pod's wall (ADR 0029): from inside a pod in the pod's network namespace, the
    # node's addresses, the metadata address and another pod's address are refused at once,
    # each with a listener there that a pod without the wall reaches (the metadata address
    # is put on the node's loopback for the test: routed by the pod's default route to the
    # node, never off the machine); an annotated host is reached through Cordon's proxy.
    name = f"egress-{runtime_class}"
    apply(f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{cordon.allow-hosts: "127.0.0.1/32:{EGRESS_PORT}"}}
spec:
  runtimeClassName: {runtime_class}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: task, image: cordon.local/busybox:1, imagePullPolicy: Never, command: ["sleep", "1000"]}}
""")
    wait_ready(name)
    runc_ip = kubectl("get", "pod", "default-runc", "-o", "jsonpath={.status.podIP}").stdout
    sh("exec", "ip", "addr", "add", f"{METADATA}/32", "dev", "lo")
    listener = node_process("python3", "-c", NODE_LISTENER)
    upstream = node_process("python3", "-u", "-c",
                            "import http.server as h, sys\n"
                            "class A(h.BaseHTTPRequestHandler):\n"
                            "  def do_GET(self):\n"
                            "    self.send_response(200); self.end_headers(); self.wfile.write(b'upstream-ok')\n"
                            f"s = h.HTTPServer(('127.0.0.1', {EGRESS_PORT}), A); print('up', flush=True); s.serve_forever()\n")
    try:
        targets = [f"10.255.0.1:19181", "10.244.0.1:19181", f"{METADATA}:19181", f"{runc_ip}:8080",
                   "10.96.0.1:443"]
        probe = ("for t in " + " ".join(targets) + "; do "
                 "if out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${t%:*} ${t#*:} 2>&1); "
                 "then echo \"REACHED $t $out\"; else echo \"refused $t\"; fi; done")
        out = kubectl("exec", name, "--", "sh", "-c", probe).stdout
        assert "REACHED" not in out and out.count("refused") == len(targets), out
        # Nothing in the sandbox can change the pod namespace's routes, links or addresses
        # (it holds no capability in the node's user namespace, which owns that namespace;
        # on the container tier its filter refuses netlink sockets outright). The wall and
        # the proxy are then checked again below.
        for change in ("ip route del default", "ip link set lo down",
                       "ip addr add 10.9.9.9/32 dev lo", "ip route add 10.255.0.1/32 dev eth0"):
            r = kubectl("exec", name, "--", "sh", "-c", change, check=False)
            assert r.returncode != 0, f"`{change}` changed the pod's network: {r}"
        again = kubectl("exec", name, "--", "sh", "-c", probe).stdout
        assert "REACHED" not in again, again
        allowed = kubectl("exec", name, "--", "wget", "-qO-", f"http://127.0.0.1:{EGRESS_PORT}/", check=False)
        assert allowed.stdout == "upstream-ok", f"the allowed upstream through the proxy: {allowed}"
        other = kubectl("exec", name, "--", "wget", "-qO-", f"http://127.0.0.1:{EGRESS_PORT + 1}/", check=False)
        assert other.returncode != 0 and "403" in other.stderr, f"an unlisted port through the proxy: {other}"
        # The metadata and a private address asked of the proxy itself are refused too.
        for refused in (f"http://{METADATA}/", "http://10.255.0.1:19181/"):
            r = kubectl("exec", name, "--", "wget", "-qO-", refused, check=False)
            assert r.returncode != 0 and "403" in r.stderr, f"{refused} through the proxy: {r}"
    finally:
        heard = end_process(listener)
        end_process(upstream)
        sh("exec", "ip", "addr", "del", f"{METADATA}/32", "dev", "lo", check=False)
    assert "GOT" not in heard, f"the node-side listener was reached from the pod: {heard}"
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)
    # The proxy's decisions are in the node's audit store, each row naming the pod.
    wants = {("127.0.0.1", EGRESS_PORT, "allow"), ("127.0.0.1", EGRESS_PORT + 1, "deny"),
             (METADATA, 80, "deny"), ("10.255.0.1", 19181, "deny")}
    got: set = set()
    for _ in range(30):  # the monitor writes its last rows as the sandbox ends
        got = {(r.get("host"), r.get("port"), r.get("decision")) for r in egress_rows(f"default/{name}")}
        if wants <= got:
            break
        time.sleep(1)
    assert wants <= got, f"audit rows naming the pod: missing {wants - got}; its rows: {sorted(map(str, got))}"


def egress_rows(pod: str) -> list[dict]:
    """The node's egress audit rows (their details) naming kubelet pod `pod`."""
    import sqlite3
    db = Path(lib("cordon_data_dir")) / "k8s" / "cluster" / "oci" / "audit.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        details = [json.loads(d) for (d,) in con.execute(
            "SELECT detail FROM events WHERE kind = 'egress'")]
    finally:
        con.close()
    return [d for d in details if d.get("pod") == pod]


def test_a_sidecar_reaches_its_pods_server_on_localhost(cluster) -> None:
    # Two containers of one `cordon` pod share its namespace: the sidecar reaches the web
    # container on localhost, and each has an egress forwarder of its own on the pod's
    # loopback (ports differ), both reaching the annotated upstream through the proxy.
    name = "sidecar-cordon"
    apply(f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{cordon.allow-hosts: "127.0.0.1/32:{EGRESS_PORT}"}}
spec:
  runtimeClassName: cordon
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: cordon.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "{WEB}"]
    readinessProbe: {{httpGet: {{path: /index.html, port: 8080}}, periodSeconds: 1}}
  - {{name: side, image: cordon.local/busybox:1, imagePullPolicy: Never, command: ["sleep", "1000"]}}
""")
    wait_ready(name)
    upstream = node_process("python3", "-u", "-m", "http.server", str(EGRESS_PORT), "--bind", "127.0.0.1",
                            "--directory", "/proc/self")
    try:
        assert kubectl("exec", name, "-c", "side", "--", "sh", "-c",
                       "unset http_proxy HTTP_PROXY; wget -qO- http://127.0.0.1:8080/index.html").stdout == "ok\n"
        ports = {c: kubectl("exec", name, "-c", c, "--", "sh", "-c", "echo $HTTP_PROXY").stdout.strip()
                 for c in ("web", "side")}
        assert len(set(ports.values())) == 2 and all(p.startswith("http://127.0.0.1:") for p in ports.values()), ports
        for c in ("web", "side"):
            r = kubectl("exec", name, "-c", c, "--", "wget", "-qO-", f"http://127.0.0.1:{EGRESS_PORT}/", check=False)
            assert r.returncode == 0 and "Directory listing" in r.stdout, f"{c} through its forwarder: {r}"
    finally:
        end_process(upstream)
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def kube_battery() -> Path:
    """The escape battery's driver through kubectl (crates/cordon-testkit/examples), built by
    make test's examples phase beside cordon-oci."""
    return cordon_oci().parent / "examples" / "kube_battery"


def battery(runtime_class: str, tier: str) -> subprocess.CompletedProcess[str]:
    """Every case of the escape battery in pods of `runtime_class`, each probe a `kubectl
    exec`, run inside the node's namespace (so the network cases' host is the node), after
    the battery's image is imported into the node's containerd."""
    return sh("exec", str(kube_battery()), runtime_class, tier, "--import", check=False, timeout=1200)


def node_pods_left(label: str, seconds: int = 90) -> list[str]:
    """The pod sandboxes the node's containerd still holds with `label` after up to `seconds`:
    a pod deleted from the API must also end on the node (its workload killed, its sandbox
    removed), or a workload could outlive its deletion."""
    left: list[str] = []
    for _ in range(seconds):
        left = sh("crictl", "pods", "--label", label, "-q").stdout.split()
        if not left:
            break
        time.sleep(1)
    return left


def failed_cases(r: subprocess.CompletedProcess[str]) -> str:
    """The battery's lines that say what failed. A panic's message is on the line after its
    `thread '…' panicked at` line, and a failed pod create or probe says why only there, so
    that line is kept too (a gVisor pod's create once failed with only the case's name kept)."""
    lines = (r.stdout + r.stderr).splitlines()
    kept: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith(("escape case", "thread", "kube_battery")) or any(
                word in line for word in ("ALLOWED", "OPENED", "WROTE")):
            kept.append(line)
            if "panicked at" in line and i + 1 < len(lines):
                kept.append(lines[i + 1])
    return "\n".join(kept)


@pytest.mark.parametrize("runtime_class,tier", [("cordon", "container"), ("cordon-gvisor", "gvisor")])
def test_the_escape_battery_passes_through_kubectl_exec(cluster, runtime_class: str, tier: str) -> None:
    r = battery(runtime_class, tier)
    assert r.returncode == 0, failed_cases(r)
    assert f"every case passed on {runtime_class}" in r.stdout, r.stdout
    # Every pod of the battery is gone, from the API and from the node.
    assert pods_gone("cordon-test=escape") == []
    assert node_pods_left("cordon-test=escape") == []


def test_the_escape_battery_sees_what_runc_lets_through(cluster) -> None:
    # The same battery on the node's default handler, runc: it must fail, naming the walls runc
    # does not have (a root workload with raw sockets, user namespaces and a writable root), or
    # it would prove nothing on Cordon's classes.
    r = battery("runc", "container")
    assert r.returncode != 0, r.stdout
    said = r.stdout + r.stderr
    for seen in ("OPENED packet", "unshare-user ALLOWED", "WROTE /usr/"):
        assert seen in said, failed_cases(r)
    assert pods_gone("cordon-test=escape") == []


TASK_POD = """
    spec:
      runtimeClassName: cordon
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 2
      containers:
      - name: agent
        image: cordon.local/busybox:1
        imagePullPolicy: Never
        command: ["sh", "-c", "exec sleep 100000"]
"""


def pods_gone(selector: str, seconds: int = 90) -> list[str]:
    """The pods `selector` still names after up to `seconds` (none, once they are deleted)."""
    left: list[str] = []
    for _ in range(seconds):
        left = kubectl("get", "pods", "-l", selector, "-o", "name").stdout.split()
        if not left:
            break
        time.sleep(1)
    return left


def test_an_agent_sandbox_on_cordon_is_created_reached_and_deleted(cluster) -> None:
    apply("""
apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {name: task-1, labels: {test: task-1}}
spec:
  podTemplate:
    metadata: {labels: {test: task-1}}
""" + TASK_POD)
    kubectl("wait", "--for=condition=Ready", "sandbox/task-1", "--timeout=120s", timeout=150)
    pod = kubectl("get", "pod", "task-1", "-o", "json")
    assert json.loads(pod.stdout)["spec"]["runtimeClassName"] == "cordon"
    assert kubectl("get", "pods", "-l", "test=task-1", "-o", "name").stdout.split() == ["pod/task-1"]
    out = kubectl("exec", "task-1", "--", "sh", "-c", "echo reached; grep CapEff /proc/self/status").stdout.split()
    assert out == ["reached", "CapEff:", "0000000000000000"], out
    kubectl("delete", "sandbox", "task-1", "--timeout=60s", timeout=90)
    assert pods_gone("test=task-1") == [], "the sandbox's pod outlived it"


def test_an_agent_sandbox_warm_pool_on_cordon_serves_a_claim(cluster) -> None:
    apply("""
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: cordon-task}
spec:
  podTemplate:
    metadata: {labels: {test: pool}}
""" + TASK_POD + """
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: cordon-pool}
spec:
  replicas: 2
  sandboxTemplateRef: {name: cordon-task}
""")
    ready = ""
    for _ in range(120):
        ready = kubectl("get", "sandboxwarmpool", "cordon-pool", "-o", "jsonpath={.status.readyReplicas}").stdout
        if ready == "2":
            break
        time.sleep(1)
    assert ready == "2", f"the warm pool has {ready or 0} ready sandboxes, not 2"
    warm = set(kubectl("get", "pods", "-l", "test=pool", "-o", "jsonpath={.items[*].metadata.name}").stdout.split())
    assert len(warm) == 2, warm
    apply("""
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: claim-1}
spec:
  warmPoolRef: {name: cordon-pool}
""")
    kubectl("wait", "--for=condition=Ready", "sandboxclaim/claim-1", "--timeout=120s", timeout=150)
    got = kubectl("get", "sandboxclaim", "claim-1", "-o", "jsonpath={.status.sandbox.name}").stdout
    assert got in warm, f"the claim got {got!r}, not one of the warm pool's sandboxes {warm}"
    assert kubectl("exec", got, "--", "echo", "claimed").stdout.strip() == "claimed"
    kubectl("delete", "sandboxclaim", "claim-1", "--timeout=60s", timeout=90)
    kubectl("delete", "sandboxwarmpool", "cordon-pool", "--timeout=60s", timeout=90)
    kubectl("delete", "sandboxtemplate", "cordon-task", "--timeout=60s", timeout=90)
    assert pods_gone("test=pool") == [], "the warm pool's pods outlived it"


def containers(names: list[str]) -> dict[str, tuple[str, int]]:
    """Each pod's container id and restart count."""
    out = {}
    for name in names:
        st = json.loads(kubectl("get", "pod", name, "-o", "json").stdout)["status"]["containerStatuses"][0]
        out[name] = (st.get("containerID", ""), st["restartCount"])
    return out


def test_pods_live_through_a_crash_of_the_kubelet_and_of_containerd(cluster) -> None:
    names = ["survivor-runc", "survivor-cordon"]
    apply(PLAIN_POD.format(name=names[0], runtime_class="null"))
    apply(PLAIN_POD.format(name=names[1], runtime_class="cordon"))
    for n in names:
        wait_ready(n)
    before = containers(names)
    for component in ("kubelet", "containerd"):
        sh("crash", component)
        sh("restart", component)
        kubectl("wait", "--for=condition=Ready", "node/cordon-node", "--timeout=120s", timeout=150)
        for n in names:
            wait_ready(n)
            # The same container, never restarted, and still served (exec goes through both),
            # once the restarted kubelet knows its pods again (until then the API server's
            # status is its predecessor's and an exec answers "pod does not exist").
            r = None
            for _ in range(60):
                r = kubectl("exec", n, "--", "echo", "alive", check=False)
                if r.returncode == 0:
                    break
                time.sleep(1)
            assert r is not None and r.stdout.strip() == "alive", (component, n, r and r.stderr)
        assert containers(names) == before, f"after a crash of {component}"
    for n in names:
        kubectl("delete", "pod", n, "--timeout=60s", timeout=90)
    # Their sandboxes stopped (the kubelet's garbage collector removes them later; down
    # checks that nothing is left at all).
    sandboxes: list[str] = []
    for _ in range(60):
        sandboxes = sh("crictl", "pods", "--name", "survivor-", "--state", "ready", "-q").stdout.split()
        if not sandboxes:
            break
        time.sleep(1)
    assert not sandboxes, f"pod sandboxes still running after their pods were deleted: {sandboxes}"


def monitors(cid: str) -> list[tuple[int, list[bytes]]]:
    """cordon-oci's monitors of container `cid` alive on the node: (pid, argv)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # A zombie's cmdline is empty, so one waiting for its reaper is not counted.
        if b"__monitor" in argv and cid.encode() in argv:
            out.append((int(p.name), argv))
    return out


def cgroups_of(cid: str) -> list[str]:
    """The node's cgroup directories (every v1 hierarchy) named for container `cid`."""
    found = []
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "cordon-k8s"
        if not top.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(top):
            found += [f"{dirpath}/{d}" for d in dirnames if cid in d]
    return found


def gone(cid: str, root: Path, seconds: int = 90) -> list[str]:
    """What is left of container `cid` after `seconds`: its monitors, cgroups, record."""
    left: list[str] = []
    for _ in range(seconds):
        left = [f"monitor {pid}" for pid, _ in monitors(cid)] + cgroups_of(cid)
        if (root / cid).exists():
            left.append(str(root / cid))
        if not left:
            break
        time.sleep(1)
    return left


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor"])
def test_a_killed_monitor_is_restarted_and_leaves_nothing(cluster, runtime_class: str) -> None:
    """SIGKILL to a Cordon container's monitor (the process the shim watches): its sandbox
    ends with it, the kubelet starts the container again (one restart, a new container),
    and the killed one leaves no monitor, cgroup or record; after the pod is deleted,
    neither does the new one."""
    import signal
    name = f"monitor-{runtime_class}"
    apply(PLAIN_POD.format(name=name, runtime_class=runtime_class))
    wait_ready(name)
    first, restarts = containers([name])[name]
    assert restarts == 0
    cid = first.split("://", 1)[1]
    found = monitors(cid)
    assert len(found) == 1, f"monitors of {cid}: {found}"
    pid, argv = found[0]
    root = Path(argv[argv.index(b"--root") + 1].decode())
    os.kill(pid, signal.SIGKILL)
    again = ("", 0)
    for _ in range(120):
        again = containers([name])[name]
        if again[1] >= 1 and again[0] and again[0] != first:
            break
        time.sleep(1)
    assert again[1] == 1 and again[0] != first, f"not restarted once: {again} (was {first})"
    wait_ready(name)
    assert kubectl("exec", name, "--", "echo", "alive").stdout.strip() == "alive"
    assert gone(cid, root) == [], "the killed container left these"
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)
    second = again[0].split("://", 1)[1]
    assert gone(second, root) == [], "the deleted pod's container left these"


MIB = 1 << 20

FILLED_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{cordon.tmp: 128M}}
spec:
  runtimeClassName: {runtime_class}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: task
    image: cordon.local/busybox:1
    imagePullPolicy: Never
    # 64 MiB in /tmp (a tmpfs: its pages are the writer's memory), then idle.
    command: ["sh", "-c", "head -c 67108864 /dev/zero > /tmp/fill && touch /tmp/done && exec sleep 100000"]
    readinessProbe: {{exec: {{command: ["test", "-f", "/tmp/done"]}}, periodSeconds: 1}}
    resources:
      requests: {{memory: 64Mi, cpu: 100m}}
      limits: {{memory: {memory}, cpu: 500m}}
"""


def container_id(pod: str) -> str:
    st = json.loads(kubectl("get", "pod", pod, "-o", "json").stdout)["status"]["containerStatuses"][0]
    return st["containerID"].split("://", 1)[1]


def cri_memory(cid: str) -> int:
    """The container's working set as containerd reports it (`crictl stats`, CRI stats)."""
    stats = json.loads(sh("crictl", "stats", "-o", "json", "--id", cid).stdout)["stats"]
    return int(stats[0]["memory"]["workingSetBytes"]["value"]) if stats else 0


def summary_memory(pod: str) -> tuple[int, int]:
    """The pod's and its container's working set in the kubelet's summary API."""
    summary = json.loads(kubectl("get", "--raw", "/api/v1/nodes/cordon-node/proxy/stats/summary").stdout)
    for p in summary["pods"]:
        if p["podRef"]["name"] == pod:
            ws = p.get("memory", {}).get("workingSetBytes", 0)
            return ws, sum(c.get("memory", {}).get("workingSetBytes", 0) for c in p["containers"])
    return 0, 0


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor"])
def test_the_pods_cgroup_counts_its_workload(cluster, runtime_class: str) -> None:
    # The sandbox is in the pod's cgroup (linux.cgroupsPath): containerd's CRI stats (the
    # cgroup of the container's process, cordon-oci's monitor) and the kubelet's summary (the
    # pod's cgroup) count the 64 MiB the workload holds, not the node's root cgroup (the old
    # code: over a GB for an idle sleep) and not nothing (the old summary: 0 bytes).
    name = f"filled-{runtime_class}"
    apply(FILLED_POD.format(name=name, runtime_class=runtime_class, memory="256Mi"))
    wait_ready(name)
    cid = container_id(name)
    cri = summary = (0, 0)
    for _ in range(60):  # the kubelet's and containerd's figures are sampled (every ~10 s)
        cri = cri_memory(cid)
        summary = summary_memory(name)
        if cri >= 64 * MIB and min(summary) >= 64 * MIB:
            break
        time.sleep(1)
    print(f"\n{runtime_class}: CRI working set {cri / MIB:.1f} MiB, summary pod "
          f"{summary[0] / MIB:.1f} MiB, container {summary[1] / MIB:.1f} MiB (64 MiB held)")
    assert 64 * MIB <= cri <= 256 * MIB, f"crictl stats: {cri} bytes for a container holding 64 MiB"
    assert 64 * MIB <= summary[0] <= 384 * MIB, f"summary: the pod has {summary[0]} bytes"
    assert 64 * MIB <= summary[1] <= 256 * MIB, f"summary: its container has {summary[1]} bytes"
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def resize_memory(pod: str, memory: str) -> None:
    """Resizes the pod's container in place and waits until the kubelet says it is done."""
    patch = {"spec": {"containers": [{"name": "task", "resources": {
        "requests": {"memory": "64Mi", "cpu": "100m"}, "limits": {"memory": memory, "cpu": "500m"}}}]}}
    kubectl("patch", "pod", pod, "--subresource", "resize", "--patch", json.dumps(patch))
    status: dict = {}
    for _ in range(60):
        status = json.loads(kubectl("get", "pod", pod, "-o", "json").stdout)["status"]
        done = status["containerStatuses"][0].get("resources", {}).get("limits", {}).get("memory") == memory
        resizing = [c for c in status.get("conditions", []) if c["type"].startswith("PodResize")]
        if done and not resizing:
            return
        time.sleep(1)
    raise AssertionError(f"the resize of {pod} to {memory} did not complete: {json.dumps(status)[:2000]}")


def allocates(pod: str, size: str) -> int:
    """The exit code of one allocation of `size` in the pod (137: killed for memory)."""
    return kubectl("exec", pod, "--", "dd", "if=/dev/zero", "of=/dev/null", f"bs={size}", "count=1",
                   check=False).returncode


@pytest.mark.parametrize("runtime_class", ["cordon", "cordon-gvisor"])
def test_a_resize_changes_the_memory_limit_inside(cluster, runtime_class: str) -> None:
    # `update` (containerd's runc update --resources -): the new limit passes the node's gate
    # and the running sandbox takes it. 200 MB does not fit in 128 Mi (64 Mi of it held in
    # /tmp) and fits once the pod is resized to 512 Mi, in the same container (no restart).
    name = f"resized-{runtime_class}"
    apply(FILLED_POD.format(name=name, runtime_class=runtime_class, memory="128Mi"))
    wait_ready(name)
    if runtime_class == "cordon":
        # (On gVisor the cgroup's OOM kill takes the sentry, so the whole container.)
        assert allocates(name, "200M") == 137, "200 MB fit in a 128 Mi container"
    resize_memory(name, "512Mi")
    assert allocates(name, "200M") == 0, "200 MB did not fit after the resize to 512 Mi"
    restarts = json.loads(kubectl("get", "pod", name, "-o", "json").stdout)["status"]["containerStatuses"][0]
    assert restarts["restartCount"] == 0, restarts
    kubectl("delete", "pod", name, "--timeout=60s", timeout=90)


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended and waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_down_leaves_nothing(cluster) -> None:
    state = Path(lib("cordon_data_dir")) / "k8s" / "cluster"
    pids = [int(p.read_text()) for p in Path("/run/cordon-k8s").glob("*.pid")]
    assert pids, "no process of the cluster was recorded"
    sh("down")
    assert not Path("/run/netns/cordon-k8s").exists(), "the node's network namespace is left"
    assert not state.exists(), f"{state} is left"
    assert not Path("/run/cordon-k8s").exists(), "/run/cordon-k8s is left"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts and "/run/cordon-k8s" not in mounts, "a mount of the cluster is left"
    left = [p for p in pids if running(p)]
    assert not left, f"processes of the cluster are left: {left}"
    logs = [str(f) for f in Path("/var/log/containers").glob("*.log") if str(state) in os.readlink(f)]
    assert not logs, f"the kubelet's links to its containers' logs are left: {logs}"
    cgroups = [str(d) for d in Path("/sys/fs/cgroup").glob("*/cordon-k8s")]
    assert not cgroups, f"cgroups of the cluster are left: {cgroups}"
    # No shim or container process of the node's runtimes outlives it.
    time.sleep(0.5)
    shims = subprocess.run(["pgrep", "-f", "containerd-shim.*cordon-k8s"], capture_output=True,
                           text=True, check=False).stdout.split()
    assert not shims, f"containerd shims of the cluster are left: {shims}"
