#!/usr/bin/env python3
"""What reading file metadata costs a listing and an upload through the E2B listener
(ADR 0037): a directory of N files listed, and small files uploaded, against a real
`cordon serve` on one tier; run it once per binary (CORDON_BIN) and compare.
  CORDON_BIN=.../cordon python3 scripts/e2b-metadata-ab.py [--tier container] [-n 1000]
Prints the median of the rounds in milliseconds. Loopback only."""
import argparse
import importlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

# The repository's own E2B test helpers (they set the SDK's URLs before it is imported).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk/python/tests"))
e2b_server = importlib.import_module("test_e2b_compat").e2b_server


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tier", default="container")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    s = e2b_server(a.tier)
    try:
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=600)
        sbx.commands.run(f"mkdir -p /home/user/d && cd /home/user/d && "
                         f"for i in $(seq {a.n}); do echo $i > f$i; done")
        lists, puts = [], []
        for _ in range(a.rounds):
            t = time.perf_counter()
            assert len(sbx.files.list("d")) == a.n
            lists.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            for i in range(20):
                sbx.files.write(f"p{i}.txt", "x")
            puts.append((time.perf_counter() - t) * 1000 / 20)
        print(f"{a.tier} {os.environ.get('CORDON_BIN')}: list of {a.n} files "
              f"{statistics.median(lists):.1f} ms, one small upload "
              f"{statistics.median(puts):.2f} ms (medians of {a.rounds})")
        sbx.kill()
    finally:
        s.stop()
        shutil.rmtree(s.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
