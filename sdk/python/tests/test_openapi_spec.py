"""docs/openapi.json (generated from the server's router and wire types) is a valid OpenAPI
3.1 document (openapi-spec-validator, pinned by scripts/setup.d/45-client-tests.sh), and a
real `cordon serve` answers what it says: each answer below is validated against the
schema the document gives for that operation and status (jsonschema, draft 2020-12)."""
import json
import urllib.error
import urllib.request

import jsonschema
import pytest
from openapi_spec_validator import validate

from conftest import KEYS, ROOT

SPEC = json.loads((ROOT / "docs" / "openapi.json").read_text())


def test_the_document_is_valid_openapi_3_1():
    validate(SPEC)
    ids = [op["operationId"] for item in SPEC["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def check(method: str, path: str, status: int, body) -> None:
    """`body` matches the schema of `method path`'s `status` answer in the document."""
    answer = SPEC["paths"][path][method]["responses"][str(status)]
    schema = answer["content"]["application/json"]["schema"]
    root = {"components": SPEC["components"], **schema}
    jsonschema.Draft202012Validator(root).validate(body)


def call(server, method: str, path: str, body=None, key=KEYS["alice"]):
    req = urllib.request.Request(
        server.url.rstrip("/") + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_live_answers_match_the_document(server, has_container):
    if not has_container:
        pytest.skip("the container tier is not available here")
    s, v = call(server, "GET", "/v1/health")
    check("get", "/v1/health", s, v)
    s, sb = call(server, "POST", "/v1/sandboxes", {"tier": "container", "labels": {"spec": "1"}})
    assert s == 201, sb
    check("post", "/v1/sandboxes", s, sb)
    sid = sb["id"]
    try:
        s, v = call(server, "GET", "/v1/sandboxes?label=spec=1")
        check("get", "/v1/sandboxes", s, v)
        s, v = call(server, "POST", f"/v1/sandboxes/{sid}/exec",
                    {"lang": "bash", "code": "echo out; echo err >&2; exit 4"})
        assert s == 200 and v["exit_code"] == 4, v
        check("post", "/v1/sandboxes/{id}/exec", s, v)
        s, v = call(server, "POST", f"/v1/sandboxes/{sid}/exec",
                    {"argv": ["sleep", "30"], "background": True})
        assert s == 202, v
        check("post", "/v1/sandboxes/{id}/exec", s, v)
        s, v = call(server, "GET", f"/v1/sandboxes/{sid}/execs")
        check("get", "/v1/sandboxes/{id}/execs", s, v)
        s, v = call(server, "GET", f"/v1/sandboxes/{sid}/files")
        check("get", "/v1/sandboxes/{id}/files", s, v)
        s, v = call(server, "GET", f"/v1/audit?sandbox={sid}")
        check("get", "/v1/audit", s, v)
        # An error answer: a refused path.
        s, v = call(server, "GET", f"/v1/sandboxes/{sid}/files/stat?path=/proc/self/environ")
        assert s == 400, v
        check("get", "/v1/sandboxes/{id}/files/stat", s, v)
        assert v["code"] == "path_refused"
    finally:
        s, v = call(server, "DELETE", f"/v1/sandboxes/{sid}")
        check("delete", "/v1/sandboxes/{id}", s, v)
    s, v = call(server, "POST", "/v1/run", {"tier": "wasm", "lang": "python",
                                            "code": "print(6*7)"})
    assert s == 200 and v["stdout"] == "42\n", v
    check("post", "/v1/run", s, v)
