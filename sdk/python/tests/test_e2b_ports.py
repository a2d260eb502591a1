"""A sandbox's own servers reached from outside (issue 47): E2B's `get_host(port)` names
`{port}-{sandboxID}.{domain}`, and the E2B listener routes a request for that host (or with
E2B's routing headers naming that port) to the port on the sandbox's own loopback, with the
sandbox's traffic token; the native API has `/v1/sandboxes/{id}/ports/{port}/...` with the
tenant's key. A `python3 -m http.server` started by a background exec is reached by a later
exec, through the E2B listener and through the native route by plain HTTP clients on this
host; another tenant cannot reach it; the egress proxy's port is refused; after the kill
nothing answers. Every byte stays on loopback (the listeners' own addresses)."""

import json
import sys
import time
import urllib.error
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from conftest import KEYS  # noqa: E402
from test_e2b_compat import ORIGIN, serving  # noqa: E402  (sets the SDK's URLs)

# The tiers whose sandboxes serve their own ports to the outside.
PORT_TIERS = ("container", "gvisor")
# The sandbox's egress proxy's port (cordon_egress::DEFAULT_SANDBOX_PROXY_PORT).
PROXY_PORT = 3128


def _get(url: str, headers: dict) -> tuple:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module", params=PORT_TIERS)
def server(request):
    yield from serving(request.param)


