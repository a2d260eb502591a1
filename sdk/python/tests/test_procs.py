"""Background execs, disconnect interruption, pause and resume and labels against a real
`cordon serve` on the container and gvisor tiers."""

import json
import random
import socket
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from cordon_sandbox import (CordonError, InvalidRequest, NotFound, SandboxBusy, SandboxPaused,
                    TooManyExecs,
                    Unsupported)
from conftest import KEYS, tier_available

TIERS = ["container", "gvisor"]


def need(tier: str) -> None:
    if not tier_available(tier):
        pytest.skip(f"{tier} tier unavailable here (see the SKIPPING line above)")


def host_pids_with(marker: str):
    """Host processes whose command line holds `marker`."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def await_host_pids(marker: str, present: bool):
    """Waits (5 s at most) until processes holding `marker` show (`present`) or are gone;
    returns those found last."""
    for _ in range(100):
        found = host_pids_with(marker)
        if bool(found) == present:
            return found
        time.sleep(0.05)
    return host_pids_with(marker)


FETCH = """
import sys, time, urllib.request
for _ in range(200):
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())
        break
    except OSError as e:
        err = e
        time.sleep(0.05)
else:
    print("unreachable:", err)
"""


# The container tier's Landlock rules allow no TCP bind (docs/design.md): its dev server
# listens on a unix socket in /work; gvisor's on a loopback TCP port.
SERVE_UNIX = """
import http.server, os, socketserver, sys
class Handler(http.server.SimpleHTTPRequestHandler):
    def address_string(self):
        return "unix"
