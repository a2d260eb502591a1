"""Snapshots and forks (issue 46) against a real `cordon serve`, on the container tier
(filesystem snapshots: the workspace kept, processes start fresh).

Each attack test names the vulnerable code it was checked against (docs/snapshots.md)."""

import http.server
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import KEYS, ServerProc, tier_available

from cordon_sandbox import (Cordon, NotFound, Sandbox, SnapshotExists, SnapshotQuota,
                            Unsupported)

# The tenants' snapshot budget: a sandbox with a 64 MiB disk limit fits (each snapshot is
# held at its disk limit while it is taken), one with 256 MiB does not.
BUDGET = "200M"


class Upstream:
    """A loopback HTTP server recording the Authorization header of each request."""

    def __init__(self) -> None:
        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                seen.append(self.headers.get("Authorization", ""))
                body = b"upstream-ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def snap_server(has_container):
    if not has_container:
        pytest.skip("the container tier is unavailable here")
    d = Path(tempfile.mkdtemp(prefix="cordon-snap-"))
    extra = (f'egress = ["*", "127.0.0.1/32"]\nmax_snapshot_bytes = "{BUDGET}"\n'
             '[[grant]]\nname = "cloud"\n'
             'secret = { mint = { audience = "sts.example.test", lifetime = "5m" } }\n'
             'hosts = ["sts.example.test"]\ntenants = ["alice"]\n')
    s = ServerProc(d / "data", {}, extra=extra).start()
    yield s
    s.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def a(snap_server):
    with Cordon(snap_server.url, api_key=KEYS["alice"]) as c:
        yield c
        for snap in c.snapshots():
            c.delete_snapshot(snap.id)


@pytest.fixture
def b(snap_server):
    with Cordon(snap_server.url, api_key=KEYS["bob"]) as c:
        yield c


def sandboxes(got) -> list:
    errors = [x for x in got if not isinstance(x, Sandbox)]
    assert not errors, errors
    return got


def test_a_file_is_in_each_of_three_forks_and_a_change_stays_in_its_own(a):
    with a.create_sandbox("container", ttl="5m", limits={"disk_bytes": 64 << 20}) as src:
        src.write_file("/work/state.txt", b"before")
        src.exec("mkdir -p /work/deep/er && printf nested > /work/deep/er/f && chmod 700 /work/deep")
        # A process of the source's: a filesystem snapshot does not carry it.
        ticker = src.exec_background("sleep 301")
        snap = src.create_snapshot("base", mode="filesystem")
        assert (snap.tier, snap.mode, snap.source, snap.name) == (
            "container", "filesystem", src.id, "base")
        assert 0 < snap.bytes <= 64 << 20
        assert a.snapshot("base").id == snap.id == a.snapshot(snap.id).id
        # The source runs on, and what it changes after the snapshot is not in the forks.
        src.write_file("/work/state.txt", b"source-after")
        forks = sandboxes(a.start_from_snapshot("base", 3, ttl="3m"))
        try:
            ids = {f.id for f in forks}
            assert len(ids) == 3 and src.id not in ids
            for f in forks:
                assert f.read_file("/work/state.txt") == b"before"
                assert f.read_file("/work/deep/er/f") == b"nested"
                assert f.info.source == "snapshot"
                assert f.exec("stat -c %a /work/deep").stdout == "700\n"
                # No process of the source's runs in it.
                assert f.execs() == []
            forks[0].write_file("/work/state.txt", b"fork-0")
            forks[0].write_file("/work/only-0", b"x")
            assert [f.read_file("/work/state.txt") for f in forks] == [
                b"fork-0", b"before", b"before"]
            for f in forks[1:]:
                assert f.exec("test -e /work/only-0 && echo yes || echo no").stdout == "no\n"
            assert src.read_file("/work/state.txt") == b"source-after"
            assert [(x.id, x.status().state) for x in src.execs()] == [(ticker.id, "running")]
            # Each fork's create row names the snapshot.
            for f in forks:
                rows = a.audit(sandbox=f.id, kind="create")
                assert [r.detail.get("snapshot") for r in rows] == [snap.id], rows
            taken = a.audit(sandbox=src.id, kind="snapshot")
            assert [r.detail.get("snapshot") for r in taken] == [snap.id], taken
        finally:
            for f in forks:
                f.destroy()
            ticker.kill()
    # The snapshot outlives its source.
    assert [s.id for s in a.snapshots()] == [snap.id]
    with sandboxes(a.start_from_snapshot(snap.id))[0] as again:
        assert again.read_file("/work/state.txt") == b"before"


