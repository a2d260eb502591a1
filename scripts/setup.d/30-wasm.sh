#!/usr/bin/env bash
# The wasm tier's toolchain: Debian's clang 19 and wasi-libc (QuickJS and CPython to
# wasm32-wasi), the rust target, and the source of the CPython the Python guest is built from
# (Debian's python3.13 source package, so a deb-src entry; tclsh makes SQLite's one-file
# source from its source package). The guests themselves are built by
# scripts/guests.d/30-wasm.sh (setup.sh runs it last; `make test` runs it after its build,
# with the tools that build made).
# part: wasm
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install clang-19 lld-19 libclang-rt-19-dev-wasm32 wasi-libc llvm xz-utils tcl8.6
# The JavaScript guest (guests/js) is a Rust crate built for this target.
rustup_target_add wasm32-wasip1
# The backports build of wasi-libc (2024): it has __wasilibc_reset_preopens and the environ
# hooks a pre-initialized program needs to read its exec's preopens and environment afresh
# (guests/python/main.c); bookworm's 2022 build has neither.
installed=$(dpkg-query -W -f='${Version}' wasi-libc 2>/dev/null || true)
if [[ $installed != *"~bpo12"* ]]; then
  add_bookworm_backports
  apt_update_once
  policy=$(apt-cache policy wasi-libc 2>/dev/null || true)
  if ! grep -q bookworm-backports <<<"$policy"; then
    log "no wasi-libc in bookworm-backports: the Python guest needs its 2024 build (__wasilibc_reset_preopens); add that suite to apt's sources and run setup again"
    exit 1
  fi
  log "installing wasi-libc from bookworm-backports"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    -t bookworm-backports wasi-libc >/dev/null
fi
# Source packages (apt-get source --download-only): bookworm's and trixie's, from the archive
# this machine's own bookworm entry names, checked by apt against its signed indexes like any
# package.
src=/etc/apt/sources.list.d/cordon-src.sources
# (Read whole before grep: `grep -q` would stop apt-cache mid-output, a failure under pipefail.)
sources=$(apt-cache showsrc python3.13 2>/dev/null || true)
if [ ! -f "$src" ] || ! grep -q '^Package: python3.13' <<<"$sources"; then
  archive=$(debian_mirror_uri)
  [ -n "$archive" ] || { log "no apt entry for bookworm found: add one, then run setup again"; exit 1; }
  log "adding Debian's source indexes (the wasm tier's CPython is built from python3.13's)"
  printf '%s\n' 'Types: deb-src' "URIs: $archive" 'Suites: bookworm trixie' \
    'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
    $SUDO tee "$src" >/dev/null
  rm -f /tmp/.cordon-apt-updated
  apt_update_once
fi
