"""`cordon run -- sh -c true` of two builds beside bubblewrap on this host: rounds of build A,
build B and `bwrap --unshare-all` with a read-only /usr (the shape `cordon bench` compares),
each round in that order, and the median of each with its ratio to bwrap. A build is a
`cordon` with its `cordon-sandbox-init` beside it (make them with scripts/build-static.sh and
copy them aside). With one build, A is compared alone. Usage:
python3 scripts/run-ab.py A_CORDON [B_CORDON] [rounds] (ADR 0042)"""
import statistics, subprocess, sys, time

BWRAP = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
         "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
         "--dev", "/dev", "sh", "-c", "true"]
args = sys.argv[1:]
rounds = int(args.pop()) if args and args[-1].isdigit() else 40
runs = {f"{k} ({b})": [b, "run", "--", "sh", "-c", "true"] for k, b in zip("AB", args)}
runs["bwrap"] = BWRAP


def ms(argv):
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"{argv[0]} failed ({done.returncode}); run it by hand to see why")
    return (time.perf_counter() - start) * 1000


for argv in runs.values():
    ms(argv)
times = {k: [] for k in runs}
for _ in range(rounds):
    for k, argv in runs.items():
        times[k].append(ms(argv))
bwrap = statistics.median(times["bwrap"])
for k, t in times.items():
    m = statistics.median(t)
    print(f"{k}: {m:.2f} ms ({m / bwrap:.2f}x bwrap)")
print(f"(medians of {rounds} rounds, each round in the order above)")
