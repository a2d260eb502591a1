"""E2B's own published Python SDKs (`e2b`, `e2b-code-interpreter`, pinned by
scripts/setup.d/45-e2b-sdks.sh) run their quick-start flows unchanged against a real
`cordon serve` with its `[e2b]` listener on loopback.

Every byte stays on this machine: the SDK's URLs are set to the loopback listener here, at
import, before the SDK is imported (it reads them when a sandbox is made), and the test
fails if the SDK was imported before that."""

import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

assert "e2b" not in sys.modules, "the E2B SDK must not be imported before its URLs are set"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()
ORIGIN = f"http://127.0.0.1:{PORT}"
E2B_KEY = "e2b_" + "0123456789abcdef" * 2 + "01234567"
os.environ["E2B_API_URL"] = ORIGIN
os.environ["E2B_SANDBOX_URL"] = ORIGIN
os.environ["E2B_DOMAIN"] = "localhost"
os.environ["E2B_API_KEY"] = E2B_KEY
os.environ.pop("E2B_DEBUG", None)

from conftest import KEYS, ServerProc, tier_available  # noqa: E402

TIERS = os.environ.get("CORDON_E2B_TIERS", "container,gvisor,microvm").split(",")


def wheels_dir() -> Path:
    """Where scripts/setup.d/46-e2b-sdks.sh downloaded the base template's wheels."""
    home = os.environ.get("CORDON_HOME") or ("/var/lib/cordon" if os.getuid() == 0 else
                                             os.path.expanduser("~/.local/share/cordon"))
    d = Path(home) / "e2b-wheels"
    if not (d / ".pins").exists():
        pytest.fail(f"no wheels in {d}: run scripts/setup.d/46-e2b-sdks.sh (make setup)")
    return d


def build_base_template(data_dir: Path) -> None:
    """E2B's `base` for a tier whose root is Debian's (microvm): bash, Python with matplotlib
    and pandas (the guest makes /home/user the workspace's second mount point itself). pip reads the
    wheels from an index on loopback, the only host the build may reach."""
    import functools
    import http.server
    import subprocess
    import threading
    from conftest import cordon_bin
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheels_dir()))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        r = subprocess.run(
            [cordon_bin(), "template", "build", "e2b-base", "--from", "debian",
             "--run", "python3 -m venv /opt/py",
             "--run", "/opt/py/bin/pip install --no-cache-dir --disable-pip-version-check "
                      f"--no-input --no-index --find-links http://127.0.0.1:{port}/ matplotlib pandas",
             "--allow-cidr", f"127.0.0.1/32:{port}",
             "--env", "PATH=/opt/py/bin:/usr/local/bin:/usr/bin:/bin"],
            env=dict(os.environ, CORDON_HOME=str(data_dir)), capture_output=True, text=True,
            timeout=900)
        assert r.returncode == 0, r.stderr[-4000:]
    finally:
        srv.shutdown()


# The tiers whose own root is the host's /usr (bash, Python with matplotlib, Node); the
# others get E2B's base as a template.
HOST_ROOT = {"container", "gvisor"}


def e2b_server(tier: str, port: int = PORT, exec_timeout_ms: int = 180000,
               e2b_extra: str = "", builds: bool = False) -> ServerProc:
    """`builds`: the data dir is made ready for template builds (E2B's `Template.build`)
    on a tier whose root is the host's too."""
    d = Path(tempfile.mkdtemp(prefix=f"cordon-e2b-{tier}-"))
    templates = ""
    if tier not in HOST_ROOT or builds:
        # The build's sandbox opens the template store: its parents must be passable.
        d.chmod(0o755)
        (d / "data").mkdir(mode=0o755)
        # The `debian` base is read from the microvm guest image setup built.
        (d / "data" / "microvm").symlink_to(wheels_dir().parent / "microvm")
    if tier not in HOST_ROOT:
        build_base_template(d / "data")
        templates = '[e2b.templates]\nbase = "e2b-base"\n"code-interpreter-v1" = "e2b-base"\n'
    extra = (f'[[keys]]\ntenant = "alice"\nkey = "{E2B_KEY}"\n'
             f'[e2b]\nlisten = "127.0.0.1:{port}"\ntier = "{tier}"\n'
             # A cell's timeout is the sandbox's exec timeout: matplotlib's first import
             # builds its font cache, slow on a loaded host.
             f'limits = {{ timeout_ms = {exec_timeout_ms} }}\n{e2b_extra}{templates}')
    s = ServerProc(d / "data", {}, extra=extra)
    # No warm pool: every E2B sandbox is made for its create.
    text = s.config.read_text().replace("[pools]\n", "")
    s.config.write_text(text.replace('default_tier = "wasm"', f'default_tier = "{tier}"'))
    s.start()
    s.tmp = d
    return s


