"""Typed models of the API's answers (docs/openapi.json's schemas).

Each is a dataclass read from the JSON answer by `from_json`; fields the server adds later
are kept in `raw`, so an older client still sees them. Times are milliseconds since the Unix
epoch (`*_ms`), durations microseconds (`*_us`), sizes bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

Json = Mapping[str, Any]
_T = TypeVar("_T")


def _read(cls: Type[_T], d: Json) -> _T:
    """A dataclass of plain fields, each read by its name (left at its default when absent)."""
    return cls(**{f.name: d[f.name] for f in fields(cls)  # type: ignore[arg-type]
                  if f.name in d})


@dataclass
class Limits:
    """A sandbox's limits; `None` where the server applies its default."""

    timeout_ms: Optional[int] = None
    memory_bytes: Optional[int] = None
    pids: Optional[int] = None
    disk_bytes: Optional[int] = None
    tmp_bytes: Optional[int] = None
    cpus: Optional[float] = None
    stdout_bytes: Optional[int] = None
    stderr_bytes: Optional[int] = None
    open_files: Optional[int] = None
    fuel: Optional[int] = None

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "Limits":
        d = d or {}
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Usage:
    """What an exec used."""

    cpu_time_us: int = 0
    peak_memory_bytes: int = 0
    wall_time_us: int = 0

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "Usage":
        d = d or {}
        return cls(cpu_time_us=d.get("cpu_time_us", 0),
                   peak_memory_bytes=d.get("peak_memory_bytes", 0),
                   wall_time_us=d.get("wall_time_us", 0))


@dataclass
class Timings:
    """Where an exec's time went, in microseconds (see docs/openapi.json)."""

    start_us: int = 0
    run_us: int = 0
    destroy_us: int = 0
    program_us: int = 0

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "Timings":
        d = d or {}
        return cls(start_us=d.get("start_us", 0), run_us=d.get("run_us", 0),
                   destroy_us=d.get("destroy_us", 0), program_us=d.get("program_us", 0))


@dataclass
class Finding:
    """A credential format or known secret found in what left the sandbox (never the value):
    `kind` (known_secret, private_key, github_token, ...), where (`stream` or `file`), its
    byte `offset` and `len`, and whether it was `redacted` in the output."""

    kind: str
    offset: int
    len: int
    redacted: bool
    stream: Optional[str] = None
    file: Optional[str] = None
    name: Optional[str] = None

    @classmethod
    def from_json(cls, d: Json) -> "Finding":
        return _read(cls, d)


@dataclass
class EgressEvent:
    """One egress decision of the sandbox's proxy: `decision` (allow, deny, exfiltration,
    limit, error, closed, truncated), `kind` (http, connect, https, connection), the `rule`
    that decided and `reason`; `grant` names a grant whose secret was added. `path` never
    carries the query; no header value is ever kept."""

    time_ms: int
    sandbox: str
    conn: int
    kind: str
    decision: str
    count: int = 1
    last_ms: Optional[int] = None
    host: Optional[str] = None
    port: Optional[int] = None
    addr: Optional[str] = None
    method: Optional[str] = None
    path: Optional[str] = None
    status: Optional[int] = None
    terminated: Optional[bool] = None
    rule: Optional[str] = None
    reason: Optional[str] = None
    grant: Optional[str] = None
    bytes_up: Optional[int] = None
    bytes_down: Optional[int] = None
    pod: Optional[str] = None

    @classmethod
    def from_json(cls, d: Json) -> "EgressEvent":
        return _read(cls, d)


@dataclass
class Details:
    """An outcome's details (`ExecResult.extra`): findings in what left the sandbox, its
    egress decisions since the last outcome, how the sandbox failed and the microVM's
    accelerator, where the tier knows."""

    findings: List[Finding] = field(default_factory=list)
    egress: List[EgressEvent] = field(default_factory=list)
    failure: Optional[str] = None
    accelerator: Optional[str] = None

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "Details":
        d = d or {}
        return cls(findings=[Finding.from_json(f) for f in d.get("findings", [])],
                   egress=[EgressEvent.from_json(e) for e in d.get("egress", [])],
                   failure=d.get("failure"), accelerator=d.get("accelerator"))


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
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    weakened: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    #: Findings, egress decisions and failure details.
    extra: Details = field(default_factory=Details)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.termination == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Json) -> "ExecResult":
        return cls(
            termination=d["termination"], exit_code=d.get("exit_code"), signal=d.get("signal"),
            stdout=d.get("stdout", ""), stderr=d.get("stderr", ""),
            stdout_truncated=d.get("stdout_truncated", False),
            stderr_truncated=d.get("stderr_truncated", False), tier=d.get("tier", ""),
            usage=Usage.from_json(d.get("usage")), timings=Timings.from_json(d.get("timings")),
            weakened=list(d.get("weakened", [])), warnings=list(d.get("warnings", [])),
            extra=Details.from_json(d.get("extra")), raw=dict(d))


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
    context: str = ""
    duration_us: int = 0
    warnings: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Json) -> "Execution":
        e = d.get("error")
        results = d.get("results", [])
        main = next((r["data"] for r in results if r.get("main")), None)
        logs = d.get("logs", {})
        return cls(
            status=d["status"], text=d.get("text"), results=[r["data"] for r in results],
            logs={"stdout": list(logs.get("stdout", [])), "stderr": list(logs.get("stderr", []))},
            error=ExecutionError(e["name"], e["value"], e.get("traceback", "")) if e else None,
            execution_count=d.get("execution_count", 0), restarted=d.get("restarted", False),
            main_result=main, context=d.get("context", ""),
            duration_us=d.get("duration_us", 0), warnings=list(d.get("warnings", [])),
            raw=dict(d))


