#!/usr/bin/env python3
"""Pod create→Ready on the test cluster, per runtime class, and what an idle pod costs.

    scripts/k8s.sh up && python3 scripts/k8s/bench.py [--runs 20] [--idle 10] [CLASS...]

CLASS is a RuntimeClass (`cordon`, `cordon-gvisor`, `cordon-microvm`) or `runc` (none: the
node's default); without any, runc, cordon and cordon-gvisor. Each run creates one pod (no
volumes: `automountServiceAccountToken: false`; the busybox image, `sleep`) and times from
just before `kubectl create` to the moment a watch on the API server reports it Ready; the
pod is then deleted and gone before the next. Then `--idle` pods of each class are started
together and left idle: their memory on the node (the proportional set size of their shims
and every process below them: containers, runsc, cordon-oci's monitors and sandboxes; a
microVM's guest memory is its QEMU's) over the pods, and how many such pods the node's
available memory holds (and so how many with the kubelet's maxPods, 110). Prints figures; asserts nothing
(docs/kubernetes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

K8S = Path(__file__).resolve().parents[1] / "k8s.sh"


def kubectl(*args: str, stdin: str | None = None) -> str:
    r = subprocess.run(["bash", str(K8S), "kubectl", *args], input=stdin, capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"bench: kubectl {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def pod(name: str, klass: str, label: str) -> str:
    rc = "" if klass == "runc" else f"runtimeClassName: {klass}"
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": label}},
        "spec": {
            **({"runtimeClassName": klass} if rc else {}),
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "idle", "image": "cordon.local/busybox:1",
                            "imagePullPolicy": "Never", "command": ["sleep", "100000"]}],
        },
    })


class ReadyWatch:
    """One `kubectl get pods --watch` for the run: when each pod was first seen Ready."""

    def __init__(self, label: str) -> None:
        self.ready: dict[str, float] = {}
        self.cv = threading.Condition()
        tmpl = '{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\\n"}'
        self.proc = subprocess.Popen(
            ["bash", str(K8S), "kubectl", "get", "pods", "-l", f"bench={label}", "--watch",
             "-o", f"jsonpath={tmpl}"], stdout=subprocess.PIPE, text=True, start_new_session=True)
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            parts = line.split()
            if len(parts) == 2 and parts[1] == "True":
                with self.cv:
                    self.ready.setdefault(parts[0], now)
                    self.cv.notify_all()

    def wait(self, name: str, timeout: float) -> float | None:
        with self.cv:
            self.cv.wait_for(lambda: name in self.ready, timeout)
            return self.ready.get(name)

    def stop(self) -> None:
        # The whole group: k8s.sh, nsenter and kubectl (kubectl would outlive its shell).
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


def gone(label: str) -> None:
    for _ in range(300):
        if not kubectl("get", "pods", "-l", f"bench={label}", "-o", "name").split():
            return
        time.sleep(0.2)
    sys.exit(f"bench: pods bench={label} were not deleted in 60 s")


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def create_to_ready(klass: str, runs: int) -> list[float]:
    label = f"ready-{klass}"
    watch = ReadyWatch(label)
    time.sleep(1)  # the watch is established
    times = []
    try:
        for i in range(runs):
            name = f"bench-{klass}-{i}"
            t0 = time.monotonic()
            kubectl("create", "-f", "-", stdin=pod(name, klass, label))
            t1 = watch.wait(name, 180)
            if t1 is None:
                sys.exit(f"bench: {name} was not Ready in 180 s")
            times.append(t1 - t0)
            kubectl("delete", "pod", name, "--wait=false")
            gone(label)
    finally:
        watch.stop()
    return times


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def pods_pss(sandbox_ids: set[str]) -> int:
    """The proportional set size of the containerd shims of these pod sandboxes and all below
    them (the containers, runsc, cordon-oci's monitors and sandboxes: a shim is its pod's
    subreaper)."""
    parent: dict[int, int] = {}
    shims = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        words = cmd.split()
        if "containerd-shim" in cmd and any(words[i] == "-id" and words[i + 1] in sandbox_ids
                                            for i in range(len(words) - 1)):
            shims.append(int(d.name))
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0, list(shims), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def idle_cost(klass: str, n: int) -> tuple[float, int]:
    label = f"idle-{klass}"
    kubectl("create", "-f", "-", stdin="\n---\n".join(pod(f"idle-{klass}-{i}", klass, label) for i in range(n)))
    kubectl("wait", "--for=condition=Ready", "pod", "-l", f"bench={label}", "--timeout=600s")
    time.sleep(5)  # settled
    r = subprocess.run(["bash", str(K8S), "crictl", "pods", "--label", f"bench={label}", "-q"],
                       capture_output=True, text=True, check=False)
    ids = set(r.stdout.split())
    if len(ids) != n:
        sys.exit(f"bench: crictl lists {len(ids)} sandboxes of bench={label}, not {n}: {r.stderr.strip()}")
    per_pod = pods_pss(ids) / n
    kubectl("delete", "pod", "-l", f"bench={label}", "--wait=false")
    gone(label)
    return per_pod, int(mem_available() / per_pod) if per_pod else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("classes", nargs="*", default=["runc", "cordon", "cordon-gvisor"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--idle", type=int, default=10)
    a = ap.parse_args()
    if a.runs:
        print(f"pod create→Ready, {a.runs} runs each, one pod at a time (seconds):")
        print(f"{'class':<16} {'median':>8} {'p99':>8} {'min':>8} {'max':>8}")
    for klass in a.classes if a.runs else []:
        t = create_to_ready(klass, a.runs)
        print(f"{klass:<16} {statistics.median(t):8.3f} {p99(t):8.3f} {min(t):8.3f} {max(t):8.3f}", flush=True)
    if a.idle:
        print(f"\nidle pods ({a.idle} at once): memory per pod (PSS of its shim and all below it), "
              "and pods per node at that cost (the node's MemAvailable):")
        for klass in a.classes:
            per_pod, per_node = idle_cost(klass, a.idle)
            print(f"{klass:<16} {per_pod / 2**20:8.1f} MiB/pod  {per_node:6d} pods/node by memory, "
                  f"{min(per_node, 110)} with maxPods", flush=True)


if __name__ == "__main__":
    main()
