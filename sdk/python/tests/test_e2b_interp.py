"""E2B's code interpreter and home directory beyond the quick-start flows, through the pinned
SDKs (`e2b`, `e2b-code-interpreter`) against the E2B listener (issue 47): `/home/user` is
the workspace's own mount point on every program tier (a cell's `os.getcwd()` and a
command's `pwd` answer it, and Cordon's `/work` names the same files). Every byte stays on
loopback."""

import sys

import pytest

assert "e2b" not in sys.modules or "test_e2b_compat" in sys.modules, \
    "the E2B SDK must not be imported before its URLs are set"

# Importing it sets the SDK's URLs; its `server` fixture runs this module on every tier.
from test_e2b_compat import server  # noqa: E402,F401


@pytest.fixture
def ci(server):
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(timeout=300)
    s.tier = server.tier
    yield s
    try:
        s.kill()
    except Exception:
        pass


def test_home_user_is_the_workspaces_mount_point(ci, server):
    """A cell and a command start in /home/user by that name (a link would answer /work),
    the E2B files API and the cell see the same files there, and /work names them too."""
    ex = ci.run_code("import os\nos.getcwd()")
    assert ex.error is None, ex.error
    assert ex.text == "'/home/user'"
    ex = ci.run_code("import os\n(os.environ['HOME'], os.path.realpath('.'))")
    assert ex.text == "('/home/user', '/home/user')"
    r = ci.commands.run("pwd; /bin/pwd -P; echo $HOME; cd /home/user && /bin/pwd -P")
    assert r.stdout == "/home/user\n/home/user\n/home/user\n/home/user\n"
    # Not a link: a directory that is a mount point of its own.
    r = ci.commands.run("test -L /home/user && echo link || echo dir; "
                        "cut -d' ' -f5 /proc/self/mountinfo | grep -x /home/user")
    assert r.stdout == "dir\n/home/user\n"
    # The files API and the cell: the same files under either name.
    ci.files.write("/home/user/from-api.txt", "written by files.write")
    ex = ci.run_code("open('/home/user/from-api.txt').read() + '|' + "
                     "open('/work/from-api.txt').read()")
    assert ex.text == "'written by files.write|written by files.write'"
    ex = ci.run_code("open('from-cell.txt', 'w').write('written by a cell')")
    assert ex.error is None, ex.error
    assert ci.files.read("/home/user/from-cell.txt") == "written by a cell"
    assert ci.commands.run("cat /work/from-cell.txt").stdout == "written by a cell"
    # A context of its own starts in E2B's home too, and a subdirectory by its own name.
    ctx = ci.create_code_context(language="python")
    assert ctx.cwd == "/home/user"
    assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "'/home/user'"
    sub = ci.create_code_context(language="python", cwd="/home/user/proj")
    assert ci.run_code("import os\nos.getcwd()", context=sub).text == "'/home/user/proj'"
    assert ci.commands.run("pwd", cwd="/home/user/proj").stdout == "/home/user/proj\n"


def test_the_native_api_keeps_work(server):
    """Cordon's own API on the same server: a sandbox's programs and contexts start in
    /work by that name, and the same files are under /home/user."""
    from cordon_sandbox import Cordon
    from test_e2b_compat import E2B_KEY
    sb = Cordon(server.url, api_key=E2B_KEY).create_sandbox(tier=server.tier, ttl="2m")
    try:
        assert sb.exec("pwd").stdout == "/work\n"
        assert sb.run_code("import os\nos.getcwd()").text == "'/work'"
        sb.write_file("/work/native.txt", b"native")
        assert sb.exec("cat /home/user/native.txt").stdout == "native"
    finally:
        sb.destroy()


def test_a_sandboxs_envs_in_cells_and_commands(server):
    """The envs a sandbox is made with reach Python and bash cells and commands; a cell's
    own envs win for that cell only."""
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(timeout=120, envs={"TEST_ENV_VAR": "supertest"})
    try:
        assert s.run_code("import os; os.getenv('TEST_ENV_VAR')").text == "'supertest'"
        r = s.run_code("echo $TEST_ENV_VAR", language="bash")
        assert r.error is None, r.error
        assert r.logs.stdout == ["supertest\n"]
        r = s.run_code("echo $TEST_ENV_VAR", language="bash", envs={"TEST_ENV_VAR": "mine"})
        assert r.logs.stdout == ["mine\n"]
        assert s.run_code("echo $TEST_ENV_VAR", language="bash").logs.stdout == ["supertest\n"]
        r = s.run_code("echo $FOO", language="bash", envs={"FOO": "bar"})
        assert r.logs.stdout == ["bar\n"]
        assert s.run_code("echo ${FOO:-default}", language="bash").logs.stdout == ["default\n"]
        assert s.commands.run("echo $TEST_ENV_VAR").stdout == "supertest\n"
    finally:
        s.kill()


def test_bash_contexts(ci):
    """A bash context keeps its shell's state from cell to cell; run_code(language="bash")
    uses the sandbox's default one; a failing command is the cell's error; a cell may end
    its shell, and the next gets a new one."""
    ctx = ci.create_code_context(language="bash")
    assert ctx.language == "bash"
    assert ctx.cwd == "/home/user"
    r = ci.run_code("X=41; f() { echo $((X + $1)); }; mkdir -p sub && cd sub", context=ctx)
    assert r.error is None, r.error
    r = ci.run_code("f 1; pwd; echo err >&2", context=ctx)
    assert "".join(r.logs.stdout) == "42\n/home/user/sub\n"
    assert r.logs.stderr == ["err\n"]
    r = ci.run_code("false", context=ctx)
    assert r.error is not None and r.error.value == "1"
    r = ci.run_code("exit 3", context=ctx)
    assert r.error is not None
    r = ci.run_code("echo ${X:-gone}; pwd", context=ctx)
    assert "".join(r.logs.stdout) == "gone\n/home/user\n"
    # The default bash context, separate from this one.
    r = ci.run_code("echo $X; pwd", language="bash")
    assert "".join(r.logs.stdout) == "\n/home/user\n"
    # IPython's shell escape in a Python cell.
    assert "".join(ci.run_code("!pwd").logs.stdout).strip() == "/home/user"
    assert any(c.id == ctx.id and c.language == "bash" for c in ci.list_code_contexts())


def test_contexts_listed_as_e2b_lists_them(ci):
    """The default Python (and, where the tier has Node, JavaScript) contexts are listed
    before any use, first; a new context is last, with its options."""
    contexts = ci.list_code_contexts()
    languages = [c.language for c in contexts]
    assert languages[0] == "python"
    if ci.tier == "container":
        assert "javascript" in languages
    ctx = ci.create_code_context()
    last = ci.list_code_contexts()[-1]
    assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/home/user")
    ctx = ci.create_code_context(language="python", cwd="/tmp")
    last = ci.list_code_contexts()[-1]
    assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/tmp")
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"


def test_the_interpreter_comes_back_after_it_is_killed(ci):
    """A cell that kills its own interpreter ends as a dead kernel; the next cell of the
    context runs in a fresh one, as does the one after an interpreter that exited."""
    assert ci.run_code("x = 1; x").text == "1"
    r = ci.run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.error is not None
    assert ci.run_code("x = 2; x").text == "2"
    r = ci.run_code("import os; os._exit(0)")
    assert r.error is not None
    assert ci.run_code("'y' in dir(), 3").text == "(False, 3)"