@dataclass
class StreamEvent:
    """One streamed event: `type` is stdout, stderr, outcome (then `outcome` is set) or,
    for a code cell, result (then `result` is set)."""

    type: str
    data: str = ""
    outcome: Optional[ExecResult] = None
    result: Optional[Execution] = None


@dataclass
class SandboxInfo:
    """A sandbox as the server lists it. `state`: live, paused, destroying, destroyed."""

    id: str
    tier: str
    state: str
    created_ms: int = 0
    expires_ms: int = 0
    idle_timeout_ms: int = 0
    last_used_ms: int = 0
    limits: Limits = field(default_factory=Limits)
    allow_hosts: List[str] = field(default_factory=list)
    source: str = ""
    start_us: int = 0
    busy: bool = False
    paused: bool = False
    on_disk: bool = False
    on_disk_bytes: Optional[int] = None
    labels: Dict[str, str] = field(default_factory=dict)
    #: What its TTL or idle timeout does: "destroy", "pause" or "pause_files".
    on_timeout: str = "destroy"
    #: How many times a resume started it again from its files (`pause(files_only=True)`).
    restarts: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Json) -> "SandboxInfo":
        return cls(
            id=d["id"], tier=d.get("tier", ""), state=d.get("state", ""),
            created_ms=d.get("created_ms", 0), expires_ms=d.get("expires_ms", 0),
            idle_timeout_ms=d.get("idle_timeout_ms", 0), last_used_ms=d.get("last_used_ms", 0),
            limits=Limits.from_json(d.get("limits")), allow_hosts=list(d.get("allow_hosts", [])),
            source=d.get("source", ""), start_us=d.get("start_us", 0),
            busy=d.get("busy", False), paused=d.get("paused", False),
            on_disk=d.get("on_disk", False), on_disk_bytes=d.get("on_disk_bytes"),
            labels=dict(d.get("labels", {})), on_timeout=d.get("on_timeout", "destroy"),
            restarts=d.get("restarts", 0), raw=dict(d))


@dataclass
class SandboxList:
    """Your sandboxes, and the disk those paused to disk hold in all."""

    sandboxes: List[SandboxInfo]
    on_disk_bytes: int = 0

    @classmethod
    def from_json(cls, d: Json) -> "SandboxList":
        return cls([SandboxInfo.from_json(s) for s in d.get("sandboxes", [])],
                   d.get("on_disk_bytes", 0))


@dataclass
class Destroyed:
    """A destroy's answer: `already` when an earlier destroy (or the reaper) had done it."""

    id: str
    state: str
    already: bool

    @classmethod
    def from_json(cls, d: Json) -> "Destroyed":
        return cls(d["id"], d.get("state", "destroyed"), d.get("already", False))


@dataclass
class PoolStatus:
    size: int
    ready: int


@dataclass
class Health:
    """The server's health. `version`, `tiers` (tier -> status), `pools` and
    `live_sandboxes` come only with a valid key (or where the operator shows them to all)."""

    status: str
    version: Optional[str] = None
    tiers: Dict[str, Any] = field(default_factory=dict)
    pools: Dict[str, PoolStatus] = field(default_factory=dict)
    live_sandboxes: Optional[int] = None

    @classmethod
    def from_json(cls, d: Json) -> "Health":
        pools = {t: PoolStatus(p.get("size", 0), p.get("ready", 0))
                 for t, p in (d.get("pools") or {}).items()}
        return cls(d["status"], d.get("version"), dict(d.get("tiers") or {}), pools,
                   d.get("live_sandboxes"))


@dataclass
class FileWritten:
    """A file upload's answer: the sandbox path and how many bytes were written."""

    path: str
    bytes: int

    @classmethod
    def from_json(cls, d: Json) -> "FileWritten":
        return cls(d["path"], d["bytes"])


