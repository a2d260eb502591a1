"""The client: `Cordon` (the service), `Sandbox` (one live sandbox), results and errors."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

Command = Union[str, Sequence[str]]


class CordonError(Exception):
    """An error the API reported: `code` is stable, `message` says what, `fix` what to do."""

    def __init__(self, status: int, code: str, message: str, fix: str = "",
                 retry_after: Optional[float] = None) -> None:
        super().__init__(f"{code}: {message} (fix: {fix})" if fix else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fix = fix
        self.retry_after = retry_after


class Unauthorized(CordonError):
    """The API key is missing or wrong."""


class NotFound(CordonError):
    """No such sandbox (or it belongs to another tenant)."""


class InvalidRequest(CordonError):
    """The request was malformed or named unknown fields."""


class PathRefused(CordonError):
    """A file path outside /work, with '..', or a symlink."""


class PolicyDenied(CordonError):
    """The server's policy refused the spec (limits, tier, egress)."""


class TierUnavailable(CordonError):
    """The tier cannot run on the server's host."""


class TooManySandboxes(CordonError):
    """A concurrency limit is full; `retry_after` says when to try again."""


class ResourceBusy(CordonError):
    """Your share of a resource the server shares between tenants (host descriptors, the
    compile queue) is in use by your own other requests; `retry_after` says when to retry."""


class SandboxBusy(CordonError):
    """The sandbox is running another request."""


class SandboxGone(CordonError):
    """The sandbox was destroyed."""


class Unsupported(CordonError):
    """The sandbox's tier (or its build) cannot do this; `fix` says what can."""


class TooManyExecs(CordonError):
    """The sandbox has its limit of background execs running."""


class SandboxPaused(CordonError):
    """The sandbox is paused: resume it first."""


class ContextBusy(CordonError):
    """The code context is running another cell (one at a time per context)."""


class TooManyContexts(CordonError):
    """The sandbox holds its limit of code contexts: delete one first."""


class VolumeExists(CordonError):
    """You have a volume of that name already."""


class VolumeInUse(CordonError):
    """The volume is mounted: read-write by another sandbox, or by any to delete it."""


class VolumeQuota(CordonError):
    """The volume would pass your volume ceiling (count or bytes)."""


_BY_CODE = {
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "invalid_request": InvalidRequest,
    "payload_too_large": InvalidRequest,
    "unsupported_media_type": InvalidRequest,
    "path_refused": PathRefused,
    "policy_denied": PolicyDenied,
    "tier_unavailable": TierUnavailable,
    "layer_unavailable": TierUnavailable,
    "too_many_sandboxes": TooManySandboxes,
    "sandbox_busy": SandboxBusy,
    "resource_busy": ResourceBusy,
    "sandbox_gone": SandboxGone,
    "unsupported": Unsupported,
    "too_many_execs": TooManyExecs,
    "sandbox_paused": SandboxPaused,
    "context_busy": ContextBusy,
    "too_many_contexts": TooManyContexts,
    "volume_exists": VolumeExists,
    "volume_in_use": VolumeInUse,
    "volume_quota": VolumeQuota,
}


def _error(status: int, body: bytes, retry_after: Optional[str] = None) -> CordonError:
    try:
        d = json.loads(body)
        code, message, fix = d["code"], d["message"], d.get("fix", "")
    except (ValueError, KeyError, TypeError):
        code, message, fix = "http_error", body.decode("utf-8", "replace")[:500], ""
    cls = _BY_CODE.get(code, CordonError)
    ra = float(retry_after) if retry_after and retry_after.isdigit() else None
    return cls(status, code, message, fix, ra)


@dataclass
class ExecResult:
    """How an exec ended. `exit_code` is None unless `termination == "exited"`."""

    termination: str
    exit_code: Optional[int]
    signal: Optional[int]
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    tier: str = ""
    usage: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.termination == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExecResult":
        return cls(
            termination=d["termination"], exit_code=d.get("exit_code"), signal=d.get("signal"),
            stdout=d.get("stdout", ""), stderr=d.get("stderr", ""),
            stdout_truncated=d.get("stdout_truncated", False),
            stderr_truncated=d.get("stderr_truncated", False), tier=d.get("tier", ""),
            usage=d.get("usage", {}), timings=d.get("timings", {}), raw=dict(d))


