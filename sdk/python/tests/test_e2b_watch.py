"""E2B's `watch_dir` through the pinned SDK against the E2B listener (issue 47): the sync
SDK's polled watcher (CreateWatcher / GetWatcherEvents / RemoveWatcher) and the async SDK's
stream (WatchDir) see files created, written and removed by later commands, below the
watched directory only when recursive; `stop()` ends a watcher; another tenant cannot
watch; a flood of directories and files under a recursive watch is dropped past the
sandbox's bounds, never kept (neither in the sandbox's agent nor in the server). Every byte
stays on loopback."""

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from conftest import KEYS  # noqa: E402
from test_e2b_compat import ORIGIN, sbx, serving  # noqa: E402,F401  (sets the SDK's URLs)

# cordon_core::MAX_QUEUED_EVENTS: the most events one watcher keeps until they are read.
MAX_QUEUED_EVENTS = 4096


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def _collect(handle, want, rounds: int = 100) -> list:
    """Events of a sync watcher until every (name, type) in `want` came (at most `rounds`
    reads, 0.1 s apart: the sandbox may still be taking them when a command returns)."""
    got = []
    for _ in range(rounds):
        got += [(e.name, e.type.value) for e in handle.get_new_events()]
        if all(w in got for w in want):
            break
        time.sleep(0.1)
    return got


def test_watch_dir_sync_sees_later_commands(sbx):
    sbx.files.make_dir("/home/user/w/sub")
    flat = sbx.files.watch_dir("/home/user/w")
    deep = sbx.files.watch_dir("/home/user/w", recursive=True)
    sbx.commands.run("echo one > /home/user/w/a.txt && echo two >> /home/user/w/a.txt")
    sbx.commands.run("echo three > /home/user/w/sub/b.txt && rm /home/user/w/a.txt")
    sbx.commands.run("chmod 600 /home/user/w/sub/b.txt && mv /home/user/w/sub/b.txt /home/user/w/c.txt")
    want = [("a.txt", "create"), ("a.txt", "write"), ("a.txt", "remove"), ("c.txt", "create")]
    got = _collect(flat, want)
    for w in want:
        assert w in got, got
    # Not recursive: nothing below the watched directory.
    assert not any("/" in name for name, _ in got), got
    deep_want = want + [("sub/b.txt", "create"), ("sub/b.txt", "write"),
                        ("sub/b.txt", "chmod"), ("sub/b.txt", "rename")]
    got = _collect(deep, deep_want)
    for w in deep_want:
        assert w in got, got
    # A directory made later is watched too, with what appeared in it.
    sbx.commands.run("mkdir -p /home/user/w/new && echo x > /home/user/w/new/late.txt")
    got = _collect(deep, [("new", "create"), ("new/late.txt", "create")])
    assert ("new/late.txt", "create") in got, got
    # stop() ends it: the next read is refused, later changes reach nobody.
    flat.stop()
    with pytest.raises(Exception):
        flat.get_new_events()
    deep.stop()
    # A path outside the workspace, or a file, is refused.
    from e2b import SandboxException
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/etc")
    sbx.files.write("/home/user/f.txt", "x")
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/home/user/f.txt")


def test_watch_dir_stream(server):
    from e2b import AsyncSandbox

    async def run():
        s = await AsyncSandbox.create(timeout=300)
        try:
            await s.files.make_dir("/home/user/s/d")
            seen = []
            h = await s.files.watch_dir("/home/user/s", lambda e: seen.append(
                (e.name, e.type.value)), recursive=True)
            await s.commands.run("echo hi > /home/user/s/d/x.txt && rm /home/user/s/d/x.txt")
            await s.commands.run("touch /home/user/s/top.txt")
            want = [("d/x.txt", "create"), ("d/x.txt", "write"), ("d/x.txt", "remove"),
                    ("top.txt", "create")]
            for _ in range(100):
                if all(w in seen for w in want):
                    break
                await asyncio.sleep(0.1)
            for w in want:
                assert w in seen, seen
            await h.stop()
            n = len(seen)
            await s.commands.run("touch /home/user/s/after.txt")
            await asyncio.sleep(0.5)
            assert ("after.txt", "create") not in seen[n:], seen
        finally:
            await s.kill()

    asyncio.run(run())


