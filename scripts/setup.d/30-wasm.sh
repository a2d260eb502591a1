#!/usr/bin/env bash
# The wasm tier's toolchain: Debian's clang 19 and wasi-libc (QuickJS to wasm32-wasip1), the
# rust target, and python3-venv for componentize-py. The guests themselves are built by
# scripts/guests.d/wasm.sh (setup.sh runs it last; `make test` runs it after its build, with
# the tools that build made).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
apt_install clang-19 lld-19 libclang-rt-19-dev-wasm32 wasi-libc llvm python3-venv
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  log "adding the rust target wasm32-wasip1"
  rustup target add wasm32-wasip1 >/dev/null
fi