@dataclass
class FileEntry:
    """One directory entry or what `stat` found (a symlink is reported, never followed).
    `path` is set for `stat`."""

    name: str
    kind: str  # file, dir, symlink, fifo, socket, char_device, block_device
    size: int
    mode: int
    mtime_ms: int
    path: Optional[str] = None
    #: Where a symlink points, its text as written (never followed); None for other kinds.
    target: Optional[str] = None
    #: The user metadata on a file or directory (its `user.e2b.*` extended attributes, by
    #: key); empty when it has none.
    metadata: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> "FileEntry":
        return cls(name=d["name"], kind=d["kind"], size=d["size"], mode=d["mode"],
                   mtime_ms=d["mtime_ms"], path=d.get("path"), target=d.get("target"),
                   metadata=dict(d.get("metadata") or {}))


@dataclass
class Listing:
    """A directory's entries, sorted by name; `truncated` when it holds more than 10,000."""

    path: str
    entries: List[FileEntry]
    truncated: bool = False

    @classmethod
    def from_json(cls, d: Json) -> "Listing":
        return cls(d["path"], [FileEntry.from_json(e) for e in d["entries"]],
                   d.get("truncated", False))


@dataclass
class FileDone:
    """What a remove, rename or mkdir did (`to` for a rename)."""

    op: str
    path: str
    to: Optional[str] = None

    @classmethod
    def from_json(cls, d: Json) -> "FileDone":
        return cls(d["op"], d["path"], d.get("to"))


@dataclass
class ArchiveReport:
    """What moving a directory as a tar stream did; `skipped` lists (path, reason)."""

    files: int
    dirs: int
    bytes: int
    symlinks: int = 0
    skipped: List[Tuple[str, str]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Json) -> "ArchiveReport":
        return cls(files=d["files"], dirs=d["dirs"], bytes=d["bytes"],
                   symlinks=d.get("symlinks", 0),
                   skipped=[(s["path"], s["reason"]) for s in d.get("skipped", [])])


@dataclass
class ExecInfo:
    """A background exec as listed: `state` running or exited; `pty` is (rows, cols) for
    one on a terminal."""

    id: str
    command: str = ""
    state: str = ""
    started_ms: int = 0
    ended_ms: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    pty: Optional[Tuple[int, int]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Json) -> "ExecInfo":
        p = d.get("pty")
        return cls(id=d["id"], command=d.get("command", ""), state=d.get("state", ""),
                   started_ms=d.get("started_ms", 0), ended_ms=d.get("ended_ms"),
                   exit_code=d.get("exit_code"), signal=d.get("signal"),
                   pty=(p["rows"], p["cols"]) if p else None, raw=dict(d))


@dataclass
class StdinWritten:
    """A stdin write's answer: bytes written, and whether the stdin is now closed."""

    bytes: int
    closed: bool

    @classmethod
    def from_json(cls, d: Json) -> "StdinWritten":
        return cls(d.get("bytes", 0), d.get("closed", False))


@dataclass
class ContextInfo:
    """A code context. `state`: ready, running (a cell runs), dead, deleted."""

    id: str
    lang: str
    state: str
    default: bool = False
    created_ms: int = 0
    started_ms: int = 0
    execution_count: int = 0
    version: str = ""
    restarts: int = 0
    #: The directory its code runs in.
    cwd: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Json) -> "ContextInfo":
        return cls(id=d["id"], lang=d.get("lang", "python"), state=d.get("state", ""),
                   default=d.get("default", False), created_ms=d.get("created_ms", 0),
                   started_ms=d.get("started_ms", 0),
                   execution_count=d.get("execution_count", 0), version=d.get("version", ""),
                   restarts=d.get("restarts", 0), cwd=d.get("cwd", ""), raw=dict(d))


@dataclass
class VolumeMountInfo:
    """A sandbox mounting a volume now."""

    sandbox: str
    read_only: bool = False
    since_ms: int = 0


@dataclass
class Volume:
    """A volume: `size` its quota, `used` the server's disk it holds, `mounts` who mounts it."""

    name: str
    size: int
    used: int = 0
    created_ms: int = 0
    mounts: List[VolumeMountInfo] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Json) -> "Volume":
        return cls(d["name"], d["size"], d.get("used", 0), d.get("created_ms", 0),
                   [VolumeMountInfo(m.get("sandbox", ""), m.get("read_only", False),
                                    m.get("since_ms", 0)) for m in d.get("mounts", [])])


