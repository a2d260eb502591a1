"""The synchronous client: `Cordon` (the service), `Sandbox` (one live sandbox), its `Files`,
code `Context`s and `BackgroundExec`s. `cordon_sandbox.aio` has the same surface with
`async` methods."""

from __future__ import annotations

import io
import os
from typing import (IO, Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional,
                    Sequence, Tuple, Union, overload)

import httpx

from . import _ops as ops
from ._ops import Command, Duration, LimitsArg, VolumeArg
from . import _tar
from . import errors
from ._transport import CHUNK, Data, SyncTransport, settings
from .errors import CordonError, NotFound
from .models import (ArchiveReport, AuditEvent, ContextInfo, Destroyed, ExecInfo, ExecResult,
                     Execution, FileDone, FileEntry, FileWritten, Health, Jwks, Listing,
                     MetricSample, OidcConfiguration, SandboxInfo,
                     SandboxList, Snapshot, SnapshotStarts, StdinWritten, StreamEvent, TokenInfo,
                     Volume, VolumeDeleted, VolumeList)

PathLike = Union[str, "os.PathLike[str]"]


class Cordon:
    """A Cordon server.

    `url` defaults to `CORDON_URL` (else http://127.0.0.1:7070), `api_key` to
    `CORDON_API_KEY`. One kept-alive connection pool serves every call; `timeout` bounds
    each HTTP request (seconds); a 429 that says when to come back (`Retry-After`) is sent
    again once after that wait (`retries=0`: never). `http` takes an `httpx.Client` of your
    own (event hooks, proxies); its base URL, key header and timeout are set here. Close it
    with `close()` or use the client as a context manager."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 120.0, retries: int = 1,
                 http: Optional[httpx.Client] = None) -> None:
        self.url, key = settings(url, api_key)
        self.timeout = timeout
        self._t = SyncTransport(self.url, key, timeout, retries, http)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> "Cordon":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Any route of the API (`docs/openapi.json`), for one this client does not wrap: the
        decoded JSON answer; errors raise as for every call."""
        return self._t.json(ops.raw(method, path, body))

    def health(self) -> Health:
        """The server's health; its tiers, pools and counts come with a valid key."""
        return self._t.json(ops.health())

    def metrics(self) -> str:
        """The server's Prometheus metrics (OpenMetrics text)."""
        return self._t.read(ops.metrics()).decode()

    def run(self, code: Command, lang: Optional[str] = "python", *,
            tier: Optional[str] = None, timeout: Optional[Duration] = None,
            stdin: Optional[Union[str, bytes]] = None,
            files: Optional[Mapping[str, Union[bytes, str]]] = None,
            limits: LimitsArg = None, env: Optional[Mapping[str, str]] = None,
            allow_hosts: Sequence[str] = (), deny_hosts: Sequence[str] = (),
            grants: Sequence[str] = (), trust: Optional[str] = None,
            autonomy: Optional[str] = None, shape: Optional[str] = None,
            template: Optional[str] = None, allow_weaker: Sequence[str] = ()) -> ExecResult:
        """Runs code once in a fresh sandbox that is destroyed afterwards.

        `code` is code in `lang` (a string) or an argv (a list; pass `lang=None`). `files`
        maps sandbox paths under /work to their contents. `template` names a template on
        the server (`cordon template ls`). With `trust` ("trusted"/"untrusted") and
        `autonomy` ("compute", "read-files", "write-files", "install-packages", "internet")
        the server's tier policy picks the tier (`tier="auto"` or none) or checks the one
        named; a refusal raises PolicyDenied."""
        return self._t.json(ops.run(
            code, lang, tier=tier, timeout=timeout, stdin=stdin, files=files, limits=limits,
            env=env, allow_hosts=allow_hosts, deny_hosts=deny_hosts, grants=grants,
            trust=trust, autonomy=autonomy, shape=shape, template=template,
            allow_weaker=allow_weaker))

    def run_stream(self, code: Command, lang: Optional[str] = "python", *,
                   tier: Optional[str] = None, timeout: Optional[Duration] = None,
                   stdin: Optional[Union[str, bytes]] = None,
                   files: Optional[Mapping[str, Union[bytes, str]]] = None,
                   limits: LimitsArg = None, env: Optional[Mapping[str, str]] = None,
                   template: Optional[str] = None) -> Iterator[StreamEvent]:
        """Like `run`, yielding stdout/stderr events as they come, then the outcome."""
        return self._t.events(ops.run(
            code, lang, tier=tier, timeout=timeout, stdin=stdin, files=files, limits=limits,
            env=env, allow_hosts=(), deny_hosts=(), grants=(), trust=None, autonomy=None,
            shape=None, template=template, allow_weaker=(), stream=True))

    def create_sandbox(self, tier: Optional[str] = None, *, allow_hosts: Sequence[str] = (),
                       deny_hosts: Sequence[str] = (), ttl: Optional[Duration] = None,
                       idle_timeout: Optional[Duration] = None, limits: LimitsArg = None,
                       env: Optional[Mapping[str, str]] = None, trust: Optional[str] = None,
                       autonomy: Optional[str] = None, shape: Optional[str] = None,
                       grants: Sequence[str] = (), template: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None,
                       volumes: Sequence[VolumeArg] = (),
                       allow_weaker: Sequence[str] = (),
                       on_timeout: Optional[str] = None) -> "Sandbox":
        """Creates a sandbox; use it as `with c.sandbox(...) as sb:` so it is destroyed.

        `trust`, `autonomy` and `shape` are the tier policy's inputs, as for `run`.
        `grants` names credentials of the server's grant catalogue: the sandbox gets a
        placeholder, the egress proxy puts the real secret (or a minted token) into requests
        to the grant's hosts. `labels` tag it for `list_sandboxes`. `volumes` mounts volumes
        of yours, each `"name:/work/path"`, `"name:/work/path:ro"` or
        `{"name", "path", "read_only"}`. `on_timeout="pause"` pauses it at its TTL or idle
        timeout instead of destroying it (`resume()` gives it its TTL again);
        `on_timeout="pause_files"` keeps its files only (container, gvisor)."""
        body = ops.spec(tier=tier, allow_hosts=allow_hosts, deny_hosts=deny_hosts, ttl=ttl,
                        idle_timeout=idle_timeout, limits=limits, env=env, trust=trust,
                        autonomy=autonomy, shape=shape, grants=grants, template=template,
                        labels=labels, volumes=volumes, allow_weaker=allow_weaker,
                        on_timeout=on_timeout)
        return Sandbox(self, self._t.json(ops.create_sandbox(body)))

    sandbox = create_sandbox
    create = create_sandbox

    def get_sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on a sandbox of yours by its id (from `list_sandboxes`)."""
        return Sandbox(self, self._t.json(ops.info(sandbox_id)))

    def sandbox_handle(self, sandbox_id: str) -> "Sandbox":
        """A handle on sandbox `sandbox_id` without asking the server (`get_sandbox` reads
        its state); its calls raise NotFound if it is not yours."""
        return Sandbox(self, SandboxInfo(id=sandbox_id, tier="", state=""))

    def list_sandboxes(self, labels: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        """Your sandboxes; with `labels`, only those carrying every one of them."""
        return self._t.json(ops.list_sandboxes(labels)).sandboxes

    def sandboxes(self, labels: Optional[Mapping[str, str]] = None) -> SandboxList:
        """Your sandboxes and the bytes those paused to disk hold (`on_disk_bytes`)."""
        return self._t.json(ops.list_sandboxes(labels))

    def snapshots(self) -> List[Snapshot]:
        """Your snapshots, oldest first."""
        return self._t.json(ops.snapshots())

    def snapshot(self, key: str) -> Snapshot:
        """One of your snapshots, by id or name."""
        return self._t.json(ops.snapshot(key))

    def delete_snapshot(self, key: str) -> None:
        """Deletes a snapshot (by id or name) and its image; sandboxes started from it live on."""
        self._t.json(ops.delete_snapshot(key))

    def start_from_snapshot(self, key: str, count: int = 1, *, ttl: Optional[Duration] = None,
                            idle_timeout: Optional[Duration] = None,
                            labels: Optional[Mapping[str, str]] = None
                            ) -> List[Union["Sandbox", CordonError]]:
        """Starts `count` (1 to 20) sandboxes from snapshot `key` (id or name), each a create
        through the server's gate with the snapshot's spec: one entry per sandbox asked for,
        the sandbox or why it did not start."""
        got = self._t.json(ops.start_from_snapshot(key, count, ttl, idle_timeout, labels))
        return _starts(self, got)

    def create_volume(self, name: str, size: Union[int, str]) -> Volume:
        """Creates a volume: an empty file system of `size` bytes (or "256M"), its quota."""
        return self._t.json(ops.create_volume(name, size))

    def volumes(self) -> VolumeList:
        """Your volumes, their sizes added up (`used_bytes`) and your ceiling."""
        return self._t.json(ops.volumes())

    def volume(self, name: str) -> Volume:
        """One of your volumes: size, bytes used, the sandboxes mounting it."""
        return self._t.json(ops.volume(name))

    def delete_volume(self, name: str) -> VolumeDeleted:
        """Deletes a volume and its contents; refused while a sandbox mounts it."""
        return self._t.json(ops.delete_volume(name))

    def audit(self, *, sandbox: Optional[str] = None, kind: Optional[str] = None,
              after_id: Optional[int] = None, since_ms: Optional[int] = None,
              limit: Optional[int] = 100) -> List[AuditEvent]:
        """Your audit rows, oldest first (`after_id` pages on; at most 1000 a call)."""
        return self._t.json(ops.audit(sandbox=sandbox, kind=kind, after_id=after_id,
                                      since_ms=since_ms, limit=limit))

    def introspect_token(self, token: str) -> TokenInfo:
        """Whether a token this server minted for a sandbox is active, and its claims."""
        return self._t.json(ops.introspect_token(token))

    def openid_configuration(self) -> OidcConfiguration:
        """The OIDC discovery document of the server's minted tokens."""
        return self._t.json(ops.openid_configuration())

    def jwks(self) -> Jwks:
        """The public keys minted tokens verify with."""
        return self._t.json(ops.jwks())


