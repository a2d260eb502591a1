# Cordon: the two commands a user needs are `make demo` and `make test`.
# Both run scripts/setup.sh first (idempotent: installs only what is missing).

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: setup build demo test lint bench clean

setup:
	bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace --bins
	bash scripts/build-static.sh

## Installs what is missing, builds, and runs an untrusted Python snippet in the container tier.
demo: build
	bash scripts/demo.sh

## Installs what is missing and runs every test (CI runs exactly this).
test: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) deny check licenses bans sources
	$(CARGO) test --workspace --no-fail-fast
	cd sdk/python && python3 -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo 'sdk/python: pytest collected no tests' >&2; exit 1; fi; exit $$rc
	bash scripts/static-smoke.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Start-up figures of every tier beside its peers on this host.
bench: build
	./target/release/cordon bench

clean:
	$(CARGO) clean
