#!/usr/bin/env bash
# Runs an untrusted Python snippet in the container tier and shows what it could not do.
set -euo pipefail
cd "$(dirname "$0")/.."
CORDON=./target/release/cordon
export DEMO_HOST_SECRET="sk-live-this-must-not-leak"
cat <<'PY' > /tmp/cordon-demo.py
import os, socket
print("hello from the sandbox: 2 + 2 =", 2 + 2)
print("whoami:", os.getuid(), "| env keys:", sorted(os.environ))
print("host secret visible:", "DEMO_HOST_SECRET" in os.environ)
for path in ("/etc/shadow", "/root", "/home"):
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).read()
        print("READ", path)
    except OSError as e:
        print("blocked:", path, "-", e.strerror)
try:
    socket.create_connection(("169.254.169.254", 80), timeout=2)
    print("REACHED the metadata service")
except OSError as e:
    print("blocked: network -", e.strerror)
PY
echo "== cordon run --lang python --script /tmp/cordon-demo.py"
"$CORDON" run --lang python --timeout 10s --memory 256M --pids 64 --script /tmp/cordon-demo.py
echo
echo "== a fork bomb, stopped by the process limit"
"$CORDON" run --lang bash --pids 32 --timeout 10s -- 'b() { b | b & }; b; wait' || echo "(exit status $? = process-limit)"
echo
if [ -x ./target/release/cordon-full ]; then
  echo "== cordon doctor"
  "$CORDON" doctor
else
  cat <<'MSG'
== the other tiers
This demo built only the container tier. Each other tier is made ready by one command, which
installs its packages and builds its parts (a request for a tier that is not ready fails at once
and names the same command):
  ./target/release/cordon setup wasm       # WebAssembly: Python and JavaScript in wasmtime
  ./target/release/cordon setup gvisor     # gVisor (runsc): a user-space kernel
  ./target/release/cordon setup microvm    # QEMU microVMs: a kernel of their own
  ./target/release/cordon setup all        # every tier, the server and every command (make build)
MSG
fi
