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
    assert ex.text == "/home/user"
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
    assert ex.text == "written by files.write|written by files.write"
    ex = ci.run_code("open('from-cell.txt', 'w').write('written by a cell')")
    assert ex.error is None, ex.error
    assert ci.files.read("/home/user/from-cell.txt") == "written by a cell"
    assert ci.commands.run("cat /work/from-cell.txt").stdout == "written by a cell"
    # A context of its own starts in E2B's home too, and a subdirectory by its own name.
    ctx = ci.create_code_context(language="python")
    assert ctx.cwd == "/home/user"
    assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "/home/user"
    sub = ci.create_code_context(language="python", cwd="/home/user/proj")
    assert ci.run_code("import os\nos.getcwd()", context=sub).text == "/home/user/proj"
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
        # A str value's text as E2B's interpreter gives it: IPython's quotes taken off.
        assert s.run_code("import os; os.getenv('TEST_ENV_VAR')").text == "supertest"
        assert s.run_code("'it' + chr(39) + 's'").text == "it's"
        # Only one matching pair around the whole text goes; other text is as shown.
        assert s.run_code("[1, 'a']").text == "[1, 'a']"
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
    if ci.tier in ("container", "gvisor"):
        assert "javascript" in languages
    ctx = ci.create_code_context()
    last = ci.list_code_contexts()[-1]
    assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/home/user")
    ctx = ci.create_code_context(language="python", cwd="/tmp")
    last = ci.list_code_contexts()[-1]
    assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/tmp")
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"


def test_a_context_in_a_missing_directory_is_refused(ci):
    """A context whose cwd the sandbox's user has no directory at (E2B's suites ask for
    root's /root) is refused with a 400 that says what to do, not a 500 from a failed
    start; it is not listed, and one in a directory that exists still starts there."""
    from e2b.exceptions import SandboxException
    # /root: missing in the container and gVisor sandboxes' root, closed in the microVM's.
    for cwd, why in (("/root", ("does not exist", "may not enter")),
                     ("/no/such/dir", ("does not exist",))):
        with pytest.raises(SandboxException) as e:
            ci.create_code_context(language="python", cwd=cwd)
        said = str(e.value).replace('\\"', '"')  # the message as the JSON body quotes it
        assert said.startswith("400 "), said
        assert f'"{cwd}"' in said and any(w in said for w in why), said
        assert "/home/user" in said and "mkdir" in said, said
    assert ci.commands.run("echo x > /tmp/not-a-dir").exit_code == 0
    with pytest.raises(SandboxException) as e:
        ci.create_code_context(language="python", cwd="/tmp/not-a-dir")
    assert str(e.value).startswith("400 ") and "is not a directory" in str(e.value), e.value
    assert all(c.cwd not in ("/root", "/no/such/dir", "/tmp/not-a-dir")
               for c in ci.list_code_contexts())
    ctx = ci.create_code_context(language="python", cwd="/tmp")
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"


def test_javascript_cells_with_esm_imports_and_top_level_await(ci):
    """A JavaScript cell takes ESM `import` declarations and top-level `await`, as E2B's
    kernel does: what it declares stays for the next cell, its last expression is its
    value, a rejected promise is its error; dynamic `import()` works in any cell. Tiers
    without Node refuse the language, saying which tiers have it."""
    if ci.tier not in ("container", "gvisor"):
        from e2b.exceptions import SandboxException
        with pytest.raises(SandboxException) as e:
            ci.run_code("await 1", language="js")
        assert "JavaScript" in str(e.value), e.value
        return
    r = ci.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)",
                    language="js")
    assert r.error is None, r.error
    assert r.logs.stdout == ["function\n"]
    assert ci.run_code("await Promise.resolve('Hello World!')", language="js").text \
        == "Hello World!"
    r = ci.run_code("import * as path from 'path'; import def, { join as j } from 'path'\n"
                    "const base = await Promise.resolve('a');\n"
                    "[typeof path.join, typeof def.join, j(base, 'b')].join(' ')", language="js")
    assert r.error is None, r.error
    assert r.text == "function function a/b"
    # Declarations of the earlier cells are still there.
    assert ci.run_code("typeof readFileSync + ' ' + base", language="js").text == "function a"
    assert ci.run_code("(await import('os')).EOL.length", language="js").text == "1"
    r = ci.run_code("await Promise.reject(new Error('rejected'))", language="js")
    assert r.error is not None and r.error.value == "rejected"
    r = ci.run_code("await Promise.resolve(1) +", language="js")
    assert r.error is not None and r.error.name == "SyntaxError"


