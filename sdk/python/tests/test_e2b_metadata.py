"""E2B's file metadata (envd 0.6.2) and entries in watch events (envd 0.6.3, with 0.6.4's
`allow_network_mounts`) through the pinned SDK against the E2B listener (issue 47): an
upload's metadata is kept as `user.e2b.*` extended attributes on the file and shown by
`get_info`, `list` and `rename`; an upload without any clears what was there; a command's own
`user.e2b.*` attribute shows, other `user.*` ones do not; a symlink's metadata is never its
target's; metadata past the bounds is refused and nothing is written. Every byte stays on
loopback."""

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

from test_e2b_compat import ORIGIN, sbx, serving  # noqa: E402,F401  (sets the SDK's URLs)

# cordon_core::MAX_METADATA_VALUE and MAX_METADATA_KEYS.
MAX_VALUE = 4096
MAX_KEYS = 64


@pytest.fixture(scope="module", params=("container", "gvisor"))
def server(request):
    yield from serving(request.param)


def test_the_listener_announces_envd_0_6_4(sbx):
    got = tuple(int(x) for x in str(sbx._envd_version).split("."))
    assert got >= (0, 6, 4), sbx._envd_version


def test_metadata_round_trips_lists_renames_and_clears(sbx):
    from e2b.sandbox.filesystem.filesystem import WriteEntry
    md = {"author": "mish", "purpose": "upload"}
    assert sbx.files.write("m/a.txt", "a", metadata=md).metadata == md
    assert sbx.files.get_info("m/a.txt").metadata == md
    # The octet-stream upload carries it the same way.
    assert sbx.files.write("m/o.txt", "o", metadata=md, use_octet_stream=True).metadata == md
    assert sbx.files.get_info("m/o.txt").metadata == md
    # Header names are case-insensitive: keys come back lowercased.
    assert sbx.files.write("m/u.txt", "u", metadata={"Owner": "x"}).metadata == {"owner": "x"}
    # Several files in one upload: the same map on each.
    infos = sbx.files.write_files([WriteEntry(path="m/1.txt", data="1"),
                                   WriteEntry(path="m/2.txt", data="2")],
                                  metadata={"source": "suite"})
    assert [i.metadata for i in infos] == [{"source": "suite"}] * 2
    listed = {e.name: e.metadata for e in sbx.files.list("m")}
    assert listed["a.txt"] == md and listed["2.txt"] == {"source": "suite"}, listed
    assert sbx.files.rename("m/a.txt", "m/b.txt").metadata == md
    # Written again without metadata: none is left from before.
    assert sbx.files.write("m/b.txt", "again").metadata is None
    assert sbx.files.get_info("m/b.txt").metadata is None
    assert sbx.files.write("plain.txt", "p").metadata is None
    assert sbx.files.get_info("plain.txt").metadata is None


# gVisor (runsc 20240729) keeps no user attributes for programs on its directfs mounts:
# setxattr answers EOPNOTSUPP there (a refusal the program sees, nothing dropped silently),
# so on that tier only the file API sets metadata.
SETXATTR = ("import os, sys\n"
            "try:\n"
            "    os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode())\n"
            "except OSError as e:\n"
            "    print(e.errno)\n")


def _setxattr(sbx, path: str, name: str, value: str) -> str:
    """Sets an attribute from a command in the sandbox: '' when set, else the errno."""
    sbx.files.write("/home/user/.setxattr.py", SETXATTR)
    r = sbx.commands.run(f"python3 .setxattr.py {path} {name} {value}", cwd="/home/user")
    return r.stdout.strip()


def test_attributes_a_command_sets_show_only_in_e2b_namespace(server, sbx):
    sbx.files.write("x.txt", "x")
    if server.tier == "gvisor":
        assert _setxattr(sbx, "x.txt", "user.e2b.author", "mish") == "95"  # EOPNOTSUPP
        return
    assert _setxattr(sbx, "x.txt", "user.e2b.author", "mish") == ""
    assert _setxattr(sbx, "x.txt", "user.other", "hidden") == ""
    assert sbx.files.get_info("x.txt").metadata == {"author": "mish"}
    # And the upload's own attributes are what a program in the sandbox reads.
    sbx.files.write("y.txt", "y", metadata={"k": "v"})
    out = sbx.commands.run(
        "python3 -c \"import os; print(os.getxattr('y.txt', 'user.e2b.k').decode())\"",
        cwd="/home/user").stdout
    assert out.strip() == "v"


