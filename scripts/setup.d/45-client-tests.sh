#!/usr/bin/env bash
# What the server's client-facing tests use (sdk/python/tests): the official MCP Python SDK
# (the `mcp` package, pinned; anyio and httpx2 come with it and the tests import them), which
# drives whole MCP sessions over stdio and streamable HTTP; openapi-spec-validator and
# jsonschema, which check docs/openapi.json and live answers against it; and Debian's Chromium, which the
# dashboard test runs headless against a live server. Idempotent: installs only what is
# missing.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
pip_install 'mcp==2.3.0' anyio httpx2 'openapi-spec-validator==0.9.0' jsonschema
apt_install chromium