def test_names_are_unique_and_counts_bounded(a):
    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as src:
        src.create_snapshot("one", mode="filesystem")
        with pytest.raises(SnapshotExists):
            src.create_snapshot("one", mode="filesystem")
        for count in (0, 21):
            with pytest.raises(Exception) as e:
                a.start_from_snapshot("one", count)
            assert "1 to 20" in str(e.value)


def test_a_full_snapshot_on_container_is_refused_with_the_reason(a):
    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as src:
        with pytest.raises(Unsupported) as e:
            src.create_snapshot(mode="full")
        assert "CRIU" in e.value.message and "Landlock" in e.value.message, e.value
        assert "filesystem" in e.value.fix, e.value
        # Left out, the mode is the most the tier keeps: its files.
        assert src.create_snapshot().mode == "filesystem"
    assert len(a.snapshots()) == 1


def test_another_tenant_cannot_see_start_or_delete_a_snapshot(a, b):
    """Checked against a vulnerable version: with the tenant filter dropped from
    `Snapshots::row` (any tenant's snapshot found by id or name), bob starts and deletes
    alice's snapshot and this test fails."""
    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as src:
        src.write_file("/work/secret.txt", b"alice's")
        snap = src.create_snapshot("mine", mode="filesystem")
    assert snap.id not in [s.id for s in b.snapshots()]
    for key in (snap.id, "mine"):
        with pytest.raises(NotFound):
            b.snapshot(key)
        with pytest.raises(NotFound):
            b.start_from_snapshot(key)
        with pytest.raises(NotFound):
            b.delete_snapshot(key)
    # A name is the tenant's own: bob may use it for a snapshot of his.
    with b.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as bs:
        bsnap = bs.create_snapshot("mine", mode="filesystem")
    assert b.snapshot("mine").id == bsnap.id != snap.id
    b.delete_snapshot("mine")
    assert a.snapshot("mine").id == snap.id
    with sandboxes(a.start_from_snapshot("mine"))[0] as f:
        assert f.read_file("/work/secret.txt") == b"alice's"


def test_a_snapshot_past_the_budget_is_refused(a, snap_server):
    """Checked against a vulnerable version: with `Snapshots::room`'s budget check removed
    the 256 MiB sandbox's snapshot is taken and this test fails."""
    before = sorted(p.name for p in (snap_server.data_dir / "snapshots").iterdir())
    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 256 << 20}) as big:
        big.write_file("/work/f", b"x" * 1024)
        with pytest.raises(SnapshotQuota) as e:
            big.create_snapshot(mode="filesystem")
        assert "max_snapshot_bytes" in e.value.fix, e.value
        with pytest.raises(SnapshotQuota):
            big.fork(2)
    # Nothing of the refused snapshots is kept.
    assert a.snapshots() == []
    assert sorted(p.name for p in (snap_server.data_dir / "snapshots").iterdir()) == before
    # Within the budget it is taken.
    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 128 << 20}) as s:
        assert s.create_snapshot(mode="filesystem").bytes < 1 << 20


