"""The asyncio client: `AsyncCordon`, `AsyncSandbox`, `AsyncFiles`, `AsyncContext` and
`AsyncBackgroundExec`, the same surface as `cordon_sandbox.client` with `async` methods
(streams are `async for`), on the same transport (httpx, kept-alive connections, one retry
on a 429 with `Retry-After`).

    async with AsyncCordon() as c:
        async with await c.sandbox(tier="container") as sb:
            r = await sb.exec("echo hi")
            async for ev in sb.exec_stream("seq 3"):
                print(ev.type, ev.data)
"""

from __future__ import annotations

import asyncio
from typing import (IO, Any, AsyncIterator, Callable, Dict, List, Literal, Mapping, Optional,
                    Sequence, Tuple, Union, overload)

import httpx

from . import _ops as ops
from ._ops import Command, Duration, LimitsArg, VolumeArg
from . import _tar
from . import errors
from ._transport import CHUNK, AsyncTransport, Data, settings
from .client import PathLike
from .errors import CordonError, NotFound
from .models import (ArchiveReport, AuditEvent, ContextInfo, Destroyed, ExecInfo, ExecResult,
                     Execution, FileDone, FileEntry, FileWritten, Health, Jwks, Listing,
                     MetricSample, OidcConfiguration, SandboxInfo,
                     SandboxList, Snapshot, SnapshotStarts, StdinWritten, StreamEvent, TokenInfo,
                     Volume, VolumeDeleted, VolumeList)