def serving(tier: str):
    """A server with the E2B listener on `tier` for a module's tests (skipped where the tier
    does not run), stopped and removed after them."""
    if not tier_available(tier):
        pytest.skip(f"{tier} tier unavailable here")
    s = e2b_server(tier)
    s.tier = tier
    yield s
    s.stop()
    shutil.rmtree(s.tmp, ignore_errors=True)


@pytest.fixture(scope="module", params=TIERS)
def server(request):
    yield from serving(request.param)


@pytest.fixture
def sbx(server):
    from e2b import Sandbox
    s = Sandbox.create(timeout=300)
    yield s
    try:
        s.kill()
    except Exception:
        pass


def test_commands(sbx):
    from e2b import CommandExitException
    r = sbx.commands.run("echo hello; echo oops >&2; pwd")
    assert r.exit_code == 0
    assert r.stdout == "hello\n/home/user\n"
    assert r.stderr == "oops\n"
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo bye; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "bye\n"
    # Background, then wait.
    h = sbx.commands.run("sleep 0.5; echo done", background=True)
    assert h.pid > 0
    assert h.wait().stdout == "done\n"
    # Background, killed.
    h = sbx.commands.run("sleep 60", background=True)
    assert any(p.pid == h.pid for p in sbx.commands.list())
    assert h.kill() is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert not any(p.pid == h.pid for p in sbx.commands.list())
    # Standard input.
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "to stdin\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "to stdin\n"
    # Environment and working directory.
    r = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp")
    assert r.stdout == "hi\n/tmp\n"
    # The call's timeout is the process's lifetime.
    from e2b import TimeoutException
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)


def test_pty(sbx):
    from e2b import PtySize
    out = bytearray()
    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=30)
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((40+2)); exit\n")
    r = h.wait(on_pty=lambda d: out.extend(d))
    assert r.exit_code == 0
    assert b"pty-42" in out
    assert b"30 100" in out


def test_files(sbx):
    f = sbx.files
    info = f.write("/home/user/hello.txt", "hello file")
    assert info.path == "/home/user/hello.txt"
    assert f.read("/home/user/hello.txt") == "hello file"
    assert f.read("hello.txt") == "hello file"
    assert sbx.commands.run("cat /home/user/hello.txt").stdout == "hello file"
    f.write("data.bin", b"\x00\x01\xff")
    assert f.read("/home/user/data.bin", format="bytes") == b"\x00\x01\xff"
    assert f.make_dir("/home/user/d/e") is True
    assert f.make_dir("/home/user/d/e") is False
    f.write("/home/user/d/e/x.txt", "x")
    names = sorted(e.name for e in f.list("/home/user"))
    assert names == ["d", "data.bin", "hello.txt"]
    deep = sorted(e.path for e in f.list("/home/user/d", depth=2))
    assert deep == ["/home/user/d/e", "/home/user/d/e/x.txt"]
    assert f.exists("/home/user/hello.txt")
    assert not f.exists("/home/user/nope.txt")
    moved = f.rename("/home/user/hello.txt", "/home/user/moved.txt")
    assert moved.path == "/home/user/moved.txt"
    assert not f.exists("/home/user/hello.txt")
    assert f.read("/home/user/moved.txt") == "hello file"
    # A directory's size is its own, as envd reports it (E2B's test_info: size > 0).
    assert f.get_info("/home/user/d").size > 0
    f.remove("/home/user/d")
    assert not f.exists("/home/user/d")
    f.remove("/home/user/never-there")  # as envd: not an error
    from e2b import NotFoundException
    with pytest.raises(NotFoundException):
        f.read("/home/user/nope.txt")
    # The kernel's views and devices are never reached, saying what to do instead (the
    # rest of the sandbox's root is: test_e2b_files_outside.py, ADR 0031).
    from e2b import SandboxException
    with pytest.raises(SandboxException) as e:
        f.read("/proc/self/environ")
    assert "commands.run" in str(e.value)
    # So does every filesystem call of envd's protocol, each of its paths (a move's both).
    f.write("/home/user/stays.txt", "stays")
    for call in (lambda: f.get_info("/proc/self"), lambda: f.list("/sys"),
                 lambda: f.make_dir("/dev/made"), lambda: f.remove("/proc/1"),
                 lambda: f.rename("/home/user/stays.txt", "/proc/moved"),
                 lambda: f.rename("/sys/kernel/notes", "/home/user/taken")):
        with pytest.raises(SandboxException) as e:
            call()
        assert "commands.run" in str(e.value), e.value
    assert f.read("/home/user/stays.txt") == "stays" and not f.exists("/home/user/taken")
    entries = f.write_files([
        {"path": "/home/user/m1.txt", "data": "one"},
        {"path": "/home/user/m2.txt", "data": "two"},
    ])
    assert sorted(x.path for x in entries) == ["/home/user/m1.txt", "/home/user/m2.txt"]
    assert f.read("/home/user/m2.txt") == "two"