def test_the_sources_placeholder_is_worthless_in_a_fork(a):
    """The source's grant placeholder, kept in its workspace, reaches a fork; the fork's
    proxy watches its own placeholder (sent to a host the grant does not cover, 403) and
    does not know the source's, which leaves as the inert string it is: no token is put in
    for it. Checked against a vulnerable version: with placeholders that are not fresh per
    sandbox (cordon-egress's `new_placeholder` giving every sandbox the same one, so a
    fork's proxy swaps in for the source's), this test fails."""
    up = Upstream()
    try:
        allow = [f"127.0.0.1/32:{up.port}"]
        curl = ("curl -s --max-time 5 -o /dev/null -w '%{http_code}' "
                f"-H \"Authorization: Bearer $PH\" http://127.0.0.1:{up.port}/")
        with a.create_sandbox("container", ttl="3m", grants=["cloud"], allow_hosts=allow,
                              limits={"disk_bytes": 16 << 20}) as src:
            src.exec("printf %s \"$CLOUD_TOKEN\" > /work/source-placeholder")
            source_ph = src.read_file("/work/source-placeholder").decode()
            assert source_ph.startswith("cordon-ph-"), source_ph
            # In the source, its placeholder headed for a host the grant does not cover
            # is refused.
            assert src.exec(curl, env={"PH": source_ph}).stdout == "403"
            snap = src.create_snapshot(mode="filesystem")
        with sandboxes(a.start_from_snapshot(snap.id))[0] as fork:
            own = fork.exec("printf %s \"$CLOUD_TOKEN\"").stdout
            assert own.startswith("cordon-ph-") and own != source_ph
            assert fork.read_file("/work/source-placeholder").decode() == source_ph
            assert fork.exec(curl, env={"PH": own}).stdout == "403"
            assert up.seen == []
            assert fork.exec(curl.replace("$PH", "$(cat /work/source-placeholder)")).stdout \
                == "200"
            # What left is the inert placeholder, not a minted token.
            assert up.seen == [f"Bearer {source_ph}"]
    finally:
        up.close()


class TlsUpstream(Upstream):
    """The same upstream over HTTPS for `localhost`, its certificate signed by a test CA
    made here with openssl (a minted grant's token is only ever put into HTTPS)."""

    def __init__(self, d: Path) -> None:
        import ssl
        import subprocess

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)
        self.ca = d / "ca.pem"
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-days", "1", "-subj", "/CN=cordon test CA",
                "-keyout", str(d / "ca.key"), "-out", str(self.ca))
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", "/CN=localhost", "-keyout", str(d / "up.key"), "-out", str(d / "up.csr"))
        (d / "ext").write_text("subjectAltName=DNS:localhost\n")
        openssl("x509", "-req", "-in", str(d / "up.csr"), "-CA", str(self.ca),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                "-extfile", str(d / "ext"), "-out", str(d / "up.pem"))
        super().__init__()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(d / "up.pem", d / "up.key")
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)


