"""E2B's `get_metrics` through the pinned SDK against the E2B listener (issue 47), and the
native `GET /v1/sandboxes/{id}/metrics`: samples of the tier's own figures (the sandbox's
cgroup, its workspace's file system) taken every 5 s, within the time range asked; memory
grows in them while a command holds memory; another tenant gets none. Every byte stays on
loopback."""

import datetime
import json
import sys
import time
import urllib.error
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from conftest import KEYS  # noqa: E402
from test_e2b_compat import E2B_KEY, sbx, serving  # noqa: E402,F401  (sets the SDK's URLs)

MIB = 1 << 20


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def _wait_for(sbx, ok, rounds: int = 60) -> list:
    """get_metrics until `ok(samples)` (at most `rounds` reads, 0.5 s apart: a sample is
    taken every 5 s)."""
    m = []
    for _ in range(rounds):
        m = sbx.get_metrics()
        if ok(m):
            return m
        time.sleep(0.5)
    return m


def test_get_metrics_follow_a_command_holding_memory(server, sbx):
    sbx.commands.run("head -c 20000000 /dev/urandom > /home/user/blob")
    first = _wait_for(sbx, lambda m: len(m) >= 1)
    assert first, "no sample within 30 s"
    m = first[-1]
    assert m.cpu_count >= 1
    assert 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert m.disk_total > 0
    assert m.disk_used >= 20_000_000, m  # the blob is in the workspace
    assert m.timestamp.tzinfo is not None
    base = min(s.mem_used for s in first)
    # A command that holds 300 MiB (touched, so charged) until it is killed.
    sbx.commands.run("python3 -c 'import time; b = bytearray(300 << 20); b[::4096] = b\"x\" * "
                     "len(b[::4096]); time.sleep(600)'", background=True, timeout=0)
    grown = _wait_for(sbx, lambda m: any(s.mem_used >= base + 250 * MIB for s in m))
    assert any(s.mem_used >= base + 250 * MIB for s in grown), \
        (base, [s.mem_used for s in grown])
    # Oldest first, one every 5 s or so.
    stamps = [s.timestamp for s in grown]
    assert stamps == sorted(stamps)
    # The range asked: only the samples within it (the SDK sends whole seconds).
    mid = grown[len(grown) // 2].timestamp
    one = sbx.get_metrics(start=mid, end=mid)
    assert [s.timestamp for s in one] == [s.timestamp for s in grown
                                          if int(s.timestamp.timestamp()) == int(mid.timestamp())]
    later = sbx.get_metrics(start=mid + datetime.timedelta(seconds=1))
    assert all(s.timestamp > mid for s in later)
    assert len(later) < len(grown) + 3
    from e2b import SandboxException
    with pytest.raises(SandboxException):
        sbx.get_metrics(start=mid, end=mid - datetime.timedelta(seconds=10))


def test_metrics_are_the_tenants_own_and_native(server, sbx):
    from e2b import Sandbox, SandboxException
    _wait_for(sbx, lambda m: len(m) >= 1)
    with pytest.raises(SandboxException):
        Sandbox.get_metrics(sbx.sandbox_id, api_key=KEYS["bob"])

    def native(key: str):
        req = urllib.request.Request(
            f"{server.url.rstrip('/')}/v1/sandboxes/{sbx.sandbox_id}/metrics",
            headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, None

    status, body = native(E2B_KEY)
    assert status == 200
    assert body["interval_ms"] == 5000 and body["samples"]
    s = body["samples"][-1]
    assert s["mem_total"] > 0 and s["cpu_count"] >= 1
    assert native(KEYS["bob"])[0] == 404
    # Cordon's own SDK reads the same samples, the range in milliseconds.
    from cordon_sandbox import Cordon, NotFound
    mine = Cordon(server.url, api_key=E2B_KEY).sandbox_handle(sbx.sandbox_id)
    got = mine.metrics()
    assert got and got[-1].mem_total == s["mem_total"]
    last = got[-1].at_ms
    assert [m.at_ms for m in mine.metrics(start_ms=last)] == [last]
    assert all(m.at_ms < last for m in mine.metrics(end_ms=last - 1))
    with pytest.raises(NotFound):
        Cordon(server.url, api_key=KEYS["bob"]).sandbox_handle(sbx.sandbox_id).metrics()
    sbx.kill()
    assert native(E2B_KEY)[0] == 404
