"""Starts a real `cordon serve` for the SDK tests (binary: $CORDON_BIN or target/debug)."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"alice": "ck_test_alice_key_0123456789abcdef0123456789",
        "bob": "ck_test_bob_key_0123456789abcdef0123456789ab",
        # The operator's own tenant (edge.dashboard_operators): /metrics and the pools.
        "ops": "ck_test_ops_key_0123456789abcdef0123456789ab"}


def cordon_bin() -> str:
    b = os.environ.get("CORDON_BIN")
    if b:
        return b
    # Where cargo built it: $CARGO_TARGET_DIR when set (as `make test` honours), else target/.
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for p in (target / "debug/cordon", target / "release/cordon"):
        if p.exists():
            return str(p)
    pytest.fail("no cordon binary: run `cargo build` or set CORDON_BIN")


def container_available() -> bool:
    out = subprocess.run([cordon_bin(), "doctor", "--json"], capture_output=True, text=True,
                         timeout=60)
    tiers = {t["tier"]: t["status"] for t in json.loads(out.stdout)}
    ok = tiers.get("container") in ("available", "degraded")
    if not ok:
        msg = "container tier unavailable here (needs root, cgroups, user namespaces)"
        if os.environ.get("CORDON_REQUIRE_ALL") == "1":
            pytest.fail(msg + " and CORDON_REQUIRE_ALL=1")
        print(f"\nSKIPPING container-tier SDK tests: {msg}", file=sys.stderr)
    return ok


def tier_available(tier: str) -> bool:
    """Whether `tier` runs here; a missing one fails the run under CORDON_REQUIRE_ALL=1."""
    out = subprocess.run([cordon_bin(), "doctor", "--json"], capture_output=True, text=True,
                         timeout=60)
    tiers = {t["tier"]: t["status"] for t in json.loads(out.stdout)}
    ok = tiers.get(tier) in ("available", "degraded")
    if not ok:
        msg = f"{tier} tier unavailable here"
        if os.environ.get("CORDON_REQUIRE_ALL") == "1":
            pytest.fail(msg + " and CORDON_REQUIRE_ALL=1")
        print(f"\nSKIPPING {tier}-tier SDK tests: {msg}", file=sys.stderr)
    return ok


class ServerProc:
    def __init__(self, data_dir: Path, pools: dict, extra: str = "",
                 nofile: Optional[int] = None, sessions: str = "") -> None:
        self.data_dir = data_dir
        # The server's descriptor limit (soft and hard), as an operator's unit file sets it.
        self.nofile = nofile
        self.config = data_dir.parent / (data_dir.name + ".toml")
        keys = "".join(f'[[keys]]\ntenant = "{t}"\nkey = "{k}"\n' for t, k in KEYS.items())
        pool_lines = "".join(f"{t} = {n}\n" for t, n in pools.items())
        self.config.write_text(
            f'data_dir = "{data_dir}"\nbind = "127.0.0.1:0"\ndefault_tier = "wasm"\n{keys}'
            + ("" if "[edge]" in extra else '[edge]\ndashboard_operators = ["ops"]\n')
            + f"[sessions]\nreap_interval = \"100ms\"\n{sessions}"
            # The operator trusts the test tenants with every tier (the gate's refusals
            # for untrusted tenants are tested in crates/cordon-server and cordon-engine).
            f'[tenant_defaults]\ntrust = "trusted"\n'
            f'tiers = ["runtime", "wasm", "container", "gvisor", "microvm"]\n'
            f"{extra}[pools]\n{pool_lines}")
        self.proc = None
        self.url = ""

    def start(self) -> "ServerProc":
        # (A test may build one with __new__ and set only what it needs.)
        nofile = getattr(self, "nofile", None)

        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        # The server's log goes to a file: a pipe nobody reads would fill with a long
        # module's log lines and then block the server's next one.
        self.log = self.config.with_suffix(".log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [cordon_bin(), "serve", "--config", str(self.config)],
                stdout=subprocess.PIPE, stderr=log, text=True,
                preexec_fn=limits if nofile is not None else None)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            if not line:  # stdout closed: the server is exiting; read why
                self.proc.wait(timeout=60)
            err = self.log.read_text(errors="replace") if self.proc.poll() is not None else ""
            raise RuntimeError(f"cordon serve did not start: {line!r} {err}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.report_panics()

    def report_panics(self) -> None:
        """A panic in one request's task ends only its connection (the client sees it
        closed without an answer): its lines go to the run's own stderr, so a CI log shows
        where it came from."""
        log = getattr(self, "log", None)
        if log is None or not log.exists():
            return
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "panicked at" in line:
                print(f"\ncordon serve ({self.config.name}) panicked:\n"
                      + "\n".join(lines[i:i + 6]), file=sys.__stderr__)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def has_container() -> bool:
    return container_available()


@pytest.fixture(scope="session")
def server(has_container):
    d = Path(tempfile.mkdtemp(prefix="cordon-sdk-"))
    pools = {"wasm": 1}
    if has_container:
        pools["container"] = 2
    s = ServerProc(d / "data", pools).start()
    yield s
    s.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def alice(server):
    from cordon_sandbox import Cordon
    return Cordon(server.url, api_key=KEYS["alice"])


@pytest.fixture
def bob(server):
    from cordon_sandbox import Cordon
    return Cordon(server.url, api_key=KEYS["bob"])
