"""A sandbox's own ports over HTTPS, as E2B's SDKs name them (issue 47):
`https://<port>-<id>.<domain>` on the E2B listener's HTTPS port (`e2b.https_listen`), with a
certificate from the data dir's own CA, which signs sandbox hosts under `e2b.domain` and
nothing else. With the operator's `e2b.public_traffic`, a sandbox whose create did not turn
`allowPublicTraffic` off answers without a token, as under E2B; one that did answers 403
without its traffic token. `maskRequestHost` is the `Host` the program sees, and a paused
sandbox whose create asked `autoResume` is woken by a request for its port. Through the
pinned SDK; every byte stays on loopback."""

import http.client
import os
import shutil
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from conftest import KEYS, tier_available  # noqa: E402
from test_e2b_compat import ORIGIN, _free_port, e2b_server  # noqa: E402  (sets the SDK's URLs)
from test_e2b_ports import _http_server, _serve  # noqa: E402

HTTPS_PORT = _free_port()


@pytest.fixture(scope="module")
def server():
    if not tier_available("container"):
        pytest.skip("container tier unavailable here")
    s = e2b_server("container", e2b_extra=(f'https_listen = "127.0.0.1:{HTTPS_PORT}"\n'
                                           'public_traffic = true\n'))
    yield s
    s.stop()
    shutil.rmtree(s.tmp, ignore_errors=True)


def _ca(server) -> str:
    return str(server.data_dir / "e2b-https" / "ca.pem")


def _https_get(server, host: str, path: str = "/", headers=None, cafile=None) -> tuple:
    """GET `path` of `host` on the HTTPS listener, the certificate checked for `host` against
    the data dir's CA (or `cafile`); the connection goes to loopback whatever `host` is."""
    ctx = ssl.create_default_context(cafile=cafile or _ca(server))
    raw = socket.create_connection(("127.0.0.1", HTTPS_PORT), timeout=30)
    conn = http.client.HTTPConnection(host, HTTPS_PORT, timeout=30)
    conn.sock = ctx.wrap_socket(raw, server_hostname=host)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_the_certificate_is_for_sandbox_hosts_only(server):
    from e2b import Sandbox
    ca_dir = server.data_dir / "e2b-https"
    assert oct(os.stat(ca_dir / "ca.key").st_mode & 0o777) == "0o600"
    assert oct(os.stat(ca_dir).st_mode & 0o777) == "0o700"
    sbx = Sandbox.create(timeout=120)
    try:
        host = sbx.get_host(8000)
        # Nothing listens yet: E2B's proxy's answer, over a verified connection.
        status, body = _https_get(server, host)
        assert status == 502 and b"port is not open" in body, (status, body)
        # A name that is no sandbox host under the domain gets no certificate at all.
        for name in ("example.com", "localhost", f"8000-{sbx.sandbox_id}.example.com",
                     f"8000-{sbx.sandbox_id}.x.localhost", f"80000-{sbx.sandbox_id}.localhost"):
            with pytest.raises(ssl.SSLError):
                _https_get(server, name)
        # Not a certificate anyone trusts by default: only clients given the CA take it.
        system = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
        if os.path.exists(system):
            with pytest.raises(ssl.SSLCertVerificationError):
                _https_get(server, host, cafile=system)
    finally:
        sbx.kill()
    # An ended sandbox's host still answers over TLS, as E2B's proxy: 502, "was not found"
    # (its certificate signed as one of the few unknown hosts a second).
    status, body = _https_get(server, host)
    assert status == 502 and b"was not found" in body, (status, body)


