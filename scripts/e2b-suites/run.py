#!/usr/bin/env python3
"""Runs a checkout of E2B's own SDK test suites against a real `cordon serve` (docs/e2b.md).

    scripts/e2b-suites.sh [--tier container|gvisor] [--lang python|js|all] [--json OUT]
        [--filter TEXT] DIR...

Each DIR is a git repository of e2b-dev/E2B or e2b-dev/code-interpreter, read at its
commit pinned in PINS (or a plain directory, run as it is); the suites found in it are run
against one `cordon serve` started here with its E2B listener on loopback: the Python ones
file by file, each in its own pytest process, the JavaScript ones (js_suites.py) in one vitest
process per suite; a line per file says how many of its tests passed, then each suite's totals. The suites are another project's code: they stay outside this
repository, and nothing here edits them.

Every byte stays on this machine: E2B_API_URL, E2B_SANDBOX_URL (the listener), E2B_DOMAIN
(`localhost`) and E2B_API_KEY are in the environment before the SDK is imported, and the
pytest plugin cordon_e2b_guard (next to this file) deselects tests that name a public host
and refuses, in the test process, any name resolution or connection beyond loopback; for
the JavaScript suites js/loopback-guard.cjs does the same in every Node process."""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from js_suites import JS_SUITES, guard_holds, run_js_suite

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# (name, the suite's directory in its checkout, the directory its tests are run from)
PY_SUITES = [
    ("e2b python", "packages/python-sdk/tests", "packages/python-sdk"),
    ("code-interpreter python", "python/tests", "python"),
]
# The commits the suites are run at (docs/e2b.md): a git repository given as DIR is read at
# its pin, never at whatever it has checked out.
PINS = {
    "e2b-dev/E2B": "b8029973aa7da5f741f7bb1a9f833b38a0885438",
    "e2b-dev/code-interpreter": "7df1757bfd5baa037f909ce97c2dbe014da973c0",
}
E2B_KEY = "e2b_" + "5eed" * 10
FILE_TIMEOUT_S = 600


def cordon_bin() -> str:
    b = os.environ.get("CORDON_BIN")
    if b:
        return b
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for p in (target / "debug/cordon", target / "release/cordon"):
        if p.exists():
            return str(p)
    sys.exit("e2b-suites: no cordon binary: run `cargo build --workspace --bins` "
             "or set CORDON_BIN")


def git_dir(d: Path):
    """`d`'s git directory when `d` is a repository (a bare one or a work tree), else None."""
    for g in (d / ".git", d):
        if (g / "HEAD").is_file() and (g / "objects").is_dir():
            return g
    return None


