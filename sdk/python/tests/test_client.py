"""The client's own behaviour against a real `cordon serve`: the environment, kept-alive
connections, streamed uploads and downloads, the one retry after a 429, typed answers, and
the README's example as a user runs it after `pip install ./sdk/python`."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from conftest import KEYS, ServerProc

from cordon_sandbox import (Cordon, CordonError, Destroyed, ExecResult, Health, NotFound,
                            SandboxInfo, TooManySandboxes, Unauthorized)

SDK = Path(__file__).resolve().parents[1]


def test_url_and_key_come_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("CORDON_URL", server.url)
    monkeypatch.setenv("CORDON_API_KEY", KEYS["alice"])
    with Cordon() as c:
        assert c.url == server.url
        h = c.health()
        assert isinstance(h, Health) and h.status == "ok" and h.version, h
        # The pools are the operator's figures (issue 44): a tenant's health has none.
        assert "wasm" in h.tiers and h.pools == {}, h
        assert c.list_sandboxes() == []
    monkeypatch.setenv("CORDON_API_KEY", "ck_wrong_key_0123456789abcdef0123456789")
    with pytest.raises(Unauthorized) as e:
        Cordon().list_sandboxes()
    assert e.value.status == 401 and e.value.fix
    monkeypatch.delenv("CORDON_API_KEY")
    with pytest.raises(ValueError, match="CORDON_API_KEY"):
        Cordon()


def test_calls_reuse_one_kept_alive_connection(server):
    ports = []

    def seen(resp: httpx.Response) -> None:
        stream = resp.extensions["network_stream"]
        ports.append(stream.get_extra_info("client_addr")[1])

    with Cordon(server.url, KEYS["alice"],
                http=httpx.Client(event_hooks={"response": [seen]})) as c:
        with c.sandbox(tier="wasm") as sb:
            for i in range(10):
                assert sb.exec(f"print({i})", lang="python").stdout == f"{i}\n"
            events = list(sb.exec_stream("print('s')", lang="python"))
            assert events[-1].outcome is not None and events[-1].outcome.ok
        c.list_sandboxes()
    # Create, ten execs, a stream, a destroy and a list: every one on the same connection.
    assert len(ports) == 14 and len(set(ports)) == 1, ports


def test_uploads_and_downloads_stream(alice, tmp_path):
    blob = os.urandom(1 << 20) * 3  # 3 MiB
    pulled = []

    def chunks():
        for i in range(0, len(blob), 64 << 10):
            pulled.append(i)
            yield blob[i:i + (64 << 10)]

    with alice.sandbox(tier="wasm", limits={"disk_bytes": 64 << 20}) as sb:
        # A generator is sent as it is read (chunked), never joined first by the client.
        w = sb.write_file("/work/blob.bin", chunks())
        assert w.path == "/work/blob.bin" and w.bytes == len(blob), w
        assert len(pulled) == 48
        local = tmp_path / "blob.bin"
        assert sb.files.download("/work/blob.bin", local) == len(blob)
        assert hashlib.sha256(local.read_bytes()).digest() == hashlib.sha256(blob).digest()
        # A local file goes up from disk and comes back the same.
        src = tmp_path / "up.bin"
        src.write_bytes(blob[:100_000])
        assert sb.files.upload(src, "/work/up.bin", mode=0o600).bytes == 100_000
        st = sb.files.stat("/work/up.bin")
        assert (st.kind, st.size, st.mode, st.path) == ("file", 100_000, 0o600, "/work/up.bin")
        assert sb.read_file("/work/up.bin") == blob[:100_000]


def test_directories_stream_without_a_spool(alice, tmp_path, monkeypatch):
    """A directory goes up as a thread writes its tar and comes down extracted as it
    arrives: no temporary file is made on the way (earlier versions spooled each archive)."""
    import tempfile as tf

    def refused(*a, **k):
        raise AssertionError("an archive was spooled to a temporary file")
    monkeypatch.setattr(tf, "SpooledTemporaryFile", refused)
    monkeypatch.setattr(tf, "TemporaryFile", refused)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    blobs = {f"d/f{i}.bin": os.urandom(1 << 20) for i in range(12)}  # 12 MiB
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    (src / "small.txt").write_text("s\n")
    with alice.sandbox(tier="wasm", limits={"disk_bytes": 128 << 20}) as sb:
        rep = sb.files.upload_dir(src, "/work/in")
        assert (rep.files, rep.bytes) == (13, 12 * (1 << 20) + 2), rep
        assert sb.files.download_dir("/work/in", tmp_path / "out") == []
        for name, data in blobs.items():
            assert (tmp_path / "out" / name).read_bytes() == data, name
        assert (tmp_path / "out" / "small.txt").read_text() == "s\n"
        # The download was read to its end: the next call finds the sandbox free at once.
        assert sb.files.stat("/work/in/small.txt").size == 2
        # A local directory that cannot be read fails the upload with the local error.
        with pytest.raises(FileNotFoundError):
            sb.files.upload_dir(tmp_path / "missing", "/work/none")


def test_answers_are_typed_models(alice):
    with alice.sandbox(tier="wasm", labels={"t": "typed"}, limits={"memory_bytes": 256 << 20}) as sb:
        assert isinstance(sb.info, SandboxInfo) and sb.info.state == "live"
        assert sb.info.limits.memory_bytes == 256 << 20 and sb.info.labels == {"t": "typed"}
        r = sb.exec("print('x')", lang="python")
        assert isinstance(r, ExecResult) and r.ok and r.usage.wall_time_us > 0
        assert r.timings.run_us > 0 and r.tier == "wasm"
        listing = sb.files.listing("/work")
        assert listing.path == "/work" and not listing.truncated
        done = sb.files.mkdir("/work/d/e", parents=True)
        assert (done.op, done.path) == ("mkdir", "/work/d/e")
        moved = sb.files.rename("/work/d/e", "/work/f")
        assert (moved.op, moved.to) == ("rename", "/work/f"), moved
        assert sb.refresh().id == sb.id
        assert alice.get_sandbox(sb.id).info.labels == {"t": "typed"}
    gone = sb.destroy()
    assert isinstance(gone, Destroyed) and gone.already
    with pytest.raises(NotFound):
        alice.get_sandbox(sb.id)


def test_metrics_and_the_minted_tokens_documents(server, alice):
    # The server-wide figures are the operator's (issue 44): a tenant's key is refused.
    with pytest.raises(CordonError) as e:
        alice.metrics()
    assert e.value.status == 403, e.value
    ops = Cordon(server.url, api_key=KEYS["ops"])
    m = ops.metrics()
    assert "cordon_pool_ready" in m and m.rstrip().endswith("# EOF"), m[-500:]
    h = ops.health()
    assert h.pools["wasm"].size == 1, h
    conf = alice.openid_configuration()
    assert conf.jwks_uri.endswith("/.well-known/jwks.json") and conf.issuer, conf
    assert "ES256" in conf.id_token_signing_alg_values_supported, conf
    keys = alice.jwks().keys
    assert keys and all(k["kty"] == "EC" and k["kid"] for k in keys), keys
    # A token this server did not mint is not active (and says nothing else).
    bogus = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    info = alice.introspect_token(bogus)
    assert info.active is False and info.claims == {}, info


def test_a_429_with_retry_after_is_sent_once_more():
    """One sandbox per tenant: a second create is refused with 429 and Retry-After (1 s).
    The client waits that long and sends it once more; a place freed meanwhile takes it."""
    d = Path(tempfile.mkdtemp(prefix="cordon-sdk-retry-"))
    s = ServerProc(d / "data", {}, extra="max_sandboxes = 1\n").start()
    try:
        creates = []
        held = []

        def on_response(resp: httpx.Response) -> None:
            if resp.request.method == "POST" and resp.request.url.path == "/v1/sandboxes":
                creates.append(resp.status_code)
                if resp.status_code == 429 and held:
                    held.pop().destroy()  # frees the place before the retry

        c = Cordon(s.url, KEYS["alice"], http=httpx.Client(event_hooks={"response": [on_response]}))
        other = Cordon(s.url, KEYS["alice"])
        held.append(other.sandbox_handle(c.create_sandbox(tier="wasm").id))
        second = c.create_sandbox(tier="wasm")
        assert creates == [201, 429, 201], creates
        # With the place still held: one retry, then the error, never a third request.
        creates.clear()
        with pytest.raises(TooManySandboxes) as e:
            c.create_sandbox(tier="wasm")
        assert creates == [429, 429] and e.value.retry_after == 1.0, (creates, e.value)
        # retries=0: the 429 is raised at once.
        creates.clear()
        no_retry = Cordon(s.url, KEYS["alice"], retries=0,
                          http=httpx.Client(event_hooks={"response": [on_response]}))
        with pytest.raises(TooManySandboxes):
            no_retry.create_sandbox(tier="wasm")
        assert creates == [429], creates
        second.destroy()
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def readme_example(readme: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_example_runs_after_pip_install(server, has_container, tmp_path):
    """`pip install ./sdk/python` into a fresh environment, then the README's example as
    written, against this server (CORDON_URL and CORDON_API_KEY as the README says)."""
    if not has_container:
        pytest.skip("the README's example uses the container tier (see the SKIPPING line)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    # A copy, so setuptools' build/ and egg-info land there, not in the tree;
    # --no-build-isolation: the host's setuptools builds it, so the test needs no download.
    src = tmp_path / "python"
    shutil.copytree(SDK, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build",
                                                             "*.egg-info"))
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-build-isolation", str(src)], check=True, cwd=tmp_path)
    where = subprocess.run([py, "-c", "import cordon_sandbox; print(cordon_sandbox.__file__)"],
                           check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where
    example = tmp_path / "example.py"
    example.write_text(readme_example(SDK / "README.md"))
    env = dict(os.environ, CORDON_URL=server.url, CORDON_API_KEY=KEYS["alice"])
    out = subprocess.run([py, str(example)], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "42", lines
    assert "exited 0 3" in lines, lines
    assert "stdout one" in lines and "stderr two" in lines and "outcome exited" in lines, lines
    assert any(line.startswith("[('a.csv', 'file', 6)") for line in lines), lines
    assert "['ex-1'] ex-1" in lines and "42" in lines[1:], lines
    assert "not_found True" in lines, lines
    assert "['0', '2', '4']" in lines, lines
    assert lines[-1] == "outcome exited" and "stdout 1" in lines, lines


def test_the_package_and_its_readme_example_type_check(tmp_path):
    """Typed answers: mypy --strict over the package and over the README's example, which
    uses the models' fields (a misspelt field or a wrong type fails here)."""
    example = tmp_path / "readme_example.py"
    example.write_text(readme_example(SDK / "README.md"))
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                          "--cache-dir", str(tmp_path / "cache"), str(SDK / "cordon_sandbox"),
                          str(example)],
                         capture_output=True, text=True, cwd=SDK, env=dict(os.environ, MYPYPATH=str(SDK)),
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("from cordon_sandbox import Cordon\n"
                   "def f(c: Cordon) -> int:\n"
                   "    return c.run('1').exit_status\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                          str(tmp_path / "cache"), str(bad)], capture_output=True, text=True,
                         cwd=SDK, env=dict(os.environ, MYPYPATH=str(SDK)), timeout=300)
    assert out.returncode == 1 and "exit_status" in out.stdout, out.stdout