@dataclass
class VolumeList:
    """Your volumes and your ceiling: `used_bytes` (their sizes added up) counts against
    `quota_bytes`; `allocated_bytes` is the server's disk they hold."""

    volumes: List[Volume]
    used_bytes: int = 0
    quota_bytes: int = 0
    allocated_bytes: int = 0
    max_volumes: int = 0

    @classmethod
    def from_json(cls, d: Json) -> "VolumeList":
        return cls([Volume.from_json(v) for v in d.get("volumes", [])], d.get("used_bytes", 0),
                   d.get("quota_bytes", 0), d.get("allocated_bytes", 0),
                   d.get("max_volumes", 0))


@dataclass
class VolumeDeleted:
    name: str
    deleted: bool

    @classmethod
    def from_json(cls, d: Json) -> "VolumeDeleted":
        return cls(d["name"], d.get("deleted", False))


@dataclass
class Snapshot:
    """A snapshot you keep: `mode` full (memory, processes, files) or filesystem (files;
    processes start fresh), `bytes` counted in your `max_snapshot_bytes`, `source` the
    sandbox it was taken of."""

    id: str
    tier: str
    mode: str
    bytes: int = 0
    source: str = ""
    created_ms: int = 0
    name: Optional[str] = None
    template: Optional[str] = None

    @classmethod
    def from_json(cls, d: Json) -> "Snapshot":
        return cls(d["id"], d.get("tier", ""), d.get("mode", ""), d.get("bytes", 0),
                   d.get("source", ""), d.get("created_ms", 0), d.get("name"),
                   d.get("template"))


@dataclass
class SnapshotStarts:
    """Sandboxes started from a snapshot (or a fork): those that started, and the errors
    (`{"code", "message", "fix"}`) of those that did not."""

    snapshot: str
    sandboxes: List[SandboxInfo]
    errors: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Json) -> "SnapshotStarts":
        return cls(d.get("snapshot", ""), [SandboxInfo.from_json(s) for s in d["sandboxes"]],
                   list(d.get("errors", [])))


@dataclass
class AuditEvent:
    """One audit row: `kind` (policy, create, exec, file_put, egress, destroy, ...),
    `decision` (allow/deny, a destroy's reason, ...) and the row's `detail`."""

    id: int
    time_ms: int
    kind: str
    tenant: Optional[str] = None
    sandbox: Optional[str] = None
    decision: Optional[str] = None
    tier: Optional[str] = None
    detail: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> "AuditEvent":
        return cls(id=d["id"], time_ms=d.get("time_ms", 0), kind=d.get("kind", ""),
                   tenant=d.get("tenant"), sandbox=d.get("sandbox"), decision=d.get("decision"),
                   tier=d.get("tier"), detail=dict(d.get("detail") or {}))


@dataclass
class OidcConfiguration:
    """The OIDC discovery document of the tokens the server mints for sandboxes."""

    issuer: str
    jwks_uri: str
    introspection_endpoint: str = ""
    id_token_signing_alg_values_supported: List[str] = field(default_factory=list)
    claims_supported: List[str] = field(default_factory=list)
    response_types_supported: List[str] = field(default_factory=list)
    subject_types_supported: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Json) -> "OidcConfiguration":
        return cls(d["issuer"], d["jwks_uri"], d.get("introspection_endpoint", ""),
                   list(d.get("id_token_signing_alg_values_supported", [])),
                   list(d.get("claims_supported", [])),
                   list(d.get("response_types_supported", [])),
                   list(d.get("subject_types_supported", [])), dict(d))


@dataclass
class Jwks:
    """The public keys minted tokens verify with (each a JWK: kty, crv, x, y, kid, ...)."""

    keys: List[Dict[str, Any]]

    @classmethod
    def from_json(cls, d: Json) -> "Jwks":
        return cls([dict(k) for k in d.get("keys", [])])


@dataclass
class TokenInfo:
    """Token introspection (RFC 7662): `active`, and for an active token its claims."""

    active: bool
    claims: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> "TokenInfo":
        return cls(bool(d.get("active")), {k: v for k, v in d.items() if k != "active"})


@dataclass
class MetricSample:
    """One sample of a sandbox's figures (`Sandbox.metrics()`), taken every 5 s from its
    tier's own accounting: CPU (its limit rounded up, and the share of it used since the
    sample before, in percent), memory charged (page cache included) and its limit, the
    page cache, bytes used on its workspace (0 where the tier cannot tell: microvm) and
    its disk limit. `at_ms` is milliseconds since the Unix epoch."""

    at_ms: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int

    @classmethod
    def from_json(cls, d: Json) -> "MetricSample":
        return cls(d["at_ms"], d["cpu_count"], float(d["cpu_used_pct"]), d["mem_used"],
                   d["mem_total"], d["mem_cache"], d["disk_used"], d["disk_total"])