def test_list_walks_as_envd(sbx):
    """files.list(depth > 1) answers as envd walks: depth first, each directory's entries by
    name, a directory's own entries right after it (E2B's suite: test_files_list.py)."""
    f = sbx.files
    for d in ("w/b", "w/a/z", "w/a/y"):
        f.make_dir(d)
    f.write("w/c.txt", "c")
    got = [e.path.removeprefix("/home/user/w/") for e in f.list("w", depth=2)]
    assert got == ["a", "a/y", "a/z", "b", "c.txt"]


def test_stream_input(sbx):
    """commands.stream_input: envd's StreamInput, chunks in order, then close_stdin."""
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, ["streamed ", b"in", "put\n"])
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "streamed input\n"


def test_a_killed_sandbox_ends_its_commands_as_not_running(sbx):
    """A command waited on when its sandbox is killed raises the SDK's not-running error,
    as under E2B (the stream breaks off, /health answers 502 "was not found";
    E2B's suite: test_sandbox_killed_during_run.py)."""
    from e2b import SandboxNotRunningException
    h = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(SandboxNotRunningException) as e:
        h.wait()
    assert "killed or reached its end of life" in str(e.value)


def test_a_commands_timeout_is_its_lifetime():
    """As envd runs a process under a context with the call's deadline: past `timeout` the
    process is killed (not only the client's wait ended), and `timeout=0` is no timeout,
    so it runs past the sandbox's exec timeout (1.5 s on this server)."""
    if not tier_available("container"):
        pytest.skip("container tier unavailable here")
    from e2b import Sandbox, TimeoutException
    port = _free_port()
    origin = f"http://127.0.0.1:{port}"
    srv = e2b_server("container", port=port, exec_timeout_ms=1500)
    try:
        s = Sandbox.create(timeout=60, api_url=origin, sandbox_url=origin)
        try:
            with pytest.raises(TimeoutException):
                s.commands.run("sleep 2; echo ran-on > /home/user/marker", timeout=1)
            time.sleep(3)
            assert not s.files.exists("/home/user/marker"), "the process outlived its timeout"
            r = s.commands.run("sleep 2; echo outlived", timeout=0)
            assert r.stdout == "outlived\n"
        finally:
            s.kill()
    finally:
        srv.stop()
        shutil.rmtree(srv.tmp, ignore_errors=True)


