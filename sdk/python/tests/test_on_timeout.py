"""`on_timeout: "pause"` on a native create: at its TTL the sandbox is paused instead of
destroyed (its files and a running process kept, its execs refused until resumed, a `pause`
row audited), and `resume()` gives it its TTL again from then. A tier that cannot pause is
refused at the create, saying which can."""
import time

import pytest

from cordon_sandbox import CordonError


def _state(c, sid: str) -> str:
    return c.get_sandbox(sid).info.state


def test_a_ttl_pauses_and_a_resume_gives_the_ttl_again(alice, has_container):
    if not has_container:
        pytest.skip("the container tier is unavailable here")
    sb = alice.create_sandbox("container", ttl="3s", on_timeout="pause")
    try:
        assert sb.info.on_timeout == "pause"
        sb.write_file("/work/kept.txt", b"kept")
        ticker = sb.exec("i=0; while true; do i=$((i+1)); echo $i > /work/count; sleep 0.2; done",
                         background=True)
        sb.exec("until [ -s /work/count ]; do sleep 0.1; done")
        deadline = time.monotonic() + 30
        while _state(alice, sb.id) != "paused":
            assert time.monotonic() < deadline, "not paused at its TTL"
            time.sleep(0.2)
        with pytest.raises(CordonError):
            sb.exec("true")
        assert len(alice.audit(sandbox=sb.id, kind="pause")) == 1
        info = sb.resume()
        assert info.state == "live"
        # Its TTL runs again from the resume, whole.
        assert info.expires_ms > time.time() * 1000 + 2000, info
        assert sb.read_file("/work/kept.txt") == b"kept"
        first = int(sb.exec("cat /work/count").stdout)
        time.sleep(1)
        assert int(sb.exec("cat /work/count").stdout) > first
        assert ticker.status().state == "running"
    finally:
        sb.destroy()


def test_a_tier_that_cannot_pause_is_refused_at_the_create(alice):
    with pytest.raises(CordonError) as e:
        alice.create_sandbox("wasm", ttl="1m", on_timeout="pause")
    assert "cannot pause" in str(e.value) and "container" in str(e.value), e.value