class Files:
    """A sandbox's /work: `sandbox.files.list("/work")`, `stat`, `remove`, `rename`,
    `mkdir`, single files streamed both ways (`upload`, `download`) and directories as tar
    streams (`upload_dir`, `download_dir`)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox
        self._t = sandbox.client._t

    def list(self, path: str = "/work") -> List[FileEntry]:
        """The entries of a directory, sorted by name."""
        return self._t.json(ops.list_files(self._sb.id, path)).entries

    def listing(self, path: str = "/work") -> Listing:
        """The directory's listing, with `truncated` for one of more than 10,000 entries."""
        return self._t.json(ops.list_files(self._sb.id, path))

    def stat(self, path: str) -> FileEntry:
        """One entry; a symlink is reported as one."""
        return self._t.json(ops.stat(self._sb.id, path))

    def remove(self, path: str, recursive: bool = False) -> FileDone:
        """Removes a file, a symlink or an empty directory (any directory with `recursive`)."""
        return self._t.json(ops.remove(self._sb.id, path, recursive))

    def rename(self, src: str, dst: str) -> FileDone:
        """Renames or moves `src` to `dst` (a file at `dst` is replaced)."""
        return self._t.json(ops.rename(self._sb.id, src, dst))

    def mkdir(self, path: str, parents: bool = False) -> FileDone:
        """Makes a directory (with `parents`, missing parents too and no error if it exists)."""
        return self._t.json(ops.mkdir(self._sb.id, path, parents))

    def upload(self, local: PathLike, path: str, mode: int = 0o644) -> FileWritten:
        """Sends the local file `local` to `path`, streamed from disk."""
        with open(local, "rb") as f:
            return self._t.json(ops.write_file(self._sb.id, path, f, mode))

    def download(self, path: str, local: Union[PathLike, IO[bytes]]) -> int:
        """Writes the file `path` to `local` (a path or a binary file) as it arrives;
        returns its size."""
        call = ops.read_file(self._sb.id, path)
        if hasattr(local, "write"):
            return self._t.download(call, local)  # type: ignore[arg-type]
        with open(local, "wb") as f:
            return self._t.download(call, f)

    def upload_archive(self, tar: Data, path: str = "/work") -> ArchiveReport:
        """Extracts an uncompressed tar (bytes, a binary file or chunks) into `path`."""
        return self._t.json(ops.put_archive(self._sb.id, path, tar))

    def download_archive(self, path: str, out: IO[bytes]) -> int:
        """Writes the directory `path` as a tar stream into `out`; returns its size."""
        return self._t.download(ops.get_archive(self._sb.id, path), out)

    def upload_dir(self, local_dir: PathLike, path: str = "/work") -> ArchiveReport:
        """Sends the local directory `local_dir` (its contents) into `path` as a tar stream,
        written by a worker thread as it is sent (never whole in memory nor on disk).

        Symlinks go in the archive as links; the server skips them (see `skipped`)."""
        with _tar.TarPipe(local_dir) as src:
            return self.upload_archive(src, path)

    def download_dir(self, path: str, local_dir: PathLike) -> List[str]:
        """Receives the directory `path` as a tar stream and extracts it into `local_dir`
        (made if missing), with tarfile's `data` filter: entries that would leave
        `local_dir`, links pointing out of it, devices are skipped. Returns what was
        skipped. Extracted as it arrives (never whole in memory nor on disk)."""
        with self._t.open(ops.get_archive(self._sb.id, path)) as resp:
            src = io.BufferedReader(_tar.IterReader(resp.iter_bytes(CHUNK)))
            return _tar.untar(src, local_dir)


