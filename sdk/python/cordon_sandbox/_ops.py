"""Every API request, described once (routes, bodies, how the answer is read); the sync and
the async clients both send these."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from ._transport import Body, Call, Data
from .models import (ArchiveReport, AuditEvent, ContextInfo, Destroyed, ExecInfo, ExecResult,
                     Execution, FileDone, FileEntry, FileWritten, Health, Jwks, Limits, Listing,
                     MetricSample, OidcConfiguration, SandboxInfo, SandboxList, Snapshot, SnapshotStarts,
                     StdinWritten, TokenInfo, Volume, VolumeDeleted, VolumeList)

T = TypeVar("T")
Command = Union[str, Sequence[str]]
Duration = Union[str, int, float]
LimitsArg = Union[Limits, Mapping[str, Any], None]
VolumeArg = Union[str, Mapping[str, Any]]


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _sb(sid: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{_q(sid)}{rest}"


def _none(_: Any) -> None:
    return None


def _ident(d: Any) -> Any:
    return d


def _list(key: str, parse: Callable[[Any], T]) -> Callable[[Any], List[T]]:
    return lambda d: [parse(x) for x in d[key]]


def _some(d: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields that were given (None and empty collections are left out)."""
    return {k: v for k, v in d.items() if v is not None and v != [] and v != {} and v != ()}


def _limits(limits: LimitsArg) -> Optional[Dict[str, Any]]:
    if limits is None:
        return None
    return limits.to_json() if isinstance(limits, Limits) else dict(limits)


def command(code: Command, lang: Optional[str]) -> Dict[str, Any]:
    """A string is code in `lang` (sh when none is given); a list is an argv."""
    if isinstance(code, str):
        return {"lang": lang or "sh", "code": code}
    if lang is not None:
        raise ValueError("lang applies to code given as a string, not to an argv list")
    return {"argv": list(code)}


def volume_mount(v: VolumeArg) -> Dict[str, Any]:
    """`"name:/work/path"`, `"name:/work/path:ro"` or `{"name", "path", "read_only"}`."""
    if isinstance(v, str):
        name, _, rest = v.partition(":")
        path, ro = rest, False
        if rest.endswith(":ro") or rest.endswith(":rw"):
            path, ro = rest[:-3], rest.endswith(":ro")
        return {"name": name, "path": path, "read_only": ro}
    return dict(v)


# -- the service ---------------------------------------------------------------------------

def health() -> Call[Health]:
    return Call("GET", "/v1/health", Health.from_json)


def metrics() -> Call[None]:
    return Call("GET", "/metrics", _none)


def spec(*, tier: Optional[str], allow_hosts: Sequence[str], deny_hosts: Sequence[str],
         ttl: Optional[Duration], idle_timeout: Optional[Duration], limits: LimitsArg,
         env: Optional[Mapping[str, str]], trust: Optional[str], autonomy: Optional[str],
         shape: Optional[str], grants: Sequence[str], template: Optional[str],
         labels: Optional[Mapping[str, str]], volumes: Sequence[VolumeArg],
         allow_weaker: Sequence[str], on_timeout: Optional[str] = None) -> Dict[str, Any]:
    """A create's body (CreateRequest)."""
    return _some({
        "on_timeout": on_timeout,
        "tier": tier, "allow_hosts": list(allow_hosts), "deny_hosts": list(deny_hosts),
        "ttl": ttl, "idle_timeout": idle_timeout, "limits": _limits(limits),
        "env": dict(env) if env else None, "trust": trust, "autonomy": autonomy,
        "shape": shape, "grants": list(grants), "template": template,
        "labels": dict(labels) if labels else None,
        "volumes": [volume_mount(v) for v in volumes], "allow_weaker": list(allow_weaker)})


def create_sandbox(body: Dict[str, Any]) -> Call[SandboxInfo]:
    return Call("POST", "/v1/sandboxes", SandboxInfo.from_json, json=body)


