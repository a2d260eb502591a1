"""E2B's JavaScript test suites (vitest) against `cordon serve`, for run.py (docs/e2b.md).

Each suite runs from its sources at the pinned commit (the SDK's own `src`, as E2B runs it)
with the npm packages its lockfile resolves, installed by setup into
scripts/e2b-suites/js/<suite>/node_modules (package-lock.json there). One vitest process per
suite, with a config written here (E2B's projects less the browser and Cloudflare runtimes, which
need a browser or E2B's cloud), the JSON reporter, and the loopback guard
(js/loopback-guard.cjs) in every Node process: NODE_OPTIONS preloads it and the setup file
js/vitest-setup.mjs loads it in each worker and skips the tests that name a public host
(found here, the way the Python guard finds them, and counted as deselected)."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

from cordon_e2b_guard import public_hosts

JS_DIR = Path(__file__).resolve().parent / "js"

# (name, the package's directory in its checkout, its tests under it, the npm install for it,
#  the vitest projects: (name, include, exclude, test timeout ms, setup files of the suite's own))
JS_SUITES = [
    ("e2b js", "packages/js-sdk", "tests", "e2b", [
        ("unit", ["tests/**/*.test.ts"],
         ["tests/runtimes/**", "tests/template/**", "tests/connectionConfig.test.ts"], 30_000,
         ["tests/globalFetchFallback.setup.ts"]),
        ("template", ["tests/template/**/*.test.ts"], [], 180_000,
         ["tests/globalFetchFallback.setup.ts"]),
        ("connectionConfig", ["tests/connectionConfig.test.ts"], [], 10_000, []),
    ]),
    ("code-interpreter js", "js", "tests", "code-interpreter", [
        ("code-interpreter", ["tests/**/*.test.ts"], ["tests/runtimes/**"], 30_000, []),
    ]),
]
SUITE_TIMEOUT_S = 3600
# A test call's first line: `test('name'`, `sandboxTest.skipIf(x)('name'`, `it.only("name"`.
_TEST_CALL = re.compile(
    r"^[ \t]*(?:\w*[tT]est|it)\b(?:\.\w+(?:\([^()\n]*\))?)*\(\s*(['\"`])((?:\\.|(?!\1).)*)\1",
    re.M)


def public_host_tests(tests: Path) -> list:
    """`file::name` of each test whose source (from its call to the next test's) names a
    public host, with the host."""
    found = []
    for path in sorted(tests.rglob("*.test.ts*")):
        src = path.read_text(errors="replace")
        calls = list(_TEST_CALL.finditer(src))
        for i, m in enumerate(calls):
            end = calls[i + 1].start() if i + 1 < len(calls) else len(src)
            hosts = public_hosts(src[m.start():end])
            if hosts:
                found.append((f"{path.relative_to(tests)}::{m.group(2)}", hosts[0]))
    return found


def mocked_files(tests: Path) -> list:
    """The test files that mock E2B's API with msw (the SDK's own unit tests). They run as
    E2B's CI runs them, their requests going to the mock: a real build or sandbox among them
    (template/tags.test.ts' four builds) goes to `api.localhost` and fails to connect."""
    return sorted(str(p.relative_to(tests)) for p in tests.rglob("*.test.ts*")
                  if re.search(r"""from ['"]msw""", p.read_text(errors="replace")))


def guard_holds(env: dict) -> str:
    """'' when a Node process with the suites' environment refuses a non-loopback connection
    (192.0.2.1, a documentation address: nothing is sent either way), else what went wrong."""
    env = js_env(env, Path("."), Path("/dev/null"), Path("/dev/null"))
    probe = ("require('net').connect(9,'192.0.2.1').on('error',e=>{console.log(e.message);"
             "process.exit(0)}).on('connect',()=>{console.log('connected');process.exit(1)});"
             "setTimeout(()=>{console.log('no refusal');process.exit(1)},5000)")
    p = subprocess.run(["node", "-e", probe], env=env, capture_output=True, text=True,
                       timeout=30)
    return "" if p.returncode == 0 and "loopback is reachable" in p.stdout else (p.stdout + p.stderr).strip()


def vitest_config(projects: list, setup: Path, out: Path) -> str:
    """A vitest config with `projects` (see JS_SUITES) and the guard's setup file first."""
    items = []
    for name, include, exclude, timeout, setups in projects:
        items.append({"test": {
            "name": name, "include": include, "exclude": exclude or ["**/node_modules/**"],
            "isolate": True, "globals": False, "environment": "node", "testTimeout": timeout,
            "hookTimeout": timeout, "setupFiles": [str(setup), *setups],
            "deps": {"interopDefault": True}}})
    config = {"test": {"reporters": ["dot", "json"], "outputFile": {"json": str(out)},
                       "projects": items}}
    return ("import { defineConfig } from 'vitest/config'\n\n"
            f"export default defineConfig({json.dumps(config, indent=1)})\n")


def js_env(env: dict, tests: Path, deselect: Path, mocked: Path) -> dict:
    env = dict(env)
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        env[f"CORDON_{name}"] = env[name]
    guard = str(JS_DIR / "loopback-guard.cjs")
    env["NODE_OPTIONS"] = " ".join(filter(None, [f"--require={guard}",
                                                 env.get("NODE_OPTIONS")]))
    env.update(CORDON_E2B_DESELECT=str(deselect), CORDON_E2B_MOCKED=str(mocked),
               CORDON_E2B_TESTS_DIR=str(tests),
               CI="1", NO_COLOR="1")
    return env


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:240]
    return ""


