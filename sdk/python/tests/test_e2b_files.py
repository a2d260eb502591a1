"""E2B's file calls beyond plain reads and writes, through the pinned SDK against the E2B
listener (issue 47): gzip uploads and downloads (`gzip=True`, E2B's content_encoding) and
what `get_info` and `list` report (a directory's size, a symlink and its target). Every byte
stays on loopback."""

import gzip
import sys
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

# Importing it sets the SDK's URLs; its `sbx` fixture serves this module's server.
from test_e2b_compat import ORIGIN, sbx, serving  # noqa: E402,F401


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def test_gzip_uploads_and_downloads(sbx):
    from e2b.sandbox.filesystem.filesystem import WriteEntry
    text = "compressed on the way in\n" * 100
    info = sbx.files.write("gz.txt", text, gzip=True)
    assert info.path == "/home/user/gz.txt"
    # Stored inflated: a plain read and the sandbox's own cat see the text.
    assert sbx.files.read("gz.txt") == text
    assert sbx.commands.run("cat /home/user/gz.txt").stdout == text
    assert sbx.files.read("gz.txt", gzip=True) == text
    assert sbx.files.read("gz.txt", format="bytes", gzip=True) == text.encode()
    infos = sbx.files.write_files([WriteEntry(path=f"m{i}.txt", data=f"file {i}")
                                   for i in range(3)], gzip=True)
    assert len(infos) == 3
    assert [sbx.files.read(f"m{i}.txt") for i in range(3)] == ["file 0", "file 1", "file 2"]
    # On the wire: the answer is gzip when asked for, plain otherwise.
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
         "X-Access-Token": sbx._envd_access_token}
    req = urllib.request.Request(ORIGIN + "/files?path=/home/user/gz.txt",
                                 headers=dict(h, **{"Accept-Encoding": "gzip"}))
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.read()).decode() == text
    # A bomb past the server's file limit (32 MiB) is refused, not expanded.
    bomb = gzip.compress(b"\0" * (33 << 20))
    req = urllib.request.Request(ORIGIN + "/files?path=/home/user/bomb", data=bomb,
                                 method="POST",
                                 headers=dict(h, **{"Content-Type": "application/octet-stream",
                                                    "Content-Encoding": "gzip"}))
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 413
    assert not sbx.files.exists("bomb")


def test_file_metadata(sbx):
    """get_info and list report what envd reports: type, size (a directory's own too),
    mode and permissions, owner, a time with its zone, and a symlink as one with its
    target as an absolute path."""
    from e2b import FileType
    sbx.files.write("meta/a.txt", "four")
    f = sbx.files.get_info("meta/a.txt")
    assert (f.name, f.type, f.path, f.size) == ("a.txt", FileType.FILE, "/home/user/meta/a.txt", 4)
    assert (f.mode, f.permissions, f.owner, f.group) == (0o644, "-rw-r--r--", "user", "user")
    assert f.modified_time is not None and f.modified_time.tzinfo is not None
    assert f.symlink_target is None
    sbx.files.make_dir("meta/sub")
    d = sbx.files.get_info("meta/sub")
    assert (d.name, d.type, d.path) == ("sub", FileType.DIR, "/home/user/meta/sub")
    assert d.size > 0, d
    assert d.permissions.startswith("d") and d.mode & 0o700 == 0o700
    sbx.commands.run("ln -s a.txt link && ln -s ../meta/sub up", cwd="/home/user/meta")
    link = sbx.files.get_info("meta/link")
    assert link.type == FileType.SYMLINK, link
    assert link.symlink_target == "/home/user/meta/a.txt", link
    listed = {e.name: e for e in sbx.files.list("meta")}
    assert listed["up"].type == FileType.SYMLINK
    assert listed["up"].symlink_target == "/home/user/meta/sub"
    assert listed["a.txt"].symlink_target is None and listed["a.txt"].size == 4
    assert listed["sub"].size > 0
