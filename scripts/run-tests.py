#!/usr/bin/env python3
"""Runs every test of `make test` side by side: the workspace's test binaries, its doc tests
and any extra suite given with --also, at most --jobs at a time, longest first.

    scripts/run-tests.py [--jobs N] [--also NAME=COMMAND]... -- CARGO-COMMAND...

CARGO-COMMAND is how cargo is called (`bash scripts/linted.sh cargo` in `make test`, so the
listing below finds the build the lint made and compiles nothing). `cargo test --workspace`
runs its test binaries one after another; most of them wait on sandboxes, VMs and servers
rather than compute, so on two cores three at a time finish sooner (figures:
docs/adr/0012-tests-side-by-side.md). Each binary runs as cargo would run it (from its
package's directory, with the CARGO_* variables cargo gives a test at run time) and with
every test in it, failures or not (cargo's --no-fail-fast). Each job's output is printed
whole when it ends, so two jobs never interleave; a summary with every job's time and
result comes last, and the exit status is 1 when any job failed.

A job that runs past --timeout (default $CORDON_TEST_JOB_TIMEOUT or 30 minutes) is stopped:
what its processes were doing is printed (`ps` of its process group, with each one's kernel
wait channel), then the group gets SIGTERM and, 10 s later, SIGKILL; it counts as failed
(exit 124). While jobs run, a line every --heartbeat seconds names those still running, so a
run cut short from outside still shows where it was.

Durations are remembered in $CARGO_TARGET_DIR/run-tests-durations.json to order the next run;
without that record the order falls back to the known slow suites first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Slowest first when nothing is recorded yet (seconds, from `make test` on this machine).
KNOWN = {
    "sdk": 390.0,
    "microvm": 110.0,
    "cli": 75.0,
    "template_build": 70.0,
    "gvisor": 50.0,
    "check-setup": 50.0,
    "k8s": 50.0,
    "wasm": 20.0,
    "doc": 15.0,
}


@dataclass
class Job:
    name: str
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    # Filled in when it ends.
    seconds: float = 0.0
    status: int | None = None


def test_binaries(cargo: list[str]) -> list[Job]:
    """The test executables `cargo test --workspace` would run, from cargo itself."""
    out = subprocess.run(
        cargo + ["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"],
        stdout=subprocess.PIPE,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"run-tests: listing the test binaries failed (cargo exit {out.returncode}); "
                 "run the cargo command above to see why")
    jobs = []
    for line in out.stdout.decode().splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        pkg_dir = Path(msg["manifest_path"]).parent
        package = msg["package_id"]
        # `path+file:///…/crates/cordon-cli#cordon-cli@0.1.0` or `…#0.1.0` for a dir named
        # like the package.
        pkg_name = pkg_dir.name
        if "#" in package and "@" in package.rsplit("#", 1)[1]:
            pkg_name = package.rsplit("#", 1)[1].split("@", 1)[0]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{pkg_name}:{kind}:{target['name']}"
        jobs.append(Job(
            name=name,
            argv=[msg["executable"]],
            cwd=pkg_dir,
            env={"CARGO_MANIFEST_DIR": str(pkg_dir), "CARGO_PKG_NAME": pkg_name,
                 "CARGO_CRATE_NAME": target["name"].replace("-", "_")},
        ))
    return jobs


def order(jobs: list[Job], record: dict[str, float]) -> list[Job]:
    def expected(j: Job) -> float:
        return record.get(j.name, KNOWN.get(j.name, 1.0))
    return sorted(jobs, key=expected, reverse=True)


def snapshot(pgid: int) -> str:
    """What the processes of group `pgid` are, and where each waits in the kernel."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,pgid,etimes,stat,wchan:32,args"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    lines = out.stdout.decode(errors="replace").splitlines()
    keep = lines[:1] + [ln for ln in lines[1:]
                        if len(ln.split()) > 2 and ln.split()[2] == str(pgid)]
    return "\n".join(keep) + "\n"


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the job's whole process group, then SIGKILL 10 s later."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run(jobs: list[Job], slots: int, timeout: float, heartbeat: float) -> None:
    pending = list(jobs)
    running: dict[str, float] = {}
    # Each job is in a session of its own, out of reach of the terminal's Ctrl-C and of a
    # SIGTERM to the runner: those stop every job's group here instead.
    groups: set[int] = set()
    lock = threading.Lock()
    printing = threading.Lock()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(heartbeat):
            with lock:
                now = time.monotonic()
                names = ", ".join(f"{n} ({now - t:.0f}s)" for n, t in sorted(running.items()))
                left = len(pending)
            with printing:
                print(f"[run-tests] running: {names or 'none'}; {left} not started", flush=True)

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
                start = time.monotonic()
                running[job.name] = start
            with tempfile.TemporaryFile() as log:
                env = dict(os.environ)
                env.update(job.env)
                timed_out = b""
                pid = None
                try:
                    # Its own process group, so a timeout stops all it started.
                    proc = subprocess.Popen(job.argv, cwd=job.cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
                    pid = proc.pid
                    with lock:
                        groups.add(pid)
                    try:
                        job.status = proc.wait(timeout=timeout)
                    except subprocess.TimeoutExpired:
                        timed_out = (f"\nrun-tests: {job.name} ran past {timeout:.0f}s; its "
                                     f"processes then:\n{snapshot(proc.pid)}").encode()
                        stop_group(proc)
                        job.status = 124
                except OSError as e:
                    log.write(f"run-tests: could not start {job.argv[0]}: {e}\n".encode())
                    job.status = 127
                job.seconds = time.monotonic() - start
                with lock:
                    running.pop(job.name, None)
                    groups.discard(pid)
                log.seek(0)
                with printing:
                    verdict = "ok" if job.status == 0 else f"FAILED (exit {job.status})"
                    if timed_out:
                        verdict = f"TIMED OUT after {timeout:.0f}s"
                    sys.stdout.write(f"\n===== {job.name}: {verdict} in {job.seconds:.1f}s =====\n")
                    sys.stdout.flush()
                    sys.stdout.buffer.write(log.read())
                    sys.stdout.buffer.write(timed_out)
                    sys.stdout.flush()

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, slots))]
    for t in threads:
        t.start()

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=1.0)
    except KeyboardInterrupt:
        with lock:
            pending.clear()
            left = list(groups)
        for pgid in left:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise
    finally:
        done.set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("CORDON_TEST_JOBS", "3")),
                    help="jobs at a time (default: $CORDON_TEST_JOBS or 3)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=COMMAND",
                    help="another suite to run beside the binaries (a shell command)")
    ap.add_argument("--timeout", type=float,
                    default=float(os.environ.get("CORDON_TEST_JOB_TIMEOUT", "1800")),
                    help="seconds a job may run before it is stopped and failed "
                         "(default: $CORDON_TEST_JOB_TIMEOUT or 1800)")
    ap.add_argument("--heartbeat", type=float, default=300.0,
                    help="seconds between the lines naming the jobs still running")
    ap.add_argument("--no-doc", action="store_true", help="skip the doc tests")
    ap.add_argument("cargo", nargs=argparse.REMAINDER, help="-- then how to call cargo")
    args = ap.parse_args()
    cargo = args.cargo[1:] if args.cargo[:1] == ["--"] else args.cargo
    if not cargo:
        ap.error("give the cargo command after --, e.g. -- cargo")
    repo = Path(__file__).resolve().parent.parent
    target = Path(os.environ.get("CARGO_TARGET_DIR") or repo / "target")
    record_path = target / "run-tests-durations.json"
    try:
        record = {k: float(v) for k, v in json.loads(record_path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        record = {}

    jobs = test_binaries(cargo)
    if not args.no_doc:
        # Doc tests compile with rustdoc against the libraries built above.
        jobs.append(Job(name="doc", argv=cargo + ["test", "--workspace", "--doc"], cwd=repo))
    for spec in args.also:
        name, sep, command = spec.partition("=")
        if not sep or not name or not command:
            ap.error(f"--also wants NAME=COMMAND, got {spec!r}")
        jobs.append(Job(name=name, argv=["bash", "-c", command], cwd=repo))

    started = time.monotonic()
    try:
        run(order(jobs, record), args.jobs, args.timeout, args.heartbeat)
    except KeyboardInterrupt:
        print("\nrun-tests: interrupted; every running job's process group was killed",
              flush=True)
        return 130
    wall = time.monotonic() - started

    for j in jobs:
        record[j.name] = round(j.seconds, 1)
    try:
        record_path.write_text(json.dumps(record, indent=1, sort_keys=True))
    except OSError:
        pass

    failed = [j for j in jobs if j.status != 0]
    busy = sum(j.seconds for j in jobs)
    print(f"\n===== {len(jobs)} test jobs, {args.jobs} at a time: {wall:.0f}s "
          f"(one after another: {busy:.0f}s) =====")
    for j in sorted(jobs, key=lambda j: -j.seconds)[:12]:
        print(f"  {j.seconds:7.1f}s  {'ok' if j.status == 0 else 'FAILED'}  {j.name}")
    if failed:
        print("FAILED: " + ", ".join(j.name for j in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
