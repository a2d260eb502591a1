"""E2B's own Python SDK (pinned `e2b`), unchanged, builds templates through its template
API against a real `cordon serve` (container tier): `Template.build` with a copy of local
files, a command, variables, a working directory and a start command; `Template.exists`;
tags (`assign_tags`, `get_tags`, `remove_tags`); a sandbox made from the build; a failed
step, a user the build does not have, an image no one maps; and what another tenant may
not do with a tenant's template, its build or its upload link.

`ubuntu:22.04` is mapped to the `debian` base here (`[e2b.images]`): this machine reaches no
registry, so an operator names the template that stands for each image a build may start
from."""

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import test_e2b_compat as compat  # noqa: F401 (sets the SDK's loopback URLs first)
from conftest import KEYS, tier_available

BOB_E2B_KEY = "e2b_" + "fedcba9876543210" * 2 + "76543210"


@pytest.fixture(scope="module")
def server():
    if not tier_available("container"):
        pytest.skip("container tier unavailable here")
    s = compat.e2b_server("container", builds=True, e2b_extra=(
        'max_upload_bytes = "256K"\n'
        '[e2b.images]\n"ubuntu:22.04" = "debian"\n"e2bdev/base" = "debian"\n'
        f'[[keys]]\ntenant = "bob"\nkey = "{BOB_E2B_KEY}"\n'))
    yield s
    s.stop()
    shutil.rmtree(s.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def context():
    d = Path(tempfile.mkdtemp(prefix="e2b-build-ctx-"))
    (d / "folder").mkdir()
    (d / "folder" / "test.txt").write_text("This is a test file.")
    os.symlink("test.txt", d / "folder" / "symlink.txt")
    (d / "big.bin").write_bytes(os.urandom(400 * 1024))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def build(template, name, **kw):
    from e2b import Template
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append, **kw)
    return info, "\n".join(str(entry.message) for entry in logs)


def test_build_a_template_and_start_a_sandbox_from_it(server, context):
    from e2b import Sandbox, Template, wait_for_timeout
    t = (Template(file_context_path=str(context))
         .from_image("ubuntu:22.04")
         .skip_cache()
         .copy("folder/*", "folder")
         .copy("folder/test.txt", "/opt/data/")
         .run_cmd("cat folder/symlink.txt && test \"$(pwd)\" = /home/user")
         .set_envs({"GREETING": "hello from the template"})
         .run_cmd('echo "greeting=$GREETING"')
         .set_workdir("/app")
         .run_cmd("pwd > /app/where")
         .set_start_cmd("echo started > /tmp/started", wait_for_timeout(1_000)))
    info, logs = build(t, "my-tpl:v1")
    assert info.template_id and info.build_id, info
    assert "This is a test file." in logs, logs
    assert "greeting=hello from the template" in logs, logs
    assert Template.exists("my-tpl") is True
    assert Template.exists("no-such-tpl") is False
    sbx = Sandbox.create("my-tpl:v1", timeout=60)
    try:
        r = sbx.commands.run("cat /opt/data/test.txt; echo; cat /app/where; echo $GREETING; "
                             "grep -c '^ID=debian' /etc/os-release")
        assert r.stdout.split("\n")[:4] == [
            "This is a test file.", "/app", "hello from the template", "1"], r.stdout
        # The start command runs with every sandbox of the template, as E2B's does.
        r = sbx.commands.run("for i in $(seq 100); do [ -s /tmp/started ] && break; "
                             "sleep 0.1; done; cat /tmp/started")
        assert r.stdout == "started\n", r.stdout
    finally:
        sbx.kill()
    # By the alias alone: its default tag or its newest ready build.
    sbx = Sandbox.create("my-tpl", timeout=60)
    sbx.kill()


def test_tags_assign_list_and_remove(server):
    from e2b import Sandbox, Template
    build(Template().from_base_image(), "tagged:v1")
    assigned = Template.assign_tags("tagged:v1", ["production", "latest"])
    assert sorted(assigned.tags) == ["latest", "production"] and assigned.build_id
    listed = {t.tag: t.build_id for t in Template.get_tags("tagged")}
    assert set(listed) == {"v1", "production", "latest"}, listed
    assert len(set(listed.values())) == 1
    Sandbox.create("tagged:production", timeout=30).kill()
    for bad in [":invalid-tag", "tagged:"]:
        with pytest.raises(Exception):
            Template.assign_tags("tagged:v1", bad)
    Template.remove_tags("tagged", "production")
    assert {t.tag for t in Template.get_tags("tagged")} == {"v1", "latest"}
    with pytest.raises(Exception) as gone:
        Sandbox.create("tagged:production", timeout=30)
    assert "not found" in str(gone.value), gone.value


