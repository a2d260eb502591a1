"""E2B's own Python SDK (pinned `e2b`), unchanged, runs its snapshot and fork API against a
real `cordon serve` with its `[e2b]` listener on loopback (container tier: filesystem
snapshots): `create_snapshot`, `Sandbox.create(snapshot_id)`, `fork(count=3)`,
`list_snapshots` and `delete_snapshot`.

The SDK's URLs are the loopback listener's, set by test_e2b_compat at its import, before the
SDK is imported; this module's server listens there once that module's is gone."""

import shutil

import pytest

import test_e2b_compat as compat  # noqa: F401 (sets the SDK's loopback URLs first)
from conftest import tier_available


@pytest.fixture(scope="module")
def server():
    if not tier_available("container"):
        pytest.skip("container tier unavailable here")
    s = compat.e2b_server("container")
    yield s
    s.stop()
    shutil.rmtree(s.tmp, ignore_errors=True)


def read(sbx, path: str) -> str:
    return sbx.files.read(path)


def test_create_snapshot_create_from_it_list_and_delete(server):
    from e2b import Sandbox
    src = Sandbox.create(timeout=120)
    try:
        src.files.write("/home/user/state.txt", "before")
        info = src.create_snapshot("e2b-snap")
        assert info.snapshot_id.startswith("snap-") and info.names == ["e2b-snap"], info
        src.files.write("/home/user/state.txt", "source-after")
        new = Sandbox.create(info.snapshot_id, timeout=60)
        try:
            assert new.sandbox_id != src.sandbox_id
            assert read(new, "/home/user/state.txt") == "before"
            assert new.commands.run("cat state.txt").stdout == "before"
        finally:
            new.kill()
        # By name too, as E2B's templates are.
        by_name = Sandbox.create("e2b-snap", timeout=60)
        try:
            assert read(by_name, "/home/user/state.txt") == "before"
        finally:
            by_name.kill()
        listed = Sandbox.list_snapshots().next_items()
        assert [s.snapshot_id for s in listed] == [info.snapshot_id], listed
        assert [s.snapshot_id for s in src.list_snapshots().next_items()] == [info.snapshot_id]
        assert Sandbox.list_snapshots(sandbox_id="sb-" + "0" * 32).next_items() == []
        # A name may start with snap- (E2B's suites name them so) unless it has an id's
        # shape, which could shadow another snapshot's id.
        named = src.create_snapshot("snap-named")
        assert named.names == ["snap-named"], named
        assert Sandbox.delete_snapshot(named.snapshot_id) is True
        with pytest.raises(Exception) as shaped:
            src.create_snapshot("snap-" + "a" * 32)
        assert "id's shape" in str(shaped.value), shaped.value
        # A name given again goes to the new snapshot (E2B's), the old one is deleted.
        again = src.create_snapshot("e2b-snap")
        assert again.snapshot_id != info.snapshot_id
        assert [s.snapshot_id for s in Sandbox.list_snapshots().next_items()] == [
            again.snapshot_id]
        assert Sandbox.delete_snapshot(again.snapshot_id) is True
        assert Sandbox.delete_snapshot(again.snapshot_id) is False
        assert Sandbox.list_snapshots().next_items() == []
    finally:
        src.kill()


def test_fork_three(server):
    from e2b import Sandbox
    src = Sandbox.create(timeout=120)
    try:
        src.files.write("/home/user/f.txt", "before")
        forks = src.fork(count=3, timeout=60)
        try:
            assert all(isinstance(f, Sandbox) for f in forks), forks
            ids = {f.sandbox_id for f in forks}
            assert len(ids) == 3 and src.sandbox_id not in ids
            for f in forks:
                assert read(f, "/home/user/f.txt") == "before"
            forks[0].files.write("/home/user/f.txt", "fork-0")
            assert [read(f, "/home/user/f.txt") for f in forks] == ["fork-0", "before", "before"]
            assert read(src, "/home/user/f.txt") == "before"
        finally:
            for f in forks:
                if isinstance(f, Sandbox):
                    f.kill()
        # The fork's snapshot is not kept.
        assert Sandbox.list_snapshots().next_items() == []
    finally:
        src.kill()


def test_refusals_in_e2b_shape(server):
    from e2b import Sandbox, SandboxException
    src = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxException) as e:
            src.create_snapshot(mode="full")
        assert "CRIU" in str(e.value) and "filesystem" in str(e.value), e.value
        with pytest.raises(Exception) as e:
            Sandbox.fork("sb-" + "0" * 32, count=2)
        assert "not found" in str(e.value).lower(), e.value
    finally:
        src.kill()


def test_template_exists_answers_for_mapped_templates_and_own_snapshots(server):
    """`Template.exists` (`GET /templates/aliases/{alias}`): true for a name a create takes
    (a template the operator maps, E2B's defaults, the tenant's own snapshots), false for any
    other name and for another tenant's snapshot."""
    from e2b import Sandbox, Template
    from conftest import KEYS
    assert Template.exists("base") is True
    assert Template.exists("code-interpreter-v1") is True
    assert Template.exists("base:latest") is True
    assert Template.exists("no-such-template-47") is False
    src = Sandbox.create(timeout=120)
    try:
        info = src.create_snapshot("exists-snap")
        assert Template.exists("exists-snap") is True
        # Another tenant's key does not see alice's snapshot by its name.
        assert Template.exists("exists-snap", api_key=KEYS["bob"]) is False
        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Template.exists("exists-snap") is False
    finally:
        src.kill()
