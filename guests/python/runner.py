"""Cordon's Python guest for the wasm tier.

Built with componentize-py into a `wasi:cli/command` component. componentize-py snapshots this
module after its top level ran, so only modules imported here exist at run time: the runner
preloads a broad part of the standard library (see PRELOAD) and installs a finder that turns
any other import into a clear error naming the tier's limits and the tier to use instead.

At run time: argv is `python -c SOURCE [ARGS...]`; the environment is exactly what the host
passed; the working directory is /work when the host preopened it. The source runs as
`__main__`; an uncaught exception prints a traceback and exits with status 1; `sys.exit(n)`
exits with n.
"""

import builtins
import importlib.abc
import os
import sys
import traceback

# Modules a data-crunching agent reaches for. Each is imported at build time so it is in the
# snapshot; a name that cannot be imported in CPython's WASI build is recorded in UNAVAILABLE.
PRELOAD = [
    "abc", "argparse", "array", "ast", "base64", "binascii", "bisect", "calendar", "cmath",
    "codecs", "collections", "collections.abc", "colorsys", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "dis", "email", "email.message",
    "email.utils", "enum", "errno", "fnmatch", "fractions", "functools", "gc", "getopt",
    "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser",
    "inspect", "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale",
    "logging", "math", "mimetypes", "numbers", "operator", "os", "os.path", "pathlib",
    "pickle", "platform", "pprint", "quopri", "random", "re", "reprlib", "secrets", "shlex",
    "shutil", "statistics", "string", "stringprep", "struct", "tempfile", "textwrap", "time",
    "timeit", "tokenize", "tomllib", "traceback", "types", "typing", "unicodedata",
    "urllib.parse", "uuid", "warnings", "weakref", "xml.dom.minidom", "xml.etree.ElementTree",
    "zipfile", "zlib", "zoneinfo", "bz2", "lzma", "sqlite3", "queue", "sched", "heapq",
    "wave", "plistlib", "configparser", "filecmp", "fileinput", "textwrap", "unittest",
    "doctest", "contextvars",
]

# Modules that exist in CPython's WASI build but cannot work in this tier (no network, no
# processes, no foreign code): importing them fails at once with a clear message.
BLOCKED = {
    "socket", "_socket", "ssl", "_ssl", "select", "selectors", "subprocess",
    "_posixsubprocess", "multiprocessing", "ctypes", "_ctypes", "asyncio", "urllib.request",
    "http.client", "http.server", "socketserver", "ftplib", "smtplib", "poplib", "imaplib",
    "xmlrpc.client", "xmlrpc.server", "webbrowser", "pty", "concurrent.futures.process",
}

UNAVAILABLE = []
for _name in PRELOAD:
    try:
        __import__(_name)
    except Exception:  # noqa: BLE001 - recorded and reported, not hidden
        UNAVAILABLE.append(_name)

AVAILABLE = sorted({n for n in PRELOAD if n not in UNAVAILABLE})


def _missing(fullname):
    top = fullname.partition(".")[0]
    return ModuleNotFoundError(
        f"No module named {fullname!r}: Cordon's wasm tier runs a WebAssembly CPython 3.14 "
        f"with the standard library only, and without network, subprocesses, threads or "
        f"foreign code (no third-party packages). Use --tier container (or a stronger tier) "
        f"for {top!r}.",
        name=fullname,
    )


class _CordonBlocked(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: modules that cannot work in this tier."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in BLOCKED:
            raise _missing(fullname)
        return None


class _CordonMissing(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: anything no other finder found is not in this tier."""

    def find_spec(self, fullname, path=None, target=None):
        raise _missing(fullname)


for _name in list(sys.modules):
    if _name in BLOCKED:
        del sys.modules[_name]
sys.meta_path.insert(0, _CordonBlocked())
sys.meta_path.append(_CordonMissing())

from wit_world import exports  # noqa: E402
from wit_world.imports import environment  # noqa: E402


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _main():
    args = environment.get_arguments()
    source = args[2] if len(args) > 2 else ""
    sys.argv = ["-c"] + list(args[3:])
    os.environ.clear()
    for key, value in environment.get_environment():
        os.environ[key] = value
    try:
        os.chdir("/work")
    except OSError:
        pass
    scope = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
    try:
        code = compile(source, "<string>", "exec")
        exec(code, scope)
        status = 0
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException:  # noqa: BLE001 - the snippet's own error, printed like CPython
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    return status


class Run(exports.Run):
    def run(self) -> None:
        status = _main()
        if status != 0:
            os._exit(status)
