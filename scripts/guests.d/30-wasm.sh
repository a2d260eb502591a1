#!/usr/bin/env bash
# The wasm tier's guests: QuickJS built to wasm32-wasip1 (guests/js) and CPython built to
# wasm32-wasi (guests/python), both pre-initialized with Wizer. Both land content-addressed in
# $(cordon_data_dir)/guests/ with a manifest.json the backend reads; precompiled code is
# cached next to them by the backend on first use. Idempotent: each guest is rebuilt only
# when its inputs (sources, tool versions) changed or its artifact is missing or corrupt.
# Run by scripts/guests.sh; $CORDON_BIN_DIR, when set, holds a build of the workspace whose
# examples/wizen is used instead of building that tool again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
repo=${CORDON_REPO:-$(cd "$here/../.." && pwd)}

# The Python guest's CPython: the newest python$PY_SERIES source package the source indexes
# offer (trixie's: setup.d/30-wasm.sh adds them); its upstream version is the one built.
PY_SERIES=3.13
WASMTIME_WIZER_VERSION=48.0.8   # pinned in crates/cordon-wasm/Cargo.toml

data=$(cordon_data_dir)
guests="$data/guests"
mkdir -p "$guests/cache"

# inputs_hash FILE...: one hash over the names and contents of the inputs and versions
# (and $INPUTS_EXTRA, a guest's own tool versions).
inputs_hash() {
  { for f in "$@"; do echo "== $f"; cat "$f"; done
    [ -z "${INPUTS_EXTRA:-}" ] || echo "$INPUTS_EXTRA"
    rustc --version; clang-19 --version | head -1
    dpkg-query -W -f='wasi-libc ${Version}\n' wasi-libc; } | sha256sum | cut -c1-64
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

# Python: CPython built from Debian's python3.13 source package (upstream's tarball, which apt
# checks against the archive's signed index), cross-compiled to wasm32-wasi with clang 19 and
# wasi-libc together with zlib and SQLite (from their source packages too), statically linked
# with guests/python/main.c into a WASI reactor, then pre-initialized by wizen with the
# standard library readable (ADR 0020): the interpreter starts and cordon_runner preloads its
# modules once, here. The cross build needs a build Python of the same version, so that is
# built first (natively, once). The builds are kept under $data/tools/cpython-$PY_VERSION.

# newest_source PKG: the newest version of source package PKG the indexes offer.
newest_source() {
  { apt-cache showsrc "$1" 2>/dev/null || true; } | awk '/^Version:/ { print $2 }' | sort -V | tail -1
}

# unpack_source PKG DEST: unpacks the upstream tarball of source package PKG into DEST (one
# directory, printed). apt checks every file it fetches against the archive's signed index;
# only the upstream tarball is used, so a newer revision whose other files the mirror no
# longer has still serves, and so does an older version when the newest has no tarball.
unpack_source() {
  local pkg=$1 dest=$2 dl v orig="" top
  dl=$(mktemp -d)
  for v in $(apt-cache showsrc "$pkg" 2>/dev/null | awk '/^Version:/ { print $2 }' | sort -rV); do
    (cd "$dl" && apt-get source -q --download-only "$pkg=$v" >/dev/null 2>&1) || true
    orig=$(find "$dl" -maxdepth 1 -name "${pkg}_*.orig.tar.*" ! -name '*.asc' | awk 'NR == 1')
    [ -n "$orig" ] && break
  done
  if [ -z "$orig" ]; then
    rm -rf "$dl"
    log "could not fetch the source of $pkg: run scripts/setup.d/30-wasm.sh (it adds the source indexes)"
    return 1
  fi
  top=$(tar -tf "$orig" | awk -F/ 'NR == 1 { print $1 }')
  rm -rf "${dest:?}/$top"
  tar -C "$dest" -xf "$orig"
  rm -rf "$dl"
  echo "$dest/$top"
}

PY_DEB_VERSION=$(newest_source "python$PY_SERIES")
ZLIB_DEB_VERSION=$(newest_source zlib)
SQLITE_DEB_VERSION=$(newest_source sqlite3)
[ -n "$PY_DEB_VERSION" ] && [ -n "$ZLIB_DEB_VERSION" ] && [ -n "$SQLITE_DEB_VERSION" ] || {
  log "no source packages found: run scripts/setup.d/30-wasm.sh (it adds the source indexes)"; exit 1; }
PY_VERSION=${PY_DEB_VERSION%%-*}
# CPython's build info (sys.version) carries the upstream release's date, from its tarball,
# not the build's: clang takes __DATE__ and __TIME__ from SOURCE_DATE_EPOCH. (Two builds still
# differ in their snapshot's bytes: ADR 0020.)
deps="zlib $ZLIB_DEB_VERSION sqlite3 $SQLITE_DEB_VERSION source-date"
py_inputs=$(cd "$repo/guests/python" && INPUTS_EXTRA="cpython $PY_VERSION $deps wasmtime-wizer $WASMTIME_WIZER_VERSION" \
  inputs_hash main.c cordon_runner.py ../../crates/cordon-wasm/examples/wizen.rs)
if ! up_to_date python "$py_inputs"; then
  tools="$data/tools/cpython-$PY_VERSION"
  src="$tools/Python-$PY_VERSION"
  mkdir -p "$tools"
  if [ ! -f "$src/.cordon-unpacked" ]; then
    log "fetching CPython $PY_VERSION (Debian source package python$PY_SERIES)"
    rm -rf "$src"
    unpack_source "python$PY_SERIES" "$tools" >/dev/null
    [ -d "$src" ] || { log "the python$PY_SERIES source did not unpack into $src"; exit 1; }
    touch "$src/.cordon-unpacked"
  fi
  SOURCE_DATE_EPOCH=$(stat -c %Y "$src/configure")
  export SOURCE_DATE_EPOCH
  native="$src/cross-build/build"
  if [ ! -x "$native/python" ]; then
    log "building CPython $PY_VERSION for this machine (the cross build's build Python)"
    mkdir -p "$native"
    # The interpreter alone: the cross build runs its scripts with the build's own
    # standard library and no extension module of this machine's build.
    (cd "$native" && ../../configure -q >"$tools/native.log" 2>&1 && make -j"$(nproc)" -s python >>"$tools/native.log" 2>&1) || {
      tail -30 "$tools/native.log" >&2; exit 1; }
  fi
  # zlib and SQLite for wasm32-wasi, as static libraries CPython's configure finds and the
  # guest links. SQLite: no threads, no extensions loaded at run time, no WAL or mmap (WASI
  # has no shared memory mappings).
  libs="$tools/wasi-libs"
  if [ "$(cat "$libs/.deps" 2>/dev/null)" != "$deps" ]; then
    log "building zlib and SQLite for wasm32-wasi"
    rm -rf "$libs" "$tools/src"
    mkdir -p "$libs/include" "$libs/lib" "$tools/src"
    zsrc=$(unpack_source zlib "$tools/src")
    (cd "$zsrc" && mkdir -p wasi &&
      for f in adler32 compress crc32 deflate gzclose gzlib gzread gzwrite infback inffast \
               inflate inftrees trees uncompr zutil; do
        clang-19 --target=wasm32-wasi -O2 -DHAVE_UNISTD_H -c "$f.c" -o "wasi/$f.o" || exit 1
      done &&
      llvm-ar rcs "$libs/lib/libz.a" wasi/*.o && cp zlib.h zconf.h "$libs/include/")
    ssrc=$(unpack_source sqlite3 "$tools/src")
    (mkdir -p "$ssrc/bld" && cd "$ssrc/bld" &&
      ../configure -q --disable-tcl >"$tools/sqlite.log" 2>&1 &&
      make -s sqlite3.c >>"$tools/sqlite.log" 2>&1 &&
      clang-19 --target=wasm32-wasi -O2 -DSQLITE_THREADSAFE=0 -DSQLITE_OMIT_LOAD_EXTENSION \
        -DSQLITE_OMIT_WAL -DSQLITE_MAX_MMAP_SIZE=0 -D_WASI_EMULATED_GETPID \
        -D_WASI_EMULATED_SIGNAL -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_MMAN \
        -c sqlite3.c -o sqlite3.o >>"$tools/sqlite.log" 2>&1 &&
      llvm-ar rcs "$libs/lib/libsqlite3.a" sqlite3.o && cp sqlite3.h "$libs/include/") || {
      tail -30 "$tools/sqlite.log" >&2; exit 1; }
    rm -rf "$tools/src"
    echo "$deps" > "$libs/.deps"
  fi
  wasi="$src/cross-build/wasi"
  if [ ! -f "$wasi/libpython$PY_SERIES.a" ] || [ "$(cat "$wasi/.deps" 2>/dev/null)" != "$deps" ]; then
    log "building CPython $PY_VERSION for wasm32-wasi"
    rm -rf "$wasi"
    mkdir -p "$wasi"
    (cd "$wasi" &&
      CONFIG_SITE=../../Tools/wasm/config.site-wasm32-wasi CFLAGS=-O2 \
      CC="clang-19 --target=wasm32-wasi" CPP="clang-19 --target=wasm32-wasi -E" \
      AR=llvm-ar RANLIB=llvm-ranlib PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=/nonexistent \
      ZLIB_CFLAGS="-I$libs/include" ZLIB_LIBS="-L$libs/lib -lz" \
      LIBSQLITE3_CFLAGS="-I$libs/include" LIBSQLITE3_LIBS="-L$libs/lib -lsqlite3 -lwasi-emulated-mman -lwasi-emulated-getpid" \
      ../../configure -q -C --host=wasm32-unknown-wasi --build="$(../../config.guess)" \
        --with-build-python="$native/python" --disable-test-modules >"$tools/wasi.log" 2>&1 &&
      make -j"$(nproc)" -s >>"$tools/wasi.log" 2>&1) || { tail -30 "$tools/wasi.log" >&2; exit 1; }
    echo "$deps" > "$wasi/.deps"
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The standard library as the guest sees it while it is initialized (and only then):
  # upstream's Lib without its tests and the tools no sandbox runs, the build's sysconfig
  # data, and our runner.
  lib="$tmp/lib/python$PY_SERIES"
  mkdir -p "$lib"
  (cd "$src/Lib" && tar -cf - --exclude=test --exclude=tests --exclude=idlelib \
    --exclude=tkinter --exclude=turtledemo --exclude=ensurepip --exclude=__pycache__ .) |
    tar -C "$lib" -xf -
  cp "$wasi"/build/lib.*/_sysconfigdata_*.py "$lib/"
  cp "$repo/guests/python/cordon_runner.py" "$lib/"
  log "linking the Python guest"
  clang-19 --target=wasm32-wasi -O2 -I"$wasi" -I"$src/Include" \
    -c "$repo/guests/python/main.c" -o "$tmp/main.o"
  clang-19 --target=wasm32-wasi -mexec-model=reactor -Wl,--strip-debug \
    -z stack-size=8388608 -Wl,--stack-first -Wl,--initial-memory=20971520 \
    -o "$tmp/raw.wasm" "$tmp/main.o" "$wasi/libpython$PY_SERIES.a" \
    "$wasi/Modules/_decimal/libmpdec/libmpdec.a" "$wasi/Modules/_hacl/libHacl_Hash_SHA2.a" \
    "$wasi/Modules/expat/libexpat.a" "$libs/lib/libsqlite3.a" "$libs/lib/libz.a" \
    -lwasi-emulated-mman -ldl -lwasi-emulated-signal -lwasi-emulated-getpid -lwasi-emulated-process-clocks -lm
  log "pre-initializing the Python guest (wasmtime-wizer $WASMTIME_WIZER_VERSION)"
  preopen="$lib=/usr/local/lib/python$PY_SERIES"
  if [ -n "${CORDON_BIN_DIR:-}" ] && [ -x "$CORDON_BIN_DIR/examples/wizen" ]; then
    "$CORDON_BIN_DIR/examples/wizen" --preopen "$preopen" "$tmp/raw.wasm" "$tmp/python.wasm"
  else
    flock /tmp/cordon-cargo.lock cargo run -q --locked --manifest-path "$repo/Cargo.toml" \
      -p cordon-wasm --example wizen -- --preopen "$preopen" "$tmp/raw.wasm" "$tmp/python.wasm"
  fi
  install_guest python python "$tmp/python.wasm" "$py_inputs"
  rm -rf "$tmp"
  trap - EXIT
fi
# Both guests precompiled for this build's engine into the backend's verified cache
# (guests/cache), so that no first run pays for it inside its own deadline: compiling the
# Python guest takes ~10 s here, far more on a loaded machine, and a fresh machine's first
# `cordon run --tier wasm --lang python` (the bench's, in make test) timed out on it.
# A no-op in well under a second when the cache holds them.
if [ -n "${CORDON_BIN_DIR:-}" ] && [ -x "$CORDON_BIN_DIR/cordon-full" ]; then
  for lang_code in "python pass" "javascript 0"; do
    set -- $lang_code
    "$CORDON_BIN_DIR/cordon-full" run --tier wasm --lang "$1" --timeout 10m -c "$2" >/dev/null 2>&1 || {
      log "precompiling the $1 guest failed: run \`$CORDON_BIN_DIR/cordon-full run --tier wasm --lang $1 -c '$2'\` to see why"
      exit 1; }
  done
  log "wasm guests precompiled for $CORDON_BIN_DIR/cordon-full"
fi
# Builds of other CPython versions, and the componentize-py the guest was once built with.
for old in "$data/tools"/cpython-* "$data/tools"/componentize-py-*; do
  [ -e "$old" ] && [ "$old" != "$data/tools/cpython-$PY_VERSION" ] && rm -rf "$old"
done
true