def test_a_failed_step_an_unknown_user_and_an_unmapped_image(server):
    from e2b import Template
    from e2b.exceptions import BuildException
    with pytest.raises(BuildException) as failed:
        build(Template().from_image("ubuntu:22.04").skip_cache()
              .run_cmd("echo before-failing; exit 3"), "fails")
    assert "exit code 3" in str(failed.value), failed.value
    with pytest.raises(BuildException) as user:
        build(Template().from_image("ubuntu:22.04").skip_cache()
              .run_cmd("whoami", user="root123"), "bad-user")
    assert ("failed to run command 'whoami': command failed: unauthenticated: invalid "
            "username: 'root123'") in str(user.value), user.value
    with pytest.raises(Exception) as image:
        build(Template().from_image("alpine:3.20").skip_cache().run_cmd("true"), "alpine")
    assert "[e2b.images]" in str(image.value) and "registry" in str(image.value), image.value
    # A failed build's alias makes no sandbox.
    from e2b import Sandbox
    with pytest.raises(Exception) as none:
        Sandbox.create("fails", timeout=30)
    assert "not found" in str(none.value), none.value


def test_uploads_are_bounded_per_tenant(server, context):
    from e2b import Template
    t = Template(file_context_path=str(context)).from_image("ubuntu:22.04").copy(
        "big.bin", "/opt/big.bin").skip_cache()
    with pytest.raises(Exception) as big:
        build(t, "too-big")
    assert "413" in str(big.value) or "uploads may" in str(big.value), big.value


