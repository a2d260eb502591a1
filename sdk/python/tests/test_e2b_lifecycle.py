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