@dataclass
class ExecutionError:
    """A cell's error: the exception's name and value, and its traceback."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    """What a code cell did.

    `text` is the text of its last expression's value; `results` its rich outputs, each a
    MIME bundle (a dict of MIME type to data: `image/png` base64, `application/json` as
    JSON text, `text/html`, `text/plain`, ...), `display()` calls and the last value in
    order (`main_result` is the last value's); `logs` its output (`{"stdout": [...],
    "stderr": [...]}`); `error` set when it raised, timed out or its interpreter died.
    `status` is ok, error, timeout (interrupted; the context keeps its state) or died
    (`restarted` says whether a fresh interpreter took its place)."""

    status: str
    text: Optional[str]
    results: List[Dict[str, str]]
    logs: Dict[str, List[str]]
    error: Optional[ExecutionError]
    execution_count: int = 0
    restarted: bool = False
    main_result: Optional[Dict[str, str]] = None
    warnings: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Execution":
        e = d.get("error")
        results = d.get("results", [])
        main = next((r["data"] for r in results if r.get("main")), None)
        return cls(
            status=d["status"], text=d.get("text"), results=[r["data"] for r in results],
            logs={"stdout": list(d.get("logs", {}).get("stdout", [])),
                  "stderr": list(d.get("logs", {}).get("stderr", []))},
            error=ExecutionError(e["name"], e["value"], e.get("traceback", "")) if e else None,
            execution_count=d.get("execution_count", 0), restarted=d.get("restarted", False),
            main_result=main, warnings=list(d.get("warnings", [])), raw=dict(d))


@dataclass
class StreamEvent:
    """One streamed event: `type` is stdout, stderr, outcome (then `outcome` is set) or,
    for a code cell, result (then `result` is set)."""

    type: str
    data: str = ""
    outcome: Optional[ExecResult] = None
    result: Optional[Execution] = None


def _command(code: Command, lang: Optional[str]) -> Dict[str, Any]:
    """A string is code in `lang` (sh when none is given); a list is an argv."""
    if isinstance(code, str):
        return {"lang": lang or "sh", "code": code}
    if lang is not None:
        raise ValueError("lang applies to code given as a string, not to an argv list")
    return {"argv": list(code)}


class Cordon:
    """A Cordon server. `timeout` bounds each HTTP request (seconds)."""

    def __init__(self, url: str, api_key: str, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    # -- transport ---------------------------------------------------------------------

    def _open(self, method: str, path: str, body: Optional[bytes] = None,
              ctype: Optional[str] = None, accept: Optional[str] = None):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.api_key}")
        if ctype:
            req.add_header("Content-Type", ctype)
        if accept:
            req.add_header("Accept", accept)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _error(e.code, e.read(), e.headers.get("Retry-After")) from None

    def _json(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        with self._open(method, path, body, "application/json" if body is not None else None) as r:
            return json.loads(r.read())

    def _stream(self, path: str, payload: Optional[Mapping[str, Any]]) -> Iterator[StreamEvent]:
        """POSTs `payload` (GETs `path` when it is None) and yields the NDJSON events."""
        body = None if payload is None else json.dumps(payload).encode()
        method = "GET" if payload is None else "POST"
        ctype = None if payload is None else "application/json"
        with self._open(method, path, body, ctype, "application/x-ndjson") as r:
            for line in r:
                if not line.strip():
                    continue
                ev = json.loads(line)
                t = ev["type"]
                if t == "outcome":
                    yield StreamEvent("outcome", outcome=ExecResult.from_json(ev["outcome"]))
                elif t == "result":
                    yield StreamEvent("result", result=Execution.from_json(ev["result"]))
                elif t == "error":
                    e = ev["error"]
                    raise _error(500, json.dumps(e).encode())
                else:
                    yield StreamEvent(t, data=ev.get("data", ""))

    # -- API ---------------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """The server's health; its tiers, pools and counts come with a valid key."""
        return self._json("GET", "/v1/health")

    def run(self, code: Command, lang: Optional[str] = "python", *, tier: Optional[str] = None,
            timeout: Optional[str] = None, stdin: Optional[str] = None,
            files: Optional[Mapping[str, bytes]] = None,
            limits: Optional[Mapping[str, Any]] = None, trust: Optional[str] = None,
            autonomy: Optional[str] = None, shape: Optional[str] = None,
            template: Optional[str] = None) -> ExecResult:
        """Runs code once in a fresh sandbox that is destroyed afterwards.

        `template` names a template on the server (`cordon template ls`): the sandbox's
        root is made from it (read-only; /work and /tmp writable).

        With `trust` ("trusted"/"untrusted") and `autonomy` ("compute", "read-files",
        "write-files", "install-packages", "internet") the server's tier policy picks the tier
        (`tier="auto"` or none) or checks the one named; a refusal raises PolicyDenied.
        """
        payload = self._run_payload(code, lang, tier, timeout, stdin, files, limits)
        payload.update(_policy(trust, autonomy, shape))
        if template:
            payload["template"] = template
        return ExecResult.from_json(self._json("POST", "/v1/run", payload))

    def _run_payload(self, code: Command, lang: Optional[str], tier: Optional[str],
                     timeout: Optional[str], stdin: Optional[str],
                     files: Optional[Mapping[str, bytes]],
                     limits: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        import base64
        payload: Dict[str, Any] = _command(code, lang if isinstance(code, str) else None)
        if tier:
            payload["tier"] = tier
        if timeout:
            payload["timeout"] = timeout
        if stdin is not None:
            payload["stdin"] = stdin
        if limits:
            payload["limits"] = dict(limits)
        if files:
            payload["files"] = [{"path": p, "content_base64": base64.b64encode(d).decode()}
                                for p, d in files.items()]
        return payload

    def create_sandbox(self, tier: Optional[str] = None, *, allow_hosts: Sequence[str] = (),
                       ttl: Optional[str] = None, idle_timeout: Optional[str] = None,
                       limits: Optional[Mapping[str, Any]] = None,
                       env: Optional[Mapping[str, str]] = None, trust: Optional[str] = None,
                       autonomy: Optional[str] = None,
                       shape: Optional[str] = None,
                       grants: Sequence[str] = (),
                       template: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None,
                       volumes: Sequence[Union[str, Mapping[str, Any]]] = ()) -> "Sandbox":
        """Creates a sandbox; prefer `with c.sandbox(...) as sb:` so it is always destroyed.

        `trust`, `autonomy` and `shape` are the tier policy's inputs, as for `run`.
        `grants` names credentials of the server's grant catalogue: the sandbox gets a
        placeholder, the egress proxy puts the real secret (or a minted token) into requests
        to the grant's hosts. `template` names a template on the server (`cordon template
        ls`) the sandbox's root is made from. `volumes` mounts volumes of yours, each
        `"name:/work/path"`, `"name:/work/path:ro"` or `{"name", "path", "read_only"}`:
        read-write for this sandbox alone, read-only for as many as like.
        """
        payload: Dict[str, Any] = _policy(trust, autonomy, shape)
        if volumes:
            payload["volumes"] = [_volume_mount(v) for v in volumes]
        if grants:
            payload["grants"] = list(grants)
        if template:
            payload["template"] = template
        if labels:
            payload["labels"] = dict(labels)
        if tier:
            payload["tier"] = tier
        if allow_hosts:
            payload["allow_hosts"] = list(allow_hosts)
        if ttl:
            payload["ttl"] = ttl
        if idle_timeout:
            payload["idle_timeout"] = idle_timeout
        if limits:
            payload["limits"] = dict(limits)
        if env:
            payload["env"] = dict(env)
        info = self._json("POST", "/v1/sandboxes", payload)
        return Sandbox(self, info)

    sandbox = create_sandbox
    create = create_sandbox

    def create_volume(self, name: str, size: Union[int, str]) -> Dict[str, Any]:
        """Creates a volume: an empty file system of `size` bytes (or "256M"), its quota."""
        return self._json("POST", "/v1/volumes", {"name": name, "size": size})

    def volumes(self) -> Dict[str, Any]:
        """Your volumes (`volumes`), their sizes added up (`used_bytes`) and your ceiling
        (`quota_bytes`, `max_volumes`)."""
        return self._json("GET", "/v1/volumes")

    def volume(self, name: str) -> Dict[str, Any]:
        """One of your volumes: size, bytes used, the sandboxes mounting it."""
        return self._json("GET", "/v1/volumes/" + urllib.parse.quote(name, safe=""))

    def delete_volume(self, name: str) -> None:
        """Deletes a volume and its contents; refused while a sandbox mounts it."""
        self._json("DELETE", "/v1/volumes/" + urllib.parse.quote(name, safe=""))

    def list_sandboxes(self, labels: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
        """Your sandboxes; with `labels`, only those carrying every one of them."""
        q = ""
        if labels:
            q = "?" + urllib.parse.urlencode([("label", f"{k}={v}") for k, v in labels.items()])
        return self._json("GET", "/v1/sandboxes" + q)["sandboxes"]

    def audit(self, *, sandbox: Optional[str] = None, kind: Optional[str] = None,
              after_id: Optional[int] = None, limit: int = 100) -> List[Dict[str, Any]]:
        q = {k: v for k, v in {"sandbox": sandbox, "kind": kind, "after_id": after_id,
                               "limit": limit}.items() if v is not None}
        return self._json("GET", "/v1/audit?" + urllib.parse.urlencode(q))["events"]


def _volume_mount(v: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    if isinstance(v, str):
        name, _, rest = v.partition(":")
        path, ro = rest, False
        if rest.endswith(":ro") or rest.endswith(":rw"):
            path, ro = rest[:-3], rest.endswith(":ro")
        return {"name": name, "path": path, "read_only": ro}
    return dict(v)


def _policy(trust: Optional[str], autonomy: Optional[str],
            shape: Optional[str]) -> Dict[str, Any]:
    return {k: v for k, v in {"trust": trust, "autonomy": autonomy, "shape": shape}.items()
            if v is not None}


@dataclass
class FileEntry:
    """One directory entry or what `stat` found (a symlink is reported, never followed)."""

    name: str
    kind: str  # file, dir, symlink, fifo, socket, char_device, block_device
    size: int
    mode: int
    mtime_ms: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileEntry":
        return cls(name=d["name"], kind=d["kind"], size=d["size"], mode=d["mode"],
                   mtime_ms=d["mtime_ms"])


@dataclass
class ArchiveReport:
    """What moving a directory as a tar stream did; `skipped` lists (path, reason)."""

    files: int
    dirs: int
    bytes: int
    symlinks: int = 0
    skipped: List[Any] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ArchiveReport":
        return cls(files=d["files"], dirs=d["dirs"], bytes=d["bytes"],
                   symlinks=d.get("symlinks", 0),
                   skipped=[(s["path"], s["reason"]) for s in d.get("skipped", [])])


# Archives are spooled through a temporary file past this size, never held whole in memory.
_SPOOL = 8 << 20
_CHUNK = 256 << 10


class Files:
    """A sandbox's /work: `sandbox.files.list("/work")`, `stat`, `remove`, `rename`,
    `mkdir`, and directories as tar streams (`upload_dir`, `download_dir`)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox
        self._base = f"/v1/sandboxes/{sandbox.id}"

    def _q(self, route: str, **params: Any) -> str:
        q = {k: ("true" if v is True else "false" if v is False else v)
             for k, v in params.items() if v is not None}
        return f"{self._base}/{route}?" + urllib.parse.urlencode(q)

    def list(self, path: str = "/work") -> List[FileEntry]:
        """The entries of a directory, sorted by name."""
        d = self._sb.client._json("GET", self._q("files", path=path))
        return [FileEntry.from_json(e) for e in d["entries"]]

    def stat(self, path: str) -> FileEntry:
        """One entry; a symlink is reported as one."""
        return FileEntry.from_json(self._sb.client._json("GET", self._q("files/stat", path=path)))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, a symlink or an empty directory (any directory with `recursive`)."""
        self._sb.client._json("DELETE", self._q("files", path=path, recursive=recursive))

    def rename(self, src: str, dst: str) -> None:
        """Renames or moves `src` to `dst` (a file at `dst` is replaced)."""
        self._sb.client._json("POST", f"{self._base}/files/rename", {"from": src, "to": dst})

    def mkdir(self, path: str, parents: bool = False) -> None:
        """Makes a directory (with `parents`, missing parents too and no error if it exists)."""
        self._sb.client._json("POST", f"{self._base}/files/mkdir",
                              {"path": path, "parents": parents})

    def upload_dir(self, local_dir: Union[str, "os.PathLike[str]"],
                   path: str = "/work") -> ArchiveReport:
        """Sends the local directory `local_dir` (its contents) into `path` as a tar stream.

        Symlinks go in the archive as links; the server skips them (see `skipped`)."""
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as spool:
            with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in sorted(os.listdir(local_dir)):
                    tar.add(os.path.join(local_dir, name), arcname=name)
            size = spool.tell()
            spool.seek(0)
            req = urllib.request.Request(
                self._sb.client.url + self._q("archive", path=path), data=spool, method="PUT")
            req.add_header("Authorization", f"Bearer {self._sb.client.api_key}")
            req.add_header("Content-Type", "application/x-tar")
            req.add_header("Content-Length", str(size))
            try:
                with urllib.request.urlopen(req, timeout=self._sb.client.timeout) as r:
                    return ArchiveReport.from_json(json.loads(r.read()))
            except urllib.error.HTTPError as e:
                raise _error(e.code, e.read(), e.headers.get("Retry-After")) from None

    def download_dir(self, path: str, local_dir: Union[str, "os.PathLike[str]"]) -> List[str]:
        """Receives the directory `path` as a tar stream and extracts it into `local_dir`
        (made if missing), with tarfile's `data` filter: entries that would leave
        `local_dir`, links pointing out of it, devices are skipped. Returns what was
        skipped."""
        os.makedirs(local_dir, exist_ok=True)
        skipped: List[str] = []

        def keep(member: tarfile.TarInfo, dest: str) -> Optional[tarfile.TarInfo]:
            try:
                return tarfile.data_filter(member, dest)
            except tarfile.FilterError:
                skipped.append(member.name)
                return None

        with self._sb.client._open("GET", self._q("archive", path=path)) as r:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as spool:
                shutil.copyfileobj(r, spool, _CHUNK)
                spool.seek(0)
                with tarfile.open(fileobj=spool, mode="r:") as tar:
                    tar.extractall(local_dir, filter=keep)
        return skipped


class Sandbox:
    """A live sandbox. A context manager: leaving the `with` block destroys it."""

    def __init__(self, client: Cordon, info: Mapping[str, Any]) -> None:
        self.client = client
        self.info = dict(info)
        self.id: str = info["id"]
        self.files = Files(self)
        self._default_contexts: Dict[str, "Context"] = {}

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def _path(self, path: str) -> str:
        return f"/v1/sandboxes/{self.id}/files/" + urllib.parse.quote(path.lstrip("/"))

    def write_file(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        """Writes a file under /work."""
        body = data.encode() if isinstance(data, str) else data
        with self.client._open("PUT", self._path(path) + f"?mode={mode:o}", body,
                               "application/octet-stream"):
            pass

    def read_file(self, path: str) -> bytes:
        """Reads a file under /work."""
        with self.client._open("GET", self._path(path)) as r:
            return r.read()

    def _exec_payload(self, code: Command, lang: Optional[str], timeout: Optional[str],
                      stdin: Optional[str], env: Optional[Mapping[str, str]]) -> Dict[str, Any]:
        p = _command(code, lang)
        if timeout:
            p["timeout"] = timeout
        if stdin is not None:
            p["stdin"] = stdin
        if env:
            p["env"] = dict(env)
        return p

    def exec(self, code: Command, lang: Optional[str] = None, *, timeout: Optional[str] = None,
             stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
             background: bool = False, pty: Optional[Tuple[int, int]] = None) -> Any:
        """Runs a shell command (a string), code in `lang`, or an argv (a list); waits for it.

        With `background=True` it returns a `BackgroundExec` at once instead (its stdin goes
        through `send_stdin`); `pty=(rows, cols)` runs it on a pseudo-terminal of that size
        (background execs only)."""
        if background:
            if stdin is not None:
                raise ValueError("a background exec takes its stdin through send_stdin()")
            return self.exec_background(code, lang, env=env, timeout=timeout, pty=pty)
        if pty is not None:
            raise ValueError("a pseudo-terminal is for background execs: pass background=True")
        p = self._exec_payload(code, lang, timeout, stdin, env)
        return ExecResult.from_json(self.client._json("POST", f"/v1/sandboxes/{self.id}/exec", p))

    def exec_stream(self, code: Command, lang: Optional[str] = None, *,
                    timeout: Optional[str] = None, stdin: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None) -> Iterator[StreamEvent]:
        """Like `exec`, yielding stdout/stderr events as they come, then the outcome."""
        p = self._exec_payload(code, lang, timeout, stdin, env)
        return self.client._stream(f"/v1/sandboxes/{self.id}/exec", p)

    def exec_background(self, code: Command, lang: Optional[str] = None, *,
                        env: Optional[Mapping[str, str]] = None,
                        timeout: Optional[str] = None,
                        pty: Optional[Tuple[int, int]] = None) -> "BackgroundExec":
        """Starts a command in the background and returns its handle at once. With
        `pty=(rows, cols)` it runs on a pseudo-terminal: its stdin, stdout and stderr (all its
        output is stdout; `TERM` is `xterm-256color` unless `env` sets it); `resize` changes
        the size, and closing its stdin sends ^D."""
        p = self._exec_payload(code, lang, timeout, None, env)
        p["background"] = True
        if pty is not None:
            rows, cols = pty
            p["pty"] = {"rows": int(rows), "cols": int(cols)}
        info = self.client._json("POST", f"/v1/sandboxes/{self.id}/exec", p)
        return BackgroundExec(self, info)

    def execs(self) -> List["BackgroundExec"]:
        """The sandbox's background execs, running or ended, oldest first."""
        return [BackgroundExec(self, e)
                for e in self.client._json("GET", f"/v1/sandboxes/{self.id}/execs")["execs"]]

    def exec_handle(self, exec_id: str) -> "BackgroundExec":
        """The handle of background exec `exec_id` (from `execs()` or an earlier start)."""
        return BackgroundExec(self, {"id": exec_id})

    def refresh(self) -> Dict[str, Any]:
        """Reads its current state (live, paused, ...) into `info` and returns it."""
        self.info = self.client._json("GET", f"/v1/sandboxes/{self.id}")
        return self.info

    def pause(self, to_disk: bool = False) -> Dict[str, Any]:
        """Stops its processes where they are (no CPU); its TTL clock stands still.

        `to_disk=True` (microvm tier) saves the whole sandbox to disk and frees its memory:
        it is listed with `on_disk` and `on_disk_bytes`, survives a server restart, and
        `resume()` restores it."""
        body = {"to_disk": True} if to_disk else {}
        self.info = self.client._json("POST", f"/v1/sandboxes/{self.id}/pause", body)
        return self.info

    def resume(self) -> Dict[str, Any]:
        """Continues a paused sandbox's processes."""
        self.info = self.client._json("POST", f"/v1/sandboxes/{self.id}/resume", {})
        return self.info

    def update(self, *, ttl: Optional[str] = None,
               idle_timeout: Optional[str] = None) -> Dict[str, Any]:
        """Changes its TTL (from its creation) or idle timeout, within the server's maxima."""
        p = {k: v for k, v in {"ttl": ttl, "idle_timeout": idle_timeout}.items()
             if v is not None}
        self.info = self.client._json("PATCH", f"/v1/sandboxes/{self.id}", p)
        return self.info

    def destroy(self) -> None:
        """Destroys the sandbox; calling it again is fine."""
        self.client._json("DELETE", f"/v1/sandboxes/{self.id}")

    # -- code contexts -----------------------------------------------------------------

    def create_context(self, lang: str = "python") -> "Context":
        """Starts a long-lived interpreter (python or javascript) whose variables, imports
        and open files persist from one cell to the next."""
        info = self.client._json("POST", f"/v1/sandboxes/{self.id}/contexts", {"lang": lang})
        return Context(self, info)

    def contexts(self) -> List["Context"]:
        """The sandbox's code contexts, oldest first."""
        return [Context(self, c) for c in
                self.client._json("GET", f"/v1/sandboxes/{self.id}/contexts")["contexts"]]

    def default_context(self, lang: str = "python") -> "Context":
        """The sandbox's default context of `lang` (made at its first use)."""
        c = self._default_contexts.get(lang)
        if c is None:
            info = self.client._json("POST", f"/v1/sandboxes/{self.id}/contexts",
                                     {"lang": lang, "default": True})
            c = self._default_contexts[lang] = Context(self, info)
        return c

    def run_code(self, code: str, context: Optional["Context"] = None, lang: str = "python",
                 *, timeout: Optional[Union[str, float]] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        """Runs a cell in `context` (default: the sandbox's default context of `lang`).

        `timeout` ("5s" or seconds) interrupts the cell without losing the context;
        `on_stdout`/`on_stderr` receive output as it comes."""
        ctx = context if context is not None else self.default_context(lang)
        return ctx.run(code, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)


class Context:
    """A code context: a long-lived interpreter in a sandbox. `close()` ends it."""

    def __init__(self, sandbox: Sandbox, info: Mapping[str, Any]) -> None:
        self.sandbox = sandbox
        self.info = dict(info)
        self.id: str = info["id"]
        self.lang: str = info.get("lang", "python")

    def _route(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.sandbox.id}/contexts/{self.id}{rest}"

    def _payload(self, code: str, timeout: Optional[Union[str, float]]) -> Dict[str, Any]:
        p: Dict[str, Any] = {"code": code}
        if timeout is not None:
            p["timeout"] = timeout
        return p

    def run(self, code: str, *, timeout: Optional[Union[str, float]] = None,
            on_stdout: Optional[Callable[[str], Any]] = None,
            on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        """Runs one cell and returns what it did (see `Execution`)."""
        if on_stdout is None and on_stderr is None:
            return Execution.from_json(
                self.sandbox.client._json("POST", self._route("/run"),
                                          self._payload(code, timeout)))
        for ev in self.run_stream(code, timeout=timeout):
            if ev.type == "stdout" and on_stdout is not None:
                on_stdout(ev.data)
            elif ev.type == "stderr" and on_stderr is not None:
                on_stderr(ev.data)
            elif ev.type == "result" and ev.result is not None:
                return ev.result
        raise CordonError(500, "internal", "the stream ended without the cell's result")

    def run_stream(self, code: str, *,
                   timeout: Optional[Union[str, float]] = None) -> Iterator[StreamEvent]:
        """Runs one cell, yielding stdout/stderr events as they come, then a result event."""
        return self.sandbox.client._stream(self._route("/run"), self._payload(code, timeout))

    def restart(self) -> Dict[str, Any]:
        """Starts its interpreter again: every variable and import is gone."""
        self.info = self.sandbox.client._json("POST", self._route("/restart"), {})
        return self.info

    def close(self) -> None:
        """Ends the context (its interpreter is killed)."""
        self.sandbox.client._json("DELETE", self._route())
        self.sandbox._default_contexts = {
            k: v for k, v in self.sandbox._default_contexts.items() if v.id != self.id}

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BackgroundExec:
    """A background exec: attach to its output, write to its stdin, stop it.

    Iterating yields its output events (everything since its start that the sandbox kept,
    then live output) and ends with its outcome event; `wait()` returns the outcome.
    """

    def __init__(self, sandbox: Sandbox, info: Mapping[str, Any]) -> None:
        self.sandbox = sandbox
        self.info = dict(info)
        self.id: str = info["id"]

    def _route(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.sandbox.id}/execs/{self.id}{rest}"

    def __iter__(self) -> Iterator[StreamEvent]:
        return self.sandbox.client._stream(self._route(), None)

    def output(self) -> Iterator[StreamEvent]:
        """Attaches: replayed output, live output, then the outcome event."""
        return iter(self)

    def wait(self) -> ExecResult:
        """Waits for its end; its stdout and stderr are what the sandbox kept."""
        return ExecResult.from_json(
            self.sandbox.client._json("GET", self._route("?stream=false")))

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> None:
        """Writes to its stdin; `close` ends the stdin after these bytes."""
        if isinstance(data, bytes):
            import base64
            p: Dict[str, Any] = {"data_base64": base64.b64encode(data).decode()}
        else:
            p = {"data": data}
        p["close"] = close
        self.sandbox.client._json("POST", self._route("/stdin"), p)

    def resize(self, rows: int, cols: int) -> Dict[str, Any]:
        """Sets its pseudo-terminal's size (it gets SIGWINCH); an exec started without `pty`
        raises `Unsupported`."""
        self.info = self.sandbox.client._json(
            "POST", self._route("/resize"), {"rows": int(rows), "cols": int(cols)})
        return self.info

    def kill(self, force: bool = False) -> Dict[str, Any]:
        """SIGTERM to its process tree, SIGKILL after the server's grace (`force`: at once)."""
        q = "?signal=kill" if force else ""
        return self.sandbox.client._json("DELETE", self._route(q))

    def status(self) -> Dict[str, Any]:
        """Its entry in the sandbox's list (state, exit code)."""
        for e in self.sandbox.client._json(
                "GET", f"/v1/sandboxes/{self.sandbox.id}/execs")["execs"]:
            if e["id"] == self.id:
                return e
        raise NotFound(404, "not_found", f"no background exec {self.id}")