class AsyncCordon:
    """A Cordon server, for asyncio code; see `Cordon` for the arguments."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 120.0, retries: int = 1,
                 http: Optional[httpx.AsyncClient] = None) -> None:
        self.url, key = settings(url, api_key)
        self.timeout = timeout
        self._t = AsyncTransport(self.url, key, timeout, retries, http)

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> "AsyncCordon":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        return await self._t.json(ops.raw(method, path, body))

    async def health(self) -> Health:
        return await self._t.json(ops.health())

    async def metrics(self) -> str:
        return (await self._t.read(ops.metrics())).decode()

    async def run(self, code: Command, lang: Optional[str] = "python", *,
                  tier: Optional[str] = None, timeout: Optional[Duration] = None,
                  stdin: Optional[Union[str, bytes]] = None,
                  files: Optional[Mapping[str, Union[bytes, str]]] = None,
                  limits: LimitsArg = None, env: Optional[Mapping[str, str]] = None,
                  allow_hosts: Sequence[str] = (), deny_hosts: Sequence[str] = (),
                  grants: Sequence[str] = (), trust: Optional[str] = None,
                  autonomy: Optional[str] = None, shape: Optional[str] = None,
                  template: Optional[str] = None,
                  allow_weaker: Sequence[str] = ()) -> ExecResult:
        """Runs code once in a fresh sandbox that is destroyed afterwards (see `Cordon.run`)."""
        return await self._t.json(ops.run(
            code, lang, tier=tier, timeout=timeout, stdin=stdin, files=files, limits=limits,
            env=env, allow_hosts=allow_hosts, deny_hosts=deny_hosts, grants=grants,
            trust=trust, autonomy=autonomy, shape=shape, template=template,
            allow_weaker=allow_weaker))

    def run_stream(self, code: Command, lang: Optional[str] = "python", *,
                   tier: Optional[str] = None, timeout: Optional[Duration] = None,
                   stdin: Optional[Union[str, bytes]] = None,
                   files: Optional[Mapping[str, Union[bytes, str]]] = None,
                   limits: LimitsArg = None, env: Optional[Mapping[str, str]] = None,
                   template: Optional[str] = None) -> AsyncIterator[StreamEvent]:
        """Like `run`, yielding stdout/stderr events as they come, then the outcome."""
        return self._t.events(ops.run(
            code, lang, tier=tier, timeout=timeout, stdin=stdin, files=files, limits=limits,
            env=env, allow_hosts=(), deny_hosts=(), grants=(), trust=None, autonomy=None,
            shape=None, template=template, allow_weaker=(), stream=True))

    async def create_sandbox(self, tier: Optional[str] = None, *,
                             allow_hosts: Sequence[str] = (), deny_hosts: Sequence[str] = (),
                             ttl: Optional[Duration] = None,
                             idle_timeout: Optional[Duration] = None, limits: LimitsArg = None,
                             env: Optional[Mapping[str, str]] = None,
                             trust: Optional[str] = None, autonomy: Optional[str] = None,
                             shape: Optional[str] = None, grants: Sequence[str] = (),
                             template: Optional[str] = None,
                             labels: Optional[Mapping[str, str]] = None,
                             volumes: Sequence[VolumeArg] = (),
                             allow_weaker: Sequence[str] = (),
                             on_timeout: Optional[str] = None) -> "AsyncSandbox":
        """Creates a sandbox (see `Cordon.create_sandbox`); `async with await
        c.sandbox(...) as sb:` destroys it at the end."""
        body = ops.spec(tier=tier, allow_hosts=allow_hosts, deny_hosts=deny_hosts, ttl=ttl,
                        idle_timeout=idle_timeout, limits=limits, env=env, trust=trust,
                        autonomy=autonomy, shape=shape, grants=grants, template=template,
                        labels=labels, volumes=volumes, allow_weaker=allow_weaker,
                        on_timeout=on_timeout)
        return AsyncSandbox(self, await self._t.json(ops.create_sandbox(body)))

    sandbox = create_sandbox
    create = create_sandbox

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, await self._t.json(ops.info(sandbox_id)))

    def sandbox_handle(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, SandboxInfo(id=sandbox_id, tier="", state=""))

    async def list_sandboxes(self,
                             labels: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        return (await self._t.json(ops.list_sandboxes(labels))).sandboxes

    async def sandboxes(self, labels: Optional[Mapping[str, str]] = None) -> SandboxList:
        return await self._t.json(ops.list_sandboxes(labels))

    async def snapshots(self) -> List[Snapshot]:
        """Your snapshots, oldest first."""
        return await self._t.json(ops.snapshots())

    async def snapshot(self, key: str) -> Snapshot:
        """One of your snapshots, by id or name."""
        return await self._t.json(ops.snapshot(key))

    async def delete_snapshot(self, key: str) -> None:
        """Deletes a snapshot (by id or name) and its image; sandboxes started from it live on."""
        await self._t.json(ops.delete_snapshot(key))

    async def start_from_snapshot(self, key: str, count: int = 1, *, ttl: Optional[Duration] = None,
                            idle_timeout: Optional[Duration] = None,
                            labels: Optional[Mapping[str, str]] = None
                            ) -> List[Union["AsyncSandbox", CordonError]]:
        """Starts `count` (1 to 20) sandboxes from snapshot `key` (id or name), each a create
        through the server's gate with the snapshot's spec: one entry per sandbox asked for,
        the sandbox or why it did not start."""
        got = await self._t.json(ops.start_from_snapshot(key, count, ttl, idle_timeout, labels))
        return _starts(self, got)

    async def create_volume(self, name: str, size: Union[int, str]) -> Volume:
        return await self._t.json(ops.create_volume(name, size))

    async def volumes(self) -> VolumeList:
        return await self._t.json(ops.volumes())

    async def volume(self, name: str) -> Volume:
        return await self._t.json(ops.volume(name))

    async def delete_volume(self, name: str) -> VolumeDeleted:
        return await self._t.json(ops.delete_volume(name))

    async def audit(self, *, sandbox: Optional[str] = None, kind: Optional[str] = None,
                    after_id: Optional[int] = None, since_ms: Optional[int] = None,
                    limit: Optional[int] = 100) -> List[AuditEvent]:
        return await self._t.json(ops.audit(sandbox=sandbox, kind=kind, after_id=after_id,
                                            since_ms=since_ms, limit=limit))

    async def introspect_token(self, token: str) -> TokenInfo:
        return await self._t.json(ops.introspect_token(token))

    async def openid_configuration(self) -> OidcConfiguration:
        return await self._t.json(ops.openid_configuration())

    async def jwks(self) -> Jwks:
        return await self._t.json(ops.jwks())


class AsyncFiles:
    """A sandbox's /work (see `Files`)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox
        self._t = sandbox.client._t

    async def list(self, path: str = "/work") -> List[FileEntry]:
        return (await self._t.json(ops.list_files(self._sb.id, path))).entries

    async def listing(self, path: str = "/work") -> Listing:
        return await self._t.json(ops.list_files(self._sb.id, path))

    async def stat(self, path: str) -> FileEntry:
        return await self._t.json(ops.stat(self._sb.id, path))

    async def remove(self, path: str, recursive: bool = False) -> FileDone:
        return await self._t.json(ops.remove(self._sb.id, path, recursive))

    async def rename(self, src: str, dst: str) -> FileDone:
        return await self._t.json(ops.rename(self._sb.id, src, dst))

    async def mkdir(self, path: str, parents: bool = False) -> FileDone:
        return await self._t.json(ops.mkdir(self._sb.id, path, parents))

    async def upload(self, local: PathLike, path: str, mode: int = 0o644) -> FileWritten:
        """Sends the local file `local` to `path`, read in a worker thread as it is sent."""
        f = await asyncio.to_thread(open, local, "rb")
        try:
            return await self._t.json(ops.write_file(self._sb.id, path, f, mode))
        finally:
            f.close()

    async def download(self, path: str, local: Union[PathLike, IO[bytes]]) -> int:
        call = ops.read_file(self._sb.id, path)
        if hasattr(local, "write"):
            return await self._t.download(call, local)  # type: ignore[arg-type]
        f = await asyncio.to_thread(open, local, "wb")
        try:
            return await self._t.download(call, f)
        finally:
            f.close()

    async def upload_archive(self, tar: Data, path: str = "/work") -> ArchiveReport:
        return await self._t.json(ops.put_archive(self._sb.id, path, tar))

    async def download_archive(self, path: str, out: IO[bytes]) -> int:
        return await self._t.download(ops.get_archive(self._sb.id, path), out)

    async def upload_dir(self, local_dir: PathLike, path: str = "/work") -> ArchiveReport:
        """The tar is written by a worker thread as it is sent (see `Files.upload_dir`)."""
        with _tar.TarPipe(local_dir) as src:
            return await self.upload_archive(src, path)

    async def download_dir(self, path: str, local_dir: PathLike) -> List[str]:
        """Extracted by a worker thread as the chunks arrive (see `Files.download_dir`)."""
        reader = _tar.QueueReader()
        job = asyncio.ensure_future(asyncio.to_thread(_tar.untar_queue, reader, local_dir))
        try:
            async with self._t.open(ops.get_archive(self._sb.id, path)) as resp:
                async for chunk in resp.aiter_bytes(CHUNK):
                    if not await asyncio.to_thread(reader.put, chunk):
                        break
        except BaseException:
            await asyncio.to_thread(reader.put, None)
            await asyncio.gather(job, return_exceptions=True)
            raise
        await asyncio.to_thread(reader.put, None)
        return await job


