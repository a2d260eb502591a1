"""The SDK's models against docs/openapi.json, field by field (issue 50, ADR 0033).

The models are written by hand (dataclasses with `from_json`, the shapes users import); this
test holds them to the spec the server generates: every property of each schema the SDK
models is a field of its class (or listed below as read another way, with the reason), of
the same type, Optional exactly where the spec allows null, with a default where the spec
may leave it out; `from_json` reads every field from an answer the spec describes; every
error code of the spec has its class. A property, schema or code the spec gains fails here
until the SDK has it (or says here why not). No server is needed.
"""
import dataclasses
import inspect
import json
import typing
from typing import Any, Dict, List, Optional, Tuple

import pytest

from conftest import ROOT

from cordon_sandbox import _ops as ops
from cordon_sandbox import errors, models as m

SPEC = json.loads((ROOT / "docs" / "openapi.json").read_text())
SCHEMAS: Dict[str, Any] = SPEC["components"]["schemas"]

# Each answer schema and the class that models it.
MODELS: Dict[str, type] = {
    "ArchiveReport": m.ArchiveReport,
    "CellError": m.ExecutionError,
    "CellResult": m.Execution,
    "ContextInfo": m.ContextInfo,
    "Destroyed": m.Destroyed,
    "Details": m.Details,
    "Discovery": m.OidcConfiguration,
    "Done": m.FileDone,
    "EgressEvent": m.EgressEvent,
    "Event": m.AuditEvent,
    "ExecInfo": m.ExecInfo,
    "ExecOutcome": m.ExecResult,
    "FileEntry": m.FileEntry,
    "FileWritten": m.FileWritten,
    "Finding": m.Finding,
    "Health": m.Health,
    "Introspection": m.TokenInfo,
    "Jwks": m.Jwks,
    "Limits": m.Limits,
    "Listing": m.Listing,
    "MetricSample": m.MetricSample,
    "PoolHealth": m.PoolStatus,
    "SandboxInfo": m.SandboxInfo,
    "SandboxList": m.SandboxList,
    "SnapshotInfo": m.Snapshot,
    "StartedFromSnapshot": m.SnapshotStarts,
    "Stat": m.FileEntry,
    "StdinWritten": m.StdinWritten,
    "Usage": m.Usage,
    "Timings": m.Timings,
    "VolumeDeleted": m.VolumeDeleted,
    "VolumeInfo": m.Volume,
    "VolumeList": m.VolumeList,
    "VolumeMountInfo": m.VolumeMountInfo,
}

# Properties a class reads another way than a field of the same name and type: (schema,
# property) -> why. Each is still read by `from_json` (the round trip below skips only these).
OTHERWISE: Dict[Tuple[str, str], str] = {
    ("ArchiveReport", "skipped"): "a list of (path, reason) pairs",
    ("CellResult", "results"): "each output's MIME bundle; the last value's is main_result",
    ("CellResult", "logs"): "a dict of stdout and stderr lists",
    ("Event", "detail"): "the row's detail as JSON: its shape is the kind's",
    ("ExecInfo", "pty"): "a (rows, cols) pair",
    ("Health", "tiers"): "tier -> its status as the server gives it (a word or an object)",
    ("Introspection", "active"): "a bool field; the token's other claims are in claims",
    ("Jwks", "keys"): "each key as a JSON object, as JWT libraries take it",
    ("StartedFromSnapshot", "errors"): "each error body as JSON ({code, message, fix})",
}
for _p in SCHEMAS["Introspection"]["properties"]:
    OTHERWISE.setdefault(("Introspection", _p), "a claim, in claims")

# Fields a class has that its schema does not: (class, field) -> why.
SDK_ONLY: Dict[Tuple[str, str], str] = {
    ("FileEntry", "path"): "set for stat (the Stat schema), None in a listing",
    ("Execution", "main_result"): "the last value's MIME bundle, from results",
    ("TokenInfo", "claims"): "the token's claims but active",
}

# Schemas the SDK answers with no class of their own, and why.
NOT_MODELLED: Dict[str, str] = {
    "AuditEvents": "answered as List[AuditEvent]",
    "ContextList": "answered as a list of Context handles",
    "ExecList": "answered as a list of BackgroundExec handles",
    "SnapshotList": "answered as List[Snapshot]",
    "MetricsList": "answered as List[MetricSample] (Sandbox.metrics)",
    "SnapshotDeleted": "delete_snapshot answers None",
    "CellOutput": "read into Execution.results (a MIME bundle each)",
    "CellLogs": "read into Execution.logs",
    "Skipped": "read into ArchiveReport.skipped",
    "PtySize": "read into ExecInfo.pty",
    "Jwk": "Jwks.keys are JSON objects",
    "Error": "an error answer raises a CordonError (test_every_error_code_has_its_class)",
    "Snapshot": "the dashboard's stream (/dashboard), not the SDK's",
    "LiveCount": "the dashboard's",
    "LiveSandbox": "the dashboard's",
    "PoolFill": "the dashboard's",
}

