# Cordon: the two commands a user needs are `make demo` and `make test`.
# Both run scripts/setup.sh first (idempotent: installs only what is missing).

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# `make test` builds the workspace once: clippy's driver compiles the workspace's own crates
# (dependencies keep rustc), so the test build is also the lint, with the same `-D warnings`
# as `cargo clippy --workspace --all-targets -- -D warnings` (`make lint`). Why and what it
# saves: docs/adr/0009-one-build-in-make-test.md. `--all-targets` builds the examples as
# tests; the second build makes them as programs (guests.sh runs examples/wizen), which the
# test run would build anyway. The tests then run side by side (scripts/run-tests.py: the
# workspace's test binaries, its doc tests, cargo deny, the SDK's tests and the static
# smoke, three at a time, longest first; docs/adr/0012-tests-side-by-side.md).
LINTED = bash scripts/linted.sh
# Each step runs as a timed phase: a table of the phases' times at the end, and on a failure
# the phase, what the machine is missing and the command that fixes it (scripts/phase.sh).
export CORDON_PHASE_LOG ?= $(abspath $(TARGET_DIR))/phases.tsv
PHASE = bash scripts/phase.sh

.PHONY: setup check-setup build demo test lint bench clean openapi

setup:
	bash scripts/setup.sh

## Every rust target, program, cargo tool and Python module a build or test uses is installed
## by a setup step and present on this machine (setup.sh ends with this too).
check-setup:
	python3 scripts/check-setup.py

build:
	@$(PHASE) --begin
	@$(PHASE) setup -- env CORDON_SETUP_GUESTS=later bash scripts/setup.sh
	@$(PHASE) build -- $(CARGO) build --release --workspace --bins
	@$(PHASE) guests -- bash scripts/guests.sh --bin-dir $(TARGET_DIR)/release
	@$(PHASE) static -- bash scripts/build-static.sh
	@$(PHASE) --report

## Installs what is missing, builds only what the demo runs (the front and the container tier's
## init), and runs an untrusted Python snippet in the container tier. Every other tier:
## `target/release/cordon setup wasm|gvisor|microvm|all` (scripts/setup-tier.sh); all: `make build`.
demo:
	@$(PHASE) --begin
	@$(PHASE) setup -- bash scripts/setup.sh base
	@$(PHASE) build -- bash scripts/build-front.sh
	@$(PHASE) demo -- bash scripts/demo.sh
	@$(PHASE) --report

## Installs what is missing and runs every test (CI runs exactly this).
# The static (musl) front and init are built unoptimised here: the tests need them built and
# working, not fast; the guest agent stays optimised (docs/adr/0016).
test: export CORDON_MUSL_PROFILE = dev
test:
	@$(PHASE) --begin
	@$(PHASE) setup -- env CORDON_SETUP_GUESTS=later bash scripts/setup.sh
	@$(PHASE) fmt -- $(CARGO) fmt --all -- --check
	@$(PHASE) build -- $(LINTED) $(CARGO) test --workspace --all-targets --no-run
	@$(PHASE) examples -- $(LINTED) $(CARGO) build --workspace --examples
	@$(PHASE) guests -- bash scripts/guests.sh --bin-dir $(TARGET_DIR)/debug
	@$(PHASE) tests -- python3 scripts/run-tests.py \
	  --also 'deny=$(CARGO) deny check licenses bans sources' \
	  --also 'sdk=bash scripts/sdk-tests.sh' \
	  --also 'static-smoke=bash scripts/static-smoke.sh' \
	  --also 'check-setup=python3 -m pytest -q scripts/tests' \
	  --also 'k8s=python3 -m pytest -q scripts/k8s/tests' \
	  -- $(LINTED) $(CARGO)
	@$(PHASE) --report

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## docs/openapi.json again from the server's router and wire types (a test fails when the
## checked-in file differs from the generated one).
openapi:
	CORDON_UPDATE_OPENAPI=1 $(CARGO) test -p cordon-server --test api -- openapi_is_generated_from_the_router

## Start-up figures of every tier beside its peers on this host.
bench: build
	./target/release/cordon bench

clean:
	$(CARGO) clean
