"""A sandbox's lifecycle as E2B's SDK sets it (issue 47): `lifecycle={"on_timeout": "pause",
"auto_resume": True}` pauses the sandbox at its timeout instead of killing it, its info says
so, and the next request resumes it where it stopped (a file and a running process kept),
with its timeout given again. Without `auto_resume` a request to it finds it paused until
`connect()`. Through the pinned SDK against the E2B listener; every byte stays on loopback."""

import sys
import time

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from test_e2b_compat import serving  # noqa: E402  (sets the SDK's URLs)


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def _state(sandbox_id: str) -> str:
    from e2b import Sandbox
    return Sandbox.get_info(sandbox_id).state.value


def _wait_state(sandbox_id: str, want: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while _state(sandbox_id) != want:
        assert time.monotonic() < deadline, f"{sandbox_id} never became {want}"
        time.sleep(0.2)


# Written then renamed: `>` truncates first, and a `cat` between the truncation and the
# write would read an empty file.
COUNTER = ("i=0; while true; do i=$((i+1)); echo $i > /home/user/count.new;"
           " mv /home/user/count.new /home/user/count; sleep 0.2; done")


def test_a_timeout_pauses_and_the_next_request_resumes(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sbx.files.write("/home/user/kept.txt", "before the pause")
        sbx.commands.run(COUNTER, background=True, timeout=0)
        sbx.commands.run("until [ -s /home/user/count ]; do sleep 0.1; done")
        _wait_state(sbx.sandbox_id, "paused")
        # Paused, not killed: it is listed as paused.
        assert _state(sbx.sandbox_id) == "paused"
        # The next request wakes it: the file and the process are where they were.
        assert sbx.files.read("/home/user/kept.txt") == "before the pause"
        assert _state(sbx.sandbox_id) == "running"
        first = int(sbx.commands.run("cat /home/user/count").stdout)
        time.sleep(1)
        assert int(sbx.commands.run("cat /home/user/count").stdout) > first
        # Its timeout runs again from the resume: it is not paused again at once.
        time.sleep(1)
        assert _state(sbx.sandbox_id) == "running"
    finally:
        sbx.kill()


def test_without_auto_resume_it_stays_paused_until_connect(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sbx.files.write("/home/user/kept.txt", "kept")
        _wait_state(sbx.sandbox_id, "paused")
        # A request does not wake it.
        with pytest.raises(Exception):
            sbx.files.read("/home/user/kept.txt")
        assert _state(sbx.sandbox_id) == "paused"
        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.files.read("/home/user/kept.txt") == "kept"
        assert _state(sbx.sandbox_id) == "running"
    finally:
        sbx.kill()


def test_a_plain_sandbox_is_still_killed_at_its_timeout(server):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=2)
    assert sbx.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
    deadline = time.monotonic() + 30
    while Sandbox.list().next_items() and any(
            s.sandbox_id == sbx.sandbox_id for s in Sandbox.list().next_items()):
        assert time.monotonic() < deadline, "a sandbox outlived its timeout"
        time.sleep(0.2)


BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def _paused_files(server) -> list:
    d = server.data_dir / "snapshots"
    return sorted(p.name for p in d.iterdir() if p.name.startswith("paused-")) if d.exists() else []


def test_a_pause_of_the_files_only_boots_it_again_from_them(server):
    """`pause(mode="filesystem")` (E2B's `memory: false`): the sandbox's processes end and
    its memory is let go, its files are kept; `connect()` boots it again from them under the
    same id: the file is there, the process of before is not, and the boot id is new. A
    pause that keeps memory keeps the boot id. Its files go when it is killed."""
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        boot = sbx.commands.run(BOOT_ID).stdout.strip()
        host_boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        assert len(boot) == 36 and boot != host_boot, boot
        # The file API reads the boot id (E2B's suites read it so), and that file alone of
        # /proc: on the container tier the one its programs read; gVisor's kernel has one
        # per /proc it mounts (each exec's own), never the host's.
        read_boot = sbx.files.read("/proc/sys/kernel/random/boot_id").strip()
        if server.tier == "container":
            assert read_boot == boot
        assert len(read_boot) == 36 and read_boot != host_boot, read_boot
        for other in ("/proc/sys/kernel/random/uuid", "/proc/self/environ"):
            with pytest.raises(Exception):
                sbx.files.read(other)
        # Paused with its memory: the same boot on the container tier (gVisor's restore of
        # a checkpoint gives its kernel a new boot id; its processes go on all the same).
        assert sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=120)
        if server.tier == "container":
            assert sbx.commands.run(BOOT_ID).stdout.strip() == boot
        boot = sbx.commands.run(BOOT_ID).stdout.strip()
        sbx.commands.run(COUNTER, background=True, timeout=0)
        sbx.commands.run("until [ -s /home/user/count ]; do sleep 0.1; done")
        assert sbx.pause(mode="filesystem")
        assert _state(sbx.sandbox_id) == "paused"
        assert _paused_files(server) == [f"paused-{sbx.sandbox_id}"]
        # Paused: no call reaches it until it is resumed.
        with pytest.raises(Exception):
            sbx.files.read("/home/user/kept.txt")
        again = sbx.connect()
        assert again.sandbox_id == sbx.sandbox_id
        assert _state(sbx.sandbox_id) == "running"
        assert _paused_files(server) == []
        assert again.files.read("/home/user/kept.txt") == "kept"
        assert again.commands.run(BOOT_ID).stdout.strip() not in (boot, host_boot)
        if server.tier == "container":
            assert again.files.read("/proc/sys/kernel/random/boot_id").strip() == \
                again.commands.run(BOOT_ID).stdout.strip()
        # The ticker of before is gone: its count stands still.
        count = again.commands.run("cat /home/user/count").stdout
        time.sleep(1)
        assert again.commands.run("cat /home/user/count").stdout == count
        # Booted again, it runs and pauses as any sandbox does.
        assert again.commands.run("echo alive").stdout == "alive\n"
        assert again.pause(mode="filesystem")
        assert _paused_files(server) == [f"paused-{sbx.sandbox_id}"]
    finally:
        sbx.kill()
    # Killed while paused to its files: they go with it.
    assert _paused_files(server) == []


def test_a_timeout_pause_of_the_files_only(server):
    """`lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}` (E2B's
    `autoPauseMemory: false`): its timeout pauses it keeping its files only; `connect()`
    boots it again from them."""
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": {"action": "pause",
                                                              "mode": "filesystem"}})
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sbx.files.write("/home/user/kept.txt", "kept")
        boot = sbx.commands.run(BOOT_ID).stdout.strip()
        _wait_state(sbx.sandbox_id, "paused")
        assert _paused_files(server) == [f"paused-{sbx.sandbox_id}"]
        again = sbx.connect(timeout=60)
        assert again.files.read("/home/user/kept.txt") == "kept"
        assert again.commands.run(BOOT_ID).stdout.strip() != boot
    finally:
        sbx.kill()