def test_lifecycle(server):
    from e2b import Sandbox
    s = Sandbox.create(timeout=120, metadata={"suite": "e2b-compat"}, envs={"FROM_CREATE": "yes"})
    try:
        assert s.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        assert s.is_running()
        s.set_timeout(60)
        info = s.get_info()
        left = info.end_at.timestamp() - time.time()
        assert 30 < left <= 62, left
        assert info.metadata == {"suite": "e2b-compat"}
        listed = Sandbox.list(query=None).next_items()
        assert s.sandbox_id in [x.sandbox_id for x in listed]
        # connect: a second handle on the same sandbox.
        s.files.write("kept.txt", "kept")
        s2 = Sandbox.connect(s.sandbox_id)
        assert s2.files.read("kept.txt") == "kept"
        # pause, then connect resumes it with its files and processes' state.
        h = s.commands.run("sleep 300", background=True)
        assert s.pause() is True
        assert not s.is_running()
        paused = [x for x in Sandbox.list().next_items() if x.sandbox_id == s.sandbox_id]
        assert paused and paused[0].state.value == "paused"
        s3 = Sandbox.connect(s.sandbox_id)
        assert s3.is_running()
        assert s3.files.read("kept.txt") == "kept"
        assert any(p.pid == h.pid for p in s3.commands.list())
    finally:
        assert s.kill() is True
    assert s.sandbox_id not in [x.sandbox_id for x in Sandbox.list().next_items()]
    assert Sandbox.kill(s.sandbox_id) is False


def test_refusals_say_what_cordon_does_instead(server):
    from e2b import Sandbox, SandboxException, AuthenticationException
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template="some-unmapped-template")
    assert "e2b.templates" in str(e.value)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "f" * 40)


def test_code_interpreter(server):
    from e2b import SandboxException
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(timeout=300)
    try:
        ex = s.run_code("x = 41\nprint('side')\nx + 1")
        assert ex.error is None, ex.error
        assert ex.logs.stdout == ["side\n"]
        assert ex.text == "42"
        assert s.run_code("x * 2").text == "82"
        ex = s.run_code(
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert pngs and pngs[0].startswith("iVBORw0KGgo")
        err = s.run_code("1 / 0")
        assert err.error is not None and err.error.name == "ZeroDivisionError"
        # run_code(envs=...): set for that cell only, as E2B's interpreter sets them.
        code = "import os\nprint(os.environ.get('CELL_ONLY', 'unset'))"
        ex = s.run_code(code, envs={"CELL_ONLY": "for-this-cell"})
        assert ex.error is None, ex.error
        assert ex.logs.stdout == ["for-this-cell\n"]
        assert s.run_code(code).logs.stdout == ["unset\n"]
        # A cell whose client gives up (its own timeout) is interrupted, and the next cell
        # of the context waits for it to end rather than failing, as E2B's interpreter
        # queues them (E2B's suite: test_interrupt.py, test_timeout.py).
        from e2b import TimeoutException
        with pytest.raises(TimeoutException):
            s.run_code("import time\ntime.sleep(120)", timeout=2)
        assert s.run_code("1 + 1", timeout=60).text == "2"
        # A cell written indented (as E2B's documentation writes them) runs as IPython runs
        # it: leading blank lines and the first line's indent come off.
        ex = s.run_code("""
            z = 6
            z * 7
            """)
        assert ex.error is None, ex.error
        assert ex.text == "42"
        # A context's cwd: its interpreter starts there (made if missing in the workspace).
        sub = s.create_code_context(language="python", cwd="/home/user/project")
        assert sub.cwd == "/home/user/project"
        ex = s.run_code("open('here.txt', 'w').write('x')", context=sub)
        assert ex.error is None, ex.error
        assert s.files.read("/home/user/project/here.txt") == "x"
        listed = {c.id: c.cwd for c in s.list_code_contexts()}
        assert listed[sub.id] == "/home/user/project"
        s.remove_code_context(sub)
        ctx = s.create_code_context(language="python")
        assert s.run_code("y = 5", context=ctx).error is None
        assert s.run_code("y + 1", context=ctx).text == "6"
        assert s.run_code("'y' in dir()").text == "False"
        if server.tier in ("container", "gvisor"):
            js = s.run_code("const a = 20; a + 22", language="javascript")
            assert js.text == "42", js
            js = s.run_code("console.log(process.env.CELL_ONLY)", language="javascript",
                            envs={"CELL_ONLY": "js-cell"})
            assert js.logs.stdout == ["js-cell\n"], js
            js = s.run_code("console.log(process.env.CELL_ONLY)", language="javascript")
            assert js.logs.stdout == ["undefined\n"], js
        else:
            # No JavaScript runtime in this tier's root: refused, saying where one is.
            with pytest.raises(SandboxException) as e:
                s.run_code("1", language="javascript")
            assert "JavaScript" in str(e.value)
        assert ctx.id in [c.id for c in s.list_code_contexts()]
        s.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in s.list_code_contexts()]
    finally:
        s.kill()