def jwt_claims(header: str) -> dict:
    import base64
    import json
    payload = header.removeprefix("Bearer ").split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_a_forks_minted_token_is_its_own_and_the_sources_is_refused_in_it(
        has_container, monkeypatch):
    """A minted grant for a loopback HTTPS upstream: the token the source's proxy puts in
    names the source, a fork's names the fork (a token minted for it, never the source's),
    and the source's placeholder sent from the fork gets no token at all; once the source
    is gone its token is refused (introspection: inactive) while the fork's is active.
    What it guards against: a fork given the source's resolved grants or proxy, whose
    token would be the source's (naming the source, alive while the source lives)."""
    import json
    import urllib.request
    if not has_container:
        pytest.skip("the container tier is unavailable here")
    d = Path(tempfile.mkdtemp(prefix="cordon-snap-mint-"))
    up = TlsUpstream(d)
    # The server's proxies trust the test CA for upstream TLS (the host's roots are read
    # from SSL_CERT_FILE when it is set).
    monkeypatch.setenv("SSL_CERT_FILE", str(up.ca))
    extra = (f'egress = ["*", "127.0.0.1/32"]\n[[grant]]\nname = "loop"\n'
             'secret = { mint = { audience = "upstream.test", lifetime = "5m" } }\n'
             'hosts = ["localhost"]\ntenants = ["alice"]\n')
    s = ServerProc(d / "data", {}, extra=extra).start()
    try:
        c = Cordon(s.url, api_key=KEYS["alice"])
        allow = [f"localhost:{up.port}", f"127.0.0.1/32:{up.port}"]
        curl = ("curl -s --max-time 5 -o /dev/null -w '%{http_code}' "
                f"-H \"Authorization: Bearer $PH\" https://localhost:{up.port}/")

        def active(header: str) -> bool:
            req = urllib.request.Request(
                f"{s.url}/v1/tokens/introspect",
                data=f"token={header.removeprefix('Bearer ')}".encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"})
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)["active"]
        src = c.create_sandbox("container", ttl="3m", grants=["loop"], allow_hosts=allow,
                               limits={"disk_bytes": 16 << 20})
        src_ph = src.exec("printf %s \"$LOOP_TOKEN\"").stdout
        assert src.exec(curl, env={"PH": src_ph}).stdout == "200"
        src_token = up.seen[-1]
        assert jwt_claims(src_token)["sub"] == src.id
        src.write_file("/work/ph", src_ph.encode())
        snap = src.create_snapshot(mode="filesystem")
        with sandboxes(c.start_from_snapshot(snap.id))[0] as fork:
            own = fork.exec("printf %s \"$LOOP_TOKEN\"").stdout
            assert own.startswith("cordon-ph-") and own != src_ph
            assert fork.exec(curl, env={"PH": own}).stdout == "200"
            fork_token = up.seen[-1]
            assert fork_token != src_token
            assert jwt_claims(fork_token)["sub"] == fork.id
            # The source's placeholder, kept in the fork's files, leaves it inert.
            assert fork.exec(curl.replace("$PH", "$(cat /work/ph)")).stdout == "200"
            assert up.seen[-1] == f"Bearer {src_ph}"
            assert active(src_token) and active(fork_token)
            src.destroy()
            assert not active(src_token)
            assert active(fork_token)
        c.delete_snapshot(snap.id)
        c.close()
    finally:
        s.stop()
        up.close()
        shutil.rmtree(d, ignore_errors=True)