def test_a_symlinks_metadata_is_never_its_targets(server, sbx):
    """Attack: a link in the workspace to a file or directory with metadata must show none
    of the target's: the attributes are read from the entry itself, never through a link."""
    sbx.files.write("secret.txt", "s", metadata={"secret": "target"})
    r = sbx.commands.run("ln -s secret.txt link && ln -s /home/user/secret.txt abs "
                         "&& mkdir -p d && ln -s d dlink", cwd="/home/user")
    assert r.exit_code == 0, r
    on_dir = server.tier != "gvisor"
    if on_dir:
        assert _setxattr(sbx, "d", "user.e2b.dir", "d") == ""
    from e2b import FileType
    for name in ("link", "abs", "dlink"):
        info = sbx.files.get_info(name)
        assert info.type == FileType.SYMLINK and info.metadata is None, info
    listed = {e.name: e.metadata for e in sbx.files.list("/home/user")}
    assert listed["link"] is None and listed["dlink"] is None, listed
    assert listed["secret.txt"] == {"secret": "target"}, listed
    assert listed["d"] == ({"dir": "d"} if on_dir else None), listed
    # An upload through the link is refused, so the target keeps its own metadata.
    with pytest.raises(Exception):
        sbx.files.write("link", "over", metadata={"secret": "replaced"})
    assert sbx.files.get_info("secret.txt").metadata == {"secret": "target"}


def _upload(sbx, path: str, headers: dict) -> int:
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
         "X-Access-Token": sbx._envd_access_token,
         "Content-Type": "application/octet-stream", **headers}
    req = urllib.request.Request(f"{ORIGIN}/files?path={path}", data=b"x", method="POST",
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            json.load(r)
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def test_metadata_past_its_bounds_is_refused_and_nothing_written(sbx):
    from e2b.exceptions import InvalidArgumentException
    with pytest.raises(InvalidArgumentException) as e:
        sbx.files.write("big.txt", "x", metadata={"k": "v" * (MAX_VALUE + 1)})
    assert "at most" in str(e.value), e.value
    many = {f"k{i}": "v" for i in range(MAX_KEYS + 1)}
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("big.txt", "x", metadata=many)
    assert not sbx.files.exists("big.txt")
    # Past the SDK's own checks, on the wire: a value that is not printable ASCII.
    assert _upload(sbx, "/home/user/raw.txt", {"X-Metadata-k": "tab\there"}) == 400
    assert not sbx.files.exists("raw.txt")
    # Just within the bounds is kept whole.
    assert sbx.files.write("ok.txt", "x", metadata={"k": "v" * MAX_VALUE}).metadata == \
        {"k": "v" * MAX_VALUE}
    assert sbx.files.get_info("ok.txt").metadata == {"k": "v" * MAX_VALUE}


def _until(handle, done, rounds: int = 100) -> list:
    """A sync watcher's events until `done(events)` (at most `rounds` reads, 0.1 s apart:
    the sandbox may still be taking them when a call returns)."""
    got = []
    for _ in range(rounds):
        got += handle.get_new_events()
        if done(got):
            break
        time.sleep(0.1)
    return got


def test_watch_events_carry_their_entries(sbx):
    from e2b import FileType
    sbx.files.make_dir("w")
    h = sbx.files.watch_dir("w", include_entry=True, allow_network_mounts=True)
    plain = sbx.files.watch_dir("w")
    sbx.files.write("w/f.txt", "hello", metadata={"tag": "t"})
    # Read while the file is there: the entry is what a stat finds as the event is read.
    got = _until(h, lambda g: any(e.type.value == "write" for e in g))
    assert {"create", "write"} <= {e.type.value for e in got}, got
    entries = [e.entry for e in got if e.entry is not None]
    assert entries and len(entries) == len(got), got
    entry = entries[-1]
    assert (entry.name, entry.path, entry.type, entry.size) == \
        ("f.txt", "/home/user/w/f.txt", FileType.FILE, 5), entry
    assert entry.metadata == {"tag": "t"}, entry
    sbx.commands.run("rm /home/user/w/f.txt")
    got = _until(h, lambda g: any(e.type.value == "remove" for e in g))
    removed = [e for e in got if e.type.value == "remove"]
    assert removed and all(e.entry is None for e in removed), got
    # A watcher that did not ask gets none.
    assert all(e.entry is None for e in plain.get_new_events())
    h.stop()
    plain.stop()


def test_watch_stream_events_carry_their_entries(server):
    from e2b import AsyncSandbox, FileType

    async def run():
        s = await AsyncSandbox.create(timeout=300)
        try:
            await s.files.make_dir("/home/user/s")
            seen = []
            h = await s.files.watch_dir("/home/user/s", seen.append, include_entry=True,
                                        allow_network_mounts=True)
            await s.commands.run("echo hi > /home/user/s/x.txt")
            for _ in range(100):
                if any(e.entry is not None for e in seen):
                    break
                await asyncio.sleep(0.1)
            await h.stop()
            entries = [e.entry for e in seen if e.entry is not None]
            assert entries, seen
            assert (entries[0].name, entries[0].path, entries[0].type) == \
                ("x.txt", "/home/user/s/x.txt", FileType.FILE)
        finally:
            await s.kill()

    asyncio.run(run())