def _call(method: str, path: str, headers: dict, body: bytes = b"") -> tuple:
    """A raw request to the E2B listener (loopback only): status and body."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(ORIGIN + path, data=body or None, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_killed_sandbox_ends_its_cell_as_killed(server):
    """run_code waiting on a cell when its sandbox is killed raises the SDK's sandbox-killed
    error, as under E2B: the answer breaks off and /health answers 502 (E2B's suite:
    test_killed.py); it used to return an execution with an error."""
    import threading
    from e2b import TimeoutException
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(timeout=300)
    assert s.run_code("1").text == "1"  # the context's start is not what is measured
    t = threading.Timer(2.0, s.kill)
    t.start()
    try:
        with pytest.raises(TimeoutException) as e:
            s.run_code("import time\ntime.sleep(60)")
        assert "killed while the request was in progress" in str(e.value)
    finally:
        t.cancel()


def test_envd_needs_the_sandboxs_access_token(sbx):
    """A caller that knows a sandbox's id but not its access token reaches nothing in it."""
    import json
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
            "Content-Type": "application/json"}
    for token in (None, "0" * 48):
        h = dict(base)
        if token:
            h["X-Access-Token"] = token
        status, body = _call("POST", "/filesystem.Filesystem/ListDir", h,
                             json.dumps({"path": "/home/user"}).encode())
        assert status == 401, (status, body)
        status, _ = _call("GET", "/files?path=/home/user/x", h)
        assert status == 401
        ci = dict(h, **{"E2b-Sandbox-Port": "49999"})
        status, _ = _call("POST", "/execute", ci, json.dumps({"code": "1"}).encode())
        assert status == 401
        # The code interpreter's context routes, where E2B's SDKs send the traffic token.
        if token:
            ci = dict(ci, **{"E2B-Traffic-Access-Token": token})
        for method, path, body in (("POST", "/contexts", b"{}"), ("GET", "/contexts", b""),
                                   ("POST", "/contexts/ctx-0/restart", b""),
                                   ("DELETE", "/contexts/ctx-0", b"")):
            status, answer = _call(method, path, ci, body)
            assert status == 401, (method, path, status, answer)
    # The SDK's own tokens work: the create answered both.
    assert sbx.traffic_access_token and sbx.traffic_access_token != sbx._envd_access_token
    assert sbx.files.list("/home/user") is not None
    ci = dict(base, **{"E2b-Sandbox-Port": "49999",
                       "E2B-Traffic-Access-Token": sbx.traffic_access_token})
    status, answer = _call("GET", "/contexts", ci)
    assert status == 200, (status, answer)


def test_signed_file_urls(sbx):
    """download_url/upload_url: a plain HTTP client with no header reads and writes through
    a signed URL; a signature past its expiry, for the other operation or another path, or
    tampered with is 401."""
    import httpx
    from e2b.sandbox.signature import get_signature
    path = "/home/user/signed.txt"
    up = sbx.upload_url(path)
    assert up.startswith(ORIGIN) and "signature=v1_" in up, up
    r = httpx.post(up, files={"file": ("signed.txt", b"through a signed URL\n")}, timeout=30)
    assert r.status_code == 200, r.text
    assert sbx.files.read(path) == "through a signed URL\n"
    down = sbx.download_url(path, use_signature_expiration=60)
    assert "signature_expiration=" in down, down
    r = httpx.get(down, timeout=30)
    assert (r.status_code, r.content) == (200, b"through a signed URL\n"), r.text
    # A read signature does not write; a signature for one path does not read another.
    assert httpx.post(down, files={"file": ("x", b"no")}, timeout=30).status_code == 401
    assert sbx.files.read(path) == "through a signed URL\n"
    other = sbx.download_url("/home/user/other.txt").replace("other.txt", "signed.txt")
    assert httpx.get(other, timeout=30).status_code == 401
    tampered = down.replace("signature=v1_", "signature=v1_A")
    assert httpx.get(tampered, timeout=30).status_code == 401
    # Expired: a signature made (with the sandbox's own token) for a time already past.
    sig = get_signature(path, "read", None, sbx._envd_access_token, -10)
    r = httpx.get(f"{ORIGIN}/files", params={"path": path, "signature": sig["signature"],
                                            "signature_expiration": sig["expiration"]},
                  timeout=30)
    # envd's own answer, which E2B's SDK tests compare whole.
    assert r.status_code == 401, r.text
    assert r.json() == {"code": 401, "message": "signature is already expired"}, r.text