class Sandbox:
    """A live sandbox. A context manager: leaving the `with` block destroys it."""

    def __init__(self, client: Cordon, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        self.id: str = info.id
        self._t = client._t
        self.files = Files(self)
        self._default_contexts: Dict[str, "Context"] = {}

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def write_file(self, path: str, data: Data, mode: int = 0o644) -> FileWritten:
        """Writes a file under /work: bytes, text, a binary file or an iterator of chunks
        (files and iterators are streamed)."""
        return self._t.json(ops.write_file(self.id, path, data, mode))

    def read_file(self, path: str) -> bytes:
        """Reads a file under /work (`files.download` streams one to disk)."""
        return self._t.read(ops.read_file(self.id, path))

    @overload
    def exec(self, code: Command, lang: Optional[str] = None, *,
             timeout: Optional[Duration] = None, stdin: Optional[Union[str, bytes]] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             background: Literal[False] = False, pty: None = None) -> ExecResult: ...

    @overload
    def exec(self, code: Command, lang: Optional[str] = None, *,
             timeout: Optional[Duration] = None, stdin: None = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             background: Literal[True], pty: Optional[Tuple[int, int]] = None
             ) -> "BackgroundExec": ...

    def exec(self, code: Command, lang: Optional[str] = None, *,
             timeout: Optional[Duration] = None, stdin: Optional[Union[str, bytes]] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             background: bool = False,
             pty: Optional[Tuple[int, int]] = None) -> Union[ExecResult, "BackgroundExec"]:
        """Runs a shell command (a string), code in `lang`, or an argv (a list); waits for
        it and returns its `ExecResult`.

        With `background=True` it returns a `BackgroundExec` at once instead (its stdin goes
        through `send_stdin`); `pty=(rows, cols)` runs it on a pseudo-terminal of that size
        (background execs only)."""
        if background:
            if stdin is not None:
                raise ValueError("a background exec takes its stdin through send_stdin()")
            return self.exec_background(code, lang, env=env, cwd=cwd, timeout=timeout, pty=pty)
        if pty is not None:
            raise ValueError("a pseudo-terminal is for background execs: pass background=True")
        body = ops.exec_body(code, lang, timeout=timeout, stdin=stdin, env=env, cwd=cwd)
        return self._t.json(ops.exec_(self.id, body))

    def exec_stream(self, code: Command, lang: Optional[str] = None, *,
                    timeout: Optional[Duration] = None,
                    stdin: Optional[Union[str, bytes]] = None,
                    env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None) -> Iterator[StreamEvent]:
        """Like `exec`, yielding stdout/stderr events as they come, then the outcome."""
        body = ops.exec_body(code, lang, timeout=timeout, stdin=stdin, env=env, cwd=cwd)
        return self._t.events(ops.exec_(self.id, body))

    def exec_background(self, code: Command, lang: Optional[str] = None, *,
                        env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                        timeout: Optional[Duration] = None,
                        pty: Optional[Tuple[int, int]] = None) -> "BackgroundExec":
        """Starts a command in the background and returns its handle at once. With
        `pty=(rows, cols)` it runs on a pseudo-terminal: its stdin, stdout and stderr (all its
        output is stdout; `TERM` is `xterm-256color` unless `env` sets it); `resize` changes
        the size, and closing its stdin sends ^D."""
        body = ops.exec_body(code, lang, timeout=timeout, stdin=None, env=env, cwd=cwd)
        return BackgroundExec(self, self._t.json(ops.exec_background(self.id, body, pty)))

    def execs(self) -> List["BackgroundExec"]:
        """The sandbox's background execs, running or ended, oldest first."""
        return [BackgroundExec(self, e) for e in self._t.json(ops.execs(self.id))]

    def exec_handle(self, exec_id: str) -> "BackgroundExec":
        """The handle of background exec `exec_id` (from `execs()` or an earlier start)."""
        return BackgroundExec(self, ExecInfo(id=exec_id))

    def refresh(self) -> SandboxInfo:
        """Reads its current state (live, paused, ...) into `info` and returns it."""
        self.info = self._t.json(ops.info(self.id))
        return self.info

    def metrics(self, start_ms: Optional[int] = None,
                end_ms: Optional[int] = None) -> List[MetricSample]:
        """Its CPU, memory and disk samples (one every 5 s, the last hour kept) taken from
        `start_ms` to `end_ms` (milliseconds since the Unix epoch; each optional), oldest
        first."""
        return self._t.json(ops.sandbox_metrics(self.id, start_ms, end_ms))

    def create_snapshot(self, name: Optional[str] = None, *,
                        mode: Optional[str] = None) -> Snapshot:
        """Takes a snapshot of this sandbox, kept until you delete it: `mode` "full" (memory,
        processes and files, where the tier can) or "filesystem" (files; processes start
        fresh); left out, the most its tier keeps. The sandbox runs on."""
        return self._t.json(ops.create_snapshot(self.id, name, mode))

    def fork(self, count: int = 1, *, ttl: Optional[Duration] = None,
             idle_timeout: Optional[Duration] = None,
             labels: Optional[Mapping[str, str]] = None) -> List[Union["Sandbox", CordonError]]:
        """`count` (1 to 20) new sandboxes from a snapshot of this one taken now (deleted
        after): one entry per sandbox asked for, the sandbox or why it did not start."""
        got = self._t.json(ops.fork(self.id, count, ttl, idle_timeout, labels))
        return _starts(self.client, got)

    def pause(self, to_disk: bool = False, files_only: bool = False) -> SandboxInfo:
        """Stops its processes where they are (no CPU); its TTL clock stands still.

        `to_disk=True` (microvm tier) saves the whole sandbox to disk and frees its memory:
        it is listed with `on_disk` and `on_disk_bytes`, survives a server restart, and
        `resume()` restores it. `files_only=True` (container, gvisor) keeps its files only:
        its processes end and its memory is freed; `resume()` starts it again from its
        files under the same id, as a machine boots again."""
        self.info = self._t.json(ops.pause(self.id, to_disk, files_only))
        return self.info

    def resume(self) -> SandboxInfo:
        """Continues a paused sandbox's processes."""
        self.info = self._t.json(ops.resume(self.id))
        return self.info

    def update(self, *, ttl: Optional[Duration] = None,
               idle_timeout: Optional[Duration] = None) -> SandboxInfo:
        """Changes its TTL (from its creation) or idle timeout, within the server's maxima."""
        self.info = self._t.json(ops.update(self.id, ttl, idle_timeout))
        return self.info

    def destroy(self) -> Destroyed:
        """Destroys the sandbox; calling it again is fine (`already` is then true)."""
        return self._t.json(ops.destroy(self.id))

    # -- code contexts -------------------------------------------------------------------

    def create_context(self, lang: str = "python") -> "Context":
        """Starts a long-lived interpreter (python, javascript, typescript or bash) whose
        variables, imports and open files persist from one cell to the next."""
        return Context(self, self._t.json(ops.create_context(self.id, lang)))

    def contexts(self) -> List["Context"]:
        """The sandbox's code contexts, oldest first."""
        return [Context(self, c) for c in self._t.json(ops.contexts(self.id))]

    def default_context(self, lang: str = "python") -> "Context":
        """The sandbox's default context of `lang` (made at its first use)."""
        c = self._default_contexts.get(lang)
        if c is None:
            c = Context(self, self._t.json(ops.create_context(self.id, lang, default=True)))
            self._default_contexts[lang] = c
        return c

    def run_code(self, code: str, context: Optional["Context"] = None, lang: str = "python",
                 *, timeout: Optional[Duration] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        """Runs a cell in `context` (default: the sandbox's default context of `lang`).

        `timeout` ("5s" or seconds) interrupts the cell without losing the context;
        `on_stdout`/`on_stderr` receive output as it comes."""
        ctx = context if context is not None else self.default_context(lang)
        return ctx.run(code, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)


class Context:
    """A code context: a long-lived interpreter in a sandbox. `close()` ends it."""

    def __init__(self, sandbox: Sandbox, info: ContextInfo) -> None:
        self.sandbox = sandbox
        self.info = info
        self.id: str = info.id
        self.lang: str = info.lang
        self._t = sandbox._t

    def run(self, code: str, *, timeout: Optional[Duration] = None,
            on_stdout: Optional[Callable[[str], Any]] = None,
            on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        """Runs one cell and returns what it did (see `Execution`)."""
        if on_stdout is None and on_stderr is None:
            return self._t.json(ops.run_cell(self.sandbox.id, self.id, code, timeout))
        for ev in self.run_stream(code, timeout=timeout):
            if ev.type == "stdout" and on_stdout is not None:
                on_stdout(ev.data)
            elif ev.type == "stderr" and on_stderr is not None:
                on_stderr(ev.data)
            elif ev.type == "result" and ev.result is not None:
                return ev.result
        raise CordonError(500, "internal", "the stream ended without the cell's result")

    def run_stream(self, code: str, *,
                   timeout: Optional[Duration] = None) -> Iterator[StreamEvent]:
        """Runs one cell, yielding stdout/stderr events as they come, then a result event."""
        return self._t.events(ops.run_cell(self.sandbox.id, self.id, code, timeout))

    def restart(self) -> ContextInfo:
        """Starts its interpreter again: every variable and import is gone."""
        self.info = self._t.json(ops.restart_context(self.sandbox.id, self.id))
        return self.info

    def close(self) -> ContextInfo:
        """Ends the context (its interpreter is killed)."""
        self.info = self._t.json(ops.delete_context(self.sandbox.id, self.id))
        self.sandbox._default_contexts = {
            k: v for k, v in self.sandbox._default_contexts.items() if v.id != self.id}
        return self.info

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BackgroundExec:
    """A background exec: attach to its output, write to its stdin, stop it.

    Iterating yields its output events (everything since its start that the sandbox kept,
    then live output) and ends with its outcome event; `wait()` returns the outcome.
    """

    def __init__(self, sandbox: Sandbox, info: ExecInfo) -> None:
        self.sandbox = sandbox
        self.info = info
        self.id: str = info.id
        self._t = sandbox._t

    def __iter__(self) -> Iterator[StreamEvent]:
        return self._t.events(ops.attach(self.sandbox.id, self.id))

    def output(self) -> Iterator[StreamEvent]:
        """Attaches: replayed output, live output, then the outcome event."""
        return iter(self)

    def wait(self) -> ExecResult:
        """Waits for its end; its stdout and stderr are what the sandbox kept."""
        return self._t.json(ops.wait(self.sandbox.id, self.id))

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> StdinWritten:
        """Writes to its stdin; `close` ends the stdin after these bytes."""
        return self._t.json(ops.send_stdin(self.sandbox.id, self.id, data, close))

    def resize(self, rows: int, cols: int) -> ExecInfo:
        """Sets its pseudo-terminal's size (it gets SIGWINCH); an exec started without `pty`
        raises `Unsupported`."""
        self.info = self._t.json(ops.resize(self.sandbox.id, self.id, rows, cols))
        return self.info

    def kill(self, force: bool = False) -> ExecInfo:
        """SIGTERM to its process tree, SIGKILL after the server's grace (`force`: at once)."""
        return self._t.json(ops.kill(self.sandbox.id, self.id, force))

    def status(self) -> ExecInfo:
        """Its entry in the sandbox's list (state, exit code)."""
        for e in self._t.json(ops.execs(self.sandbox.id)):
            if e.id == self.id:
                return e
        raise NotFound(404, "not_found", f"no background exec {self.id}",
                       "list the sandbox's execs with execs()")


__all__ = ["BackgroundExec", "Context", "Cordon", "Files", "Sandbox"]


def _starts(client: Cordon, got: SnapshotStarts) -> List[Union[Sandbox, CordonError]]:
    out: List[Union[Sandbox, CordonError]] = [Sandbox(client, info) for info in got.sandboxes]
    out.extend(errors.from_json(0, e) for e in got.errors)
    return out
