"""The asyncio client against a real `cordon serve`: the same surface as the sync one, on
one connection pool, with many calls in flight at once."""

import asyncio
import hashlib
import io
import os

import pytest
from conftest import KEYS

from cordon_sandbox import (AsyncCordon, AsyncSandbox, ExecResult, NotFound, PathRefused,
                            PolicyDenied, SandboxInfo, StreamEvent)


def run(coro):
    return asyncio.run(coro)


def test_async_sandbox_lifecycle_files_and_streams(server, tmp_path):
    async def main() -> None:
        async with AsyncCordon(server.url, KEYS["alice"]) as c:
            h = await c.health()
            assert h.status == "ok" and "wasm" in h.tiers
            r = await c.run("print(6*7)", lang="python", tier="wasm")
            assert isinstance(r, ExecResult) and r.ok and r.stdout == "42\n", r
            async with await c.sandbox(tier="wasm", labels={"a": "sync"}) as sb:
                assert isinstance(sb, AsyncSandbox) and isinstance(sb.info, SandboxInfo)
                assert [s.id for s in await c.list_sandboxes(labels={"a": "sync"})] == [sb.id]

                async def chunks():
                    for _ in range(16):
                        yield b"0123456789abcdef" * 4096  # 64 KiB
                w = await sb.write_file("/work/big.bin", chunks())
                assert w.bytes == 1 << 20
                out = io.BytesIO()
                assert await sb.files.download("/work/big.bin", out) == 1 << 20
                assert out.getvalue() == b"0123456789abcdef" * 65536
                await sb.write_file("/work/a.csv", "x\n1\n2\n")
                r = await sb.exec("print(sum(1 for _ in open('/work/a.csv')))", lang="python")
                assert r.stdout == "3\n", r
                events = [ev async for ev in sb.exec_stream(
                    "import sys; print('out'); print('err', file=sys.stderr)", lang="python")]
                assert all(isinstance(e, StreamEvent) for e in events)
                assert events[-1].type == "outcome" and events[-1].outcome.ok
                assert "".join(e.data for e in events if e.type == "stdout") == "out\n"
                assert "".join(e.data for e in events if e.type == "stderr") == "err\n"
                await sb.files.mkdir("/work/d/e", parents=True)
                await sb.files.rename("/work/a.csv", "/work/d/e/a.csv")
                names = [e.name for e in await sb.files.list("/work/d/e")]
                assert names == ["a.csv"], names
                src = tmp_path / "src"
                (src / "sub").mkdir(parents=True)
                (src / "sub" / "f.txt").write_text("f\n")
                rep = await sb.files.upload_dir(src, "/work/up")
                assert rep.files == 1 and rep.dirs >= 1, rep
                assert await sb.files.download_dir("/work/up", tmp_path / "back") == []
                assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "f\n"
                await sb.files.remove("/work/up", recursive=True)
                assert (await sb.files.stat("/work/d")).kind == "dir"
                with pytest.raises(PathRefused):
                    await sb.read_file("/proc/self/environ")
                # Another tenant sees nothing of it.
                async with AsyncCordon(server.url, KEYS["bob"]) as bob:
                    with pytest.raises(NotFound):
                        await bob.sandbox_handle(sb.id).exec("echo no")
            assert (await sb.destroy()).already
            kinds = {e.kind for e in await c.audit(sandbox=sb.id, limit=1000)}
            assert {"create", "exec", "file_put", "file_get", "destroy"} <= kinds, kinds
            with pytest.raises(PolicyDenied):
                await c.create_sandbox(tier="wasm", allow_hosts=["example.test"])
    run(main())


def test_async_calls_run_at_once_on_one_client(server):
    """Six one-shot runs and six execs in flight together, each answered with its own
    output (a token of its own), on one client's connection pool."""
    async def main() -> None:
        async with AsyncCordon(server.url, KEYS["alice"]) as c:
            tokens = [hashlib.sha256(os.urandom(8)).hexdigest()[:16] for _ in range(6)]
            runs = await asyncio.gather(*(c.run(f"print('{t}')", tier="wasm") for t in tokens))
            assert [r.stdout for r in runs] == [t + "\n" for t in tokens]
            sbs = await asyncio.gather(*(c.sandbox(tier="wasm") for _ in tokens))
            try:
                rs = await asyncio.gather(*(sb.exec(f"print('{t}')", lang="python")
                                            for sb, t in zip(sbs, tokens)))
                assert [r.stdout for r in rs] == [t + "\n" for t in tokens]
            finally:
                await asyncio.gather(*(sb.destroy() for sb in sbs))
    run(main())


def test_async_background_exec_and_code_context(server, has_container):
    if not has_container:
        pytest.skip("container tier unavailable here (see the SKIPPING line above)")

    async def main() -> None:
        async with AsyncCordon(server.url, KEYS["alice"]) as c:
            async with await c.sandbox(tier="container", ttl="5m") as sb:
                cat = await sb.exec(["cat"], background=True)
                assert cat.id.startswith("ex-") and cat.info.state == "running"
                assert (await cat.send_stdin("hello\n")).bytes == 6
                await cat.send_stdin(b"bytes\n", close=True)
                end = await cat.wait()
                assert end.ok and end.stdout == "hello\nbytes\n", end
                events = [ev async for ev in cat]
                assert events[-1].outcome is not None and events[-1].outcome.ok
                assert [e.id for e in await sb.execs()] == [cat.id]
                await sb.run_code("x = 41")
                r = await sb.run_code("x + 1")
                assert r.status == "ok" and r.text == "42", r
                seen = []
                r = await sb.run_code("print('live')\n7", on_stdout=seen.append)
                assert r.text == "7" and "".join(seen) == "live\n", (r, seen)
                ctx = await sb.create_context("python")
                assert (await ctx.run("1 + 1")).text == "2"
                assert (await ctx.restart()).restarts == 1
                assert (await ctx.close()).state == "deleted"
    run(main())


def test_async_directories_stream_without_a_spool(server, tmp_path, monkeypatch):
    """As the sync test: a tar written by a thread as it is sent, and one extracted by a
    thread as its chunks arrive (more than the hand-over queue holds), no temporary file."""
    import tempfile as tf

    def refused(*a, **k):
        raise AssertionError("an archive was spooled to a temporary file")
    monkeypatch.setattr(tf, "SpooledTemporaryFile", refused)
    monkeypatch.setattr(tf, "TemporaryFile", refused)
    src = tmp_path / "src"
    src.mkdir()
    blobs = {f"f{i}.bin": os.urandom(1 << 20) for i in range(8)}  # 8 MiB: 32+ chunks
    for name, data in blobs.items():
        (src / name).write_bytes(data)

    async def main() -> None:
        async with AsyncCordon(server.url, KEYS["alice"]) as c:
            async with await c.sandbox(tier="wasm", limits={"disk_bytes": 64 << 20}) as sb:
                rep = await sb.files.upload_dir(src, "/work/in")
                assert (rep.files, rep.bytes) == (8, 8 << 20), rep
                assert await sb.files.download_dir("/work/in", tmp_path / "out") == []
                assert (await sb.files.stat("/work/in/f0.bin")).size == 1 << 20
                with pytest.raises(NotFound):
                    await c.sandbox_handle("sb-" + "0" * 32).files.download_dir(
                        "/work", tmp_path / "none")
    run(main())
    for name, data in blobs.items():
        assert (tmp_path / "out" / name).read_bytes() == data, name