def test_figures_exec_round_trip_sync_and_async(server):
    """Prints (never asserts) the SDK's exec round trip on one kept-alive connection, and
    eight sandboxes' execs in flight at once from one async client. Run with
    `pytest -s -k figures tests/test_client.py`."""
    import asyncio
    import statistics
    import time

    from cordon_sandbox import AsyncCordon

    n = 50
    with Cordon(server.url, KEYS["alice"]) as c, c.sandbox(tier="wasm") as sb:
        walls = []
        for _ in range(n + 5):
            t0 = time.perf_counter()
            assert sb.exec("pass", lang="python").ok
            walls.append((time.perf_counter() - t0) * 1e3)
        walls = sorted(walls[5:])

    async def together() -> float:
        async with AsyncCordon(server.url, KEYS["alice"]) as ac:
            sbs = await asyncio.gather(*(ac.sandbox(tier="wasm") for _ in range(8)))
            try:
                t0 = time.perf_counter()
                for _ in range(5):
                    await asyncio.gather(*(s.exec("pass", lang="python") for s in sbs))
                return (time.perf_counter() - t0) * 1e3 / 40
            finally:
                await asyncio.gather(*(s.destroy() for s in sbs))

    per_exec = asyncio.run(together())
    print(f"\n[figures] wasm exec of Python `pass` through the sync SDK, {n} in a row: median "
          f"{statistics.median(walls):.2f} ms, p90 {walls[int(n * 0.9)]:.2f} ms; async, 8 "
          f"sandboxes at once, 40 execs: {per_exec:.2f} ms of wall time per exec")
