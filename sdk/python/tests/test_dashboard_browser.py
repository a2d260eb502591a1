"""The dashboard in a real browser: headless Chromium (Debian's package, installed by
scripts/setup.d/45-client-tests.sh) loads `cordon serve`'s /dashboard with a tenant's key;
the test then creates a sandbox and runs an exec through the API, and the page shows the
sandbox and the exec's termination from its event stream, without a reload. A screenshot
is written to $CORDON_TEST_ARTIFACTS (default target/test-artifacts/) as dashboard.png.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages ended by NUL on descriptors 3 and 4), so no WebSocket client is needed."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import KEYS, ROOT

CHROMIUM = shutil.which("chromium")


def artifacts() -> Path:
    d = Path(os.environ.get("CORDON_TEST_ARTIFACTS") or ROOT / "target" / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Browser:
    """A headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self) -> None:
        if CHROMIUM is None:
            pytest.fail("chromium is not installed: run scripts/setup.sh (setup.d/45-client-tests.sh)")
        self.profile = tempfile.mkdtemp(prefix="cordon-chromium-")
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        # Out of the way of 3 and 4 before the child puts them there.
        high = [os.dup2(fd, 100 + i) for i, fd in enumerate((to_r, from_w))]
        for fd in (to_r, from_w):
            os.close(fd)

        def child() -> None:
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--disable-default-apps", "--mute-audio",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             "--window-size=1280,1400", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, *high), preexec_fn=child)
        for fd in high:
            os.close(fd)
        self.w = os.fdopen(to_w, "wb", buffering=0)
        self.r = os.fdopen(from_r, "rb", buffering=0)
        self.buf = b""
        self.next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    def _read_message(self) -> dict:
        while b"\0" not in self.buf:
            chunk = self.r.read(65536)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict = None, session: bool = False) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                      session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 30.0):
        """Polls `expression` in the page until it is truthy (bounded by `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                v = self.eval(expression)
            except RuntimeError:
                v = None  # the page is not there yet (still loading)
            if v:
                return v
            time.sleep(0.2)
        body = self.eval("document.body ? document.body.innerText : ''")
        raise AssertionError(f"the page did not show {what} in {timeout}s; it shows:\n{body}")

    def screenshot(self, path: Path) -> None:
        png = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                        session=True)["data"]
        path.write_bytes(base64.b64decode(png))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.w.close()
        self.r.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def api(server, method: str, path: str, key: str, body=None) -> dict:
    req = urllib.request.Request(
        server.url.rstrip("/") + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def text_of(table: str) -> str:
    return f"document.querySelector('#{table} tbody').innerText"


def test_dashboard_shows_a_new_sandbox_and_its_exec_live(server, has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    # The page itself is served with a policy that lets it load only itself.
    with urllib.request.urlopen(server.url.rstrip("/") + "/dashboard", timeout=30) as r:
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
    b = Browser()
    try:
        b.call("Page.navigate", {"url": f"{server.url.rstrip('/')}/dashboard#key={KEYS['alice']}"},
               session=True)
        b.wait_for("document.getElementById('conn').textContent === 'live'", "a live stream")
        # The key left the address bar at once.
        assert "key=" not in b.eval("location.href")
        # Who the page speaks for comes with the stream's first snapshot (up to a second
        # after the stream opens), not with the opening itself.
        b.wait_for("document.getElementById('who').textContent === 'tenant alice'",
                   "the first snapshot naming the tenant")

        sb = api(server, "POST", "/v1/sandboxes", KEYS["alice"],
                 {"tier": "container", "ttl": "5m", "labels": {"by": "dashboard-test"}})
        sid = sb["id"]
        try:
            b.wait_for(f"{text_of('sandboxes')}.includes({json.dumps(sid)})", f"sandbox {sid}")
            b.wait_for(f"{text_of('live-counts')}.includes('container')", "the container count")
            out = api(server, "POST", f"/v1/sandboxes/{sid}/exec", KEYS["alice"],
                      {"lang": "bash", "code": "echo hi; exit 3"})
            assert out["termination"] == "exited" and out["exit_code"] == 3, out
            b.wait_for(f"{text_of('execs')}.includes({json.dumps(sid)})", "the exec's row")
            row = b.eval(f"[...document.querySelectorAll('#execs tbody tr')]"
                         f".map(r => r.innerText).find(t => t.includes({json.dumps(sid)}))")
            assert "exited" in row and "\t3\t" in row, row
            # The chart has points for the exec's run.
            b.wait_for("document.querySelectorAll('#chart circle.run').length > 0",
                       "a point on the latency chart")
            # Another tenant's sandbox is not on alice's page.
            other = api(server, "POST", "/v1/sandboxes", KEYS["bob"], {"tier": "container"})
            try:
                time.sleep(2.5)  # two snapshots later
                assert other["id"] not in b.eval(text_of("sandboxes"))
            finally:
                api(server, "DELETE", f"/v1/sandboxes/{other['id']}", KEYS["bob"])
            b.screenshot(artifacts() / "dashboard.png")
        finally:
            api(server, "DELETE", f"/v1/sandboxes/{sid}", KEYS["alice"])
        b.wait_for(f"!{text_of('sandboxes')}.includes({json.dumps(sid)})",
                   f"sandbox {sid} gone after its destroy")
    finally:
        b.close()
    png = artifacts() / "dashboard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
