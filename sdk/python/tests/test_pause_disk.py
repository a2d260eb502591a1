"""Pause to disk (microvm) against a real `cordon serve`: the VM's QEMU ends, the sandbox
outlives a server SIGKILL + restart, and resumes with its processes and an interpreter's
variable; tampered state is refused; other tenants get 404; paused_ttl and destroy remove
the files."""

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from cordon_sandbox import Cordon, CordonError, NotFound, SandboxPaused, Unsupported
from conftest import KEYS, ServerProc, tier_available

# A counter and a Python interpreter holding a random variable, each writing to /work.
# (Written aside and renamed: a reader never sees the file truncated.)
TICKER = ("i=0; while :; do i=$((i+1)); echo $i > /work/ticks.t; mv /work/ticks.t /work/ticks; "
          "sleep 0.2; done")
HOLDER = ("import secrets, time\nx = secrets.token_hex(8)\n"
          "while True:\n    open('/work/x', 'w').write(x)\n    time.sleep(0.2)\n")


@pytest.fixture
def microvm():
    if not tier_available("microvm"):
        pytest.skip("microvm tier unavailable here (see the SKIPPING line above)")


def ticks(sb) -> int:
    return int(sb.exec("cat /work/ticks").stdout.strip())


def read_x(sb) -> str:
    for _ in range(100):
        out = sb.exec("cat /work/x 2>/dev/null").stdout.strip()
        if out:
            return out
        time.sleep(0.1)
    raise AssertionError("the interpreter never wrote its variable")


def still_ticking(sb) -> bool:
    before = ticks(sb)
    for _ in range(50):
        time.sleep(0.2)
        if ticks(sb) > before:
            return True
    return False


