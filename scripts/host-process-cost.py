"""What the host's process count costs a start here, without Cordon: the median wall time
of a fork+exec of `true` and of `bwrap --unshare-all ... sh -c true` (and of `cordon run`
when CORDON_RUN names a binary), first as the host is, then with N more idle processes
(`sleep`). Usage: python3 scripts/host-process-cost.py N [runs] (ADR 0026)"""
import os, shutil, statistics, subprocess, sys, time

N = int(sys.argv[1]); RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
SLEEP = shutil.which("busybox") and [shutil.which("busybox"), "sleep"] or ["sleep"]
BWRAP = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
         "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
         "--dev", "/dev", "sh", "-c", "true"]
CORDON = os.environ.get("CORDON_RUN")

def med(argv):
    ts = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)

def measure(label):
    row = {"true": med(["/bin/true"]), "bwrap": med(BWRAP)}
    if CORDON:
        row["cordon run"] = med([CORDON, "run", "--", "sh", "-c", "true"])
    print(f"{label:>24}: " + "  ".join(f"{k} {v:.2f} ms" for k, v in row.items()), flush=True)
    return row

tasks = lambda: sum(1 for d in os.listdir("/proc") if d.isdigit())
a = measure(f"{tasks()} host processes")
procs = []
for i in range(N):
    procs.append(subprocess.Popen(SLEEP + ["900"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
time.sleep(5)
b = measure(f"{tasks()} host processes")
for p in procs:
    p.kill()
for p in procs:
    p.wait()
print("ratios: " + "  ".join(f"{k} {b[k] / a[k]:.2f}x" for k in a))
