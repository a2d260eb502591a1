"""`Sandbox.list` as E2B answers it, through the pinned SDK against the E2B listener (issue
47): newest first, pages of `limit` with `next_token` over running and paused sandboxes, the
state, template and `started_after` filters; another tenant's sandboxes are never listed.
Every byte stays on loopback."""

import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from conftest import KEYS  # noqa: E402
from test_e2b_compat import serving  # noqa: E402  (sets the SDK's URLs)


@pytest.fixture(scope="module", params=("container",))
def server(request):
    yield from serving(request.param)


def _all(paginator) -> list:
    out = []
    while paginator.has_next:
        out.extend(paginator.next_items())
    return out


def test_list_order_pages_and_filters(server):
    from e2b import Sandbox, SandboxQuery, SandboxState
    tag = {"list_test": str(uuid.uuid4())}
    made = []
    try:
        for _ in range(3):
            made.append(Sandbox.create(timeout=300, metadata=tag))
            time.sleep(0.01)  # distinct start times, in milliseconds
        bob = Sandbox.create(timeout=300, metadata=tag, api_key=KEYS["bob"])
        made[1].pause()
        newest_first = [s.sandbox_id for s in reversed(made)]

        q = SandboxQuery(metadata=tag)
        assert [s.sandbox_id for s in Sandbox.list(query=q).next_items()] == newest_first
        # One at a time, across running and paused, each once.
        pages = Sandbox.list(query=q, limit=1)
        seen = []
        while pages.has_next:
            items = pages.next_items()
            assert len(items) <= 1
            seen.extend(s.sandbox_id for s in items)
        assert seen == newest_first, seen
        assert pages.next_token is None
        # A page of two, then the rest.
        pages = Sandbox.list(query=q, limit=2)
        first = pages.next_items()
        assert [s.sandbox_id for s in first] == newest_first[:2]
        assert pages.has_next and pages.next_token
        assert [s.sandbox_id for s in pages.next_items()] == newest_first[2:]
        assert not pages.has_next
        # States.
        paused = _all(Sandbox.list(query=SandboxQuery(metadata=tag,
                                                      state=[SandboxState.PAUSED]), limit=1))
        assert [s.sandbox_id for s in paused] == [made[1].sandbox_id]
        assert paused[0].state == SandboxState.PAUSED
        running = _all(Sandbox.list(query=SandboxQuery(metadata=tag,
                                                       state=[SandboxState.RUNNING]), limit=1))
        assert [s.sandbox_id for s in running] == [newest_first[0], newest_first[2]]
        # Template.
        assert len(_all(Sandbox.list(query=SandboxQuery(metadata=tag, template="base")))) == 3
        assert _all(Sandbox.list(query=SandboxQuery(metadata=tag, template="other"))) == []
        # Started after: the last one's start, and a time after all of them.
        last = made[2].get_info().started_at
        after = _all(Sandbox.list(query=SandboxQuery(metadata=tag, started_after=last)))
        assert [s.sandbox_id for s in after] == [made[2].sandbox_id]
        later = datetime.now(timezone.utc) + timedelta(minutes=1)
        assert _all(Sandbox.list(query=SandboxQuery(metadata=tag, started_after=later))) == []
        # Bob sees only his own.
        theirs = _all(Sandbox.list(query=q, api_key=KEYS["bob"]))
        assert [s.sandbox_id for s in theirs] == [bob.sandbox_id]
    finally:
        for s in made:
            Sandbox.kill(s.sandbox_id)
        bob.kill()
