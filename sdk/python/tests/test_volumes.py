"""Volumes against a real `cordon serve`: written by one sandbox and read by the next (on the
container and gvisor tiers, and from one tier to the other), the quota as disk-full, read-only
mounts, read-write exclusivity, another tenant's 404s, the tenant's ceiling, the MCP tools, and
a kill -9 of the server while a volume is mounted."""
import json
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import KEYS, ServerProc, tier_available
from cordon_sandbox import (Cordon, NotFound, PolicyDenied, InvalidRequest, VolumeExists, VolumeInUse,
                    VolumeQuota)
from test_mcp_procs import Mcp


def _name() -> str:
    return "v" + uuid.uuid4().hex[:12]


@pytest.fixture
def volume(alice, has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    name = _name()
    alice.create_volume(name, "16M")
    yield name
    try:
        alice.delete_volume(name)
    except NotFound:
        pass


@pytest.mark.parametrize("tiers", [("container", "container"), ("gvisor", "gvisor"),
                                   ("container", "gvisor"), ("gvisor", "container")])
def test_written_by_one_sandbox_read_by_the_next_bounded_and_read_only(alice, volume, tiers):
    first, second = tiers
    if "gvisor" in tiers and not tier_available("gvisor"):
        pytest.skip("the gvisor tier is not available here")
    with alice.sandbox(tier=first, volumes=[f"{volume}:/work/data"]) as sb:
        r = sb.exec("echo kept > /work/data/a && ln -s /etc /work/data/etc && "
                    "ln -s / /work/data/root && cat /work/data/a", lang="bash")
        assert r.exit_code == 0, r.stderr
        v = alice.volume(volume)
        assert [m.sandbox for m in v.mounts] == [sb.id] and not v.mounts[0].read_only
    assert alice.volume(volume).mounts == []
    with alice.sandbox(tier=second, volumes=[{"name": volume, "path": "/work/in/v",
                                              "read_only": True}]) as sb:
        r = sb.exec("cat /work/in/v/a; touch /work/in/v/b 2>&1 || echo REFUSED; "
                    "cat /work/in/v/etc/shadow 2>&1 || echo NO-SHADOW; "
                    "echo ROOT: $(ls /work/in/v/root/) :END; "
                    "echo HOME: $(ls -A /work/in/v/root/home 2>/dev/null) :END", lang="bash")
        assert r.stdout.startswith("kept\n"), r.stdout
        assert "REFUSED" in r.stdout and "NO-SHADOW" in r.stdout, r.stdout
        root = r.stdout.split("ROOT:")[1].split(":END")[0]
        for host_only in (" boot ", " var ", " root "):
            assert host_only not in root, root
        # The sandbox's root may have its own /home (the container tier links E2B's
        # /home/user to /work); nothing of the host's /home is in it.
        home = r.stdout.split("HOME:")[1].split(":END")[0].split()
        assert home in ([], ["user"]), (home, r.stdout)
    # The quota is the volume's size: past it, ENOSPC inside and disk-limit outside.
    with alice.sandbox(tier=second, volumes=[f"{volume}:/work/data"]) as sb:
        r = sb.exec("dd if=/dev/zero of=/work/data/big bs=1M count=64", lang="bash")
        assert r.termination == "disk-limit", (r.termination, r.stderr)
        assert "No space left" in r.stderr
    assert alice.volume(volume).used > 8 << 20


def test_exclusive_tenant_checked_and_counted(alice, bob, volume):
    with alice.sandbox(tier="container", volumes=[f"{volume}:/work/data"]) as writer:
        for spec in (f"{volume}:/work/d", f"{volume}:/work/d:ro"):
            with pytest.raises(VolumeInUse):
                alice.sandbox(tier="container", volumes=[spec])
        with pytest.raises(VolumeInUse):
            alice.delete_volume(volume)
        assert writer.exec("ls /work/data", lang="bash").exit_code == 0
    # Read-only many at once.
    with alice.sandbox(tier="container", volumes=[f"{volume}:/work/a:ro"]), \
            alice.sandbox(tier="container", volumes=[f"{volume}:/work/b:ro"]):
        assert len(alice.volume(volume).mounts) == 2
    # Another tenant: not found, everywhere.
    assert volume not in [v.name for v in bob.volumes().volumes]
    for call in (lambda: bob.volume(volume), lambda: bob.delete_volume(volume),
                 lambda: bob.sandbox(tier="container", volumes=[f"{volume}:/work/d:ro"])):
        with pytest.raises(NotFound):
            call()
    # Mount points: under /work, plain; tiers with a kernel wall only.
    for path in ("/etc", "/work", "/work/../etc", "work/x"):
        with pytest.raises(InvalidRequest):
            alice.sandbox(tier="container", volumes=[{"name": volume, "path": path}])
    with pytest.raises(PolicyDenied):
        alice.sandbox(tier="wasm", volumes=[f"{volume}:/work/d"])
    with pytest.raises(VolumeExists):
        alice.create_volume(volume, "16M")
    # The ceiling (1 GiB by default) counts the sizes of the tenant's volumes.
    listed = alice.volumes()
    assert listed.quota_bytes == 1 << 30
    assert listed.used_bytes >= 16 << 20
    big = _name()
    with pytest.raises(VolumeQuota):
        alice.create_volume(big, (1 << 30) - listed.used_bytes + (1 << 20))
    assert big not in [v.name for v in alice.volumes().volumes]


def _tool(mcp: Mcp, tool: str, **args):
    """`Mcp.tool`, for tools whose arguments include `name`."""
    res = mcp.rpc("tools/call", {"name": tool, "arguments": args})
    text = "".join(c.get("text", "") for c in res.get("content", []))
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    return not res.get("isError", False), value


def test_volume_tools_over_mcp_are_tenant_checked(server, has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    alice, bob = Mcp(server.url, KEYS["alice"]), Mcp(server.url, KEYS["bob"])
    name = _name()
    ok, v = _tool(alice, "create_volume", name=name, size="16M")
    assert ok and v["size"] == 16 << 20, v
    try:
        ok, listed = bob.tool("list_volumes")
        assert ok and name not in [x["name"] for x in listed["volumes"]], listed
        ok, err = _tool(bob, "delete_volume", name=name)
        assert not ok and "no volume" in str(err), err
        ok, err = bob.tool("create_sandbox", tier="container",
                           volumes=[{"name": name, "path": "/work/v"}])
        assert not ok, err
        ok, sb = alice.tool("create_sandbox", tier="container",
                            volumes=[{"name": name, "path": "/work/v"}])
        assert ok, sb
        ok, err = _tool(alice, "delete_volume", name=name)
        assert not ok and "mounted" in str(err), err
        ok, out = alice.tool("exec", sandbox=sb["id"], lang="bash",
                             code="echo mcp > /work/v/f && cat /work/v/f")
        assert ok and "mcp" in str(out), out
        assert alice.tool("destroy", sandbox=sb["id"])[0]
    finally:
        ok, out = _tool(alice, "delete_volume", name=name)
        assert ok, out


def test_kill9_while_mounted_then_restart_keeps_the_volume(has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    top = Path(tempfile.mkdtemp(prefix="cordon-vol-crash-"))
    d = top / "data"
    s = ServerProc(d, {}).start()
    try:
        c = Cordon(s.url, KEYS["alice"])
        c.create_volume("kept", "16M")
        sb = c.sandbox(tier="container", volumes=["kept:/work/k"])
        assert sb.exec("echo survived > /work/k/f && sync", lang="bash").exit_code == 0
        s.kill9()
        s = ServerProc(d, {}).start()
        c = Cordon(s.url, KEYS["alice"])
        v = c.volume("kept")
        assert v.mounts == [], v
        with c.sandbox(tier="container", volumes=["kept:/work/k"]) as sb2:
            assert sb2.exec("cat /work/k/f", lang="bash").stdout == "survived\n"
        c.delete_volume("kept")
        assert c.volumes().volumes == []
    finally:
        s.stop()
        shutil.rmtree(top, ignore_errors=True)