def test_another_tenant_cannot_reach_a_sandbox(sbx):
    """Bob's key (a valid key of another tenant) neither sees nor kills alice's sandbox."""
    from e2b import Sandbox
    bob = KEYS["bob"]
    assert sbx.sandbox_id not in [x.sandbox_id for x in Sandbox.list(api_key=bob).next_items()]
    status, body = _call("GET", f"/sandboxes/{sbx.sandbox_id}", {"X-API-KEY": bob})
    assert status == 404, body
    status, _ = _call("POST", f"/sandboxes/{sbx.sandbox_id}/connect",
                      {"X-API-KEY": bob, "Content-Type": "application/json"}, b"{}")
    assert status == 404
    assert Sandbox.kill(sbx.sandbox_id, api_key=bob) is False
    assert sbx.is_running()


def test_network_options_only_narrow(server):
    """An SDK's allow-list cannot reach past the tenant's egress ceiling (private ranges stay
    refused unless the operator names them), and egress stays denied by default."""
    from e2b import Sandbox, SandboxException
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"allow_out": ["10.1.2.3"]}, timeout=60)
    assert "403" in str(e.value) or "ceiling" in str(e.value) or "private" in str(e.value)
    s = Sandbox.create(allow_internet_access=True, timeout=60)
    try:
        # What the native API says of the same sandbox: no host allowed.
        import json
        native = server.url + f"/v1/sandboxes/{s.sandbox_id}"
        import urllib.request
        req = urllib.request.Request(native, headers={"Authorization": f"Bearer {E2B_KEY}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["allow_hosts"] == []
    finally:
        s.kill()
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"allow_out": ["api.example.com"],
                                "rules": {"api.example.com": [{"transform": {"headers": {"A": "b"}}}]}},
                       timeout=60)
    assert "catalogue" in str(e.value)


def test_figures_e2b_beside_native(server, capsys):
    """Create and run_code latency through E2B's SDK beside Cordon's own SDK, same server,
    same tier, printed (`pytest -s -k figures sdk/python/tests/test_e2b_compat.py`): a
    figure, not an assertion."""
    import statistics
    from cordon_sandbox import Cordon
    from e2b_code_interpreter import Sandbox
    n = 8
    native = Cordon(server.url, api_key=E2B_KEY)
    fig = {"e2b create": [], "native create": [], "e2b run_code": [], "native run_code": []}
    for _ in range(n):
        t = time.perf_counter()
        s = Sandbox.create(timeout=120)
        fig["e2b create"].append(time.perf_counter() - t)
        s.run_code("1")  # the default context's start, not counted
        t = time.perf_counter()
        assert s.run_code("x = 1\nx + 1").text == "2"
        fig["e2b run_code"].append(time.perf_counter() - t)
        s.kill()
        t = time.perf_counter()
        sb = native.create_sandbox(tier=server.tier, ttl="2m")
        fig["native create"].append(time.perf_counter() - t)
        sb.run_code("1")
        t = time.perf_counter()
        assert sb.run_code("x = 1\nx + 1").text == "2"
        fig["native run_code"].append(time.perf_counter() - t)
        sb.destroy()
    with capsys.disabled():
        print(f"\nE2B beside native, {server.tier} tier, {n} rounds, medians:")
        for k, v in fig.items():
            print(f"  {k:16} {statistics.median(v) * 1000:8.1f} ms  (p90 "
                  f"{sorted(v)[int(0.9 * (len(v) - 1))] * 1000:.1f} ms)")