def qemu_processes(server: int) -> list:
    """QEMU processes descended from the server process `server` (other tests running side
    by side start QEMUs of their own)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass

    def under(pid: int) -> bool:
        for _ in range(64):
            if pid == server:
                return True
            pid = parent.get(pid, 0)
            if pid <= 1:
                return False
        return False

    found = []
    for pid in parent:
        try:
            if b"qemu-system" in Path(f"/proc/{pid}/cmdline").read_bytes() and under(pid):
                found.append(pid)
        except OSError:
            pass
    return found


def paused_dir(data: Path, sid: str) -> Path:
    return data / "paused" / "microvm" / sid


def start_holders(sb):
    sb.exec(TICKER, lang="bash", background=True)
    sb.exec(HOLDER, lang="python", background=True)
    for _ in range(100):
        if sb.exec("test -s /work/ticks && test -s /work/x && echo y").stdout.strip() == "y":
            return
        time.sleep(0.1)
    raise AssertionError("the background processes did not start")


def test_pause_to_disk_survives_a_sigkill_and_restart(microvm):
    top = Path(tempfile.mkdtemp(prefix="cordon-pause-"))
    d = top / "data"
    s = ServerProc(d, {}).start()
    try:
        alice, bob = Cordon(s.url, KEYS["alice"]), Cordon(s.url, KEYS["bob"])
        before_qemus = set(qemu_processes(s.proc.pid))
        sb = alice.create_sandbox(tier="microvm", ttl="10m", labels={"run": "p"})
        start_holders(sb)
        x = read_x(sb)
        ctx = sb.create_context("python")
        assert ctx.run("y = 41 + 1").error is None
        mine = set(qemu_processes(s.proc.pid)) - before_qemus
        assert mine, "no QEMU process for the sandbox"

        # In this server: pause to disk, QEMU gone, resume, everything alive.
        t0 = time.monotonic()
        info = sb.pause(to_disk=True)
        pause_ms = (time.monotonic() - t0) * 1000
        assert info.state == "paused" and info.on_disk and info.on_disk_bytes > 0, info
        assert not (set(qemu_processes(s.proc.pid)) & mine), "the sandbox's QEMU still runs"
        assert paused_dir(d, sb.id).is_dir()
        assert oct(paused_dir(d, sb.id).stat().st_mode & 0o777) == "0o700"
        listed = {i.id: i for i in alice.list_sandboxes()}
        assert listed[sb.id].on_disk and listed[sb.id].on_disk_bytes == info.on_disk_bytes
        # The tenant's view counts it; another tenant's does not.
        assert alice.sandboxes().on_disk_bytes == info.on_disk_bytes
        assert bob.sandboxes().on_disk_bytes == 0
        for call in (lambda: bob.request("POST", f"/v1/sandboxes/{sb.id}/resume", {}),
                     lambda: bob.request("POST", f"/v1/sandboxes/{sb.id}/pause",
                                       {"to_disk": True}),
                     lambda: bob.request("GET", f"/v1/sandboxes/{sb.id}")):
            with pytest.raises(NotFound):
                call()
        with pytest.raises(SandboxPaused):
            sb.exec("echo no")
        t0 = time.monotonic()
        info = sb.resume()
        resume_ms = (time.monotonic() - t0) * 1000
        print(f"\nmicrovm via the API: pause to disk {pause_ms:.0f} ms, resume {resume_ms:.0f} ms, "
              f"{info.on_disk_bytes} / {listed[sb.id].on_disk_bytes} bytes on disk")
        assert info.state == "live" and not info.on_disk, info
        assert not paused_dir(d, sb.id).exists()
        assert still_ticking(sb) and read_x(sb) == x
        assert ctx.run("y").text == "42"
        kinds = [e.kind for e in alice.audit(sandbox=sb.id, limit=1000)]
        assert "pause" in kinds and "resume" in kinds
        pause_rows = [e for e in alice.audit(sandbox=sb.id, kind="pause", limit=100)]
        assert any(e.detail.get("to_disk") for e in pause_rows), pause_rows

        # Across a SIGKILL and a restart on the same data dir.
        sb.pause(to_disk=True)
        s.kill9()
        s = ServerProc(d, {}).start()
        alice, bob = Cordon(s.url, KEYS["alice"]), Cordon(s.url, KEYS["bob"])
        listed = {i.id: i for i in alice.list_sandboxes()}
        assert sb.id in listed, listed
        kept = listed[sb.id]
        assert kept.state == "paused" and kept.on_disk and kept.labels == {"run": "p"}
        assert kept.created_ms == info.created_ms
        assert bob.list_sandboxes() == []
        with pytest.raises(NotFound):
            bob.request("POST", f"/v1/sandboxes/{sb.id}/resume", {})
        sb = alice.sandbox_handle(kept.id)
        sb.resume()
        assert still_ticking(sb) and read_x(sb) == x

        # And across a graceful stop (SIGTERM).
        sb.pause(to_disk=True)
        s.stop()
        assert paused_dir(d, sb.id).is_dir(), "a graceful stop removed a paused sandbox"
        s = ServerProc(d, {}).start()
        alice = Cordon(s.url, KEYS["alice"])
        sb = alice.get_sandbox(sb.id)
        assert sb.info.on_disk
        sb.resume()
        assert still_ticking(sb) and read_x(sb) == x

        # A tampered state: refused, the sandbox is destroyed, nothing runs from it.
        sb.pause(to_disk=True)
        state = paused_dir(d, sb.id) / "state"
        with open(state, "r+b") as f:
            f.seek(8192)
            f.write(b"\x00tampered\x00")
        qemus = set(qemu_processes(s.proc.pid))
        with pytest.raises(CordonError) as e:
            sb.resume()
        assert "create a new" in (e.value.fix + str(e.value)), e.value
        assert not (set(qemu_processes(s.proc.pid)) - qemus), \
            "a QEMU was started from tampered state"
        assert not paused_dir(d, sb.id).exists()
        assert sb.id not in {i.id for i in alice.list_sandboxes()}

        # Destroy removes the files.
        sb2 = alice.create_sandbox(tier="microvm", ttl="10m")
        sb2.pause(to_disk=True)
        assert paused_dir(d, sb2.id).is_dir()
        sb2.destroy()
        assert not paused_dir(d, sb2.id).exists()
        assert list((d / "paused" / "microvm").iterdir()) == []
    finally:
        s.stop()
        shutil.rmtree(top, ignore_errors=True)


def test_paused_ttl_removes_a_sandbox_paused_to_disk_even_after_a_restart(microvm):
    top = Path(tempfile.mkdtemp(prefix="cordon-pttl-"))
    d = top / "data"
    s = ServerProc(d, {}, extra='').start()
    try:
        alice = Cordon(s.url, KEYS["alice"])
        sb = alice.create_sandbox(tier="microvm", ttl="10m")
        sb.pause(to_disk=True)
        s.kill9()
        # Restarted with a short paused_ttl: the reaper ends it and removes its files.
        cfg = s.config.read_text().replace(
            '[sessions]\nreap_interval = "100ms"\n',
            '[sessions]\nreap_interval = "100ms"\npaused_ttl = "2s"\n')
        s.config.write_text(cfg)
        s = ServerProc.__new__(ServerProc)
        s.data_dir, s.config, s.proc, s.url = d, top / "data.toml", None, ""
        s.start()
        alice = Cordon(s.url, KEYS["alice"])
        assert [i.id for i in alice.list_sandboxes()] == [sb.id]
        deadline = time.time() + 30
        while alice.list_sandboxes() and time.time() < deadline:
            time.sleep(0.2)
        assert alice.list_sandboxes() == []
        assert not paused_dir(d, sb.id).exists()
        reasons = [e.decision for e in alice.audit(sandbox=sb.id, kind="destroy", limit=10)]
        assert "paused-ttl" in reasons, reasons
    finally:
        s.stop()
        shutil.rmtree(top, ignore_errors=True)


def test_to_disk_is_refused_off_microvm_and_with_egress(alice, microvm):
    with alice.create_sandbox(tier="wasm") as sb:
        with pytest.raises(Unsupported) as e:
            sb.pause(to_disk=True)
        assert "microvm" in e.value.fix
    with alice.create_sandbox(tier="microvm", allow_hosts=["example.com"]) as sb:
        with pytest.raises(Unsupported) as e:
            sb.pause(to_disk=True)
        assert "without to_disk" in e.value.fix
        assert sb.exec("echo ok").stdout == "ok\n"


def test_a_paused_sandbox_whose_manifest_was_tampered_is_ended_at_the_restart(microvm):
    top = Path(tempfile.mkdtemp(prefix="cordon-ptam-"))
    d = top / "data"
    s = ServerProc(d, {}).start()
    try:
        alice = Cordon(s.url, KEYS["alice"])
        sb = alice.create_sandbox(tier="microvm", ttl="10m")
        sb.pause(to_disk=True)
        s.kill9()
        manifest = paused_dir(d, sb.id) / "manifest.json"
        manifest.write_text(manifest.read_text().replace('"format"', '"formaat"'))
        s = ServerProc(d, {}).start()
        alice = Cordon(s.url, KEYS["alice"])
        assert alice.list_sandboxes() == []
        assert not paused_dir(d, sb.id).exists()
        rows = alice.audit(sandbox=sb.id, kind="destroy", limit=10)
        assert [r.decision for r in rows] == ["resume-failed"], rows
        with pytest.raises(NotFound):
            alice.request("POST", f"/v1/sandboxes/{sb.id}/resume", {})
    finally:
        s.stop()
        shutil.rmtree(top, ignore_errors=True)


def test_pause_sandbox_tool_takes_to_disk(server, microvm):
    from test_mcp_procs import Mcp
    alice = Mcp(server.url, KEYS["alice"])
    ok, created = alice.tool("create_sandbox", tier="microvm")
    assert ok, created
    sb = created["id"]
    try:
        ok, paused = alice.tool("pause_sandbox", sandbox=sb, to_disk=True)
        assert ok and paused["on_disk"] and paused["on_disk_bytes"] > 0, paused
        ok, resumed = alice.tool("resume_sandbox", sandbox=sb)
        assert ok and not resumed.get("on_disk"), resumed
        ok, ran = alice.tool("exec", sandbox=sb, lang="bash", code="echo back")
        assert ok and "back" in str(ran), ran
    finally:
        alice.tool("destroy", sandbox=sb)
    ok, wasm = alice.tool("create_sandbox", tier="wasm")
    assert ok, wasm
    try:
        ok, refused = alice.tool("pause_sandbox", sandbox=wasm["id"], to_disk=True)
        assert not ok and "microvm" in str(refused), refused
    finally:
        alice.tool("destroy", sandbox=wasm["id"])