def test_snapshots_outlive_a_restart_and_a_cut_short_one_is_removed(has_container):
    if not has_container:
        pytest.skip("the container tier is unavailable here")
    d = Path(tempfile.mkdtemp(prefix="cordon-snap-restart-"))
    s = ServerProc(d / "data", {}).start()
    try:
        with Cordon(s.url, api_key=KEYS["alice"]) as c:
            with c.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as sb:
                sb.write_file("/work/kept", b"across a restart")
                snap = sb.create_snapshot("kept", mode="filesystem")
        # What a server killed while taking a snapshot leaves: an image without a row.
        stray = s.data_dir / "snapshots" / ("snap-" + "0" * 32)
        stray.mkdir(mode=0o700)
        (stray / "work.tar").write_bytes(b"partial")
        s.kill9()
        s.start()
        assert not stray.exists()
        with Cordon(s.url, api_key=KEYS["alice"]) as c:
            assert [x.id for x in c.snapshots()] == [snap.id]
            with sandboxes(c.start_from_snapshot("kept"))[0] as f:
                assert f.read_file("/work/kept") == b"across a restart"
            c.delete_snapshot("kept")
            assert not (s.data_dir / "snapshots" / snap.id).exists()
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_a_server_killed_mid_snapshot_leaves_nothing_and_restarts_clean(has_container):
    """A server killed (SIGKILL) while it writes a snapshot (its image directory made, its
    row not yet): after a restart no snapshot is listed, nothing is left under the data
    dir's snapshots, and the tenant's budget is whole (a snapshot held at most of the budget
    is taken at once)."""
    import time
    if not has_container:
        pytest.skip("the container tier is unavailable here")
    d = Path(tempfile.mkdtemp(prefix="cordon-snap-cut-"))
    s = ServerProc(d / "data", {}, extra='max_snapshot_bytes = "200M"\n').start()
    snaps = s.data_dir / "snapshots"
    try:
        for _ in range(3):  # bounded: a snapshot that ends before the kill is tried again
            got: dict = {}
            with Cordon(s.url, api_key=KEYS["alice"]) as c:
                sb = c.create_sandbox("container", ttl="5m", limits={"disk_bytes": 160 << 20})
                # 128 MiB of files: seconds of writing through the agent's archive channel.
                sb.exec("head -c 134217728 /dev/urandom > /work/blob")

                def take() -> None:
                    try:
                        got["snapshot"] = sb.create_snapshot("cut", mode="filesystem")
                    except Exception as e:  # the server dies under it
                        got["error"] = e

                taker = threading.Thread(target=take, daemon=True)
                taker.start()
                for _ in range(1500):
                    if snaps.is_dir() and any(snaps.iterdir()) or not taker.is_alive():
                        break
                    time.sleep(0.02)
                s.kill9()
                taker.join(30)
            s.start()
            with Cordon(s.url, api_key=KEYS["alice"]) as c:
                for x in c.snapshots():
                    c.delete_snapshot(x.id)
            if "snapshot" not in got:
                break
        else:
            pytest.fail("every snapshot ended before the server was killed")
        with Cordon(s.url, api_key=KEYS["alice"]) as c:
            assert c.snapshots() == []
            assert not snaps.exists() or list(snaps.iterdir()) == [], list(snaps.iterdir())
            with c.create_sandbox("container", ttl="2m", limits={"disk_bytes": 160 << 20}) as sb:
                sb.write_file("/work/after", b"after the restart")
                snap = sb.create_snapshot("after", mode="filesystem")
            with sandboxes(c.start_from_snapshot("after"))[0] as f:
                assert f.read_file("/work/after") == b"after the restart"
            c.delete_snapshot(snap.id)
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("tier", ["gvisor", "microvm"])
def test_a_full_snapshot_carries_a_variable_a_process_and_a_file(a, tier):
    """A full snapshot through the server (gVisor's runsc checkpoint, the microVM's QEMU
    state): a code context's variable, a running background process (its exec listed under
    its id) and a file are in each of 3 forks; a change in one is in no other nor in the
    source."""
    if not tier_available(tier):
        pytest.skip(f"the {tier} tier is unavailable here")
    with a.create_sandbox(tier, ttl="3m",
                          limits={"disk_bytes": 32 << 20, "memory_bytes": 160 << 20}) as src:
        assert src.run_code("x = 41").status == "ok"
        ticker = src.exec_background(
            # Written then renamed: `>` truncates first, and a snapshot (or a `cat`) taken
            # between the truncation and the write would see an empty file.
            "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new;"
            " mv /tmp/count.new /tmp/count; sleep 0.2; done")
        src.write_file("/work/f", b"before")
        src.exec("until [ -s /tmp/count ]; do sleep 0.1; done")
        snap = src.create_snapshot()
        assert (snap.tier, snap.mode) == (tier, "full")
        forks = sandboxes(a.start_from_snapshot(snap.id, 3, ttl="2m"))
        try:
            for f in forks:
                assert f.run_code("x + 1").text == "42"
                assert f.read_file("/work/f") == b"before"
                assert [(e.id, e.status().state) for e in f.execs()] == [(ticker.id, "running")]
                before = int(f.exec("cat /tmp/count").stdout)
                assert before >= 1
                # The ticker runs on in the fork: its count goes past what the fork began with.
                moved = f.exec(f"until [ $(cat /tmp/count) -gt {before} ]; do sleep 0.1; done",
                               timeout=30)
                assert (moved.termination, moved.exit_code) == ("exited", 0), moved
            assert forks[0].run_code("x = 100").status == "ok"
            forks[0].write_file("/work/f", b"fork-0")
            for f in forks[1:]:
                assert f.run_code("x").text == "41"
                assert f.read_file("/work/f") == b"before"
            assert src.run_code("x").text == "41"
            assert src.read_file("/work/f") == b"before"
        finally:
            for f in forks:
                f.destroy()