# Request bodies: the SDK builds them in _ops.py from these functions' parameters.
REQUESTS: Dict[str, Any] = {
    "SandboxRequest": ops.spec,
    "RunRequest": ops.run,
    "ExecBody": ops.exec_body,
}
# Request properties a function takes another way: (schema, property) -> why.
REQUEST_OTHERWISE: Dict[Tuple[str, str], str] = {
    ("RunRequest", "code"): "the code parameter (a string)",
    ("RunRequest", "argv"): "the code parameter (a list)",
    ("RunRequest", "stdin_base64"): "stdin given as bytes",
    ("RunRequest", "stream"): "run_stream",
    ("RunRequest", "args"): "not taken: an argv carries its own arguments",
    ("RunRequest", "wasm_base64"): "not taken: the SDK runs code and programs, not modules",
    ("ExecBody", "code"): "the code parameter (a string)",
    ("ExecBody", "argv"): "the code parameter (a list)",
    ("ExecBody", "stdin_base64"): "stdin given as bytes",
    ("ExecBody", "stream"): "exec_stream",
    ("ExecBody", "background"): "exec_background",
    ("ExecBody", "pty"): "exec_background's pty",
    ("ExecBody", "args"): "not taken: an argv carries its own arguments",
    ("ExecBody", "wasm_base64"): "not taken: the SDK runs code and programs, not modules",
}
# The request bodies of routes whose few fields _ops.py names as the route's parameters.
SMALL_REQUESTS = {
    "CellBody", "ContextBody", "IntrospectForm", "LimitsPatch", "MkdirBody", "PatchRequest",
    "PauseRequest", "RenameBody", "ResizeBody", "RunFile", "SnapshotRequest",
    "StartFromSnapshotRequest", "StdinBody", "VolumeCreate", "VolumeRequest",
}


def resolve(prop: Any) -> Tuple[Any, bool]:
    """A property's schema without its null, and whether it may be null."""
    if not isinstance(prop, dict):
        return prop, False
    if "anyOf" in prop:
        rest = [p for p in prop["anyOf"] if p != {"type": "null"}]
        if len(rest) == 1 and len(rest) < len(prop["anyOf"]):
            return {**prop, **rest[0], "anyOf": None}, True
    t = prop.get("type")
    if isinstance(t, list) and "null" in t:
        left = [x for x in t if x != "null"]
        return {**prop, "type": left[0] if len(left) == 1 else left}, True
    return prop, False


def ref_name(prop: Dict[str, Any]) -> Optional[str]:
    r = prop.get("$ref")
    return r.rsplit("/", 1)[-1] if r else None


def is_word(name: str) -> bool:
    """A schema that is a string on the wire (an enum, a name)."""
    s = SCHEMAS[name]
    alts = s.get("oneOf") or s.get("anyOf") or [s]
    return all(a.get("type") == "string" or "const" in a or "enum" in a for a in alts)


def unoptional(hint: Any) -> Tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    return hint, False


def type_error(hint: Any, prop: Any, where: str) -> Optional[str]:
    """Why `hint` is not the type of `prop`, or None."""
    prop, _ = resolve(prop)
    hint, _ = unoptional(hint)
    if prop is True or prop == {}:
        return None
    name = ref_name(prop)
    if name:
        if is_word(name):
            return None if hint is str else f"{where}: {hint} for the word {name} (want str)"
        cls = MODELS.get(name)
        if cls is None:
            return f"{where}: {name} has no class in MODELS"
        return None if hint is cls else f"{where}: {hint} for {name} (want {cls.__name__})"
    if "enum" in prop or "const" in prop:
        return None if hint is str else f"{where}: {hint} for an enum (want str)"
    t = prop.get("type")
    simple = {"integer": int, "number": float, "string": str, "boolean": bool}
    if t in simple:
        ok = hint is simple[t] or (t == "number" and hint is int)
        return None if ok else f"{where}: {hint} (want {simple[t].__name__})"
    if t == "array":
        if typing.get_origin(hint) not in (list, List):
            return f"{where}: {hint} (want a List)"
        return type_error(typing.get_args(hint)[0], prop.get("items", {}), where + "[]")
    if t == "object":
        if typing.get_origin(hint) not in (dict, Dict):
            return f"{where}: {hint} (want a Dict)"
        key, value = typing.get_args(hint)
        if key is not str:
            return f"{where}: keys {key} (want str)"
        if value is Any:
            return None
        return type_error(value, prop.get("additionalProperties", True), where + "{}")
    return f"{where}: the spec's {prop} is not a type this test knows"


