"""A pause in memory beside a pause to files (`files_only`), on the container tier of a real
`cordon serve` ($CORDON_BIN, else the cargo target's): what the host still holds of a
sandbox with 32 MiB of files and a program holding 256 MiB (differences of /proc/meminfo's
AnonPages and Shmem from before the program started), and each pause's and resume's time.
Usage: python3 scripts/pause-files-bench.py [rounds]"""
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The repository's own SDK and test helpers, imported by name at run time.
HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "sdk" / "python" / "tests"))
sys.path.insert(0, str(HERE / "sdk" / "python"))
conftest = importlib.import_module("conftest")
Cordon = importlib.import_module("cordon_sandbox").Cordon
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def meminfo() -> dict:
    """AnonPages and Shmem of the host, MiB."""
    got = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            if key in ("AnonPages", "Shmem"):
                got[key] = int(value.split()[0]) // 1024
    return got


def held(base: dict) -> str:
    time.sleep(3)
    now = meminfo()
    return ", ".join(f"{k} {now[k] - base[k]:+d} MiB" for k in base)


def timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


d = Path(tempfile.mkdtemp(prefix="cordon-pause-bench-"))
server = conftest.ServerProc(d / "data", {})
server.start()
try:
    sb = Cordon(server.url, api_key=conftest.KEYS["alice"]).create_sandbox("container", ttl="30m")
    sb.exec("head -c 33554432 /dev/urandom > /work/blob")
    base = meminfo()
    sb.exec("python3 -c \"import time; x = b'x' * (256 << 20); time.sleep(3600)\"",
            background=True)
    print(f"a program holding 256 MiB, running: {held(base)}")
    sb.pause()
    print(f"paused in memory: {held(base)}")
    sb.resume()
    sb.pause(files_only=True)
    print(f"paused to files: {held(base)} "
          f"({sb.info.on_disk_bytes / 2**20:.1f} MiB of files on disk)")
    sb.resume()
    rounds = {"pause in memory": [], "resume from memory": [], "pause to files": [],
              "resume from files": []}
    for _ in range(ROUNDS):
        rounds["pause in memory"].append(timed(sb.pause))
        rounds["resume from memory"].append(timed(sb.resume))
        rounds["pause to files"].append(timed(lambda: sb.pause(files_only=True)))
        rounds["resume from files"].append(timed(sb.resume))
    for what, ms in rounds.items():
        print(f"{what}: median {statistics.median(ms):.1f} ms of {ROUNDS}")
    sb.destroy()
finally:
    server.stop()
    shutil.rmtree(d, ignore_errors=True)