def _http_server(sbx, name: str, port: int, get: str) -> None:
    """Starts, from a background exec, a Python HTTP server on `port` of the sandbox's
    loopback whose GET handler is `get` (the body of `do_GET`, one statement a line)."""
    body = "".join(f"        {line}\n" for line in get.splitlines())
    source = ("import http.server, time\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              f"    def do_GET(self):\n{body}"
              "    def log_message(self, *a): pass\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    sbx.files.write(f"/home/user/{name}.py", source)
    sbx.commands.run(f"python3 /home/user/{name}.py", background=True, timeout=0)


def _serve(sbx, port: int) -> None:
    """Starts `python3 -m http.server` in the workspace and waits, from later execs, until it
    answers inside the sandbox."""
    sbx.files.write("/home/user/hello.txt", "served from the sandbox\n")
    sbx.commands.run(f"cd /home/user && exec python3 -m http.server {port} --bind 127.0.0.1",
                     background=True, timeout=0)
    probe = ("import urllib.request as u, time\n"
             "for _ in range(200):\n"
             "    try:\n"
             f"        print(u.urlopen('http://127.0.0.1:{port}/hello.txt').read().decode(), end='')\n"
             "        break\n"
             "    except OSError:\n"
             "        time.sleep(0.05)\n")
    sbx.files.write("/home/user/probe.py", probe)
    r = sbx.commands.run("python3 /home/user/probe.py")
    assert r.stdout == "served from the sandbox\n", (r.stdout, r.stderr)


def test_a_sandbox_server_is_reached_through_get_host(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=300)
    bob_sbx = Sandbox.create(timeout=300, api_key=KEYS["bob"])
    try:
        _serve(sbx, 8000)
        host = sbx.get_host(8000)
        assert host == f"8000-{sbx.sandbox_id}.localhost", host
        token = {"E2B-Traffic-Access-Token": sbx.traffic_access_token}
        # By host name, as a browser or any HTTP client sends get_host's URL.
        status, body = _get(ORIGIN + "/hello.txt", dict(token, Host=f"{host}:1"))
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
        status, body = _get(ORIGIN + "/", dict(token, Host=host))
        assert status == 200 and b"hello.txt" in body, (status, body)
        # get_host's own URL, as a user types it (curl resolves *.localhost to loopback).
        import subprocess
        port = ORIGIN.rsplit(":", 1)[1]
        r = subprocess.run(["curl", "-sS", "--noproxy", "*", "-H",
                            f"E2B-Traffic-Access-Token: {sbx.traffic_access_token}",
                            f"http://{host}:{port}/hello.txt"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout == "served from the sandbox\n", (r.stdout, r.stderr)
        # By E2B's routing headers, the envd token accepted as well.
        routed = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000",
                  "X-Access-Token": sbx._envd_access_token}
        status, body = _get(ORIGIN + "/hello.txt?x=1", routed)
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
        # The server never sees Cordon's credentials.
        log = sbx.commands.run("sleep 0.2; true").stdout
        assert sbx.traffic_access_token not in log

        # No token, a wrong one, and another tenant's sandbox's token: refused (403, as
        # E2B's proxy answers for a sandbox without public traffic).
        for h in ({}, {"E2B-Traffic-Access-Token": "0" * 48},
                  {"E2B-Traffic-Access-Token": bob_sbx.traffic_access_token},
                  {"X-Access-Token": bob_sbx._envd_access_token}):
            status, body = _get(ORIGIN + "/hello.txt", dict(h, Host=host))
            assert status == 403, (h, status, body)
            assert b"served from" not in body
        # Bob's token for his own sandbox cannot name alice's port either.
        status, _ = _get(ORIGIN + "/hello.txt",
                         {"Host": f"8000-{bob_sbx.sandbox_id}.localhost",
                          "E2B-Traffic-Access-Token": bob_sbx.traffic_access_token})
        assert status == 502  # nothing listens in bob's sandbox
        # A port nothing listens on: E2B's proxy's answer.
        status, body = _get(ORIGIN + "/", dict(token, Host=sbx.get_host(8001)))
        assert status == 502 and b"port is not open" in body, (status, body)
        # The egress proxy's port is not a program's.
        status, body = _get(ORIGIN + "/", dict(token, Host=sbx.get_host(PROXY_PORT)))
        assert status == 400 and b"egress proxy" in body, (status, body)

        # The native route, with the tenant's key; bob's key does not reach it.
        alice = {"Authorization": f"Bearer {KEYS['alice']}"}
        base = f"{server.url}/v1/sandboxes/{sbx.sandbox_id}/ports"
        status, body = _get(f"{base}/8000/hello.txt", alice)
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
        # The port's root, with and without the slash.
        for root in (f"{base}/8000", f"{base}/8000/"):
            status, body = _get(root, alice)
            assert status == 200 and b"hello.txt" in body, (root, status, body)
        status, body = _get(f"{base}/8000/hello.txt",
                            {"Authorization": f"Bearer {KEYS['bob']}"})
        assert status == 404 and b"served from" not in body, (status, body)
        status, body = _get(f"{base}/{PROXY_PORT}/", alice)
        assert status == 400, (status, body)
        status, body = _get(f"{base}/8001/", alice)
        assert status == 404 and b"nothing listens on port 8001" in body, (status, body)

        # Every connection is audited, with its refusals.
        status, body = _get(f"{server.url}/v1/audit?kind=port_open&sandbox={sbx.sandbox_id}",
                            alice)
        assert status == 200, body
        rows = json.loads(body)
        rows = rows.get("events", rows) if isinstance(rows, dict) else rows
        seen = {(r["detail"]["port"], r["detail"]["via"], r["decision"]) for r in rows}
        assert {(8000, "e2b", "ok"), (8000, "api", "ok"), (8001, "e2b", "error"),
                (8001, "api", "error")} <= seen, seen
    finally:
        bob_sbx.kill()
        sbx.kill()
    # Closed with the sandbox.
    status, body = _get(ORIGIN + "/hello.txt", dict(token, Host=host))
    assert status == 502 and b"was not found" in body, (status, body)
    status, _ = _get(f"{base}/8000/hello.txt", alice)
    assert status == 404


def test_a_long_answer_ends_when_the_sandbox_is_killed(server):
    """A response still streaming from the sandbox's server breaks off when the sandbox is
    killed: nothing of the sandbox outlives it."""
    import socket
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=300)
    _http_server(sbx, "slow", 8002,
                 "self.send_response(200)\n"
                 "self.send_header('Content-Length', '1000000')\n"
                 "self.end_headers()\n"
                 "for _ in range(1000): self.wfile.write(b'x' * 10); self.wfile.flush(); "
                 "time.sleep(0.1)")
    host = sbx.get_host(8002)
    port = int(ORIGIN.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        for _ in range(100):
            s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nE2B-Traffic-Access-Token: "
                      f"{sbx.traffic_access_token}\r\n\r\n".encode())
            first = s.recv(4096)
            if first.startswith(b"HTTP/1.1 200 "):
                break
            # Not listening yet: a 502 (the connection stays usable), try again.
            assert first.startswith(b"HTTP/1.1 502"), first
            time.sleep(0.1)
        else:
            pytest.fail("the slow server never answered")
        sbx.kill()
        got = len(first)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        assert got < 1000000, "the answer went on after the kill"
    finally:
        s.close()


def test_public_ports_are_refused_unless_the_operator_allows_them(server):
    """Without the operator's `e2b.public_traffic`, a create asking for public traffic is
    refused (saying how to get it), and one turning it off is served: every request for its
    ports needs its token either way."""
    from e2b import Sandbox
    with pytest.raises(Exception) as refused:
        Sandbox.create(timeout=60, network={"allow_public_traffic": True})
    assert "e2b.public_traffic" in str(refused.value), refused.value
    sbx = Sandbox.create(timeout=60, network={"allow_public_traffic": False})
    try:
        _serve(sbx, 8000)
        status, _ = _get(ORIGIN + "/hello.txt", {"Host": sbx.get_host(8000)})
        assert status == 403
    finally:
        sbx.kill()
