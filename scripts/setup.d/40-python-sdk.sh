#!/usr/bin/env bash
# The Python SDK's tests (sdk/python) need pytest; the SDK itself uses only the standard
# library. Idempotent: installs only what is missing.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
pip_install 'pytest>=7,<9'