def has_default(f: dataclasses.Field) -> bool:
    return (f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING)  # type: ignore[misc]


def model_errors(schema_name: str, cls: type) -> List[str]:
    schema = SCHEMAS[schema_name]
    props: Dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "raw"}
    hints = typing.get_type_hints(cls)
    out = []
    for name, prop in props.items():
        where = f"{schema_name}.{name} ({cls.__name__})"
        if (schema_name, name) in OTHERWISE:
            continue
        f = fields.get(name)
        if f is None:
            out.append(f"{where}: the SDK has no such field")
            continue
        err = type_error(hints[name], prop, where)
        if err:
            out.append(err)
        _, nullable = resolve(prop)
        _, optional = unoptional(hints[name])
        if nullable and not optional and not has_default(f):
            out.append(f"{where}: the spec allows null, the SDK's type is not Optional "
                       "and has no default to read it as")
    for name in fields:
        if name not in props and (cls.__name__, name) not in SDK_ONLY:
            # A field of a class that models two schemas is checked against both.
            others = [s for s, c in MODELS.items() if c is cls and s != schema_name]
            if not any(name in SCHEMAS[s].get("properties", {}) for s in others):
                out.append(f"{cls.__name__}.{name}: not a property of {schema_name}")
    return out


def test_every_schema_is_modelled_or_said_why_not():
    words = {n for n in SCHEMAS if "properties" not in SCHEMAS[n]}
    known = set(MODELS) | set(NOT_MODELLED) | set(REQUESTS) | SMALL_REQUESTS
    assert sorted(set(SCHEMAS) - words - known) == [], \
        "schemas of docs/openapi.json the Python SDK neither models nor names in NOT_MODELLED"
    assert sorted(known - set(SCHEMAS)) == [], "schemas named here that the spec no longer has"


@pytest.mark.parametrize("schema_name", sorted(MODELS))
def test_each_model_has_every_field_of_its_schema(schema_name):
    assert model_errors(schema_name, MODELS[schema_name]) == []


def sample(prop: Any, name: str, n: List[int]) -> Any:
    """A value of `prop` unlike any default (distinct numbers, non-empty lists, the last
    enum value)."""
    prop, _ = resolve(prop)
    n[0] += 1
    r = ref_name(prop) if isinstance(prop, dict) else None
    if r:
        s = SCHEMAS[r]
        if "properties" in s:
            return {k: sample(v, k, n) for k, v in s["properties"].items()}
        alts = s.get("oneOf") or [s]
        words = [w for a in alts for w in ([a["const"]] if "const" in a else a.get("enum", []))]
        return words[-1] if words else f"{name}-{n[0]}"
    if not isinstance(prop, dict) or prop == {}:
        return {"any": n[0]}
    if "enum" in prop:
        return prop["enum"][-1]
    t = prop.get("type")
    if t == "integer":
        return 1000 + n[0]
    if t == "number":
        return 0.5 + n[0]
    if t == "string":
        return f"{name}-{n[0]}"
    if t == "boolean":
        return True
    if t == "array":
        return [sample(prop.get("items", {}), name, n)]
    if t == "object":
        return {"k": sample(prop.get("additionalProperties", {}), name, n)}
    raise AssertionError(f"no sample of {prop}")


def same(value: Any, wire: Any, where: str, schema_name: Optional[str]) -> List[str]:
    if dataclasses.is_dataclass(value) and isinstance(wire, dict) and schema_name:
        return read_errors(schema_name, value, wire)
    if isinstance(value, list) and isinstance(wire, list):
        return [e for v, w in zip(value, wire) for e in same(v, w, where + "[]", schema_name)]
    if isinstance(value, dict) and isinstance(wire, dict) and schema_name:
        return [e for k in wire for e in same(value.get(k), wire[k], f"{where}{{{k}}}", schema_name)]
    return [] if value == wire else [f"{where}: read {value!r}, the answer had {wire!r}"]


def item_schema(prop: Any) -> Optional[str]:
    prop, _ = resolve(prop)
    while isinstance(prop, dict) and prop.get("type") in ("array", "object") and not ref_name(prop):
        prop, _ = resolve(prop.get("items") or prop.get("additionalProperties") or {})
    r = ref_name(prop) if isinstance(prop, dict) else None
    return r if r in MODELS else None