def test_a_wasm_snapshot_carries_the_workspace_to_each_fork(a):
    """The wasm tier through the server: its lasting state is its files, so the default
    (`full`) snapshot carries what its Python wrote, and each of 3 forks has its own copy."""
    if not tier_available("wasm"):
        pytest.skip("the wasm tier is unavailable here")
    save = ("import json\nopen('/work/state.json', 'w').write(json.dumps({'x': 41}))\n"
            "print('saved')")
    read = "import json\nprint(json.load(open('/work/state.json'))['x'] + 1)"
    with a.create_sandbox("wasm", ttl="2m", limits={"disk_bytes": 16 << 20}) as src:
        assert src.exec(save, "python").stdout == "saved\n"
        snap = src.create_snapshot("wasm-base")
        assert (snap.tier, snap.mode, snap.source) == ("wasm", "full", src.id)
        src.exec("open('/work/state.json', 'w').write('{\"x\": 0}')", "python")
        forks = sandboxes(a.start_from_snapshot(snap.id, 3, ttl="1m"))
        try:
            assert len({f.id for f in forks} | {src.id}) == 4
            assert [f.exec(read, "python").stdout for f in forks] == ["42\n"] * 3
            forks[0].write_file("/work/state.json", b'{"x": 99}')
            assert [f.exec(read, "python").stdout for f in forks] == ["100\n", "42\n", "42\n"]
            assert src.exec(read, "python").stdout == "1\n"
        finally:
            for f in forks:
                f.destroy()


