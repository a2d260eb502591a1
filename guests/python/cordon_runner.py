"""Cordon's Python guest for the wasm tier: the part written in Python.

guests/python/main.c imports this module while the guest is built (under Wizer, with the
standard library readable), and the snapshot taken then is where every exec starts. So only
modules imported here exist at run time, besides the snippet's own modules in its working
directory: the standard library is not in the sandbox. This module preloads a broad part of
it (see PRELOAD, and every codec) and installs finders that turn any other import into a
clear error naming the tier's limits and the tier to use instead.

Each exec calls `main(args, env)`: args is `python -c SOURCE [ARGS...]`, env the exec's
`NAME=value` strings, exactly what the host passed. The working directory is /work (main.c
sets it). The source runs as `__main__`; an uncaught exception prints a traceback and gives
status 1; `sys.exit(n)` gives n.
"""

import builtins
import gc
import importlib.abc
import os
import pkgutil
import random
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
    "zipfile", "zlib", "zoneinfo", "bz2", "lzma", "sqlite3", "queue", "sched",
    "wave", "plistlib", "configparser", "filecmp", "fileinput", "unittest",
    "doctest", "contextvars", "encodings.idna", "copyreg", "shelve",
    "dbm", "code", "codeop", "pdb", "cProfile", "profile", "pstats", "tracemalloc",
    "concurrent.futures", "threading",
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

# Every codec: `str.encode` and `bytes.decode` import theirs on first use.
import encodings  # noqa: E402

for _info in pkgutil.iter_modules(encodings.__path__, "encodings."):
    try:
        __import__(_info.name)
    except Exception:  # noqa: BLE001 - a codec of another platform (mbcs, oem)
        pass

AVAILABLE = sorted({n for n in PRELOAD if n not in UNAVAILABLE})
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def _missing(fullname):
    top = fullname.partition(".")[0]
    return ModuleNotFoundError(
        f"No module named {fullname!r}: Cordon's wasm tier runs a WebAssembly CPython "
        f"{VERSION} with a preloaded part of the standard library, and without network, "
        f"subprocesses, threads or foreign code (no third-party packages). Use --tier "
        f"container (or a stronger tier) for {top!r}.",
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
# The standard library is not there at run time: the only directory imports search is the
# working directory (/work, the snippet's own files), as `python -c` puts it first.
sys.path_importer_cache.clear()
sys.path[:] = [""]
sys.meta_path.insert(0, _CordonBlocked())
sys.meta_path.append(_CordonMissing())


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def main(args, env):
    """One exec; returns its exit status."""
    source = args[2] if len(args) > 2 else ""
    sys.argv = ["-c"] + list(args[3:])
    # The C library read the exec's environment already (main.c); this is the mapping over it,
    # filled without putenv calls that would write it again.
    data = os.environ._data
    data.clear()
    for entry in env:
        key, sep, value = entry.partition("=")
        if sep:
            data[key.encode("utf-8", "surrogateescape")] = value.encode("utf-8", "surrogateescape")
    # The snapshot fixed the generator's state: every exec draws its own seed.
    random.seed(int.from_bytes(os.urandom(32), "little"))
    scope = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
    try:
        code = compile(source, "<string>", "exec")
        exec(code, scope)
        status = 0
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException as e:  # noqa: BLE001 - the snippet's own error, printed like CPython
        # Without this function's own frame, as `python -c` prints it.
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    return status


# The preloaded heap is the snapshot's: collected once here, then kept out of every collection
# an exec's allocations trigger (a full collection would otherwise write to every object's
# header, copying the whole heap into the exec's memory page by page).
gc.collect()
gc.freeze()