def file_results(report: dict, tests: Path, deselected: dict, mocked: list) -> list:
    """Per test file, in run.py's form, from vitest's JSON report."""
    out = []
    for f in sorted(report.get("testResults", []), key=lambda r: r.get("name", "")):
        rel = str(Path(f["name"]).relative_to(tests)) if f.get("name") else "?"
        r = {"file": rel, "tests": [], "deselected": [], "seconds": 0.0, "note": ""}
        if f.get("startTime") and f.get("endTime"):
            r["seconds"] = round((f["endTime"] - f["startTime"]) / 1000, 1)
        # A file that failed as a whole (a hook, its import) has its tests "skipped": errors.
        broken = f.get("status") == "failed" and bool(f.get("message"))
        for t in f.get("assertionResults", []):
            key = f"{rel}::{t['title']}"
            if key in deselected:
                r["deselected"].append({"name": t["title"], "host": deselected[key]})
                continue
            outcome = {"passed": "passed", "failed": "failed"}.get(
                t["status"], "error" if broken else "skipped")
            msgs = t.get("failureMessages") or ([f["message"]] if outcome == "error" else [])
            r["tests"].append({"name": " > ".join([*t.get("ancestorTitles", []), t["title"]]),
                               "outcome": outcome, "message": first_line(msgs[0]) if msgs
                               else ""})
        if not r["tests"] and not r["deselected"]:
            r["note"] = "collection failed: " + first_line(f.get("message", "")) \
                if f.get("message") else "no tests"
        elif rel in mocked and r["tests"]:
            r["note"] = "the SDK alone: E2B's API mocked (msw)"
        out.append(r)
    return out


def run_js_suite(suite: tuple, tree: Path, env: dict, tmp: Path, filt: str) -> list:
    """One suite of JS_SUITES found in `tree`; its files' results, or one note of failure."""
    name, pkg, tests_rel, deps, projects = suite
    pkg_dir, modules = tree / pkg, JS_DIR / deps / "node_modules"
    tests = pkg_dir / tests_rel
    if not (modules / "vitest").is_dir():
        return [{"file": "*", "tests": [], "deselected": [], "seconds": 0.0,
                 "note": f"not run: no {modules}/vitest: run scripts/setup.sh (part test)"}]
    link = pkg_dir / "node_modules"
    if not link.exists():
        link.symlink_to(modules)
    found = public_host_tests(tests)
    deselected = dict(found)
    tag = name.replace(" ", "-")
    deselect = tmp / f"{tag}-deselect.json"
    deselect.write_text(json.dumps(sorted(deselected)))
    mocked = mocked_files(tests)
    mocked_list = tmp / f"{tag}-mocked.json"
    mocked_list.write_text(json.dumps(mocked))
    out = tmp / f"{tag}-vitest.json"
    config = pkg_dir / "cordon.vitest.config.mts"
    config.write_text(vitest_config(projects, JS_DIR / "vitest-setup.mjs", out))
    cmd = ["node", str(modules / "vitest/vitest.mjs"), "run", "--config", str(config),
           "--root", str(pkg_dir), "--maxWorkers=2", *([filt] if filt else [])]
    started = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=pkg_dir, env=js_env(env, tests, deselect, mocked_list),
                           capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
        log = p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        log = f"timed out after {SUITE_TIMEOUT_S} s"
    (tmp / f"{tag}-vitest.log").write_text(log)
    if not out.exists():
        return [{"file": "*", "tests": [], "deselected": [], "note": "vitest wrote no report: "
                 + first_line(log[-2000:]), "seconds": round(time.monotonic() - started, 1)}]
    return file_results(json.loads(out.read_text()), tests, deselected, mocked)