def test_the_cli_takes_lists_starts_and_deletes(a, snap_server):
    """`cordon snapshot` against the server with a tenant's key."""
    import json
    import subprocess
    from conftest import cordon_bin

    def cli(*args: str) -> str:
        r = subprocess.run([cordon_bin(), "snapshot", *args, "--url", snap_server.url],
                           env={"CORDON_API_KEY": KEYS["alice"], "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    with a.create_sandbox("container", ttl="2m", limits={"disk_bytes": 16 << 20}) as src:
        src.write_file("/work/c", b"cli")
        taken = json.loads(cli("create", src.id, "--name", "by-cli", "--mode", "filesystem",
                               "--json"))
        assert taken["name"] == "by-cli" and taken["source"] == src.id, taken
        assert "by-cli" in cli("ls")
        ids = cli("start", "by-cli", "--count", "2", "--ttl", "1m").split()
        assert len(ids) == 2 and all(i.startswith("sb-") for i in ids), ids
        for i in ids:
            assert a.get_sandbox(i).read_file("/work/c") == b"cli"
            a.get_sandbox(i).destroy()
        forked = cli("fork", src.id, "--count", "1").split()
        assert len(forked) == 1
        a.get_sandbox(forked[0]).destroy()
        assert cli("rm", "by-cli").startswith("deleted snapshot snap-")
        assert a.snapshots() == []


def test_snapshot_tools_over_mcp(a, snap_server):
    """The MCP tools take, list, start from, fork and delete, each for its own tenant."""
    from test_mcp_procs import Mcp
    from test_volumes import _tool
    alice, bob = Mcp(snap_server.url, KEYS["alice"]), Mcp(snap_server.url, KEYS["bob"])
    ok, sb = alice.tool("create_sandbox", tier="container", ttl="2m",
                        limits={"disk_bytes": 16 << 20})
    assert ok, sb
    try:
        ok, _ = alice.tool("write_file", sandbox=sb["id"], path="/work/m", content="mcp")
        assert ok
        ok, snap = _tool(alice, "create_snapshot", sandbox=sb["id"], name="via-mcp")
        assert ok and snap["mode"] == "filesystem", snap
        ok, listed = bob.tool("list_snapshots")
        assert ok and listed["snapshots"] == [], listed
        ok, err = bob.tool("start_from_snapshot", **{"from": "via-mcp"})
        assert not ok and "no snapshot" in str(err), err
        for tool, key in (("start_from_snapshot", "via-mcp"), ("fork_sandbox", sb["id"])):
            ok, got = alice.tool(tool, count=2, ttl="1m", **{"from": key})
            assert ok and len(got["sandboxes"]) == 2 and not got.get("errors"), got
            for s in got["sandboxes"]:
                ok, out = alice.tool("exec", sandbox=s["id"], lang="bash", code="cat /work/m")
                assert ok and out["stdout"] == "mcp", out
                alice.tool("destroy", sandbox=s["id"])
        ok, err = bob.tool("delete_snapshot", snapshot=snap["id"])
        assert not ok, err
        ok, gone = alice.tool("delete_snapshot", snapshot="via-mcp")
        assert ok and gone["id"] == snap["id"], gone
    finally:
        alice.tool("destroy", sandbox=sb["id"])


def test_figures_snapshot_and_fork(a, capsys):
    """Snapshot time and size (an idle sandbox, and one holding 64 MiB of files: the budget
    here bounds it), the time to the first exec in a sandbox started from it for N = 1 and
    N = 10, beside pause/resume on the same tier, printed (`pytest -s -k figures
    sdk/python/tests/test_snapshots.py`): figures, not assertions."""
    import statistics
    import time
    rows = []

    def ms(t0: float) -> float:
        return (time.perf_counter() - t0) * 1000

    for label, fill in (("idle", 0), ("64 MiB of files", 64)):
        with a.create_sandbox("container", ttl="5m", limits={"disk_bytes": 96 << 20}) as src:
            if fill:
                src.exec(f"head -c {fill << 20} /dev/urandom > /work/blob")
            takes = []
            for _ in range(3):
                t0 = time.perf_counter()
                snap = src.create_snapshot(mode="filesystem")
                takes.append(ms(t0))
                if len(takes) < 3:
                    a.delete_snapshot(snap.id)
            for n in (1, 10):
                t0 = time.perf_counter()
                got = sandboxes(a.start_from_snapshot(snap.id, n, ttl="2m"))
                got[0].exec("true")
                first = ms(t0)
                for f in got:
                    f.destroy()
                rows.append((f"{label}: {n} from it, to the first exec", first))
            a.delete_snapshot(snap.id)
            t0 = time.perf_counter()
            src.pause()
            pause = ms(t0)
            t0 = time.perf_counter()
            src.resume()
            rows.append((f"{label}: pause / resume", f"{pause:.1f} / {ms(t0):.1f}"))
            rows.append((f"{label}: snapshot (median of 3), {snap.bytes >> 10} KiB",
                         statistics.median(takes)))
    with capsys.disabled():
        print("\ncontainer tier, filesystem snapshots (ms):")
        for name, v in rows:
            print(f"  {name:<48} {v if isinstance(v, str) else f'{v:.1f}'}")


def test_the_async_client_takes_forks_starts_and_deletes(snap_server):
    """AsyncCordon's snapshot methods, the same surface as the sync client's."""
    import asyncio
    from cordon_sandbox import AsyncCordon, AsyncSandbox

    async def main() -> None:
        async with AsyncCordon(snap_server.url, KEYS["alice"]) as c:
            async with await c.sandbox(tier="container", ttl="2m",
                                       limits={"disk_bytes": 16 << 20}) as src:
                await src.write_file("/work/a", b"async")
                snap = await src.create_snapshot("by-async", mode="filesystem")
                assert (await c.snapshot("by-async")).id == snap.id
                forks = await src.fork(2, ttl="1m")
                started = await c.start_from_snapshot(snap.id, 1, ttl="1m")
                for f in forks + started:
                    assert isinstance(f, AsyncSandbox), f
                    assert await f.read_file("/work/a") == b"async"
                    await f.destroy()
                assert [s.id for s in await c.snapshots()] == [snap.id]
                await c.delete_snapshot(snap.id)
                assert await c.snapshots() == []

    asyncio.run(main())