def run(code: Command, lang: Optional[str], *, tier: Optional[str], timeout: Optional[Duration],
        stdin: Optional[Union[str, bytes]], files: Optional[Mapping[str, Union[bytes, str]]],
        limits: LimitsArg, env: Optional[Mapping[str, str]], allow_hosts: Sequence[str],
        deny_hosts: Sequence[str], grants: Sequence[str], trust: Optional[str],
        autonomy: Optional[str], shape: Optional[str], template: Optional[str],
        allow_weaker: Sequence[str], stream: bool = False) -> Call[ExecResult]:
    body = command(code, lang if isinstance(code, str) else None)
    body.update(_stdin(stdin))
    body.update(_some({
        "tier": tier, "timeout": timeout, "limits": _limits(limits),
        "env": dict(env) if env else None, "allow_hosts": list(allow_hosts),
        "deny_hosts": list(deny_hosts), "grants": list(grants), "trust": trust,
        "autonomy": autonomy, "shape": shape, "template": template,
        "allow_weaker": list(allow_weaker),
        "files": [{"path": p, "content_base64": base64.b64encode(
            d.encode() if isinstance(d, str) else d).decode()}
            for p, d in (files or {}).items()]}))
    if stream:
        body["stream"] = True
    return Call("POST", "/v1/run", ExecResult.from_json, json=body)


def list_sandboxes(labels: Optional[Mapping[str, str]]) -> Call[SandboxList]:
    params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    return Call("GET", "/v1/sandboxes", SandboxList.from_json, params=params)


def audit(*, sandbox: Optional[str], kind: Optional[str], after_id: Optional[int],
          since_ms: Optional[int], limit: Optional[int]) -> Call[List[AuditEvent]]:
    q = _some({"sandbox": sandbox, "kind": kind, "after_id": after_id, "since_ms": since_ms,
               "limit": limit})
    return Call("GET", "/v1/audit", _list("events", AuditEvent.from_json),
                params=[(k, str(v)) for k, v in q.items()])


def introspect_token(token: str) -> Call[TokenInfo]:
    return Call("POST", "/v1/tokens/introspect", TokenInfo.from_json, json={"token": token})


def openid_configuration() -> Call[OidcConfiguration]:
    return Call("GET", "/.well-known/openid-configuration", OidcConfiguration.from_json)


def jwks() -> Call[Jwks]:
    return Call("GET", "/.well-known/jwks.json", Jwks.from_json)


def raw(method: str, path: str, body: Any) -> Call[Any]:
    return Call(method, path, _ident, json=body)


# -- volumes -------------------------------------------------------------------------------

def create_volume(name: str, size: Union[int, str]) -> Call[Volume]:
    return Call("POST", "/v1/volumes", Volume.from_json, json={"name": name, "size": size})


def volumes() -> Call[VolumeList]:
    return Call("GET", "/v1/volumes", VolumeList.from_json)


def volume(name: str) -> Call[Volume]:
    return Call("GET", "/v1/volumes/" + _q(name), Volume.from_json)


def delete_volume(name: str) -> Call[VolumeDeleted]:
    return Call("DELETE", "/v1/volumes/" + _q(name), VolumeDeleted.from_json)


# -- snapshots -----------------------------------------------------------------------------

def create_snapshot(sid: str, name: Optional[str], mode: Optional[str]) -> Call[Snapshot]:
    return Call("POST", _sb(sid, "/snapshots"), Snapshot.from_json,
                json=_some({"name": name, "mode": mode}))


def snapshots() -> Call[List[Snapshot]]:
    return Call("GET", "/v1/snapshots", _list("snapshots", Snapshot.from_json))


def snapshot(key: str) -> Call[Snapshot]:
    return Call("GET", "/v1/snapshots/" + _q(key), Snapshot.from_json)


def delete_snapshot(key: str) -> Call[None]:
    return Call("DELETE", "/v1/snapshots/" + _q(key), _none)