class AsyncSandbox:
    """A live sandbox (see `Sandbox`); `async with` destroys it at the end."""

    def __init__(self, client: AsyncCordon, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        self.id: str = info.id
        self._t = client._t
        self.files = AsyncFiles(self)
        self._default_contexts: Dict[str, "AsyncContext"] = {}

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.destroy()

    async def write_file(self, path: str, data: Data, mode: int = 0o644) -> FileWritten:
        return await self._t.json(ops.write_file(self.id, path, data, mode))

    async def read_file(self, path: str) -> bytes:
        return await self._t.read(ops.read_file(self.id, path))

    @overload
    async def exec(self, code: Command, lang: Optional[str] = None, *,
                   timeout: Optional[Duration] = None,
                   stdin: Optional[Union[str, bytes]] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   background: Literal[False] = False, pty: None = None) -> ExecResult: ...

    @overload
    async def exec(self, code: Command, lang: Optional[str] = None, *,
                   timeout: Optional[Duration] = None, stdin: None = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   background: Literal[True], pty: Optional[Tuple[int, int]] = None
                   ) -> "AsyncBackgroundExec": ...

    async def exec(self, code: Command, lang: Optional[str] = None, *,
                   timeout: Optional[Duration] = None,
                   stdin: Optional[Union[str, bytes]] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   background: bool = False, pty: Optional[Tuple[int, int]] = None
                   ) -> Union[ExecResult, "AsyncBackgroundExec"]:
        """Runs a command and waits for it; with `background=True` starts it and returns its
        handle at once (see `Sandbox.exec`)."""
        if background:
            if stdin is not None:
                raise ValueError("a background exec takes its stdin through send_stdin()")
            return await self.exec_background(code, lang, env=env, cwd=cwd, timeout=timeout,
                                              pty=pty)
        if pty is not None:
            raise ValueError("a pseudo-terminal is for background execs: pass background=True")
        body = ops.exec_body(code, lang, timeout=timeout, stdin=stdin, env=env, cwd=cwd)
        return await self._t.json(ops.exec_(self.id, body))

    def exec_stream(self, code: Command, lang: Optional[str] = None, *,
                    timeout: Optional[Duration] = None,
                    stdin: Optional[Union[str, bytes]] = None,
                    env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None) -> AsyncIterator[StreamEvent]:
        body = ops.exec_body(code, lang, timeout=timeout, stdin=stdin, env=env, cwd=cwd)
        return self._t.events(ops.exec_(self.id, body))

    async def exec_background(self, code: Command, lang: Optional[str] = None, *,
                              env: Optional[Mapping[str, str]] = None,
                              cwd: Optional[str] = None, timeout: Optional[Duration] = None,
                              pty: Optional[Tuple[int, int]] = None) -> "AsyncBackgroundExec":
        body = ops.exec_body(code, lang, timeout=timeout, stdin=None, env=env, cwd=cwd)
        info = await self._t.json(ops.exec_background(self.id, body, pty))
        return AsyncBackgroundExec(self, info)

    async def execs(self) -> List["AsyncBackgroundExec"]:
        return [AsyncBackgroundExec(self, e) for e in await self._t.json(ops.execs(self.id))]

    def exec_handle(self, exec_id: str) -> "AsyncBackgroundExec":
        return AsyncBackgroundExec(self, ExecInfo(id=exec_id))

    async def refresh(self) -> SandboxInfo:
        self.info = await self._t.json(ops.info(self.id))
        return self.info

    async def metrics(self, start_ms: Optional[int] = None,
                      end_ms: Optional[int] = None) -> List[MetricSample]:
        """Its CPU, memory and disk samples (see `Sandbox.metrics`)."""
        return await self._t.json(ops.sandbox_metrics(self.id, start_ms, end_ms))

    async def create_snapshot(self, name: Optional[str] = None, *,
                        mode: Optional[str] = None) -> Snapshot:
        """Takes a snapshot of this sandbox, kept until you delete it: `mode` "full" (memory,
        processes and files, where the tier can) or "filesystem" (files; processes start
        fresh); left out, the most its tier keeps. The sandbox runs on."""
        return await self._t.json(ops.create_snapshot(self.id, name, mode))

    async def fork(self, count: int = 1, *, ttl: Optional[Duration] = None,
             idle_timeout: Optional[Duration] = None,
             labels: Optional[Mapping[str, str]] = None) -> List[Union["AsyncSandbox", CordonError]]:
        """`count` (1 to 20) new sandboxes from a snapshot of this one taken now (deleted
        after): one entry per sandbox asked for, the sandbox or why it did not start."""
        got = await self._t.json(ops.fork(self.id, count, ttl, idle_timeout, labels))
        return _starts(self.client, got)

    async def pause(self, to_disk: bool = False, files_only: bool = False) -> SandboxInfo:
        self.info = await self._t.json(ops.pause(self.id, to_disk, files_only))
        return self.info

    async def resume(self) -> SandboxInfo:
        self.info = await self._t.json(ops.resume(self.id))
        return self.info

    async def update(self, *, ttl: Optional[Duration] = None,
                     idle_timeout: Optional[Duration] = None) -> SandboxInfo:
        self.info = await self._t.json(ops.update(self.id, ttl, idle_timeout))
        return self.info

    async def destroy(self) -> Destroyed:
        return await self._t.json(ops.destroy(self.id))

    async def create_context(self, lang: str = "python") -> "AsyncContext":
        return AsyncContext(self, await self._t.json(ops.create_context(self.id, lang)))

    async def contexts(self) -> List["AsyncContext"]:
        return [AsyncContext(self, c) for c in await self._t.json(ops.contexts(self.id))]

    async def default_context(self, lang: str = "python") -> "AsyncContext":
        c = self._default_contexts.get(lang)
        if c is None:
            info = await self._t.json(ops.create_context(self.id, lang, default=True))
            c = self._default_contexts[lang] = AsyncContext(self, info)
        return c

    async def run_code(self, code: str, context: Optional["AsyncContext"] = None,
                       lang: str = "python", *, timeout: Optional[Duration] = None,
                       on_stdout: Optional[Callable[[str], Any]] = None,
                       on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        ctx = context if context is not None else await self.default_context(lang)
        return await ctx.run(code, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)


class AsyncContext:
    """A code context (see `Context`)."""

    def __init__(self, sandbox: AsyncSandbox, info: ContextInfo) -> None:
        self.sandbox = sandbox
        self.info = info
        self.id: str = info.id
        self.lang: str = info.lang
        self._t = sandbox._t

    async def run(self, code: str, *, timeout: Optional[Duration] = None,
                  on_stdout: Optional[Callable[[str], Any]] = None,
                  on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        if on_stdout is None and on_stderr is None:
            return await self._t.json(ops.run_cell(self.sandbox.id, self.id, code, timeout))
        async for ev in self.run_stream(code, timeout=timeout):
            if ev.type == "stdout" and on_stdout is not None:
                on_stdout(ev.data)
            elif ev.type == "stderr" and on_stderr is not None:
                on_stderr(ev.data)
            elif ev.type == "result" and ev.result is not None:
                return ev.result
        raise CordonError(500, "internal", "the stream ended without the cell's result")

    def run_stream(self, code: str, *,
                   timeout: Optional[Duration] = None) -> AsyncIterator[StreamEvent]:
        return self._t.events(ops.run_cell(self.sandbox.id, self.id, code, timeout))

    async def restart(self) -> ContextInfo:
        self.info = await self._t.json(ops.restart_context(self.sandbox.id, self.id))
        return self.info

    async def close(self) -> ContextInfo:
        self.info = await self._t.json(ops.delete_context(self.sandbox.id, self.id))
        self.sandbox._default_contexts = {
            k: v for k, v in self.sandbox._default_contexts.items() if v.id != self.id}
        return self.info


class AsyncBackgroundExec:
    """A background exec (see `BackgroundExec`); `async for ev in ex` attaches."""

    def __init__(self, sandbox: AsyncSandbox, info: ExecInfo) -> None:
        self.sandbox = sandbox
        self.info = info
        self.id: str = info.id
        self._t = sandbox._t

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._t.events(ops.attach(self.sandbox.id, self.id))

    def output(self) -> AsyncIterator[StreamEvent]:
        return self.__aiter__()

    async def wait(self) -> ExecResult:
        return await self._t.json(ops.wait(self.sandbox.id, self.id))

    async def send_stdin(self, data: Union[str, bytes], close: bool = False) -> StdinWritten:
        return await self._t.json(ops.send_stdin(self.sandbox.id, self.id, data, close))

    async def resize(self, rows: int, cols: int) -> ExecInfo:
        self.info = await self._t.json(ops.resize(self.sandbox.id, self.id, rows, cols))
        return self.info

    async def kill(self, force: bool = False) -> ExecInfo:
        return await self._t.json(ops.kill(self.sandbox.id, self.id, force))

    async def status(self) -> ExecInfo:
        for e in await self._t.json(ops.execs(self.sandbox.id)):
            if e.id == self.id:
                return e
        raise NotFound(404, "not_found", f"no background exec {self.id}",
                       "list the sandbox's execs with execs()")


def _starts(client: AsyncCordon, got: SnapshotStarts) -> List[Union[AsyncSandbox, CordonError]]:
    out: List[Union[AsyncSandbox, CordonError]] = [AsyncSandbox(client, info) for info in got.sandboxes]
    out.extend(errors.from_json(0, e) for e in got.errors)
    return out
