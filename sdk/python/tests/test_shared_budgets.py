"""What one tenant must not exhaust for the others on a real `cordon serve`: the process's
descriptor table (wasm execs hold host descriptors for the files they open) and the queue
of WebAssembly programs waiting to be compiled. Each test is the attack as a tenant would
make it, with a second tenant whose requests must still be served."""

from __future__ import annotations

import base64
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import KEYS, ServerProc

# Each of alice's execs opens this many files and holds them (within the operator's ceiling:
# open_files 4096, plus the 64 the wasm tier allows beside it).
FILES = 4100
HOLD = """
import time
fs = [open(f"/work/f{i}", "wb", buffering=0) for i in range(%d)]
print("held", len(fs), flush=True)
time.sleep(6)
print("done")
""" % FILES


@pytest.fixture
def server_20k():
    """A server whose descriptor limit is 20,000 (soft and hard), as in the report."""
    d = Path(tempfile.mkdtemp(prefix="cordon-budgets-"))
    s = ServerProc(d / "data", {}, nofile=20000).start()
    yield s
    s.stop()
    shutil.rmtree(d, ignore_errors=True)


def _clients(server):
    from cordon_sandbox import Cordon
    # No retry after a 429: the test counts the refusals themselves.
    return (Cordon(server.url, KEYS["alice"], retries=0),
            Cordon(server.url, KEYS["bob"], retries=0))


def test_one_tenants_wasm_execs_cannot_take_the_servers_descriptors(server_20k):
    from cordon_sandbox import CordonError
    alice, bob = _clients(server_20k)
    results: list = [None] * 5
    started = threading.Barrier(6)

    def hold(i: int) -> None:
        started.wait()
        try:
            results[i] = alice.run(HOLD, "python", tier="wasm", timeout="30s",
                                   limits={"open_files": 4096})
        except CordonError as e:
            results[i] = e

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    started.wait()
    # Let alice's execs open their files (a synchronisation wait, not a measurement), then
    # bob's request must be served while they hold them.
    threading.Event().wait(3)
    r = bob.run("print('bob', 6 * 7)", "python", tier="wasm", timeout="30s")
    assert r.exit_code == 0 and r.stdout == "bob 42\n", r
    with bob.create_sandbox(tier="wasm") as sb:
        assert sb.exec("print('in a session')", "python").stdout == "in a session\n"
    for t in threads:
        t.join(timeout=120)
    ran = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert ran, results
    for r in ran:
        assert r.exit_code == 0 and r.stdout == f"held {FILES}\ndone\n", r
    # The ones past alice's share are refused up front, as busy for her alone: 429 with a
    # Retry-After, never a 500 or an exec that failed mid-way.
    assert refused, results
    for e in refused:
        assert e.status == 429 and e.code == "resource_busy", (e.status, e.code, str(e))
        assert e.retry_after and e.retry_after >= 1, e
        assert "descriptors" in str(e), str(e)
    # Afterwards alice has her share again.
    r = alice.run(HOLD.replace("time.sleep(6)", ""), "python", tier="wasm", timeout="30s",
                  limits={"open_files": 4096})
    assert r.exit_code == 0, r


def _slow_module(salt: int, funcs: int = 400, ops: int = 600) -> bytes:
    """A WASI command module costly to compile and instant to run; `salt` makes its bytes
    (and so its compile-cache key) its own."""
    def leb(n: int) -> bytes:
        out = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            if n == 0:
                out.append(b)
                return bytes(out)
            out.append(b | 0x80)

    def section(i: int, body: bytes) -> bytes:
        return bytes([i]) + leb(len(body)) + body

    m = b"\0asm\x01\0\0\0"
    m += section(1, bytes([1, 0x60, 0, 0]))
    m += section(3, leb(funcs) + bytes(funcs))
    m += section(5, bytes([1, 0, 1]))
    m += section(7, bytes([2, 6]) + b"_start" + bytes([0, 0, 6]) + b"memory" + bytes([2, 0]))
    body = bytes([1, 2, 0x7F]) + bytes([0x41]) + leb(salt) + bytes([0x21, 0])
    body += bytes([0x20, 0, 0x20, 1, 0x6A, 0x21, 1]) * ops + bytes([0x0B])
    m += section(10, leb(funcs) + (leb(len(body)) + body) * funcs)
    return m


def test_one_tenants_compiles_cannot_fill_the_queue_for_others(server_20k):
    alice, bob = _clients(server_20k)
    from cordon_sandbox import CordonError
    n = 8
    results: list = [None] * n
    go = threading.Barrier(n + 1)

    def compile_one(i: int) -> None:
        payload = {"wasm_base64": base64.b64encode(_slow_module(1000 + i)).decode(),
                   "tier": "wasm", "timeout": "60s"}
        go.wait()
        try:
            results[i] = alice.request("POST", "/v1/run", payload)
        except CordonError as e:
            results[i] = e

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    go.wait()
    threading.Event().wait(0.5)
    # Bob's module is compiled and run while alice's queue is full: he waits for at most
    # one of her compiles, and is never refused for her.
    payload = {"wasm_base64": base64.b64encode(_slow_module(7)).decode(), "tier": "wasm",
               "timeout": "60s"}
    r = bob.request("POST", "/v1/run", payload)
    assert r["termination"] == "exited" and r["exit_code"] == 0, r
    for t in threads:
        t.join(timeout=180)
    refused = [e for e in results if isinstance(e, Exception)]
    ran = [r for r in results if not isinstance(r, Exception)]
    assert ran and refused, results
    for e in refused:
        assert e.status == 429 and e.code == "resource_busy", (e.status, e.code, str(e))
        assert "compile" in str(e), str(e)
    for r in ran:
        assert r["exit_code"] == 0, r