def test_typescript_cells(ci):
    """`language="ts"` (or "typescript") runs TypeScript as E2B's TypeScript kernel does:
    types, interfaces and generics go, the rest runs in Node as a JavaScript cell does
    (imports, top-level `await`, the last expression as the value), in the sandbox's own
    TypeScript context whose declarations stay for its next cell; a cell that is not valid
    TypeScript is the cell's SyntaxError, with its line and column. Tiers without Node
    refuse it, saying which tiers have it."""
    if ci.tier not in ("container", "gvisor"):
        from e2b.exceptions import SandboxException
        with pytest.raises(SandboxException) as e:
            ci.run_code("const a: number = 1", language="ts")
        assert "JavaScript" in str(e.value), e.value
        return
    r = ci.run_code(
        "interface Point { x: number; y: number }\n"
        "function largest<T extends Point>(ps: T[]): T {\n"
        "  return ps.reduce((a: T, b: T) => (a.x + a.y >= b.x + b.y ? a : b));\n"
        "}\n"
        "const best: Point = largest<Point>([{ x: 1, y: 2 }, { x: 5, y: 1 }]);\n"
        "enum Color { Red, Green }\n"
        "console.log(`${best.x},${best.y}`, Color[Color.Green] as string)",
        language="ts")
    assert r.error is None, r.error
    assert r.logs.stdout == ["5,1 Green\n"]
    # The same context (the sandbox's default TypeScript one) keeps what the cell declared.
    r = ci.run_code("import { join } from 'path'\n"
                    "const n: number = await Promise.resolve(best.x * 2);\n"
                    "join(Color[0], String(n satisfies number))", language="typescript")
    assert r.error is None, r.error
    assert r.text == "Red/10"
    assert ci.run_code("process.cwd()", language="ts").text == "/home/user"
    # Not JavaScript's context: TypeScript's names are not there.
    assert ci.run_code("typeof best", language="js").text == "undefined"
    ctx = ci.create_code_context(language="ts")
    assert ctx.language == "typescript"
    r = ci.run_code("const a: number = 1;\nlet b: = 2;", context=ctx)
    assert r.error is not None and r.error.name == "SyntaxError", r.error
    assert r.error.traceback.startswith("<typescript cell>:2:8"), r.error.traceback
    # The refused cell ran nothing, and the context goes on.
    r = ci.run_code("typeof a + ' ' + (1 as number)", context=ctx)
    assert r.error is None and r.text == "undefined 1", r


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


def _chart(ci, code):
    ex = ci.run_code(code)
    assert ex.error is None, ex.error
    charts = [r.chart for r in ex.results if r.chart is not None]
    assert len(charts) == 1, ex.results
    assert any(r.png for r in ex.results)
    return charts[0]