def _starts(count: int, ttl: Optional[Duration], idle_timeout: Optional[Duration],
            labels: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    return _some({"count": count, "ttl": ttl, "idle_timeout": idle_timeout,
                  "labels": dict(labels) if labels else None})


def start_from_snapshot(key: str, count: int, ttl: Optional[Duration],
                        idle_timeout: Optional[Duration],
                        labels: Optional[Mapping[str, str]]) -> Call[SnapshotStarts]:
    return Call("POST", "/v1/snapshots/" + _q(key) + "/sandboxes", SnapshotStarts.from_json,
                json=_starts(count, ttl, idle_timeout, labels))


def fork(sid: str, count: int, ttl: Optional[Duration], idle_timeout: Optional[Duration],
         labels: Optional[Mapping[str, str]]) -> Call[SnapshotStarts]:
    return Call("POST", _sb(sid, "/fork"), SnapshotStarts.from_json,
                json=_starts(count, ttl, idle_timeout, labels))


# -- one sandbox ---------------------------------------------------------------------------

def info(sid: str) -> Call[SandboxInfo]:
    return Call("GET", _sb(sid), SandboxInfo.from_json)


def sandbox_metrics(sid: str, start_ms: Optional[int],
                    end_ms: Optional[int]) -> Call[List[MetricSample]]:
    params = [(k, str(v)) for k, v in (("start_ms", start_ms), ("end_ms", end_ms))
              if v is not None]
    return Call("GET", _sb(sid, "/metrics"), _list("samples", MetricSample.from_json),
                params=params)


def destroy(sid: str) -> Call[Destroyed]:
    return Call("DELETE", _sb(sid), Destroyed.from_json)


def pause(sid: str, to_disk: bool, files_only: bool = False) -> Call[SandboxInfo]:
    body = {}
    if to_disk:
        body["to_disk"] = True
    if files_only:
        body["files_only"] = True
    return Call("POST", _sb(sid, "/pause"), SandboxInfo.from_json, json=body)


def resume(sid: str) -> Call[SandboxInfo]:
    return Call("POST", _sb(sid, "/resume"), SandboxInfo.from_json, json={})


def update(sid: str, ttl: Optional[Duration], idle_timeout: Optional[Duration]) -> Call[SandboxInfo]:
    return Call("PATCH", _sb(sid), SandboxInfo.from_json,
                json=_some({"ttl": ttl, "idle_timeout": idle_timeout}))


def _stdin(stdin: Optional[Union[str, bytes]]) -> Dict[str, Any]:
    if stdin is None:
        return {}
    if isinstance(stdin, str):
        return {"stdin": stdin}
    return {"stdin_base64": base64.b64encode(stdin).decode()}


def exec_body(code: Command, lang: Optional[str], *, timeout: Optional[Duration],
              stdin: Optional[Union[str, bytes]], env: Optional[Mapping[str, str]],
              cwd: Optional[str]) -> Dict[str, Any]:
    body = command(code, lang)
    body.update(_stdin(stdin))
    body.update(_some({"timeout": timeout, "env": dict(env) if env else None, "cwd": cwd}))
    return body


def exec_(sid: str, body: Dict[str, Any]) -> Call[ExecResult]:
    return Call("POST", _sb(sid, "/exec"), ExecResult.from_json, json=body)


def exec_background(sid: str, body: Dict[str, Any],
                    pty: Optional[Tuple[int, int]]) -> Call[ExecInfo]:
    body = dict(body, background=True)
    if pty is not None:
        rows, cols = pty
        body["pty"] = {"rows": int(rows), "cols": int(cols)}
    return Call("POST", _sb(sid, "/exec"), ExecInfo.from_json, json=body)


def execs(sid: str) -> Call[List[ExecInfo]]:
    return Call("GET", _sb(sid, "/execs"), _list("execs", ExecInfo.from_json))


def _ex(sid: str, eid: str, rest: str = "") -> str:
    return _sb(sid, f"/execs/{_q(eid)}{rest}")


def attach(sid: str, eid: str) -> Call[None]:
    return Call("GET", _ex(sid, eid), _none)


def wait(sid: str, eid: str) -> Call[ExecResult]:
    return Call("GET", _ex(sid, eid), ExecResult.from_json, params=[("stream", "false")])


def send_stdin(sid: str, eid: str, data: Union[str, bytes], close: bool) -> Call[StdinWritten]:
    if isinstance(data, str):
        body: Dict[str, Any] = {"data": data}
    else:
        body = {"data_base64": base64.b64encode(data).decode()}
    body["close"] = close
    return Call("POST", _ex(sid, eid, "/stdin"), StdinWritten.from_json, json=body)


def resize(sid: str, eid: str, rows: int, cols: int) -> Call[ExecInfo]:
    return Call("POST", _ex(sid, eid, "/resize"), ExecInfo.from_json,
                json={"rows": int(rows), "cols": int(cols)})


def kill(sid: str, eid: str, force: bool) -> Call[ExecInfo]:
    return Call("DELETE", _ex(sid, eid), ExecInfo.from_json,
                params=[("signal", "kill")] if force else [])


# -- files ---------------------------------------------------------------------------------

def _file(sid: str, path: str) -> str:
    return _sb(sid, "/files/" + urllib.parse.quote(path.lstrip("/")))


def write_file(sid: str, path: str, data: Data, mode: int) -> Call[FileWritten]:
    return Call("PUT", _file(sid, path), FileWritten.from_json, params=[("mode", f"{mode:o}")],
                body=Body(data), headers={"Content-Type": "application/octet-stream"})


def read_file(sid: str, path: str) -> Call[None]:
    return Call("GET", _file(sid, path), _none)


def list_files(sid: str, path: str) -> Call[Listing]:
    return Call("GET", _sb(sid, "/files"), Listing.from_json, params=[("path", path)])


def stat(sid: str, path: str) -> Call[FileEntry]:
    return Call("GET", _sb(sid, "/files/stat"), FileEntry.from_json, params=[("path", path)])


def remove(sid: str, path: str, recursive: bool) -> Call[FileDone]:
    return Call("DELETE", _sb(sid, "/files"), FileDone.from_json,
                params=[("path", path), ("recursive", "true" if recursive else "false")])


def rename(sid: str, src: str, dst: str) -> Call[FileDone]:
    return Call("POST", _sb(sid, "/files/rename"), FileDone.from_json,
                json={"from": src, "to": dst})


def mkdir(sid: str, path: str, parents: bool) -> Call[FileDone]:
    return Call("POST", _sb(sid, "/files/mkdir"), FileDone.from_json,
                json={"path": path, "parents": parents})


def put_archive(sid: str, path: str, tar: Data) -> Call[ArchiveReport]:
    return Call("PUT", _sb(sid, "/archive"), ArchiveReport.from_json, params=[("path", path)],
                body=Body(tar), headers={"Content-Type": "application/x-tar"})


def get_archive(sid: str, path: str) -> Call[None]:
    return Call("GET", _sb(sid, "/archive"), _none, params=[("path", path)])


# -- code contexts -------------------------------------------------------------------------

def _ctx(sid: str, cid: str = "", rest: str = "") -> str:
    return _sb(sid, "/contexts" + (f"/{_q(cid)}" if cid else "") + rest)


def create_context(sid: str, lang: str, default: bool = False) -> Call[ContextInfo]:
    body: Dict[str, Any] = {"lang": lang}
    if default:
        body["default"] = True
    return Call("POST", _ctx(sid), ContextInfo.from_json, json=body)


def contexts(sid: str) -> Call[List[ContextInfo]]:
    return Call("GET", _ctx(sid), _list("contexts", ContextInfo.from_json))


def run_cell(sid: str, cid: str, code: str, timeout: Optional[Duration]) -> Call[Execution]:
    return Call("POST", _ctx(sid, cid, "/run"), Execution.from_json,
                json=_some({"code": code, "timeout": timeout}))


def restart_context(sid: str, cid: str) -> Call[ContextInfo]:
    return Call("POST", _ctx(sid, cid, "/restart"), ContextInfo.from_json, json={})


def delete_context(sid: str, cid: str) -> Call[ContextInfo]:
    return Call("DELETE", _ctx(sid, cid), ContextInfo.from_json)