class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    pass
os.chdir("/work")
Server(sys.argv[1], Handler).serve_forever()
"""

FETCH_UNIX = r"""
import socket, sys, time
for _ in range(200):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(sys.argv[1])
        s.sendall(sys.argv[2].encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        print(data.split(b"\r\n\r\n", 1)[1].decode())
        break
    except OSError as e:
        err = e
        time.sleep(0.05)
else:
    print("unreachable:", err)
"""


def serve_and_fetch(tier: str):
    """The dev server's argv, and a function giving the argv that fetches a path from it."""
    if tier == "container":
        sock = "/work/dev.sock"
        return (["python3", "-u", "-c", SERVE_UNIX, sock],
                lambda path, tries=200: ["python3", "-c",
                                         FETCH_UNIX.replace("range(200)", f"range({tries})"),
                                         sock, f"GET {path} HTTP/1.0\r\n\r\n"])
    port = random.randrange(20000, 40000)
    return (["python3", "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1",
             "--directory", "/work"],
            lambda path, tries=200: ["python3", "-c",
                                     FETCH.replace("range(200)", f"range({tries})"),
                                     f"http://127.0.0.1:{port}{path}"])


@pytest.mark.parametrize("tier", TIERS)
def test_a_background_dev_server_is_reached_replayed_killed_and_ends_with_destroy(
        alice, bob, tier):
    need(tier)
    sb = alice.create_sandbox(tier=tier, ttl="5m")
    try:
        serve, fetch = serve_and_fetch(tier)
        sb.write_file("/work/hello.txt", "hi from the sandbox")
        srv = sb.exec(serve, background=True)
        assert srv.id.startswith("ex-")
        # A second exec reaches it.
        r = sb.exec(fetch("/hello.txt"), timeout="60s")
        assert r.stdout.strip() == "hi from the sandbox", r
        # Attaching replays what it logged before the attach (its request log on stderr).
        seen = ""
        for ev in srv.output():
            assert ev.type != "outcome", "the server ended on its own"
            seen += ev.data
            if "GET /hello.txt" in seen:
                break
        assert "GET /hello.txt" in seen
        listed = {e.id: e.info for e in sb.execs()}
        assert listed[srv.id].state == "running"
        assert listed[srv.id].command.startswith("python3 -u")
        # Another tenant can neither see, attach to, write to nor stop it.
        theirs = bob.sandbox_handle(sb.id)
        for call in (theirs.execs, lambda: theirs.exec_handle(srv.id).wait(),
                     lambda: theirs.exec_handle(srv.id).send_stdin("x"),
                     lambda: theirs.exec_handle(srv.id).kill(force=True)):
            with pytest.raises(NotFound):
                call()
        assert sb.execs()[0].info.state == "running"
        # Kill: SIGTERM ends it; the outcome says it was stopped.
        srv.kill()
        out = srv.wait()
        assert out.termination == "killed" and out.signal == 15, out
        assert "GET /hello.txt" in out.stderr
        r = sb.exec(fetch("/hello.txt", 3))
        assert "unreachable" in r.stdout, r
        kinds = [e.kind for e in alice.audit(sandbox=sb.id, limit=1000)]
        for k in ("exec_background", "exec_signal", "exec_background_end"):
            assert k in kinds, kinds
        # Destroy ends every background exec.
        marker = f"cordon-bg-{uuid.uuid4().hex}"
        sb.exec(["python3", "-c", "import time; time.sleep(3600)", marker], background=True)
        if tier == "container":
            assert await_host_pids(marker, True), "the background process never showed"
    finally:
        sb.destroy()
    if tier == "container":
        assert await_host_pids(marker, False) == [], "a background process outlived its sandbox"


def test_background_stdin_output_cap_and_limit(alice):
    need("container")
    with alice.create_sandbox(tier="container", ttl="5m",
                              limits={"stdout_bytes": 4 << 20}) as sb:
        cat = sb.exec(["cat"], background=True)
        cat.send_stdin("hello\n")
        cat.send_stdin(b"bytes\n", close=True)
        out = cat.wait()
        assert out.ok and out.stdout == "hello\nbytes\n", out
        # More than the sandbox keeps: the last MiB is replayed, the rest marked dropped.
        big = sb.exec("head -c 1500000 /dev/zero | tr '\\0' a; echo END", background=True)
        out = big.wait()
        assert out.stdout_truncated and out.stdout.endswith("aEND\n"), out.raw.get("warnings")
        assert len(out.stdout) == 1 << 20
        # Waited on from its start, while it writes: the same last MiB, not every byte the
        # waiting reader happened to see (before: all 1.5 MB, more than the sandbox keeps).
        slow = sb.exec("for i in $(seq 30); do head -c 50000 /dev/zero | tr '\\0' b; "
                       "sleep 0.05; done; echo END", background=True)
        out = slow.wait()
        assert out.stdout_truncated and out.stdout.endswith("bEND\n"), out.raw.get("warnings")
        assert len(out.stdout) == 1 << 20
        assert any(f"first {1500004 - (1 << 20)} bytes of stdout" in w
                   for w in out.raw.get("warnings", [])), out.raw.get("warnings")
        # The per-sandbox cap: the ninth running background exec is refused.
        sleepers = [sb.exec(["sleep", "600"], background=True) for _ in range(8)]
        with pytest.raises(TooManyExecs) as e:
            sb.exec(["sleep", "600"], background=True)
        assert "DELETE" in e.value.fix
        sleepers[0].kill(force=True)
        assert sleepers[0].wait().termination == "killed"
        sb.exec(["sleep", "600"], background=True)
        # Foreground execs still run beside them.
        assert sb.exec("echo still here").stdout == "still here\n"


def test_a_background_fork_bomb_is_stopped_by_the_process_limit(alice):
    need("container")
    with alice.create_sandbox(tier="container", ttl="5m", limits={"pids": 64}) as sb:
        bomb = sb.exec(["sh", "-c", "b() { b | b & }; b; sleep 5"], background=True,
                       timeout="60s")
        out = bomb.wait()
        # The exec ended (its tree is gone) and the sandbox still serves execs.
        assert out.termination in ("process-limit", "exited", "signalled"), out
        assert sb.exec("echo alive").stdout == "alive\n"


def test_wasm_answers_unsupported_for_background(alice):
    with alice.create_sandbox(tier="wasm") as sb:
        with pytest.raises(Unsupported) as e:
            sb.exec("print(1)", lang="python", background=True)
        assert "container" in e.value.fix


def _raw_exec(url: str, sandbox: str, payload: dict, stream: bool) -> socket.socket:
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port))
    body = json.dumps(payload).encode()
    accept = "application/x-ndjson" if stream else "application/json"
    s.sendall((f"POST /v1/sandboxes/{sandbox}/exec HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {KEYS['alice']}\r\nAccept: {accept}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body)
    return s


@pytest.mark.parametrize("stream", [True, False])
def test_a_foreground_exec_whose_client_disconnects_is_interrupted(alice, server, stream):
    need("container")
    with alice.create_sandbox(tier="container", ttl="5m") as sb:
        # Each beat is renamed into place: a kill between the shell's truncation of the file
        # and `date`'s write would otherwise leave it empty ("missing" below).
        beat = ("while true; do date +%s%N > /work/beat.new && mv /work/beat.new /work/beat; "
                "echo tick; sleep 0.1; done")
        s = _raw_exec(server.url, sb.id, {"lang": "sh", "code": beat, "timeout": "600s"},
                      stream)
        # It runs: its first output arrives (streaming), or it has had a moment to start.
        if stream:
            got = b""
            s.settimeout(30)
            while b"tick" not in got:
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
        else:
            # Nothing comes back before the end: wait until the server has taken the exec,
            # then give the program a moment to write its first beat.
            for _ in range(300):
                if sb.refresh().busy:
                    break
                time.sleep(0.1)
            time.sleep(1.5)
        s.close()
        # Once the exec is gone the sandbox takes another; it is not left to its timeout.
        r = None
        for _ in range(300):
            try:
                r = sb.exec("test -s /work/beat || { echo missing; exit; }; "
                            "a=$(cat /work/beat); sleep 0.5; b=$(cat /work/beat); "
                            "[ \"$a\" = \"$b\" ] && echo stopped || echo beating")
                break
            except SandboxBusy:
                time.sleep(0.1)
        assert r is not None, "the disconnected exec still holds the sandbox"
        assert r.stdout == "stopped\n", r
        rows = [e for e in alice.audit(sandbox=sb.id, kind="exec", limit=100)]
        assert any(e.decision == "cancelled" for e in rows), rows


def host_cpu_ticks(marker: str) -> int:
    """User plus system CPU ticks of the host processes whose command line holds `marker`."""
    total = 0
    for pid in host_pids_with(marker):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


LOOP = """
import sys
n = 0
while True:
    n += 1
    if n % 100000 == 0:
        with open('/work/n', 'w') as f:
            f.write(str(n))
"""


def read_count(sb) -> int:
    for _ in range(200):
        try:
            return int(sb.read_file("/work/n"))
        except (NotFound, ValueError, Exception):
            time.sleep(0.05)
    raise AssertionError("the busy loop never wrote its count")


@pytest.mark.parametrize("tier", TIERS)
def test_a_paused_sandbox_uses_no_cpu_and_resumes_with_its_process(alice, bob, tier):
    need(tier)
    with alice.create_sandbox(tier=tier, ttl="5m") as sb:
        marker = f"cordon-busy-{uuid.uuid4().hex}"
        busy = sb.exec(["python3", "-c", LOOP, marker], background=True)
        before = read_count(sb)
        # Host processes to watch: the loop itself (container), the whole sentry (gvisor).
        watch = marker if tier == "container" else sb.id
        assert host_cpu_ticks(watch) > 0
        t0 = time.monotonic()
        info = sb.pause()
        pause_ms = (time.monotonic() - t0) * 1000
        assert info.state == "paused" and info.paused, info
        # Another tenant can neither resume nor pause it.
        for call in (lambda: bob.request("POST", f"/v1/sandboxes/{sb.id}/resume", {}),
                     lambda: bob.request("POST", f"/v1/sandboxes/{sb.id}/pause", {})):
            with pytest.raises(NotFound):
                call()
        with pytest.raises(SandboxPaused) as e:
            sb.exec("echo no")
        assert "resume" in e.value.fix
        with pytest.raises(SandboxPaused):
            sb.exec(["sleep", "1"], background=True)
        c1 = host_cpu_ticks(watch)
        time.sleep(1.0)
        c2 = host_cpu_ticks(watch)
        t0 = time.monotonic()
        info = sb.resume()
        resume_ms = (time.monotonic() - t0) * 1000
        print(f"\n{tier}: pause {pause_ms:.1f} ms, resume {resume_ms:.1f} ms, "
              f"CPU ticks while paused {c2 - c1}")
        assert info.state == "live" and not info.paused
        if tier == "container":
            # The frozen loop got no CPU at all.
            assert c2 == c1, (c1, c2)
        else:
            # The sentry's own housekeeping may tick; the loop (100 ticks a second) did not.
            assert c2 - c1 < 20, (c1, c2)
        # The same process is alive and counting on from where it stopped.
        after = read_count(sb)
        assert after >= before
        later = after
        for _ in range(100):
            later = read_count(sb)
            if later > after:
                break
            time.sleep(0.05)
        assert later > after, "the loop did not continue after resume"
        states = {e.id: e.info.state for e in sb.execs()}
        assert states[busy.id] == "running"
        kinds = [e.kind for e in alice.audit(sandbox=sb.id, limit=1000)]
        assert "pause" in kinds and "resume" in kinds


def test_labels_filter_the_list_and_patch_moves_the_ttl(alice, bob):
    a = alice.create_sandbox(tier="wasm", labels={"team": "red", "run": "x1"})
    b = alice.create_sandbox(tier="wasm", labels={"team": "blue"})
    try:
        assert a.info.labels == {"team": "red", "run": "x1"}
        red = [s.id for s in alice.list_sandboxes(labels={"team": "red"})]
        assert red == [a.id]
        both = [s.id for s in alice.list_sandboxes(labels={"team": "red", "run": "x1"})]
        assert both == [a.id]
        assert alice.list_sandboxes(labels={"team": "red", "run": "x2"}) == []
        # Another tenant's list never shows them, whatever the filter.
        assert bob.list_sandboxes(labels={"team": "red"}) == []
        for bad in ({"": "x"}, {"-x": "y"}, {"a b": "c"}, {"k": "v\n"},
                    {f"k{i}": "v" for i in range(33)}, {"k" * 64: "v"}):
            with pytest.raises(InvalidRequest):
                alice.create_sandbox(tier="wasm", labels=bad)
        # PATCH: a longer TTL moves the expiry; past the server's maximum it is refused.
        old = a.info.expires_ms
        new = a.update(ttl="50m", idle_timeout="20m")
        assert new.expires_ms > old and new.idle_timeout_ms == 20 * 60 * 1000
        with pytest.raises(CordonError) as e:
            a.update(ttl="1000h")
        assert e.value.code == "policy_denied"
        with pytest.raises(NotFound):
            bob.sandbox_handle(a.id).update(ttl="30m")
        # The wasm tier cannot pause: a clear answer naming the tiers that can.
        with pytest.raises(Unsupported) as e:
            a.pause()
        assert "container" in e.value.fix
    finally:
        a.destroy()
        b.destroy()