def test_charts_of_matplotlib_figures(ci):
    """A shown figure comes back as its PNG and its chart data, typed as E2B's SDK types
    them: line (a datetime axis), bar, scatter, pie, box and whiskers, several axes, a log
    and a categorical scale; their labels, units, ticks and elements."""
    import datetime

    from e2b_code_interpreter.charts import (BarChart, BoxAndWhiskerChart, LineChart,
                                             PieChart, ScatterChart, SuperChart)
    c = _chart(ci, """
        import datetime, math
        import matplotlib.pyplot as plt
        days = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(20)]
        plt.figure()
        plt.plot(days, [math.sin(i / 3) for i in range(20)], label='sin')
        plt.plot(days, [math.cos(i / 3) for i in range(20)], label='cos')
        plt.xlabel('Time (s)'); plt.ylabel('Amplitude [Hz]'); plt.title('Waves')
        plt.show()""")
    assert isinstance(c, LineChart)
    assert (c.title, c.x_label, c.y_label, c.x_unit, c.y_unit) == (
        "Waves", "Time (s)", "Amplitude [Hz]", "s", "Hz")
    assert (c.x_scale, c.y_scale) == ("datetime", "linear")
    assert all(isinstance(t, str) for t in c.x_ticks)
    datetime.datetime.fromisoformat(c.x_ticks[0])
    assert all(isinstance(t, float) for t in c.y_ticks)
    assert all(isinstance(t, str) for t in c.y_tick_labels) and any(c.y_tick_labels)
    assert [e.label for e in c.elements] == ["sin", "cos"]
    assert len(c.elements[0].points) == 20
    x, y = c.elements[0].points[3]
    assert datetime.datetime.fromisoformat(x).date() == datetime.date(2023, 9, 4)
    assert y == 1.0 * __import__("math").sin(1)

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        plt.bar(['A', 'B', 'C'], [100, 200, 300], label='Sold')
        plt.xlabel('Authors'); plt.ylabel('Books'); plt.title('Sales')
        plt.show()""")
    assert isinstance(c, BarChart)
    assert [(b.label, b.value, b.group) for b in c.elements] == [
        ("A", 100, "Sold"), ("B", 200, "Sold"), ("C", 300, "Sold")]
    assert (c.x_unit, c.y_unit) == (None, None)

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        plt.scatter([1, 2, 3], [4, 5, 6], label='one')
        plt.scatter([1, 2], [1, 2], label='two')
        plt.xlabel('A'); plt.ylabel('B')
        plt.show()""")
    assert isinstance(c, ScatterChart)
    assert c.title is None
    assert [(e.label, e.points) for e in c.elements] == [
        ("one", [(1.0, 4.0), (2.0, 5.0), (3.0, 6.0)]), ("two", [(1.0, 1.0), (2.0, 2.0)])]

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        plt.pie([90, 10], labels=['No', 'Yes'])
        plt.title('Early tomorrow?')
        plt.show()""")
    assert isinstance(c, PieChart)
    assert [(e.label, e.angle, e.radius) for e in c.elements] == [("No", 324, 1), ("Yes", 36, 1)]

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.boxplot([[78, 85, 88, 90, 92], [76, 85, 86, 88, 90, 91, 92]],
                   labels=['Class A', 'Class B'])
        ax.set_xlabel('Class'); ax.set_ylabel('Score'); ax.set_title('Scores')
        plt.show()""")
    assert isinstance(c, BoxAndWhiskerChart)
    assert c.title == "Scores"
    assert [(b.label, b.min, b.first_quartile, b.median, b.third_quartile, b.max, b.outliers)
            for b in c.elements] == [("Class A", 78, 85, 88, 90, 92, []),
                                     ("Class B", 85, 85.5, 88, 90.5, 92, [76])]

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        fig, (a, b) = plt.subplots(1, 2)
        fig.suptitle('Two')
        a.plot([1, 2, 3], [1, 4, 9]); a.set_title('Line')
        b.scatter([1, 2], [3, 4]); b.set_xlabel('X'); b.set_yscale('log')
        plt.show()""")
    assert isinstance(c, SuperChart)
    assert c.title == "Two"
    first, second = c.elements
    assert isinstance(first, LineChart) and first.title == "Line"
    assert isinstance(second, ScatterChart) and second.x_label == "X"
    assert second.y_scale == "log"

    c = _chart(ci, """
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], ['A', 'B', 'C'])
        plt.show()""")
    assert (c.x_scale, c.y_scale) == ("linear", "categorical")
    assert c.elements[0].points == [(1.0, "A"), (2.0, "B"), (3.0, "C")]
    # A cell without a figure has no chart (and pays nothing for extraction).
    assert all(r.chart is None for r in ci.run_code("1 + 1").results)


def test_ipython_display_in_a_root_without_ipython(ci):
    """IPython's display API, as E2B's IPython-based interpreter has it, where the sandbox's
    root has no IPython: a raw bundle, the rich wrappers, clear_output; other missing
    modules still fail to import."""
    ex = ci.run_code("from IPython.display import display\n"
                     "display({'text/latex': r'\\text{Custom}'}, raw=True)")
    assert ex.error is None, ex.error
    assert [r.formats() for r in ex.results] == [["latex"]]
    assert ex.results[0].latex == "\\text{Custom}"
    ex = ci.run_code("from IPython.display import HTML, Markdown, Image, clear_output\n"
                     "import IPython\n"
                     "clear_output(); display(HTML('<b>x</b>'), Markdown('# h'))\n"
                     "Image(data=bytes.fromhex('89504e470d0a1a0a'))")
    assert ex.error is None, ex.error
    html, md, img = ex.results
    assert (html.html, md.markdown, img.png) == ("<b>x</b>", "# h", "iVBORw0KGgo=")
    assert img.is_main_result and not html.is_main_result
    ex = ci.run_code("import no_such_module_here")
    assert ex.error is not None and ex.error.name == "ModuleNotFoundError"


def test_rich_results_of_objects(ci):
    """An object's own representations (a custom _repr_html_ and _repr_markdown_), and a
    PIL image, shown by display() and as a cell's value."""
    ex = ci.run_code("""
        class Card:
            def _repr_html_(self):
                return '<b>card</b>'
            def _repr_markdown_(self):
                return '**card**'
        Card()""")
    assert ex.error is None, ex.error
    r = ex.results[0]
    assert (r.is_main_result, r.html, r.markdown) == (True, "<b>card</b>", "**card**")
    ex = ci.run_code("""
        from PIL import Image
        img = Image.new('RGB', (4, 3), 'red')
        display(img)
        img""")
    assert ex.error is None, ex.error
    shown, value = ex.results
    assert shown.png and shown.png.startswith("iVBORw0KGgo") and not shown.is_main_result
    assert value.png == shown.png and value.is_main_result
    # As E2B's interpreter: show() and save() to a path display the image.
    ex = ci.run_code("img.show()\nimg.save('red.png')\nprint('saved')")
    assert ex.error is None, ex.error
    assert [r.png for r in ex.results] == [shown.png, shown.png]
    assert ex.logs.stdout == ["saved\n"]
    assert ci.files.read("/home/user/red.png", format="bytes")[:4] == b"\x89PNG"


def test_a_dataframe_as_data(ci):
    """A pandas DataFrame as a cell's value: its columns as E2B's `data` (times as ISO
    text), beside its HTML table and text."""
    ex = ci.run_code("""
        import pandas as pd
        pd.DataFrame({'a': [1, 2], 'b': ['x', 'y'],
                      't': pd.to_datetime(['2024-01-02', '2024-03-04'])})""")
    assert ex.error is None, ex.error
    r = ex.results[0]
    assert r.is_main_result
    assert r.data == {"a": [1, 2], "b": ["x", "y"],
                      "t": ["2024-01-02T00:00:00", "2024-03-04T00:00:00"]}
    assert "<table" in r.html and "a" in r.text
    # Anything else has no data.
    assert ci.run_code("{'a': [1]}").results[0].data is None
