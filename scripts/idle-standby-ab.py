"""ADR 0039's A/B: an exec of `true` warm and after 31 s of idleness, per tier, against a
real `cordon serve` ($CORDON_BIN). Usage: python3 scripts/idle-standby-ab.py container gvisor"""
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The repository's own SDK and test helpers, imported by name at run time.
HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "sdk" / "python" / "tests"))
sys.path.insert(0, str(HERE / "sdk" / "python"))
budgets = importlib.import_module("test_shared_budgets")
ServerProc, KEYS = budgets.ServerProc, budgets.KEYS
Cordon = importlib.import_module("cordon_sandbox").Cordon
d=Path(tempfile.mkdtemp())
s=ServerProc(d/'data', {}, nofile=20000, sessions='max_sandboxes = 100\n').start()
try:
    a=Cordon(s.url, KEYS['alice'], retries=0)
    for tier in sys.argv[1:]:
        sb=a.create_sandbox(tier=tier)
        sb.exec("true","sh")
        warm=[];cold=[]
        for i in range(5):
            for _ in range(3):
                t=time.monotonic(); sb.exec("true","sh"); warm.append((time.monotonic()-t)*1000)
            time.sleep(31)
            t=time.monotonic(); sb.exec("true","sh"); cold.append((time.monotonic()-t)*1000)
        print(tier, "warm p50 %.1f ms (n=%d)"%(statistics.median(warm),len(warm)), "after 31 s idle p50 %.1f ms (n=%d)"%(statistics.median(cold),len(cold)), [round(x,1) for x in cold], flush=True)
        sb.destroy()
finally: s.stop()