def _rpc(method: str, sandbox_id: str, token: str, body: dict) -> tuple:
    req = urllib.request.Request(
        f"{ORIGIN}/filesystem.Filesystem/{method}", data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox_id,
                 "E2b-Sandbox-Port": "49983", "X-Access-Token": token})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_another_tenant_cannot_watch(sbx):
    from e2b import Sandbox
    bob = Sandbox.create(timeout=300, api_key=KEYS["bob"])
    try:
        mine = sbx.files.watch_dir("/home/user")
        body = {"path": "/home/user", "recursive": True}
        # Bob's token for alice's sandbox, no token: refused, no watcher made.
        for token in (bob._envd_access_token, ""):
            status, _ = _rpc("CreateWatcher", sbx.sandbox_id, token, body)
            assert status in (401, 403, 404), status
        # Alice's watcher id is nothing in bob's sandbox, nor with bob's token in hers.
        status, _ = _rpc("GetWatcherEvents", sbx.sandbox_id, bob._envd_access_token,
                         {"watcherId": mine._watcher_id})
        assert status in (401, 403, 404), status
        status, _ = _rpc("GetWatcherEvents", bob.sandbox_id, bob._envd_access_token,
                         {"watcherId": mine._watcher_id})
        assert status == 404, status
        # Her own token works, so the refusals above were the tenant's.
        status, got = _rpc("GetWatcherEvents", sbx.sandbox_id, sbx._envd_access_token,
                           {"watcherId": mine._watcher_id})
        assert status == 200, got
        mine.stop()
    finally:
        bob.kill()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_flood_under_a_recursive_watch_is_bounded(server, sbx):
    """Attack: 5,000 directories and 30,000 files made under a recursive watch nobody reads
    for a while. The watcher keeps at most its bound and reports the rest as dropped (the
    agent's queue stays bounded), the server's memory does not grow with the flood, and the
    watcher still works afterwards. On code without bounds the events (or watches) would
    grow with the workload."""
    sbx.files.make_dir("/home/user/flood")
    h = sbx.files.watch_dir("/home/user/flood", recursive=True)
    before = _rss_kb(server.proc.pid)
    r = sbx.commands.run(
        "cd /home/user/flood && python3 -c \"\n"
        "import os\n"
        "for d in range(5000):\n"
        "    os.mkdir(f'd{d}')\n"
        "for i in range(30000):\n"
        "    open(f'd{i % 5000}/f{i}', 'w').close()\n\"",
        timeout=600)
    assert r.exit_code == 0, r.stderr
    events = h.get_new_events()
    assert 0 < len(events) <= MAX_QUEUED_EVENTS, len(events)
    after = _rss_kb(server.proc.pid)
    # The flood was about 35,000 events of ~10-byte names at least: kept whole, the server
    # or a reply would hold every one; bounded, a read carries at most the queue.
    assert after - before < 64 * 1024, (before, after)
    # Still watching: once what is left of the flood is read (what overflowed the kernel's
    # queue meanwhile is lost, as inotify loses it), a later change comes through.
    for _ in range(100):
        if not h.get_new_events():
            break
    sbx.commands.run("touch /home/user/flood/last.txt")
    got = _collect(h, [("last.txt", "create")])
    assert ("last.txt", "create") in got, got[-5:]
    h.stop()


def test_native_watch_stream(server, sbx):
    """The native door: GET /v1/sandboxes/{id}/watch as server-sent events, with the
    tenant's key (the E2B key is alice's); bob's key gets 404."""
    import threading
    from test_e2b_compat import E2B_KEY
    url = (f"{server.url.rstrip('/')}/v1/sandboxes/{sbx.sandbox_id}/watch"
           "?path=/work&recursive=true")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(
            url, headers={"Authorization": f"Bearer {KEYS['bob']}"}), timeout=30)
    assert e.value.code == 404
    resp = urllib.request.urlopen(urllib.request.Request(
        url, headers={"Authorization": f"Bearer {E2B_KEY}"}), timeout=60)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    t = threading.Timer(0.5, lambda: sbx.commands.run("mkdir -p /home/user/n && touch /home/user/n/x"))
    t.start()
    changes = []
    event = None
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event == "change":
            changes.append(json.loads(line.split(":", 1)[1]))
            if {"name": "n/x", "kind": "create"} in changes:
                break
    t.join()
    resp.close()
    assert {"name": "n", "kind": "create"} in changes, changes
    assert {"name": "n/x", "kind": "create"} in changes, changes


def test_watchers_are_bounded_and_stop_frees_one(sbx):
    """A sandbox has at most 16 watchers (cordon_core::MAX_WATCHERS): the 17th is refused
    saying to stop one, and stopping one makes room."""
    from e2b import SandboxException
    handles = [sbx.files.watch_dir("/home/user") for _ in range(16)]
    with pytest.raises(SandboxException) as e:
        sbx.files.watch_dir("/home/user")
    assert "stop one" in str(e.value)
    handles.pop().stop()
    handles.append(sbx.files.watch_dir("/home/user"))
    for h in handles:
        h.stop()


def test_a_stream_that_ends_frees_its_watcher(server, sbx):
    """Each native watch stream holds one of the sandbox's 16 watchers until its client goes:
    16 streams opened and closed, then 16 watchers can be had again (the server stops a
    stream's watcher once it sees the client gone, within a few reads)."""
    from e2b import SandboxException
    from test_e2b_compat import E2B_KEY
    url = f"{server.url.rstrip('/')}/v1/sandboxes/{sbx.sandbox_id}/watch?path=/work"
    streams = [urllib.request.urlopen(urllib.request.Request(
        url, headers={"Authorization": f"Bearer {E2B_KEY}"}), timeout=60) for _ in range(16)]
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/home/user")
    for s in streams:
        s.close()
    handles = []
    for _ in range(200):
        try:
            handles.append(sbx.files.watch_dir("/home/user"))
        except SandboxException:
            time.sleep(0.05)
        if len(handles) == 16:
            break
    assert len(handles) == 16
    for h in handles:
        h.stop()
