"""Files outside the workspace through the pinned E2B SDK (issue 47, ADR 0031): as E2B's git
helpers do, a directory under /tmp made by a command takes files written by the file API,
read back, listed, moved and removed, written as the sandbox's user; the image's files are
read. The agent inside the sandbox serves these as the sandbox's user, so a symlink in /tmp
to /proc/1/root, to / or to /proc/self, `..`, /proc, /sys, /dev and the read-only image are
refused, and nothing is written through a link. Container and gvisor (the microvm tier's
guest image must be rebuilt for its agent to serve them). Every byte stays on loopback."""

import sys

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from test_e2b_compat import sbx, serving  # noqa: E402,F401  (sets the SDK's URLs)


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def _out(sbx, cmd: str) -> str:
    return sbx.commands.run(cmd).stdout.strip()


def test_tmp_is_written_read_listed_moved_and_removed(sbx):
    f = sbx.files
    # E2B's git helpers: the directory made by a command, its files by the file API.
    sbx.commands.run('mkdir -p "/tmp/test-git/abc/repo"')
    f.write("/tmp/test-git/abc/repo/README.md", "hello\n")
    assert _out(sbx, "cat /tmp/test-git/abc/repo/README.md") == "hello"
    f.write("/tmp/x", "x-data")
    assert f.read("/tmp/x") == "x-data"
    names = {e.name for e in f.list("/tmp")}
    assert {"x", "test-git"} <= names, names
    assert [e.path for e in f.list("/tmp/test-git/abc")] == ["/tmp/test-git/abc/repo"]
    # Written as the sandbox's user, as a command would.
    assert _out(sbx, "stat -c %u /tmp/x") == _out(sbx, "id -u")
    info = f.get_info("/tmp/x")
    assert (info.type.value, info.size, info.path) == ("file", 6, "/tmp/x")
    assert f.exists("/tmp/x") and not f.exists("/tmp/none")
    assert f.make_dir("/tmp/made/deeper") is True
    moved = f.rename("/tmp/x", "/tmp/made/y")
    assert moved.path == "/tmp/made/y"
    assert f.read("/tmp/made/y") == "x-data"
    f.remove("/tmp/made")
    assert not f.exists("/tmp/made")
    assert _out(sbx, "test -e /tmp/made && echo there || echo gone") == "gone"
    # The image's own files are read.
    assert "root:" in f.read("/etc/passwd")


def test_links_climbs_and_the_kernels_views_are_refused(sbx):
    from e2b import SandboxException
    f = sbx.files
    # A naive server that followed these from the host's view of the sandbox would reach
    # the host's root (/proc/1/root is the host's init's, seen from outside).
    sbx.commands.run("ln -sfn /proc/1/root /tmp/init; ln -sfn / /tmp/slash; "
                     "ln -sfn /proc/self/environ /tmp/env; mkdir -p /tmp/d; "
                     "ln -sfn /tmp/d /tmp/dlink")
    refused = [
        lambda: f.read("/tmp/init/etc/hostname"),
        lambda: f.write("/tmp/init/tmp/planted", "x"),
        lambda: f.list("/tmp/init"),
        lambda: f.read("/tmp/slash/etc/passwd"),
        lambda: f.read("/tmp/env"),
        lambda: f.write("/tmp/dlink/planted", "x"),
        lambda: f.make_dir("/tmp/dlink/made"),
        lambda: f.read("/tmp/../proc/self/environ"),
        lambda: f.read("/proc/self/environ"),
        lambda: f.list("/proc/self/fd"),
        lambda: f.read("/sys/kernel/notes"),
        lambda: f.read("/dev/zero"),
        # The read-only image, as the sandbox's user.
        lambda: f.write("/etc/planted", "x"),
        lambda: f.remove("/etc/passwd"),
        # A move between /work and the rest is a command's.
        lambda: f.rename("/tmp/d", "/home/user/d"),
    ]
    for i, call in enumerate(refused):
        with pytest.raises(SandboxException):
            call()
            pytest.fail(f"call {i} was not refused")
    assert _out(sbx, "ls -A /tmp/d; test -e /tmp/planted || echo none") == "none"
    assert "root:" in _out(sbx, "head -1 /etc/passwd")
    # A link is listed and removed as itself, never followed.
    kinds = {e.name: e.type.value for e in f.list("/tmp")}
    assert kinds.get("init") == "symlink", kinds
    f.remove("/tmp/dlink")
    assert _out(sbx, "test -d /tmp/d && echo kept") == "kept"