def pinned(d: Path, into: Path) -> Path:
    """A repository `d` as its pinned commit has it, written under `into`; a plain
    directory is used as it is (not pinned: said on the output)."""
    g = git_dir(d)
    if g is None:
        print(f"e2b-suites: {d} is no git repository: its files are run as they are, "
              f"at no pinned commit", flush=True)
        return d
    for repo, commit in PINS.items():
        have = subprocess.run(["git", "--git-dir", str(g), "cat-file", "-e",
                               f"{commit}^{{commit}}"], capture_output=True)
        if have.returncode != 0:
            continue
        out = into / repo.replace("/", "+")
        out.mkdir(parents=True, exist_ok=True)
        paths = [t for _, t, _ in PY_SUITES] + [s[1] for s in JS_SUITES]
        present = [p for p in paths if subprocess.run(
            ["git", "--git-dir", str(g), "cat-file", "-e", f"{commit}:{p}"],
            capture_output=True).returncode == 0]
        archive = subprocess.run(["git", "--git-dir", str(g), "archive", commit, *present],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
        print(f"e2b-suites: {repo} at {commit[:12]} (from {d})", flush=True)
        return out
    sys.exit(f"e2b-suites: {d} has none of the pinned commits "
             f"({', '.join(f'{r} {c[:12]}' for r, c in PINS.items())}): fetch them")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`cordon serve` with the E2B listener on loopback; one tenant whose key is E2B_KEY."""

    def __init__(self, tier: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="cordon-e2b-suites-"))
        # E2B's template builds: the build's sandbox opens the template store (its parents
        # must be passable), and the `debian` base is read from the microvm guest image
        # setup built.
        self.tmp.chmod(0o755)
        (self.tmp / "data").mkdir(mode=0o755)
        home = os.environ.get("CORDON_HOME") or "/var/lib/cordon"
        (self.tmp / "data" / "microvm").symlink_to(Path(home) / "microvm")
        self.port = free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        config = self.tmp / "cordon.toml"
        config.write_text(
            f'data_dir = "{self.tmp / "data"}"\nbind = "127.0.0.1:0"\n'
            f'default_tier = "{tier}"\n'
            f'[[keys]]\ntenant = "suite"\nkey = "{E2B_KEY}"\n'
            '[sessions]\nreap_interval = "100ms"\n'
            '[tenant_defaults]\ntrust = "trusted"\n'
            'tiers = ["runtime", "wasm", "container", "gvisor", "microvm"]\n'
            f'[e2b]\nlisten = "127.0.0.1:{self.port}"\ntier = "{tier}"\n'
            # A cell's timeout is the sandbox's exec timeout: matplotlib's first import
            # builds its font cache, slow on a loaded host.
            'limits = { timeout_ms = 180000 }\n'
            # `https://<port>-<id>.localhost` as E2B's tests fetch get_host's URL: port 443
            # on loopback, a certificate from the data dir's CA (the tests' processes trust
            # it, below); their sandboxes' ports public unless a create says otherwise.
            'https_listen = "127.0.0.1:443"\npublic_traffic = true\n'
            # This machine reaches no registry: the images E2B's template tests build from
            # are served by the Debian root (docs/e2b.md, Template builds).
            '[e2b.images]\n"ubuntu:22.04" = "debian"\n"e2bdev/base" = "debian"\n')
        self.ca = self.tmp / "data" / "e2b-https" / "ca.pem"
        self.log = open(self.tmp / "serve.log", "w")
        self.proc = subprocess.Popen([cordon_bin(), "serve", "--config", str(config)],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        # The native API's address (the same tenant's key works there).
        self.native = line.strip().rsplit(" ", 1)[-1]
        if "listening on" not in line:
            self.stop()
            sys.exit(f"e2b-suites: cordon serve did not start: {line!r}; "
                     f"see {self.tmp / 'serve.log'}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def loopback_env(origin: str, ca: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=origin, E2B_SANDBOX_URL=origin, E2B_DOMAIN="localhost",
               E2B_API_KEY=E2B_KEY)
    # The listener's HTTPS certificates come from the server's own CA: the only one these
    # processes trust (httpx and requests read the first two, Node the third).
    env.update(SSL_CERT_FILE=str(ca), REQUESTS_CA_BUNDLE=str(ca), NODE_EXTRA_CA_CERTS=str(ca))
    # No proxy may carry a request anywhere: the SDK talks to loopback only.
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
              "all_proxy"):
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "*"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


PYTEST_INI = """[pytest]
markers =
    skip_debug: E2B's: skipped when E2B_DEBUG is set (never here)
    e2e: E2B's end-to-end marker
    timeout: E2B's per-test timeout marker
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
"""


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:240]
    return ""


def run_py_file(path: Path, run_dir: Path, env: dict, ini: Path, xml_out: Path,
                tests: Path) -> dict:
    """One test file in its own pytest process; its tests' outcomes from the JUnit XML. The
    suite's own helper modules (beside its conftest) are importable, as E2B runs it."""
    env = dict(env, PYTHONPATH=os.pathsep.join([str(tests), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(run_dir),
           "-p", "cordon_e2b_guard", "-p", "no:cacheprovider", "--import-mode=importlib",
           "-q", "-rN", f"--junitxml={xml_out}", str(path)]
    started = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True,
                           timeout=FILE_TIMEOUT_S)
        out, timed_out = p.stdout + p.stderr, False
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        timed_out = True
    res = {"file": "", "tests": [], "deselected": [], "seconds": 0.0, "note": ""}
    res["seconds"] = round(time.monotonic() - started, 1)
    for m in re.finditer(r"E2B-SUITES-DESELECTED (\S+) names a public host: (\S+)", out):
        res["deselected"].append({"name": m.group(1).split("::")[-1], "host": m.group(2)})
    if timed_out:
        res["note"] = f"timed out after {FILE_TIMEOUT_S} s"
        return res
    if xml_out.exists():
        for case in ET.parse(xml_out).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = first_line(el.get("message") or el.text or "")
                    break
            res["tests"].append({"name": case.get("name"), "outcome": outcome,
                                 "message": message})
    if not res["tests"] and not res["deselected"]:
        # Nothing collected: an import error or a missing fixture module; say which.
        errs = [line for line in out.splitlines() if line.startswith("E ")]
        res["note"] = "collection failed: " + (errs[-1][2:].strip()[:240] if errs
                                                else first_line(out[-2000:]))
    return res


def report_line(rel: str, r: dict) -> str:
    t = r["tests"]
    passed = sum(1 for x in t if x["outcome"] == "passed")
    status = "PASS" if t and passed == len(t) else ("SKIP" if not t and r["deselected"]
                                                     else "FAIL")
    extra = f", {len(r['deselected'])} deselected (public host)" if r["deselected"] else ""
    note = f" [{r['note']}]" if r["note"] else ""
    return f"  {status:4} {passed:3}/{len(t):<3} {rel}{extra}{note}"


def new_totals() -> dict:
    return {"files": 0, "tests": 0, "passed": 0, "failed": 0, "error": 0, "skipped": 0,
            "deselected": 0, "not collected": 0}


def count(totals: dict, r: dict) -> None:
    totals["files"] += 1
    totals["tests"] += len(r["tests"])
    totals["deselected"] += len(r["deselected"])
    totals["not collected"] += 1 if r["note"] and not r["tests"] else 0
    for t in r["tests"]:
        totals[t["outcome"]] += 1


def show(r: dict, verbose: bool) -> None:
    print(report_line(r["file"], r), flush=True)
    if verbose:
        for t in r["tests"]:
            if t["outcome"] in ("failed", "error"):
                print(f"         {t['name']}: {t['message']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path,
                    help="checkouts of e2b-dev/E2B and/or e2b-dev/code-interpreter")
    ap.add_argument("--tier", default="container", choices=["container", "gvisor"],
                    help="the tier of the listener's sandboxes (default container)")
    ap.add_argument("--lang", default="all", choices=["python", "js", "all"],
                    help="the suites to run: E2B's Python ones, JavaScript ones, or both")
    ap.add_argument("--filter", default="", help="run only files whose path contains TEXT")
    ap.add_argument("--json", type=Path, help="write every test's outcome to this file")
    ap.add_argument("--verbose", action="store_true", help="print each failure's message")
    ap.add_argument("--keep", action="store_true", help="keep the server's data and log")
    a = ap.parse_args()

    suites = []
    trees = Path(tempfile.mkdtemp(prefix="cordon-e2b-trees-"))
    for d in a.dirs:
        d = pinned(d.resolve(), trees)
        for name, tests, run_from in PY_SUITES if a.lang != "js" else []:
            if (d / tests).is_dir():
                suites.append((name, d / tests, d / run_from, None))
        for js in JS_SUITES if a.lang != "python" else []:
            if (d / js[1] / js[2]).is_dir():
                suites.append((js[0], d / js[1] / js[2], d, js))
    if not suites:
        sys.exit("e2b-suites: no suite found: give a checkout holding packages/python-sdk/tests "
                 "or packages/js-sdk (e2b-dev/E2B), python/tests or js (e2b-dev/code-interpreter)")

    # A TERM (a CI timeout) stops the server too, through the `finally` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = Server(a.tier)
    print(f"cordon serve: E2B listener {server.origin}, tier {a.tier}, log "
          f"{server.tmp / 'serve.log'}", flush=True)
    env = loopback_env(server.origin, server.ca)
    ini = server.tmp / "pytest.ini"
    ini.write_text(PYTEST_INI)
    results, totals, per_suite = [], new_totals(), {}
    try:
        for name, tests, run_dir, js in suites:
            print(f"{name} ({tests})", flush=True)
            suite_totals = per_suite.setdefault(name, new_totals())
            if js is not None:
                broken = guard_holds(env)
                if broken:
                    sys.exit(f"e2b-suites: the loopback guard does not hold in Node: {broken}")
                found = run_js_suite(js, run_dir, env, server.tmp, a.filter)
            else:
                found = []
                for n, path in enumerate(sorted(tests.rglob("test_*.py"))):
                    rel = str(path.relative_to(tests))
                    if a.filter not in rel:
                        continue
                    r = run_py_file(path, run_dir, env, ini, server.tmp / f"junit-{n}.xml",
                                    tests)
                    r["file"] = rel
                    found.append(r)
                    show(r, a.verbose)
            for r in found:
                r["suite"] = name
                if js is not None:
                    show(r, a.verbose)
                results.append(r)
                count(totals, r)
                count(suite_totals, r)
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in suite_totals.items()),
                  flush=True)
    finally:
        server.stop()
    print("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"tier": a.tier, "totals": totals, "suites": per_suite,
                                     "files": results},
                                     indent=1))
    shutil.rmtree(trees, ignore_errors=True)
    if not a.keep:
        shutil.rmtree(server.tmp, ignore_errors=True)
    return 0 if totals["passed"] == totals["tests"] else 1


if __name__ == "__main__":
    sys.exit(main())
