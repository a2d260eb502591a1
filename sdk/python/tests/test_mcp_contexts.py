"""The MCP tools of code contexts (run_code, create_context, list_contexts, restart_context,
delete_context) over streamable HTTP to a real `cordon serve`, on the container tier."""

import pytest

from conftest import KEYS
from test_mcp_procs import Mcp


def test_run_code_and_contexts_through_mcp_tools(server, has_container):
    if not has_container:
        pytest.skip("container tier unavailable here (see the SKIPPING line above)")
    alice = Mcp(server.url, KEYS["alice"])
    ok, created = alice.tool("create_sandbox", tier="container", ttl="5m")
    assert ok, created
    sb = created["id"]
    try:
        # Without a context: the sandbox's default Python context, state kept.
        ok, r = alice.tool("run_code", sandbox=sb, code="x = 20\nprint('set')")
        assert ok and r["status"] == "ok" and r["logs"]["stdout"] == ["set\n"], r
        ok, r = alice.tool("run_code", sandbox=sb, code="x * 2 + 2")
        assert ok and r["text"] == "42", r
        ok, r = alice.tool("run_code", sandbox=sb, code="import time\ntime.sleep(30)",
                           timeout="1s")
        assert ok and r["status"] == "timeout" and r["error"]["name"] == "TimeoutError", r
        ok, r = alice.tool("run_code", sandbox=sb, code="x")
        assert ok and r["text"] == "20", r
        ok, r = alice.tool("run_code", sandbox=sb, code="{}['k']")
        assert ok and r["error"]["name"] == "KeyError" and "Traceback" in r["error"]["traceback"]
        # A context of its own: JavaScript.
        ok, js = alice.tool("create_context", sandbox=sb, lang="javascript")
        assert ok and js["id"].startswith("ctx-") and js["state"] == "ready", js
        ok, r = alice.tool("run_code", sandbox=sb, context=js["id"], code="var n = 6; n * 7")
        assert ok and r["text"] == "42", r
        # TypeScript: run_code's lang makes the sandbox's default TypeScript context.
        ok, r = alice.tool("run_code", sandbox=sb, lang="typescript",
                           code="const t: number = 40;\n(t as number) + 2")
        assert ok and r["text"] == "42", r
        ok, r = alice.tool("run_code", sandbox=sb, lang="typescript", code="let : = 1")
        assert ok and r["status"] == "error" and r["error"]["name"] == "SyntaxError", r
        ok, listed = alice.tool("list_contexts", sandbox=sb)
        assert ok and len(listed["contexts"]) == 3, listed
        assert sorted(c["lang"] for c in listed["contexts"]) == [
            "javascript", "python", "typescript"], listed
        ok, info = alice.tool("delete_context", sandbox=sb, context=next(
            c["id"] for c in listed["contexts"] if c["lang"] == "typescript"))
        assert ok, info
        ok, listed = alice.tool("list_contexts", sandbox=sb)
        assert ok and len(listed["contexts"]) == 2, listed
        default = next(c for c in listed["contexts"] if c["default"])
        assert default["lang"] == "python" and default["execution_count"] >= 4, default
        # Another tenant is refused on every context tool.
        bob = Mcp(server.url, KEYS["bob"])
        for name, args in (("run_code", {"code": "1"}),
                           ("run_code", {"code": "1", "context": js["id"]}),
                           ("create_context", {"lang": "python"}),
                           ("list_contexts", {}),
                           ("restart_context", {"context": js["id"]}),
                           ("delete_context", {"context": js["id"]})):
            ok, msg = bob.tool(name, sandbox=sb, **args)
            assert not ok and "not_found" in str(msg), (name, msg)
        # Restart clears the context; delete ends it.
        ok, info = alice.tool("restart_context", sandbox=sb, context=js["id"])
        assert ok and info["restarts"] == 1, info
        ok, r = alice.tool("run_code", sandbox=sb, context=js["id"], code="typeof n")
        assert ok and r["text"] == "undefined", r
        ok, info = alice.tool("delete_context", sandbox=sb, context=js["id"])
        assert ok and info["state"] == "deleted", info
        ok, listed = alice.tool("list_contexts", sandbox=sb)
        assert ok and [c["id"] for c in listed["contexts"]] == [default["id"]], listed
    finally:
        alice.tool("destroy", sandbox=sb)