def read_errors(schema_name: str, obj: Any, wire: Dict[str, Any]) -> List[str]:
    out = []
    for name, prop in SCHEMAS[schema_name].get("properties", {}).items():
        if (schema_name, name) in OTHERWISE:
            continue
        out += same(getattr(obj, name, None), wire[name], f"{schema_name}.{name}",
                    item_schema(prop))
    return out


# The classes read on their own (the others only inside these, and checked there).
READ = sorted(n for n, c in MODELS.items() if hasattr(c, "from_json"))


@pytest.mark.parametrize("schema_name", READ)
def test_from_json_reads_every_field(schema_name):
    """An answer with every property set (none at its default) is read field by field."""
    cls = MODELS[schema_name]
    wire = sample({"$ref": f"#/components/schemas/{schema_name}"}, schema_name, [0])
    assert read_errors(schema_name, cls.from_json(wire), wire) == []


def least(schema_name: str, null: bool) -> Dict[str, Any]:
    """An answer of only the required properties (each nullable one null when `null`)."""
    schema = SCHEMAS[schema_name]
    out = {}
    for name, prop in schema.get("properties", {}).items():
        _, nullable = resolve(prop)
        if null and nullable:
            out[name] = None
        elif name in schema.get("required", []):
            base = resolve(prop)[0]
            r = ref_name(base) if isinstance(base, dict) else None
            out[name] = least(r, null) if r in MODELS else sample(prop, name, [0])
    return out


@pytest.mark.parametrize("null", [False, True], ids=["left-out", "null"])
@pytest.mark.parametrize("schema_name", READ)
def test_from_json_reads_an_answer_that_leaves_out_what_it_may(schema_name, null):
    """What the spec may leave out (or send as null) reads as None, or the field's default."""
    cls = MODELS[schema_name]
    obj = cls.from_json(least(schema_name, null))
    schema = SCHEMAS[schema_name]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        prop = schema.get("properties", {}).get(f.name)
        if prop is None or (schema_name, f.name) in OTHERWISE or f.name in schema.get("required", []):
            continue
        got = getattr(obj, f.name)
        if unoptional(hints[f.name])[1] and got is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        assert got == default, f"{schema_name}.{f.name}: read {got!r} from an answer without it"


@pytest.mark.parametrize("schema_name", sorted(REQUESTS))
def test_each_request_takes_every_field_of_its_body(schema_name):
    params = set(inspect.signature(REQUESTS[schema_name]).parameters)
    props = set(SCHEMAS[schema_name]["properties"])
    taken_otherwise = {p for (s, p) in REQUEST_OTHERWISE if s == schema_name}
    assert sorted(props - params - taken_otherwise) == [], \
        f"fields of {schema_name} that {REQUESTS[schema_name].__name__} does not take"
    assert sorted(params - props - {"lang", "code", "stdin", "files", "stream"}) == [], \
        f"parameters of {REQUESTS[schema_name].__name__} that {schema_name} has no field for"


def test_the_create_and_the_run_take_the_same_sandbox_fields():
    """The run's body is the create's flattened (less a sandbox's life): so are the SDK's."""
    create = set(inspect.signature(ops.spec).parameters)
    run = set(inspect.signature(ops.run).parameters)
    life = {"ttl", "idle_timeout", "on_timeout", "labels", "volumes"}
    assert sorted(create - life - run) == []


def test_every_error_code_has_its_class():
    codes = set(SCHEMAS["Code"]["enum"])
    assert sorted(codes - set(errors.BY_CODE)) == [], "codes of the spec the SDK has no class for"
    assert sorted(set(errors.BY_CODE) - codes) == [], "classes of codes the spec no longer has"
    body = SCHEMAS["Error"]["properties"]
    err = errors.from_json(400, {"code": "invalid_request", "message": "m", "fix": "f",
                                 "rule": "r"})
    for prop in body:
        assert hasattr(err, prop), f"CordonError has no {prop}"


def test_a_property_the_spec_gains_fails_here():
    """The check itself: a schema with one more property than the SDK's class is refused."""
    SCHEMAS["__Probe"] = {**SCHEMAS["FileWritten"],
                          "properties": {**SCHEMAS["FileWritten"]["properties"],
                                         "sha256": {"type": "string"}}}
    try:
        assert model_errors("__Probe", m.FileWritten) == [
            "__Probe.sha256 (FileWritten): the SDK has no such field"]
    finally:
        del SCHEMAS["__Probe"]
