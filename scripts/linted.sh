#!/usr/bin/env bash
# linted.sh CARGO-COMMAND...: runs a cargo build or test with clippy's driver compiling the
# workspace's own crates (cargo's RUSTC_WORKSPACE_WRAPPER; dependencies keep plain rustc),
# denying every warning, as `cargo clippy -- -D warnings` does. The build is then the lint:
# `make test` compiles the workspace once instead of a clippy check and a test build
# (docs/adr/0009-one-build-in-make-test.md). A clippy or compiler warning fails the build.
set -euo pipefail
driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver 2>/dev/null || true)
if [ -z "$driver" ] || [ ! -x "$driver" ]; then
  echo "linted.sh: clippy-driver not found; install it with \`rustup component add clippy\`" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$driver"
# cargo-clippy's own encoding of the driver's arguments: joined by this separator.
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
exec "$@"