def test_public_ports_and_ports_behind_the_token(server):
    from e2b import Sandbox
    public = Sandbox.create(timeout=300)
    private = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        _serve(public, 8000)
        _serve(private, 8000)
        # Public (the create left allowPublicTraffic out; the operator allows it): no token.
        status, body = _https_get(server, public.get_host(8000), "/hello.txt")
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
        # The plain listener answers the same.
        req = urllib.request.Request(ORIGIN + "/hello.txt", headers={"Host": public.get_host(8000)})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.read() == b"served from the sandbox\n"
        # allowPublicTraffic=False: 403 without its own traffic token (another sandbox's,
        # public or not, does not do), 200 with it.
        host = private.get_host(8000)
        for h in ({}, {"E2B-Traffic-Access-Token": public.traffic_access_token},
                  {"E2B-Traffic-Access-Token": "0" * 48}):
            status, body = _https_get(server, host, "/hello.txt", h)
            assert status == 403 and b"served from" not in body, (h, status, body)
        status, body = _https_get(server, host, "/hello.txt",
                                  {"E2B-Traffic-Access-Token": private.traffic_access_token})
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
    finally:
        public.kill()
        private.kill()


def test_mask_request_host_is_the_host_the_program_sees(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=120,
                         network={"mask_request_host": "custom-host.example.com:${PORT}"})
    try:
        _http_server(sbx, "capture", 8080,
                     "open('/tmp/headers.txt', 'w').write(str(self.headers))\n"
                     "self.send_response(200); self.end_headers(); self.wfile.write(b'ok')")
        host = sbx.get_host(8080)
        deadline = time.monotonic() + 30
        while True:
            status, body = _https_get(server, host)
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (status, body) == (200, b"ok"), (status, body)
        seen = sbx.commands.run("cat /tmp/headers.txt").stdout
        # In the case most HTTP/1 clients send it (E2B's own test looks for `Host:`).
        assert "Host: custom-host.example.com:8080" in seen, seen
        assert host not in seen, seen
        # The client's own Authorization is the program's through the E2B listener...
        status, _ = _https_get(server, host, "/", {"Authorization": "token for-the-app"})
        assert status == 200
        seen = sbx.commands.run("cat /tmp/headers.txt").stdout
        assert "Authorization: token for-the-app" in seen, seen
        # ...while on the native route it is the tenant's key, which never goes in.
        req = urllib.request.Request(
            f"{server.url}/v1/sandboxes/{sbx.sandbox_id}/ports/8080/",
            headers={"Authorization": f"Bearer {KEYS['alice']}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        seen = sbx.commands.run("cat /tmp/headers.txt").stdout
        assert KEYS["alice"] not in seen and "Authorization" not in seen, seen
    finally:
        sbx.kill()


def test_a_paused_sandbox_is_woken_by_a_request_for_its_port(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        _serve(sbx, 8000)
        deadline = time.monotonic() + 30
        while Sandbox.get_info(sbx.sandbox_id).state.value != "paused":
            assert time.monotonic() < deadline, "the sandbox was never paused at its timeout"
            time.sleep(0.2)
        status, body = _https_get(server, sbx.get_host(8000), "/hello.txt")
        assert (status, body) == (200, b"served from the sandbox\n"), (status, body)
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    finally:
        sbx.kill()


def test_a_tenant_cannot_reach_another_tenants_private_port(server):
    """Bob's own traffic token does not open alice's sandbox's port."""
    from e2b import Sandbox
    alice = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    bob = Sandbox.create(timeout=120, api_key=KEYS["bob"], network={"allow_public_traffic": False})
    try:
        _serve(alice, 8000)
        for token in (bob.traffic_access_token, bob._envd_access_token):
            for name in ("E2B-Traffic-Access-Token", "X-Access-Token"):
                status, body = _https_get(server, alice.get_host(8000), "/hello.txt",
                                          {name: token})
                assert status == 403 and b"served from" not in body, (name, status, body)
        try:
            urllib.request.urlopen(urllib.request.Request(
                ORIGIN + "/hello.txt", headers={"Host": alice.get_host(8000)}), timeout=30)
            raise AssertionError("the plain listener served a private port without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 403
    finally:
        alice.kill()
        bob.kill()
