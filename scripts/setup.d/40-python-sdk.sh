#!/usr/bin/env bash
# The Python SDK's tests (sdk/python) need pytest; the SDK itself uses only the standard
# library. Idempotent: installs only what is missing.
set -euo pipefail
if python3 -c 'import pytest' 2>/dev/null; then
    exit 0
fi
echo "setup: installing pytest for the Python SDK tests"
python3 -m pip install --quiet --disable-pip-version-check 'pytest>=7,<9'