def http(method, url, body=None, headers=None):
    """A JSON call: its status and its answer's JSON (None when empty)."""
    req = urllib.request.Request(url, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def native(server, key, method, path, body=None):
    return http(method, server.url + path, body, {"Authorization": f"Bearer {key}"})


def test_another_tenant_cannot_use_read_or_upload_to_a_tenants_build(server, context):
    """The attack: bob knows alice's alias, her template and build ids and the store name
    her build made. Each way in is refused as if nothing were there."""
    from e2b import Sandbox, Template
    before = tenant_templates(server)
    info, _ = build(Template().from_image("ubuntu:22.04").run_cmd("echo secret > /opt/s"),
                    "alices")
    with pytest.raises(Exception) as create:
        Sandbox.create("alices", timeout=30, api_key=BOB_E2B_KEY)
    assert "not found" in str(create.value), create.value
    assert Template.exists("alices", api_key=BOB_E2B_KEY) is False
    with pytest.raises(Exception):
        Template.get_build_status(info, api_key=BOB_E2B_KEY)
    with pytest.raises(Exception):
        Template.get_tags("alices", api_key=BOB_E2B_KEY)
    # The Cordon template alice's build made, named on the native API by bob: refused as
    # a template that does not exist; alice may.
    names = sorted(tenant_templates(server) - before)
    assert len(names) == 1, names
    status, body = native(server, KEYS["bob"], "POST", "/v1/sandboxes",
                          {"tier": "container", "template": names[0]})
    assert status == 400 and "no template named" in json.dumps(body), (status, body)
    status, body = native(server, KEYS["alice"], "POST", "/v1/sandboxes",
                          {"tier": "container", "template": names[0]})
    assert status in (200, 201), (status, body)
    native(server, KEYS["alice"], "DELETE", f"/v1/sandboxes/{body['id']}")
    # An upload link is for its tenant's template and files only: bob gets none for
    # alice's template, and alice's link does not take other files.
    origin = compat.ORIGIN

    def get(path, key):
        req = urllib.request.Request(origin + path, headers={"X-API-KEY": key})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, None
    h = "ab" * 32
    assert get(f"/templates/{info.template_id}/files/{h}", BOB_E2B_KEY)[0] == 404
    status, link = get(f"/templates/{info.template_id}/files/{h}", compat.E2B_KEY)
    assert status == 201 and link["present"] is False, link
    other = link["url"].replace(h, "cd" * 32)
    req = urllib.request.Request(other, method="PUT", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    assert refused.value.code == 403
    # Deleting it (E2B's DELETE /templates/{id}): bob's is refused as not found, alice's
    # removes it from the store.
    def delete(key):
        req = urllib.request.Request(f"{origin}/templates/alices", method="DELETE",
                                     headers={"X-API-KEY": key})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    assert delete(BOB_E2B_KEY) == 404
    assert delete(compat.E2B_KEY) == 204
    assert Template.exists("alices") is False
    assert not (server.data_dir / "templates" / "names" / f"{names[0]}.json").exists()


def tenant_templates(server) -> set:
    return {p.stem for p in (server.data_dir / "templates" / "names").glob("t-*.json")}


def test_a_rebuilt_tag_lets_the_old_build_go_and_templates_outlive_a_restart(server):
    """Building one tag again leaves one build in the store (the one the tag names), not
    every build's root; and a template built before the server restarted still makes
    sandboxes after it."""
    from e2b import Sandbox, Template
    before = tenant_templates(server)
    build(Template().from_image("ubuntu:22.04").skip_cache().run_cmd("echo 1 > /opt/v"),
          "rebuilt:v1")
    first = tenant_templates(server) - before
    assert len(first) == 1, first
    build(Template().from_image("ubuntu:22.04").skip_cache().run_cmd("echo 2 > /opt/v"),
          "rebuilt:v1")
    second = tenant_templates(server) - before
    assert len(second) == 1 and second != first, (first, second)
    server.stop()
    server.start()
    sbx = Sandbox.create("rebuilt:v1", timeout=60)
    try:
        assert sbx.commands.run("cat /opt/v").stdout == "2\n"
    finally:
        sbx.kill()
    assert Template.exists("rebuilt") is True
    assert {t.tag for t in Template.get_tags("rebuilt")} == {"v1"}


def test_a_build_starts_once_and_unstarted_ones_are_bounded(server):
    """A build's start is taken once (a second is 409, never a second build of it); builds
    asked and never started are bounded per tenant (the oldest go past 16)."""
    origin = compat.ORIGIN

    def call(method, path, body):
        return http(method, origin + path, body, {"X-API-KEY": compat.E2B_KEY})
    asked = [call("POST", "/v3/templates", {"name": "unstarted"})[1] for _ in range(20)]
    first, last = asked[0], asked[-1]
    step = {"fromImage": "ubuntu:22.04", "steps": [{"type": "RUN", "args": ["true"]}]}
    status, _ = call("POST", f"/v2/templates/{first['templateID']}/builds/{first['buildID']}",
                     step)
    assert status == 404, "an unstarted build past the bound was kept"
    path = f"/v2/templates/{last['templateID']}/builds/{last['buildID']}"
    assert call("POST", path, step)[0] == 202
    assert call("POST", path, step)[0] == 409


def test_builds_go_on_when_the_program_file_is_replaced(server):
    """An upgrade replaces the program file under a running server: its builds are its own
    program's still (the running one, not the path's), where they used to fail to start."""
    from conftest import cordon_bin
    from e2b import Template
    # `cordon serve` runs cordon-full from beside the `cordon` it was started as, and the
    # tiers' programs from beside it.
    where = server.tmp / "bin"
    where.mkdir()
    for name in ("cordon", "cordon-full", "cordon-sandbox-init", "cordon-guest",
                 "cordon-gvisor-agent"):
        shutil.copy2(Path(cordon_bin()).with_name(name), where / name)
    copy = where / "cordon"
    server.stop()
    before = os.environ.get("CORDON_BIN")
    os.environ["CORDON_BIN"] = str(copy)
    try:
        server.start()
    finally:
        if before is None:
            os.environ.pop("CORDON_BIN", None)
        else:
            os.environ["CORDON_BIN"] = before
    for name in ("cordon", "cordon-full"):
        (where / name).unlink()
        (where / name).write_text("#!/bin/sh\nexit 1\n")
        (where / name).chmod(0o755)
    info, logs = build(Template().from_image("ubuntu:22.04").skip_cache()
                       .run_cmd("echo still-built"), "after-upgrade")
    assert "still-built" in logs, logs


def test_two_first_builds_from_debian_at_once_both_build():
    """Two builds that are the first from `debian` in a data dir both import the Debian
    root; the later import finds the other's and builds on it (it used to fail with the
    name taken: E2B's background build beside the next test's build)."""
    import subprocess
    from conftest import cordon_bin
    # A data dir whose parents the build's sandbox may pass (pytest's tmp_path's are not).
    tmp_path = Path(tempfile.mkdtemp(prefix="cordon-twin-builds-"))
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "microvm").symlink_to(compat.wheels_dir().parent / "microvm")
    env = dict(os.environ, CORDON_HOME=str(data))
    procs = [subprocess.Popen([cordon_bin(), "template", "build", f"twin{i}", "--from", "debian",
                               "--run", f"echo {i}"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-2000:]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
