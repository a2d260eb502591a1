"""MCP as MCP clients see it: the official MCP Python SDK (the `mcp` package, pinned by
scripts/setup.d/45-client-tests.sh) drives a whole session against a real server, over
streamable HTTP (`cordon serve`'s /mcp, with an API key) and over stdio (`cordon mcp`).

The SDK checks every tool result's structured content against the tool's outputSchema
itself (ClientSession.call_tool), so a tool whose answer does not match its declared schema
fails here."""
import json
import shutil
import tempfile
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import KEYS, cordon_bin

HINTS = ("read_only_hint", "destructive_hint", "idempotent_hint")
READ_ONLY = {"list_sandboxes", "get_sandbox", "list_files", "stat_file", "read_file",
             "list_volumes", "list_contexts", "list_execs", "read_exec", "audit", "list_snapshots"}


def enum_values(schema: dict, root: dict) -> set:
    """Every value a schema enumerates (enum, const), through $ref, anyOf and oneOf."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return enum_values(root["$defs"][name], root)
    found = set(schema.get("enum", []))
    if "const" in schema:
        found.add(schema["const"])
    for key in ("anyOf", "oneOf", "allOf"):
        for s in schema.get(key, []):
            found |= enum_values(s, root)
    return found


async def call(session: ClientSession, name: str, **args):
    """A tool call that must succeed: its structured content, which must equal its text."""
    r = await session.call_tool(name, args)
    text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
    assert not r.is_error, f"{name}: {text}"
    assert r.structured_content is not None, name
    assert json.loads(text) == r.structured_content, name
    return r.structured_content


async def whole_session(session: ClientSession) -> str:
    """initialize, tools/list and a sandbox's life through the tools; returns its id."""
    init = await session.initialize()
    assert init.server_info.name == "cordon"
    assert init.capabilities.tools is not None

    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert READ_ONLY | {"create_sandbox", "exec", "write_file", "destroy", "run"} <= set(tools)
    for t in tools.values():
        assert t.title, f"{t.name} has no title"
        assert t.annotations is not None, f"{t.name} has no annotations"
        for h in HINTS:
            assert getattr(t.annotations, h) is not None, f"{t.name} lacks {h}"
        assert t.output_schema and t.output_schema.get("type") == "object", t.name
        assert t.annotations.read_only_hint is (t.name in READ_ONLY), t.name
    assert tools["destroy"].annotations.destructive_hint is True
    assert tools["destroy"].annotations.idempotent_hint is True
    assert tools["create_sandbox"].annotations.destructive_hint is False
    # Enums in the input schemas.
    create = tools["create_sandbox"].input_schema
    props = create["properties"]
    assert {"auto", "container", "gvisor", "microvm", "wasm", "runtime"} <= \
        enum_values(props["tier"], create)
    assert enum_values(props["trust"], create) == {"trusted", "untrusted"}
    assert "install-packages" in enum_values(props["autonomy"], create)
    exec_schema = tools["exec"].input_schema
    assert enum_values(exec_schema["properties"]["lang"], exec_schema) == \
        {"python", "bash", "sh", "javascript"}

    sb = await call(session, "create_sandbox", tier="container", ttl="5m",
                    labels={"by": "official-mcp-client"})
    sid = sb["id"]
    assert sb["tier"] == "container" and sb["state"] == "live", sb
    listed = await call(session, "list_sandboxes", labels={"by": "official-mcp-client"})
    assert [s["id"] for s in listed["sandboxes"]] == [sid], listed
    assert (await call(session, "get_sandbox", sandbox=sid))["id"] == sid

    wrote = await call(session, "write_file", sandbox=sid, path="/work/in.txt",
                       content="hello from mcp\n")
    assert wrote == {"path": "/work/in.txt", "bytes": 15}
    out = await call(session, "exec", sandbox=sid, lang="bash",
                     code="tr a-z A-Z < in.txt > out.txt; cat out.txt")
    assert out["termination"] == "exited" and out["exit_code"] == 0, out
    assert out["stdout"] == "HELLO FROM MCP\n", out
    files = await call(session, "list_files", sandbox=sid)
    assert sorted(e["name"] for e in files["entries"]) == ["in.txt", "out.txt"], files
    assert (await call(session, "read_file", sandbox=sid, path="/work/out.txt"))["text"] == \
        "HELLO FROM MCP\n"
    st = await call(session, "stat_file", sandbox=sid, path="/work/out.txt")
    assert st["kind"] == "file" and st["size"] == 15, st

    # A refused call is a tool error the client sees as one, with what to do.
    r = await session.call_tool("read_file", {"sandbox": sid, "path": "/proc/self/environ"})
    assert r.is_error and "path_refused" in r.content[0].text, r

    rows = (await call(session, "audit", sandbox=sid))["events"]
    kinds = {e["kind"] for e in rows}
    assert {"create", "file_put", "exec"} <= kinds, kinds
    assert all(e["sandbox"] == sid for e in rows)

    gone = await call(session, "destroy", sandbox=sid)
    assert gone == {"id": sid, "state": "destroyed", "already": False}
    again = await call(session, "destroy", sandbox=sid)
    assert again["already"] is True
    r = await session.call_tool("exec", {"sandbox": sid, "argv": ["true"]})
    assert r.is_error and "not_found" in r.content[0].text
    return sid


def http_client(key: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                              timeout=httpx2.Timeout(60, read=300))


def test_official_client_whole_session_over_streamable_http(server, has_container, caplog):
    if not has_container:
        pytest.skip("the container tier is not available here")

    async def main():
        url = server.url.rstrip("/") + "/mcp"
        async with http_client(KEYS["alice"]) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    sid = await whole_session(session)
        # Another tenant's session sees none of it.
        async with http_client(KEYS["bob"]) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    r = await session.call_tool("audit", {"sandbox": sid})
                    assert not r.is_error and r.structured_content == {"events": []}, r
                    r = await session.call_tool("get_sandbox", {"sandbox": sid})
                    assert r.is_error, r

    anyio.run(main)
    # The client ended its sessions (DELETE /mcp) and took the answers as such.
    assert not [r for r in caplog.records if "termination failed" in r.getMessage()]


def test_official_client_whole_session_over_stdio(has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    d = Path(tempfile.mkdtemp(prefix="cordon-mcp-stdio-"))
    try:
        params = StdioServerParameters(command=cordon_bin(),
                                       args=["mcp", "--data-dir", str(d / "data")])

        async def main():
            with open(d / "stderr.log", "w") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        await whole_session(session)

        anyio.run(main)
    finally:
        shutil.rmtree(d, ignore_errors=True)
