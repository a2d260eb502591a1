"""The MCP tools of long-lived sandboxes (background execs, pause and resume), spoken as an MCP
client does: JSON-RPC over streamable HTTP to a real `cordon serve`, on the container tier."""
import json
import time
import urllib.request

import pytest

from conftest import KEYS


class Mcp:
    """A minimal streamable-HTTP MCP client: one session, tool calls answered as JSON or SSE."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url.rstrip("/") + "/mcp"
        self.key = key
        self.session = None
        self.next_id = 0
        init = self.rpc("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cordon-sdk-test", "version": "0"}})
        assert "serverInfo" in init, init
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg: dict):
        headers = {"content-type": "application/json",
                   "accept": "application/json, text/event-stream",
                   "authorization": f"Bearer {self.key}"}
        if self.session:
            headers["mcp-session-id"] = self.session
        req = urllib.request.Request(self.url, data=json.dumps(msg).encode(), headers=headers,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            self.session = r.headers.get("mcp-session-id") or self.session
            body = r.read().decode()
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                events = [json.loads(line[5:]) for line in body.splitlines()
                          if line.startswith("data:") and line[5:].strip()]
                return next((e for e in events if e.get("id") == msg.get("id")), None)
            return json.loads(body) if body.strip() else None

    def rpc(self, method: str, params: dict) -> dict:
        self.next_id += 1
        reply = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                           "params": params})
        assert reply is not None and "error" not in reply, reply
        return reply["result"]

    def tool(self, name: str, **args):
        """(ok, parsed JSON or text) of one tool call."""
        res = self.rpc("tools/call", {"name": name, "arguments": args})
        text = "".join(c.get("text", "") for c in res.get("content", []))
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        return not res.get("isError", False), value


def two_tenants_and_a_sandbox(server, has_container):
    """MCP sessions of alice and bob, and a container sandbox of alice's."""
    if not has_container:
        pytest.skip("the container tier is not available here")
    alice = Mcp(server.url, KEYS["alice"])
    bob = Mcp(server.url, KEYS["bob"])
    ok, created = alice.tool("create_sandbox", tier="container")
    assert ok, created
    return alice, bob, created["id"]


def test_background_exec_and_pause_through_mcp_tools(server, has_container):
    alice, bob, sb = two_tenants_and_a_sandbox(server, has_container)
    try:
        ok, started = alice.tool(
            "start_background", sandbox=sb, lang="bash",
            code="echo ready; i=0; while :; do i=$((i+1)); echo $i > /work/n; sleep 0.1; done")
        assert ok, started
        ex = started["id"]
        assert started["state"] == "running", started
        # Its output, read without waiting: bounded polling until the first line is in.
        for _ in range(100):
            ok, peek = alice.tool("read_exec", sandbox=sb, exec=ex)
            assert ok, peek
            if "ready" in peek["stdout"]:
                break
            time.sleep(0.05)
        assert "ready" in peek["stdout"], peek
        ok, listed = alice.tool("list_execs", sandbox=sb)
        assert ok and [e["id"] for e in listed["execs"]] == [ex], listed
        # Another tenant sees nothing of it and cannot stop it.
        ok, _ = bob.tool("read_exec", sandbox=sb, exec=ex)
        assert not ok
        ok, _ = bob.tool("kill_exec", sandbox=sb, exec=ex, force=True)
        assert not ok
        ok, _ = bob.tool("pause_sandbox", sandbox=sb)
        assert not ok
        # Pause: execs are refused; resume: the same background exec is still running.
        ok, paused = alice.tool("pause_sandbox", sandbox=sb)
        assert ok, paused
        ok, refused = alice.tool("exec", sandbox=sb, lang="bash", code="echo no")
        assert not ok and "paused" in str(refused), refused
        ok, resumed = alice.tool("resume_sandbox", sandbox=sb)
        assert ok, resumed
        ok, peek = alice.tool("read_exec", sandbox=sb, exec=ex)
        assert ok and peek["state"] == "running", peek
        # Stopped with SIGKILL at once: its end is reported.
        ok, stopped = alice.tool("kill_exec", sandbox=sb, exec=ex, force=True)
        assert ok, stopped
        for _ in range(100):
            ok, peek = alice.tool("read_exec", sandbox=sb, exec=ex)
            if peek["state"] == "exited":
                break
            time.sleep(0.05)
        assert peek["state"] == "exited", peek
    finally:
        alice.tool("destroy", sandbox=sb)


PTY_WINCH = r"""
import os, signal, time
got = []
signal.signal(signal.SIGWINCH, lambda *a: got.append(os.get_terminal_size()))
print("size", *os.get_terminal_size(), "tty", os.isatty(1), flush=True)
for _ in range(1200):
    if got:
        break
    time.sleep(0.05)
print("winch", *(got[0] if got else ("none", "none")), flush=True)
"""


def test_a_pty_exec_and_its_resize_through_mcp_tools(server, has_container):
    alice, bob, sb = two_tenants_and_a_sandbox(server, has_container)
    try:
        ok, started = alice.tool("start_background", sandbox=sb, lang="python", code=PTY_WINCH,
                                 pty={"rows": 20, "cols": 70})
        assert ok and started["pty"] == {"rows": 20, "cols": 70}, started
        ex = started["id"]
        for _ in range(200):
            ok, peek = alice.tool("read_exec", sandbox=sb, exec=ex)
            if "size" in peek["stdout"]:
                break
            time.sleep(0.05)
        assert "size 70 20 tty True" in peek["stdout"], peek
        # Another tenant cannot resize it; bounds hold; then the program sees the new size.
        ok, _ = bob.tool("resize_exec", sandbox=sb, exec=ex, rows=30, cols=90)
        assert not ok
        ok, refused = alice.tool("resize_exec", sandbox=sb, exec=ex, rows=0, cols=90)
        assert not ok and "1000" in str(refused), refused
        ok, resized = alice.tool("resize_exec", sandbox=sb, exec=ex, rows=30, cols=90)
        assert ok and resized["pty"] == {"rows": 30, "cols": 90}, resized
        for _ in range(200):
            ok, peek = alice.tool("read_exec", sandbox=sb, exec=ex)
            if peek["state"] == "exited":
                break
            time.sleep(0.05)
        assert "winch 90 30" in peek["stdout"], peek
        # An exec without a terminal has no size to change.
        ok, plain = alice.tool("start_background", sandbox=sb, argv=["sleep", "30"])
        assert ok, plain
        ok, refused = alice.tool("resize_exec", sandbox=sb, exec=plain["id"], rows=30, cols=90)
        assert not ok and "pty" in str(refused), refused
    finally:
        alice.tool("destroy", sandbox=sb)
