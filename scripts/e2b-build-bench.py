#!/usr/bin/env python3
"""E2B template builds beside native ones (ADR 0048): starts a `cordon serve` with its E2B
listener on loopback (container tier, `ubuntu:22.04` mapped to the Debian root, as
sdk/python/tests/test_e2b_template_build.py does), then alternates, ROUNDS times, an E2B
`Template.build` of one step (cache missed) and the native `cordon template build` of one
step, and prints each one's wall time and the medians.

    python3 scripts/e2b-build-bench.py [ROUNDS]     # default 8; needs `make setup`'s SDKs

Every byte stays on this machine: the SDK's URLs are the loopback listener's, set before it
is imported (by test_e2b_compat, imported first)."""

import importlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk/python/tests"))
# The tests' own helpers (a module beside the tests, not a package setup installs); this
# one sets the SDK's loopback URLs before the SDK is imported.
compat = importlib.import_module("test_e2b_compat")
cordon_bin = importlib.import_module("conftest").cordon_bin


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    server = compat.e2b_server("container", builds=True,
                               e2b_extra='[e2b.images]\n"ubuntu:22.04" = "debian"\n')
    d = server.tmp
    from e2b import Template
    env = dict(os.environ, CORDON_HOME=str(d / "data"))
    e2b, native = [], []
    try:
        # The first build imports the Debian root into the store: not measured.
        Template.build(Template().from_image("ubuntu:22.04").run_cmd("true"), "warm")
        for i in range(rounds):
            t0 = time.monotonic()
            Template.build(Template().from_image("ubuntu:22.04").skip_cache()
                           .run_cmd(f"true {i}"), f"b{i}")
            e2b.append(time.monotonic() - t0)
            t0 = time.monotonic()
            r = subprocess.run([cordon_bin(), "template", "build", f"n{i}", "--from", "debian",
                                "--run", f"true n{i}"], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"the native build failed: {r.stderr[-2000:]}")
            native.append(time.monotonic() - t0)
    finally:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)
    diffs = [a - b for a, b in zip(e2b, native)]
    print("e2b build (s):    ", " ".join(f"{x:.2f}" for x in e2b),
          f" median {statistics.median(e2b):.2f}")
    print("native build (s): ", " ".join(f"{x:.2f}" for x in native),
          f" median {statistics.median(native):.2f}")
    print(f"paired difference median: {statistics.median(diffs):.2f} s")


if __name__ == "__main__":
    main()
