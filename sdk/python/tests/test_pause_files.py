"""A pause that keeps a sandbox's files only (`pause(files_only=True)`, `on_timeout:
"pause_files"`; E2B's `memory: false`): the sandbox's processes end and the host lets go of
everything it held for them (its processes, cgroup, memory), its files stay on disk under
the tenant's paused-state budget; `resume()` starts it again from them under the same id, as
a machine boots again. Another tenant can neither see nor resume it."""
import os
import socket
import time
import urllib.parse
from pathlib import Path

import pytest

from cordon_sandbox import CordonError
from conftest import KEYS


def _host_pids_of(sid: str) -> list:
    """Host processes in a cgroup named for sandbox `sid`."""
    short = sid[:19]
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if short in (p / "cgroup").read_text():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def _paused_dirs(server) -> list:
    d = Path(server.data_dir) / "snapshots"
    return sorted(p.name for p in d.iterdir() if p.name.startswith("paused-")) if d.exists() else []


@pytest.fixture
def container(has_container):
    if not has_container:
        pytest.skip("the container tier is unavailable here")


def test_files_only_lets_go_of_the_processes_and_a_resume_boots_it_again(alice, bob, server,
                                                                          container):
    sb = alice.create_sandbox("container", ttl="5m")
    try:
        sb.write_file("/work/kept.txt", b"kept")
        ticker = sb.exec("i=0; while true; do i=$((i+1)); echo $i > /work/c.new; "
                         "mv /work/c.new /work/count; sleep 0.2; done", background=True)
        sb.exec("until [ -s /work/count ]; do sleep 0.1; done")
        boot = sb.exec("cat /proc/sys/kernel/random/boot_id").stdout
        assert boot.strip() != Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        # The sandbox's own boot id is a wall too: it can neither be written nor unmounted
        # to show the host's behind it.
        for attempt in ("echo 0 > /proc/sys/kernel/random/boot_id",
                        "umount /proc/sys/kernel/random/boot_id",
                        "umount -l /proc/sys/kernel/random/boot_id"):
            assert sb.exec(attempt).exit_code != 0, attempt
            assert sb.exec("cat /proc/sys/kernel/random/boot_id").stdout == boot, attempt
        assert _host_pids_of(sb.id), "a live sandbox has processes on the host"
        info = sb.pause(files_only=True)
        assert info.state == "paused" and info.on_disk and info.on_disk_bytes > 0, info
        # Nothing of it runs on the host any more; its files are kept, root-only.
        assert _host_pids_of(sb.id) == []
        assert _paused_dirs(server) == [f"paused-{sb.id}"]
        d = Path(server.data_dir) / "snapshots" / f"paused-{sb.id}"
        assert oct(os.stat(d).st_mode & 0o777) == "0o700"
        with pytest.raises(CordonError):
            sb.exec("true")
        # Another tenant cannot resume it (or learn that it exists).
        with pytest.raises(CordonError) as e:
            bob.get_sandbox(sb.id).resume()
        assert "not_found" in str(e.value), e.value
        assert alice.get_sandbox(sb.id).info.state == "paused"
        info = sb.resume()
        assert info.state == "live" and info.id == sb.id and not info.on_disk, info
        assert _paused_dirs(server) == []
        assert _host_pids_of(sb.id), "resumed, it runs again"
        assert sb.read_file("/work/kept.txt") == b"kept"
        assert sb.exec("cat /proc/sys/kernel/random/boot_id").stdout != boot
        # The ticker did not come back: its count stands still, and its exec is gone.
        count = sb.exec("cat /work/count").stdout
        time.sleep(1)
        assert sb.exec("cat /work/count").stdout == count
        with pytest.raises(CordonError):
            ticker.status()
    finally:
        sb.destroy()
    assert _paused_dirs(server) == []


def test_a_resume_its_client_hangs_up_on_still_ends_whole(alice, server, container):
    """A client that sends a resume and hangs up at once (an anonymous visitor can, through a
    public port of a sandbox with autoResume) does not cut the start short: the sandbox comes
    back live with its files, and nothing of its paused state is left on disk."""
    sb = alice.create_sandbox("container", ttl="5m")
    try:
        sb.write_file("/work/kept.txt", b"kept")
        sb.pause(files_only=True)
        u = urllib.parse.urlparse(server.url)
        for _ in range(3):
            with socket.create_connection((u.hostname, u.port), timeout=10) as c:
                c.sendall((f"POST /v1/sandboxes/{sb.id}/resume HTTP/1.1\r\nHost: x\r\n"
                           f"Authorization: Bearer {KEYS['alice']}\r\n"
                           "Content-Length: 0\r\n\r\n").encode())
        deadline = time.monotonic() + 60
        while True:
            info = alice.get_sandbox(sb.id).info
            if info.state == "live" and not info.busy:
                break
            assert time.monotonic() < deadline, f"never came back: {info}"
            time.sleep(0.1)
        assert info.restarts == 1, info
        assert sb.read_file("/work/kept.txt") == b"kept"
        assert _paused_dirs(server) == []
        assert sb.exec("echo up").stdout == "up\n"
    finally:
        sb.destroy()
    assert _paused_dirs(server) == []


def test_a_ttl_pause_of_the_files_only(alice, server, container):
    sb = alice.create_sandbox("container", ttl="3s", on_timeout="pause_files")
    try:
        assert sb.info.on_timeout == "pause_files"
        sb.write_file("/work/kept.txt", b"kept")
        deadline = time.monotonic() + 30
        while alice.get_sandbox(sb.id).info.state != "paused":
            assert time.monotonic() < deadline, "not paused at its TTL"
            time.sleep(0.2)
        assert alice.get_sandbox(sb.id).info.on_disk
        assert _host_pids_of(sb.id) == []
        info = sb.resume()
        # Its TTL runs again from the resume, whole.
        assert info.expires_ms > time.time() * 1000 + 2000, info
        assert sb.read_file("/work/kept.txt") == b"kept"
    finally:
        sb.destroy()


def test_refusals(alice, container):
    with pytest.raises(CordonError) as e:
        alice.create_sandbox("wasm", ttl="1m", on_timeout="pause_files")
    assert "cannot pause" in str(e.value) and "container" in str(e.value), e.value
    sb = alice.create_sandbox("wasm", ttl="1m")
    try:
        with pytest.raises(CordonError) as e:
            sb.pause(files_only=True)
        assert "container" in str(e.value), e.value
    finally:
        sb.destroy()
    sb = alice.create_sandbox("container", ttl="1m")
    try:
        with pytest.raises(CordonError) as e:
            sb.pause(to_disk=True, files_only=True)
        assert "give one of them" in str(e.value), e.value
        assert alice.get_sandbox(sb.id).info.state == "live"
    finally:
        sb.destroy()
