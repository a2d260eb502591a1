#!/usr/bin/env bash
# The wasm tier's guests: QuickJS built to wasm32-wasip1 (guests/js) and a componentize-py
# CPython component (guests/python/runner.py). Both land content-addressed in
# $(cordon_data_dir)/guests/ with a manifest.json the backend reads; precompiled code is
# cached next to them by the backend on first use. Idempotent: each guest is rebuilt only
# when its inputs (sources, tool versions) changed or its artifact is missing or corrupt.
# Run by scripts/guests.sh; $CORDON_BIN_DIR, when set, holds a build of the workspace whose
# examples/wizen is used instead of building that tool again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
repo=${CORDON_REPO:-$(cd "$here/../.." && pwd)}

COMPONENTIZE_PY_VERSION=0.25.1   # carries CPython 3.14
WASI_CLI_WORLD=wasi:cli/command@0.2.12
WASMTIME_WASI_VERSION=48.0.8
WASMTIME_WIZER_VERSION=48.0.8   # pinned in crates/cordon-wasm/Cargo.toml

data=$(cordon_data_dir)
guests="$data/guests"
mkdir -p "$guests/cache"

# inputs_hash FILE...: one hash over the names and contents of the inputs and versions
# (and $INPUTS_EXTRA, a guest's own tool versions).
inputs_hash() {
  { for f in "$@"; do echo "== $f"; cat "$f"; done
    echo "componentize-py $COMPONENTIZE_PY_VERSION world $WASI_CLI_WORLD wasmtime-wasi $WASMTIME_WASI_VERSION"
    [ -z "${INPUTS_EXTRA:-}" ] || echo "$INPUTS_EXTRA"
    rustc --version; clang-19 --version | head -1; } | sha256sum | cut -c1-64
}

# up_to_date NAME HASH: the stamp matches and the artifact it names is intact.
up_to_date() {
  local stamp="$guests/.$1.inputs" want file
  [ -f "$stamp" ] || return 1
  read -r want file < "$stamp" || return 1
  [ "$want" = "$2" ] && [ -f "$guests/$file" ] || return 1
  local named=${file##*-}
  [ "$(sha256sum "$guests/$file" | cut -c1-64)" = "${named%.wasm}" ]
}

# install NAME PREFIX BUILT HASH: content-address BUILT, record it in the manifest, prune.
install_guest() {
  local name=$1 prefix=$2 built=$3 inputs=$4 sha file
  sha=$(sha256sum "$built" | cut -c1-64)
  file="$prefix-$sha.wasm"
  cp "$built" "$guests/$file.tmp" && mv "$guests/$file.tmp" "$guests/$file"
  python3 - "$guests/manifest.json" "$name" "$file" <<'PY'
import json, os, sys
path, name, file = sys.argv[1:]
try:
    with open(path) as f:
        m = json.load(f)
except (OSError, ValueError):
    m = {}
m[name] = file
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(m, f, indent=1, sort_keys=True)
os.replace(tmp, path)
PY
  for old in "$guests/$prefix"-*.wasm; do
    [ "$old" = "$guests/$file" ] || rm -f "$old"
  done
  find "$guests/cache" -name "$name-*" ! -name "$name-${sha:0:16}-*" -delete 2>/dev/null || true
  echo "$inputs $file" > "$guests/.$name.inputs"
  log "wasm guest $name: $file"
}

# JavaScript: QuickJS (rquickjs) to wasm32-wasip1 with Debian's clang and wasi-libc, then
# pre-initialized with Wizer (crates/cordon-wasm/examples/wizen.rs, wasmtime-wizer
# $WASMTIME_WIZER_VERSION): the interpreter, its context and the console are built once here and
# every exec starts from that snapshot. The tool is part of the inputs, as is its Cargo.lock pin.
js_inputs=$(cd "$repo/guests/js" && INPUTS_EXTRA="wasmtime-wizer $WASMTIME_WIZER_VERSION" inputs_hash Cargo.toml Cargo.lock src/lib.rs src/prelude.js \
  ../../crates/cordon-wasm/examples/wizen.rs)
if ! up_to_date javascript "$js_inputs"; then
  log "building the JavaScript guest (QuickJS -> wasm32-wasip1)"
  (cd "$repo/guests/js" &&
    RQUICKJS_SYS_NO_WASI_SDK=1 CC_wasm32_wasip1=clang-19 AR_wasm32_wasip1=llvm-ar \
    CFLAGS_wasm32_wasip1="-isystem /usr/include/wasm32-wasi" \
    CARGO_TARGET_DIR="$repo/guests/js/target" \
    flock /tmp/cordon-cargo.lock cargo build -q --release --locked --target wasm32-wasip1)
  log "pre-initializing the JavaScript guest (wasmtime-wizer $WASMTIME_WIZER_VERSION)"
  jstmp=$(mktemp -d)
  trap 'rm -rf "$jstmp"' EXIT
  js_raw="$repo/guests/js/target/wasm32-wasip1/release/cordon_js_guest.wasm"
  if [ -n "${CORDON_BIN_DIR:-}" ] && [ -x "$CORDON_BIN_DIR/examples/wizen" ]; then
    "$CORDON_BIN_DIR/examples/wizen" "$js_raw" "$jstmp/js.wasm"
  else
    flock /tmp/cordon-cargo.lock cargo run -q --locked --manifest-path "$repo/Cargo.toml" \
      -p cordon-wasm --example wizen -- "$js_raw" "$jstmp/js.wasm"
  fi
  install_guest javascript js "$jstmp/js.wasm" "$js_inputs"
  rm -rf "$jstmp"
  trap - EXIT
fi

# Python: componentize-py (pinned, in its own venv) over our runner.
py_inputs=$(cd "$repo/guests/python" && inputs_hash runner.py)
if ! up_to_date python "$py_inputs"; then
  venv="$data/tools/componentize-py-$COMPONENTIZE_PY_VERSION"
  if [ ! -x "$venv/bin/componentize-py" ]; then
    log "installing componentize-py $COMPONENTIZE_PY_VERSION"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  # The WASI WIT files come from the wasmtime-wasi crate the host is built with, so the
  # guest imports exactly the interfaces the host provides.
  wit=$(flock /tmp/cordon-cargo.lock cargo metadata -q --format-version 1 --manifest-path "$repo/Cargo.toml" |
    python3 -c 'import json,sys,os
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wasmtime-wasi" and p["version"] == sys.argv[1]:
        print(os.path.join(os.path.dirname(p["manifest_path"]), "src/p2/wit"))' "$WASMTIME_WASI_VERSION")
  [ -d "$wit" ] || { log "wasmtime-wasi $WASMTIME_WASI_VERSION sources not found"; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  log "building the Python guest (componentize-py $COMPONENTIZE_PY_VERSION)"
  # A clean environment: nothing of the build machine's environment goes into the snapshot.
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$tmp" \
    "$venv/bin/componentize-py" -d "$wit" -w "$WASI_CLI_WORLD" componentize runner \
    -p "$repo/guests/python" -o "$tmp/python.wasm" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  install_guest python python "$tmp/python.wasm" "$py_inputs"
fi
